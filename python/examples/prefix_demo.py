#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two worker processes share a prompt prefix through kvqd, NumPy only.

Each worker attaches to the pool "py-demo" (int8 KV, created on first
attach), looks its prompt up, writes K/V for the tokens not found and
computes one attention per layer.  K/V are synthetic: pseudo-random from
token id and position, so both workers compute the same values for the same
tokens.  The first worker runs cold and publishes its blocks; the second
finds them, skips writing them, and its attention equals the first's.
    KVQ_SOCKET=/path/to/kvqd.sock python3 prefix_demo.py
"""
import multiprocessing as mp
import time

import numpy as np

import kvq

LAYERS, KV_HEADS, HEAD_DIM, Q_HEADS = 4, 2, 64, 8


def kv_of(tokens, start, layer):
    """Synthetic K and V for tokens at positions start.. of one layer."""
    out = []
    for which in (0, 1):
        rows = [np.random.default_rng([int(t), start + i, layer, which]).standard_normal((KV_HEADS, HEAD_DIM))
                for i, t in enumerate(tokens)]
        out.append(np.array(rows, dtype=np.float16))
    return out


def worker(name, prompt, results):
    q = np.random.default_rng(0).standard_normal((1, Q_HEADS, HEAD_DIM)).astype(np.float32)
    with kvq.attach("py-demo", "synthetic-demo", LAYERS, KV_HEADS, HEAD_DIM, policy="int8") as pool, \
            pool.sequence() as seq:
        t0 = time.perf_counter()
        hit = seq.begin_prompt(prompt)            # prefix lookup, then the write of the rest
        outs = []
        for layer in range(LAYERS):
            k, v = kv_of(prompt[hit:], hit, layer)
            seq.write(layer, k, v)
            outs.append(seq.attention(layer, q))  # the last token's attention over the whole prompt
        seq.commit()                              # seal full blocks, publish them to the prefix cache
        dt = time.perf_counter() - t0
        print(f"{name}: {hit} of {len(prompt)} tokens found in kvqd, prepared in {1000 * dt:.1f} ms")
        results[name] = np.array(outs)


if __name__ == "__main__":
    prompt = np.random.default_rng(1).integers(0, 32000, 1000)
    results = mp.Manager().dict()
    for name in ("cold", "warm"):
        p = mp.Process(target=worker, args=(name, prompt, results))
        p.start()
        p.join()
        assert p.exitcode == 0
    print("warm attention equals cold:", bool(np.array_equal(results["cold"], results["warm"])))
    with kvq.connect() as c:
        st = c.stats("py-demo")
    print(f"pool py-demo: {st['cached']} cached blocks, {st['hit_tokens']} of {st['lookup_tokens']} tokens hit")
