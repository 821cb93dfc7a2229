/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf's schema: the one list of its section kinds and of its keys
 * (rows only: conf_schema.h turns them into data, conf.h into fields).
 *
 * A key is one row, X(section, key, type, field, lo, hi, step, default,
 * flags, what):
 *   section  the section kind that holds it (KVQ_CONF_SECTIONS)
 *   key      its name in the file, a C identifier
 *   type     how its value is read and stored (KVQ_CONF_T_*, below)
 *   field    the field of the section's struct that holds the value; the
 *            struct's fields are generated from the rows (conf.h).  A
 *            GIDS or SHARE row shares the field of the UIDS or AMOUNT row
 *            before it (one ACL, one amount that two keys set).
 *   lo, hi, step  range of the numeric types (U32, INT, COUNT, BYTES, MS);
 *            step: the value must be a multiple of it
 *   default  in the file's own syntax, read by the row's own reader; ""
 *            when the field starts zeroed (or is required, or inherited)
 *   flags    KVQ_CONF_RELOAD: SIGHUP applies a new value (else the running
 *            value stays until the next start, with a log line);
 *            KVQ_CONF_REQUIRED: a section without it is an error;
 *            KVQ_CONF_INHERIT: unset, it takes the [kvqd] key of the same
 *            name once the whole file is read
 *   what     kvqd.conf(5)'s one-line meaning
 * parsing, range checks, defaults, inheritance and reload are driven by the
 * rows (conf_parse.c, conf_value.c, conf_schema.c); kvqd.conf(5) documents every row of
 * its section and no other key (tests/unit/test_conf_schema.c).
 * KVQ_CONF_KVQD_EXTRA and KVQ_CONF_POOL_EXTRA, when a build defines them,
 * append rows (the throwaway-row test: tests/unit/conf_row.h).
 */
#ifndef KVQD_CONF_KEYS_H
#define KVQD_CONF_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "timing_buckets.h"

/*
 * Section kinds, X(id, word, items, n_items, max, init, check):
 *   word     the header: [word], or [word NAME] when the kind is named
 *   items, n_items  where kvq_config keeps the named sections (an array of
 *            KVQ_CONF_STRUCT_<id> and its count; KVQ_CONF_SINGLE: the kind
 *            is unnamed, once at most, and its keys are kvq_config's own)
 *   max      how many named sections of the kind a file may hold
 *   init     what no default of a row can say, once the row defaults are in
 *            (conf.c)
 *   check    what needs the section's keys together, at its end (or NULL)
 *            (conf_check.c; the reader calls both, conf_parse.c)
 * Each kind has its KVQ_CONF_STRUCT_<id> and its row list
 * KVQ_CONF_<id>_KEYS below.
 */
#define KVQ_CONF_SECTIONS(X) \
	X(KVQD, "kvqd", KVQ_CONF_SINGLE, KVQ_CONF_SINGLE, 1, kvq_config_init_kvqd, NULL) \
	X(POOL, "pool", KVQ_CONF_ITEMS(pools), KVQ_CONF_ITEMS(n_pools), KVQ_CONFIG_MAX_POOLS, kvq_config_init_pool, \
	  conf_check_pool) \
	X(REMOTE, "remote", KVQ_CONF_ITEMS(remotes), KVQ_CONF_ITEMS(n_remotes), KVQ_CONFIG_MAX_REMOTES, NULL, \
	  conf_check_remote)

#define KVQ_CONF_STRUCT_KVQD struct kvq_config
#define KVQ_CONF_STRUCT_POOL struct kvq_config_pool
#define KVQ_CONF_STRUCT_REMOTE struct kvq_config_remote

enum kvq_conf_section {
#define KVQ_CONF_SECTION_ENUM(id, word, items, n_items, max, init, check) KVQ_CONF_SEC_##id,
	KVQ_CONF_SECTIONS(KVQ_CONF_SECTION_ENUM)
#undef KVQ_CONF_SECTION_ENUM
	KVQ_CONF_SEC_COUNT
};

/* Value types: how a row's value is read (conf_parse.c), and the C field it
 * is kept in (KVQ_CONF_DECL_<type>). */
