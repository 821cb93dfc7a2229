/* SPDX-License-Identifier: Apache-2.0 */
/* Tensor-parallel groups: membership, group lookups, eviction by group
 * (groups.h). */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group_fetch.h"
#include "groups.h"
#include "kvq_wire.h"
#include "log.h"
#include "seterr.h"
#include "rtier.h"
#include "tiering.h"

/* A lookup whose references wait for the ranks that have not asked yet;
 * or, while fetch is set, whose hit waits for the remote (no references
 * yet, the ranks that asked in waiters). */
struct pending {
	struct pending *next;
	struct kvq_group *g;
	uint8_t rid[KVQ_GROUP_MAX_REQUEST_ID];
	size_t rid_len;
	uint32_t n;              /* blocks, the same for every rank */
	uint64_t claimed;        /* ranks that took theirs */
	int64_t expires_ms;
	uint32_t *ids;           /* [rank][n] */
	/* the fetch, and what fixing the hit after it needs */
	struct kvq_group_fetch *fetch;
	struct kvq_group_waiter *waiters;
	uint32_t *tok, n_tokens, max_tokens, max_ids;
	uint8_t salt[KVQ_PREFIX_MAX_SALT];
	size_t salt_len;
	uint64_t timeout_ms;
};

struct kvq_group {
	struct kvq_group *next;
	char name[KVQ_PROTO_MAX_NAME + 1];
	char model[KVQ_PROTO_MAX_MODEL_ID + 1];
	struct kvq_policy policy;
	uint32_t world, layers, kv_heads, head_dim, block_tokens, act, sink_blocks;
	uint32_t window;          /* R of every member pool (the first's) */
	struct kvq_pools_rec *member[KVQ_GROUP_MAX_RANKS];
	uint32_t n_members;
	struct pending *pending;
	uint32_t n_pending;
	bool evicting;           /* in the evict hook: its own evictions are not passed on */
};

uint32_t kvq_group_shard_heads(uint32_t kv_heads, uint32_t world, char *err, size_t errlen)
{
	if (world < 2 || world > KVQ_GROUP_MAX_RANKS || kv_heads == 0)
		return kvq_seterr(err, errlen, "world_size %u: a group has 2 to %u ranks", world, KVQ_GROUP_MAX_RANKS),
		       0;
	if (world <= kv_heads && kv_heads % world == 0)
		return kv_heads / world;
	if (world > kv_heads && world % kv_heads == 0)
		return 1;
	kvq_seterr(err, errlen, "%u KV heads do not split over %u ranks (%u must divide the heads, or the heads %u)",
		   kv_heads, world, world, world);
	return 0;
}

static struct kvq_group *group_find(const struct kvq_pools *ps, const char *name)
{
	for (struct kvq_group *g = ps->groups; g; g = g->next)
		if (!strcmp(g->name, name))
			return g;
	return NULL;
}

int kvq_group_check(const struct kvq_pools *ps, const Kvq__Attach *a, const struct kvq_pools_rec *p,
		    uint32_t *ret_heads, uint32_t *ret_window, char *err, size_t errlen)
{
	const struct kvq_group *g = group_find(ps, a->group);
	struct kvq_policy pol;
	uint32_t heads;

	if (strlen(a->group) > KVQ_PROTO_MAX_NAME)
		return kvq_seterr(err, errlen, "group name longer than %u bytes", KVQ_PROTO_MAX_NAME), -EINVAL;
	if (!(heads = kvq_group_shard_heads(a->kv_heads, a->world_size, err, errlen)))
		return -EINVAL;
	if (a->rank >= a->world_size)
		return kvq_seterr(err, errlen, "rank %u of %u ranks", a->rank, a->world_size), -EINVAL;
	if (kvq_policy_parse(a->policy, a->layers, &pol, err, errlen) < 0)
		return KVQ_EPOLICY;
	if (g && (g->world != a->world_size || strcmp(g->model, a->model_id) || g->layers != a->layers ||
		  g->kv_heads != a->kv_heads || g->head_dim != a->head_dim || g->block_tokens != a->block_tokens ||
		  g->act != (uint32_t)a->act || !kvq_policy_equal(&g->policy, &pol) || g->sink_blocks != a->sink_blocks ||
		  (a->window && a->window != g->window)))
		return kvq_seterr(err, errlen,
				  "group %s is %u ranks of model %s, %ux%ux%u, %u tokens/block, window %u, sink_blocks %u",
				  g->name, g->world, g->model, g->layers, g->kv_heads, g->head_dim, g->block_tokens,
				  g->window, g->sink_blocks),
		       KVQ_ELAYOUT;
	if (g && g->member[a->rank] && g->member[a->rank] != p)
		return kvq_seterr(err, errlen, "rank %u of group %s is pool %s", a->rank, g->name,
				  g->member[a->rank]->name),
		       -EEXIST;
	/* a configured pool not yet allocated (create_on_attach) joins at its first attach */
	if (p && (p->allocated || p->group[0]) && (strcmp(p->group, a->group) || p->glink.rank != a->rank))
		return kvq_seterr(err, errlen, "pool %s is not rank %u of group %s", p->name, a->rank, a->group),
		       KVQ_ELAYOUT;
	*ret_heads = heads;
	*ret_window = g ? g->window : a->window;
	return 0;
}

