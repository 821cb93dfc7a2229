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
 *   [remote NAME]           a Redis Cluster that pools share blocks through
 *                           (none: no pool shares)
 *
 * Whole-line comments start with '#' or ';' (not after a value: policies use
 * ';').  Blanks around keys, values and section names are ignored.  Unknown
 * sections and keys, a key given twice in a section, a pool name given
 * twice, missing required keys and bad values are errors reported as
 * "FILE:LINE: what is wrong"; a file with an error yields nothing.
 * The sections and keys are the rows of conf_keys.h; kvqd.conf(5) and
 * systemd/kvqd.conf.example document every key.
 *
 * Sizes are bytes with an optional K, M, G or T suffix (powers of 1024,
 * "KiB" style accepted).  memory_budget also takes "N%" (N may have
 * decimals): of the device's memory with the cuda backend, of physical
 * memory with host.  A pool's memory_share is a percent of the budget of
 * its device.
 *
 * The types are here and the questions the daemon asks of a config
 * (conf.c); the reader, with the defaults and inheritance, is conf_parse.h,
 * one value by its row's type conf_value.h, the checks that need more than
 * one value conf_check.h, the schema as data and what a reload keeps
 * conf_schema.h.
 */
#ifndef KVQD_CONF_H
#define KVQD_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conf_keys.h"
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
#define KVQ_CONFIG_MAX_REMOTES 8u
#define KVQ_CONFIG_NODES_MAX 1023u   /* a remote's seed list */
#define KVQ_CONFIG_WORD_MAX 64u      /* a remote namespace, a Redis user */
#define KVQ_CONFIG_FILE_MAX 255u     /* a key or password file's path */
#define KVQ_CONFIG_HMAC_MIN 32u      /* bytes of an HMAC key: SHA-256's output at least */
#define KVQ_CONFIG_HMAC_MAX 1024u
#define KVQ_CONFIG_PASSWORD_MAX 512u

/* No quota. */
#define KVQ_CONFIG_UNLIMITED UINT64_MAX

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

/* A named section's first fields, for the schema's generic code. */
#define KVQ_CONFIG_NAMED_HEAD \
	char name[KVQ_CONFIG_NAME_MAX + 1]; \
	unsigned line;                   /* line of the section's header */
struct kvq_config_named {
	KVQ_CONFIG_NAMED_HEAD
};

/* [pool NAME]: its keys' fields come from its rows (conf_keys.h). */
struct kvq_config_pool {
	KVQ_CONFIG_NAMED_HEAD
	KVQ_CONF_POOL_KEYS(KVQ_CONF_FIELD)
};

/* A pool's remote_write: through (every block it publishes, once it has
 * it), back (a block when it leaves the last local tier), off (it reads
 * the remote and never writes). */
enum kvq_remote_write { KVQ_REMOTE_WRITE_THROUGH = 0, KVQ_REMOTE_WRITE_BACK, KVQ_REMOTE_WRITE_OFF };

/* [remote NAME]: its keys' fields from its rows, then what its files
 * hold, read when the section ends (conf_check_remote); the config's free
 * wipes them. */
struct kvq_config_remote {
	KVQ_CONFIG_NAMED_HEAD
	KVQ_CONF_REMOTE_KEYS(KVQ_CONF_FIELD)
	uint8_t hmac_key[KVQ_CONFIG_HMAC_MAX];
	uint32_t hmac_key_len;
	char password[KVQ_CONFIG_PASSWORD_MAX + 1];   /* "" without password_file */
};

/* [kvqd]'s fields come from its rows (conf_keys.h), then each named
 * section kind's array (KVQ_CONF_SECTIONS). */
struct kvq_config {
	KVQ_CONF_KVQD_KEYS(KVQ_CONF_FIELD)
	uint32_t n_pools;
	struct kvq_config_pool *pools;
	uint32_t n_remotes;
	struct kvq_config_remote *remotes;
};

/* The section kinds' init hooks (KVQ_CONF_SECTIONS): what no row's default
 * can say.  [kvqd]: pools are created and admin operations run by root and
 * the daemon's own user unless the file names others.  [pool NAME]: a pool
 * without an ACL is open to anyone who can connect. */
void kvq_config_init_kvqd(void *config);
void kvq_config_init_pool(void *pool);

/* The pool called name, or NULL. */
const struct kvq_config_pool *kvq_config_find_pool(const struct kvq_config *c, const char *name);

/* The remote called name, or NULL. */
const struct kvq_config_remote *kvq_config_find_remote(const struct kvq_config *c, const char *name);

/* What a remote's files held (not rows: kvq_config_keep_running calls
 * this) back to the running config's, for each remote both hold: a reload
 * changes no remote key, and no secret either, until the next start. */
void kvq_config_keep_secrets(const struct kvq_config *running, struct kvq_config *next);

/* Whether a peer with uid and groups gids[0..n_gids) passes acl. */
bool kvq_config_acl_allows(const struct kvq_config_acl *acl, uid_t uid, const gid_t *gids, size_t n_gids);

/* An amount in bytes against total (the device's or host's memory for the
 * budget, the budget for shares); percentages round down. */
uint64_t kvq_config_amount_bytes(const struct kvq_config_amount *a, uint64_t total);

#endif
