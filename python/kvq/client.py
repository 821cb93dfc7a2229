# SPDX-License-Identifier: Apache-2.0
"""Client (a connection to kvqd, attached to one pool) and Sequence (one
sequence's block table in it): libkvq's kvq_client and kvq_seq.

Resources: a Client holds a connection, the pool's mapping and every block
its sequences hold; close() (or the end of a ``with`` block, or garbage
collection) frees its batches (kvq.batch) and open sequences, then the
client.  A Sequence's close() releases its blocks (one Release); it is
refused while a Batch holds the sequence.  Closing twice is fine.

Threads: one libkvq client may be used by one thread at a time; each Client
has a lock that its calls (its sequences' too) take, so sharing one across
threads is safe but serial.  The GIL is released inside every libkvq call.

fork(): a child inherits the parent's Client and Sequence objects but not
their use.  Every call on them in the child raises InheritedError, and
closing or collecting them there does nothing: no request goes out on the
parent's connection and the parent's mapping is left alone (the socket's
descriptor stays open in the child until it exits or execs; it is
close-on-exec).  A child opens its own Client.
"""
import ctypes
import errno
import os
import threading
import weakref

import numpy as np

from . import _arrays, _lib
from .errors import InheritedError, KvqError, error_class

L = _lib.lib


def _tokens(tokens, what="tokens"):
    t = np.asarray(tokens)
    if t.ndim != 1 or not (np.issubdtype(t.dtype, np.integer) or t.size == 0):
        raise TypeError(f"{what}: a 1-D sequence of integer token ids, not {t.dtype} of shape {t.shape}")
    if t.size and (t.min() < 0 or t.max() > 0xFFFFFFFF):
        raise ValueError(f"{what}: token ids must be in [0, 2**32)")
    return np.ascontiguousarray(t, dtype=np.uint32)


def _u32p(a):
    return a.ctypes.data_as(_lib.P_u32)


class _Handle:
    """A kvq_client pointer with its lock, its process, its open sequences
    and batches; freed once, in the process that opened it."""

    def __init__(self, ptr):
        self.ptr, self.pid, self.lock, self.seqs, self.batches = ptr, os.getpid(), threading.RLock(), {}, {}

    def check(self, what):
        if self.ptr is None:
            raise ValueError(f"{what}: the client is closed")
        if os.getpid() != self.pid:
            raise InheritedError(-errno.EBADF, f"this client was opened by process {self.pid}, before fork(); "
                                 f"open a new one in this process", what)

    def fail(self, r, what, call=""):
        """The exception for libkvq's code r, with kvq_client_error (read
        under the lock, before the next call)."""
        msg = L.kvq_client_error(self.ptr).decode(errors="replace") if self.ptr else ""
        return error_class(r, call)(r, msg, what)

    def free(self):
        if self.ptr is None or os.getpid() != self.pid:
            return
        with self.lock:
            for b in list(self.batches.values()):   # a batch refers to its sequences
                b.free()
            for s in list(self.seqs.values()):
                s.free()
            L.kvq_client_free(self.ptr)
            self.ptr = None


class _SeqHandle:
    """A kvq_seq pointer and the batches (batch._BatchHandle) that hold it:
    libkvq frees a sequence only when no batch holds it."""

    def __init__(self, client, ptr):
        self.client, self.ptr, self.batches = client, ptr, {}
        client.seqs[id(self)] = self

    def free(self):
        c = self.client
        if self.ptr is None or os.getpid() != c.pid:
            return
        with c.lock:
            # Sequence.close() refuses while a batch holds it; collection at
            # exit or the client's close frees those batches first
            for b in list(self.batches.values()):
                b.free()
            if self.ptr is not None and c.ptr is not None:
                L.kvq_seq_free(self.ptr)
            self.ptr = None
            c.seqs.pop(id(self), None)


def _call_on(h, kind, what, fn, *args, raw=False):
    """fn(ptr, *args) for the handle h of a sequence or batch (kind) under
    its client's lock; raises on a negative return (unless raw)."""
    with h.client.lock:
        h.client.check(what)
        if h.ptr is None:
            raise ValueError(f"{what}: the {kind} is closed")
        r = fn(h.ptr, *args)
        if not raw and isinstance(r, int) and r < 0:
            raise h.client.fail(r, what)
        return r


ACTS = {"f16": _lib.KVQ_ACT_F16, "bf16": _lib.KVQ_ACT_BF16}


def connect(socket=None, name="python"):
    """A Client connected to kvqd at socket (None: $KVQ_SOCKET, else the
    default path libkvq(3) names) with a name kvqctl clients shows.  Raises
    DaemonUnavailable when kvqd is not there or refuses."""
    return Client(socket, name)


