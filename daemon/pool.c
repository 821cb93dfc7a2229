/* SPDX-License-Identifier: Apache-2.0 */
/* Slot bookkeeping of one pool: free stacks, states, references (pool.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "pool.h"

#define OPEN_FREE UINT32_MAX   /* reserved[] of a free open slot */

struct kvq_pool {
	uint32_t n_sealed, n_open, n_sink;

	/* blocks: sealed slots, then sink slots (pool.h) */
	uint8_t *state;            /* enum kvq_pool_state */
	uint32_t *refs;
	uint32_t *free[2];         /* stacks of free ids, by class (sealed, sink) */
	uint32_t n_free[2];

	/* open slots */
	uint32_t *reserved;        /* sealed id reserved for a used open slot, or OPEN_FREE */
	uint32_t *ofree;           /* stack of free open ids */
	uint32_t n_ofree;

	/* DEMOTING blocks by class, and each one's place there (pool.h) */
	uint32_t *demoting[2], n_demoting[2];
	uint32_t *demoting_at;

	/* counters kept on each transition, so stats cost nothing; by class */
	uint32_t n_reserved, n_private[2], n_cached[2], n_cached_ref[2];
	uint64_t total_refs[2], evictions, alloc_failures;

	struct kvq_pool_cache cache;   /* all NULL when none is attached */
	struct kvq_pool_transit transit;
	uint8_t *mirror;               /* kvq_pool_set_mirror's, or NULL */
	uint32_t *mirror_open;
	uint16_t *owners, *owners_open;   /* kvq_pool_set_owners', or NULL */
};

/* Class of block id: 0 sealed, 1 sink. */
static int cls_of(const struct kvq_pool *p, uint32_t id)
{
	return id >= p->n_sealed;
}

int kvq_pool_new(uint32_t n_sealed, uint32_t n_open, uint32_t n_sink, kvq_pool **ret)
{
	struct kvq_pool *p;
	size_t nb = (size_t)n_sealed + n_sink;

	if (n_sealed > KVQ_MAX_SLOTS || n_open > KVQ_MAX_SLOTS || n_sink > KVQ_MAX_SLOTS)
		return -EINVAL;
	p = calloc(1, sizeof *p);
	if (!p)
		return -ENOMEM;
	p->n_sealed = n_sealed;
	p->n_open = n_open;
	p->n_sink = n_sink;
	/* +1: calloc(0) may return NULL, which would read as a failure */
	p->state = calloc(nb + 1, sizeof *p->state);
	p->refs = calloc(nb + 1, sizeof *p->refs);
	p->free[0] = calloc((size_t)n_sealed + 1, sizeof *p->free[0]);
	p->free[1] = calloc((size_t)n_sink + 1, sizeof *p->free[1]);
	p->reserved = calloc((size_t)n_open + 1, sizeof *p->reserved);
	p->ofree = calloc((size_t)n_open + 1, sizeof *p->ofree);
	p->demoting[0] = calloc((size_t)n_sealed + 1, sizeof *p->demoting[0]);
	p->demoting[1] = calloc((size_t)n_sink + 1, sizeof *p->demoting[1]);
	p->demoting_at = calloc(nb + 1, sizeof *p->demoting_at);
	if (!p->state || !p->refs || !p->free[0] || !p->free[1] || !p->reserved || !p->ofree || !p->demoting[0] ||
	    !p->demoting[1] || !p->demoting_at) {
		kvq_pool_free(p);
		return -ENOMEM;
	}
	/* pushed in reverse so that ids come out 0, 1, 2, ... (easier to read
	 * in dumps; nothing depends on it) */
	for (uint32_t i = 0; i < n_sealed; i++)
		p->free[0][i] = n_sealed - 1 - i;
	p->n_free[0] = n_sealed;
	for (uint32_t i = 0; i < n_sink; i++)
		p->free[1][i] = n_sealed + n_sink - 1 - i;
	p->n_free[1] = n_sink;
	for (uint32_t i = 0; i < n_open; i++) {
		p->reserved[i] = OPEN_FREE;
		p->ofree[i] = n_open - 1 - i;
	}
	p->n_ofree = n_open;
	*ret = p;
	return 0;
}

