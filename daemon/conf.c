/* SPDX-License-Identifier: Apache-2.0 */
/* The config: what no row's default can say (the section kinds' init
 * hooks) and what the daemon asks of a config once it is read. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#include "conf.h"

void kvq_config_init_kvqd(void *config)
{
	struct kvq_config *c = config;

	/* who may create pools unless the file says: root and the daemon's own user */
	c->create_acl.any = false;
	c->create_acl.n_uids = 0;
	c->create_acl.uids[c->create_acl.n_uids++] = 0;
	if (geteuid() != 0)
		c->create_acl.uids[c->create_acl.n_uids++] = geteuid();
	/* admin operations: the same default as pool creation */
	c->admin_acl = c->create_acl;
}

void kvq_config_init_pool(void *pool)
{
	struct kvq_config_pool *pl = pool;

	pl->acl.any = true;
}

const struct kvq_config_pool *kvq_config_find_pool(const struct kvq_config *c, const char *name)
{
	for (uint32_t i = 0; c && name && i < c->n_pools; i++)
		if (strcmp(c->pools[i].name, name) == 0)
			return &c->pools[i];
	return NULL;
}

const struct kvq_config_remote *kvq_config_find_remote(const struct kvq_config *c, const char *name)
{
	for (uint32_t i = 0; c && name && i < c->n_remotes; i++)
		if (strcmp(c->remotes[i].name, name) == 0)
			return &c->remotes[i];
	return NULL;
}

void kvq_config_keep_secrets(const struct kvq_config *running, struct kvq_config *next)
{
	for (uint32_t i = 0; i < next->n_remotes; i++) {
		struct kvq_config_remote *n = &next->remotes[i];
		const struct kvq_config_remote *r = kvq_config_find_remote(running, n->name);

		if (!r)
			continue;
		memcpy(n->hmac_key, r->hmac_key, sizeof n->hmac_key);
		n->hmac_key_len = r->hmac_key_len;
		memcpy(n->password, r->password, sizeof n->password);
	}
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