/* q's waiters off its list; woken when wake (their lookups then run again
 * and may free q: the list is taken first), else left to their bound. */
static void waiters_off(struct pending *q, bool wake)
{
	struct kvq_group_waiter *w = q->waiters, *nx;

	q->waiters = NULL;
	for (; w; w = nx) {
		nx = w->next;
		w->next = NULL;
		w->on = NULL;
		if (wake)
			w->wake(w);
	}
}

static void drop_pending(struct kvq_group *g, struct pending *q)
{
	kvq_group_fetch_end(q->fetch);
	q->fetch = NULL;
	waiters_off(q, false);
	for (uint32_t r = 0; r < g->world; r++)
		if (!(q->claimed >> r & 1) && g->member[r])
			for (uint32_t i = 0; i < q->n; i++)
				kvq_pool_unref(g->member[r]->pool, q->ids[(size_t)r * q->n + i]);
	for (struct pending **pp = &g->pending; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	g->n_pending--;
	free(q->ids);
	free(q->tok);
	free(q);
}

/* A member evicted the block of key, or demoted it to its host tier: the
 * others do the same with theirs where they can (an unreferenced leaf; a
 * member with no tier drops it). */
static void evict_hook(void *arg, const uint8_t *key, int demote)
{
	const struct kvq_group_link *l = arg;
	struct kvq_group *g = l->g;

	if (g->evicting)
		return;
	g->evicting = true;
	for (uint32_t r = 0; r < g->world; r++) {
		struct kvq_pools_rec *m = g->member[r];

		if (r == l->rank || !m)
			continue;
		if (!demote || !m->tiering || kvq_tiering_demote_key(m->tiering, key) == -ENOENT)
			kvq_prefix_evict_key(m->prefix, key);
	}
	g->evicting = false;
}

static int cached_on(void *prefix, const uint8_t *key)
{
	return kvq_prefix_has(prefix, key);
}

void kvq_group_rank_lost(struct kvq_pools_rec *p)
{
	struct kvq_group *g = p->glink.g;
	int n = 0;

	if (!g)
		return;
	g->evicting = true;   /* each member is swept here */
	for (uint32_t r = 0; r < g->world; r++)
		if (r != p->glink.rank && g->member[r]) {
			int e = kvq_prefix_evict_unless(g->member[r]->prefix, cached_on, p->prefix);
			n += e > 0 ? e : 0;
		}
	g->evicting = false;
	kvq_log(LOG_INFO, "group %s: rank %u died in a write: %d unreferenced blocks the other ranks held and it "
		"did not were released", g->name, p->glink.rank, n);
}

int kvq_group_join(struct kvq_pools *ps, const Kvq__Attach *a, struct kvq_pools_rec *p)
{
	struct kvq_group *g = group_find(ps, a->group);

	if (p->glink.g)
		return 0;
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g)
			return -ENOMEM;
		snprintf(g->name, sizeof(g->name), "%s", a->group);
		snprintf(g->model, sizeof(g->model), "%s", a->model_id);
		g->policy = p->policy;
		g->world = a->world_size;
		g->layers = a->layers;
		g->kv_heads = a->kv_heads;
		g->head_dim = a->head_dim;
		g->block_tokens = a->block_tokens;
		g->act = (uint32_t)a->act;
		g->sink_blocks = a->sink_blocks;
		g->window = p->L->window;
		g->next = ps->groups;
		ps->groups = g;
	}
	g->member[a->rank] = p;
	g->n_members++;
	p->glink.g = g;
	p->glink.rank = a->rank;
	p->glink.world = g->world;
	p->glink.pending = &g->n_pending;
	p->glink.list = &ps->groups;
	p->glink.leave = kvq_group_leave;
	kvq_prefix_set_evict_hook(p->prefix, evict_hook, &p->glink);
	/* its records on the remote under its rank's keys */
	if (p->rtier)
		kvq_rtier_set_rank(p->rtier, a->rank, g->world);
	kvq_log(LOG_INFO, "pool %s: rank %u of group %s (%u of %u ranks)", p->name, a->rank, g->name, g->n_members,
		g->world);
	return 0;
}

