# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers (5.x) with the KV cache in a kvqd pool.

    import kvq.hf                                     # registers attn_implementation "kvq"
    model.set_attn_implementation("kvq")
    with kvq.hf.KvqCache.attach(model, "smollm2", "SmolLM2-135M@Q4_1", policy="int8", prompt_ids=ids) as cache:
        out = model.generate(ids, past_key_values=cache, max_new_tokens=32, do_sample=False)

KvqCache is a transformers Cache whose layers write K/V into a kvq.Sequence;
the attention function "kvq" computes attention with kvqd's kernels over KV
as stored (sealed blocks quantized).  The Cache API never sees token ids,
which the prefix lookup and the publish need: the cache takes the prompt's
ids (prompt_ids) and looks them up when made, reporting the hit as its
sequence length, so generate() prefills only the rest; a forward pre-hook
on the model reads each step's input_ids.  Other processes with the same
prompt prefix (same pool, model id and salt) get the hit.

Limits: batch size 1, unpadded (an attention_mask with a zero -- left
padding -- raises ValueError); Llama-architecture attention (q_heads a
multiple of kv_heads, full causal attention, no sliding window); the model
is given input_ids, not inputs_embeds.  Copies: K/V arrive as
[1, kv_heads, m, head_dim] and are written as [m, kv_heads, head_dim] in the
pool's dtype (one transposing copy, and a conversion where the model's dtype
is not the pool's); q likewise.  A layer whose (K, V) formats have no CUDA
kernel raises kvq.NotSupported with libkvq's message.
"""
import threading

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

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


class KvqLayer(CacheLayerMixin):
    """One model layer of a KvqCache: update() writes the step's K/V into
    the sequence; keys/values stay None (they live in kvqd)."""

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
        return self.cache.seq.tokens

    def get_max_length(self):
        return -1

    def reset(self):
        raise NotImplementedError("a KvqCache is not reset: close it and make another")


class KvqCache(Cache):
    """A transformers Cache whose K/V live in the kvqd pool of client (an
    attached kvq.Client with the model's geometry).  prompt_ids: the
    prompt's token ids, looked up at once (hit tokens: self.hit, also
    get_seq_length()); the first forward must then be given
    prompt_ids[hit:], as generate() does.  A context manager: close()
    removes its hooks from model and frees the sequence (its published
    blocks stay cached in kvqd for others); the client stays open."""

    def __init__(self, model, client, prompt_ids=None, salt=None):
        g = geometry(model)
        mine = {k: client.geometry[k] for k in g}
        if mine != g:
            raise ValueError(f"KvqCache: the pool's geometry {mine} is not the model's {g}")
        super().__init__(layers=[KvqLayer(self, i) for i in range(g["layers"])])
        self.client, self.model = client, model
        self.act = client.geometry["act"]
        self.on_gpu = client.backend == "cuda"
        self.seq = client.sequence(salt)
        if prompt_ids is not None and hasattr(prompt_ids, "tolist"):
            prompt_ids = prompt_ids.tolist()   # a torch.Tensor on any device, or a NumPy array
        self._prompt = None if prompt_ids is None else [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
        self.hit = self.seq.lookup(self._prompt) if self._prompt else 0
        self._steps = 0
        self._owns_client = False
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       model.register_forward_hook(self._post, with_kwargs=True)]

    @classmethod
    def attach(cls, model, pool, model_id, policy="f16", prompt_ids=None, salt=None, socket=None, backend=None,
               block_tokens=32, **kw):
        """Connects, attaches to pool with the model's geometry (the open
        window's dtype: bf16 for a bf16 model, else f16) and makes the
        cache; close() then closes the client too."""
        act = "bf16" if next(model.parameters()).dtype == torch.bfloat16 else "f16"
        client = kvq_attach(pool, model_id, socket=socket, name="kvq.hf", policy=policy, act=act, backend=backend,
                            block_tokens=block_tokens, **geometry(model), **kw)
        try:
            cache = cls(model, client, prompt_ids, salt)
        except BaseException:
            client.close()
            raise
        cache._owns_client = True
        return cache

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.seq.close()
        if self._owns_client:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_seq_length(self, layer_idx=0):
        return self.seq.tokens

    # --- the model's forward: begin before, commit after

    def _pre(self, module, args, kwargs):
        if kwargs.get("past_key_values") is not self:
            return
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            raise ValueError("KvqCache: the model must be given input_ids (the prefix cache keys on token ids)")
        if ids.shape[0] != 1:
            raise ValueError(f"KvqCache: batch size {ids.shape[0]}; a KvqCache holds one sequence (batch size 1)")
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and not bool(mask.all()):
            raise ValueError("KvqCache: padded batches (an attention_mask with zeros, e.g. left padding) are "
                             "refused: give one unpadded sequence")
        tokens = ids[0].tolist()
        if self._steps == 0 and self._prompt is not None and tokens != self._prompt[self.hit:]:
            raise ValueError(f"KvqCache: the first forward got {len(tokens)} tokens that are not the prompt after "
                             f"its cached {self.hit} (prompt_ids[hit:], as generate() passes them)")
        self.seq.begin(tokens)
        self._steps += 1
        _active.cache = self

    def _post(self, module, args, kwargs, output):
        if getattr(_active, "cache", None) is self:
            _active.cache = None
            self.seq.commit()

    # --- K/V and attention

    def _write(self, layer, k, v):
        if k.shape[0] != 1:
            raise ValueError(f"KvqCache: batch size {k.shape[0]}; batch size 1 only")
        want = _TORCH_ACT[self.act]
        dev = k.device if self.on_gpu else "cpu"
        kk = k[0].transpose(0, 1).to(device=dev, dtype=want).contiguous()
        vv = v[0].transpose(0, 1).to(device=dev, dtype=want).contiguous()
        self.seq.write(layer, kk, vv)

    def _attention(self, layer, query, scale):
        q = query[0].transpose(0, 1)   # [n_q, q_heads, head_dim]
        if self.on_gpu and query.is_cuda:
            out = self.seq.attention(layer, q.to(_TORCH_ACT[self.act]).contiguous(), scale=scale)
        else:
            out = self.seq.attention(layer, q.to(device="cpu", dtype=torch.float32).contiguous(), scale=scale)
        return out.to(device=query.device, dtype=query.dtype)[None]   # [1, n_q, q_heads, head_dim]


def kvq_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function interface ("kvq"): attention of the
    step's queries over the sequence as kvqd stores it.  key and value (this
    step's) are already in the pool; attention_mask is not needed (causal,
    unpadded)."""
    cache = getattr(_active, "cache", None)
    if cache is None:
        raise RuntimeError("attn_implementation 'kvq' needs a kvq.hf.KvqCache as past_key_values")
    if getattr(module, "sliding_window", None):
        raise ValueError("kvq: sliding-window attention layers are not supported")
    return cache._attention(module.layer_idx, query, float(scaling) if scaling else 0.0), None


AttentionInterface.register("kvq", kvq_attention)
