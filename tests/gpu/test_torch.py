# SPDX-License-Identifier: Apache-2.0
"""TAP, on a GPU machine: the kvq package's torch path on a cuda pool against
its NumPy path on a host pool, the pointers the CUDA kernels get against the
tensors' data_ptr() (zero copy), work on a side stream, the refusals, and a
kvq.Batch on a cuda pool against one on a host pool.
A running kvqd built with CUDA at $KVQ_SOCKET; tests/gpu/python.sh runs it.
"""
import os
import sys
import traceback

import numpy as np
import torch

import kvq

G = dict(layers=2, kv_heads=2, head_dim=128)
A = dict(G, n_sealed=256, n_open=16)   # attach: the geometry and slot counts (small pools, whatever kvqd's default capacity)
QH = 8
SOCK = os.environ.get("KVQ_SOCKET")


def kv(gen, m):
    x = torch.randn(m, G["kv_heads"], G["head_dim"], generator=gen)
    x[torch.randint(0, m, (max(1, m // 16),), generator=gen)] *= 50
    return x.half()


def run_pair(policy, steps, seed):
    """The same K/V and q through a cuda pool (CUDA tensors) and a host pool
    (NumPy); returns the outputs and the cuda client's trace."""
    gen = torch.Generator().manual_seed(seed)
    data = [[(kv(gen, m), kv(gen, m), torch.randn(1 + (m > 1) * 4, QH, G["head_dim"], generator=gen).half())
             for _ in range(G["layers"])] for m in steps]
    calls, outs = [], {"cuda": [], "host": []}
    tag = f"{policy}-{seed}"
    with kvq.attach(f"t-cuda-{tag}", "gpu-test", socket=SOCK, policy=policy, backend="cuda", **A) as cc, \
            kvq.attach(f"t-host-{tag}", "gpu-test", socket=SOCK, policy=policy, backend="host", **A) as hc, \
            cc.sequence() as cs, hc.sequence() as hs:
        assert cc.backend == "cuda" and cc.device == torch.cuda.current_device(), (cc.backend, cc.device)
        cc.set_trace(calls.append)
        done = 0
        for m, step in zip(steps, data):
            toks = np.arange(done, done + m)
            cs.begin(toks)
            hs.begin(toks)
            for layer, (k, v, q) in enumerate(step):
                kd, vd, qd = k.cuda(), v.cuda(), q.cuda()
                od = torch.empty(qd.shape, dtype=torch.float32, device="cuda")
                cs.write(layer, kd, vd)
                cs.attention(layer, qd, od)
                t = calls[-2:]
                assert t[0]["k"] == kd.data_ptr() and t[0]["v"] == vd.data_ptr() and t[0]["device"], t
                assert t[1]["q"] == qd.data_ptr() and t[1]["out"] == od.data_ptr(), t
                hs.write(layer, k.numpy(), v.numpy())
                outs["host"].append(hs.attention(layer, q.float().numpy()))
                outs["cuda"].append(od.cpu().numpy())
            cs.commit()
            hs.commit()
            done += m
    return outs, calls


def test_cuda_matches_host():
    """cuda pool (CUDA tensors, zero copy) equals the host pool for f16, int8, kivi4 (max rel err <= 1e-2)"""
    worst = {}
    for policy in ("f16", "int8", "kivi4"):
        outs, calls = run_pair(policy, [300, 1, 1, 1, 64], 7)
        assert len(calls) == 2 * 5 * G["layers"]
        err = max(np.abs(c - h).max() / max(1.0, np.abs(h).max()) for c, h in zip(outs["cuda"], outs["host"]))
        worst[policy] = err
        assert err <= 1e-2, f"{policy}: cuda vs host relative error {err}"
    print("# cuda vs host, largest relative error: " + ", ".join(f"{p} {e:.2e}" for p, e in worst.items()))


def test_side_stream():
    """work on a side torch stream is queued on it (result equal to the default stream's)"""
    gen = torch.Generator().manual_seed(3)
    k, v = kv(gen, 50).cuda(), kv(gen, 50).cuda()
    q = torch.randn(1, QH, G["head_dim"], generator=gen).half().cuda()
    res = []
    for use_side in (False, True):
        with kvq.attach(f"stream-{use_side}", "gpu-test", socket=SOCK, policy="int8", backend="cuda", **A) as c, \
                c.sequence() as s:
            side = torch.cuda.Stream()
            ctx = torch.cuda.stream(side) if use_side else torch.cuda.stream(torch.cuda.current_stream())
            with ctx:
                s.begin(np.arange(50))
                for layer in range(2):
                    s.write(layer, k, v)
                out = s.attention(1, q)
            side.synchronize()
            torch.cuda.synchronize()
            s.commit()
            res.append(out.float().cpu())
    assert torch.equal(res[0], res[1]), (res[0] - res[1]).abs().max()


def test_refusals():
    """a bf16 K on an f16 pool, a CPU q with a CUDA out, CUDA K on a host pool: clear errors"""
    with kvq.attach("ref-cuda", "gpu-test", socket=SOCK, policy="f16", backend="cuda", **A) as c, c.sequence() as s, \
            kvq.attach("ref-host", "gpu-test", socket=SOCK, policy="f16", backend="host", **A) as h, \
            h.sequence() as hs:
        s.begin(np.arange(4))
        z = torch.zeros(4, 2, 128, dtype=torch.float16, device="cuda")
        for f, exc, text in [
            (lambda: s.write(0, z.bfloat16(), z), TypeError, "k: dtype torch.bfloat16, expected f16"),
            (lambda: s.write(0, z.transpose(0, 1), z), ValueError, "not contiguous"),
        ]:
            try:
                f()
                raise AssertionError("no error")
            except exc as e:
                assert text in str(e), e
        s.write(0, z, z)
        try:
            s.attention(0, torch.zeros(1, 8, 128), torch.zeros(1, 8, 128, device="cuda"))
            raise AssertionError("no error")
        except ValueError as e:
            assert "one in host memory and one on a GPU" in str(e), e
        hs.begin(np.arange(4))
        try:
            hs.write(0, z, z)
            raise AssertionError("no error")
        except ValueError as e:
            assert "host pool" in str(e), e


def test_batch_cuda_matches_host():
    """kvq.Batch on a cuda pool (CUDA tensors, zero copy; host arrays too) equals a host pool's batch for int8 within 1e-2"""
    gen = torch.Generator().manual_seed(11)
    with kvq.attach("b-cuda", "gpu-test", socket=SOCK, policy="int8", backend="cuda", **A) as cc, \
            kvq.attach("b-host", "gpu-test", socket=SOCK, policy="int8", backend="host", **A) as hc:
        seqs = {c: [c.sequence() for _ in range(3)] for c in (cc, hc)}
        batches = {c: kvq.Batch(c) for c in (cc, hc)}
        calls, worst = [], 0.0
        cc.set_trace(calls.append)
        for n, lens in enumerate([(70, 33, 5), (1, 1, 1), (1, 1, 1)]):
            for c, b in batches.items():
                b.clear()
                for s, m in zip(seqs[c], lens):
                    b.add(s, np.arange(n * 100, n * 100 + m))
                b.begin()
            rows = int(batches[cc].indptr[-1])
            assert rows == sum(lens)
            for layer in range(G["layers"]):
                k, v = kv(gen, rows), kv(gen, rows)
                q = torch.randn(rows, QH, G["head_dim"], generator=gen)
                if layer == 0:   # CUDA tensors, read in place
                    kd, vd, qd = k.cuda(), v.cuda(), q.half().cuda()
                    od = torch.empty(qd.shape, dtype=torch.float32, device="cuda")
                    batches[cc].write(layer, kd, vd)
                    batches[cc].attention(layer, qd, od)
                    assert calls[-2]["k"] == kd.data_ptr() and calls[-1]["out"] == od.data_ptr(), calls[-2:]
                    got = od.cpu().numpy()
                    q = q.half().float()
                else:            # host arrays on the cuda pool (copied by libkvq)
                    batches[cc].write(layer, k.numpy(), v.numpy())
                    got = batches[cc].attention(layer, q.numpy())
                batches[hc].write(layer, k.numpy(), v.numpy())
                ref = batches[hc].attention(layer, q.numpy())
                worst = max(worst, np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
            for b in batches.values():
                b.commit()
        for b in batches.values():
            b.close()
        assert worst <= 1e-2, f"batch cuda vs host relative error {worst}"
    print(f"# batch cuda vs host, largest relative error {worst:.2e}")


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_")]
    failed = 0
    for i, (name, f) in enumerate(tests, 1):
        try:
            f()
            print(f"ok {i} - {f.__doc__}")
        except Exception:
            failed += 1
            print(f"not ok {i} - {f.__doc__}")
            print("\n".join("# " + x for x in traceback.format_exc().splitlines()))
        sys.stdout.flush()
    print(f"1..{len(tests)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
