/* SPDX-License-Identifier: Apache-2.0 */
/* Demotion to the host tier and promotion back (tiering.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blockrec.h"
#include "log.h"
#include "prefix.h"
#include "seterr.h"
#include "tiering.h"

/* Blocks one demotion job packs at most. */
#define DEMOTE_BATCH 32u

struct kvq_tiering {
	struct kvq_tiering_pool p;     /* the pool's parts, borrowed */
	kvq_tier *tier;
	kvq_copier *const *cp;         /* the daemon's copier (struct kvq_pools), which may change */
	struct kvq_backend_chan *chan; /* the backend's copies, where the daemon does not map the pool */
	uint32_t *gen;                 /* per block id: bumped at each demotion and cancel */
	int64_t *rec_of;               /* per block id: its record while DEMOTING */
	uint32_t inflight;             /* blocks in demotion jobs */
	uint32_t jobs;                 /* jobs not yet back */
	uint32_t reserve_pct, max_inflight;   /* kvq_tiering_demote's last: each job's end goes on */
	bool closing;                  /* kvq_tiering_free: no new job */
	struct kvq_tiering_stats st;
};

struct demote_job {
	struct kvq_copy_job job;
	struct kvq_tiering *tg;
	uint32_t n;
	struct {
		uint32_t id, gen, rec;
		int has_parent;
		uint8_t key[KVQ_PREFIX_KEY_LEN], parent[KVQ_PREFIX_KEY_LEN];
	} b[DEMOTE_BATCH];
};

static void count_copy(struct kvq_tiering *tg, const struct kvq_copy_job *j)
{
	tg->st.copy_bytes += j->bytes;
	tg->st.copy_us += (uint64_t)(j->seconds * 1e6);
	tg->st.copies++;
	kvq_hist_observe(&tg->st.copy_time, j->seconds);
}

/* ------------------------------------------------------------ demotion */

/* Copies between blocks ids[n] and records recs[n] through the backend's
 * channel, all in one wait. */
static int chan_blocks(const struct kvq_tiering *tg, int to_host, const uint32_t *ids, uint8_t *const *recs,
		       uint32_t n)
{
	const struct kvq_layout *L = tg->p.L;
	struct kvq_backend_run *runs = malloc(((size_t)n * L->layers + 1) * sizeof(*runs));
	char err[KVQ_BACKEND_MSG_MAX];
	int r;

	if (!runs)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		kvq_backend_block_runs(L, kvq_layout_block_ref(L, ids[i]), recs[i], runs + (size_t)i * L->layers);
	r = tg->p.mem->backend->chan_copy(tg->chan, to_host, runs, n * L->layers, err, sizeof err);
	if (r < 0)
		kvq_log(LOG_ERR, "pool %s: %s", tg->p.name, err);
	free(runs);
	return r;
}

static int demote_run(struct kvq_copy_job *job)
{
	struct demote_job *j = (struct demote_job *)job;
	const struct kvq_tiering *tg = j->tg;
	const struct kvq_layout *L = tg->p.L;
	uint32_t ids[DEMOTE_BATCH];
	uint8_t *recs[DEMOTE_BATCH];
	uint64_t len[DEMOTE_BATCH];
	char err[128];
	int r = 0;

	for (uint32_t i = 0; i < j->n; i++) {
		ids[i] = j->b[i].id;
		recs[i] = kvq_tier_rec(tg->tier, j->b[i].rec, &len[i]);
	}
	if (tg->chan)
		r = chan_blocks(tg, 1, ids, recs, j->n);
	for (uint32_t i = 0; i < j->n && r == 0; i++) {
		const uint8_t *parent = j->b[i].has_parent ? j->b[i].parent : NULL;

		/* host: pack reads the mapping; cuda: the slices came by DMA */
		/* unsummed: the records never leave kvqd's memory, and the
		 * copies run at the bus's speed (kernels/blockrec.h) */
		r = tg->chan ? kvq_blockrec_seal(L, kvq_layout_block_ref(L, ids[i]).cls, j->b[i].key, parent, NULL,
						 0, recs[i], len[i])
			     : kvq_blockrec_pack(L, tg->p.mem->map, kvq_layout_block_ref(L, ids[i]), j->b[i].key, parent,
						 NULL, 0, recs[i], len[i], err, sizeof err);
		job->bytes += len[i];
	}
	return r;
}

