#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Batched generation on the real model, every KV format, in one run.

kvq-run generate (batched through libkvq's kvq_batch) on SmolLM2-135M, each
run against a kvqd of its own that this script starts on a temporary socket:

  (a) every format at the same batch and context (default 64 x 4096 and
      256 x 2048 prompt tokens, 128 new tokens each): decode tokens/s and
      per-token (per-step) latency, against f16;
  (b) the largest batch each format fits in one KV budget (default 8 GiB)
      at 4096 tokens (its bytes per token measured in (a)), and its
      tokens/s: the effective batch against f16;
  (c) with --hf CACHES, the same model in transformers at the first shape
      (bench/generate_hf.py: its StaticCache, DynamicCache, QuantizedCache
      and kvq.hf's cache on this run's kvqd), against StaticCache.

Prints one table, and with --json the figures as one JSON document.
Beside each format its two monitoring figures: KV bytes per token and the
effective batch gain over f16 at equal memory.

  bench/generate.py --kvq-run BUILD/examples/kvq-run/kvq-run --kvqd BUILD/daemon/kvqd \\
      --model SmolLM2-135M-Instruct.Q4_1.gguf --text /usr/share/common-licenses/GPL-3 [--gpu]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


class Kvqd:
    """A kvqd of its own on a temporary socket, for one kvq-run (or one
    transformers run): its pools go when it stops, so no run's pool holds
    memory the next one needs; pools created on attach may take the whole
    memory budget (the default, a quarter of it, is under what 256 x 2048
    f16 asks on an 80 GB GPU)."""

    def __init__(self, kvqd):
        self.kvqd = kvqd

    def __enter__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvq-generate.")
        self.sock = os.path.join(self.tmp.name, "kvqd.sock")
        conf = os.path.join(self.tmp.name, "kvqd.conf")
        with open(conf, "w") as f:
            f.write("[kvqd]\ncreate_memory_share = 100%\n")
        self.p = subprocess.Popen([self.kvqd, "--config", conf, "--backend", "host", "--socket", self.sock,
                                   "--foreground", "--log-level", "warning"])
        for _ in range(500):
            if os.path.exists(self.sock):
                return self
            if self.p.poll() is not None:
                break
            time.sleep(0.01)
        self.__exit__()
        raise SystemExit("kvqd did not start")

    def __exit__(self, *exc):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        self.p.wait(10)
        self.tmp.cleanup()


def generate(a, kv, seqs, ctx):
    """One kvq-run generate on a kvqd of its own; its JSON report, or None
    with the reason on stderr."""
    with Kvqd(a.kvqd) as d:
        cmd = [a.kvq_run, "generate", "--kv", kv, "--seqs", str(seqs), "--ctx", str(ctx), "--max-tokens", str(a.new),
               "--ignore-eos", "--no-prefix-cache", "--json", "--model", a.model, "--socket", d.sock, a.text]
        if a.gpu:
            cmd.insert(2, "--gpu")
        cmd[2:2] = a.run_arg or []
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        sys.stderr.write(f"{kv} {seqs}x{ctx}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}\n")
        return None
    j = json.loads(r.stdout)
    j.pop("sequences", None)     # the texts: not figures
    return j


def figures(j):
    return {"decode_tokens_per_s": j["decode_tokens_per_s"], "tokens_per_s": j["tokens_per_s"],
            "decode_step_ms": j["decode_step_ms"]["mean"], "decode_step_ms_p99": j["decode_step_ms"]["p99"],
            "attention_share_decode": j["attention_share_decode"], "kv_bytes_peak": j["kv_bytes_peak"],
            "kv_tokens_peak": j["kv_tokens_peak"], "prefill_seconds": j["prefill_seconds"],
            "bytes_per_token": j["kv_bytes_peak"] / max(1, j["kv_tokens_peak"]),
            "decode_step_parts_ms": j.get("decode_step_parts_ms")}


def transformers_rows(a, shape):
    """(c): bench/generate_hf.py at shape on a kvqd of its own; its JSON, or {"error": why}."""
    with Kvqd(a.kvqd) as d:
        js = os.path.join(d.tmp.name, "hf.json")
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "generate_hf.py"),
               "--model", a.model, "--text", a.text, "--batch", str(shape[0]), "--ctx", str(shape[1]),
               "--new", str(a.new), "--caches", a.hf, "--socket", d.sock, "--json", js]
        if not a.gpu:
            cmd += ["--device", "cpu"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        if r.returncode != 0 or not os.path.exists(js):
            err = r.stderr.strip().splitlines()
            return {"error": err[-1] if err else f"exit {r.returncode}"}
        with open(js) as fh:
            return json.load(fh)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvq-run", required=True)
    ap.add_argument("--kvqd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--gpu", action="store_true", help="kvq-run's GPU path (cuda pools)")
    ap.add_argument("--formats", default="f16,int8,fp8,int4g32,kivi4,kivi2")
    ap.add_argument("--shapes", default="64x4096,256x2048", help="sequences x prompt tokens, comma-separated")
    ap.add_argument("--new", type=int, default=128, help="new tokens per sequence")
    ap.add_argument("--budget-gib", type=float, default=8.0, help="KV budget of (b)")
    ap.add_argument("--budget-ctx", type=int, default=4096, help="prompt tokens of (b)")
    ap.add_argument("--max-seqs", type=int, default=1024, help="kvq-run's limit")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--run-arg", action="append", metavar="ARG",
                    help="an argument for every kvq-run (repeat it), e.g. --tf32, --fp16 or --no-graphs with --gpu")
    ap.add_argument("--hf", metavar="CACHES",
                    help="(c): bench/generate_hf.py's caches (e.g. static,dynamic,quantized,kvq-int8,kvq-kivi4) "
                         "at the first shape, on this run's kvqd")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    formats = a.formats.split(",")
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    out = {"model": os.path.basename(a.model), "path": "gpu" if a.gpu else "cpu", "new_tokens": a.new,
           "kvq_run_args": a.run_arg or [],
           "same_shape": [], "budget": []}
    bpt = {}
    for seqs, ctx in shapes:
        base = None
        for kv in formats:
            j = generate(a, kv, seqs, ctx)
            if j is None:
                continue
            f = figures(j)
            bpt.setdefault(kv, f["bytes_per_token"])
            if kv == "f16":
                base = f
            f.update(kv=kv, seqs=seqs, ctx=ctx,
                     vs_f16=f["decode_tokens_per_s"] / base["decode_tokens_per_s"] if base else None)
            out["same_shape"].append(f)
    budget = int(a.budget_gib * 2**30)
    base = None
    for kv in formats:
        if kv not in bpt:
            continue
        seqs = min(a.max_seqs, int(budget // (bpt[kv] * (a.budget_ctx + a.new))))
        j = generate(a, kv, seqs, a.budget_ctx) if seqs > 0 else None
        if j is None:
            continue
        f = figures(j)
        if kv == "f16":
            base = f | {"seqs": seqs}
        f.update(kv=kv, seqs=seqs, ctx=a.budget_ctx, budget_bytes=budget,
                 batch_vs_f16=seqs / base["seqs"] if base else None,
                 tokens_per_s_vs_f16=f["decode_tokens_per_s"] / base["decode_tokens_per_s"] if base else None)
        out["budget"].append(f)
    if a.hf:
        out["transformers"] = transformers_rows(a, shapes[0])
    print(f"{out['model']}, {out['path']} path, {a.new} new tokens per sequence"
          + (f", kvq-run {' '.join(out['kvq_run_args'])}" if out["kvq_run_args"] else ""))
    print("(a) same batch and context")
    print(f"{'format':8} {'shape':>10} {'decode tok/s':>13} {'vs f16':>7} {'step ms':>8} {'p99':>7} {'attn':>6} "
          f"{'KV GiB':>7} {'B/token':>8}")
    for f in out["same_shape"]:
        vs = f"{f['vs_f16']:.2f}" if f["vs_f16"] else "-"
        print(f"{f['kv']:8} {f['seqs']:>4}x{f['ctx']:<5} {f['decode_tokens_per_s']:13.0f} {vs:>7} "
              f"{f['decode_step_ms']:8.2f} {f['decode_step_ms_p99']:7.2f} {100 * f['attention_share_decode']:5.1f}% "
              f"{f['kv_bytes_peak'] / 2**30:7.2f} {f['bytes_per_token']:8.0f}")
    print("    where a decode step went, ms (host: rows, begin, layers, commit, output; "
          "GPU: K/V write, attention, the layers' span)")
    for f in out["same_shape"]:
        p = f.get("decode_step_parts_ms")
        if p:
            print(f"    {f['kv']:8} {f['seqs']:>4}x{f['ctx']:<5} " + " ".join(f"{k} {v:.3f}" for k, v in p.items()))
    print(f"(b) the largest batch in {a.budget_gib:g} GiB of KV at {a.budget_ctx} prompt tokens")
    print(f"{'format':8} {'batch':>6} {'vs f16':>7} {'decode tok/s':>13} {'vs f16':>7} {'step ms':>8} {'KV GiB':>7}")
    for f in out["budget"]:
        b = f"{f['batch_vs_f16']:.2f}" if f["batch_vs_f16"] else "-"
        t = f"{f['tokens_per_s_vs_f16']:.2f}" if f["tokens_per_s_vs_f16"] else "-"
        print(f"{f['kv']:8} {f['seqs']:6} {b:>7} {f['decode_tokens_per_s']:13.0f} {t:>7} {f['decode_step_ms']:8.2f} "
              f"{f['kv_bytes_peak'] / 2**30:7.2f}")
    if a.hf:
        t = out["transformers"]
        print(f"(c) transformers {t.get('transformers', '?')} at {shapes[0][0]}x{shapes[0][1]}, "
              f"bench/generate_hf.py, the model in {'FP16' if a.gpu else 'FP32'}")
        print(f"{'cache':12} {'decode tok/s':>13} {'vs static':>9} {'step ms':>8} {'KV GiB':>7}")
        static = next((r for r in t.get("rows", []) if r.get("cache") == "static" and "error" not in r), None)
        for r in t.get("rows", []):
            if "error" in r:
                print(f"{r['cache']:12} not run: {r['error'].splitlines()[0]}")
                continue
            vs = f"{r['decode_tokens_per_s'] / static['decode_tokens_per_s']:.2f}" if static else "-"
            kv = f"{r['kv_bytes'] / 2**30:7.2f}" if r.get("kv_bytes") is not None else "      -"
            print(f"{r['cache']:12} {r['decode_tokens_per_s']:13.0f} {vs:>9} {r['step_ms']:8.2f} {kv}")
        if "error" in t:
            print(f"(c) not run: {t['error']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if out["same_shape"] else 1


if __name__ == "__main__":
    sys.exit(main())
