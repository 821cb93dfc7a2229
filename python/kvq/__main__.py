# SPDX-License-Identifier: Apache-2.0
"""python -m kvq [--socket PATH] [--json] stats POOL: a pool's figures as
libkvq reports them (kvq_client_stats, kvq_client_sink_stats), under
kvqctl's names: the text has kvqctl stats' labels, --json its keys (blocks
free/open/sealed/cached/referenced/reserved and the sink slots', prefix
lookup/hit tokens and hit rate, evictions, alloc failures, clients, live
sequences).  kvqctl shows more (policy, bytes per token, resident tokens
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
    }


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
