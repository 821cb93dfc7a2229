/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvqd.conf parser's state, shared by its three parts: the reader
 * (conf_parse.c: lines, sections, keys, values), the checks (conf_check.c:
 * what one value cannot tell) and the defaults (conf_defaults.c).  Not for
 * the rest of the daemon, which sees conf.h.
 */
#ifndef KVQD_CONF_PARSER_H
#define KVQD_CONF_PARSER_H

#include <stdbool.h>
#include <stddef.h>

#include "conf.h"

enum { SEC_NONE = 0, SEC_KVQD = 1, SEC_POOL = 2 };

/* The first limit's key; K_FIRST_LIMIT + i is kvq_limit_rows[i]'s. */
#define K_FIRST_LIMIT K_LIMIT_max_connections

enum key {
	K_SOCKET, K_BACKEND, K_DEVICE, K_MEMORY_BUDGET, K_LOG_LEVEL, K_CREATE_ON_ATTACH, K_CREATE_UIDS,
	K_CREATE_GIDS, K_CREATE_CAPACITY, K_CREATE_MEMORY_SHARE, K_QUOTA_PER_UID, K_ADMIN_UIDS, K_ADMIN_GIDS,
	K_METRICS_LISTEN, K_ATTENTION_TIMING, K_ATTENTION_REPORT_MS,
	K_MODEL, K_LAYERS, K_KV_HEADS, K_HEAD_DIM, K_BLOCK_TOKENS, K_POLICY, K_WINDOW, K_WINDOW_DTYPE,
	K_SINK_BLOCKS, 	K_CAPACITY, K_MEMORY_SHARE, K_ACL_UIDS, K_ACL_GIDS,
#define K_LIMIT_KEY(key, def, lo, hi, unit, what) K_LIMIT_##key,
	KVQ_LIMITS(K_LIMIT_KEY)         /* one per row, in the rows' order (kvq_limit_rows[]) */
#undef K_LIMIT_KEY
	K_COUNT
};

/* The keys: name and the sections that allow it (conf_parse.c; the
 * limits' rows are KVQ_LIMITS's). */
struct conf_key {
	const char *name;
	unsigned sections;      /* SEC_KVQD | SEC_POOL */
};
extern const struct conf_key conf_keys[K_COUNT];

struct conf_parser {
	const char *file;
	char *err;
	size_t errlen;
	struct kvq_config *c;
	int sec;
	unsigned line, sec_line, kvqd_line;
	unsigned seen[K_COUNT];         /* line where each key of the open section was set */
	struct kvq_config_pool *pool;   /* the open [pool] section */
	unsigned pool_device_line[KVQ_CONFIG_MAX_POOLS]; /* 0: device comes from [kvqd] */
	unsigned pool_quota_line[KVQ_CONFIG_MAX_POOLS];
	unsigned pool_timing_line[KVQ_CONFIG_MAX_POOLS];
	char policy[KVQ_POLICY_MAX_LEN + 1];  /* kept until layers is known */
	char buf[KVQ_CONFIG_MAX_LINE + 1];
};

/* "FILE:LINE: what is wrong" into p->err; returns -EINVAL. */
int conf_fail(struct conf_parser *p, unsigned line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Decimal digits only, into *ret: 0, -EINVAL or -ERANGE. */
int conf_parse_u64(const char *s, uint64_t *ret);

/* A pool name: 1-KVQ_CONFIG_NAME_MAX of [A-Za-z0-9._-]. */
bool conf_valid_name(const char *s);

/* The checks of a [pool] section once all its keys are read (keys that
 * depend on each other).  0 or -EINVAL with the message set. */
int conf_check_pool(struct conf_parser *p);

/* The checks across sections, once the file is read and the defaults are
 * in: shares and capacities of the pools of one device. */
int conf_check_all(struct conf_parser *p);

/* Built-in defaults of the [kvqd] settings (kvq_config_new's). */
void conf_defaults(struct kvq_config *c);

/* A new [pool] section's defaults. */
void conf_pool_defaults(struct kvq_config_pool *pl);

/* What pools take from [kvqd] when they do not set it (device,
 * quota_per_uid, attention_timing): applied after the whole file is read, since [kvqd] may
 * come last. */
void conf_inherit(struct conf_parser *p);

#endif
