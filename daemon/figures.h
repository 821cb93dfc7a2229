/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The figures kvqd reports of each pool: one table with a row per figure,
 * from which every consumer is made.  The daemon fills PoolStats.figures
 * (kvq.proto, version 7) and the metrics' per-pool families from it;
 * libkvq (kvq_client_pool_stat), kvqctl and the Python package read the
 * figures by name from PoolStats.figures, so a new figure is one row here.
 * A pool's identity and geometry (name, policy, layers, ...) are PoolStats'
 * own fields, not figures.
 *
 *   X(ID, NAME, TYPE, FAMILY, LABEL, MEANING, VALUE)
 *
 *   ID       internal name (kvq_pool_stats' where it comes from there)
 *   NAME     the figure's name in PoolStats.figures, libkvq, Python's
 *            Client.stats() and kvqctl --json (a figure kvqctl has no place
 *            of its own for is shown under it); NULL: the metrics only (a
 *            figure the others derive from figures they have).  Frozen
 *            once shipped: sealed_private is shown as sealed_held.
 *   TYPE     GAUGE or COUNTER (only grows); every value is a uint64
 *   FAMILY   the Prometheus family, or NULL: not in the metrics
 *   LABEL    the value of FAMILY's label (KVQ_POOL_FAMILIES) when the figure
 *            is one sample of a labelled family; NULL: the family has one
 *            sample per pool, of this figure
 *   MEANING  one line; a one-sample family's HELP
 *   VALUE    an expression of i, the pool's const struct kvq_pools_info *
 *
 * The metrics list each family at its first row, with its samples in row
 * order: a figure of an existing family goes after that family's rows, a
 * new family's at the end, so the text of the others does not move.
 *
 * KVQ_POOL_FIGURES_EXTRA, when a build defines it, appends rows (the test
 * of the table adds a throwaway figure that way: tests/unit/figure_row.h).
 */
#ifndef KVQD_FIGURES_H
#define KVQD_FIGURES_H

#include <stddef.h>
#include <stdint.h>

#include "pools.h"

/* Rows a build may have at most (PoolStats.figures' room in kvqd). */
#define KVQ_FIGURES_MAX 96u

#ifndef KVQ_POOL_FIGURES_EXTRA
#define KVQ_POOL_FIGURES_EXTRA(X)
#endif

#define KVQ_POOL_FIGURES(X)                                                                                        \
	/* slots by state */                                                                                       \
	X(sealed_free, "sealed_free", GAUGE, "kvq_blocks", "free", "Sealed slots neither held, reserved nor cached.", \
	  i->st.sealed_free)                                                                                       \
	X(sealed_reserved, "sealed_reserved", GAUGE, "kvq_blocks", "reserved", "Sealed slots reserved for open slots.", \
	  i->st.sealed_reserved)                                                                                   \
	X(sealed_private, "sealed_held", GAUGE, "kvq_blocks", "held", "Sealed slots allocated, not published.",      \
	  i->st.sealed_private)                                                                                    \
	X(sealed_cached, "cached", GAUGE, "kvq_blocks", "cached", "Sealed blocks in the prefix cache.",             \
	  i->st.sealed_cached)                                                                                     \
	X(cached_referenced, "referenced", GAUGE, "kvq_blocks", "referenced",                                      \
	  "Cached sealed blocks with at least one reference.", i->st.cached_referenced)                            \
	X(open_used, "open_used", GAUGE, "kvq_blocks", "open_used", "Open slots allocated.", i->st.open_used)      \
	X(open_free, NULL, GAUGE, "kvq_blocks", "open_free", "Open slots free.", i->st.open_free)                   \
	X(sink_free, "sink_free", GAUGE, "kvq_blocks", "sink_free", "Sink slots neither held nor cached.",          \
	  i->st.sink_free)                                                                                         \
	X(sink_private, "sink_held", GAUGE, "kvq_blocks", "sink_held", "Sink slots allocated, not published.",      \
	  i->st.sink_private)                                                                                      \
	X(sink_cached, "sink_cached", GAUGE, "kvq_blocks", "sink_cached", "Sink blocks in the prefix cache.",       \
	  i->st.sink_cached)                                                                                       \
	X(sink_referenced, "sink_referenced", GAUGE, "kvq_blocks", "sink_referenced",                              \
	  "Cached sink blocks with at least one reference.", i->st.sink_referenced)                                \
	X(demoting, "demoting", GAUGE, "kvq_blocks", "demoting",                                                    \
	  "Sealed and sink slots whose block is being copied to the host tier (0 without one).",                  \
	  (uint64_t)i->st.sealed_demoting + i->st.sink_demoting)                                                   \
	/* bytes of the slots by state */                                                                          \
	X(held_bytes, NULL, GAUGE, "kvq_pool_bytes", "held", "Bytes of the held sealed slots.",                    \
	  (uint64_t)i->st.sealed_private * i->sealed_block_bytes)                                                  \
	X(cached_bytes, NULL, GAUGE, "kvq_pool_bytes", "cached", "Bytes of the cached sealed blocks.",             \
	  (uint64_t)i->st.sealed_cached * i->sealed_block_bytes)                                                   \
	X(reserved_bytes, NULL, GAUGE, "kvq_pool_bytes", "reserved", "Bytes of the reserved sealed slots.",        \
	  (uint64_t)i->st.sealed_reserved * i->sealed_block_bytes)                                                 \
	X(open_bytes, NULL, GAUGE, "kvq_pool_bytes", "open", "Bytes of the used open slots.",                      \
	  (uint64_t)i->st.open_used * i->open_block_bytes)                                                         \
	X(sink_held_bytes, NULL, GAUGE, "kvq_pool_bytes", "sink_held", "Bytes of the held sink slots.",            \
	  (uint64_t)i->st.sink_private * i->open_block_bytes)                                                      \
	X(sink_cached_bytes, NULL, GAUGE, "kvq_pool_bytes", "sink_cached", "Bytes of the cached sink blocks.",     \
	  (uint64_t)i->st.sink_cached * i->open_block_bytes)                                                       \
	/* one sample per pool */                                                                                  \
	X(total_bytes, "total_bytes", GAUGE, "kvq_pool_capacity_bytes", NULL, "Bytes of the pool's layout.",       \
	  i->total_bytes)                                                                                          \
	X(group_pending, NULL, GAUGE, "kvq_pool_group_pending_lookups", NULL,                                      \
	  "Lookups of the pool's tensor-parallel group waiting for ranks (0: in no group).", i->group_pending)    \
	X(device_memory, "device_memory", GAUGE, "kvq_pool_device_memory_bytes", NULL,                             \
	  "Memory of the pool's device (host: physical memory).", i->device_memory)                                \
	X(bytes_per_token, NULL, GAUGE, "kvq_pool_sealed_bytes_per_token", NULL,                                   \
	  "Bytes one sealed token takes over all layers, scales included.",                                        \
	  i->sealed_block_bytes / i->block_tokens)                                                                 \
	X(n_sealed, "n_sealed", GAUGE, "kvq_pool_sealed_slots", NULL, "Sealed slots of the pool.", i->st.n_sealed) \
	X(n_open, "n_open", GAUGE, "kvq_pool_open_slots", NULL, "Open slots of the pool.", i->st.n_open)           \
	X(n_sink, "n_sink", GAUGE, "kvq_pool_sink_slots", NULL,                                                    \
	  "Sink slots of the pool (sink blocks: each sequence's first block exact; 0 without).", i->st.n_sink)     \
	X(lookup_tokens, "lookup_tokens", COUNTER, "kvq_prefix_lookup_tokens_total", NULL,                         \
	  "Tokens prefix lookups asked for.", i->lookup_tokens)                                                    \
	X(hit_tokens, "hit_tokens", COUNTER, "kvq_prefix_hit_tokens_total", NULL,                                  \
	  "Tokens prefix lookups found cached.", i->hit_tokens)                                                    \
	X(evictions, "evictions", COUNTER, "kvq_evictions_total", NULL, "Cached blocks evicted.", i->st.evictions) \
	X(alloc_failures, "alloc_failures", COUNTER, "kvq_alloc_failures_total", NULL,                             \
	  "Allocations refused for lack of room.", i->alloc_failures)                                              \
	X(clients, "clients", GAUGE, "kvq_pool_clients", NULL, "Connections attached to the pool.", i->clients)    \
	X(sequences, "sequences", GAUGE, "kvq_resident_sequences", NULL,                                           \
	  "Live sequences: open slots used / (window / block tokens), rounded up (exact when the window is one "   \
	  "block); with sink blocks the references on sink blocks (exact).", i->res.sequences)                     \
	X(resident_bytes, "resident_bytes", GAUGE, "kvq_resident_bytes", NULL,                                     \
	  "Bytes the resident tokens take: their distinct sealed blocks, open slots and the sealed slots "         \
	  "reserved for those.", i->res.bytes)                                                                     \
	X(resident_f16_bytes, "resident_f16_bytes", GAUGE, "kvq_resident_f16_bytes", NULL,                         \
	  "Bytes the same tokens would take in f16 (effective batch gain = this / kvq_resident_bytes).",           \
	  i->res.f16_bytes)                                                                                        \
	X(attention_report_ms, "attention_report_ms", GAUGE, "kvq_attention_report_interval_ms", NULL,             \
	  "Attention timing: how often clients report, milliseconds (0: the pool does not time).",                 \
	  i->attention_report_ms)                                                                                  \
	/* resident tokens by kind */                                                                              \
	X(sealed_tokens, "sealed_tokens", GAUGE, "kvq_resident_tokens", "sealed",                                  \
	  "References on sealed blocks x block tokens (as the sequences see them; sink blocks not counted).",      \
	  i->res.sealed_tokens)                                                                                    \
	X(sealed_distinct_tokens, "sealed_distinct_tokens", GAUGE, "kvq_resident_tokens", "sealed_distinct",      \
	  "Sealed blocks with a reference x block tokens (as stored).", i->res.sealed_distinct_tokens)             \
	X(open_tokens_max, "open_tokens_max", GAUGE, "kvq_resident_tokens", "open_max",                            \
	  "Used open slots x block tokens: at most this many open tokens.", i->res.open_tokens_max)                \
	/* not in the metrics */                                                                                   \
	X(sealed_block_bytes, "sealed_block_bytes", GAUGE, NULL, NULL,                                             \
	  "One sealed block, all layers (bytes per token = / block_tokens).", i->sealed_block_bytes)               \
	X(open_block_bytes, "open_block_bytes", GAUGE, NULL, NULL, "One open block (and sink slot), all layers.",  \
	  i->open_block_bytes)                                                                                     \
	X(sink_tokens, "sink_tokens", GAUGE, NULL, NULL,                                                           \
	  "Sink blocks with a reference x block tokens (at most: a first block may not be full yet).",             \
	  i->res.sink_tokens)                                                                                      \
	/* the host tier (daemon/tiering.h); all 0 without one */                                                  \
	X(tier_capacity, "tier_capacity", GAUGE, "kvq_tier_capacity_bytes", NULL,                                  \
	  "Bytes of the pool's host tier (0: none).", i->tier.tier.capacity)                                       \
	X(tier_records, "tier_records", GAUGE, "kvq_tier_records", NULL,                                           \
	  "Block records in the host tier (sealed and sink, copies in flight included).",                          \
	  (uint64_t)i->tier.tier.records[0] + i->tier.tier.records[1])                                             \
	X(tier_bytes, "tier_bytes", GAUGE, "kvq_tier_bytes", NULL, "Bytes of the host tier's records.",            \
	  i->tier.tier.bytes)                                                                                      \
	X(tier_hit_tokens, "tier_hit_tokens", COUNTER, "kvq_tier_hit_tokens_total", NULL,                          \
	  "Tokens of lookups' hits promoted from the host tier (part of hit_tokens).", i->tier.hit_tokens)         \
	X(tier_demotions, "tier_demotions", COUNTER, "kvq_tier_blocks_total", "demoted",                           \
	  "Blocks stored in the host tier.", i->tier.demotions)                                                    \
	X(tier_promotions, "tier_promotions", COUNTER, "kvq_tier_blocks_total", "promoted",                        \
	  "Blocks copied back into the pool for lookups.", i->tier.promotions)                                     \
	X(tier_evictions, "tier_evictions", COUNTER, "kvq_tier_blocks_total", "evicted",                           \
	  "Records the host tier evicted for room.", i->tier.tier.evictions)                                       \
	X(tier_drops, "tier_drops", COUNTER, "kvq_tier_blocks_total", "dropped",                                   \
	  "Records dropped: their parent left both tiers, or their copy failed.", i->tier.tier.dropped)            \
	X(tier_cancelled, "tier_cancelled", COUNTER, "kvq_tier_blocks_total", "cancelled",                         \
	  "Demotions an allocation overtook (the slot taken, the copy dropped).", i->tier.cancelled)               \
	X(tier_copy_bytes, "tier_copy_bytes", COUNTER, "kvq_tier_copy_bytes_total", NULL,                          \
	  "Bytes the copy engine moved for the host tier, both ways.", i->tier.copy_bytes)                         \
	X(tier_copy_us, "tier_copy_us", COUNTER, "kvq_tier_copy_microseconds_total", NULL,                         \
	  "Time of the host tier's copy jobs, microseconds.", i->tier.copy_us)                                     \
	X(tier_copies, "tier_copies", COUNTER, "kvq_tier_copies_total", NULL,                                      \
	  "Copy jobs of the host tier (one per demotion batch or lookup).", i->tier.copies)                        \
	X(tier_open_us, "tier_open_us", GAUGE, "kvq_tier_open_microseconds", NULL,                                 \
	  "Time the host tier took to start: its memory made or taken back, pinned for a cuda pool.",              \
	  i->tier.open_us)                                                                                         \
	/* a restart (daemon/restart.h): what this start took back */                                              \
	X(restart_blocks, "restart_blocks", GAUGE, "kvq_restart_blocks", "cached",                                 \
	  "Cached blocks taken back at this start.", i->restart.blocks)                                            \
	X(restart_records, "restart_records", GAUGE, "kvq_restart_blocks", "tier",                                 \
	  "Host-tier records taken back at this start.", i->restart.records)                                       \
	X(restart_held, "restart_held", GAUGE, "kvq_restart_blocks", "held",                                       \
	  "Slots held now for processes that were attached before the restart and live on.", i->restart.held)      \
	X(restart_us, "restart_us", GAUGE, "kvq_restart_microseconds", NULL,                                       \
	  "Time this start spent taking the pool back, microseconds.", i->restart.us)                              \
	X(restart_cold, "restart_cold", GAUGE, "kvq_restart_cold", NULL,                                           \
	  "1: books a restart left could not be taken back and the pool started cold (the log and Stats say why).", \
	  (uint64_t)(i->restart.cold && i->restart.cold[0]))                                                       \
	/* the remote tier (daemon/rtier.h); all 0 without one */                                                \
	X(remote_hit_tokens, "remote_hit_tokens", COUNTER, "kvq_remote_hit_tokens_total", NULL, "Tokens of lookups' hits fetched from the remote tier (part of hit_tokens).", i->remote.hit_tokens) \
	X(remote_fetched, "remote_fetched", COUNTER, "kvq_remote_blocks_total", "fetched", "Blocks fetched from the remote, verified and placed in the pool.", i->remote.fetched) \
	X(remote_absent, "remote_absent", COUNTER, "kvq_remote_blocks_total", "absent", "Blocks a lookup asked the remote for that it did not have.", i->remote.absent) \
	X(remote_written, "remote_written", COUNTER, "kvq_remote_blocks_total", "written", "Blocks written to the remote.", i->remote.written) \
	X(remote_dropped, "remote_dropped", COUNTER, "kvq_remote_blocks_total", "dropped", "Blocks not written: queue full, parent's remote key unknown, evicted first, refused.", i->remote.dropped) \
	X(remote_bytes_in, "remote_bytes_in", COUNTER, "kvq_remote_bytes_total", "in", "Bytes of values read from the remote.", i->remote.bytes_in) \
	X(remote_bytes_out, "remote_bytes_out", COUNTER, "kvq_remote_bytes_total", "out", "Bytes of values written to the remote.", i->remote.bytes_out) \
	X(remote_queue, "remote_queue", GAUGE, "kvq_remote_write_queue", NULL, "Blocks waiting to be written to the remote, and writes in flight.", i->remote.queue) \
	X(remote_errors_timeout, "remote_errors_timeout", COUNTER, "kvq_remote_errors_total", "timeout", "Remote failures: timeout (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_TIMEOUT]) \
	X(remote_errors_conn, "remote_errors_conn", COUNTER, "kvq_remote_errors_total", "conn", "Remote failures: conn (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_CONN]) \
	X(remote_errors_down, "remote_errors_down", COUNTER, "kvq_remote_errors_total", "down", "Remote failures: down (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_DOWN]) \
	X(remote_errors_loop, "remote_errors_loop", COUNTER, "kvq_remote_errors_total", "loop", "Remote failures: loop (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_LOOP]) \
	X(remote_errors_auth, "remote_errors_auth", COUNTER, "kvq_remote_errors_total", "auth", "Remote failures: auth (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_AUTH]) \
	X(remote_errors_full, "remote_errors_full", COUNTER, "kvq_remote_errors_total", "full", "Remote failures: full (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_FULL]) \
	X(remote_errors_cancelled, "remote_errors_cancelled", COUNTER, "kvq_remote_errors_total", "cancelled", "Remote failures: cancelled (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_CANCELLED]) \
	X(remote_errors_oversize, "remote_errors_oversize", COUNTER, "kvq_remote_errors_total", "oversize", "Remote failures: oversize (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_OVERSIZE]) \
	X(remote_errors_magic, "remote_errors_magic", COUNTER, "kvq_remote_errors_total", "magic", "Remote failures: magic (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_MAGIC]) \
	X(remote_errors_truncated, "remote_errors_truncated", COUNTER, "kvq_remote_errors_total", "truncated", "Remote failures: truncated (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_TRUNCATED]) \
	X(remote_errors_version, "remote_errors_version", COUNTER, "kvq_remote_errors_total", "version", "Remote failures: version (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_VERSION]) \
	X(remote_errors_identity, "remote_errors_identity", COUNTER, "kvq_remote_errors_total", "identity", "Remote failures: identity (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_IDENTITY]) \
	X(remote_errors_key, "remote_errors_key", COUNTER, "kvq_remote_errors_total", "key", "Remote failures: key (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_KEY]) \
	X(remote_errors_hmac, "remote_errors_hmac", COUNTER, "kvq_remote_errors_total", "hmac", "Remote failures: hmac (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_HMAC]) \
	X(remote_errors_record, "remote_errors_record", COUNTER, "kvq_remote_errors_total", "record", "Remote failures: record (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_RECORD]) \
	X(remote_errors_reply, "remote_errors_reply", COUNTER, "kvq_remote_errors_total", "reply", "Remote failures: reply (each a miss or a dropped write).", i->remote.errors[KVQ_RTIER_E_REPLY]) \
	X(remote_on, "remote_on", GAUGE, NULL, NULL, "1: the pool has a remote tier (kvqd.conf remote).",        \
	  (uint64_t)i->remote.on)                                                                                  \
	/* the remote's fetch times: the metrics' histogram kvq_remote_fetch_seconds (daemon/metrics.c) */        \
	X(remote_fetches, "remote_fetches", COUNTER, NULL, NULL,                                                   \
	  "Fetches from the remote timed: a lookup's GETs, sent until each value was unpacked or refused.",       \
	  i->remote.fetch_time.count)                                                                              \
	X(remote_fetch_us, "remote_fetch_us", COUNTER, NULL, NULL, "Time of those fetches, microseconds.",         \
	  (uint64_t)(i->remote.fetch_time.sum * 1e6))                                                              \
	KVQ_REMOTE_FETCH_LE(X, 250us, 0.00025, "250 us") KVQ_REMOTE_FETCH_LE(X, 500us, 0.0005, "500 us")            \
	KVQ_REMOTE_FETCH_LE(X, 1ms, 0.001, "1 ms") KVQ_REMOTE_FETCH_LE(X, 2_5ms, 0.0025, "2.5 ms")                   \
	KVQ_REMOTE_FETCH_LE(X, 10ms, 0.01, "10 ms") KVQ_REMOTE_FETCH_LE(X, 50ms, 0.05, "50 ms")                      \
	KVQ_REMOTE_FETCH_LE(X, 250ms, 0.25, "250 ms") KVQ_REMOTE_FETCH_LE(X, 1s, 1.0, "1 s")                         \
	KVQ_POOL_FIGURES_EXTRA(X)

/* A cumulative bucket of the remote's fetch times as a row: the fetches of
 * at most le seconds (a bound of kvq_hist_bucket_le, daemon/hist.h). */
#define KVQ_REMOTE_FETCH_LE(X, tag, le, text)                                                                      \
	X(remote_fetch_le_##tag, "remote_fetch_le_" #tag, COUNTER, NULL, NULL,                                     \
	  "Fetches from the remote that took at most " text " (cumulative).",                                     \
	  kvq_hist_le(&i->remote.fetch_time, le))

/* The labelled families of the rows: F(FAMILY, KEY, HELP), KEY the label
 * whose value is a row's LABEL. */
#define KVQ_POOL_FAMILIES(F)                                                                                       \
	F("kvq_blocks", "state", "Slots of each pool by state (sealed: free, reserved, held, cached; cached and "   \
	  "referenced; open: used, free; sink slots, 0 without sink blocks: free, held, cached, referenced; "       \
	  "demoting: in copy to the host tier).")                                                                   \
	F("kvq_pool_bytes", "state", "Bytes of each pool's slots by state (sealed: held, cached, reserved; open: "    \
	  "used; sink: held, cached).")                                                                             \
	F("kvq_tier_blocks_total", "event", "Blocks through each pool's host tier: demoted, promoted, evicted "      \
	  "(for room), dropped (parent gone or copy failed), cancelled (slot taken before the copy ended).")        \
	F("kvq_resident_tokens", "kind", "Tokens resident in live sequences: sealed (as the sequences see them: "    \
	  "references x block tokens), sealed_distinct (as stored), open_max (open slots x block tokens, an upper "  \
	  "bound).  Sharing factor = sealed / sealed_distinct.")                                                    \
	F("kvq_restart_blocks", "kind", "What each pool took back at this start: cached blocks, host-tier "         \
	  "records, and slots held for processes alive across the restart.")                                      \
	F("kvq_remote_blocks_total", "event", "Blocks through each pool's remote tier: fetched (verified, placed), " \
	  "absent (asked, not there), written, dropped (not written).")                                            \
	F("kvq_remote_bytes_total", "dir", "Bytes of values each pool's remote tier read (in) and wrote (out).")   \
	F("kvq_remote_errors_total", "kind", "Each pool's remote failures by kind: the cluster's (timeout, conn, "  \
	  "down, loop, auth, full, cancelled), refused values (oversize, magic, truncated, version, identity, key, " \
	  "hmac), records that did not unpack (record) and unexpected replies (reply); each a miss or a dropped "   \
	  "write.")

enum kvq_figure_type { KVQ_FIGURE_GAUGE, KVQ_FIGURE_COUNTER };

/* A row of KVQ_POOL_FIGURES. */
struct kvq_figure {
	const char *id, *name;           /* name NULL: the metrics only */
	enum kvq_figure_type type;
	const char *family, *label, *meaning;
	uint64_t (*value)(const struct kvq_pools_info *i);
};

/* A labelled family: its label's key and its HELP. */
struct kvq_figure_family {
	const char *family, *key, *help;
};

/* The rows in order, and the labelled families. */
extern const struct kvq_figure kvq_figures[];
extern const size_t kvq_figures_n;
extern const struct kvq_figure_family kvq_figure_families[];
extern const size_t kvq_figure_families_n;

/* The labelled family called family, or NULL (a family of one sample). */
const struct kvq_figure_family *kvq_figure_family(const char *family);

/* "gauge" or "counter". */
const char *kvq_figure_type_name(enum kvq_figure_type t);

/* The rows with a NAME, at most max, into names[] and values[] for pool i
 * (names static).  Returns how many. */
size_t kvq_figures_named(const struct kvq_pools_info *i, const char **names, uint64_t *values, size_t max);

/* A pool's PoolStats and the room for its figures. */
struct kvq_figures_stats {
	Kvq__PoolStats ps;
	Kvq__Figure fig[KVQ_FIGURES_MAX];
	Kvq__Figure *figp[KVQ_FIGURES_MAX];
};

/* The protocol's PoolStats of p, in ret->ps: its identity and geometry,
 * and its figures from the table.  Strings point into p and the table;
 * ret->ps points into ret. */
void kvq_figures_stats(const struct kvq_pools_rec *p, struct kvq_figures_stats *ret);

#endif