def attach(pool, model_id, layers, kv_heads, head_dim, socket=None, name="python", **kw):
    """connect() and Client.attach(): a Client attached to pool, closed
    again if the attach fails."""
    c = Client(socket, name)
    try:
        return c.attach(pool, model_id, layers, kv_heads, head_dim, **kw)
    except BaseException:
        c.close()
        raise


class Client:
    """A connection to kvqd (kvq_client).  A context manager; close() frees
    it and its sequences."""

    def __init__(self, socket=None, name="python"):
        ptr = ctypes.c_void_p()
        path = None if socket is None else os.fsencode(socket)
        r = L.kvq_client_connect(path, name.encode(), ctypes.byref(ptr))
        if r < 0:
            where = socket if socket is not None else os.environ.get("KVQ_SOCKET", "the default socket")
            raise error_class(r, "connect")(r, f"cannot connect to kvqd at {where}: {_lib.strerror(r)}", "connect")
        self._h = _Handle(ptr.value)
        self._fin = weakref.finalize(self, self._h.free)
        self._trace_fn = None
        self._stream = 0
        self.geometry = None

    def close(self):
        """Frees the open sequences, unmaps the pool and closes the
        connection; kvqd then drops what it still held."""
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, what, fn, *args, call="", raw=False):
        """fn(client, *args) under the lock; raises on a negative return
        (unless raw: a value, not a code)."""
        h = self._h
        with h.lock:
            h.check(what)
            r = fn(h.ptr, *args)
            if not raw and isinstance(r, int) and r < 0:
                raise h.fail(r, what, call)
            return r

    @property
    def id(self):
        """The daemon's name for this connection (kvqctl clients)."""
        return self._call("id", L.kvq_client_id)

    @property
    def backend(self):
        """'host' or 'cuda' once attached, else None."""
        b = self._call("backend", L.kvq_client_backend)
        return b.decode() if b else None

    @property
    def device(self):
        """The CUDA device (this process's ordinal) of a cuda pool, else -1."""
        return self._call("device", L.kvq_client_device, raw=True)

    def attach(self, pool, model_id, layers, kv_heads, head_dim, block_tokens=32, policy="f16", window=0,
               act="f16", create=True, n_sealed=0, n_open=0, backend=None, device=-1, codebooks=None,
               group=None, rank=0, world_size=0, sink_blocks=0, n_sink=0, host_capacity=0):
        """Joins pool (created with this geometry and policy when create and
        kvqd allows it; n_sealed and n_open 0: sized by kvqd's
        configuration; backend 'host', 'cuda' or None for kvqd's default;
        device -1 any) and maps it.  act is the open window's and the
        inputs' dtype, 'f16' or 'bf16'.  codebooks: the path of a codebook
        file, which a policy with pq2 or pq1 needs to create the pool (and
        which, joining one, must be the pool's).  Returns self.  Raises
        PoolRefused with kvqd's message (geometry or model mismatch, bad
        policy, codebooks, ...).  group, rank, world_size: join that
        tensor-parallel group as rank of world_size (kvq_client_set_group):
        pool is then this rank's member pool, kv_heads the model's, and each
        lookup needs the request id every rank gives (Sequence.lookup).
        sink_blocks 1: a pool that keeps each sequence's first block exact
        (kvqd.conf(5) sink_blocks; it must be the pool's), n_sink its sink
        slots when the attach creates it with n_sealed and n_open (0: as
        many as open slots) (kvq_client_set_sinks).  host_capacity: bytes
        of the host tier of a pool the attach creates (0: none; kvqd.conf(5)
        host_capacity): blocks evicted from the pool kept there, quantized,
        and copied back by kvqd for lookups; its figures are the stats'
        tier_* names."""
        if act not in ACTS:
            raise ValueError(f"act: 'f16' or 'bf16', not {act!r}")
        p = _lib.AttachParams(pool=pool.encode(), model_id=model_id.encode(), layers=layers, kv_heads=kv_heads,
                              head_dim=head_dim, block_tokens=block_tokens, policy=policy.encode(), window=window,
                              act=ACTS[act], create=1 if create else 0, n_sealed=n_sealed, n_open=n_open,
                              backend=backend.encode() if backend else None, device=device,
                              codebooks=os.fsencode(codebooks) if codebooks is not None else None,
                              host_capacity=host_capacity)
        if group is not None:
            self._call(f"group {group}", L.kvq_client_set_group, group.encode(), rank, world_size)
        if sink_blocks or n_sink:
            self._call("sink blocks", L.kvq_client_set_sinks, sink_blocks, n_sink)
        # the size of the struct this package knows (kvq.h: the library reads that much)
        self._call(f"attach {pool}", L.kvq_client_attach_sized, ctypes.byref(p), ctypes.sizeof(p), call="attach")
        if group is not None:   # a member pool holds the rank's shard of the heads
            kv_heads = self.stats()["kv_heads"]
        self.geometry = {"pool": pool, "model_id": model_id, "layers": layers, "kv_heads": kv_heads,
                         "head_dim": head_dim, "block_tokens": block_tokens, "act": act}
        return self

    def stats(self, pool=None):
        """The pool's (None: the attached one) identity and geometry as
        kvq_client_stats gives them and every figure kvqd reports of it
        (figures()), as one dict: struct kvq_stats' field names, then the
        figures' names (struct kvq_stats' figures among them)."""
        st = _lib.Stats()
        self._call("stats", L.kvq_client_stats, pool.encode() if pool else None, ctypes.byref(st))
        d = {f: getattr(st, f) for f, _ in _lib.Stats._fields_}
        for f in ("name", "model_id", "backend"):
            d[f] = d[f].decode(errors="replace")
        d.update(self.figures(pool))
        return d

    def figures(self, pool=None):
        """Every figure kvqd reports of the pool (None: the attached one),
        by name, from one Stats request (kvq_client_pool_figures): a new
        figure of kvqd's shows up here with no change to this package."""
        f = ctypes.c_void_p()
        self._call("figures", L.kvq_client_pool_figures, pool.encode() if pool else None, ctypes.byref(f))
        try:
            name, value, d = ctypes.c_char_p(), ctypes.c_uint64(), {}
            for i in range(L.kvq_pool_figures_count(f)):
                if L.kvq_pool_figures_at(f, i, ctypes.byref(name), ctypes.byref(value)) == 0:
                    d[name.value.decode(errors="replace")] = value.value
            return d
        finally:
            L.kvq_pool_figures_free(f)

    def sink_stats(self, pool=None):
        """The pool's sink blocks as kvq_client_sink_stats gives them, a
        dict with struct kvq_sink_stats' field names."""
        st = _lib.SinkStats()
        self._call("sink stats", L.kvq_client_sink_stats, pool.encode() if pool else None, ctypes.byref(st))
        return {f: getattr(st, f) for f, _ in _lib.SinkStats._fields_}

    def sequence(self, salt=None):
        """A new empty Sequence; salt (bytes, at most 64) separates its
        cache hits from other salts'."""
        return Sequence(self, salt)

    def set_trace(self, fn):
        """Debug hook (kvq_client_set_trace): fn(dict) before each kernel of
        a sequence, with op ('write' or 'attention'), layer, device (bool)
        and the addresses the kernel gets: k, v (write), q, out (attention),
        as ints (0 for none).  None turns it off."""
        def hook(_ctx, t):
            t = t.contents
            fn({"op": "write" if t.op == _lib.KVQ_TRACE_WRITE else "attention", "layer": t.layer,
                "device": bool(t.device), "k": t.k or 0, "v": t.v or 0, "q": t.q or 0, "out": t.out or 0})
        cb = _lib.TRACE_FN(hook) if fn else _lib.TRACE_FN()
        self._call("set_trace", L.kvq_client_set_trace, cb, None)
        self._trace_fn = cb   # kept alive while libkvq may call it

    def _use_stream(self, stream):
        """Queues libkvq's CUDA work on stream (the inputs' producer's)."""
        if stream is not None and stream != self._stream:
            self._call("set_stream", L.kvq_client_set_stream, ctypes.c_void_p(stream or None))
            self._stream = stream