void kvq_pool_free(kvq_pool *p)
{
	if (!p)
		return;
	free(p->state);
	free(p->refs);
	free(p->free[0]);
	free(p->free[1]);
	free(p->reserved);
	free(p->ofree);
	free(p->demoting[0]);
	free(p->demoting[1]);
	free(p->demoting_at);
	free(p);
}

/* Block id's state and whether a client holds it, into the mirror. */
static void mirror(struct kvq_pool *p, uint32_t id)
{
	uint8_t s = p->state[id];

	if (!p->mirror)
		return;
	if (s == KVQ_POOL_RESERVED || s == KVQ_POOL_PRIVATE || p->refs[id] > 0)
		s |= KVQ_POOL_MIRROR_HELD;
	else if (p->owners)
		__atomic_store_n(&p->owners[id], 0, __ATOMIC_RELEASE);
	__atomic_store_n(&p->mirror[id], s, __ATOMIC_RELEASE);
}

static void mirror_open(struct kvq_pool *p, uint32_t o)
{
	if (p->owners_open && p->reserved[o] == OPEN_FREE)
		__atomic_store_n(&p->owners_open[o], 0, __ATOMIC_RELEASE);
	if (p->mirror_open)
		__atomic_store_n(&p->mirror_open[o], p->reserved[o] == OPEN_FREE ? UINT32_MAX : p->reserved[o],
				 __ATOMIC_RELEASE);
}

static void owner_merge(uint16_t *slot, uint16_t tag)
{
	uint16_t was = __atomic_load_n(slot, __ATOMIC_RELAXED);

	if (was != tag)
		__atomic_store_n(slot, was ? (uint16_t)KVQ_POOL_OWNERS_SEVERAL : tag, __ATOMIC_RELEASE);
}

void kvq_pool_set_owners(kvq_pool *p, uint16_t *blocks, uint16_t *open)
{
	p->owners = blocks;
	p->owners_open = open;
}

void kvq_pool_owner(kvq_pool *p, uint32_t id, uint16_t tag)
{
	if (p->owners && tag && id < p->n_sealed + p->n_sink)
		owner_merge(&p->owners[id], tag);
}

void kvq_pool_open_owner(kvq_pool *p, uint32_t o, uint16_t tag)
{
	if (!p->owners_open || !tag || o >= p->n_open || p->reserved[o] == OPEN_FREE)
		return;
	owner_merge(&p->owners_open[o], tag);
	kvq_pool_owner(p, p->reserved[o], tag);
}

/* Callers set refs before the id leaves the pool; the mirror says held
 * from here on (reserved and private are held at any count). */
static uint32_t pop_block(struct kvq_pool *p, int cls, uint8_t state)
{
	uint32_t id = p->free[cls][--p->n_free[cls]];

	p->state[id] = state;
	mirror(p, id);
	return id;
}

static void push_block(struct kvq_pool *p, uint32_t id)
{
	int c = cls_of(p, id);

	p->state[id] = KVQ_POOL_FREE;
	p->refs[id] = 0;
	mirror(p, id);
	p->free[c][p->n_free[c]++] = id;
}

/* DEMOTING block id out of its class's list. */
static void demoting_remove(struct kvq_pool *p, uint32_t id)
{
	int c = cls_of(p, id);
	uint32_t at = p->demoting_at[id], last = p->demoting[c][--p->n_demoting[c]];

	p->demoting[c][at] = last;
	p->demoting_at[last] = at;
}

/* Makes at least need slots of class cls free, taking demoting slots (their
 * copies dropped) and then evicting until the shortfall is made up, or
 * changes nothing and returns -ENOSPC.  The cache is asked first how much
 * it could evict, so a refusal never costs the cache any block. */