void kvq_group_leave(struct kvq_pools_rec *p)
{
	struct kvq_group *g = p->glink.g;

	if (!g)
		return;
	/* their references are on every member, this one's included */
	while (g->pending)
		drop_pending(g, g->pending);
	if (p->prefix)
		kvq_prefix_set_evict_hook(p->prefix, NULL, NULL);
	g->member[p->glink.rank] = NULL;
	p->glink.g = NULL;
	if (p->rtier)
		kvq_rtier_set_rank(p->rtier, 0, 1);
	if (--g->n_members == 0) {
		for (struct kvq_group **pp = p->glink.list; *pp; pp = &(*pp)->next)
			if (*pp == g) {
				*pp = g->next;
				break;
			}
		free(g);
	}
}

/* The chain past the n blocks every member caches, as long as every
 * member has each next block cached or in its host tier: each member
 * promotes the part it has in its tier, with nobody waiting (its blocks
 * published unreferenced), so that the group's next lookup counts them on
 * every member at once.  keys[] room for max blocks. */
static void group_promote(struct kvq_group *g, uint32_t n, const uint32_t *tokens, uint32_t max,
			  const void *salt, size_t salt_len)
{
	const uint32_t B = g->block_tokens;
	uint8_t (*key)[KVQ_PREFIX_KEY_LEN] = calloc((size_t)max + 1, KVQ_PREFIX_KEY_LEN);
	uint32_t *rec = calloc((size_t)g->world * (max + 1), sizeof(*rec)), first[KVQ_GROUP_MAX_RANKS];
	uint32_t end = 0;

	if (!key || !rec)
		goto out;
	for (uint32_t m = 0; m < g->world; m++)
		first[m] = UINT32_MAX;
	for (uint32_t j = 0; j < max; j++, end++) {
		bool whole = true;

		if (kvq_prefix_chain_key(g->member[0]->prefix, j ? key[j - 1] : NULL, tokens + (size_t)j * B, salt,
					 salt_len, key[j]) < 0)
			break;
		if (j < n)
			continue;
		for (uint32_t m = 0; m < g->world && whole; m++) {
			struct kvq_pools_rec *p = g->member[m];
			int64_t r = p->tiering ? kvq_tiering_find(p->tiering, key[j]) : -1;

			/* a member's cached blocks come first, its tier's after */
			if (r >= 0 && first[m] == UINT32_MAX)
				first[m] = j;
			if (r >= 0)
				rec[(size_t)m * (max + 1) + j] = (uint32_t)r;
			else if (first[m] != UINT32_MAX || kvq_prefix_find(p->prefix, key[j]) < 0)
				whole = false;
		}
		if (!whole)
			break;
	}
	for (uint32_t m = 0; m < g->world; m++)
		if (first[m] < end && g->member[m]->tiering)
			kvq_tiering_promote_chain(g->member[m]->tiering, rec + (size_t)m * (max + 1) + first[m],
						  end - first[m], first[m] ? key[first[m] - 1] : NULL,
						  tokens + (size_t)first[m] * B, salt, salt_len);
out:
	free(key);
	free(rec);
}

/* The blocks of tokens' chain every member caches (a missing member:
 * none) into *ret_n: 0 or a negative code. */
