#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Check of kvq-run's FP16-KV forward pass and tokenizer against Hugging Face
transformers, which loads the same .gguf file.

The reference is transformers' own code, used as it is:
  * model: AutoModelForCausalLM.from_pretrained(dir, gguf_file=name) -- its
    GGUF loader dequantizes the tensors (through the `gguf` package), undoes
    the converter's Q/K permutation and builds a LlamaForCausalLM (tied
    embeddings, RMSNorm eps, RoPE base from the file's metadata);
  * tokens: AutoTokenizer.from_pretrained(dir, gguf_file=name) -- its GGUF
    tokenizer converter builds a fast (Rust) BPE tokenizer from the file's
    vocabulary and merges.  That converter ignores `tokenizer.ggml.pre` and
    always pre-tokenizes the GPT-2 way; SmolLM2's file says `smollm` (digits
    split one by one first, then GPT-2's split, as llama.cpp reads it), so
    the ids are compared twice: with transformers' tokenizer as it loads
    (printed, not judged: it differs where two or more whitespace
    characters stand before a digit) and with the same tokenizer given the
    pre-tokenizer the file names (judged).
The forward runs once over the first N tokens (no KV cache in the judged
pass), in float32 -- the pass that is judged -- and, as diagnostics, in
float64 and in float32 with a cache that rounds K (after RoPE) and V to
FP16, which is what FP16 KV stores.
Tolerance (the one of tools/model-check.py, stated before looking at a KV
format), judged against the plain float32 pass: identical token ids (with
the file's pre-tokenizer, see above); logits max |diff| <= 0.1 and mean
|diff| <= 0.01; the same top-1 token at >= 99 % of positions; perplexity
within 0.1 %.
It compares the token ids with `kvq-run tokenize` and the logits with
`kvq-run perplexity --kv f16 --dump`.  Usage (a running kvqd, KVQ_SOCKET):
  python3 tools/model-check-hf.py KVQ_RUN MODEL.gguf TEXTFILE [N_TOKENS]
  python3 tools/model-check-hf.py tokens KVQ_RUN MODEL.gguf FILE...   (token ids only)
Needs torch, transformers, accelerate, gguf (tools/model-check-hf.sh makes a venv).
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file: nothing is fetched
os.environ.setdefault("TQDM_DISABLE", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from tokenizers import Tokenizer, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(int(os.environ.get("KVQ_CHECK_THREADS", "2")))


def load_tokenizer(model):
    d, f = os.path.split(os.path.abspath(model))
    return AutoTokenizer.from_pretrained(d, gguf_file=f)


def load_tokenizers(model):
    """transformers' tokenizer as it loads the file, and the same one with the
    pre-tokenizer that the file's `tokenizer.ggml.pre` names."""
    fixed = load_tokenizer(model)
    as_is = Tokenizer.from_str(fixed.backend_tokenizer.to_str())   # a copy, encode(text).ids
    fld = GGUFReader(model).fields.get("tokenizer.ggml.pre")
    pre = bytes(fld.parts[fld.data[0]]).decode() if fld else None
    if pre == "smollm":   # as llama.cpp reads it: digits, then GPT-2's split
        fixed.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre not in (None, "gpt-2", "default"):
        print(f"tokenizer.ggml.pre = {pre}: the tokenizer is used as transformers loads it", file=sys.stderr)
    return as_is, fixed, pre


def kvq_tokens(kvq_run, model, text):
    env = dict(os.environ, KVQ_MODEL=model)
    out = subprocess.run([kvq_run, "tokenize", text], env=env, check=True, capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


class F16Cache(DynamicCache):
    """A DynamicCache that stores K and V rounded to FP16 (as FP16 KV does)."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states.half().to(key_states.dtype), value_states.half().to(value_states.dtype),
                              layer_idx, *args, **kwargs)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(c_logits, ref, ids):
    """kvq-run's logits against a reference's, both float64 [n, vocab]."""
    n = len(ids)
    d = np.abs(c_logits - ref)
    lc, lr = log_softmax(c_logits), log_softmax(ref)
    tgt = ids[1:]
    nll_c = -lc[np.arange(n - 1), tgt].mean()
    nll_r = -lr[np.arange(n - 1), tgt].mean()
    return {
        "max_abs_logit_diff": float(d.max()), "mean_abs_logit_diff": float(d.mean()),
        "top1_agreement": float((c_logits.argmax(-1) == ref.argmax(-1)).mean()),
        "ppl_kvq_run": float(np.exp(nll_c)), "ppl_reference": float(np.exp(nll_r)),
        "kl_ref_to_kvq_run": float((np.exp(lr) * (lr - lc)).sum(-1).mean()),
    }


def tokens_only(kvq_run, model, files):
    """Token ids of each UTF-8 file from kvq-run and from transformers' tokenizer."""
    as_is, tk, pre = load_tokenizers(model)
    n = equal = equal_as_is = non_ascii = tokens = 0
    bad = []
    for f in files:
        try:
            text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if "\0" in text or len(text) > 60000:   # one argv string
            continue
        ref = tk(text).input_ids
        n += 1
        non_ascii += any(ord(c) > 127 for c in text)
        tokens += len(ref)
        c = kvq_tokens(kvq_run, model, text)
        equal_as_is += c == as_is.encode(text).ids
        if c == ref:
            equal += 1
        else:
            bad.append(f)
    print(json.dumps({"reference": "transformers " + transformers.__version__, "tokenizer_ggml_pre": pre,
                      "files": n, "with_non_ascii": non_ascii, "tokens": tokens, "equal": equal,
                      "mismatches": bad[:10], "equal_transformers_pre_tokenizer_as_loaded": equal_as_is},
                     indent=1))
    return 0 if n and equal == n else 1


def main():
    if sys.argv[1] == "tokens":
        return tokens_only(sys.argv[2], sys.argv[3], sys.argv[4:])
    kvq_run, model, textfile = sys.argv[1:4]
    n_tok = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    text = open(textfile, encoding="utf-8").read()
    as_is, tk, pre = load_tokenizers(model)
    ref_ids = tk(text).input_ids
    as_is_ids = as_is.encode(text).ids
    c_ids = kvq_tokens(kvq_run, model, text)
    tok_equal = c_ids == ref_ids

    def first_mismatch(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                    None if len(a) == len(b) else min(len(a), len(b)))
    env = dict(os.environ, KVQ_MODEL=model)
    with tempfile.NamedTemporaryFile() as dump:
        subprocess.run([kvq_run, "perplexity", "--kv", "f16", "--ctx", str(n_tok), "--limit", str(n_tok),
                        "--dump", dump.name, textfile], env=env, check=True, capture_output=True)
        raw = open(dump.name, "rb").read()
    n = int(np.frombuffer(raw[:4], np.uint32)[0])
    ids = np.frombuffer(raw[4:4 + 4 * n], np.uint32).astype(np.int64)
    c_logits = np.frombuffer(raw[4 + 4 * n:], np.float32).reshape(n, -1).astype(np.float64)

    d, f = os.path.split(os.path.abspath(model))
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    x = torch.from_numpy(ids)[None]
    with torch.no_grad():
        ref = m(x, use_cache=False).logits[0].double().numpy()
        ref_f16kv = m(x, past_key_values=F16Cache(config=m.config), use_cache=True).logits[0].double().numpy()
        m = m.to(torch.float64)
        ref64 = m(x, use_cache=False).logits[0].numpy()

    res = {
        "text": textfile, "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                                       f"attention {m.config._attn_implementation}, float32",
        "tokenizer_ggml_pre": pre, "tokens_compared": len(ref_ids), "token_ids_equal": tok_equal,
        "first_token_mismatch": first_mismatch(c_ids, ref_ids),
        "token_ids_equal_transformers_pre_tokenizer_as_loaded": c_ids == as_is_ids,
        "first_token_mismatch_transformers_pre_tokenizer_as_loaded": first_mismatch(c_ids, as_is_ids),
        "dump_ids_equal": ids.tolist() == ref_ids[:n], "logit_tokens": n, "logit_std": float(ref.std()),
    }
    res.update(compare(c_logits, ref, ids))
    res["float64"] = compare(c_logits, ref64, ids)
    res["float32_kv_rounded_to_f16"] = compare(c_logits, ref_f16kv, ids)
    res["max_abs_diff_reference_float32_vs_float64"] = float(np.abs(ref - ref64).max())
    print(json.dumps(res, indent=1))
    ok = (tok_equal and res["dump_ids_equal"] and res["max_abs_logit_diff"] <= 0.1 and
          res["mean_abs_logit_diff"] <= 0.01 and res["top1_agreement"] >= 0.99 and
          abs(res["ppl_kvq_run"] / res["ppl_reference"] - 1) <= 0.001)
    print("AGREE" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