static int make_room(struct kvq_pool *p, int cls, uint32_t need)
{
	uint32_t short_by;

	if (need <= p->n_free[cls])
		return 0;
	short_by = need - p->n_free[cls];
	if (short_by > p->n_demoting[cls] &&
	    (!p->cache.evict || p->cache.evictable(p->cache.ctx, cls) < short_by - p->n_demoting[cls]))
		return -ENOSPC;
	while (p->n_free[cls] < need && p->n_demoting[cls] > 0) {
		uint32_t id = p->demoting[cls][p->n_demoting[cls] - 1];

		demoting_remove(p, id);
		push_block(p, id);
		if (p->transit.cancel)
			p->transit.cancel(p->transit.ctx, id);
	}
	if (p->n_free[cls] >= need)
		return 0;
	p->cache.evict(p->cache.ctx, cls, need - p->n_free[cls]);
	/* only a cache that broke its word leaves us short here */
	return p->n_free[cls] >= need ? 0 : -ENOSPC;
}

int kvq_pool_alloc_open(kvq_pool *p, uint32_t count, uint32_t *ret_open, uint32_t *ret_sealed)
{
	int r;

	if (count > p->n_ofree) {
		p->alloc_failures++;
		return -ENOSPC;
	}
	r = make_room(p, 0, count);
	if (r < 0) {
		p->alloc_failures++;
		return r;
	}
	for (uint32_t i = 0; i < count; i++) {
		uint32_t o = p->ofree[--p->n_ofree];
		uint32_t s = pop_block(p, 0, KVQ_POOL_RESERVED);

		p->reserved[o] = s;
		mirror_open(p, o);
		ret_open[i] = o;
		if (ret_sealed)
			ret_sealed[i] = s;
	}
	p->n_reserved += count;
	return 0;
}

static int alloc_blocks(struct kvq_pool *p, int cls, uint32_t count, uint32_t *ret_ids)
{
	int r = make_room(p, cls, count);

	if (r < 0) {
		p->alloc_failures++;
		return r;
	}
	for (uint32_t i = 0; i < count; i++) {
		uint32_t s = pop_block(p, cls, KVQ_POOL_PRIVATE);

		p->refs[s] = 1;
		ret_ids[i] = s;
	}
	p->n_private[cls] += count;
	p->total_refs[cls] += count;
	return 0;
}

int kvq_pool_alloc_sealed(kvq_pool *p, uint32_t count, uint32_t *ret_ids)
{
	return alloc_blocks(p, 0, count, ret_ids);
}

int kvq_pool_alloc_sink(kvq_pool *p, uint32_t count, uint32_t *ret_ids)
{
	return alloc_blocks(p, 1, count, ret_ids);
}

int kvq_pool_check_open(const kvq_pool *p, uint32_t open_id)
{
	if (open_id >= p->n_open)
		return -ERANGE;
	return p->reserved[open_id] == OPEN_FREE ? -EINVAL : 0;
}

int kvq_pool_open_reserved(const kvq_pool *p, uint32_t open_id, uint32_t *ret_id)
{
	int r = kvq_pool_check_open(p, open_id);

	if (r < 0)
		return r;
	*ret_id = p->reserved[open_id];
	return 0;
}

static void free_open(struct kvq_pool *p, uint32_t open_id)
{
	p->reserved[open_id] = OPEN_FREE;
	mirror_open(p, open_id);
	p->ofree[p->n_ofree++] = open_id;
	p->n_reserved--;
}

int kvq_pool_seal(kvq_pool *p, uint32_t open_id, uint32_t *ret_id)
{
	uint32_t s;
	int r = kvq_pool_check_open(p, open_id);

	if (r < 0)
		return r;
	s = p->reserved[open_id];
	free_open(p, open_id);
	p->state[s] = KVQ_POOL_PRIVATE;
	p->refs[s] = 1;
	mirror(p, s);
	p->n_private[0]++;
	p->total_refs[0]++;
	*ret_id = s;
	return 0;
}

int kvq_pool_release_open(kvq_pool *p, uint32_t open_id)
{
	uint32_t s;
	int r = kvq_pool_check_open(p, open_id);

	if (r < 0)
		return r;
	s = p->reserved[open_id];
	free_open(p, open_id);
	push_block(p, s);
	return 0;
}