static int group_visible(struct kvq_group *g, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
			 const void *salt, size_t salt_len, uint32_t max_ids, uint32_t *ret_n)
{
	uint32_t n = UINT32_MAX;

	for (uint32_t m = 0; m < g->world && n; m++) {
		uint32_t c = 0;
		int r;

		if (!g->member[m])
			return *ret_n = 0, 0;
		r = kvq_prefix_match(g->member[m]->prefix, tokens, n_tokens, max_tokens, salt, salt_len, max_ids, &c);
		if (r < 0)
			return r;
		n = c < n ? c : n;
	}
	*ret_n = n;
	return 0;
}

/* q's hit: n blocks, one reference on every member's n blocks in q->ids,
 * or none at all (a negative code). */
static int group_take(struct kvq_group *g, struct pending *q, uint32_t n, const uint32_t *tokens,
		      uint32_t n_tokens, const void *salt, size_t salt_len)
{
	int r = 0;

	if (!(q->ids = calloc((size_t)g->world * n + 1, sizeof(*q->ids))))
		return -ENOMEM;
	q->n = n;
	for (uint32_t m = 0; m < g->world && n; m++) {
		uint32_t got = 0;

		r = kvq_prefix_lookup(g->member[m]->prefix, tokens, n_tokens, n * g->block_tokens, salt, salt_len,
				      q->ids + (size_t)m * n, n, &got);
		if (r == 0 && got != n)
			r = -EIO;   /* every member matched n just now */
		if (r < 0) {
			for (uint32_t k = 0; k < m; k++)
				for (uint32_t i = 0; i < n; i++)
					kvq_pool_unref(g->member[k]->pool, q->ids[(size_t)k * n + i]);
			for (uint32_t i = 0; i < got; i++)
				kvq_pool_unref(g->member[m]->pool, q->ids[(size_t)m * n + i]);
			free(q->ids);
			q->ids = NULL;
			q->n = 0;
			return r;
		}
	}
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* q's fetch came back (or its waiters' bound passed): what came placed in
 * every member, then the hit fixed as a first rank's, no rank's claimed
 * yet, and the waiters woken to claim theirs. */
static void group_fetched(void *arg)
{
	struct pending *q = arg;
	struct kvq_group *g = q->g;
	uint32_t n = 0;

	kvq_group_fetch_place(q->fetch);
	if (group_visible(g, q->tok, q->n_tokens, q->max_tokens, q->salt, q->salt_len, q->max_ids, &n) < 0 ||
	    group_take(g, q, n, q->tok, q->n_tokens, q->salt, q->salt_len) < 0)
		group_take(g, q, 0, q->tok, q->n_tokens, q->salt, q->salt_len);
	kvq_group_fetch_end(q->fetch);
	q->fetch = NULL;
	free(q->tok);
	q->tok = NULL;
	q->expires_ms = mono_ms() + (int64_t)q->timeout_ms;
	waiters_off(q, true);
}

void kvq_group_unwait(struct kvq_group_waiter *w, bool settle)
{
	struct pending *q = w->on;

	if (!q)
		return;
	for (struct kvq_group_waiter **pw = &q->waiters; *pw; pw = &(*pw)->next)
		if (*pw == w) {
			*pw = w->next;
			break;
		}
	w->next = NULL;
	w->on = NULL;
	if (settle && q->fetch)
		group_fetched(q);
}

/* A first rank's lookup whose chain may go on in the remote: q waits for
 * every member's fetch of the blocks after n, w on it.  0, or a negative
 * code (nothing started). */
static int group_fetch(struct kvq_group *g, struct pending *q, uint32_t n, const uint32_t *tokens,
		       uint32_t n_tokens, uint32_t max_tokens, const void *salt, size_t salt_len, uint32_t max_ids,
		       uint64_t timeout_ms, struct kvq_group_waiter *w)
{
	uint32_t end = (max_tokens < n_tokens ? max_tokens : n_tokens) / g->block_tokens;
	int r;

	end = end < max_ids ? end : max_ids;
	if (!w || !kvq_group_fetch_wanted(g->member, g->world, tokens, n, end, salt, salt_len))
		return -ENOENT;
	if (!(q->tok = malloc((size_t)n_tokens * sizeof(*q->tok) + 1)))
		return -ENOMEM;
	r = kvq_group_fetch_start(g->member, g->world, tokens, n, end, salt, salt_len, group_fetched, q, &q->fetch);
	if (r < 0) {
		free(q->tok);
		q->tok = NULL;
		return r;
	}
	memcpy(q->tok, tokens, (size_t)n_tokens * sizeof(*q->tok));
	q->n_tokens = n_tokens;
	q->max_tokens = max_tokens;
	q->max_ids = max_ids;
	if (salt_len)
		memcpy(q->salt, salt, salt_len);
	q->salt_len = salt_len;
	q->timeout_ms = timeout_ms;
	w->on = q;
	q->waiters = w;
	return 0;
}

