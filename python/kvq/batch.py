# SPDX-License-Identifier: Apache-2.0
"""Batch: a step over several sequences of one Client (libkvq's kvq_batch,
interface 8), as a serving engine runs one: each sequence gets its own
number of new tokens (1 for decode, more for a prefill chunk, mixed in one
step) and each phase is one call for all of them.

    with kvq.Batch(client) as b:
        for s, toks in step:          # Sequence objects of client
            b.add(s, toks)            # lookup=True: an empty sequence's prompt
        b.begin()                     # the lookups in one request, the slots in one more
        for layer in range(layers):
            b.write(layer, k[layer], v[layer])       # packed rows, b.indptr
            out = b.attention(layer, q[layer])
        b.commit()                    # Seal and Publish of the whole step
        b.clear()                     # then the next step's add()s

K, V, q and out are packed ragged rows: sequence i's new rows are
indptr[i] .. indptr[i + 1] - 1 (indptr, made by begin(): a sequence's
tokens less what its lookup found), in the order the sequences were added;
rows = indptr[-1].  The arrays are Sequence's (kvq.client): K and V
[rows, kv_heads, head_dim] in the pool's act dtype, q and out [rows,
q_heads, head_dim], float32 in host memory or (cuda pools) CUDA tensors on
their current stream, checked by the same code and passed by address.

A batch holds its sequences (Python references, and libkvq's): a Sequence
in a batch refuses close() until the batch is cleared or closed.  A begin
is all or nothing: when the pool cannot hold the step it raises PoolFull
with ``short``, the slots it was short of, and changes no sequence.  The
batch shares its Client's lock, process check and close: closing the
Client closes its batches first.
"""
import ctypes
import os
import weakref

import numpy as np

from . import _arrays, _lib
from .client import Sequence, _call_on, _tokens, _u32p

L = _lib.lib

PHASES = {"begin": _lib.KVQ_BATCH_BEGIN, "commit": _lib.KVQ_BATCH_COMMIT}


class _BatchHandle:
    """A kvq_batch pointer and the Sequence objects it holds (kept alive
    while libkvq refers to them); freed once, before its client."""

    def __init__(self, client, ptr):
        self.client, self.ptr, self.seqs = client, ptr, []
        client.batches[id(self)] = self

    def forget(self):
        """Drops the sequences (after kvq_batch_clear or _free)."""
        for s in self.seqs:
            s._h.batches.pop(id(self), None)
        self.seqs = []

    def free(self):
        c = self.client
        if self.ptr is None or os.getpid() != c.pid:
            return
        with c.lock:
            if self.ptr is not None and c.ptr is not None:
                L.kvq_batch_free(self.ptr)
            self.ptr = None
            self.forget()
            c.batches.pop(id(self), None)