int kvq_pool_check_sealed(const kvq_pool *p, uint32_t id, unsigned mask)
{
	if (id >= p->n_sealed + p->n_sink)
		return -ERANGE;
	return mask & KVQ_POOL_BIT(p->state[id]) ? 0 : -EINVAL;
}

int kvq_pool_state(const kvq_pool *p, uint32_t id)
{
	return id < p->n_sealed + p->n_sink ? p->state[id] : -ERANGE;
}

uint32_t kvq_pool_refs(const kvq_pool *p, uint32_t id)
{
	return id < p->n_sealed + p->n_sink ? p->refs[id] : 0;
}

int kvq_pool_ref(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_SEALED_BLOCK);

	if (r < 0)
		return r;
	if (p->refs[id] >= KVQ_POOL_MAX_REFS)
		return -EOVERFLOW;
	p->total_refs[cls_of(p, id)]++;
	if (p->refs[id]++ == 0) {
		/* only a cached block can be at zero (a private one would be free) */
		mirror(p, id);
		p->n_cached_ref[cls_of(p, id)]++;
		if (p->cache.held)
			p->cache.held(p->cache.ctx, id, 1);
	}
	return 0;
}

int kvq_pool_unref(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_SEALED_BLOCK);

	if (r < 0)
		return r;
	if (p->refs[id] == 0)
		return -EINVAL;
	p->total_refs[cls_of(p, id)]--;
	if (--p->refs[id] > 0)
		return 0;
	if (p->state[id] == KVQ_POOL_PRIVATE) {
		p->n_private[cls_of(p, id)]--;
		push_block(p, id);
	} else {
		mirror(p, id);
		p->n_cached_ref[cls_of(p, id)]--;
		if (p->cache.held)
			p->cache.held(p->cache.ctx, id, 0);
	}
	return 0;
}

void kvq_pool_stats(const kvq_pool *p, struct kvq_pool_stats *ret)
{
	struct kvq_pool_stats s = {
		.n_sealed = p->n_sealed,
		.n_open = p->n_open,
		.n_sink = p->n_sink,
		.sealed_free = p->n_free[0],
		.sealed_reserved = p->n_reserved,
		.sealed_private = p->n_private[0],
		.sealed_cached = p->n_cached[0],
		.cached_referenced = p->n_cached_ref[0],
		.sealed_evictable = p->cache.evictable ? p->cache.evictable(p->cache.ctx, 0) : 0,
		.sealed_demoting = p->n_demoting[0],
		.sink_demoting = p->n_demoting[1],
		.sink_free = p->n_free[1],
		.sink_private = p->n_private[1],
		.sink_cached = p->n_cached[1],
		.sink_referenced = p->n_cached_ref[1],
		.sink_evictable = p->cache.evictable ? p->cache.evictable(p->cache.ctx, 1) : 0,
		.open_free = p->n_ofree,
		.open_used = p->n_open - p->n_ofree,
		.refs = p->total_refs[0],
		.sink_refs = p->total_refs[1],
		.evictions = p->evictions,
		.alloc_failures = p->alloc_failures,
	};

	*ret = s;
}

void kvq_pool_set_cache(kvq_pool *p, const struct kvq_pool_cache *c)
{
	if (c)
		p->cache = *c;
	else
		memset(&p->cache, 0, sizeof p->cache);
}

int kvq_pool_cache_insert(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_BIT(KVQ_POOL_PRIVATE));

	if (r < 0)
		return r;
	p->state[id] = KVQ_POOL_CACHED;
	mirror(p, id);
	p->n_private[cls_of(p, id)]--;
	p->n_cached[cls_of(p, id)]++;
	p->n_cached_ref[cls_of(p, id)]++;   /* a private block always has refs >= 1 */
	return 0;
}

int kvq_pool_cache_evicted(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_BIT(KVQ_POOL_CACHED));

	if (r < 0)
		return r;
	if (p->refs[id] > 0)
		return -EINVAL;
	p->n_cached[cls_of(p, id)]--;
	p->evictions++;
	push_block(p, id);
	return 0;
}

