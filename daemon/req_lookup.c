/* SPDX-License-Identifier: Apache-2.0 */
/* Lookup: the longest cached prefix of each prompt, with references taken;
 * in a pool with a host tier, the chain's continuation there promoted
 * first (daemon/tiering.h), the reply waiting for it; then, in a pool with
 * a remote tier, the continuation of what the pool and the host tier hit
 * fetched from the remote (daemon/rtier.h), the same reply waiting for it
 * within the same bound. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "request.h"
#include "seterr.h"
#include "tiering.h"
#include "wire_block.h"

/* One prompt of a Lookup: its own fields, or a LookupPrompt's (version 8);
 * its hit goes to ids[0..n), at most max_ids, each with one reference of
 * the pool's taken for the caller and none of the lease's yet. */
struct lookup_prompt {
	const uint32_t *tokens;
	uint32_t n_tokens, max_tokens;
	ProtobufCBinaryData salt, rid;
	uint32_t *ids, max_ids, n;
};

/* Drops the pool references prompts q[0..n) were granted. */
static void lookup_unref(struct kvq_pools_rec *p, const struct lookup_prompt *q, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (uint32_t k = 0; k < q[i].n; k++)
			kvq_pool_unref(p->pool, q[i].ids[k]);
}

/* In a group's member pool, prompt i of q's request id: of a length the
 * group takes and, among several prompts, none of the earlier ones'.
 * Checked before any prompt is looked up: a group's lookup cannot be taken
 * back. */
static bool lookup_rid_ok(const struct lookup_prompt *q, size_t i)
{
	if (q[i].rid.len < 1 || q[i].rid.len > KVQ_GROUP_MAX_REQUEST_ID)
		return false;
	for (size_t k = 0; k < i; k++)
		if (q[k].rid.len == q[i].rid.len && !memcmp(q[k].rid.data, q[i].rid.data, q[i].rid.len))
			return false;
	return true;
}

/* A Lookup's prompts in a new array (free it) of *ret_n, the most ids
 * their hits can have in *ret_ids; or NULL and *ret -E2BIG, -EINVAL (err
 * set) or -ENOMEM. */
static struct lookup_prompt *lookup_prompts(const struct kvq_pools_rec *p, const Kvq__Lookup *l, size_t *ret_n,
					    uint32_t *ret_ids, int *ret, char *err, size_t errlen)
{
	const size_t n = l->n_prompts ? l->n_prompts : 1;
	struct lookup_prompt *q = calloc(n, sizeof(*q));
	uint64_t ids = 0;

	*ret = -ENOMEM;
	if (!q)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		const Kvq__LookupPrompt *lp = l->n_prompts ? l->prompts[i] : NULL;

		if (lp)
			q[i] = (struct lookup_prompt){ .tokens = lp->tokens, .n_tokens = (uint32_t)lp->n_tokens,
				.max_tokens = lp->max_tokens, .salt = lp->salt, .rid = lp->request_id };
		else
			q[i] = (struct lookup_prompt){ .tokens = l->tokens, .n_tokens = (uint32_t)l->n_tokens,
				.max_tokens = l->max_tokens, .salt = l->salt, .rid = l->request_id };
		q[i].max_ids = q[i].max_tokens / p->L->block_tokens;
		if (q[i].max_ids > KVQ_PROTO_MAX_IDS)
			q[i].max_ids = KVQ_PROTO_MAX_IDS;
		ids += q[i].max_ids;
		if (p->glink.g && l->n_prompts && !lookup_rid_ok(q, i)) {
			*ret = -EINVAL;
			kvq_seterr(err, errlen, "pool %s is rank %u of group %s: lookup.prompts[%zu] needs a request_id "
				   "of 1 to %u bytes, not another prompt's", p->name, p->glink.rank, p->group, i,
				   KVQ_GROUP_MAX_REQUEST_ID);
			goto fail;
		}
	}
	if (ids > KVQ_PROTO_MAX_IDS) {
		*ret = -E2BIG;
		kvq_seterr(err, errlen, "lookup.prompts: up to %llu blocks (max_tokens / %u, summed), at most %u",
			   (unsigned long long)ids, p->L->block_tokens, KVQ_PROTO_MAX_IDS);
		goto fail;
	}
	*ret_n = n;
	*ret_ids = (uint32_t)ids;
	*ret = 0;
	return q;
