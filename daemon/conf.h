/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf: the daemon's settings and its configured pools.
 *
 * INI-like, one "key = value" per line:
 *
 *   [kvqd]                  the daemon (optional; every key has a default)
 *   [pool NAME]             one section per pool (none at all is fine: pools
 *                           are then created by the first attach that names
 *                           them, if [kvqd] create_on_attach allows it)
 *
 * Whole-line comments start with '#' or ';' (not after a value: policies use
 * ';').  Blanks around keys, values and section names are ignored.  Unknown
 * sections and keys, a key given twice in a section, a pool name given
 * twice, missing required keys and bad values are errors reported as
 * "FILE:LINE: what is wrong"; a file with an error yields nothing.
 * systemd/kvqd.conf.example documents every key.
 *
 * Sizes are bytes with an optional K, M, G or T suffix (powers of 1024,
 * "KiB" style accepted).  memory_budget also takes "N%" (N may have
 * decimals): of the device's memory with the cuda backend, of physical
 * memory with host.  A pool's memory_share is a percent of the budget of
 * its device.
 *
 * The reader is conf_parse.c, the checks that need more than one value
 * conf_check.c, the defaults conf_defaults.c.
 */
#ifndef KVQD_CONF_H
#define KVQD_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "policy.h"

/* Limits on what a config file may hold. */
#define KVQ_CONFIG_MAX_FILE (1u << 20)                 /* bytes of the whole file */
#define KVQ_CONFIG_MAX_LINE (KVQ_POLICY_MAX_LEN + 256u) /* bytes of one line: room for any policy */
#define KVQ_CONFIG_MAX_POOLS 64u
#define KVQ_CONFIG_NAME_MAX 63u      /* pool name: [A-Za-z0-9._-] */
#define KVQ_CONFIG_MODEL_MAX 255u    /* model id: printable, no control characters */
#define KVQ_CONFIG_PATH_MAX 107u     /* socket path: fits sockaddr_un.sun_path */
#define KVQ_CONFIG_MAX_IDS 64u       /* entries of one uid or gid list */
#define KVQ_CONFIG_MAX_DEVICE 1023
#define KVQ_CONFIG_MSG_MAX 512       /* room for an error message */
#define KVQ_CONFIG_LISTEN_MAX 63u    /* metrics_listen: "127.0.0.1:9464", "[::1]:9464" */

/* Attention timing (kvq.proto "Attention timings"): on (its cost on an
 * H200: bench/RESULTS.md, 2026-12-04); reports every 5 s. */
#define KVQ_CONFIG_ATTENTION_TIMING true
#define KVQ_CONFIG_ATTENTION_REPORT_MS 5000u

/* No quota. */
#define KVQ_CONFIG_UNLIMITED UINT64_MAX

/*
 * The limits on what clients control, one row each and the one list of them:
 * X(key, default, min, max, unit, what).  key is the [kvqd] key and the field
 * of struct kvq_config_limits; unit is COUNT, BYTES (a size, K/M/G suffixes)
 * or MS (milliseconds).  Every limit is reloaded by SIGHUP and applies to
 * connections already open from then on (a lower connection limit closes
 * none, it refuses new ones).  kvqd.conf(5) documents each row.
 *   max_connections     connections at once (exiting ones included), and
 *                       at most half the file descriptors kvqd has left
 *                       after its own (daemon/server.c); its maximum is the
 *                       protocol's KVQ_PROTO_MAX_CLIENTS, which bounds a
 *                       StatsReply
 *   max_connections_per_uid  live connections of one uid
 *   max_output          reply bytes queued for one connection before kvqd
 *                       decodes no more of its requests
 *   frames_per_wakeup   requests of one connection answered before the
 *                       others get their turn
 *   handshake_timeout_ms  a connection that has sent no Hello by then is
 *                       closed
 *   idle_timeout_ms     a connection attached to no pool (it holds no
 *                       lease) that sends nothing for this long is closed;
 *                       0: never
 *   accept_pause_ms     how long kvqd stops accepting when it is out of file
 *                       descriptors or at max_connections (a connection's
 *                       end resumes it sooner)
 *   group_lookup_timeout_ms  how long a tensor-parallel group keeps the
 *                       references of a lookup for the ranks that have not
 *                       looked up the same request yet (daemon/groups.h)
 *   group_pending_lookups  requests waiting for ranks, per group
 */
