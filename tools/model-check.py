#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Independent check of kvq-run's FP16-KV forward pass and tokenizer.

Reference, written separately from examples/kvq-run/ and sharing no code
with it:
  * weights: read and dequantized by the `gguf` Python package
    (gguf.GGUFReader, gguf.quants.dequantize: Q4_1, Q8_0, F32);
  * tokens: the `tokenizers` library (Rust BPE) built from the GGUF's
    vocabulary and merges with SmolLM2's pre-tokenizer (Digits(individual)
    then ByteLevel, no prefix space);
  * forward: a float64 numpy Llama written the Hugging Face way: Q/K rows
    un-permuted back to the checkpoint's order and RoPE by rotate_half
    (kvq-run keeps GGUF's order and turns adjacent pairs), plain softmax
    attention over K/V rounded to FP16 (what FP16 KV stores; the logit
    difference without that rounding is printed too).
Tolerance (stated before looking at a KV format): identical token ids; logits
max |diff| <= 0.1 and mean |diff| <= 0.01 (logits have a spread of about 8);
the same top-1 token at >= 99 % of positions; perplexity within 0.1 %.
It compares the token ids with `kvq-run tokenize` and the logits with
`kvq-run perplexity --kv f16 --dump`.  Usage (a running kvqd, KVQ_SOCKET):
  python3 tools/model-check.py KVQ_RUN MODEL.gguf TEXTFILE [N_TOKENS]
  python3 tools/model-check.py tokens KVQ_RUN MODEL.gguf FILE...   (token ids only)
Needs numpy, gguf and tokenizers (tools/model-check.sh makes a venv).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def field_strs(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_val(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]][0].item()


def hf_tokenizer(r):
    toks = field_strs(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field_strs(r, "tokenizer.ggml.merges")]
    tf = r.fields["tokenizer.ggml.token_type"]
    types = [int(tf.parts[i][0]) for i in tf.data]
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges, unk_token=toks[0]))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(toks, types) if ty == 3])
    return tk