enum kvq_conf_type {
	KVQ_CONF_T_PATH,        /* absolute path that fits sun_path */
	KVQ_CONF_T_BACKEND,     /* auto, host or cuda */
	KVQ_CONF_T_INT,         /* decimal in lo-hi, kept as int */
	KVQ_CONF_T_U32,         /* decimal in lo-hi, a multiple of step */
	KVQ_CONF_T_BOOL,        /* yes/no, true/false, on/off, 1/0 */
	KVQ_CONF_T_LOGLEVEL,    /* syslog level name or 0-7 */
	KVQ_CONF_T_BUDGET,      /* a size, or N% (the '%' required) */
	KVQ_CONF_T_AMOUNT,      /* a size; with the SHARE row after it, one of the pair */
	KVQ_CONF_T_SHARE,       /* N or N% of the AMOUNT row's field */
	KVQ_CONF_T_UIDS,        /* user names or numbers of an ACL */
	KVQ_CONF_T_GIDS,        /* group names or numbers of the UIDS row's ACL */
	KVQ_CONF_T_QUOTA,       /* a size, or none */
	KVQ_CONF_T_LISTEN,      /* loopback ADDRESS:PORT */
	KVQ_CONF_T_MODEL,       /* printable text */
	KVQ_CONF_T_POLICY,      /* a policy, parsed once layers is known */
	KVQ_CONF_T_DTYPE,       /* f16 or bf16 */
	KVQ_CONF_T_COUNT,       /* a limit: a count in lo-hi */
	KVQ_CONF_T_BYTES,       /* a limit: a size in lo-hi */
	KVQ_CONF_T_MS,          /* a limit: milliseconds in lo-hi */
	KVQ_CONF_T_NODES,       /* ADDRESS:PORT,... (IPv4, or IPv6 in brackets) */
	KVQ_CONF_T_WORD,        /* printable, no blanks, within the field */
	KVQ_CONF_T_FILE,        /* absolute path of a file (read by the section's check) */
	KVQ_CONF_T_WRITE,       /* through, back or off (enum kvq_remote_write) */
	KVQ_CONF_T_COUNT_OF_TYPES
};

#define KVQ_CONF_DECL_PATH(f) char f[KVQ_CONFIG_PATH_MAX + 1];
#define KVQ_CONF_DECL_BACKEND(f) char f[8];
#define KVQ_CONF_DECL_INT(f) int f;
#define KVQ_CONF_DECL_U32(f) uint32_t f;
#define KVQ_CONF_DECL_BOOL(f) bool f;
#define KVQ_CONF_DECL_LOGLEVEL(f) int f;
#define KVQ_CONF_DECL_BUDGET(f) struct kvq_config_amount f;
#define KVQ_CONF_DECL_AMOUNT(f) struct kvq_config_amount f;
#define KVQ_CONF_DECL_SHARE(f)
#define KVQ_CONF_DECL_UIDS(f) struct kvq_config_acl f;
#define KVQ_CONF_DECL_GIDS(f)
#define KVQ_CONF_DECL_QUOTA(f) uint64_t f;
#define KVQ_CONF_DECL_LISTEN(f) char f[KVQ_CONFIG_LISTEN_MAX + 1];
#define KVQ_CONF_DECL_MODEL(f) char f[KVQ_CONFIG_MODEL_MAX + 1];
#define KVQ_CONF_DECL_POLICY(f) struct kvq_policy f;
#define KVQ_CONF_DECL_DTYPE(f) int f;          /* KVQ_DT_F16 or KVQ_DT_BF16 */
#define KVQ_CONF_DECL_COUNT(f) uint64_t f;
#define KVQ_CONF_DECL_BYTES(f) uint64_t f;
#define KVQ_CONF_DECL_MS(f) uint64_t f;
#define KVQ_CONF_DECL_NODES(f) char f[KVQ_CONFIG_NODES_MAX + 1];
#define KVQ_CONF_DECL_WORD(f) char f[KVQ_CONFIG_WORD_MAX + 1];
#define KVQ_CONF_DECL_FILE(f) char f[KVQ_CONFIG_FILE_MAX + 1];
#define KVQ_CONF_DECL_WRITE(f) int f;          /* enum kvq_remote_write */

