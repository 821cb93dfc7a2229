#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Batched generation in Hugging Face transformers, its own KV caches beside
kvq.hf's, on the same model and prompts (part (c) of bench/generate.py's
table).

The model is the GGUF file kvq-run reads (SmolLM2-135M-Instruct), loaded by
transformers' own GGUF loader (the `gguf` package) in FP16 on the GPU;
--batch prompts of --ctx tokens, each a continuation of --text from its own
starting point, --new tokens each (greedy, EOS ignored).  For each cache:

  static      transformers' StaticCache (max length ctx + new)
  dynamic     transformers' DynamicCache
  quantized   transformers' QuantizedCache (its quanto backend, 4 bits);
              where the backend's package is missing, a line says why
  kvq-FORMAT  kvq.hf's KvqCache, attention "kvq", on a cuda pool of the
              kvqd at --socket (the pool made by attach, named after the
              format and the run, with sealed slots for every token of
              the batch and eight open slots a sequence: KIVI's window)

decode tokens/s = batch x new / (time of generate(new + 1) - time of
generate(1)) (the second less the prefill and first token; a warm-up
generate(3) before both: with a static cache transformers compiles the
prefill and the decode step on their first calls), the KV bytes
the cache holds at the end (its tensors' bytes; kvq: the pool's
resident_bytes while the sequences live; not given for QuantizedCache,
whose backend packs its own tensors), and each sequence's tokens equal to static's
(greedy; FP16 on a GPU may differ where two logits tie within rounding).

  python3 bench/generate_hf.py --model M.gguf --text GPL-3 [--batch 64 --ctx 4096 --new 128]
      [--caches static,dynamic,quantized,kvq-int8,kvq-kivi4] [--socket S] [--json FILE]
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, StaticCache  # noqa: E402

transformers.logging.set_verbosity_error()


def load(path, device):
    d, f = os.path.split(os.path.abspath(path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype).to(device).eval()
    return tok, model


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prompts(tok, text, batch, ctx, device):
    """batch windows of ctx tokens of text (repeated as needed), each from its own start."""
    ids = tok(open(text, encoding="utf-8").read(), return_tensors="pt").input_ids[0]
    while ids.numel() < 2 * ctx:
        ids = torch.cat([ids, ids])
    step = max(1, (ids.numel() - ctx) // batch)
    return torch.stack([ids[i * step:i * step + ctx] for i in range(batch)]).to(device)


def kv_bytes(cache):
    n = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                n += t.numel() * t.element_size()
    return n


def make_cache(kind, model, ids, a):
    """(cache, closer, attn implementation) for one generate; raises with the reason."""
    b, ctx = ids.shape
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=ctx + a.new + 1), None, "sdpa"
    if kind == "dynamic":
        return DynamicCache(config=model.config), None, "sdpa"
    if kind == "quantized":
        from transformers import QuantizedCache
        return QuantizedCache(backend="quanto", config=model.config, nbits=4), None, "sdpa"
    if kind.startswith("kvq-"):
        import kvq.hf
        pool = f"bench-hf-{kind[4:]}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        cache = kvq.hf.KvqCache.attach(model, pool, "bench-hf@smollm2", policy=kind[4:], prompt_ids=ids,
                                       attention_mask=torch.ones_like(ids), socket=a.socket,
                                       backend="cuda" if a.device == "cuda" else "host",
                                       n_sealed=b * ((ctx + a.new + 32) // 32 + 1), n_open=8 * b)
        return cache, cache.close, "kvq"
    raise ValueError(f"unknown cache {kind}")


def run(kind, model, ids, a, new):
    cache, close, attn = make_cache(kind, model, ids, a)
    model.set_attn_implementation(attn)
    try:
        sync()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
        sync()
        dt = time.perf_counter() - t0
        if kind.startswith("kvq-"):   # the live sequences' blocks and open slots (kvqd's resident_bytes)
            kv = int(cache.client.figures().get("resident_bytes", 0))
        elif kind == "quantized":   # its backend's packed tensors are not counted here
            kv = None
        else:
            kv = kv_bytes(cache)
        return out[:, ids.shape[1]:], dt, kv
    finally:
        if close:
            close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--caches", default="static,dynamic,quantized,kvq-int8,kvq-kivi4")
    ap.add_argument("--socket", help="kvqd's socket, for the kvq-* caches")
    ap.add_argument("--device", default="cuda", help="cuda (FP16), or cpu (FP32: a check of the script, not figures)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()

    tok, model = load(a.model, a.device)
    ids = prompts(tok, a.text, a.batch, a.ctx, a.device)
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {dev}; "
          f"{os.path.basename(a.model)} in {'FP16' if a.device == 'cuda' else 'FP32'}; "
          f"{a.batch} x {a.ctx} prompt tokens, {a.new} new each")
    rows, ref = [], None
    for kind in a.caches.split(","):
        try:
            run(kind, model, ids, a, 3)   # warm-up: first calls' set-up (and a static cache's compile) out
            first, t1, _ = run(kind, model, ids, a, 1)
            toks, tn, kv = run(kind, model, ids, a, a.new + 1)
        except Exception as e:   # a backend or a pool that is not there: say why, go on
            print(f"{kind:12s} not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            rows.append({"cache": kind, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        dec = a.batch * a.new / (tn - t1)
        if ref is None:
            ref = toks
        same = int((toks == ref).all(dim=1).sum())
        rows.append({"cache": kind, "prefill_s": t1, "generate_s": tn, "decode_tokens_per_s": dec,
                     "step_ms": (tn - t1) / a.new * 1e3, "kv_bytes": kv, "same_as_first": same})
        kvs = f"{kv / 2**30:6.2f} GiB" if kv is not None else "     - GiB"
        print(f"{kind:12s} prefill+1 {t1:7.3f} s  decode {dec:9.0f} tok/s  step {(tn - t1) / a.new * 1e3:7.2f} ms  "
              f"KV {kvs}  sequences equal to {a.caches.split(',')[0]}'s: {same}/{a.batch}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "device": dev, "batch": a.batch, "ctx": a.ctx, "new": a.new,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