static void demote_done(struct kvq_copy_job *job, int result)
{
	struct demote_job *j = (struct demote_job *)job;
	struct kvq_tiering *tg = j->tg;
	kvq_pool *pool = tg->p.pool;

	count_copy(tg, job);
	for (uint32_t i = 0; i < j->n; i++) {
		uint32_t id = j->b[i].id;
		bool mine = tg->gen[id] == j->b[i].gen && kvq_pool_state(pool, id) == KVQ_POOL_DEMOTING;

		if (mine && result == 0 && kvq_tier_commit(tg->tier, j->b[i].rec))
			tg->st.demotions++;
		else if (!mine || result != 0)
			kvq_tier_abort(tg->tier, j->b[i].rec);
		if (mine) {
			tg->rec_of[id] = -1;
			kvq_pool_demoted(pool, id);
			if (result != 0)
				kvq_tier_drop_under(tg->tier, j->b[i].key);
		}
	}
	if (result != 0)
		kvq_log(LOG_ERR, "pool %s: a copy to the host tier failed: %s", tg->p.name, strerror(-result));
	tg->inflight -= j->n;
	tg->jobs--;
	free(j);
	kvq_tiering_demote(tg, tg->reserve_pct, tg->max_inflight);
}

/* An allocation took DEMOTING block id: its record is dropped when its job
 * comes back, and the records below it now. */
static void on_cancel(void *ctx, uint32_t id)
{
	struct kvq_tiering *tg = ctx;

	tg->gen[id]++;
	tg->st.cancelled++;
	if (tg->rec_of[id] >= 0)
		kvq_tier_drop_under(tg->tier, kvq_tier_rec_key(tg->tier, (uint32_t)tg->rec_of[id]));
	tg->rec_of[id] = -1;
}

/* The pool dropped a block without a copy. */
static void on_drop(void *arg, const uint8_t *key)
{
	struct kvq_tiering *tg = arg;

	kvq_tier_drop_under(tg->tier, key);
}

/* Blocks v[n] (DEMOTING in the pool, out of the index) into one job: a
 * record reserved for each; a block that gets none just goes. */
static void demote_victims(struct kvq_tiering *tg, const struct kvq_prefix_victim *v, uint32_t n)
{
	struct demote_job *j = calloc(1, sizeof *j);

	for (uint32_t i = 0; i < n; i++) {
		int64_t rec = j ? kvq_tier_reserve(tg->tier, (uint32_t)v[i].cls, v[i].key,
						   v[i].has_parent ? v[i].parent : NULL) : -ENOMEM;

		tg->gen[v[i].id]++;
		if (rec < 0) {
			/* no room, or the key is there already: the block just goes */
			kvq_pool_demoted(tg->p.pool, v[i].id);
			if (rec != -EEXIST)
				kvq_tier_drop_under(tg->tier, v[i].key);
			continue;
		}
		tg->rec_of[v[i].id] = rec;
		j->b[j->n].id = v[i].id;
		j->b[j->n].gen = tg->gen[v[i].id];
		j->b[j->n].rec = (uint32_t)rec;
		j->b[j->n].has_parent = v[i].has_parent;
		memcpy(j->b[j->n].key, v[i].key, sizeof v[i].key);
		memcpy(j->b[j->n].parent, v[i].parent, sizeof v[i].parent);
		j->n++;
	}
	if (!j || j->n == 0) {
		free(j);
		return;
	}
	j->tg = tg;
	j->job.run = demote_run;
	j->job.done = demote_done;
	tg->inflight += j->n;
	tg->jobs++;
	kvq_copier_submit(*tg->cp, &j->job);
}

/* Up to want blocks of class cls into one job; how many left the index. */
static uint32_t demote_some(struct kvq_tiering *tg, int cls, uint32_t want)
{
	struct kvq_prefix_victim v[DEMOTE_BATCH];
	uint32_t n = kvq_prefix_demote(tg->p.prefix, cls, want < DEMOTE_BATCH ? want : DEMOTE_BATCH, DEMOTE_BATCH, v);

	demote_victims(tg, v, n);
	return n;
}

int kvq_tiering_demote_key(struct kvq_tiering *tg, const uint8_t *key)
{
	struct kvq_prefix_victim v;
	int r;

	if (tg->closing)
		return -ESHUTDOWN;
	r = kvq_prefix_demote_key(tg->p.prefix, key, &v);
	if (r == 0)
		demote_victims(tg, &v, 1);
	return r;
}