fail:
	free(q);
	return NULL;
}

/* Prompt q's hit into q->ids[0..q->n), references taken in the pool: 0, 1
 * when a group member's hit waits in w for the group's fetch from the
 * remote (daemon/groups.h; w NULL: it may not), or a negative code with
 * err set. */
static int lookup_one(struct kvq_conn *c, struct lookup_prompt *q, struct kvq_group_waiter *w, char *err,
		      size_t errlen)
{
	struct kvq_pools_rec *p = c->pool;
	int ret;

	if (!p->glink.g) {
		ret = kvq_prefix_lookup(p->prefix, q->tokens, q->n_tokens, q->max_tokens, q->salt.data, q->salt.len,
					q->ids, q->max_ids, &q->n);
		return ret < 0 ? (kvq_seterr(err, errlen, "lookup failed: %s", strerror(-ret)), ret) : 0;
	}
	/* a group's member: the hit the request's first rank fixed */
	ret = kvq_group_lookup(p, q->rid.data, q->rid.len, q->tokens, q->n_tokens, q->max_tokens, q->salt.data,
			       q->salt.len, q->ids, q->max_ids, &q->n, c->active_ms,
			       c->st->cfg->group_lookup_timeout_ms, c->st->cfg->group_pending_lookups, w);
	if (ret == -EINVAL)
		return kvq_seterr(err, errlen, "pool %s is rank %u of group %s: a lookup needs a request_id of 1 to "
				  "%u bytes, its other ranks' and no more tokens", p->name, p->glink.rank, p->group,
				  KVQ_GROUP_MAX_REQUEST_ID), ret;
	if (ret < 0)
		return kvq_seterr(err, errlen, "group lookup failed: %s", ret == -EALREADY ?
				  "this rank looked the request up already" : ret == -EBUSY ?
				  "too many requests wait for ranks (group_pending_lookups)" : ret == -EAGAIN ?
				  "the group's fetch from the remote is still out" : strerror(-ret)), ret;
	return ret;
}

/* The hits of a Lookup of prompts (version 8) into rep->hits, from
 * hits[n] and ptrs[n] (the reply's from now on): each prompt's ids replaced
 * by its wire list (kvq_wire_blocks_put), refs the room for the longest. */
static void lookup_hits(struct kvq_reply *r, const struct kvq_pools_rec *p, struct lookup_prompt *q, size_t n,
			Kvq__LookupHit *hits, Kvq__LookupHit **ptrs, struct kvq_block_ref *refs)
{
	Kvq__LookupReply *rep = r->e.lookup_reply;

	for (size_t i = 0; i < n; i++) {
		kvq__lookup_hit__init(&hits[i]);
		for (uint32_t k = 0; k < q[i].n; k++)
			refs[k] = kvq_layout_block_ref(p->L, q[i].ids[k]);
		/* the chain, its sink block first (daemon/prefix.h) */
		kvq_wire_blocks_put(&hits[i].base, KVQ_WIRE_CHAIN, refs, q[i].n, q[i].ids);
		ptrs[i] = &hits[i];
	}
	rep->n_hits = n;
	rep->hits = ptrs;
	r->mem[1] = hits;
	r->mem[2] = ptrs;
}

/* What a Lookup holds between its handler and its reply: the prompts and
 * their ids, and, while it waits, its promotion (daemon/tiering.h).  The
 * promoted blocks land in got[] (UINT32_MAX: not in place), in the order
 * of the records: prompt by prompt, each chain from its pool hit on. */
