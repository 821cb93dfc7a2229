/* SPDX-License-Identifier: Apache-2.0 */
/* Admin requests (the table lets only root and the admin ACL through):
 * Evict, PoolAdd, PoolDrop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "figures.h"
#include "kvq_wire.h"
#include "log.h"
#include "request.h"
#include "seterr.h"
#include "tiering.h"

/* A pool the caller may name in an admin request: hidden pools read as
 * absent, so the reply does not tell which names exist. */
static int admin_pool(struct kvq_conn *c, const char *name, struct kvq_pools_rec **ret, char *err, size_t errlen)
{
	struct kvq_pools_rec *p = kvq_pools_find(&c->st->pools, name);

	if (!p || !kvq_conn_sees(c, p))
		return kvq_seterr(err, errlen, "no pool %s", name), -ENOENT;
	*ret = p;
	return 0;
}

int kvq_req_evict(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Evict *q = req->evict;
	Kvq__EvictReply *rep = r->e.evict_reply;
	struct kvq_pools_rec *p = NULL;
	uint32_t want, n = 0;
	int ret;

	ret = admin_pool(c, q->pool, &p, err, errlen);
	if (ret < 0)
		return ret;
	if (q->demote && !p->tiering)
		return kvq_seterr(err, errlen, "pool %s has no host tier (host_capacity)", p->name), -EOPNOTSUPP;
	want = kvq_prefix_evictable(p->prefix, -1);
	if (q->blocks && q->blocks < want)
		want = q->blocks;
	if (q->demote)
		n = kvq_tiering_demote_count(p->tiering, want);
	else
		kvq_prefix_evict(p->prefix, want, NULL, &n);
	kvq_log(LOG_NOTICE, "pool %s: uid %u %s %u cached blocks", p->name, (unsigned)c->uid,
		q->demote ? "demoted" : "evicted", n);
	rep->evicted = n;
	return 0;
}

int kvq_req_pool_add(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__PoolAdd *q = req->pool_add;
	Kvq__PoolAddReply *rep = r->e.pool_add_reply;
	struct kvq_state *st = c->st;
	const Kvq__Attach *a = q->spec;
	struct kvq_pools_rec *p = NULL;
	struct kvq_codebooks cb = { 0 };
	struct kvq_figures_stats *ps = NULL;
	int ret;

	if (kvq_pools_find(&st->pools, a->pool))
		return kvq_seterr(err, errlen, "pool %s exists", a->pool), -EEXIST;
	if (a->layout_version != KVQ_LAYOUT_VERSION)
		return kvq_seterr(err, errlen, "layout version %u, this daemon has %u", a->layout_version,
				  KVQ_LAYOUT_VERSION), KVQ_ELAYOUT;
	ret = kvq_pools_from_attach(&st->pools, st->cfg, a, c->uid, &p, err, errlen);
	if (ret < 0)
		return ret;
	p->origin = KVQ_BOOKS_POOLADD;
	if (q->n_acl_uids || q->n_acl_gids) {
		p->acl.n_uids = p->acl.n_gids = 0;
		p->acl.uids[p->acl.n_uids++] = 0;
		for (size_t i = 0; i < q->n_acl_uids; i++)
			p->acl.uids[p->acl.n_uids++] = (uid_t)q->acl_uids[i];
		for (size_t i = 0; i < q->n_acl_gids; i++)
			p->acl.gids[p->acl.n_gids++] = (gid_t)q->acl_gids[i];
	}
	if (q->capacity)
		p->capacity = (struct kvq_config_amount){ .kind = KVQ_AMOUNT_BYTES, .bytes = q->capacity };
	ret = kvq_pools_codebooks(p, true, a, r->req_fd, &cb, err, errlen);
	if (ret < 0)
		goto fail;
	ps = calloc(1, sizeof(*ps));
	if (!ps) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = kvq_pools_allocate(&st->pools, st->cfg, p, a->create->n_sealed, a->create->n_open, a->create->n_sink, &cb,
				 err, errlen);
	if (ret < 0)
		goto fail;
	kvq_codebooks_close(&cb);
	kvq_pools_add(&st->pools, p);
	kvq_log(LOG_NOTICE, "pool %s added by uid %u", p->name, (unsigned)c->uid);
	kvq_figures_stats(p, ps);
	rep->pool = &ps->ps;
	r->mem[0] = ps;
	return 0;
fail:
	kvq_codebooks_close(&cb);
	free(ps);
	kvq_pools_rec_free(p);
	return ret;
}

int kvq_req_pool_drop(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__PoolDrop *q = req->pool_drop;
	struct kvq_state *st = c->st;
	struct kvq_pools_rec *p = NULL;
	int ret;

	ret = admin_pool(c, q->pool, &p, err, errlen);
	if (ret < 0)
		return ret;
	/* exiting clients count too: their GPU work may still touch the memory */
	if (p->clients)
		return kvq_seterr(err, errlen, "pool %s has %u clients attached", p->name, p->clients), -EBUSY;
	if (kvq_config_find_pool(st->cfg, p->name)) {
		/* a configured pool keeps its record: the next attach allocates it again */
		kvq_pools_release(p);
	} else {
		kvq_pools_remove(&st->pools, p);
	}
	kvq_log(LOG_NOTICE, "pool %s dropped by uid %u", q->pool, (unsigned)c->uid);
	return 0;
}
