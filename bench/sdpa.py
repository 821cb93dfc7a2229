#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's scaled_dot_product_attention (FP16, contiguous K/V) at the shapes
of kvq-bench decode and prefill, for its speed-up column:

    python3 bench/sdpa.py > sdpa.txt
    kvq-bench decode --sdpa sdpa.txt

Prints one line per shape, "MODE batch context q_heads kv_heads n_q ms"
(head dim 128; 64 at SmolLM2's 9/3 heads)
(CUDA events, median of 30 runs after warm-up; K/V with the KV heads,
GQA by enable_gqa; prefill: a chunk attending causally over the cached
prefix and itself)."""
import sys

import torch
import torch.nn.functional as F

def median_ms(fn, runs=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def run(mode, batch, ctx, qh, kh, nq, D=128):
    q = torch.randn(batch, qh, nq, D, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, kh, ctx, D, device="cuda", dtype=torch.float16)
    v = torch.randn(batch, kh, ctx, D, device="cuda", dtype=torch.float16)
    mask = None
    if nq > 1:
        # query i sits at position ctx - nq + i and sees positions up to it
        pos = torch.arange(ctx - nq, ctx, device="cuda")[:, None]
        mask = torch.arange(ctx, device="cuda")[None, :] <= pos
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    print(f"{mode} {batch} {ctx} {qh} {kh} {nq} {ms:.4f}", flush=True)
    del q, k, v, mask
    torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        print("sdpa.py: no CUDA device", file=sys.stderr)
        return 1
    for batch, ctx, qh, kh, D in ((64, 8192, 32, 8, 128), (16, 32768, 32, 8, 128), (256, 2048, 32, 8, 128),
                                  (4, 131072, 64, 8, 128), (1, 131072, 32, 8, 128), (64, 8192, 9, 3, 64)):
        run("decode", batch, ctx, qh, kh, 1, D)
    for batch, ctx, qh, kh, nq, D in ((4, 10240, 32, 8, 2048, 128), (4, 8704, 32, 8, 512, 128),
                                      (4, 8192, 32, 8, 8192, 128), (4, 10240, 9, 3, 2048, 64)):
        run("prefill", batch, ctx, qh, kh, nq, D)
    return 0


if __name__ == "__main__":
    sys.exit(main())