struct lookup_state {
	struct kvq_wait wait;
	struct kvq_pools_rec *p;
	struct kvq_conn *c;               /* NULL once the reply went without the promotion */
	const Kvq__Lookup *l;             /* the request's (alive until its reply is freed) */
	struct lookup_prompt *q;
	size_t n;
	uint32_t *ids, max_ids;
	uint32_t *extra;                  /* per prompt: its records in the promotion */
	/* what publishing them needs, copied: the reply (and the request it
	 * points into) may go before the promotion comes back */
	/* per prompt: its hit's last block's key, found again at publish (the
	 * reply may have released that block, and its slot cached another) */
	uint8_t (*parent)[KVQ_PREFIX_KEY_LEN];
	bool *has_parent;                 /* per prompt: a hit, hence a parent */
	uint32_t *tok;                    /* the promoted blocks' tokens, in record order */
	uint8_t (*salt)[KVQ_PREFIX_MAX_SALT];
	size_t *salt_len;
	struct kvq_promotion *pr;         /* NULL once it came back */
	uint32_t *got;
	/* the remote fetch, per prompt its first get and how many */
	struct kvq_rtier_fetch *rf;
	uint32_t *rfirst, *rcount;
	bool detached;                    /* the reply went (or the connection): nothing waits for it */
	/* a group member's prompts whose hit waits for the group's fetch (per
	 * prompt; on NULL: not, or no more), how many still wait */
	struct kvq_group_waiter *gw;
	uint32_t gwaits;
};

static void state_free(struct lookup_state *s)
{
	if (!s)
		return;
	free(s->q);
	free(s->ids);
	free(s->extra);
	free(s->parent);
	free(s->has_parent);
	free(s->tok);
	free(s->salt);
	free(s->salt_len);
	free(s->got);
	kvq_rtier_fetch_end(s->rf);
	free(s->rfirst);
	free(s->rcount);
	for (size_t i = 0; s->gw && i < s->n; i++)
		kvq_group_unwait(&s->gw[i], false);
	free(s->gw);
	free(s);
}

/* The reply of s (its hits in s->q, references taken in the pool): quota,
 * lease and the wire lists.  On error every reference is dropped. */
static int lookup_reply(struct kvq_conn *c, const Kvq__Lookup *l, struct lookup_state *s, struct kvq_reply *r,
			char *err, size_t errlen)
{
	struct kvq_pools_rec *p = c->pool;
	struct lookup_prompt *q = s->q;
	struct kvq_block_ref *refs = calloc((size_t)s->max_ids + 1, sizeof(*refs));
	Kvq__LookupHit *hits = NULL, **ptrs = NULL;
	kvq_lease *seen = NULL;     /* every id once, for the quota's count */
	uint64_t fresh = 0;
	int ret = -ENOMEM;

	if (l->n_prompts) {
		hits = calloc(s->n, sizeof(*hits));
		ptrs = calloc(s->n, sizeof(*ptrs));
	}
	if (!refs || (l->n_prompts && (!hits || !ptrs)) || kvq_lease_new(&seen) < 0 ||
	    kvq_lease_reserve(c->lease, s->max_ids, 0) < 0 || kvq_lease_reserve(seen, s->max_ids, 0) < 0)
		goto out;
	for (size_t i = 0; i < s->n; i++)
		for (uint32_t k = 0; k < q[i].n; k++)
			if (kvq_lease_sealed_add(seen, q[i].ids[k], 1) == 1 && !kvq_lease_sealed(c->lease, q[i].ids[k]))
				fresh += kvq_layout_block_bytes(p->L, kvq_layout_block_ref(p->L, q[i].ids[k]).cls);
	if (!kvq_state_quota_allows(c->st, p, c->uid, fresh)) {
		ret = -EDQUOT;
		kvq_seterr(err, errlen, "uid %u would exceed its quota in pool %s", (unsigned)c->uid, p->name);
		goto out;
	}
	for (size_t i = 0; i < s->n; i++) {
		for (uint32_t k = 0; k < q[i].n; k++)
			kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, q[i].ids[k], 1);
		p->lookup_tokens += q[i].max_tokens;
		p->hit_tokens += (uint64_t)q[i].n * p->L->block_tokens;
	}
	if (l->n_prompts) {
		lookup_hits(r, p, q, s->n, hits, ptrs, refs);
		hits = NULL;
		ptrs = NULL;
	} else {
		/* the chain, its sink block first (daemon/prefix.h), into ids */
		for (uint32_t k = 0; k < q[0].n; k++)
			refs[k] = kvq_layout_block_ref(p->L, s->ids[k]);
		kvq_wire_blocks_put(&r->e.lookup_reply->base, KVQ_WIRE_CHAIN, refs, q[0].n, s->ids);
	}
	r->mem[0] = s->ids;
	s->ids = NULL;
	ret = 0;