class Batch:
    """A step over sequences of one attached Client (kvq_batch): add(),
    begin(), per layer write() then attention(), commit(), clear().  A
    context manager; close() ends a begun step (abort()) and frees it."""

    def __init__(self, client):
        if client.geometry is None:
            raise ValueError("batch: the client is not attached to a pool")
        ptr = ctypes.c_void_p()
        self.client = client
        client._call("batch", L.kvq_batch_new, ctypes.byref(ptr))
        self._h = _BatchHandle(client._h, ptr.value)
        self._fin = weakref.finalize(self, self._h.free)

    def close(self):
        """Abandons a begun step (its slots given back) and frees the batch;
        its sequences stay as they are, free to close."""
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, what, fn, *args, raw=False):
        return _call_on(self._h, "batch", what, fn, *args, raw=raw)

    def __len__(self):
        """Sequences in the batch."""
        return self._call("size", L.kvq_batch_size, raw=True)

    @property
    def sequences(self):
        """The Sequence objects in the batch, by index."""
        return list(self._h.seqs)

    def add(self, seq, tokens, lookup=False, request_id=None):
        """Adds seq (a Sequence of this batch's client, at most once a step)
        with its new tokens (at least one) to the next step; returns its
        index.  lookup: seq is empty and tokens is its prompt, looked up in
        the prefix cache by begin() (Sequence.lookup's rules: hit(i) then
        says what was found, and the step appends the rest); request_id
        goes with that lookup in a tensor-parallel group's member pool.
        Raises KvqError: -EINVAL (another client's sequence, a lookup on a
        sequence that is not empty), -EBUSY (a step is begun), -EEXIST (in
        the batch already)."""
        if not isinstance(seq, Sequence):
            raise TypeError(f"seq: a kvq.Sequence, not {type(seq).__name__}")
        if seq.client._h is not self._h.client:
            raise ValueError("seq: a sequence of another client")
        t = _tokens(tokens)
        if not len(t):
            raise ValueError("tokens: a step adds at least one token to each sequence")
        with self._h.client.lock:
            if request_id is not None:
                rid = request_id.encode() if isinstance(request_id, str) else bytes(request_id)
                seq._call("request id", L.kvq_seq_set_request, rid, len(rid))
            sp = seq._h.ptr
            if sp is None:
                raise ValueError("seq: the sequence is closed")
            i = self._call("add", L.kvq_batch_add, sp, _u32p(t), len(t), _lib.KVQ_BATCH_LOOKUP if lookup else 0)
            self._h.seqs.append(seq)
            seq._h.batches[id(self._h)] = self._h
        return i

    def clear(self):
        """Empties the batch for the next step; its sequences stay as they
        are (and may be closed).  Raises KvqError -EBUSY while a step is
        begun (commit() or abort() first)."""
        with self._h.client.lock:
            self._call("clear", L.kvq_batch_clear)
            self._h.forget()

    def begin(self):
        """Begins the step: one Lookup for the lookup=True sequences, then
        one Alloc for every slot the step needs.  All or nothing: raises
        PoolFull with ``short`` (the slots the pool was short of; 0 for a
        quota) when the pool cannot hold it, or another KvqError, and then
        holds nothing and changes no sequence (drop some: clear(), then add
        the rest)."""
        short = ctypes.c_uint32()
        with self._h.client.lock:   # kvq_client_error read before another call
            r = self._call("begin", L.kvq_batch_begin, ctypes.byref(short), raw=True)
            if r < 0:
                e = self._h.client.fail(r, "begin")
                e.short = short.value
                raise e

    def _indptr(self, what):
        """indptr as libkvq has it (a ctypes pointer and the count), or
        (None, 0) while no step is begun."""
        n = ctypes.c_uint32()
        p = self._call(what, L.kvq_batch_indptr, ctypes.byref(n), raw=True)
        return (p, n.value) if p else (None, 0)

    @property
    def indptr(self):
        """The begun step's row index, a copy: uint32 [len + 1], indptr[0]
        0, sequence i's new rows indptr[i] .. indptr[i + 1] - 1.  None while
        no step is begun (before begin(), after commit() or abort())."""
        p, n = self._indptr("indptr")
        return None if p is None else np.ctypeslib.as_array(p, (n + 1,)).copy()

    def _rows(self, what):
        p, n = self._indptr(what)
        if p is None:
            raise ValueError(f"{what}: no step is begun (begin() first)")
        return p[n]

    def hit(self, i):
        """The tokens sequence i's lookup found cached (0 without lookup,
        or before begin())."""
        if not 0 <= i < len(self):
            raise IndexError(f"hit: no sequence {i} in a batch of {len(self)}")
        return self._call("hit", L.kvq_batch_hit, i, raw=True)

    def write(self, layer, k, v):
        """Writes one layer's K and V of every sequence's new rows: [rows,
        kv_heads, head_dim], rows = indptr[-1]."""
        g = self.client.geometry
        shape = (self._rows("write"), g["kv_heads"], g["head_dim"])
        layout = "[rows of the step's indptr, kv_heads, head_dim]"
        ka = _arrays.kv(k, "k", shape, g["act"], self.client.device, layout)
        va = _arrays.kv(v, "v", shape, g["act"], self.client.device, layout)
        self.client._use_stream(ka.stream if ka.stream is not None else va.stream)
        self._call("write", L.kvq_batch_write, layer, ka.ptr, va.ptr)

    def attention(self, layer, q, out=None, scale=0.0):
        """Attention of every sequence's new rows over its stored tokens,
        one layer, after that layer's write(); q [rows, q_heads, head_dim]
        (Sequence.attention's dtypes and devices).  out is allocated when
        None.  scale 0: 1/sqrt(head_dim).  Host arrays: returns once out is
        written; CUDA tensors: queued on q's current stream.  Returns out."""
        g = self.client.geometry
        qa, oa, out, on_dev = _arrays.attention(q, out, g["head_dim"], g["act"], self.client.device,
                                                rows=self._rows("attention"))
        if on_dev:
            self.client._use_stream(qa.stream)
            self._call("attention", L.kvq_batch_attention_device, layer, qa.shape[1], scale, qa.ptr, oa.ptr,
                       1 if oa.dtype == "f32" else 0)
        else:
            self._call("attention", L.kvq_batch_attention, layer, qa.shape[1], scale, qa.ptr, oa.ptr)
        return out

    def commit(self):
        """Ends the step: seals every block that left a window and publishes
        every new sealed block of every sequence, in requests sent together
        (on a cuda pool after the step's CUDA work: this waits, without the
        GIL).  The sequences stay in the batch: clear() before the next
        step's add()s."""
        self._call("commit", L.kvq_batch_commit)

    def abort(self):
        """Gives back the slots a begun step allocated and ends it; each
        sequence is as before begin() except for a lookup's prefix.
        Nothing happens without a begun step."""
        self._call("abort", L.kvq_batch_abort, raw=True)

    def requests(self, phase):
        """(requests, waits) that the last begin() ('begin') or commit()
        ('commit') sent: the requests and the times the caller waited for
        kvqd's replies."""
        if phase not in PHASES:
            raise ValueError(f"phase: 'begin' or 'commit', not {phase!r}")
        n, w = ctypes.c_uint32(), ctypes.c_uint32()
        self._call("requests", L.kvq_batch_requests, PHASES[phase], ctypes.byref(n), ctypes.byref(w))
        return n.value, w.value


__all__ = ["Batch"]