#define KVQ_CONF_RELOAD 1u
#define KVQ_CONF_REQUIRED 2u
#define KVQ_CONF_INHERIT 4u

/*
 * [kvqd]: the daemon.  The limits (COUNT, BYTES, MS) bound what one client
 * may cost the others (kvqd.conf(5) "Limits", the threat model in kvqd(8));
 * max_connections' maximum is the protocol's KVQ_PROTO_MAX_CLIENTS, which
 * bounds a StatsReply, and kvqd takes fewer when its file descriptors allow
 * fewer (daemon/server.c); group_lookup_timeout_ms and
 * group_pending_lookups: daemon/groups.h.  A lower connection limit closes
 * no connection, it refuses new ones.  attention_timing is on by default
 * (kvq.proto "Attention timings"; its cost on an H200: bench/RESULTS.md,
 * 2026-12-04).
 */
#define KVQ_CONF_KVQD_KEYS(X) \
	X(KVQD, socket, PATH, socket, 0, 0, 0, KVQ_ROOT_SOCKET, 0, "Unix socket of the control plane") \
	X(KVQD, backend, BACKEND, backend, 0, 0, 0, "auto", 0, "where pools live: auto, host or cuda") \
	X(KVQD, device, INT, device, 0, KVQ_CONFIG_MAX_DEVICE, 1, "0", 0, "default CUDA device of pools") \
	X(KVQD, memory_budget, BUDGET, memory_budget, 0, 0, 0, "90%", KVQ_CONF_RELOAD, \
	  "cap on pool memory per device") \
	X(KVQD, log_level, LOGLEVEL, log_level, 0, 0, 0, "info", 0, "least important message logged") \
	X(KVQD, create_on_attach, BOOL, create_on_attach, 0, 0, 0, "yes", KVQ_CONF_RELOAD, \
	  "whether an attach may create a pool not listed here") \
	X(KVQD, create_uids, UIDS, create_acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "users who may create such pools") \
	X(KVQD, create_gids, GIDS, create_acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "groups whose members may create them") \
	X(KVQD, create_capacity, AMOUNT, create_capacity, 0, 0, 0, "", KVQ_CONF_RELOAD, \
	  "size of a pool created on attach") \
	X(KVQD, create_memory_share, SHARE, create_capacity, 0, 0, 0, "25", KVQ_CONF_RELOAD, \
	  "or its percent of memory_budget") \
	X(KVQD, quota_per_uid, QUOTA, quota_per_uid, 0, 0, 0, "none", KVQ_CONF_RELOAD, \
	  "default per-user quota of the pools") \
	X(KVQD, admin_uids, UIDS, admin_acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "users who may run admin operations") \
	X(KVQD, admin_gids, GIDS, admin_acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "groups whose members may") \
	X(KVQD, metrics_listen, LISTEN, metrics_listen, 0, 0, 0, "", 0, "loopback address of the metrics") \
	X(KVQD, attention_timing, BOOL, attention_timing, 0, 0, 0, "yes", KVQ_CONF_RELOAD, \
	  "whether clients time attention (default of pools)") \
	X(KVQD, attention_report_ms, U32, attention_report_ms, KVQ_TIMING_MIN_REPORT_MS, KVQ_TIMING_MAX_REPORT_MS, \
	  1, "5000", KVQ_CONF_RELOAD, "how often clients report timings") \
	X(KVQD, max_connections, COUNT, max_connections, 1, KVQ_PROTO_MAX_CLIENTS, 1, "1024", KVQ_CONF_RELOAD, \
	  "connections at once") \
	X(KVQD, max_connections_per_uid, COUNT, max_connections_per_uid, 1, 1024, 1, "512", KVQ_CONF_RELOAD, \
	  "connections of one uid") \
	X(KVQD, max_output, BYTES, max_output, 65536, 64u << 20, 1, "1M", KVQ_CONF_RELOAD, \
	  "queued reply bytes per connection") \
	X(KVQD, frames_per_wakeup, COUNT, frames_per_wakeup, 1, 4096, 1, "32", KVQ_CONF_RELOAD, \
	  "requests per connection per turn") \
	X(KVQD, handshake_timeout_ms, MS, handshake_timeout_ms, 100, 600000, 1, "5000", KVQ_CONF_RELOAD, \
	  "time to the Hello") \
	X(KVQD, idle_timeout_ms, MS, idle_timeout_ms, 0, 86400000, 1, "0", KVQ_CONF_RELOAD, \
	  "idle time of a connection with no pool") \
	X(KVQD, accept_pause_ms, MS, accept_pause_ms, 10, 10000, 1, "200", KVQ_CONF_RELOAD, \
	  "pause of accept at a limit") \
	X(KVQD, group_lookup_timeout_ms, MS, group_lookup_timeout_ms, 10, 3600000, 1, "30000", KVQ_CONF_RELOAD, \
	  "a group lookup's wait for its ranks") \
	X(KVQD, group_pending_lookups, COUNT, group_pending_lookups, 1, 65536, 1, "1024", KVQ_CONF_RELOAD, \
	  "group lookups waiting for ranks") \
	X(KVQD, host_tier_reserve, U32, host_tier_reserve, 0, 50, 1, "5", KVQ_CONF_RELOAD, \
	  "percent of a tiered pool's slots kept free by demotion") \
	X(KVQD, host_tier_inflight, COUNT, host_tier_inflight, 1, 4096, 1, "64", KVQ_CONF_RELOAD, \
	  "blocks of a pool in demotion at once") \
	X(KVQD, host_tier_wait_ms, MS, host_tier_wait_ms, 1, 600000, 1, "1000", KVQ_CONF_RELOAD, \
	  "a lookup's wait for its promotions") \
	KVQ_CONF_KVQD_EXTRA(X)