out:
	if (ret < 0)
		lookup_unref(p, q, s->n);
	kvq_lease_free(seen);
	free(hits);
	free(ptrs);
	free(refs);
	return ret;
}

/* ------------------------------------------------------------ promotion */

/* The records of p's host tier that continue prompt q's chain after its
 * hit, at most room, into rec[]: how many. */
static uint32_t tier_chain(struct kvq_pools_rec *p, const struct lookup_prompt *q, uint32_t *rec, uint32_t room)
{
	const uint32_t B = p->L->block_tokens;
	uint8_t key[KVQ_PREFIX_KEY_LEN], parent[KVQ_PREFIX_KEY_LEN];
	uint32_t n = 0, at = q->n;
	bool has_parent = q->n > 0;

	if (has_parent && kvq_prefix_block_key(p->prefix, q->ids[q->n - 1], parent) < 0)
		return 0;
	while (n < room && at < q->max_ids && (uint64_t)(at + 1) * B <= q->n_tokens &&
	       (uint64_t)(at + 1) * B <= q->max_tokens) {
		int64_t r;

		if (kvq_prefix_chain_key(p->prefix, has_parent ? parent : NULL, q->tokens + (size_t)at * B,
					 q->salt.data, q->salt.len, key) < 0)
			break;
		r = kvq_tiering_find(p->tiering, key);
		if (r < 0)
			break;
		rec[n++] = (uint32_t)r;
		memcpy(parent, key, sizeof key);
		has_parent = true;
		at++;
	}
	return n;
}

/* Publishes the promoted blocks of s once they are in place, each after its
 * chain's last block: got[] the blocks as cached (another's copy where one
 * was published meanwhile, its reference taken and the slot's dropped). */
static void promoted_publish(struct lookup_state *s, bool *consumed)
{
	struct kvq_pools_rec *p = s->p;
	const uint32_t B = p->L->block_tokens;
	uint32_t k = 0;

	for (size_t i = 0; i < s->n; i++) {
		int64_t parent = s->has_parent[i] ? kvq_prefix_find(p->prefix, s->parent[i]) : -1;
		bool ok = s->pr->result == 0 && (!s->has_parent[i] || parent >= 0);

		for (uint32_t e = 0; e < s->extra[i]; e++, k++) {
			uint32_t slot = s->pr->id[k], got = UINT32_MAX;

			if (ok && kvq_prefix_publish(p->prefix, slot, (int32_t)parent, s->tok + (size_t)k * B, s->salt[i],
						     s->salt_len[i], &got) == 0 &&
			    (got == slot || kvq_pool_ref(p->pool, got) == 0)) {
				consumed[k] = true;
			} else {
				got = UINT32_MAX;
				ok = false;
			}
			if (got != slot)
				kvq_pool_unref(p->pool, slot);
			s->got[k] = got;
			parent = got;
		}
	}
}

static void promoted_append(struct lookup_state *s);
static int remote_fetch(struct kvq_conn *c, struct lookup_state *s);

/* The promotion came back (on the loop). */
static void promoted(struct kvq_promotion *pr, void *arg)
{
	struct lookup_state *s = arg;
	bool *consumed = calloc((size_t)pr->n + 1, sizeof(*consumed));
	uint32_t n = pr->n;

	if (consumed)
		promoted_publish(s, consumed);
	else
		for (uint32_t k = 0; k < n; k++)
			kvq_pool_unref(s->p->pool, pr->id[k]);
	kvq_promotion_end(pr, consumed);
	free(consumed);
	s->pr = NULL;
	if (s->detached) {
		/* nobody waits: the blocks stay as cached ones, unreferenced */
		for (uint32_t k = 0; k < n; k++)
			if (s->got[k] != UINT32_MAX)
				kvq_pool_unref(s->p->pool, s->got[k]);
		state_free(s);
		return;
	}
	/* the hits now end where the tier's chains ended; the remote may
	 * continue them, within the same bound (the reply waits for it) */
	promoted_append(s);
	if (s->c && s->p->rtier && !s->p->glink.g && remote_fetch(s->c, s))
		return;
	s->wait.ready = true;
	if (s->c && s->c->resume)
		s->c->resume(s->c);
}

