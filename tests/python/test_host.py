# SPDX-License-Identifier: Apache-2.0
"""TAP: the kvq Python package against a real kvqd on a host pool, NumPy only
(tests/python.sh installs the package into a venv and runs this).

Environment: KVQD (the daemon), KVQCTL, CREF (tests/python/cref.c built),
KVQ_LIBRARY (the libkvq under test), KVQD_FIGROW and FIGURE_ROW_H (a kvqd
built with a throwaway figure row, and that row: test_figure_row).  Each test is a function test_*; its
name is the TAP line's.
"""
import ctypes
import errno
import gc
import json
import os
import re
import shutil
import signal
import socket as socketlib
import struct
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

import kvq
from kvq import _lib

KVQD, KVQCTL, CREF = os.environ["KVQD"], os.environ["KVQCTL"], os.environ["CREF"]
G = dict(layers=2, kv_heads=2, head_dim=64)   # the pools' geometry; q_heads 4 (GQA 2)
QH = 4
B = 32


def start_kvqd(tmp, budget="256M", capacity="8M", kvqd=KVQD):
    conf = os.path.join(tmp, "kvqd.conf")
    with open(conf, "w") as f:
        f.write(f"[kvqd]\nbackend = host\nmemory_budget = {budget}\ncreate_on_attach = yes\n"
                f"create_capacity = {capacity}\nlog_level = warning\n"
                # test_host_tier's pool of 16 slots: demotion keeps 6 free, above a prompt's 5
                "host_tier_reserve = 40\n")
    sock = os.path.join(tmp, "kvqd.sock")
    p = subprocess.Popen([kvqd, "--config", conf, "--socket", sock, "--backend", "host", "--foreground"])
    for _ in range(500):
        try:
            with socketlib.socket(socketlib.AF_UNIX) as s:
                s.connect(sock)
            return p, sock
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.01)
    p.kill()
    raise RuntimeError("kvqd did not start")