class Ref:
    def __init__(self, r, kv_f16=True):
        self.kv_f16 = kv_f16
        self.t = {t.name: t for t in r.tensors}
        self.L = field_val(r, "llama.block_count")
        self.dim = field_val(r, "llama.embedding_length")
        self.nh = field_val(r, "llama.attention.head_count")
        self.nkv = field_val(r, "llama.attention.head_count_kv")
        self.eps = field_val(r, "llama.attention.layer_norm_rms_epsilon")
        self.base = field_val(r, "llama.rope.freq_base")
        self.hd = self.dim // self.nh

    def w(self, name):
        t = self.t[name]
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            [int(x) for x in reversed(t.shape)])

    def unpermute(self, w, heads):
        # inverse of the GGUF converter's permute (HF rotate_half order back)
        return w.reshape(heads, self.hd // 2, 2, w.shape[-1]).swapaxes(1, 2).reshape(w.shape)

    def forward(self, ids):
        n = len(ids)
        emb = self.w("token_embd.weight")
        x = emb[ids]
        inv = 1.0 / self.base ** (np.arange(0, self.hd, 2) / self.hd)
        ang = np.outer(np.arange(n), inv)
        cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

        def rms(v, g):
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + self.eps) * g

        def rot(v):  # v: [heads, n, hd]
            h = self.hd // 2
            return v * cos + np.concatenate([-v[..., h:], v[..., :h]], -1) * sin

        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = rms(x, self.w(p + "attn_norm.weight"))
            q = h @ self.unpermute(self.w(p + "attn_q.weight"), self.nh).T
            k = h @ self.unpermute(self.w(p + "attn_k.weight"), self.nkv).T
            v = h @ self.w(p + "attn_v.weight").T
            q = rot(q.reshape(n, self.nh, self.hd).transpose(1, 0, 2))
            k = rot(k.reshape(n, self.nkv, self.hd).transpose(1, 0, 2))
            v = v.reshape(n, self.nkv, self.hd).transpose(1, 0, 2)
            if self.kv_f16:  # FP16 KV stores K (after RoPE) and V rounded to half
                k = k.astype(np.float16).astype(np.float64)
                v = v.astype(np.float16).astype(np.float64)
            g = self.nh // self.nkv
            k, v = np.repeat(k, g, 0), np.repeat(v, g, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(self.hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            a = (s / s.sum(-1, keepdims=True)) @ v
            x = x + a.transpose(1, 0, 2).reshape(n, self.dim) @ self.w(p + "attn_output.weight").T
            h = rms(x, self.w(p + "ffn_norm.weight"))
            gt = h @ self.w(p + "ffn_gate.weight").T
            up = h @ self.w(p + "ffn_up.weight").T
            x = x + (gt / (1 + np.exp(-gt)) * up) @ self.w(p + "ffn_down.weight").T
        out = self.w("output.weight") if "output.weight" in self.t else emb
        return rms(x, self.w("output_norm.weight")) @ out.T


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def tokens_only(kvq_run, model, files):
    """Token ids of each UTF-8 file from kvq-run and from the reference."""
    tk = hf_tokenizer(GGUFReader(model))
    env = dict(os.environ, KVQ_MODEL=model)
    n = equal = non_ascii = tokens = 0
    bad = []
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if "\0" in text or len(text) > 60000:   # one argv string
            continue
        ref = tk.encode(text).ids
        out = subprocess.run([kvq_run, "tokenize", text], env=env, check=True, capture_output=True,
                             text=True).stdout.split()
        n += 1
        non_ascii += any(ord(c) > 127 for c in text)
        tokens += len(ref)
        if [int(x) for x in out] == ref:
            equal += 1
        else:
            bad.append(f)
    print(json.dumps({"files": n, "with_non_ascii": non_ascii, "tokens": tokens, "equal": equal,
                      "mismatches": bad[:10]}, indent=1))
    return 0 if n and equal == n else 1


def main():
    if sys.argv[1] == "tokens":
        return tokens_only(sys.argv[2], sys.argv[3], sys.argv[4:])
    kvq_run, model, textfile = sys.argv[1:4]
    n_tok = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    r = GGUFReader(model)
    tk = hf_tokenizer(r)
    text = open(textfile, encoding="utf-8").read()
    ref_ids = tk.encode(text).ids
    env = dict(os.environ, KVQ_MODEL=model)
    c_ids = [int(x) for x in subprocess.run([kvq_run, "tokenize", text], env=env, check=True,
                                            capture_output=True, text=True).stdout.split()]
    tok_equal = c_ids == ref_ids
    with tempfile.NamedTemporaryFile() as dump:
        subprocess.run([kvq_run, "perplexity", "--kv", "f16", "--ctx", str(n_tok), "--limit", str(n_tok),
                        "--dump", dump.name, textfile], env=env, check=True, capture_output=True)
        raw = open(dump.name, "rb").read()
    n = int(np.frombuffer(raw[:4], np.uint32)[0])
    ids = np.frombuffer(raw[4:4 + 4 * n], np.uint32)
    c_logits = np.frombuffer(raw[4 + 4 * n:], np.float32).reshape(n, -1).astype(np.float64)
    ref = Ref(r).forward([int(i) for i in ids])
    ref32 = Ref(r, kv_f16=False).forward([int(i) for i in ids])
    d = np.abs(c_logits - ref)
    lc, lr = log_softmax(c_logits), log_softmax(ref)
    tgt = ids[1:]
    nll_c = -lc[np.arange(n - 1), tgt].mean()
    nll_r = -lr[np.arange(n - 1), tgt].mean()
    kl = (np.exp(lr) * (lr - lc)).sum(-1).mean()
    res = {
        "text": textfile, "tokens_compared": len(ref_ids), "token_ids_equal": tok_equal,
        "first_token_mismatch": next((i for i, (a, b) in enumerate(zip(c_ids, ref_ids)) if a != b),
                                     None if len(c_ids) == len(ref_ids) else min(len(c_ids), len(ref_ids))),
        "logit_tokens": n, "max_abs_logit_diff": float(d.max()), "mean_abs_logit_diff": float(d.mean()),
        "logit_std": float(ref.std()),
        "max_abs_logit_diff_ref_kv_unrounded": float(np.abs(c_logits - ref32).max()), "top1_agreement": float((c_logits.argmax(-1) == ref.argmax(-1)).mean()),
        "ppl_kvq_run": float(np.exp(nll_c)), "ppl_reference": float(np.exp(nll_r)), "kl_ref_to_kvq_run": float(kl),
    }
    print(json.dumps(res, indent=1))
    ok = (tok_equal and res["max_abs_logit_diff"] <= 0.1 and res["mean_abs_logit_diff"] <= 0.01 and
          res["top1_agreement"] >= 0.99 and abs(res["ppl_kvq_run"] / res["ppl_reference"] - 1) <= 0.001)
    print("AGREE" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