uint32_t kvq_tiering_demote_count(struct kvq_tiering *tg, uint32_t count)
{
	uint32_t n = 0, k = 1;

	/* in the eviction order, whatever the class; each batch one job */
	while (n < count && k > 0 && !tg->closing) {
		k = demote_some(tg, 0, count - n < DEMOTE_BATCH ? count - n : DEMOTE_BATCH);
		if (k == 0)
			k = demote_some(tg, 1, count - n < DEMOTE_BATCH ? count - n : DEMOTE_BATCH);
		n += k;
	}
	return n;
}

void kvq_tiering_demote(struct kvq_tiering *tg, uint32_t reserve_pct, uint32_t max_inflight)
{
	struct kvq_pool_stats st;

	tg->reserve_pct = reserve_pct;
	tg->max_inflight = max_inflight;
	if (tg->closing)
		return;
	for (int cls = 0; cls < 2; cls++) {
		uint32_t slots, free, demoting, reserve;

		kvq_pool_stats(tg->p.pool, &st);
		slots = cls ? st.n_sink : st.n_sealed;
		free = cls ? st.sink_free : st.sealed_free;
		demoting = cls ? st.sink_demoting : st.sealed_demoting;
		reserve = (uint32_t)((uint64_t)slots * reserve_pct / 100);
		if (reserve == 0 && slots > 0 && reserve_pct > 0)
			reserve = 1;
		if (free + demoting >= reserve || tg->inflight >= max_inflight)
			continue;
		demote_some(tg, cls, reserve - free - demoting < max_inflight - tg->inflight ?
			    reserve - free - demoting : max_inflight - tg->inflight);
	}
}

/* ------------------------------------------------------------ promotion */

static int promote_run(struct kvq_copy_job *job)
{
	struct kvq_promotion *pr = (struct kvq_promotion *)job;
	const struct kvq_tiering *tg = pr->tg;
	const struct kvq_layout *L = tg->p.L;
	uint8_t **recs = malloc(((size_t)pr->n + 1) * sizeof(*recs));
	char err[160];
	int r = recs ? 0 : -ENOMEM;

	for (uint32_t i = 0; i < pr->n && r == 0; i++) {
		uint64_t len;

		recs[i] = kvq_tier_rec(tg->tier, pr->rec[i], &len);
		/* cuda: checked whole first, then sent; host: checked as it is copied */
		r = tg->chan ? kvq_blockrec_check(L, recs[i], len, NULL, err, sizeof err)
			     : kvq_blockrec_unpack(L, tg->p.mem->map, kvq_layout_block_ref(L, pr->id[i]), recs[i], len,
						   NULL, err, sizeof err);
		job->bytes += len;
	}
	if (r == 0 && tg->chan)
		r = chan_blocks(tg, 0, pr->id, recs, pr->n);
	free(recs);
	return r;
}

static void promote_done(struct kvq_copy_job *job, int result)
{
	struct kvq_promotion *pr = (struct kvq_promotion *)job;

	count_copy(pr->tg, job);
	pr->tg->jobs--;
	pr->result = result;
	if (result != 0)
		kvq_log(LOG_ERR, "pool %s: a copy from the host tier failed: %s", pr->tg->p.name, strerror(-result));
	pr->ready(pr, pr->arg);
}

/* Slots for pr's records by class: 0 or -ENOSPC (none taken). */
static int promote_slots(struct kvq_promotion *pr)
{
	kvq_pool *pool = pr->tg->p.pool;
	uint32_t n[2] = { 0, 0 }, *ids[2];
	int r;

	for (uint32_t i = 0; i < pr->n; i++)
		n[kvq_tier_rec_cls(pr->tg->tier, pr->rec[i])]++;
	ids[0] = calloc((size_t)pr->n + 1, sizeof(uint32_t));
	ids[1] = calloc((size_t)pr->n + 1, sizeof(uint32_t));
	r = !ids[0] || !ids[1] ? -ENOMEM : kvq_pool_alloc_sealed(pool, n[0], ids[0]);
	if (r == 0) {
		r = kvq_pool_alloc_sink(pool, n[1], ids[1]);
		if (r < 0)
			for (uint32_t i = 0; i < n[0]; i++)
				kvq_pool_unref(pool, ids[0][i]);
	}
	if (r == 0) {
		uint32_t at[2] = { 0, 0 };

		for (uint32_t i = 0; i < pr->n; i++) {
			uint32_t c = kvq_tier_rec_cls(pr->tg->tier, pr->rec[i]);

			pr->id[i] = ids[c][at[c]++];
		}
	}
	free(ids[0]);
	free(ids[1]);
	return r;
}