def rand_kv(rng, m):
    """K/V with a few outlier tokens (the quantizers' hard case)."""
    x = rng.standard_normal((m, G["kv_heads"], G["head_dim"]))
    x[rng.integers(0, m, max(1, m // 16))] *= 50
    return x.astype(np.float16)


def make_case(seed, steps):
    """Inputs of cref's file: tokens, then per step per layer (k, v, q)."""
    rng = np.random.default_rng(seed)
    n = sum(steps)
    tokens = rng.integers(0, 50000, n, dtype=np.uint32)
    data = [[(rand_kv(rng, m), rand_kv(rng, m), rng.standard_normal((1 + (m > 1) * 4, QH, G["head_dim"]))
              .astype(np.float32)) for _ in range(G["layers"])] for m in steps]
    return tokens, data


def n_q(steps):
    # one query row per decode step, five for a prefill (a causal block of rows)
    return [1 + (m > 1) * 4 for m in steps]


def write_case(path, steps, tokens, data):
    nq = n_q(steps)
    assert len(set(nq)) == 1, "cref takes one n_q per file"
    with open(path, "wb") as f:
        f.write(struct.pack("<6I", G["layers"], G["kv_heads"], G["head_dim"], QH, nq[0], len(steps)))
        f.write(np.asarray(steps, "<u4").tobytes())
        f.write(tokens.astype("<u4").tobytes())
        for step in data:
            for k, v, q in step:
                f.write(k.tobytes() + v.tobytes() + q.tobytes())


def run_python(sock, pool, policy, steps, tokens, data, salt=None):
    """The same steps through the package; the outputs per step per layer."""
    outs = []
    with kvq.attach(pool, "python-test", socket=sock, policy=policy, **G) as c, c.sequence(salt) as s:
        done = 0
        for m, step in zip(steps, data):
            s.begin(tokens[done:done + m])
            for layer, (k, v, q) in enumerate(step):
                s.write(layer, k, v)
                outs.append(s.attention(layer, q))
            s.commit()
            done += m
    return outs


def reference(steps, data):
    """float64 causal GQA attention of each step's last query rows over all
    tokens so far (K/V as given: what f16 KV stores exactly)."""
    outs, ks, vs = [], [[] for _ in range(G["layers"])], [[] for _ in range(G["layers"])]
    g = QH // G["kv_heads"]
    for step in data:
        for layer, (k, v, q) in enumerate(step):
            ks[layer].append(k.astype(np.float64))
            vs[layer].append(v.astype(np.float64))
            K, V = np.concatenate(ks[layer]), np.concatenate(vs[layer])
            n, rows = len(K), len(q)
            o = np.empty(q.shape)
            for i in range(rows):
                pos = n - rows + i
                for h in range(QH):
                    sc = K[:pos + 1, h // g] @ q[i, h].astype(np.float64) / np.sqrt(G["head_dim"])
                    w = np.exp(sc - sc.max())
                    o[i, h] = (w / w.sum()) @ V[:pos + 1, h // g]
            outs.append(o)
    return outs


# ---------------------------------------------------------------- tests

def test_import_checks_libkvq(ctx):
    """import: the libkvq found, its version and protocol; a missing one is a clear ImportError."""
    assert kvq.libkvq_version == _lib.VERSION and kvq.protocol == _lib.PROTOCOL == 10, (kvq.libkvq_version, kvq.protocol)
    assert os.path.samefile(kvq.libkvq_path, os.environ["KVQ_LIBRARY"])
    if os.environ.get("KVQ_TEST_INSTALLED"):   # the venv's copy, not the source tree's
        assert "site-packages" in kvq.__file__, kvq.__file__
    env = dict(os.environ, KVQ_LIBRARY="/nonexistent/libkvq.so.3")
    p = subprocess.run([sys.executable, "-c", "import kvq"], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "ImportError: kvq: libkvq not found" in p.stderr and "KVQ_LIBRARY" in p.stderr, \
        p.stderr


def test_struct_layouts_match_kvq_h(ctx):
    """the ctypes structures have kvq.h's offsets and sizes (cref layout)"""
    out = subprocess.run([CREF, "layout"], check=True, capture_output=True, text=True).stdout.split("\n")
    mine = {"kvq_attach_params": _lib.AttachParams, "kvq_stats": _lib.Stats, "kvq_trace": _lib.Trace}
    n = 0
    for line in filter(None, out):
        s, f, off = line.split()
        got = ctypes.sizeof(mine[s]) if f == "sizeof" else getattr(mine[s], f).offset
        assert got == int(off), f"{s}.{f}: ctypes {got}, C {off}"
        n += 1
    assert n == sum(len(t._fields_) + 1 for t in mine.values()), n


def attention_vs_c(ctx, policy, seed):
    """Two cases, each through cref and through the package on pools of
    their own: prefill chunks (70 then 60 tokens: the second seals blocks,
    five query rows each) and 40 decode steps (one row; crosses a block)."""
    outs = []
    for case, steps in (("chunks", [70, 60]), ("decode", [1] * 40)):
        tokens, data = make_case(seed, steps)
        pool = f"c-{policy}-{case}"
        path = os.path.join(ctx["tmp"], f"{pool}.in")
        write_case(path, steps, tokens, data)
        subprocess.run([CREF, "attention", ctx["sock"], pool, policy, path, path + ".out"], check=True)
        c_out = np.fromfile(path + ".out", np.float32)
        py = run_python(ctx["sock"], pool + "-py", policy, steps, tokens, data)
        py_flat = np.concatenate([o.ravel() for o in py])
        assert py_flat.shape == c_out.shape, (py_flat.shape, c_out.shape)
        assert np.array_equal(py_flat, c_out), f"{pool}: Python differs from C, max {np.abs(py_flat - c_out).max()}"
        outs.append((py, reference(steps, data)))
    return outs


def test_attention_f16_equals_c_and_float64(ctx):
    """f16 KV: attention through the package equals the C path bit for bit and a float64 reference to 2e-3"""
    for py, ref in attention_vs_c(ctx, "f16", 1):
        for o, r in zip(py, ref):
            err = np.abs(o - r).max() / max(1.0, np.abs(r).max())
            assert err < 2e-3, f"f16 vs float64: relative error {err}"


def test_attention_int8_equals_c(ctx):
    """int8 KV (sealed blocks quantized): equal to the C path bit for bit, within 0.25 of float64"""
    # the int8 kernels' own accuracy is tests/unit's business; the bound only catches a wrong table
    for py, ref in attention_vs_c(ctx, "int8", 2):
        for o, r in zip(py, ref):
            err = np.abs(o - r).max() / max(1.0, np.abs(r).max())
            assert err < 0.25, f"int8 vs float64: relative error {err}"


def test_zero_copy_host(ctx):
    """the CPU kernels get the arrays' own addresses (kvq_client_set_trace)"""
    rng = np.random.default_rng(3)
    calls = []
    with kvq.attach("zc", "python-test", socket=ctx["sock"], policy="int8", **G) as c, c.sequence() as s:
        c.set_trace(calls.append)
        s.begin(np.arange(40))
        k, v = rand_kv(rng, 40), rand_kv(rng, 40)
        q = rng.standard_normal((2, QH, 64)).astype(np.float32)
        out = np.empty_like(q)
        s.write(1, k, v)
        s.attention(1, q, out)
        c.set_trace(None)
        s.write(0, k, v)
    assert [x["op"] for x in calls] == ["write", "attention"], calls
    w, a = calls
    assert (w["k"], w["v"], w["layer"], w["device"]) == (k.ctypes.data, v.ctypes.data, 1, False), w
    assert (a["q"], a["out"]) == (q.ctypes.data, out.ctypes.data), a


def test_prefix_hit_across_processes(ctx):
    """a second process finds the first one's published blocks; its attention equals a cold one"""
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, 50000, 100)
    kv = [(rand_kv(rng, 100), rand_kv(rng, 100)) for _ in range(G["layers"])]
    q = rng.standard_normal((1, QH, 64)).astype(np.float32)
    np.save(os.path.join(ctx["tmp"], "prompt.npy"), prompt)
    np.save(os.path.join(ctx["tmp"], "kv.npy"), np.array(kv))
    child = f"""
import numpy as np, kvq
p = np.load({ctx['tmp']!r} + '/prompt.npy'); kv = np.load({ctx['tmp']!r} + '/kv.npy')
with kvq.attach('share', 'python-test', socket={ctx['sock']!r}, policy='int8', layers=2, kv_heads=2, head_dim=64) as c:
    with c.sequence() as s:
        assert s.begin_prompt(p) == 0
        for l in range(2): s.write(l, kv[l][0], kv[l][1])
        s.commit()
"""
    subprocess.run([sys.executable, "-c", child], check=True)

    def run(salt):
        with kvq.attach("share", "python-test", socket=ctx["sock"], policy="int8", **G) as c, c.sequence(salt) as s:
            hit = s.begin_prompt(prompt)
            outs = []
            for layer in range(G["layers"]):
                s.write(layer, kv[layer][0][hit:], kv[layer][1][hit:])
                outs.append(s.attention(layer, q))
            s.commit()
            st = c.stats()
            return hit, outs, st
    hit, warm, st = run(None)
    assert hit == 96, f"hit {hit}, expected S(100) = 96"
    assert st["hit_tokens"] >= 96, st
    cold_hit, cold, _ = run(b"cold")   # another salt: nothing cached
    assert cold_hit == 0
    for w, c in zip(warm, cold):
        assert np.array_equal(w, c), "warm attention differs from a cold recompute"


def test_fork_lookup_and_release(ctx):
    """Sequence.fork shares the sealed blocks; close and garbage collection release what they held"""
    rng = np.random.default_rng(5)
    with kvq.attach("rel", "python-test", socket=ctx["sock"], policy="int8", **G) as c:
        s = c.sequence()
        s.begin(np.arange(80))
        for layer in range(2):
            s.write(layer, rand_kv(rng, 80), rand_kv(rng, 80))
        s.commit()
        f = s.fork()
        (ss, so), (fs, fo) = s.blocks(), f.blocks()
        assert ss == fs and len(ss) == 2 and len(so) == 1 and len(fo) == 1 and so != fo, (s.blocks(), f.blocks())
        assert f.tokens == s.tokens == 80
        st = c.stats()
        assert st["open_used"] == 2 and st["referenced"] == 2, st
        s.close()
        s.close()   # twice is fine
        del f
        gc.collect()
        st = c.stats()
        assert st["open_used"] == 0 and st["referenced"] == 0 and st["sealed_held"] == 0, st
        s2 = c.sequence()
        s2.begin(np.arange(5))
    # the client's close freed s2 first: a new connection sees nothing held
    with kvq.connect(ctx["sock"]) as c2:
        st = c2.stats("rel")
        assert st["open_used"] == 0 and st["clients"] == 0, st


def test_after_fork(ctx):
    """in a child after fork(), inherited objects raise InheritedError and their close sends nothing"""
    with kvq.attach("fork", "python-test", socket=ctx["sock"], policy="f16", **G) as c, c.sequence() as s:
        s.begin(np.arange(3))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            msg = "no error"
            try:
                s.tokens
            except kvq.InheritedError as e:
                msg = "InheritedError " + str(e)
            s.close()
            c.close()
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        got = os.read(r, 1000).decode()
        os.waitpid(pid, 0)
        assert got.startswith("InheritedError") and "before fork()" in got, got
        z = np.zeros((3, 2, 64), np.float16)
        s.write(0, z, z)   # the parent's connection is intact
        s.write(1, z, z)
        s.commit()
        assert s.tokens == 3


def test_error_bad_shape(ctx):
    """a K of the wrong shape is a ValueError naming it and the expected shape"""
    with kvq.attach("err", "python-test", socket=ctx["sock"], policy="f16", **G) as c, c.sequence() as s:
        s.begin(np.arange(4))
        z = np.zeros((4, 2, 64), np.float16)
        for bad in (np.zeros((5, 2, 64), np.float16), np.zeros((4, 64, 2), np.float16)):
            try:
                s.write(0, bad, z)
                raise AssertionError("no error")
            except ValueError as e:
                assert str(e).startswith(f"k: shape {bad.shape}, expected (4, 2, 64)"), e
        try:
            s.write(0, z, np.zeros((8, 2, 64), np.float16)[::2])
            raise AssertionError("no error")
        except ValueError as e:
            assert "v: the array is not C-contiguous" in str(e), e
        s.write(0, z, z)
        try:
            s.attention(0, np.zeros((1, 3, 64), np.float32))
            raise AssertionError("no error")
        except kvq.KvqError as e:   # q_heads not a multiple of kv_heads: libkvq's own check
            assert e.code == -errno.EINVAL and "bad query counts" in e.message, e


def test_error_wrong_dtype(ctx):
    """K in float32 on an f16 pool, q in float16 on the host: TypeErrors; no conversion"""
    with kvq.attach("err", "python-test", socket=ctx["sock"], policy="f16", **G) as c, c.sequence() as s:
        s.begin(np.arange(4))
        z = np.zeros((4, 2, 64), np.float16)
        try:
            s.write(0, z.astype(np.float32), z)
            raise AssertionError("no error")
        except TypeError as e:
            assert str(e).startswith("k: dtype float32, expected f16"), e
        s.write(0, z, z)
        try:
            s.attention(0, np.zeros((1, 4, 64), np.float16))
            raise AssertionError("no error")
        except TypeError as e:
            assert str(e).startswith("q: dtype float16, expected f32"), e


def test_error_daemon_not_running(ctx):
    """no kvqd at the socket: DaemonUnavailable (a ConnectionError) with libkvq's code and the path"""
    path = os.path.join(ctx["tmp"], "none.sock")
    for setup in ("missing", "refused"):
        if setup == "refused":
            s = socketlib.socket(socketlib.AF_UNIX)
            s.bind(path)
            s.close()   # a socket file nobody listens on
        try:
            kvq.connect(path)
            raise AssertionError("no error")
        except kvq.DaemonUnavailable as e:
            want = errno.ENOENT if setup == "missing" else errno.ECONNREFUSED
            assert isinstance(e, ConnectionError) and e.errno == want and e.code == -want, (setup, e.errno)
            assert f"cannot connect to kvqd at {path}: {os.strerror(want)}" in str(e), e


def test_error_pool_refused(ctx):
    """kvqd refuses an attach (geometry mismatch, bad policy): PoolRefused with kvqd's message"""
    with kvq.attach("ref", "python-test", socket=ctx["sock"], policy="int8", **G):
        pass
    cases = [(dict(G, layers=3), "int8", _lib.KVQ_ELAYOUT, "pool ref is model python-test"),
             (G, "int9", _lib.KVQ_EPOLICY, "int9")]
    for geo, policy, code, text in cases:
        try:
            kvq.attach("ref" if code == _lib.KVQ_ELAYOUT else "ref2", "python-test", socket=ctx["sock"],
                       policy=policy, **geo)
            raise AssertionError("no error")
        except kvq.PoolRefused as e:
            assert e.code == code and text in e.message, (e.code, e.message)
    with kvq.connect(ctx["sock"]) as c:   # a failed attach closed its client: none is left
        assert c.stats("ref")["clients"] == 0


def test_given_counts_within_budget(ctx):
    """an attach that gives slot counts needs their bytes only, not the pool's whole capacity"""
    with tempfile.TemporaryDirectory() as tmp:
        daemon, sock = start_kvqd(tmp, budget="64M", capacity="48M")
        try:
            with kvq.attach("big", "python-test", socket=sock, **G):   # sized by its capacity: 48M
                pass
            for pool, counts, text in (("big2", {}, "over the memory budget"),
                                       ("huge", dict(n_sealed=2048, n_open=8), "fit in the pool's capacity")):
                try:
                    kvq.attach(pool, "python-test", socket=sock, **G, **counts)
                    raise AssertionError(f"{pool}: no error")
                except kvq.PoolFull as e:
                    assert text in e.message, (pool, e.message)
            with kvq.attach("small", "python-test", socket=sock, n_sealed=16, n_open=4, **G), \
                    kvq.connect(sock) as s:
                st = s.stats("small")
                assert (st["n_sealed"], st["n_open"]) == (16, 4), st
        finally:
            daemon.terminate()
            daemon.wait()


def test_error_libkvq_message(ctx):
    """a refusal inside libkvq carries libkvq's message (commit before every layer is written)"""
    with kvq.attach("err", "python-test", socket=ctx["sock"], policy="f16", **G) as c, c.sequence() as s:
        s.begin(np.arange(4))
        try:
            s.commit()
            raise AssertionError("no error")
        except kvq.KvqError as e:
            assert e.message == "commit before layer 0 was written" and e.code == -errno.EINVAL, e
            assert str(e) == "commit: commit before layer 0 was written [Invalid argument]", str(e)
    try:
        s.tokens
        raise AssertionError("no error")
    except ValueError as e:
        assert "closed" in str(e)


def test_group_ranks_agree(ctx):
    """two ranks of a tensor-parallel group (kv_heads 4: 2 each) publish a prompt; a lookup by request id hits the same on both"""
    rng = np.random.default_rng(8)
    prompt = rng.integers(0, 50000, 100)
    kw = dict(socket=ctx["sock"], policy="int8", layers=2, kv_heads=4, head_dim=64)
    r0 = kvq.connect(ctx["sock"]).attach("pyg.r0", "python-test", group="pyg", rank=0, world_size=2, **{
        k: v for k, v in kw.items() if k != "socket"})
    r1 = kvq.connect(ctx["sock"]).attach("pyg.r1", "python-test", group="pyg", rank=1, world_size=2, **{
        k: v for k, v in kw.items() if k != "socket"})
    try:
        assert r0.stats()["kv_heads"] == 2 and r1.stats()["kv_heads"] == 2, "each member pool holds 2 of the 4 heads"
        for c in (r0, r1):
            with c.sequence() as s:
                assert s.lookup(prompt, request_id="publish") == 0
                s.begin(prompt)
                for layer in range(2):
                    s.write(layer, rand_kv(rng, 100), rand_kv(rng, 100))
                s.commit()
        hits = []
        for c in (r0, r1):
            with c.sequence() as s:
                hits.append(s.lookup(prompt, request_id=b"again"))
        assert hits == [96, 96], hits
    finally:
        r0.close()
        r1.close()


def test_sink_blocks_exact(ctx):
    """int4g32 KV, B + 1 tokens: with sink blocks the first block is kept exact, so attention equals float64 over the inputs (f16 rounding); without, block 0 is quantized; sink_stats counts the one sequence and its sink"""
    rng = np.random.default_rng(11)
    k, v = rand_kv(rng, B + 1), rand_kv(rng, B + 1)
    q = rng.standard_normal((1, QH, G["head_dim"])).astype(np.float32)
    ref = reference([B + 1], [[(k, v, q)] * G["layers"]])[-1]
    errs, sk = {}, {}
    for sink in (1, 0):
        with kvq.attach(f"sinks{sink}", "python-test", socket=ctx["sock"], policy="int4g32", sink_blocks=sink,
                        **G) as c, c.sequence() as s:
            s.begin(np.arange(B + 1))
            for layer in range(G["layers"]):
                s.write(layer, k, v)
            s.commit()
            out = s.attention(G["layers"] - 1, q)
            errs[sink] = np.abs(out - ref).max() / max(1.0, np.abs(ref).max())
            sk[sink] = c.sink_stats()
    assert errs[1] < 2e-3 and errs[0] > 10 * errs[1], errs
    assert (sk[1]["sink_blocks"] == 1 and sk[1]["n_sink"] >= 1 and sk[1]["sequences"] == 1 and
            sk[1]["sink_held"] + sk[1]["sink_referenced"] == 1 and sk[1]["sink_tokens"] == B), sk[1]
    assert sk[0]["sink_blocks"] == 0 and sk[0]["n_sink"] == 0 and sk[0]["sink_tokens"] == 0, sk[0]
    try:
        kvq.attach("sinks1", "python-test", socket=ctx["sock"], policy="int4g32", **G)
        raise AssertionError("attached a sink pool without sink_blocks")
    except kvq.PoolRefused as e:
        assert "sink_blocks 1" in e.message, e.message


def test_host_tier(ctx):
    """a pool created with host_capacity: its tier in the stats (tier_* figures), and a prompt evicted from
    the pool's few slots comes back whole from the tier, attention equal to before"""
    rng = np.random.default_rng(5)
    n = 4 * B + 3
    k, v = rand_kv(rng, n), rand_kv(rng, n)
    q = rng.standard_normal((1, QH, G["head_dim"])).astype(np.float32)
    with kvq.attach("tiered", "python-test", socket=ctx["sock"], policy="int8", n_sealed=16, n_open=2,
                    host_capacity=1 << 20, **G) as c:
        st = c.stats()
        assert st["tier_capacity"] > 0 and st["tier_records"] == 0, st
        with c.sequence() as s:
            s.begin(np.arange(n))
            for layer in range(G["layers"]):
                s.write(layer, k, v)
            s.commit()
            first = s.attention(G["layers"] - 1, q)
        # other prompts through the pool until the first one's blocks left it
        for p in range(1, 8):
            with c.sequence() as s:
                s.begin(np.arange(n) + 1000 * p)
                for layer in range(G["layers"]):
                    s.write(layer, k, v)
                s.commit()
            time.sleep(0.01)
        st = c.stats()
        assert st["tier_demotions"] >= 4, st
        with c.sequence() as s:
            hit = s.lookup(np.arange(n))
            s.begin(np.arange(hit, n))
            for layer in range(G["layers"]):
                s.write(layer, k[hit:], v[hit:])
            s.commit()
            again = s.attention(G["layers"] - 1, q)
        st = c.stats()
        assert hit == 4 * B and st["tier_promotions"] >= 4 and st["tier_hit_tokens"] >= hit, (hit, st)
        assert np.array_equal(first, again), np.abs(first - again).max()


def test_stats_cli_matches_kvqctl(ctx):
    """python -m kvq --json stats POOL gives kvqctl --json stats' figures for the pool"""
    with kvq.attach("share", "python-test", socket=ctx["sock"], policy="int8", **G):
        mine = json.loads(subprocess.run([sys.executable, "-m", "kvq", "--socket", ctx["sock"], "--json", "stats",
                                          "share"], check=True, capture_output=True, text=True).stdout)
        ctl = json.loads(subprocess.run([KVQCTL, "--socket", ctx["sock"], "--json", "stats", "share"], check=True,
                                        capture_output=True, text=True).stdout)
    pool = next(p for p in ctl["pools"] if p["name"] == "share")
    for key, val in mine.items():
        if key == "clients_attached":
            continue   # the two connections differ by kvqctl's own
        if isinstance(val, dict):   # kvqctl's have more (resident tokens and bytes)
            same = {k: pool[key][k] for k in val} == val
        else:
            same = abs(pool[key] - val) < 1e-12 if isinstance(val, float) else pool[key] == val
        assert same, f"{key}: python -m kvq {val}, kvqctl {pool[key]}"
    assert len(mine) >= 15
    text = subprocess.run([sys.executable, "-m", "kvq", "--socket", ctx["sock"], "stats", "share"], check=True,
                          capture_output=True, text=True).stdout
    assert "hit rate" in text and "pool share" in text, text
    p = subprocess.run([sys.executable, "-m", "kvq", "--socket", ctx["sock"], "stats", "nosuch"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "no pool nosuch" in p.stderr, p.stderr


def test_figure_row(ctx):
    """a kvqd built with one more figure row (tests/unit/figure_row.h): Client.stats() and figures() have it, the package unchanged"""
    row = open(os.environ["FIGURE_ROW_H"]).read()
    name = re.search(r'#define TEST_FIGURE_NAME "([^"]+)"', row).group(1)
    want = int(re.search(r"#define TEST_FIGURE_BASE (\d+)u", row).group(1)) + 1   # one connection attached
    tmp = tempfile.mkdtemp(prefix="kvqd-figrow.")
    daemon, sock = start_kvqd(tmp, kvqd=os.environ["KVQD_FIGROW"])
    try:
        with kvq.attach("figrow", "python-test", socket=sock, policy="int8", **G) as c:
            st, figs = c.stats(), c.figures()
        assert st[name] == want and figs[name] == want, (name, st.get(name), figs.get(name), want)
        assert list(figs)[-1] == name, "kvqd's order: the extra row last"
        for f, _ in _lib.Stats._fields_:   # struct kvq_stats' names keep their values
            assert f not in figs or figs[f] == st[f], f
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- batch

def rand_step(rng, rows):
    """Each sequence's new rows of one step: per layer (k, v, q), q one row per new token."""
    return [[(rand_kv(rng, m), rand_kv(rng, m), rng.standard_normal((m, QH, G["head_dim"])).astype(np.float32))
             for _ in range(G["layers"])] for m in rows]


def batch_vs_sequences(ctx, tag, prompts, lookups, decode, published=None, policy="int8"):
    """The same steps on two identical pools: one kvq.Batch over the
    sequences on one, each Sequence's own calls on the other.  Step 0 adds
    the prompts (lookups[i]: the prompt looked up first), then `decode`
    steps of one token each.  published: a prompt and its K/V written to
    both pools first.  Returns (batch outputs, sequence outputs, hits of
    both sides, the batch's requests after the first commit)."""
    rng = np.random.default_rng(sum(map(len, prompts)) + decode)
    kw = dict(socket=ctx["sock"], policy=policy, **G)
    outs = {"batch": [], "seq": []}
    with kvq.attach(f"bb-{tag}", "python-test", **kw) as cb, kvq.attach(f"bs-{tag}", "python-test", **kw) as cs:
        if published is not None:
            toks, kv = published
            for c in (cb, cs):
                with c.sequence() as s:
                    s.begin(toks)
                    for layer in range(G["layers"]):
                        s.write(layer, *kv[layer])
                    s.commit()
        sb = [cb.sequence() for _ in prompts]
        ss = [cs.sequence() for _ in prompts]
        b = kvq.Batch(cb)
        hits = {"batch": [], "seq": []}
        steps = [[np.asarray(p) for p in prompts]] + [[rng.integers(0, 50000, 1) for _ in prompts]
                                                      for _ in range(decode)]
        first_commit = None
        for n, toks in enumerate(steps):
            b.clear()
            assert len(b) == 0 and b.indptr is None
            for i, (s, t) in enumerate(zip(sb, toks)):
                assert b.add(s, t, lookup=n == 0 and lookups[i]) == i
            b.begin()
            ip = b.indptr
            assert ip.dtype == np.uint32 and len(ip) == len(sb) + 1 and ip[0] == 0, ip
            if n == 0:
                hits["batch"] = [b.hit(i) for i in range(len(sb))]
                hits["seq"] = [s.lookup(t) if lookups[i] else 0 for i, (s, t) in enumerate(zip(ss, toks))]
            rows = np.diff(ip)
            assert list(rows) == [len(t) - (hits["batch"][i] if n == 0 else 0) for i, t in enumerate(toks)], rows
            data = rand_step(rng, rows)
            for i, s in enumerate(ss):
                s.begin(toks[i][len(toks[i]) - rows[i]:])
            for layer in range(G["layers"]):
                k, v, q = (np.concatenate([d[layer][j] for d in data]) for j in range(3))
                b.write(layer, k, v)
                outs["batch"].append(b.attention(layer, q))
                for s, d in zip(ss, data):
                    s.write(layer, d[layer][0], d[layer][1])
                outs["seq"].append(np.concatenate([s.attention(layer, d[layer][2]) for s, d in zip(ss, data)]))
            b.commit()
            assert b.indptr is None
            for s in ss:
                s.commit()
            if n == 0:
                first_commit = b.requests("commit")
            assert [s.tokens for s in sb] == [s.tokens for s in ss]
        b.close()
        for s in sb + ss:
            s.close()
    return outs, hits, first_commit


def test_batch_equals_sequences(ctx):
    """kvq.Batch: prompts of 70, 33 and 5 tokens, then 40 decode steps: each step's attention equals each Sequence's own on a second pool bit for bit; a commit that seals and publishes waits once"""
    rng = np.random.default_rng(21)
    prompts = [rng.integers(0, 50000, m) for m in (70, 33, 5)]
    outs, hits, (reqs, waits) = batch_vs_sequences(ctx, "eq", prompts, [False] * 3, 40)
    assert len(outs["batch"]) == 41 * G["layers"]
    for n, (ob, os_) in enumerate(zip(outs["batch"], outs["seq"])):
        assert ob.shape == os_.shape and np.array_equal(ob, os_), \
            f"step {n // 2} layer {n % 2}: batch differs from the sequences, max {np.abs(ob - os_).max()}"
    assert waits == 1 and reqs >= 1, (reqs, waits)


def test_batch_lookup_hit(ctx):
    """kvq.Batch add(lookup=True) finds a published prefix: hit equals Sequence.lookup's on the other pool, and attention is equal"""
    rng = np.random.default_rng(22)
    toks = rng.integers(0, 50000, 100)
    kv = [(rand_kv(rng, 100), rand_kv(rng, 100)) for _ in range(G["layers"])]
    prompts = [np.concatenate([toks, rng.integers(0, 50000, 10)]), rng.integers(0, 50000, 40), toks[:50]]
    outs, hits, _ = batch_vs_sequences(ctx, "hit", prompts, [True, False, True], 3, published=(toks, kv))
    assert hits["batch"] == hits["seq"] == [96, 0, 32], hits
    for ob, os_ in zip(outs["batch"], outs["seq"]):
        assert np.array_equal(ob, os_), np.abs(ob - os_).max()


def test_batch_enospc(ctx):
    """kvq.Batch begin: 8 sequences in a pool of 6 open slots is PoolFull 2 slots short and changes nothing; 6 of them begin; abort gives the slots back"""
    with kvq.attach("bsmall", "python-test", socket=ctx["sock"], policy="int8", n_sealed=64, n_open=6, **G) as c:
        seqs = [c.sequence() for _ in range(8)]
        b = kvq.Batch(c)
        for s in seqs:
            b.add(s, np.arange(B - 1))
        before = c.stats()
        try:
            b.begin()
            raise AssertionError("no error")
        except kvq.PoolFull as e:
            assert e.code == -errno.ENOSPC and e.short == 2, (e, e.short)
        after = c.stats()
        for f in ("open_used", "sealed_held", "referenced"):
            assert after[f] == before[f], (f, before[f], after[f])
        assert b.indptr is None and [s.tokens for s in seqs] == [0] * 8 and all(s.blocks() == ([], []) for s in seqs)
        b.clear()
        for s in seqs[:6]:
            b.add(s, np.arange(B - 1))
        b.begin()
        assert list(b.indptr) == [i * (B - 1) for i in range(7)]
        assert c.stats()["open_used"] == before["open_used"] + 6
        b.abort()
        assert c.stats()["open_used"] == before["open_used"] and seqs[0].tokens == 0 and b.indptr is None
        b.close()
        for s in seqs:
            s.close()


def test_batch_refusals(ctx):
    """kvq.Batch: bad shapes and dtypes, a write before begin, a sequence twice or of another client, a lookup on a non-empty sequence, closing a sequence in a batch: each refused with a clear error"""
    def refused(f, exc, text):
        try:
            f()
        except exc as e:
            assert text in str(e), (text, str(e))
            return e
        raise AssertionError(f"no error ({text})")

    with kvq.attach("berr", "python-test", socket=ctx["sock"], policy="f16", **G) as c, \
            kvq.attach("berr", "python-test", socket=ctx["sock"], policy="f16", **G) as c2, \
            c.sequence() as s1, c.sequence() as s2, c2.sequence() as other:
        b = kvq.Batch(c)
        z = np.zeros((3, 2, 64), np.float16)
        refused(lambda: b.write(0, z, z), ValueError, "write: no step is begun")
        assert b.add(s1, [1, 2]) == 0 and b.add(s2, [3]) == 1
        e = refused(lambda: b.add(s1, [4]), kvq.KvqError, "in the batch already")
        assert e.code == -errno.EEXIST
        refused(lambda: b.add(other, [4]), ValueError, "another client")
        refused(lambda: s1.close(), ValueError, "the sequence is in a batch")
        b.begin()
        e = refused(lambda: b.add(c.sequence(), [4]), kvq.KvqError, "the step is begun")
        assert e.code == -errno.EBUSY
        refused(lambda: b.write(0, np.zeros((2, 2, 64), np.float16), z), ValueError,
                "k: shape (2, 2, 64), expected (3, 2, 64)")
        refused(lambda: b.write(0, z, z.astype(np.float32)), TypeError, "v: dtype float32, expected f16")
        refused(lambda: b.attention(0, np.zeros((3, QH, 64), np.float32)), kvq.KvqError, "before its write")
        b.write(0, z, z)
        refused(lambda: b.attention(0, np.zeros((2, QH, 64), np.float32)), ValueError,
                "q: shape (2, 4, 64), expected (3, 4, 64)")
        refused(lambda: b.attention(0, np.zeros((3, QH, 64), np.float16)), TypeError, "q: dtype float16")
        refused(lambda: b.attention(0, np.zeros((3, QH, 64), np.float32), np.zeros((3, QH, 32), np.float32)),
                ValueError, "out: shape (3, 4, 32)")
        assert b.attention(0, np.ones((3, QH, 64), np.float32)).shape == (3, QH, 64)
        e = refused(lambda: b.commit(), kvq.KvqError, "layer 1")
        assert e.code == -errno.EINVAL
        b.write(1, z, z)
        b.commit()
        b.clear()
        refused(lambda: b.add(s1, [5], lookup=True), kvq.KvqError, "not empty")
        refused(lambda: b.requests("write"), ValueError, "phase")
        refused(lambda: b.hit(2), IndexError, "no sequence 2")
        b.close()
        refused(lambda: len(b), ValueError, "the batch is closed")


def test_batch_zero_copy_host(ctx):
    """kvq.Batch: the CPU kernels get the packed arrays' own addresses (kvq_client_set_trace)"""
    rng = np.random.default_rng(23)
    calls = []
    with kvq.attach("bzc", "python-test", socket=ctx["sock"], policy="int8", **G) as c, \
            c.sequence() as s1, c.sequence() as s2, kvq.Batch(c) as b:
        b.add(s1, np.arange(40))
        b.add(s2, np.arange(3))
        b.begin()
        c.set_trace(calls.append)
        k, v = rand_kv(rng, 43), rand_kv(rng, 43)
        q = rng.standard_normal((43, QH, 64)).astype(np.float32)
        out = np.empty_like(q)
        b.write(1, k, v)
        assert b.attention(1, q, out) is out
        c.set_trace(None)
    assert [x["op"] for x in calls] == ["write", "attention"], calls
    w, a = calls
    assert (w["k"], w["v"], w["layer"]) == (k.ctypes.data, v.ctypes.data, 1), w
    assert (a["q"], a["out"]) == (q.ctypes.data, out.ctypes.data), a


def test_batch_close_and_collect(ctx):
    """kvq.Batch: a sequence is closable once its batch is cleared or closed; a Client closed with a begun batch and its sequences frees them all; garbage collection too"""
    with kvq.attach("bclose", "python-test", socket=ctx["sock"], policy="int8", **G) as c:
        s = c.sequence()
        b = kvq.Batch(c)
        b.add(s, np.arange(40))
        b.clear()
        s.close()
        s = c.sequence()
        b.add(s, np.arange(40))
        del s
        gc.collect()
        assert len(b.sequences) == 1, "the batch keeps its sequence alive"
        b.begin()
        assert c.stats()["open_used"] > 0
        del b
        gc.collect()   # the batch's abort and free, then the sequence's
        st = c.stats()
        assert st["open_used"] == 0 and st["sealed_held"] == 0, st
        seqs = [c.sequence() for _ in range(3)]
        b = kvq.Batch(c)
        for i, s in enumerate(seqs):
            b.add(s, np.arange(10 + i))
        b.begin()
    # the client's close freed the begun batch, then the sequences
    try:
        len(b)
        raise AssertionError("no error")
    except ValueError as e:
        assert "closed" in str(e), e
    with kvq.connect(ctx["sock"]) as c2:
        st = c2.stats("bclose")
        assert st["open_used"] == 0 and st["clients"] == 0, st


def generate_like(rng, lens, hits, width=None):
    """A left-padded prompt batch as transformers' generate makes it: ids,
    mask, the positions (the mask's cumsum), each row's real prompt."""
    width = width or max(lens)
    real = [rng.integers(3, 50000, n) for n in lens]
    ids = np.zeros((len(lens), width), np.int64)   # pad id 0
    mask = np.zeros((len(lens), width), np.int64)
    for i, r in enumerate(real):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    pos = np.where(mask == 1, mask.cumsum(1) - 1, 0)
    return ids, mask, pos, real


def test_hf_rows_padded_batch(ctx):
    """kvq._hfrows (kvq.hf's bookkeeping): a left-padded batch with prompt hits of 32, 48 and 64 tokens: the cached columns are the fewest any row has (pad + hit), each row's first step adds its prompt after its hit, pad columns never, and decode steps add one token a row; wrong positions, masks or prompt ids are refused"""
    from kvq import _hfrows
    rng = np.random.default_rng(43)
    lens, hits = [40, 90, 75], [32, 48, 64]
    ids, mask, pos, real = generate_like(rng, lens, hits)
    width = ids.shape[1]
    got_ids, got_mask = _hfrows.prompts(ids, mask)
    assert np.array_equal(got_ids, ids) and np.array_equal(got_mask, mask != 0)
    cols, seen = _hfrows.cached_columns(got_mask, hits)
    pads = [width - n for n in lens]
    assert cols == min(p + h for p, h in zip(pads, hits)) == 48, cols
    assert list(seen) == [max(0, cols - p) for p in pads] == [0, 48, 33], seen
    skip = np.asarray(hits) - seen
    prompt = [r.astype(np.int64) for r in real]
    # the first forward: columns [cols:], as generate slices them; each row
    # adds its prompt after its own hit, from the column pad + hit on
    st = _hfrows.plan(ids[:, cols:], mask, pos[:, cols:], cols, seen, skip, prompt)
    assert [list(t) for t in st.tokens] == [list(r[h:]) for r, h in zip(real, hits)]
    assert list(st.skipped) == [32, 0, 31] and list(st.real) == [40, 42, 42], (st.skipped, st.real)
    want = [(i, p + t - cols) for i, (p, h, n) in enumerate(zip(pads, hits, lens)) for t in range(h, n)]
    assert list(zip(*(list(x) for x in st.rows))) == want
    seen, skip, cols = seen + st.real, skip - st.skipped, width
    assert list(seen) == lens and not skip.any()
    # decode: one column a row, the mask grown by ones, positions one on
    for step in range(3):
        new = rng.integers(3, 50000, (3, 1))
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], 1)
        p = (seen + 0)[:, None]
        st = _hfrows.plan(new, mask, p, cols, seen, skip, prompt)
        assert st.rows is None and [list(t) for t in st.tokens] == [[int(x)] for x in new[:, 0]]
        seen, cols = seen + st.real, cols + 1
    # refusals: positions of the columns (no position_ids), a mask that does
    # not match the rows, another prompt
    ids, mask, pos, real = generate_like(rng, [20, 30], [0, 0])
    zero = np.zeros(2, np.int64)
    for args, what in (((ids, mask, None, 0, zero, zero), "position_ids"),
                       ((ids, mask[:, 1:], pos, 0, zero, zero), "attention_mask"),
                       ((ids[:, 5:], mask, pos[:, 5:], 5, np.asarray([1, 0]), zero), "attention_mask"),
                       ((ids, mask, pos, 0, zero, zero, [r[::-1].copy() for r in real]), "prompt")):
        try:
            _hfrows.plan(*args)
            raise AssertionError(f"{what}: no error")
        except ValueError as e:
            assert what in str(e), e
    st = _hfrows.plan(ids, mask, pos, 0, zero, zero, real)
    assert [list(t) for t in st.tokens] == [list(r) for r in real] and len(st.rows[0]) == 50


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_")]
    tmp = tempfile.mkdtemp(prefix="kvqd-python.")
    daemon, sock = start_kvqd(tmp)
    ctx = {"tmp": tmp, "sock": sock}
    failed = 0
    try:
        for i, (name, f) in enumerate(tests, 1):
            try:
                f(ctx)
                print(f"ok {i} - {f.__doc__.splitlines()[0]}")
            except Exception:
                failed += 1
                print(f"not ok {i} - {f.__doc__.splitlines()[0]}")
                for line in traceback.format_exc().splitlines():
                    print("# " + line)
            sys.stdout.flush()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"1..{len(tests)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