int kvq_pool_cache_demoting(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_BIT(KVQ_POOL_CACHED));
	int c;

	if (r < 0)
		return r;
	if (p->refs[id] > 0)
		return -EINVAL;
	c = cls_of(p, id);
	p->n_cached[c]--;
	p->state[id] = KVQ_POOL_DEMOTING;
	mirror(p, id);
	p->demoting_at[id] = p->n_demoting[c];
	p->demoting[c][p->n_demoting[c]++] = id;
	return 0;
}

int kvq_pool_demoted(kvq_pool *p, uint32_t id)
{
	int r = kvq_pool_check_sealed(p, id, KVQ_POOL_BIT(KVQ_POOL_DEMOTING));

	if (r < 0)
		return r;
	demoting_remove(p, id);
	push_block(p, id);
	return 0;
}

void kvq_pool_set_transit(kvq_pool *p, const struct kvq_pool_transit *t)
{
	if (t)
		p->transit = *t;
	else
		memset(&p->transit, 0, sizeof p->transit);
}

void kvq_pool_set_mirror(kvq_pool *p, uint8_t *states, uint32_t *open)
{
	p->mirror = states;
	p->mirror_open = open;
	if (!states || !open)
		return;
	for (uint32_t id = 0; id < p->n_sealed + p->n_sink; id++)
		mirror(p, id);
	for (uint32_t o = 0; o < p->n_open; o++)
		mirror_open(p, o);
}

int kvq_pool_adopt(kvq_pool *p, const uint8_t *blocks, const uint32_t *open)
{
	const uint32_t nb = p->n_sealed + p->n_sink;
	uint32_t named = 0, reserved = 0;

	if (p->n_free[0] != p->n_sealed || p->n_free[1] != p->n_sink || p->n_ofree != p->n_open)
		return -EINVAL;
	/* checked whole first: each used open slot names a distinct reserved
	 * sealed block and each reserved block is named */
	for (uint32_t id = 0; id < nb; id++) {
		if (blocks[id] > KVQ_POOL_ADOPT_RESERVED)
			return -EINVAL;
		if (blocks[id] == KVQ_POOL_ADOPT_RESERVED) {
			if (cls_of(p, id))
				return -EINVAL;
			reserved++;
		}
	}
	for (uint32_t o = 0; o < p->n_open; o++) {
		if (open[o] == UINT32_MAX)
			continue;
		if (open[o] >= p->n_sealed || blocks[open[o]] != KVQ_POOL_ADOPT_RESERVED)
			return -EINVAL;
		named++;
	}
	if (named != reserved)
		return -EINVAL;   /* one named twice, or one named by none */

	p->n_free[0] = p->n_free[1] = 0;
	for (uint32_t id = nb; id-- > 0;) {
		const int c = cls_of(p, id);

		p->refs[id] = 0;
		switch (blocks[id]) {
		case KVQ_POOL_ADOPT_FREE:
			p->state[id] = KVQ_POOL_FREE;
			p->free[c][p->n_free[c]++] = id;
			break;
		case KVQ_POOL_ADOPT_CACHED_HELD:
			p->refs[id] = 1;
			p->n_cached_ref[c]++;
			p->total_refs[c]++;
			/* fall through */
		case KVQ_POOL_ADOPT_CACHED:
			p->state[id] = KVQ_POOL_CACHED;
			p->n_cached[c]++;
			break;
		case KVQ_POOL_ADOPT_PRIVATE:
			p->state[id] = KVQ_POOL_PRIVATE;
			p->refs[id] = 1;
			p->n_private[c]++;
			p->total_refs[c]++;
			break;
		default:
			p->state[id] = KVQ_POOL_RESERVED;
			break;
		}
	}
	p->n_ofree = 0;
	for (uint32_t o = p->n_open; o-- > 0;) {
		p->reserved[o] = open[o] == UINT32_MAX ? OPEN_FREE : open[o];
		if (open[o] == UINT32_MAX)
			p->ofree[p->n_ofree++] = o;
	}
	p->n_reserved = reserved;
	if (p->mirror)
		kvq_pool_set_mirror(p, p->mirror, p->mirror_open);
	return 0;
}