class Sequence:
    """One sequence's block table (kvq_seq).  Adding m tokens:
    begin(tokens), then per layer write(layer, k, v) (and attention of that
    layer), then commit().  A context manager; close() releases its blocks.

    Arrays: k and v are [m, kv_heads, head_dim] in the pool's act dtype
    (f16: np.float16 or torch.float16; bf16: torch.bfloat16 or a NumPy
    bfloat16 dtype); q and out are [n_q, q_heads, head_dim]: float32 host
    arrays, or on a cuda pool also CUDA tensors (q in the act dtype, out
    float32 or the act dtype).  On a cuda pool K/V may be in host memory
    (libkvq copies them to the device first); CUDA tensors are read in place
    and the work is queued on the tensor's current CUDA stream."""

    def __init__(self, client, salt=None):
        if client.geometry is None:
            raise ValueError("sequence: the client is not attached to a pool")
        salt = bytes(salt or b"")
        ptr = ctypes.c_void_p()
        self.client = client
        client._call("sequence", L.kvq_seq_new, salt or None, len(salt), ctypes.byref(ptr))
        self._h = _SeqHandle(client._h, ptr.value)
        self._fin = weakref.finalize(self, self._h.free)
        self._m = 0

    def close(self):
        """Releases every block the sequence holds.  Refused (ValueError)
        while a Batch holds the sequence: clear() or close the batch first."""
        if self._h.batches and self._h.ptr is not None and os.getpid() == self._h.client.pid:
            raise ValueError("close: the sequence is in a batch; clear() or close() the batch first")
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, what, fn, *args):
        return _call_on(self._h, "sequence", what, fn, *args)

    @property
    def tokens(self):
        """Tokens stored (after the last commit, or the prefix lookup() found)."""
        return self._call("tokens", L.kvq_seq_tokens)

    def lookup(self, tokens, request_id=None):
        """Takes the longest cached chain of tokens' blocks as the prefix of
        this empty sequence; returns the tokens it covers (a multiple of the
        block size, less than len(tokens)).  Append tokens[hit:] next, in
        one begin().  request_id (bytes or str, 1-64 bytes): in a
        tensor-parallel group's member pool, the id every rank of the
        request gives; they all get the same hit."""
        t = _tokens(tokens)
        hit = ctypes.c_uint32()
        if request_id is not None:
            rid = request_id.encode() if isinstance(request_id, str) else bytes(request_id)
            self._call("request id", L.kvq_seq_set_request, rid, len(rid))
        self._call("lookup", L.kvq_seq_from_prompt, _u32p(t), len(t), ctypes.byref(hit))
        return hit.value

    def begin_prompt(self, tokens):
        """lookup(tokens), then begin(tokens[hit:]); returns hit."""
        hit = self.lookup(tokens)
        self.begin(np.asarray(tokens)[hit:])
        return hit

    def begin(self, tokens):
        """Reserves the slots for the new tokens and starts their write."""
        t = _tokens(tokens)
        self._call("begin", L.kvq_seq_begin, _u32p(t), len(t))
        self._m = len(t)

    def _kv(self, x, what):
        g = self.client.geometry
        return _arrays.kv(x, what, (self._m, g["kv_heads"], g["head_dim"]), g["act"], self.client.device,
                          "[new tokens, kv_heads, head_dim] of the current begin()")

    def write(self, layer, k, v):
        """Writes one layer's K and V of the current begin()'s tokens."""
        ka, va = self._kv(k, "k"), self._kv(v, "v")
        self.client._use_stream(ka.stream if ka.stream is not None else va.stream)
        self._call("write", L.kvq_seq_write, layer, ka.ptr, va.ptr)

    def attention(self, layer, q, out=None, scale=0.0):
        """Attention of the last n_q stored tokens of layer (causal, over KV
        as stored); q [n_q, q_heads, head_dim].  out is allocated when None
        (float32 like q on the host; on the GPU q's dtype).  scale 0:
        1/sqrt(head_dim).  Host arrays: returns once out is written; CUDA
        tensors: queued on q's current stream.  Returns out."""
        g = self.client.geometry
        qa, oa, out, on_dev = _arrays.attention(q, out, g["head_dim"], g["act"], self.client.device)
        if on_dev:
            self.client._use_stream(qa.stream)
            self._call("attention", L.kvq_seq_attention_device, layer, qa.shape[1], qa.shape[0], scale, qa.ptr,
                       oa.ptr, 1 if oa.dtype == "f32" else 0)
        else:
            self._call("attention", L.kvq_seq_attention, layer, qa.shape[1], qa.shape[0], scale, qa.ptr, oa.ptr)
        return out

    def commit(self):
        """Seals the blocks that left the open window and publishes every
        new sealed block to the prefix cache (on a cuda pool after its CUDA
        work finished: this waits, without the GIL)."""
        self._call("commit", L.kvq_seq_commit)
        self._m = 0

    def fork(self):
        """A new Sequence sharing the sealed blocks (by reference) with its
        own copy of the open window."""
        ptr = ctypes.c_void_p()
        self._call("fork", L.kvq_seq_fork, ctypes.byref(ptr))
        f = Sequence.__new__(Sequence)
        f.client, f._m = self.client, 0
        f._h = _SeqHandle(self.client._h, ptr.value)
        f._fin = weakref.finalize(f, f._h.free)
        return f

    def blocks(self):
        """(sealed ids, open ids) of the block table, as lists."""
        s, o = _lib.P_i32(), _lib.P_i32()
        ns, no = ctypes.c_uint32(), ctypes.c_uint32()
        self._call("blocks", L.kvq_seq_blocks, ctypes.byref(s), ctypes.byref(ns), ctypes.byref(o), ctypes.byref(no))
        return [s[i] for i in range(ns.value)], [o[i] for i in range(no.value)]


__all__ = ["Client", "Sequence", "connect", "attach", "KvqError"]
