/* SPDX-License-Identifier: Apache-2.0 */
/* kvqd.conf's defaults (the built-in ones, a pool section's, what pools take
 * from [kvqd]) and what the daemon asks of a config once it is read. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "conf_parser.h"
#include "format.h"
#include "kvq_wire.h"

#define DEFAULT_BUDGET_PERCENT 90.0
#define DEFAULT_CREATE_PERCENT 25.0
#define DEFAULT_BLOCK_TOKENS 32u

const struct kvq_limit_row kvq_limit_rows[] = {
#define KVQ_LIMIT_ROW(key, def, lo, hi, unit, what) \
	{ #key, def, lo, hi, KVQ_LIMIT_##unit, what, offsetof(struct kvq_config_limits, key) },
	KVQ_LIMITS(KVQ_LIMIT_ROW)
#undef KVQ_LIMIT_ROW
};
const size_t kvq_limit_rows_n = sizeof(kvq_limit_rows) / sizeof(kvq_limit_rows[0]);

void conf_defaults(struct kvq_config *c)
{
	strcpy(c->socket, KVQ_ROOT_SOCKET);
	strcpy(c->backend, "auto");
	c->device = 0;
	c->memory_budget.kind = KVQ_AMOUNT_PERCENT;
	c->memory_budget.percent = DEFAULT_BUDGET_PERCENT;
	c->log_level = LOG_INFO;
	c->create_on_attach = true;
	/* who may create pools unless the file says: root and the daemon's own user */
	c->create_acl.any = false;
	c->create_acl.uids[c->create_acl.n_uids++] = 0;
	if (geteuid() != 0)
		c->create_acl.uids[c->create_acl.n_uids++] = geteuid();
	c->create_capacity.kind = KVQ_AMOUNT_PERCENT;
	c->create_capacity.percent = DEFAULT_CREATE_PERCENT;
	c->quota_per_uid = KVQ_CONFIG_UNLIMITED;
	c->attention_timing = KVQ_CONFIG_ATTENTION_TIMING;
	c->attention_report_ms = KVQ_CONFIG_ATTENTION_REPORT_MS;
	/* admin operations: the same default as pool creation */
	c->admin_acl = c->create_acl;
	for (size_t i = 0; i < kvq_limit_rows_n; i++)
		*(uint64_t *)((char *)&c->limits + kvq_limit_rows[i].offset) = kvq_limit_rows[i].def;
}

void conf_pool_defaults(struct kvq_config_pool *pl)
{
	pl->block_tokens = DEFAULT_BLOCK_TOKENS;
	pl->act = KVQ_DT_F16;
	pl->acl.any = true;
}

void conf_inherit(struct conf_parser *p)
{
	struct kvq_config *c = p->c;

	for (uint32_t i = 0; i < c->n_pools; i++) {
		struct kvq_config_pool *pl = &c->pools[i];

		if (!p->pool_device_line[i])
			pl->device = c->device;
		if (!p->pool_quota_line[i])
			pl->quota_per_uid = c->quota_per_uid;
		if (!p->pool_timing_line[i])
			pl->attention_timing = c->attention_timing;
	}
}

int kvq_config_new(struct kvq_config **ret_config)
{
	struct kvq_config *c = calloc(1, sizeof *c);

	if (!c)
		return -ENOMEM;
	conf_defaults(c);
	*ret_config = c;
	return 0;
}

void kvq_config_free(struct kvq_config *c)
{
	if (!c)
		return;
	free(c->pools);
	free(c);
}

const struct kvq_config_pool *kvq_config_find_pool(const struct kvq_config *c, const char *name)
{
	for (uint32_t i = 0; c && name && i < c->n_pools; i++)
		if (strcmp(c->pools[i].name, name) == 0)
			return &c->pools[i];
	return NULL;
}

bool kvq_config_acl_allows(const struct kvq_config_acl *acl, uid_t uid, const gid_t *gids, size_t n_gids)
{
	if (acl->any)
		return true;
	for (uint32_t i = 0; i < acl->n_uids; i++)
		if (acl->uids[i] == uid)
			return true;
	for (uint32_t i = 0; i < acl->n_gids; i++)
		for (size_t j = 0; j < n_gids; j++)
			if (acl->gids[i] == gids[j])
				return true;
	return false;
}

uint64_t kvq_config_amount_bytes(const struct kvq_config_amount *a, uint64_t total)
{
	long double b;

	if (a->kind == KVQ_AMOUNT_BYTES)
		return a->bytes;
	/* long double: exact for totals up to 2^64 and percents with decimals */
	b = (long double)total * (long double)a->percent / 100.0L;
	return b >= 18446744073709551615.0L ? UINT64_MAX : (uint64_t)b;
}

