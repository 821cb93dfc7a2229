# SPDX-License-Identifier: Apache-2.0
"""kvq.hf.KvqCache against transformers' own cache, on SmolLM2-135M loaded by
transformers from the project's GGUF (as tools/model-check-hf.py loads it):
  greedy   greedy generation with f16 KV in kvqd equals DynamicCache token
           for token, or its first difference is a near tie: the two
           tokens' logits closer in DynamicCache's run than the two runs'
           logits differ where they agree (both teacher-forced);
  batch    four prompts of different lengths, left-padded, as one batch
           through generate (a quarter of --gen new tokens) with f16 and
           int8 KV: f16 rows equal DynamicCache's on the same batch, every
           row equal to its prompt generated alone with kvq (each or a near
           tie), each row's full blocks published and none with a pad token,
           and the batch again hitting each row's own prompt blocks with the
           same tokens out;
  ppl      int8 and kivi4 KV: perplexity over TEXT in windows of --ctx
           against DynamicCache (delta PPL %, top-1 agreement); with
           --kvq-run, `kvq-run ab` on the same windows, and the check that
           the two deltas are within 0.5 percentage points and the top-1
           agreements within 1 point;
  share    two processes with the same system prompt: hit tokens, cold and
           warm prefill time, equal answers.
A running kvqd at $KVQ_SOCKET.  Prints a JSON line per part and exits 1 if a
check failed.
  python3 test_hf.py --model GGUF --text GPL-3 --share-text Artistic [--device cuda]
                     [--kvq-run KVQ_RUN] [--ctx 512] [--limit 8192] [--batch 128] [--part greedy,batch,ppl,share]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

import kvq.hf  # noqa: E402

transformers.logging.set_verbosity_error()
BLOCK = 16   # passed to kvq-run ab too, so the two put the same tokens in sealed blocks


def load(a):
    d, f = os.path.split(os.path.abspath(a.model))
    dtype = torch.float16 if a.device == "cuda" else torch.float32
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype).to(a.device).eval()
    return tok, m


def backend(a):
    return "cuda" if a.device == "cuda" else "host"


def kvq_cache(a, m, policy, prompt_ids=None, pool=None, salt=None, attention_mask=None):
    # small pools (kvqd's default size is its budget's share): kvq-run ab attaches beside them
    return kvq.hf.KvqCache.attach(m, pool or f"hf-{policy}", "SmolLM2-135M-Instruct.Q4_1", policy=policy,
                                  prompt_ids=prompt_ids, salt=salt, backend=backend(a), block_tokens=BLOCK,
                                  n_sealed=2048, n_open=64, attention_mask=attention_mask)


def first_difference(r, o):
    return next((i for i, (x, y) in enumerate(zip(r, o)) if x != y), None)


def near_tie(a, m, ids, r, o, policy="f16"):
    """Explains the first difference of o (a kvq run) from r (DynamicCache's
    greedy continuation of the prompt ids [1, n], or another kvq run's):
    DynamicCache and a kvq cache of policy teacher-forced along r up to
    it.  Where the two tokens are DynamicCache's top two and their logits
    closer in its run than the two caches' logits differ on the tokens
    where the runs agree, the choice is a near tie that attention over
    float16 (or quantized) KV summed in another order may flip."""
    first = first_difference(r, o)
    if first is None:   # one run stopped (its end of text) where the other went on
        return {"near_tie": False, "lengths": [len(r), len(o)]}
    n = ids.shape[1]
    seq = torch.cat([ids, torch.tensor([r[:first + 1]], device=ids.device)], 1)
    with torch.no_grad():
        m.set_attn_implementation("eager")
        lh = m(seq, past_key_values=DynamicCache(config=m.config), use_cache=True).logits[0].double()
        m.set_attn_implementation("kvq")
        with kvq_cache(a, m, policy, salt=f"explain-{time.monotonic_ns()}".encode()) as c:
            lk = m(seq, past_key_values=c, use_cache=True).logits[0].double()
    at = n - 1 + first   # the position whose logits choose token `first`
    noise = (lh[n - 1:at] - lk[n - 1:at]).abs().max().item() if first else 0.0
    margin = (lh[at, r[first]] - lh[at, o[first]]).item()
    top2 = set(lh[at].topk(2).indices.tolist())
    return {"margin_at_difference": margin, "logit_noise_before": noise,
            "kvq_margin_at_difference": (lk[at, o[first]] - lk[at, r[first]]).item(),
            "near_tie": top2 == {r[first], o[first]} and abs(margin) <= noise}


def greedy(a, tok, m):
    ids = tok(open(a.share_text).read()[:3000], return_tensors="pt").input_ids.to(a.device)
    m.set_attn_implementation("eager")
    ref = m.generate(ids, past_key_values=DynamicCache(config=m.config), max_new_tokens=a.gen, do_sample=False)
    m.set_attn_implementation("kvq")
    with kvq_cache(a, m, "f16", salt=b"greedy") as c:
        out = m.generate(ids, past_key_values=c, max_new_tokens=a.gen, do_sample=False)
    r, o = ref[0, ids.shape[1]:].tolist(), out[0, ids.shape[1]:].tolist()
    first = first_difference(r, o)
    res = {"part": "greedy", "prompt_tokens": ids.shape[1], "new_tokens": len(r), "equal": r == o,
           "first_difference": first, "hf": tok.decode(r), "kvq": tok.decode(o)}
    if first is None:
        return res, r == o
    res.update(near_tie(a, m, ids, r, o))
    return res, res["near_tie"]


def batch_prompts(a, tok):
    """Prompts of different lengths (one the start of another: blocks two
    rows publish alike), left-padded as generate wants them."""
    words = open(a.share_text).read().split()
    texts = [" ".join(words[s:s + n]) for s, n in ((0, 30), (100, 60), (300, 80), (0, 50))]
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(texts, return_tensors="pt", padding=True).to(a.device)
    real = [row[mk.bool()] for row, mk in zip(enc.input_ids, enc.attention_mask)]
    return enc, real


def batch(a, tok, m):
    """One padded batch through generate: f16 rows equal DynamicCache's on
    the same batch, every row equal to its prompt generated alone with kvq,
    each row's blocks (prompt and generated) published and no block with a
    pad token; then the same batch again, each row hitting its own prompt's
    full blocks (so the rows skip different numbers of cached tokens) with
    the same tokens out."""
    enc, real = batch_prompts(a, tok)
    width, gen = enc.input_ids.shape[1], a.gen // 4
    m.set_attn_implementation("eager")
    ref = m.generate(**enc, past_key_values=DynamicCache(config=m.config), max_new_tokens=gen, do_sample=False)
    m.set_attn_implementation("kvq")
    res, ok = {"part": "batch", "rows": len(real), "width": width, "real": [len(r) for r in real],
               "new_tokens": gen, "policies": {}}, True
    for policy in ("f16", "int8"):
        d, salt = {}, f"batch-{policy}-{time.monotonic_ns()}".encode()
        with kvq_cache(a, m, policy, prompt_ids=enc.input_ids, attention_mask=enc.attention_mask, salt=salt) as c:
            out = m.generate(**enc, past_key_values=c, max_new_tokens=gen, do_sample=False)
            d["first_hits"], d["stored"] = c.hits, c.tokens
        rows = [out[i, width:].tolist() for i in range(len(real))]
        # DynamicCache on the same padded batch (f16: token for token, or a near tie)
        if policy == "f16":
            d["vs_dynamic"] = []
            for i, r in enumerate(real):
                ri = ref[i, width:].tolist()
                e = {"equal": ri == rows[i]}
                if not e["equal"]:
                    e.update(near_tie(a, m, r[None], ri, rows[i]))
                ok &= e["equal"] or e["near_tie"]
                d["vs_dynamic"].append(e)
        # each prompt alone (batch 1, unpadded) with kvq: generate stops a row alone at its end
        # (or a near tie: the batch's matrix products may round other than the prompt's alone)
        d["vs_alone"] = []
        for i, r in enumerate(real):
            with kvq_cache(a, m, policy, salt=salt + f"-alone-{i}".encode()) as c:
                alone = m.generate(r[None], past_key_values=c, max_new_tokens=gen, do_sample=False)[0, len(r):].tolist()
            e = {"equal": alone == rows[i][:len(alone)]}
            if not e["equal"]:
                e.update(near_tie(a, m, r[None], alone, rows[i], policy))
            ok &= e["equal"] or e["near_tie"]
            d["vs_alone"].append(e)
        # what the rows published: every full block of each row's real tokens, none with padding
        with kvq_cache(a, m, policy) as c:
            d["published_hits"], d["padded_hits"], want = [], [], []
            for i, r in enumerate(real):
                toks = r.tolist() + rows[i]   # the last token was never fed back: not stored
                with c.client.sequence(salt) as s:
                    d["published_hits"].append(s.lookup(toks))
                want.append((len(toks) - 1) // BLOCK * BLOCK)
                if len(r) < width:
                    with c.client.sequence(salt) as s:
                        d["padded_hits"].append(s.lookup(out[i].tolist()))
        ok &= d["published_hits"] == want and not any(d["padded_hits"])
        ok &= d["stored"] == [len(r) + out.shape[1] - width - 1 for r in real]
        # again: each row finds its prompt's full blocks; the cache reports the columns all rows have
        with kvq_cache(a, m, policy, prompt_ids=enc.input_ids, attention_mask=enc.attention_mask, salt=salt) as c:
            again = m.generate(**enc, past_key_values=c, max_new_tokens=gen, do_sample=False)
            d["hits"], d["hit_columns"] = c.hits, c.hit
        pads = [width - len(r) for r in real]
        ok &= d["hits"] == [(len(r) - 1) // BLOCK * BLOCK for r in real]
        ok &= d["hit_columns"] == min(p + h for p, h in zip(pads, d["hits"]))
        d["again_equal"] = again.tolist() == out.tolist()
        ok &= d["again_equal"]
        res["policies"][policy] = d
    return res, ok


def window_logits(a, m, ids, cache):
    """Logits of a window fed in chunks of --batch tokens, as kvq-run ab
    feeds it: a chunk's queries see the blocks earlier chunks sealed
    (quantized) and their own tokens as written."""
    with torch.no_grad():
        return torch.cat([m(ids[:, i:i + a.batch], past_key_values=cache, use_cache=True).logits[0].double()
                          for i in range(0, ids.shape[1], a.batch)])


def ppl(a, tok, m):
    ids = tok(open(a.text).read(), return_tensors="pt").input_ids[0][:a.limit]
    wins = [ids[i:i + a.ctx] for i in range(0, len(ids) - a.ctx + 1, a.ctx)]
    refs = []
    m.set_attn_implementation("eager")
    for w in wins:
        refs.append(window_logits(a, m, w[None].to(a.device), DynamicCache(config=m.config)))
    m.set_attn_implementation("kvq")
    res, ok = {"part": "ppl", "ctx": a.ctx, "windows": len(wins), "policies": {}}, True

    def nll(logits, w):
        lp = torch.log_softmax(logits[:-1], -1)
        return -lp[torch.arange(len(w) - 1), w[1:].to(lp.device)].sum().item(), len(w) - 1

    base = sum(nll(r, w)[0] for r, w in zip(refs, wins)) / sum(len(w) - 1 for w in wins)
    for policy in ("f16", "int8", "kivi4"):
        tot, agree, n = 0.0, 0, 0
        for i, w in enumerate(wins):
            with kvq_cache(a, m, policy, salt=f"ppl-{i}".encode()) as c:
                lg = window_logits(a, m, w[None].to(a.device), c)
            tot += nll(lg, w)[0]
            # over the scored positions (each predicts the next token), as kvq-run ab counts them
            agree += (lg[:-1].argmax(-1) == refs[i][:-1].argmax(-1)).sum().item()
            n += len(w) - 1
        d = {"ppl_hf": math.exp(base), "ppl_kvq": math.exp(tot / sum(len(w) - 1 for w in wins)),
             "top1_vs_hf": agree / n}
        d["dppl_pct"] = 100 * (d["ppl_kvq"] / d["ppl_hf"] - 1)
        res["policies"][policy] = d
    if a.kvq_run:
        cmd = [a.kvq_run, "ab", "--model", a.model, "--kv", "int8", "--kv", "kivi4", "--ctx", str(a.ctx), "--limit", str(a.limit),
               "--gen", "0", "--block", str(BLOCK), "--batch", str(a.batch), "--json", a.text] + (["--gpu"] if a.device == "cuda" else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
        ab = json.loads(p.stdout)
        for r in ab["results"]:
            d = res["policies"][r["kv"]]
            d["ab_dppl_pct"], d["ab_top1"] = r["dppl_pct"], r["top1"]
            d["within"] = abs(d["dppl_pct"] - r["dppl_pct"]) <= 0.5 and abs(d["top1_vs_hf"] - r["top1"]) <= 0.01
            ok &= d["within"]
    return res, ok


def share_worker(a, question):
    """One process: the system prompt + question through a KvqCache (int8),
    prompt ids looked up; prints hit, prefill seconds and the answer."""
    tok, m = load(a)
    m.set_attn_implementation("kvq")
    ids = tok(open(a.share_text).read() + "\n\nQuestion: " + question + "\nAnswer:", return_tensors="pt").input_ids
    ids = ids.to(a.device)
    # warm up (CUDA context, kernels, cuBLAS handles) on the prompt's last 16 tokens,
    # in a pool of its own, so that the timed prefill is the prefill
    with torch.no_grad(), kvq_cache(a, m, "int8", pool="hf-share-warmup") as c:
        m(ids[:, -16:], past_key_values=c, use_cache=True)
    if a.device == "cuda":
        torch.cuda.synchronize()
    with kvq_cache(a, m, "int8", prompt_ids=ids[0], pool="hf-share") as c:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = m(ids[:, c.hit:], past_key_values=c, use_cache=True)
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(json.dumps({"hit": c.hit, "prompt_tokens": ids.shape[1], "prefill_s": dt,
                          "next": int(out.logits[0, -1].argmax())}))


def share(a):
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, __file__, "--worker"] + sys.argv[1:], capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"share worker: exit {p.returncode}: {p.stderr.strip()[-3000:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    ok = cold["hit"] == 0 and warm["hit"] > 0 and warm["next"] == cold["next"]
    return {"part": "share", "cold": cold, "warm": warm, "speedup": cold["prefill_s"] / warm["prefill_s"]}, ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--share-text", default="/usr/share/common-licenses/Artistic")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--kvq-run")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--limit", type=int, default=8192,
                    help="tokens of TEXT scored (GPL-3 holds about 8000; over 2048, one standard error of a 6 %% top-1 disagreement is half a point)")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--batch", type=int, default=128, help="prefill chunk of the ppl part, kvq-run ab's too")
    ap.add_argument("--part", default="greedy,batch,ppl,share")
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        share_worker(a, "What may I do with the Standard Version?")
        return 0
    ok_all = True
    tok, m = load(a)
    for part in a.part.split(","):
        res, ok = {"greedy": lambda: greedy(a, tok, m), "batch": lambda: batch(a, tok, m),
                   "ppl": lambda: ppl(a, tok, m), "share": lambda: share(a)}[part]()
        res["ok"] = ok
        print(json.dumps(res))
        sys.stdout.flush()
        ok_all &= ok
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