int kvq_group_lookup(struct kvq_pools_rec *p, const uint8_t *rid, size_t rid_len, const uint32_t *tokens,
		     uint32_t n_tokens, uint32_t max_tokens, const void *salt, size_t salt_len, uint32_t *ret_ids,
		     uint32_t max_ids, uint32_t *ret_n, int64_t now_ms, uint64_t timeout_ms, uint64_t max_pending,
		     struct kvq_group_waiter *w)
{
	struct kvq_group *g = p->glink.g;
	const uint32_t me = p->glink.rank;
	struct pending *q, *nx;
	uint32_t n = 0;
	int r = 0;

	if (!rid_len || rid_len > KVQ_GROUP_MAX_REQUEST_ID)
		return -EINVAL;
	for (q = g->pending; q; q = nx) {
		nx = q->next;
		if (!q->fetch && q->expires_ms <= now_ms)
			drop_pending(g, q);
	}
	for (q = g->pending; q; q = q->next)
		if (q->rid_len == rid_len && !memcmp(q->rid, rid, rid_len))
			break;
	if (q && q->fetch) {
		/* the hit waits for the remote: so does this rank */
		if (!w)
			return -EAGAIN;
		w->on = q;
		w->next = q->waiters;
		q->waiters = w;
		return 1;
	}
	if (q) {
		if (q->claimed >> me & 1)
			return -EALREADY;
		/* the count the first rank fixed, whatever this one asks */
		if (q->n > max_ids)
			return -EINVAL;
		memcpy(ret_ids, q->ids + (size_t)me * q->n, q->n * sizeof(*ret_ids));
		*ret_n = q->n;
		q->claimed |= 1ull << me;
		if (q->claimed == (g->world == 64 ? ~0ull : (1ull << g->world) - 1))
			drop_pending(g, q);
		return 0;
	}
	if (g->n_pending >= max_pending)
		return -EBUSY;
	/* visible: cached on every member (a missing member: nothing is) */
	r = group_visible(g, tokens, n_tokens, max_tokens, salt, salt_len, max_ids, &n);
	if (r < 0)
		return r;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->g = g;
	memcpy(q->rid, rid, rid_len);
	q->rid_len = rid_len;
	q->expires_ms = now_ms + (int64_t)timeout_ms;
	/* the chain may go on in the remote: every rank's hit waits for it */
	if (group_fetch(g, q, n, tokens, n_tokens, max_tokens, salt, salt_len, max_ids, timeout_ms, w) == 0) {
		q->next = g->pending;
		g->pending = q;
		g->n_pending++;
		return 1;
	}
	/* one reference on every member's n blocks, or none at all */
	r = group_take(g, q, n, tokens, n_tokens, salt, salt_len);
	if (r < 0) {
		free(q);
		return r;
	}
	memcpy(ret_ids, q->ids + (size_t)me * n, n * sizeof(*ret_ids));
	*ret_n = n;
	q->claimed = 1ull << me;
	q->next = g->pending;
	g->pending = q;
	g->n_pending++;
	/* after the references: the promotions' allocations may evict, never these */
	{
		uint32_t most = (max_tokens < n_tokens ? max_tokens : n_tokens) / g->block_tokens;
		bool tiers = false, all = true;

		for (uint32_t m = 0; m < g->world; m++) {
			all = all && g->member[m];
			tiers |= g->member[m] && g->member[m]->tiering;
		}
		most = most < max_ids ? most : max_ids;
		if (all && tiers && most > n)
			group_promote(g, n, tokens, most, salt, salt_len);
	}
	return 0;
}
