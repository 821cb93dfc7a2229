/* SPDX-License-Identifier: Apache-2.0 */
/* Requests of a connection about itself and what it sees: Hello, Attach
 * (joining a pool, or creating one), Stats. */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "figures.h"
#include "groups.h"
#include "kvq_wire.h"
#include "log.h"
#include "request.h"
#include "seterr.h"

static const char daemon_version[] = PACKAGE_VERSION;

int kvq_req_hello(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Hello *h = req->hello;
	Kvq__HelloReply *rep = r->e.hello_reply;

	rep->daemon_version = (char *)daemon_version;
	rep->protocol_version = KVQ_PROTOCOL_VERSION;
	rep->client_id = c->id;
	if (h->protocol_version != KVQ_PROTOCOL_VERSION) {
		kvq_seterr(err, errlen, "protocol version %u, this daemon speaks %u", h->protocol_version,
			   KVQ_PROTOCOL_VERSION);
		r->close_after = true;
		r->refusal_body = true;   /* the daemon's version */
		return -EPROTONOSUPPORT;
	}
	c->hello = true;
	snprintf(c->name, sizeof(c->name), "%s", h->client_name);
	kvq_log(LOG_INFO, "client %llu: hello from %s (pid %d, uid %u)", (unsigned long long)c->id, c->name,
		(int)c->pid, (unsigned)c->uid);
	return 0;
}