int kvq_tiering_promote(struct kvq_tiering *tg, const uint32_t *rec, uint32_t n,
			void (*ready)(struct kvq_promotion *pr, void *arg), void *arg, struct kvq_promotion **ret)
{
	struct kvq_promotion *pr = calloc(1, sizeof *pr);
	int r = -ENOMEM;

	if (!pr)
		return r;
	pr->tg = tg;
	pr->n = n;
	pr->rec = malloc(((size_t)n + 1) * sizeof *pr->rec);
	pr->id = malloc(((size_t)n + 1) * sizeof *pr->id);
	if (!pr->rec || !pr->id)
		goto fail;
	memcpy(pr->rec, rec, (size_t)n * sizeof *rec);
	/* taken first: an allocation below may evict and drop, never these */
	for (uint32_t i = 0; i < n; i++)
		kvq_tier_take(tg->tier, rec[i]);
	r = promote_slots(pr);
	if (r < 0) {
		for (uint32_t i = 0; i < n; i++)
			kvq_tier_taken(tg->tier, rec[i], false);
		goto fail;
	}
	pr->ready = ready;
	pr->arg = arg;
	pr->job.run = promote_run;
	pr->job.done = promote_done;
	tg->jobs++;
	*ret = pr;
	kvq_copier_submit(*tg->cp, &pr->job);
	return 0;
fail:
	free(pr->rec);
	free(pr->id);
	free(pr);
	return r;
}

/* A chain promoted with nobody waiting (kvq_tiering_promote_chain). */
struct chain {
	int has_parent;
	uint8_t parent[KVQ_PREFIX_KEY_LEN];
	uint32_t *tokens;                 /* n x B */
	uint8_t salt[KVQ_PREFIX_MAX_SALT];
	size_t salt_len;
};

/* The chain's blocks published in order after its parent, unreferenced. */
static void chain_ready(struct kvq_promotion *pr, void *arg)
{
	struct chain *ch = arg;
	struct kvq_tiering *tg = pr->tg;
	bool *consumed = calloc((size_t)pr->n + 1, sizeof(*consumed));
	int64_t parent = ch->has_parent ? kvq_prefix_find(tg->p.prefix, ch->parent) : -1;
	bool ok = pr->result == 0 && consumed && (!ch->has_parent || parent >= 0);

	for (uint32_t i = 0; i < pr->n; i++) {
		uint32_t got = UINT32_MAX;

		if (ok && kvq_prefix_publish(tg->p.prefix, pr->id[i], (int32_t)parent,
					     ch->tokens + (size_t)i * tg->p.L->block_tokens, ch->salt, ch->salt_len,
					     &got) == 0) {
			consumed[i] = true;
			parent = got;
		} else {
			ok = false;
		}
		/* published: cached with no reference once ours goes; a
		 * duplicate or a failure: the slot is freed */
		kvq_pool_unref(tg->p.pool, pr->id[i]);
	}
	kvq_promotion_end(pr, consumed);
	free(consumed);
	free(ch->tokens);
	free(ch);
}

int kvq_tiering_promote_chain(struct kvq_tiering *tg, const uint32_t *rec, uint32_t n, const uint8_t *parent_key,
			      const uint32_t *tokens, const void *salt, size_t salt_len)
{
	struct kvq_promotion *pr;
	struct chain *ch = calloc(1, sizeof(*ch));
	int r = -ENOMEM;

	if (!ch || salt_len > sizeof(ch->salt))
		goto fail;
	ch->tokens = malloc(((size_t)n * tg->p.L->block_tokens + 1) * sizeof(*ch->tokens));
	if (!ch->tokens)
		goto fail;
	memcpy(ch->tokens, tokens, (size_t)n * tg->p.L->block_tokens * sizeof(*tokens));
	ch->has_parent = parent_key != NULL;
	if (parent_key)
		memcpy(ch->parent, parent_key, KVQ_PREFIX_KEY_LEN);
	if (salt_len)
		memcpy(ch->salt, salt, salt_len);
	ch->salt_len = salt_len;
	r = kvq_tiering_promote(tg, rec, n, chain_ready, ch, &pr);
	if (r == 0)
		return 0;
fail:
	if (ch)
		free(ch->tokens);
	free(ch);
	return r;
}

