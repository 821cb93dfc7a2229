# SPDX-License-Identifier: Apache-2.0
"""python -m kvq [--socket PATH] [--json] stats POOL: a pool's figures as
libkvq reports them (kvq_client_stats, kvq_client_sink_stats), under
kvqctl's names: the text has kvqctl stats' labels, --json its keys (blocks
free/open/sealed/cached/referenced/reserved and the sink slots', prefix
lookup/hit tokens and hit rate, evictions, alloc failures, clients, live
sequences, the remote tier: hits, blocks and bytes each way, queue, errors
by kind, the fetch times' buckets).  kvqctl shows more (policy, bytes per token, resident tokens
and bytes, clients' names), which libkvq's stats do not carry."""
import argparse
import json
import sys

from . import DaemonUnavailable, KvqError, connect


def pool_doc(s, k):
    """A pool's figures (s: Client.stats, k: Client.sink_stats) with
    kvqctl --json stats' keys."""
    return {
        "name": s["name"], "model_id": s["model_id"], "backend": s["backend"], "device": s["device"],
        "layers": s["layers"], "kv_heads": s["kv_heads"], "head_dim": s["head_dim"],
        "block_tokens": s["block_tokens"], "window": s["window"], "sink_blocks": k["sink_blocks"],
        "capacity_bytes": s["total_bytes"],
        "blocks": {"sealed_slots": s["n_sealed"], "open_slots": s["n_open"], "free": s["sealed_free"],
                   "reserved": s["sealed_reserved"], "sealed": s["sealed_held"], "cached": s["cached"],
                   "referenced": s["referenced"], "open": s["open_used"], "sink_slots": k["n_sink"],
                   "sink_free": k["sink_free"], "sink": k["sink_held"], "sink_cached": k["sink_cached"],
                   "sink_referenced": k["sink_referenced"]},
        "lookup_tokens": s["lookup_tokens"], "hit_tokens": s["hit_tokens"],
        "hit_rate": s["hit_tokens"] / s["lookup_tokens"] if s["lookup_tokens"] else None,
        "evictions": s["evictions"], "alloc_failures": s["alloc_failures"], "clients_attached": s["clients"],
        "resident": {"sequences": k["sequences"],
                     "sequences_max": k["sequences"] if k["sink_blocks"] else s["open_used"],
                     "sink_tokens_max": k["sink_tokens"]},
        "remote": remote_doc(s),
    }


def remote_doc(s):
    """The remote tier's figures of s (Client.stats) as kvqctl --json stats'
    "remote" object: errors by kind and the fetch times' cumulative buckets
    come from the figures' names (remote_errors_KIND, remote_fetch_le_BOUND),
    so a kind or bound kvqd adds shows without a change here."""
    def prefixed(prefix):
        return {k[len(prefix):]: v for k, v in s.items() if k.startswith(prefix)}

    g = s.get
    return {"on": bool(g("remote_on", 0)), "hit_tokens": g("remote_hit_tokens", 0),
            "fetched": g("remote_fetched", 0), "absent": g("remote_absent", 0), "written": g("remote_written", 0),
            "dropped": g("remote_dropped", 0), "bytes_in": g("remote_bytes_in", 0),
            "bytes_out": g("remote_bytes_out", 0), "queue": g("remote_queue", 0),
            "errors": prefixed("remote_errors_"), "fetches": g("remote_fetches", 0),
            "fetch_us": g("remote_fetch_us", 0), "fetch_le": prefixed("remote_fetch_le_")}


def print_pool(d):
    b = d["blocks"]
    print(f"pool {d['name']}")
    print(f"  model           {d['model_id']}")
    print(f"  geometry        {d['layers']} layers, {d['kv_heads']} KV heads, head dim {d['head_dim']}, "
          f"{d['block_tokens']} tokens/block, window {d['window']}")
    print(f"  backend         {d['backend']}, device {d['device'] if d['device'] >= 0 else '-'}")
    print(f"  capacity        {d['capacity_bytes']} bytes, {b['sealed_slots']} sealed + {b['open_slots']} open slots")
    print(f"  blocks          free {b['free']}, open {b['open']}, sealed {b['sealed']}, cached {b['cached']} "
          f"(referenced {b['referenced']}), reserved {b['reserved']}")
    if d["sink_blocks"]:
        print(f"  sink blocks     {b['sink_slots']} slots (first blocks kept exact): free {b['sink_free']}, "
              f"held {b['sink']}, cached {b['sink_cached']} (referenced {b['sink_referenced']})")
    rate = 100.0 * (d["hit_rate"] or 0.0)
    print(f"  prefix          {d['hit_tokens']} of {d['lookup_tokens']} tokens looked up were cached: "
          f"hit rate {rate:.1f}%")
    print(f"  evictions       {d['evictions']}")
    print(f"  alloc failures  {d['alloc_failures']}")
    print(f"  clients         {d['clients_attached']}")
    r = d["resident"]
    print(f"  resident        {r['sequences']} sequences (at most {r['sequences_max']})")
    m = d["remote"]
    if not m["on"]:
        print("  remote          none")
        return
    print(f"  remote          {m['hit_tokens']} tokens of hits served: fetched {m['fetched']} blocks "
          f"({m['absent']} absent), {m['bytes_in']} bytes in; written {m['written']} ({m['dropped']} dropped, "
          f"{m['queue']} queued), {m['bytes_out']} bytes out")
    mean = m["fetch_us"] / m["fetches"] / 1e3 if m["fetches"] else 0.0
    le = ", ".join(f"{b} {n}" for b, n in m["fetch_le"].items() if n)
    print(f"                  {m['fetches']} fetches, mean {mean:.2f} ms" + (f"; at most {le}" if le else ""))
    errs = ", ".join(f"{k} {n}" for k, n in m["errors"].items() if n)
    print(f"                  {('errors: ' + errs) if errs else 'no errors'}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvq", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="kvqd's socket (default: $KVQ_SOCKET, else libkvq's default)")
    ap.add_argument("--json", action="store_true", help="one JSON document")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stats", help="a pool's figures")
    st.add_argument("pool")
    a = ap.parse_args(argv)
    try:
        with connect(a.socket, "python-kvq") as c:
            d = pool_doc(c.stats(a.pool), c.sink_stats(a.pool))
    except (DaemonUnavailable, KvqError) as e:
        print(f"python -m kvq: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(d, indent=1))
    else:
        print_pool(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