/* Layers past n_layers are not part of a policy (the parser leaves them be). */
int kvq_req_attach(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Attach *const orig = req->attach, *a = orig;
	Kvq__AttachReply *rep = r->e.attach_reply;
	struct kvq_state *st = c->st;
	struct kvq_pools_rec *p = kvq_pools_find(&st->pools, a->pool);
	struct kvq_codebooks cb = { 0 };
	struct kvq_policy pol;
	Kvq__Attach member;
	bool created = false, named = false;
	int ret;

	if (c->pool)
		return kvq_seterr(err, errlen, "already attached to pool %s", c->pool->name), -EISCONN;
	if (a->group[0]) {
		/* a rank of a tensor-parallel group: its member pool has its shard
		 * of the model's heads, and is compared and created as such */
		uint32_t heads, window;

		ret = kvq_group_check(&st->pools, a, p && kvq_conn_acl_ok(c, &p->acl) ? p : NULL, &heads, &window,
				      err, errlen);
		if (ret < 0)
			return ret;
		member = *a;
		member.kv_heads = heads;
		member.window = window;
		a = &member;
	} else if (p && p->group[0] && kvq_conn_acl_ok(c, &p->acl)) {
		return kvq_seterr(err, errlen, "pool %s is rank %u of group %s: attach with the group", p->name,
				  p->glink.rank, p->group),
		       KVQ_ELAYOUT;
	}
	/* a pool the caller's ACL does not admit is answered as a missing one
	 * (kvq.proto, "Hidden pools") */
	if (!p || !kvq_conn_acl_ok(c, &p->acl)) {
		if (!a->create)
			return kvq_seterr(err, errlen, "no pool %s", a->pool), -ENOENT;
		if (!st->cfg->create_on_attach || !kvq_conn_acl_ok(c, &st->cfg->create_acl))
			return kvq_seterr(err, errlen, "may not create pool %s", a->pool), -EACCES;
		if (p)
			return kvq_seterr(err, errlen, "pool name %s is taken", a->pool), -EEXIST;
		ret = kvq_pools_from_attach(&st->pools, st->cfg, a, c->uid, &p, err, errlen);
		if (ret < 0)
			return ret;
		snprintf(p->group, sizeof(p->group), "%s", a->group);
		p->glink.rank = a->rank;
		created = true;
	} else {
		if (a->layout_version != KVQ_LAYOUT_VERSION || a->layers != p->params.layers ||
		    a->kv_heads != p->params.kv_heads || a->head_dim != p->params.head_dim ||
		    a->block_tokens != p->params.block_tokens || (int)a->act != p->params.act ||
		    strcmp(a->model_id, p->model) ||
		    (a->window && a->window != (p->L ? p->L->window : p->params.window)))
			return kvq_seterr(err, errlen, "pool %s is model %s, layout v%u, %ux%ux%u, %u tokens/block",
					  p->name, p->model, KVQ_LAYOUT_VERSION, p->params.layers,
					  p->params.kv_heads, p->params.head_dim, p->params.block_tokens),
			       KVQ_ELAYOUT;
		if (kvq_policy_parse(a->policy, a->layers, &pol, err, errlen) < 0)
			return KVQ_EPOLICY;
		if (!kvq_policy_equal(&pol, &p->policy))
			return kvq_seterr(err, errlen, "pool %s has policy %s", p->name, p->policy_str), KVQ_ELAYOUT;
		/* no wildcard: a client that does not know sinks must not write here */
		if (a->sink_blocks != p->params.sink_blocks)
			return kvq_seterr(err, errlen, "pool %s has sink_blocks %u", p->name, p->params.sink_blocks),
			       KVQ_ELAYOUT;
	}
	if (created && a->layout_version != KVQ_LAYOUT_VERSION) {
		kvq_seterr(err, errlen, "layout version %u, this daemon has %u", a->layout_version, KVQ_LAYOUT_VERSION);
		ret = KVQ_ELAYOUT;
		goto fail;
	}
	/* a configured pool allocated at its first attach: a group's member if
	 * that attach names one (kvq_group_check let it), its keys in the
	 * group's namespace from the start */
	if (!created && !p->allocated && a->group[0] && !p->group[0]) {
		snprintf(p->group, sizeof(p->group), "%s", a->group);
		p->glink.rank = a->rank;
		named = true;
	}
	/* checked (and, joining, compared) before any memory is allocated */
	ret = kvq_pools_codebooks(p, created, a, r->req_fd, &cb, err, errlen);
	if (ret < 0)
		goto fail;
	if (!p->allocated) {
		ret = kvq_pools_allocate(&st->pools, st->cfg, p, created ? a->create->n_sealed : 0,
					 created ? a->create->n_open : 0, created ? a->create->n_sink : 0,
					 created ? &cb : NULL, err, errlen);
		if (ret < 0) {
			kvq_log(LOG_WARNING, "pool %s: not created: %s", p->name, err);
			goto fail;
		}
	}
	kvq_codebooks_close(&cb);
	if (orig->group[0] && (ret = kvq_group_join(&st->pools, orig, p)) < 0)
		goto fail;
	ret = kvq_lease_new(&c->lease);
	if (ret < 0)
		goto fail;
	kvq_lease_set_first_sink(c->lease, kvq_layout_block_first(p->L, KVQ_BLOCK_SINK));
	if (created)
		kvq_pools_add(&st->pools, p);
	c->pool = p;
	p->clients++;
	c->holder = kvq_pools_random_id();
	c->kept = kvq_pools_attached(p, c->pid, c->pidfd, c->holder);
	/* its holds name it in the pool's books, so a restart holds them for it */
	kvq_lease_set_tag(c->lease, c->kept >= 0 ? (uint16_t)(c->kept + 1) : 0);

	rep->layout_version = p->L->version;
	rep->layers = p->L->layers;
	rep->kv_heads = p->L->kv_heads;
	rep->head_dim = p->L->head_dim;
	rep->block_tokens = p->L->block_tokens;
	rep->window = p->L->window;
	rep->act = (Kvq__DType)p->L->act;
	rep->n_sealed = p->L->n_sealed;
	rep->n_open = p->L->n_open;
	rep->sink_blocks = p->L->sink_blocks;
	rep->n_sink = p->L->n_sink;
	rep->policy = p->policy_str;
	rep->total_bytes = p->L->total_bytes;
	rep->map_bytes = p->mem.size;
	rep->backend = (char *)p->backend->name;
	rep->device = p->backend == &kvq_backend_host ? -1 : p->device;
	rep->model_id = p->model;
	rep->attention_report_ms = p->attention_report_ms;
	if (p->has_codebooks) {
		rep->codebooks_sha256.data = p->codebooks_sha256;
		rep->codebooks_sha256.len = KVQ_PROTO_SHA256;
	}
	rep->holder = c->holder;
	rep->memory_id = p->memory_id;
	/* the peer's pid, never the client's word: only its own process
	 * releases what a restart held for a connection of it */
	if (a->replaces && (rep->released = kvq_pools_replaced(p, c->pid, a->replaces)))
		kvq_log(LOG_INFO, "client %llu: replaces a connection of pid %d from before the restart: "
			"%llu slots released", (unsigned long long)c->id, (int)c->pid,
			(unsigned long long)rep->released);
	c->timing_ms = c->active_ms;
	r->fd = p->mem.fd;
	kvq_log(LOG_INFO, "client %llu: attached to pool %s", (unsigned long long)c->id, p->name);
	return 0;
fail:
	kvq_codebooks_close(&cb);
	if (named && !p->allocated)
		p->group[0] = '\0';
	if (created)
		kvq_pools_rec_free(p);
	return ret;
}

