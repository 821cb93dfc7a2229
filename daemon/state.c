/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "log.h"
#include "seterr.h"
#include "state.h"

int kvq_state_init(struct kvq_state *st, const struct kvq_config *cfg, const char *backend, int device,
		   const struct kvq_keep *keep, char *err, size_t errlen)
{
	int r;

	memset(st, 0, sizeof(*st));
	st->cfg = cfg;
	clock_gettime(CLOCK_MONOTONIC, &st->started);
	r = kvq_pools_init(&st->pools, backend, device, keep, err, errlen);
	if (r < 0)
		return r;
	if (!strcmp(backend, "auto") && st->pools.backend == &kvq_backend_host)
		kvq_log(LOG_NOTICE, "backend auto: using host (%s)", st->pools.backend_reason);
	else
		kvq_log(LOG_INFO, "backend %s", st->pools.backend_reason);
	for (uint32_t i = 0; i < cfg->n_pools; i++) {
		struct kvq_pools_rec *p;

		r = kvq_pools_from_config(&st->pools, &cfg->pools[i], &p, err, errlen);
		if (r < 0)
			goto fail;
		p->attention_report_ms = kvq_pools_report_ms(cfg, p->name);
		kvq_pools_add(&st->pools, p);
		if (!cfg->pools[i].create_on_attach) {
			r = kvq_pools_allocate(&st->pools, cfg, p, 0, 0, 0, NULL, err, errlen);
			if (r < 0) {
				char m[KVQ_BACKEND_MSG_MAX];

				snprintf(m, sizeof(m), "%s", err ? err : "");
				kvq_seterr(err, errlen, "pool %s: %s", p->name, m);
				goto fail;
			}
		}
	}
	kvq_pools_restore_rest(&st->pools, cfg);
	return 0;
fail:
	kvq_pools_fini(&st->pools);
	return r;
}

void kvq_state_fini(struct kvq_state *st)
{
	kvq_pools_fini(&st->pools);
}

void kvq_state_set_config(struct kvq_state *st, const struct kvq_config *cfg)
{
	st->cfg = cfg;
	for (uint32_t i = 0; i < cfg->n_pools; i++) {
		const struct kvq_config_pool *cp = &cfg->pools[i];
		struct kvq_pools_rec *p = kvq_pools_find(&st->pools, cp->name);

		if (!p) {
			kvq_log(LOG_NOTICE, "reload: new pool %s is ignored until restart", cp->name);
			continue;
		}
		p->acl = cp->acl;
		p->quota = cp->quota_per_uid;
	}
	for (struct kvq_pools_rec *p = st->pools.head; p; p = p->next) {
		if (!kvq_config_find_pool(cfg, p->name))
			p->quota = cfg->quota_per_uid;
		/* clients attached keep the interval they were told */
		p->attention_report_ms = kvq_pools_report_ms(cfg, p->name);
	}
}

/* ---------------------------------------------------------------- connections */

static void conn_unlink(struct kvq_conn **list, struct kvq_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*list = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

static void conn_push(struct kvq_conn **list, struct kvq_conn *c)
{
	c->prev = NULL;
	c->next = *list;
	if (*list)
		(*list)->prev = c;
	*list = c;
}

int kvq_state_conn_new(struct kvq_state *st, struct kvq_conn **ret)
{
	struct kvq_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->st = st;
	c->id = ++st->next_id;
	c->pidfd = -1;
	c->kept = -1;
	st->n_conns++;
	conn_push(&st->conns, c);
	*ret = c;
	return 0;
}

void kvq_state_conn_exiting(struct kvq_conn *c)
{
	conn_unlink(&c->st->conns, c);
	conn_push(&c->st->dying, c);
	c->exiting = true;
}

/* Gives every hold of c's lease back to its pool. */
static void lease_drop(struct kvq_conn *c)
{
	struct kvq_lease_dropped d;
	bool mid_write = false;

	if (!c->pool || !c->lease)
		return;
	/* a group's rank that held unpublished blocks died in a write */
	for (uint32_t pos = 0, id, n; c->pool->glink.g && !mid_write && kvq_lease_next_sealed(c->lease, &pos, &id, &n);)
		mid_write = kvq_pool_state(c->pool->pool, id) == KVQ_POOL_PRIVATE;
	kvq_lease_drop(c->lease, c->pool->pool, &d);
	c->lease = NULL;
	if (mid_write)
		kvq_group_rank_lost(c->pool);
	if (d.open_refused)
		kvq_log(LOG_ERR, "client %llu: %u open slots of its lease were not in use", (unsigned long long)c->id,
			d.open_refused);
	if (d.sealed_refused)
		kvq_log(LOG_ERR, "client %llu: %u sealed blocks of its lease had no reference",
			(unsigned long long)c->id, d.sealed_refused);
	if (d.open || d.sealed)
		kvq_log(LOG_DEBUG, "client %llu: lease dropped (%u open slots, %u sealed blocks)",
			(unsigned long long)c->id, d.open, d.sealed);
}

void kvq_state_conn_free(struct kvq_conn *c)
{
	conn_unlink(c->exiting ? &c->st->dying : &c->st->conns, c);
	lease_drop(c);
	if (c->pool) {
		/* after its holds went: the books never say a process is gone
		 * while slots are still counted as its own */
		kvq_pools_detached(c->pool, c->kept);
		c->pool->clients--;
	}
	c->st->n_conns--;
	free(c);
}

/* ---------------------------------------------------------------- access and quotas */

bool kvq_conn_acl_ok(const struct kvq_conn *c, const struct kvq_config_acl *acl)
{
	return kvq_config_acl_allows(acl, c->uid, c->groups, c->n_groups);
}

bool kvq_conn_is_admin(const struct kvq_conn *c)
{
	return c->uid == 0 || kvq_conn_acl_ok(c, &c->st->cfg->admin_acl);
}

bool kvq_conn_sees(const struct kvq_conn *c, const struct kvq_pools_rec *p)
{
	return p->allocated && kvq_conn_acl_ok(c, &p->acl);
}

uint64_t kvq_state_lease_bytes(const struct kvq_pools_rec *p, const kvq_lease *l)
{
	/* a sink slot is an open slice (kernels/layout.h) */
	return (uint64_t)(kvq_lease_n_sealed(l) - kvq_lease_n_sink(l)) * p->L->sealed_block_bytes +
	       (uint64_t)kvq_lease_n_sink(l) * p->L->open_block_bytes +
	       (uint64_t)kvq_lease_n_open(l) * (p->L->open_block_bytes + p->L->sealed_block_bytes);
}

/* Bytes of pool p that uid holds over all its connections, dying ones too. */
static uint64_t uid_bytes(const struct kvq_state *st, const struct kvq_pools_rec *p, uid_t uid)
{
	const struct kvq_conn *lists[2] = { st->conns, st->dying };
	uint64_t sum = 0;

	for (int i = 0; i < 2; i++)
		for (const struct kvq_conn *c = lists[i]; c; c = c->next)
			if (c->pool == p && c->uid == uid && c->lease)
				sum += kvq_state_lease_bytes(p, c->lease);
	return sum;
}

bool kvq_state_quota_allows(const struct kvq_state *st, const struct kvq_pools_rec *p, uid_t uid, uint64_t extra)
{
	uint64_t used;

	if (p->quota == KVQ_CONFIG_UNLIMITED || !extra)
		return true;
	used = uid_bytes(st, p, uid);
	return used <= p->quota && extra <= p->quota - used;
}