/* [pool NAME]: one configured pool.  A pool's memory, geometry and policy
 * are set when it is created; a reload changes its ACL, quota and timing. */
#define KVQ_CONF_POOL_KEYS(X) \
	X(POOL, model, MODEL, model, 0, 0, 0, "", KVQ_CONF_REQUIRED, "model id, part of every prefix key") \
	X(POOL, device, INT, device, 0, KVQ_CONFIG_MAX_DEVICE, 1, "", KVQ_CONF_INHERIT, "CUDA device of this pool") \
	X(POOL, layers, U32, layers, 1, KVQ_MAX_LAYERS, 1, "", KVQ_CONF_REQUIRED, "the model's layers") \
	X(POOL, kv_heads, U32, kv_heads, 1, KVQ_MAX_HEADS, 1, "", KVQ_CONF_REQUIRED, "its KV heads") \
	X(POOL, head_dim, U32, head_dim, 32, KVQ_MAX_HEAD_DIM, 32, "", KVQ_CONF_REQUIRED, "its head dimension") \
	X(POOL, block_tokens, U32, block_tokens, 16, KVQ_MAX_BLOCK_TOKENS, 16, "32", 0, "tokens per block") \
	X(POOL, policy, POLICY, policy, 0, 0, 0, "", KVQ_CONF_REQUIRED, "K and V formats per layer") \
	X(POOL, window, U32, window, 1, 64 * KVQ_MAX_BLOCK_TOKENS, 1, "", 0, \
	  "recent tokens kept unquantized (0: the layout's default)") \
	X(POOL, window_dtype, DTYPE, act, 0, 0, 0, "f16", 0, "dtype of the open window") \
	X(POOL, sink_blocks, U32, sink_blocks, 0, 1, 1, "0", 0, "whether each sequence's first block stays exact") \
	X(POOL, capacity, AMOUNT, capacity, 0, 0, 0, "", KVQ_CONF_REQUIRED, "pool memory in bytes") \
	X(POOL, memory_share, SHARE, capacity, 0, 0, 0, "", KVQ_CONF_REQUIRED, "or a percent of memory_budget") \
	X(POOL, host_capacity, AMOUNT, host_capacity, 0, 0, 0, "", 0, \
	  "bytes of the pool's host tier (0: none)") \
	X(POOL, host_memory_share, SHARE, host_capacity, 0, 0, 0, "", 0, \
	  "or a percent of the host's memory_budget") \
	X(POOL, acl_uids, UIDS, acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "users who may attach") \
	X(POOL, acl_gids, GIDS, acl, 0, 0, 0, "", KVQ_CONF_RELOAD, "groups whose members may attach") \
	X(POOL, quota_per_uid, QUOTA, quota_per_uid, 0, 0, 0, "", KVQ_CONF_RELOAD | KVQ_CONF_INHERIT, \
	  "per-user quota in this pool") \
	X(POOL, create_on_attach, BOOL, create_on_attach, 0, 0, 0, "no", 0, "allocate at the first attach") \
	X(POOL, attention_timing, BOOL, attention_timing, 0, 0, 0, "", KVQ_CONF_RELOAD | KVQ_CONF_INHERIT, \
	  "whether this pool's clients time attention") \
	X(POOL, remote, WORD, remote, 0, 0, 0, "", 0, "the [remote NAME] it shares blocks through (none: off)") \
	X(POOL, remote_namespace, WORD, remote_namespace, 0, 0, 0, "", 0, \
	  "the namespace its blocks share on the remote (required with remote)") \
	X(POOL, remote_write, WRITE, remote_write, 0, 0, 0, "through", 0, \
	  "when it writes blocks to the remote: through, back or off") \
	KVQ_CONF_POOL_EXTRA(X)