/* The promoted blocks after each prompt's hit, up to the first missing;
 * once (each prompt's count of them is cleared). */
static void promoted_append(struct lookup_state *s)
{
	uint32_t k = 0;

	for (size_t i = 0; s->extra && i < s->n; i++) {
		bool whole = true;

		for (uint32_t e = 0; e < s->extra[i]; e++, k++) {
			if (whole && s->got[k] != UINT32_MAX) {
				s->q[i].ids[s->q[i].n++] = s->got[k];
				kvq_tiering_count_hit(s->p->tiering, s->p->L->block_tokens);
			} else {
				whole = false;
				if (s->got[k] != UINT32_MAX)
					kvq_pool_unref(s->p->pool, s->got[k]);
			}
		}
		s->extra[i] = 0;
	}
}

/* ---------------------------------------------------------------- remote */

static int lookup_finish(struct kvq_wait *w, struct kvq_conn *c, struct kvq_reply *r, bool timed_out, char *err,
			 size_t errlen);

/* Publishes prompt i's fetched blocks (unpacked by the fetch into slots
 * of their own), in chain order from its hit, up to the first that did not
 * come or does not publish, each after the one before; their references
 * become the caller's, the others stay the fetch's (it drops them). */
static void remote_place_one(struct lookup_state *s, size_t i, struct kvq_rtier_get *g)
{
	struct kvq_pools_rec *p = s->p;
	struct lookup_prompt *q = &s->q[i];
	const uint32_t B = p->L->block_tokens;
	int32_t parent = q->n ? (int32_t)q->ids[q->n - 1] : -1;

	for (uint32_t e = 0; e < s->rcount[i] && g[e].slot != UINT32_MAX; e++) {
		uint32_t got;

		if (kvq_rtier_place(p->rtier, &g[e], parent, q->tokens + (size_t)q->n * B, q->salt.data, q->salt.len,
				    &got) < 0)
			return;
		q->ids[q->n++] = got;
		parent = (int32_t)got;
	}
}

static void remote_place(struct lookup_state *s)
{
	struct kvq_rtier_get *g = kvq_rtier_fetch_gets(s->rf);

	for (size_t i = 0; i < s->n; i++)
		remote_place_one(s, i, g + s->rfirst[i]);
}

/* Every get came back (on the loop). */
static void remote_fetched(void *arg)
{
	struct lookup_state *s = arg;

	s->wait.ready = true;
	if (s->c && s->c->resume)
		s->c->resume(s->c);
}

/* A prompt's group fetch fixed its hit (daemon/groups.h). */
static void group_woken(struct kvq_group_waiter *w)
{
	struct lookup_state *s = w->arg;

	if (--s->gwaits || s->detached)
		return;
	s->wait.ready = true;
	if (s->c && s->c->resume)
		s->c->resume(s->c);
}

/* The reply of a group member's Lookup whose prompts waited for the
 * group's fetch: each such prompt looked up again (it claims the hit the
 * fetch fixed; past the bound the fetch ends first with what came). */
static int group_finish(struct lookup_state *s, struct kvq_conn *c, struct kvq_reply *r, char *err, size_t errlen)
{
	int ret = 0;

	s->detached = true;
	for (size_t i = 0; i < s->n; i++)
		kvq_group_unwait(&s->gw[i], c != NULL);
	for (size_t i = 0; c && ret == 0 && i < s->n; i++)
		if (s->gw[i].wake && (ret = lookup_one(c, &s->q[i], NULL, err, errlen)) > 0)
			ret = -EAGAIN;
	if (c && ret == 0)
		ret = lookup_reply(c, s->l, s, r, err, errlen);
	else
		lookup_unref(s->p, s->q, s->n);
	state_free(s);
	return ret;
}

