# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers with the KV cache in a kvqd pool.

    import kvq.hf                                     # registers attn_implementation "kvq"
    model.set_attn_implementation("kvq")
    enc = tok(prompts, return_tensors="pt", padding=True)   # padding_side "left"
    with kvq.hf.KvqCache.attach(model, "smollm2", "SmolLM2-135M@Q4_1", policy="int8",
                                prompt_ids=enc.input_ids, attention_mask=enc.attention_mask) as cache:
        out = model.generate(**enc, past_key_values=cache, max_new_tokens=32, do_sample=False)

Versions: transformers 5 (tested with 5.0.0, 5.17.0 and 5.25.0, torch
2.11.0), whose Cache holds one CacheLayerMixin per layer and whose
attention functions are registered with AttentionInterface; a KvqCache is
such a Cache and "kvq" such a function.  From 5.25 the model's keyword is
cache (past_key_values deprecated); the hooks take either.
Llama-architecture attention only (q_heads a multiple of kv_heads, full
causal attention, no sliding window), and the model is given input_ids,
not inputs_embeds.

KvqCache keeps one kvq.Sequence per batch row; a forward is one kvq.Batch
step over them (begin, per layer one write and one attention for every
row, commit), and the attention function "kvq" computes attention with
kvqd's kernels over KV as stored (sealed blocks quantized).

Padding: a sequence holds only its row's real tokens.  Columns where the
2-D attention_mask is 0 (generate left-pads prompts of different lengths)
are dropped before the write, the lookup and the publish, so a pad token
is never stored, hashed or published; their attention outputs are zeros
(masked anyway).  Rotary positions must be each row's own (the mask's
cumsum, as generate makes them): each step checks them, so what a row
stores is what the prompt alone would store.  Tokens generate appends to
a finished row (pad_token_id with mask 1) are the row's as transformers
sees them, and are stored.

The prefix cache: the Cache API never sees token ids, which the lookup and
the publish need.  The cache takes the prompt's ids (prompt_ids, with the
batch's attention_mask) and looks each row's real tokens up when made,
one Lookup per row (cache.hits); a forward pre-hook on the model reads
each step's input_ids, attention_mask and position_ids.  generate() asks
for one cache length for all rows, in columns: the cache reports the
leading columns every row has cached (cache.hit; for one unpadded prompt
its lookup's hit), and generate feeds the rest.  A row that found more
than that gets some of its cached tokens again: they are checked against
the prompt and not written, and their outputs are zeros too (nothing reads
them: their K/V are the cached ones, and generate takes only the last
column's logits; in a caller's own forward those columns' logits mean
nothing).  Other processes with the same prompt
prefix (same pool, model id and salt) get the hit.

Not supported: beam search and num_return_sequences > 1 (rows are not
reordered or repeated), crop (assisted decoding), a 4-D attention mask.
Copies: a step's K/V [batch, kv_heads, q, head_dim] are gathered into
packed rows [rows, kv_heads, head_dim] in the pool's dtype (one copy,
and a conversion where the model's dtype is not the pool's); q likewise,
out scattered back.  A layer whose (K, V) formats have no CUDA kernel
raises kvq.NotSupported with libkvq's message.
"""
import threading

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from . import _hfrows
from .batch import Batch
from .client import attach as kvq_attach

_active = threading.local()   # the KvqCache of the forward running on this thread
_TORCH_ACT = {"f16": torch.float16, "bf16": torch.bfloat16}


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def geometry(model):
    """layers, kv_heads, head_dim of a Llama-architecture model's config."""
    c = _text_config(model)
    heads = c.num_attention_heads
    return dict(layers=c.num_hidden_layers, kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads)