#define KVQ_LIMITS(X) \
	X(max_connections,         1024,        1,     1024,       COUNT, "connections at once") \
	X(max_connections_per_uid, 512,         1,     1024,       COUNT, "connections of one uid") \
	X(max_output,              (1u << 20),  65536, (64u << 20), BYTES, "queued reply bytes per connection") \
	X(frames_per_wakeup,       32,          1,     4096,       COUNT, "requests per connection per turn") \
	X(handshake_timeout_ms,    5000,        100,   600000,     MS,    "time to the Hello") \
	X(idle_timeout_ms,         0,           0,     86400000,   MS,    "idle time of a connection with no pool")  \
	X(accept_pause_ms,         200,         10,    10000,      MS,    "pause of accept at a limit") \
	X(group_lookup_timeout_ms, 30000,       10,    3600000,    MS,    "a group lookup's wait for its ranks") \
	X(group_pending_lookups,   1024,        1,     65536,      COUNT, "group lookups waiting for ranks")

enum kvq_limit_unit { KVQ_LIMIT_COUNT, KVQ_LIMIT_BYTES, KVQ_LIMIT_MS };

struct kvq_config_limits {
#define KVQ_LIMIT_FIELD(key, def, lo, hi, unit, what) uint64_t key;
	KVQ_LIMITS(KVQ_LIMIT_FIELD)
#undef KVQ_LIMIT_FIELD
};

/* The rows of KVQ_LIMITS as data (conf_defaults.c): the parser's keys, the
 * defaults, the checks. */
struct kvq_limit_row {
	const char *key;
	uint64_t def, lo, hi;
	enum kvq_limit_unit unit;
	const char *what;
	size_t offset;          /* of the field in struct kvq_config_limits */
};
extern const struct kvq_limit_row kvq_limit_rows[];
extern const size_t kvq_limit_rows_n;

/* An amount of memory: bytes, or a percent of something named where used. */
enum kvq_config_amount_kind { KVQ_AMOUNT_BYTES = 0, KVQ_AMOUNT_PERCENT };

struct kvq_config_amount {
	int kind;           /* enum kvq_config_amount_kind */
	uint64_t bytes;     /* KVQ_AMOUNT_BYTES */
	double percent;     /* KVQ_AMOUNT_PERCENT: in (0, 100] */
};

/* Who may do something: any peer when any is set (no list given: the
 * socket's file mode is then the only gate), else the listed uids and any
 * member of the listed gids. */
struct kvq_config_acl {
	bool any;
	uint32_t n_uids, n_gids;
	uid_t uids[KVQ_CONFIG_MAX_IDS];
	gid_t gids[KVQ_CONFIG_MAX_IDS];
};

struct kvq_config_pool {
	char name[KVQ_CONFIG_NAME_MAX + 1];
	char model[KVQ_CONFIG_MODEL_MAX + 1];
	unsigned line;                   /* line of the [pool NAME] header */
	int device;
	uint32_t layers, kv_heads, head_dim, block_tokens;
	uint32_t window;                 /* open window in tokens, default resolved */
	int act;                         /* open window dtype: KVQ_DT_F16 or KVQ_DT_BF16 */
	uint32_t sink_blocks;            /* 1: every sequence's first block exact in a sink slot */
	struct kvq_policy policy;
	struct kvq_config_amount capacity; /* BYTES: capacity; PERCENT: memory_share */
	struct kvq_config_acl acl;
	uint64_t quota_per_uid;          /* bytes, or KVQ_CONFIG_UNLIMITED */
	bool create_on_attach;           /* allocate at the first attach, not at start */
	bool attention_timing;           /* clients time attention and report it */
};