/*
 * [remote NAME]: a Redis Cluster that pools of several kvqd share blocks
 * through (daemon/rcluster.h; docs/DESIGN.md, "The remote tier").  The
 * files are read when the section ends (conf_check_remote): the secrets
 * are kept in the section's struct, never in a row's field.  No row
 * reloads: a SIGHUP keeps the running remotes, and the pools' remote keys,
 * until the next start.  The timeouts bound what a Lookup may wait on the
 * remote; max_value_bytes what one record may cost the loop.
 */
#define KVQ_CONF_REMOTE_KEYS(X) \
	X(REMOTE, nodes, NODES, nodes, 0, 0, 0, "", KVQ_CONF_REQUIRED, "seed nodes ADDRESS:PORT,... of the cluster") \
	X(REMOTE, user, WORD, user, 0, 0, 0, "", 0, "Redis ACL user of AUTH (needs password_file)") \
	X(REMOTE, password_file, FILE, password_file, 0, 0, 0, "", 0, "file holding the AUTH password") \
	X(REMOTE, hmac_key_file, FILE, hmac_key_file, 0, 0, 0, "", KVQ_CONF_REQUIRED, \
	  "file holding the key that signs every value (32 bytes or more)") \
	X(REMOTE, connect_timeout_ms, MS, connect_timeout_ms, 10, 60000, 1, "1000", 0, "bound on a connection's start") \
	X(REMOTE, request_timeout_ms, MS, request_timeout_ms, 10, 60000, 1, "1000", 0, "bound on one request") \
	X(REMOTE, max_inflight, COUNT, max_inflight, 1, 65536, 1, "1024", 0, "requests to the cluster at once") \
	X(REMOTE, max_value_bytes, BYTES, max_value_bytes, 65536, 512u << 20, 1, "64M", 0, \
	  "largest value stored or taken") \
	X(REMOTE, ttl_s, COUNT, ttl_s, 0, 315360000, 1, "0", 0, "seconds a written value lives (0: until evicted)")

#ifndef KVQ_CONF_KVQD_EXTRA
#define KVQ_CONF_KVQD_EXTRA(X)
#endif
#ifndef KVQ_CONF_POOL_EXTRA
#define KVQ_CONF_POOL_EXTRA(X)
#endif

/* Every row, the sections' lists one after the other. */
#define KVQ_CONF_KEYS(X) KVQ_CONF_KVQD_KEYS(X) KVQ_CONF_POOL_KEYS(X) KVQ_CONF_REMOTE_KEYS(X)

/* A section's fields, in its struct (conf.h). */
#define KVQ_CONF_FIELD(sec, key, type, field, lo, hi, step, def, flags, what) KVQ_CONF_DECL_##type(field)

/* K_<SECTION>_<key>: a row's index in conf_schema_keys[]. */
enum conf_schema_key_id {
#define KVQ_CONF_KEY_ENUM(sec, key, type, field, lo, hi, step, def, flags, what) K_##sec##_##key,
	KVQ_CONF_KEYS(KVQ_CONF_KEY_ENUM)
#undef KVQ_CONF_KEY_ENUM
	K_COUNT
};

#endif