def _host(x):
    """A tensor (on any device), array or list as a NumPy array."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class KvqLayer(CacheLayerMixin):
    """One model layer of a KvqCache: update() writes the step's K/V into
    the sequences; keys/values stay None (they live in kvqd)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, cache, layer):
        super().__init__()
        self.cache, self.layer = cache, layer

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cache._write(self.layer, key_states, value_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length):
        return self.cache.get_seq_length() + query_length, 0

    def get_seq_length(self):
        return self.cache.get_seq_length()

    def get_max_length(self):
        return -1

    def get_max_cache_shape(self):   # get_max_length's name before transformers 5.16
        return -1

    def reset(self):
        raise NotImplementedError("a KvqCache is not reset: close it and make another")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("a KvqCache does not reorder its rows (beam search)")

    def batch_repeat_interleave(self, repeats):
        raise NotImplementedError("a KvqCache does not repeat its rows (num_return_sequences > 1)")

    def batch_select_indices(self, indices):
        raise NotImplementedError("a KvqCache does not select rows")

    def crop(self, max_length):
        raise NotImplementedError("a KvqCache is not cropped")


class KvqCache(Cache):
    """A transformers Cache whose K/V live in the kvqd pool of client (an
    attached kvq.Client with the model's geometry), one sequence per batch
    row.  prompt_ids: the prompt (1-D) or the padded batch of prompts
    ([batch, width], with attention_mask: 0 for padding), as generate is
    given them; each row's real tokens are looked up at once (hits: each
    row's cached tokens; hit, also get_seq_length(): the columns cached for
    all rows), and the first forward must then be given
    prompt_ids[:, hit:], as generate() does.  Without prompt_ids nothing is
    looked up and the first forward's batch size is the cache's.  A
    context manager: close() removes its hooks from model and frees the
    sequences (their published blocks stay cached in kvqd for others); the
    client stays open."""

    def __init__(self, model, client, prompt_ids=None, salt=None, attention_mask=None):
        g = geometry(model)
        mine = {k: client.geometry[k] for k in g}
        if mine != g:
            raise ValueError(f"KvqCache: the pool's geometry {mine} is not the model's {g}")
        super().__init__(layers=[KvqLayer(self, i) for i in range(g["layers"])])
        self.client, self.model, self.salt = client, model, salt
        self.act = client.geometry["act"]
        self.on_gpu = client.backend == "cuda"
        self.seqs, self._prompt, self.hits, self.hit = [], None, [], 0
        self._cols, self._step, self._rows = 0, None, {}
        self._batch = Batch(client)
        try:
            if prompt_ids is not None:
                ids, mask = _hfrows.prompts(_host(prompt_ids), _host(attention_mask))
                self._prompt = [r[m].astype(np.int64) for r, m in zip(ids, mask)]
                self._open(len(self._prompt))
                self.hits = [s.lookup(p) for s, p in zip(self.seqs, self._prompt)]
                self._cols, self._seen = _hfrows.cached_columns(mask, self.hits)
                self._skip = np.asarray(self.hits, np.int64) - self._seen
                self.hit = self._cols
        except BaseException:
            self._free()
            raise
        self._owns_client = False
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       model.register_forward_hook(self._post, with_kwargs=True)]

    def _open(self, n):
        self.seqs = [self.client.sequence(self.salt) for _ in range(n)]
        self._seen, self._skip = np.zeros(n, np.int64), np.zeros(n, np.int64)

    @classmethod
    def attach(cls, model, pool, model_id, policy="f16", prompt_ids=None, salt=None, socket=None, backend=None,
               block_tokens=32, attention_mask=None, **kw):
        """Connects, attaches to pool with the model's geometry (the open
        window's dtype: bf16 for a bf16 model, else f16) and makes the
        cache; close() then closes the client too."""
        act = "bf16" if next(model.parameters()).dtype == torch.bfloat16 else "f16"
        client = kvq_attach(pool, model_id, socket=socket, name="kvq.hf", policy=policy, act=act, backend=backend,
                            block_tokens=block_tokens, **geometry(model), **kw)
        try:
            cache = cls(model, client, prompt_ids, salt, attention_mask)
        except BaseException:
            client.close()
            raise
        cache._owns_client = True
        return cache

    def _free(self):
        self._batch.close()   # a step begun by a forward that raised: its slots given back
        for s in self.seqs:
            s.close()

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._free()
        if self._owns_client:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_seq_length(self, layer_idx=0):
        """Columns of the batch the cache holds (padding included)."""
        return self._cols

    @property
    def tokens(self):
        """Each row's stored tokens (its sequence's)."""
        return [s.tokens for s in self.seqs]

    # --- the model's forward: begin before, commit after

    def _pre(self, module, args, kwargs):
        if kwargs.get("past_key_values") is not self and kwargs.get("cache") is not self:   # "cache" from 5.25 on
            return
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            raise ValueError("KvqCache: the model must be given input_ids (the prefix cache keys on token ids)")
        if not self.seqs:
            self._open(ids.shape[0])
        if ids.shape[0] != len(self.seqs):
            raise ValueError(f"KvqCache: batch size {ids.shape[0]}; this cache holds {len(self.seqs)} rows")
        if self._step is not None:   # the last forward raised before its commit
            self._batch.abort()
            self._step = None
        self._batch.clear()
        st = _hfrows.plan(_host(ids), _host(kwargs.get("attention_mask")), _host(kwargs.get("position_ids")),
                          self._cols, self._seen, self._skip, self._prompt)
        try:
            for s, t in zip(self.seqs, st.tokens):
                if len(t):
                    self._batch.add(s, t)
            if len(self._batch):
                self._batch.begin()   # all or nothing: PoolFull changes no sequence
        except BaseException:
            self._batch.clear()
            raise
        self._step, self._rows, self._q = st, {}, ids.shape[1]
        _active.cache = self

    def _post(self, module, args, kwargs, output):
        if getattr(_active, "cache", None) is not self:
            return
        _active.cache = None
        st = self._step
        if len(self._batch):
            self._batch.commit()
            self._batch.clear()
        self._step = None
        self._seen += st.real
        self._skip -= st.skipped
        self._cols += self._q

    # --- K/V and attention: columns [batch, heads, q, head_dim] to packed rows and back

    def _index(self, device):
        """The step's packed rows' (batch, column) indices on device."""
        if device not in self._rows:
            self._rows[device] = tuple(torch.as_tensor(i, device=device) for i in self._step.rows)
        return self._rows[device]

    def _pack(self, x, device, dtype):
        """x [batch, heads, q, head_dim] as packed rows [rows, heads, head_dim]."""
        x = x.transpose(1, 2)
        if self._step.rows is None:
            x = x.reshape(-1, x.shape[2], x.shape[3])
        else:
            x = x[self._index(x.device)]
        return x.to(device=device, dtype=dtype).contiguous()

    def _write(self, layer, k, v):
        if not len(self._batch):
            return
        dev = k.device if self.on_gpu else "cpu"
        want = _TORCH_ACT[self.act]
        self._batch.write(layer, self._pack(k, dev, want), self._pack(v, dev, want))

    def _attention(self, layer, query, scale):
        nb, heads, q, hd = query.shape
        if not len(self._batch):
            return query.new_zeros(nb, q, heads, hd)
        if self.on_gpu and query.is_cuda:
            out = self._batch.attention(layer, self._pack(query, query.device, _TORCH_ACT[self.act]), scale=scale)
        else:
            out = self._batch.attention(layer, self._pack(query, "cpu", torch.float32), scale=scale)
        out = out.to(device=query.device, dtype=query.dtype)
        if self._step.rows is None:
            return out.view(nb, q, heads, hd)
        full = query.new_zeros(nb, q, heads, hd)
        full[self._index(query.device)] = out
        return full


def kvq_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function interface ("kvq"): attention of the
    step's queries over each row's sequence as kvqd stores it.  key and
    value (this step's) are already in the pool; attention_mask is not
    needed (each sequence holds only its row's real tokens, causal)."""
    cache = getattr(_active, "cache", None)
    if cache is None:
        raise RuntimeError("attn_implementation 'kvq' needs a kvq.hf.KvqCache as past_key_values")
    if getattr(module, "sliding_window", None):
        raise ValueError("kvq: sliding-window attention layers are not supported")
    return cache._attention(module.layer_idx, query, float(scaling) if scaling else 0.0), None


AttentionInterface.register("kvq", kvq_attention)