/* The remote keys of each prompt's blocks (its hit's learnt on the way)
 * and a fetch of those after its hit, at most KVQ_RTIER_FETCH_MAX in all: 1
 * when s now waits for it, 0 when there is nothing to fetch. */
static int remote_fetch(struct kvq_conn *c, struct lookup_state *s)
{
	struct kvq_pools_rec *p = c->pool;
	const uint32_t B = p->L->block_tokens;
	struct kvq_rtier_get *g = calloc(KVQ_RTIER_FETCH_MAX + 1, sizeof *g);
	uint8_t parent[KVQ_CHAINKEY_LEN];
	uint32_t total = 0;
	int r;

	s->rfirst = calloc(s->n, sizeof *s->rfirst);
	s->rcount = calloc(s->n, sizeof *s->rcount);
	if (!g || !s->rfirst || !s->rcount) {
		free(g);
		return 0;
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct lookup_prompt *q = &s->q[i];
		uint32_t end = q->max_ids;

		end = q->n_tokens / B < end ? q->n_tokens / B : end;
		end = q->max_tokens / B < end ? q->max_tokens / B : end;
		s->rfirst[i] = total;
		if (q->n >= end || q->salt.len > KVQ_CHAINKEY_MAX_SALT)
			continue;
		for (uint32_t k = 0; k < end && total < KVQ_RTIER_FETCH_MAX; k++) {
			uint8_t key[KVQ_CHAINKEY_LEN];

			if (kvq_rtier_chain(p->rtier, k ? parent : NULL, q->tokens + (size_t)k * B, q->salt.data,
					    q->salt.len, key) < 0)
				break;
			if (k < q->n) {
				kvq_rtier_learn(p->rtier, q->ids[k], key);
			} else {
				/* a chain's first block takes a sink slot (daemon/prefix.h) */
				g[total].sink = k == 0 && p->L->n_sink;
				memcpy(g[total++].chain, key, sizeof key);
			}
			memcpy(parent, key, sizeof key);
		}
		s->rcount[i] = total - s->rfirst[i];
	}
	r = total ? kvq_rtier_fetch(p->rtier, g, total, remote_fetched, s, &s->rf) : -ENOENT;
	free(g);
	if (r == 1) {
		kvq_rtier_fetch_end(s->rf);
		s->rf = NULL;
	}
	if (r != 0)
		return 0;
	s->c = c;
	s->wait.finish = lookup_finish;
	return 1;
}

static int lookup_finish(struct kvq_wait *w, struct kvq_conn *c, struct kvq_reply *r, bool timed_out, char *err,
			 size_t errlen)
{
	struct lookup_state *s = (struct lookup_state *)w;
	int ret = 0;

	if (s->gw)
		return group_finish(s, c, r, err, errlen);
	if (s->rf) {
		/* what came is a hit, the rest a miss (timed_out: may be all) */
		if (c)
			remote_place(s);
		ret = c ? lookup_reply(c, s->l, s, r, err, errlen) : (lookup_unref(s->p, s->q, s->n), 0);
		state_free(s);
		return ret;
	}
	if (s->pr) {
		/* the copies go on without the reply: promoted() ends them */
		s->detached = true;
		s->c = NULL;
		if (c)
			ret = lookup_reply(c, s->l, s, r, err, errlen);
		else
			lookup_unref(s->p, s->q, s->n);
		/* the state stays the promotion's; only its prompts go with the reply */
		return ret;
	}
	(void)timed_out;
	promoted_append(s);
	if (c)
		ret = lookup_reply(c, s->l, s, r, err, errlen);
	else
		lookup_unref(s->p, s->q, s->n);
	state_free(s);
	return ret;
}

/* Promotes the tier's continuation of every prompt's chain: 1 when s now
 * waits for it, 0 when there is none (or no room for it: the hits stand). */