struct kvq_config {
	char socket[KVQ_CONFIG_PATH_MAX + 1];
	char backend[8];                 /* "auto", "host" or "cuda" */
	int device;                      /* default device of pools */
	struct kvq_config_amount memory_budget; /* per device */
	int log_level;                   /* syslog level, LOG_EMERG .. LOG_DEBUG */
	bool create_on_attach;           /* may an attach create a pool not listed here? */
	struct kvq_config_acl create_acl; /* who may */
	struct kvq_config_amount create_capacity; /* capacity of such a pool (PERCENT: of the budget) */
	uint64_t quota_per_uid;          /* default of pools, or KVQ_CONFIG_UNLIMITED */
	struct kvq_config_acl admin_acl; /* who may evict, flush, add and drop pools */
	char metrics_listen[KVQ_CONFIG_LISTEN_MAX + 1]; /* loopback "ADDR:PORT", "" when off */
	bool attention_timing;           /* default of pools, and of pools created on attach */
	uint32_t attention_report_ms;    /* how often clients report timings */
	struct kvq_config_limits limits; /* KVQ_LIMITS */
	uint32_t n_pools;
	struct kvq_config_pool *pools;
};

/* Built-in defaults, with no file: socket /run/kvqd/kvqd.sock, backend
 * auto, device 0, memory_budget 90%, log_level info, create_on_attach yes
 * for root and the daemon's own user (create_uids / create_gids widen it;
 * create_uids replaces that default), created pools get 25% of the budget, no
 * quota, admin operations for root and the daemon's own user (admin_uids /
 * admin_gids as create_*), no metrics, the limits' defaults (KVQ_LIMITS), no pools.  Returns 0 and *ret_config (free with kvq_config_free),
 * or -ENOMEM. */
int kvq_config_new(struct kvq_config **ret_config);

/* Parses the file at path.  Returns 0 and *ret_config; -EINVAL with
 * "PATH:LINE: what is wrong" in err; or the open/read error (negative errno)
 * with "PATH: reason".  *ret_config is untouched on failure. */
int kvq_config_parse_file(const char *path, struct kvq_config **ret_config, char *err, size_t errlen);

/* Parses text[0..len) as if read from a file called name (for messages);
 * same returns as kvq_config_parse_file. */
int kvq_config_parse_string(const char *text, size_t len, const char *name, struct kvq_config **ret_config,
			    char *err, size_t errlen);

/* Frees a config; accepts NULL. */
void kvq_config_free(struct kvq_config *c);

/* The pool called name, or NULL. */
const struct kvq_config_pool *kvq_config_find_pool(const struct kvq_config *c, const char *name);

/* Whether a peer with uid and groups gids[0..n_gids) passes acl. */
bool kvq_config_acl_allows(const struct kvq_config_acl *acl, uid_t uid, const gid_t *gids, size_t n_gids);

/* An amount in bytes against total (the device's or host's memory for the
 * budget, the budget for shares); percentages round down. */
uint64_t kvq_config_amount_bytes(const struct kvq_config_amount *a, uint64_t total);

/* Parses a size ("64G", "1536MiB", "4096") into bytes: 0 or -EINVAL
 * (-ERANGE past 2^64 - 1).  Exposed for the CLI and tests. */
int kvq_config_parse_size(const char *s, uint64_t *ret_bytes);

/* Splits a metrics_listen value ("127.0.0.1:9464", "[::1]:9464") into its
 * address (without brackets, into addr[addrlen]) and port.  Only loopback
 * addresses are accepted: the metrics name pools and models and have no
 * authentication.  Returns 0, or -EINVAL with a reason in err. */
int kvq_config_parse_listen(const char *s, char *addr, size_t addrlen, uint16_t *ret_port, char *err,
			    size_t errlen);

#endif