static void fill_client_stats(const struct kvq_conn *c, bool exiting, Kvq__ClientStats *o)
{
	kvq__client_stats__init(o);
	o->id = c->id;
	o->name = (char *)c->name;
	o->pid = (uint32_t)c->pid;
	o->uid = (uint32_t)c->uid;
	o->pool = (char *)(c->pool ? c->pool->name : "");
	o->exiting = exiting;
	if (c->pool && c->lease) {
		o->sealed_blocks = kvq_lease_n_sealed(c->lease) - kvq_lease_n_sink(c->lease);
		o->sink_blocks = kvq_lease_n_sink(c->lease);
		o->open_blocks = kvq_lease_n_open(c->lease);
		o->bytes = kvq_state_lease_bytes(c->pool, c->lease);
	}
}

int kvq_req_stats(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Stats *q = req->stats;
	Kvq__StatsReply *rep = r->e.stats_reply;
	struct kvq_state *s = c->st;
	const struct kvq_conn *lists[2] = { s->conns, s->dying };
	size_t n = 0, k = 0, nc = 0, kc = 0;
	struct kvq_figures_stats *st;
	Kvq__PoolStats **pst;
	Kvq__ClientStats *cs, **pcs;
	struct timespec now;

	for (struct kvq_pools_rec *p = s->pools.head; p; p = p->next)
		n++;
	if (q->pool[0]) {
		struct kvq_pools_rec *p = kvq_pools_find(&s->pools, q->pool);

		/* hidden or missing: one answer (kvq.proto, "Hidden pools") */
		if (!p || !kvq_conn_sees(c, p))
			return kvq_seterr(err, errlen, "no pool %s", q->pool), -ENOENT;
	}
	nc = s->n_conns;
	st = calloc(n + 1, sizeof(*st));
	pst = calloc(n + 1, sizeof(*pst));
	cs = calloc(nc + 1, sizeof(*cs));
	pcs = calloc(nc + 1, sizeof(*pcs));
	if (!st || !pst || !cs || !pcs) {
		free(st);
		free(pst);
		free(cs);
		free(pcs);
		return -ENOMEM;
	}
	for (struct kvq_pools_rec *p = s->pools.head; p; p = p->next) {
		if (!kvq_conn_sees(c, p) || (q->pool[0] && strcmp(q->pool, p->name)))
			continue;
		kvq_figures_stats(p, &st[k]);
		pst[k] = &st[k].ps;
		k++;
	}
	/* clients of the pools listed, and the caller itself: who else is
	 * connected to a pool the caller cannot see is none of its business */
	for (int l = 0; l < 2; l++)
		for (const struct kvq_conn *o = lists[l]; o && kc < nc && kc < KVQ_PROTO_MAX_CLIENTS; o = o->next) {
			if (o != c && !(o->pool && kvq_conn_sees(c, o->pool) &&
					(!q->pool[0] || !strcmp(q->pool, o->pool->name))))
				continue;
			fill_client_stats(o, l == 1, &cs[kc]);
			pcs[kc] = &cs[kc];
			kc++;
		}
	clock_gettime(CLOCK_MONOTONIC, &now);
	rep->daemon_version = (char *)daemon_version;
	rep->uptime_ms = (uint64_t)(now.tv_sec - s->started.tv_sec) * 1000 +
			 (uint64_t)((now.tv_nsec - s->started.tv_nsec) / 1000000);
	rep->backend = (char *)s->pools.backend->name;
	rep->device = s->pools.backend == &kvq_backend_host ? -1 : s->pools.device;
	rep->n_pools = k;
	rep->pools = pst;
	rep->n_clients = kc;
	rep->clients = pcs;
	r->mem[0] = st;
	r->mem[1] = pst;
	r->mem[2] = cs;
	r->mem[3] = pcs;
	return 0;
}