void kvq_promotion_end(struct kvq_promotion *pr, const bool *consumed)
{
	for (uint32_t i = 0; i < pr->n; i++) {
		bool used = consumed && consumed[i];

		kvq_tier_taken(pr->tg->tier, pr->rec[i], used);
		pr->tg->st.promotions += used;
	}
	free(pr->rec);
	free(pr->id);
	free(pr);
}

/* ------------------------------------------------------------ the rest */

kvq_tier *kvq_tiering_tier(const struct kvq_tiering *tg)
{
	return tg->tier;
}

int64_t kvq_tiering_find(const struct kvq_tiering *tg, const uint8_t *key)
{
	return kvq_tier_find(tg->tier, key);
}

void kvq_tiering_count_hit(struct kvq_tiering *tg, uint64_t tokens)
{
	tg->st.hit_tokens += tokens;
}

void kvq_tiering_stats(const struct kvq_tiering *tg, struct kvq_tiering_stats *ret)
{
	*ret = tg->st;
	kvq_tier_stats(tg->tier, &ret->tier);
}

int kvq_tiering_new(const struct kvq_tiering_pool *p, uint64_t capacity, kvq_copier *const *cp, struct kvq_tiering **ret,
		    char *err, size_t errlen)
{
	struct kvq_tiering *tg;
	size_t nb = (size_t)p->L->n_sealed + p->L->n_sink + 1;
	char label[KVQ_PREFIX_MAX_NAME + 16];
	struct timespec t0, t1;
	int r;

	if (!p->mem->map && !p->mem->backend->chan_open) {
		if (p->tier_fd >= 0)
			close(p->tier_fd);
		return kvq_seterr(err, errlen, "pool %s: its %s memory cannot be copied by kvqd", p->name,
				  p->mem->backend->name), -EOPNOTSUPP;
	}
	tg = calloc(1, sizeof *tg);
	if (!tg) {
		if (p->tier_fd >= 0)
			close(p->tier_fd);
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	tg->p = *p;
	tg->cp = cp;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	tg->gen = calloc(nb, sizeof *tg->gen);
	tg->rec_of = malloc(nb * sizeof *tg->rec_of);
	if (!tg->gen || !tg->rec_of) {
		kvq_tiering_free(tg);
		if (p->tier_fd >= 0)
			close(p->tier_fd);
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	memset(tg->rec_of, 0xff, nb * sizeof *tg->rec_of);
	snprintf(label, sizeof label, "kvq-tier-%s", p->name);
	r = kvq_tier_new(p->L, capacity, label, p->tier_fd, &tg->tier, err, errlen);
	if (r < 0) {
		kvq_tiering_free(tg);
		return r;
	}
	if (!p->mem->map) {
		const struct kvq_backend_mem *tm = kvq_tier_mem(tg->tier);
		char why[KVQ_BACKEND_MSG_MAX];

		r = p->mem->backend->chan_open(p->mem, tm->map, tm->size, &tg->chan, why, sizeof why);
		if (r < 0) {
			kvq_seterr(err, errlen, "pool %s: host tier not started: %s", p->name, why);
			kvq_tiering_free(tg);
			return -EOPNOTSUPP;
		}
	}
	kvq_pool_set_transit(p->pool, &(struct kvq_pool_transit){ tg, on_cancel });
	kvq_prefix_set_drop_hook(p->prefix, on_drop, tg);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	tg->st.open_us = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000u + (uint64_t)(t1.tv_nsec / 1000) -
			 (uint64_t)(t0.tv_nsec / 1000);
	*ret = tg;
	return 0;
}

void kvq_tiering_free(struct kvq_tiering *tg)
{
	if (!tg)
		return;
	tg->closing = true;
	if (tg->jobs)
		kvq_copier_drain(*tg->cp);
	if (tg->tier) {
		kvq_pool_set_transit(tg->p.pool, NULL);
		kvq_prefix_set_drop_hook(tg->p.prefix, NULL, NULL);
	}
	if (tg->chan)
		tg->p.mem->backend->chan_close(tg->chan);
	kvq_tier_free(tg->tier);
	free(tg->gen);
	free(tg->rec_of);
	free(tg);
}