static int promote(struct kvq_conn *c, struct lookup_state *s)
{
	struct kvq_pools_rec *p = c->pool;
	uint32_t total = 0, *rec;
	int ret;

	const uint32_t B = p->L->block_tokens;

	s->extra = calloc(s->n, sizeof(*s->extra));
	s->parent = calloc(s->n, sizeof(*s->parent));
	s->has_parent = calloc(s->n, sizeof(*s->has_parent));
	s->salt = calloc(s->n, sizeof(*s->salt));
	s->salt_len = calloc(s->n, sizeof(*s->salt_len));
	rec = calloc((size_t)s->max_ids + 1, sizeof(*rec));
	if (!s->extra || !s->parent || !s->has_parent || !s->salt || !s->salt_len || !rec) {
		free(rec);
		return 0;
	}
	for (size_t i = 0; i < s->n; i++) {
		const struct lookup_prompt *q = &s->q[i];

		s->extra[i] = q->salt.len <= KVQ_PREFIX_MAX_SALT ? tier_chain(p, q, rec + total, q->max_ids - q->n) : 0;
		s->has_parent[i] = q->n && kvq_prefix_block_key(p->prefix, q->ids[q->n - 1], s->parent[i]) == 0;
		/* never published as a root what follows a hit */
		if (q->n && !s->has_parent[i])
			s->extra[i] = 0;
		s->salt_len[i] = s->extra[i] ? q->salt.len : 0;
		if (s->salt_len[i])
			memcpy(s->salt[i], q->salt.data, q->salt.len);
		total += s->extra[i];
	}
	s->got = calloc((size_t)total + 1, sizeof(*s->got));
	s->tok = calloc((size_t)total * B + 1, sizeof(*s->tok));
	if (total && s->got && s->tok)
		for (size_t i = 0, k = 0; i < s->n; k += s->extra[i++])
			memcpy(s->tok + k * B, s->q[i].tokens + (size_t)s->q[i].n * B, (size_t)s->extra[i] * B * 4);
	ret = total && s->got && s->tok ? kvq_tiering_promote(p->tiering, rec, total, promoted, s, &s->pr) : -ENOSPC;
	free(rec);
	if (ret < 0)
		return 0;
	s->c = c;
	s->wait.finish = lookup_finish;
	return 1;
}

int kvq_req_lookup(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Lookup *l = req->lookup;
	struct kvq_pools_rec *p = c->pool;
	struct lookup_state *s = calloc(1, sizeof(*s));
	size_t done = 0;
	int ret = -ENOMEM;

	if (!s)
		return ret;
	s->p = p;
	s->l = l;
	s->q = lookup_prompts(p, l, &s->n, &s->max_ids, &ret, err, errlen);
	if (!s->q)
		goto out;
	ret = -ENOMEM;
	s->ids = calloc((size_t)s->max_ids + 1, sizeof(*s->ids));
	if (!s->ids)
		goto out;
	if (p->glink.g && p->rtier && !(s->gw = calloc(s->n, sizeof(*s->gw))))
		goto out;
	/* all or nothing: a prompt that fails drops what the earlier ones got */
	for (uint32_t *at = s->ids; done < s->n; at += s->q[done++].max_ids) {
		struct kvq_group_waiter *gw = s->gw ? &s->gw[done] : NULL;

		s->q[done].ids = at;
		if (gw)
			*gw = (struct kvq_group_waiter){ .wake = group_woken, .arg = s };
		ret = lookup_one(c, &s->q[done], gw, err, errlen);
		if (ret < 0)
			goto out;
		if (ret == 0 && gw)
			gw->wake = NULL;   /* its hit is in: no second lookup */
		s->gwaits += ret;
	}
	/* a group member's hits that wait for the group's fetch from the remote */
	if (s->gwaits) {
		s->c = c;
		s->wait.finish = lookup_finish;
		r->wait = &s->wait;
		return 0;
	}
	free(s->gw);
	s->gw = NULL;
	/* a group's members promote together or not at all: not yet */
	if (p->tiering && !p->glink.g && promote(c, s)) {
		r->wait = &s->wait;
		return 0;
	}
	/* a group's members fetch together: kvq_group_lookup */
	if (p->rtier && !p->glink.g && remote_fetch(c, s)) {
		r->wait = &s->wait;
		return 0;
	}
	ret = lookup_reply(c, l, s, r, err, errlen);
	done = 0;
out:
	/* the references granted, not yet any lease's */
	lookup_unref(p, s->q, done);
	state_free(s);
	return ret;
}
