/* SPDX-License-Identifier: Apache-2.0 */
/* The host tier's records: slots, keys, chains, eviction (tier.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/random.h>

#include "blockrec.h"
#include "seterr.h"
#include "tier.h"

_Static_assert(KVQ_TIER_KEY_LEN == KVQ_BLOCKREC_KEY_LEN, "one key length");

enum { R_FREE = 0, R_INCOMING, R_READY, R_OUTGOING };

struct kvq_tier {
	struct kvq_backend_mem mem;
	uint64_t stride[2], len[2];       /* by class: a slot's bytes, a record's */
	uint64_t off[2];                  /* where each class's slots start */
	uint32_t n[2], first[2];          /* slots by class; the first index of each */
	uint32_t total;

	/* per record */
	uint8_t *state, *doomed, *has_parent;
	uint8_t (*key)[KVQ_TIER_KEY_LEN], (*parent)[KVQ_TIER_KEY_LEN];
	uint32_t *children;               /* records (not FREE) naming it as parent */
	uint64_t *tick;                   /* when it was stored */
	int32_t *heap_pos;                /* in its class's heap, -1 when not there */
	int32_t *next, *pnext;            /* next in its key's bucket, its parent key's */

	uint32_t *heap[2], heap_len[2];   /* READY leaves by class, oldest on top */
	uint32_t *free[2], n_free[2];
	uint32_t *work;                   /* kvq_tier_drop_under's list */

	int32_t *bucket, *pbucket;        /* by key, by parent key; -1: empty */
	unsigned bits;
	uint64_t mult;                    /* random odd multiplier of the bucket index */

	uint64_t clock;
	uint32_t records[2];
	uint64_t evictions, dropped;

	/* told each record that becomes READY and each that goes (kvq_tier_set_record_hook) */
	void (*record_hook)(void *arg, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent);
	void *record_arg;
	/* told each record that goes but into the pool (kvq_tier_set_leave_hook) */
	void (*leave_hook)(void *arg, uint32_t r, bool gone);
	void *leave_arg;
};

/* ------------------------------------------------------------ hashing */

static uint32_t bucket_of(const struct kvq_tier *t, const uint8_t *key)
{
	uint64_t v;

	memcpy(&v, key, sizeof v);
	return (uint32_t)((v * t->mult) >> (64 - t->bits));
}

static void link_in(int32_t *bucket, int32_t *next, uint32_t b, uint32_t r)
{
	next[r] = bucket[b];
	bucket[b] = (int32_t)r;
}

static void link_out(int32_t *bucket, int32_t *next, uint32_t b, uint32_t r)
{
	for (int32_t *at = &bucket[b]; *at >= 0; at = &next[*at])
		if ((uint32_t)*at == r) {
			*at = next[r];
			return;
		}
}

/* Any record (not FREE) under key, or -1. */
static int32_t find_any(const struct kvq_tier *t, const uint8_t *key)
{
	for (int32_t r = t->bucket[bucket_of(t, key)]; r >= 0; r = t->next[r])
		if (!memcmp(t->key[r], key, KVQ_TIER_KEY_LEN))
			return r;
	return -1;
}

/* ------------------------------------------------------------ heaps */

static uint32_t cls_of(const struct kvq_tier *t, uint32_t r)
{
	return r >= t->first[1] && t->n[1] > 0;
}

static void heap_set(struct kvq_tier *t, uint32_t c, uint32_t i, uint32_t r)
{
	t->heap[c][i] = r;
	t->heap_pos[r] = (int32_t)i;
}

static void heap_up(struct kvq_tier *t, uint32_t c, uint32_t i)
{
	uint32_t r = t->heap[c][i];

	while (i > 0 && t->tick[t->heap[c][(i - 1) / 2]] > t->tick[r]) {
		heap_set(t, c, i, t->heap[c][(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	heap_set(t, c, i, r);
}

static void heap_down(struct kvq_tier *t, uint32_t c, uint32_t i)
{
	uint32_t r = t->heap[c][i], n = t->heap_len[c];

	for (;;) {
		uint32_t k = 2 * i + 1;

		if (k >= n)
			break;
		if (k + 1 < n && t->tick[t->heap[c][k + 1]] < t->tick[t->heap[c][k]])
			k++;
		if (t->tick[t->heap[c][k]] >= t->tick[r])
			break;
		heap_set(t, c, i, t->heap[c][k]);
		i = k;
	}
	heap_set(t, c, i, r);
}

static void heap_push(struct kvq_tier *t, uint32_t r)
{
	uint32_t c = cls_of(t, r);

	if (t->heap_pos[r] >= 0)
		return;
	t->heap[c][t->heap_len[c]] = r;
	heap_up(t, c, t->heap_len[c]++);
}

static void heap_remove(struct kvq_tier *t, uint32_t r)
{
	uint32_t c = cls_of(t, r), i, moved;

	if (t->heap_pos[r] < 0)
		return;
	i = (uint32_t)t->heap_pos[r];
	t->heap_pos[r] = -1;
	if (--t->heap_len[c] == i)
		return;
	moved = t->heap[c][t->heap_len[c]];
	heap_set(t, c, i, moved);
	heap_down(t, c, i);
	heap_up(t, c, (uint32_t)t->heap_pos[moved]);
}

/* A READY record with no child is a leaf: evictable. */
static void leaf_check(struct kvq_tier *t, uint32_t r)
{
	if (t->state[r] == R_READY && t->children[r] == 0)
		heap_push(t, r);
	else
		heap_remove(t, r);
}

/* ------------------------------------------------------------ records */

/* r is about to go: the block it holds leaves every local tier (gone), or
 * its copy failed. */
static void rec_leaves(struct kvq_tier *t, uint32_t r, bool gone)
{
	if (t->leave_hook)
		t->leave_hook(t->leave_arg, r, gone);
}

/* r out of every list, its parent told, its slot free. */
static void rec_free(struct kvq_tier *t, uint32_t r)
{
	uint32_t c = cls_of(t, r);

	if (t->record_hook)
		t->record_hook(t->record_arg, r, c, NULL, NULL);

	heap_remove(t, r);
	link_out(t->bucket, t->next, bucket_of(t, t->key[r]), r);
	if (t->has_parent[r]) {
		int32_t p = find_any(t, t->parent[r]);

		link_out(t->pbucket, t->pnext, bucket_of(t, t->parent[r]), r);
		if (p >= 0) {
			t->children[p]--;
			leaf_check(t, (uint32_t)p);
		}
	}
	t->state[r] = R_FREE;
	t->doomed[r] = 0;
	t->records[c]--;
	t->free[c][t->n_free[c]++] = r;
}

static void place(struct kvq_tier *t, uint32_t r, uint8_t state, const uint8_t *key, const uint8_t *parent);

int64_t kvq_tier_reserve(kvq_tier *t, uint32_t cls, const uint8_t *key, const uint8_t *parent)
{
	uint32_t r;

	if (cls > 1 || t->n[cls] == 0)
		return -EINVAL;
	if (find_any(t, key) >= 0)
		return -EEXIST;
	while (t->n_free[cls] == 0) {
		if (t->heap_len[cls] == 0)
			return -ENOSPC;
		rec_leaves(t, t->heap[cls][0], true);
		rec_free(t, t->heap[cls][0]);
		t->evictions++;
	}
	r = t->free[cls][--t->n_free[cls]];
	place(t, r, R_INCOMING, key, parent);
	return r;
}

/* Record slot r (taken off its free stack) holds key after parent (NULL:
 * none) in state. */
static void place(struct kvq_tier *t, uint32_t r, uint8_t state, const uint8_t *key, const uint8_t *parent)
{
	uint32_t kids = 0;
	int32_t p;

	t->state[r] = state;
	t->doomed[r] = 0;
	memcpy(t->key[r], key, KVQ_TIER_KEY_LEN);
	t->has_parent[r] = parent != NULL;
	if (parent)
		memcpy(t->parent[r], parent, KVQ_TIER_KEY_LEN);
	else
		memset(t->parent[r], 0, KVQ_TIER_KEY_LEN);
	/* records stored below it before (it was promoted, and comes back) */
	for (int32_t k = t->pbucket[bucket_of(t, key)]; k >= 0; k = t->pnext[k])
		kids += !memcmp(t->parent[k], key, KVQ_TIER_KEY_LEN);
	t->children[r] = kids;
	t->tick[r] = ++t->clock;
	t->heap_pos[r] = -1;
	link_in(t->bucket, t->next, bucket_of(t, key), r);
	if (parent) {
		link_in(t->pbucket, t->pnext, bucket_of(t, parent), r);
		p = find_any(t, parent);
		if (p >= 0) {
			t->children[p]++;
			heap_remove(t, (uint32_t)p);
		}
	}
	t->records[cls_of(t, r)]++;
	leaf_check(t, r);
}

bool kvq_tier_commit(kvq_tier *t, uint32_t r)
{
	if (t->doomed[r]) {
		rec_leaves(t, r, false);
		rec_free(t, r);
		t->dropped++;
		return false;
	}
	t->state[r] = R_READY;
	leaf_check(t, r);
	if (t->record_hook)
		t->record_hook(t->record_arg, r, cls_of(t, r), t->key[r], t->has_parent[r] ? t->parent[r] : NULL);
	return true;
}

void kvq_tier_abort(kvq_tier *t, uint32_t r)
{
	rec_leaves(t, r, false);
	rec_free(t, r);
	t->dropped++;
}

int64_t kvq_tier_find(const kvq_tier *t, const uint8_t *key)
{
	int32_t r = find_any(t, key);

	return r >= 0 && t->state[r] == R_READY ? r : -1;
}

void kvq_tier_take(kvq_tier *t, uint32_t r)
{
	t->state[r] = R_OUTGOING;
	heap_remove(t, r);
}

void kvq_tier_taken(kvq_tier *t, uint32_t r, bool consumed)
{
	if (consumed || t->doomed[r]) {
		if (t->doomed[r])
			t->dropped++;
		if (!consumed)
			rec_leaves(t, r, false);
		rec_free(t, r);
		return;
	}
	t->state[r] = R_READY;
	leaf_check(t, r);
}

uint32_t kvq_tier_drop_under(kvq_tier *t, const uint8_t *key)
{
	uint32_t n = 0, len = 0;

	/* breadth first over the records below key; each is named once, by
	 * its parent, so the list holds at most every record */
	for (int32_t k = t->pbucket[bucket_of(t, key)]; k >= 0; k = t->pnext[k])
		if (!memcmp(t->parent[k], key, KVQ_TIER_KEY_LEN) && !t->doomed[k])
			t->work[len++] = (uint32_t)k;
	for (uint32_t i = 0; i < len; i++) {
		uint32_t r = t->work[i];

		for (int32_t k = t->pbucket[bucket_of(t, t->key[r])]; k >= 0; k = t->pnext[k])
			if (!memcmp(t->parent[k], t->key[r], KVQ_TIER_KEY_LEN) && !t->doomed[k] && len < t->total)
				t->work[len++] = (uint32_t)k;
		/* marked now, freed below: a freed record's key could be reused
		 * by a later reserve while the list still names it */
		t->doomed[r] = 1;
	}
	/* leaves first: the list is in breadth-first order, so backwards */
	for (uint32_t i = len; i-- > 0;) {
		uint32_t r = t->work[i];

		n++;
		if (t->state[r] == R_READY) {
			rec_leaves(t, r, true);
			rec_free(t, r);
			t->dropped++;
		}
	}
	return n;
}

uint8_t *kvq_tier_rec(const kvq_tier *t, uint32_t r, uint64_t *ret_len)
{
	uint32_t c = cls_of(t, r);

	if (ret_len)
		*ret_len = t->len[c];
	return (uint8_t *)t->mem.map + t->off[c] + (uint64_t)(r - t->first[c]) * t->stride[c];
}

uint32_t kvq_tier_rec_cls(const kvq_tier *t, uint32_t r)
{
	return cls_of(t, r);
}

const uint8_t *kvq_tier_rec_key(const kvq_tier *t, uint32_t r)
{
	return t->key[r];
}

const struct kvq_backend_mem *kvq_tier_mem(const kvq_tier *t)
{
	return &t->mem;
}

void kvq_tier_stats(const kvq_tier *t, struct kvq_tier_stats *ret)
{
	*ret = (struct kvq_tier_stats){
		.capacity = t->mem.size,
		.slots = { t->n[0], t->n[1] },
		.records = { t->records[0], t->records[1] },
		.bytes = t->records[0] * t->len[0] + t->records[1] * t->len[1],
		.evictions = t->evictions,
		.dropped = t->dropped,
	};
}

/* ------------------------------------------------------------ lifetime */

/* Slots of each class for capacity: the pool's mix of sealed and sink
 * bytes, at least one sealed slot; 0 when none fits. */
static int split(const struct kvq_layout *L, uint64_t capacity, const uint64_t *stride, uint32_t *n)
{
	double sealed = (double)L->n_sealed * (double)stride[0];
	double sink = (double)L->n_sink * (double)stride[1];
	uint64_t for_sink = L->n_sink ? (uint64_t)((double)capacity * sink / (sealed + sink)) : 0;
	uint64_t s0, s1 = L->n_sink ? for_sink / stride[1] : 0;

	s0 = (capacity - s1 * stride[1]) / stride[0];
	if (s0 == 0)
		return -EINVAL;
	if (s0 + s1 > INT32_MAX / 2)
		return -E2BIG;
	n[0] = (uint32_t)s0;
	n[1] = (uint32_t)s1;
	return 0;
}

static int alloc_arrays(struct kvq_tier *t)
{
	size_t n = (size_t)t->total + 1, nb = (size_t)1 << t->bits;

	t->state = calloc(n, 1);
	t->doomed = calloc(n, 1);
	t->has_parent = calloc(n, 1);
	t->key = calloc(n, sizeof *t->key);
	t->parent = calloc(n, sizeof *t->parent);
	t->children = calloc(n, sizeof *t->children);
	t->tick = calloc(n, sizeof *t->tick);
	t->heap_pos = malloc(n * sizeof *t->heap_pos);
	t->next = calloc(n, sizeof *t->next);
	t->pnext = calloc(n, sizeof *t->pnext);
	t->work = calloc(n, sizeof *t->work);
	for (int c = 0; c < 2; c++) {
		t->heap[c] = calloc((size_t)t->n[c] + 1, sizeof *t->heap[c]);
		t->free[c] = calloc((size_t)t->n[c] + 1, sizeof *t->free[c]);
	}
	t->bucket = malloc(nb * sizeof *t->bucket);
	t->pbucket = malloc(nb * sizeof *t->pbucket);
	if (!t->state || !t->doomed || !t->has_parent || !t->key || !t->parent || !t->children || !t->tick ||
	    !t->heap_pos || !t->next || !t->pnext || !t->work || !t->heap[0] || !t->heap[1] || !t->free[0] ||
	    !t->free[1] || !t->bucket || !t->pbucket)
		return -ENOMEM;
	memset(t->heap_pos, 0xff, n * sizeof *t->heap_pos);
	memset(t->bucket, 0xff, nb * sizeof *t->bucket);
	memset(t->pbucket, 0xff, nb * sizeof *t->pbucket);
	return 0;
}

int kvq_tier_new(const struct kvq_layout *L, uint64_t capacity, const char *label, int fd, kvq_tier **ret,
		 char *err, size_t errlen)
{
	struct kvq_tier *t = calloc(1, sizeof *t);
	uint64_t bytes, g = 0;
	int r;

	if (!t) {
		if (fd >= 0)
			close(fd);
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	t->mem.fd = -1;
	for (int c = 0; c < 2; c++) {
		t->len[c] = kvq_blockrec_size(L, (uint32_t)c);
		t->stride[c] = (t->len[c] + 63) & ~(uint64_t)63;
	}
	r = split(L, capacity, t->stride, t->n);
	if (r < 0) {
		kvq_seterr(err, errlen, r == -EINVAL ? "host_capacity %llu holds no block record (one takes %llu bytes)"
			   : "host_capacity %llu: too many records of %llu bytes", (unsigned long long)capacity,
			   (unsigned long long)t->stride[0]);
		free(t);
		if (fd >= 0)
			close(fd);
		return r;
	}
	t->total = t->n[0] + t->n[1];
	t->first[1] = t->n[0];
	t->off[1] = t->n[0] * t->stride[0];
	while (t->bits < 30 && ((uint32_t)1 << t->bits) < t->total)
		t->bits++;
	t->bits = t->bits < 4 ? 4 : t->bits;
	if (getrandom(&t->mult, sizeof t->mult, 0) != sizeof t->mult)
		t->mult = 0x9e3779b97f4a7c15ull;
	t->mult |= 1;
	r = alloc_arrays(t);
	if (r < 0) {
		kvq_seterr(err, errlen, "out of memory for %u host-tier records", t->total);
		kvq_tier_free(t);
		if (fd >= 0)
			close(fd);
		return r;
	}
	for (int c = 0; c < 2; c++) {
		/* reversed, so that records fill from the first slot */
		for (uint32_t i = 0; i < t->n[c]; i++)
			t->free[c][i] = t->first[c] + t->n[c] - 1 - i;
		t->n_free[c] = t->n[c];
	}
	bytes = t->off[1] + (uint64_t)t->n[1] * t->stride[1];
	if (fd < 0)
		r = kvq_backend_mem_create(&kvq_backend_host, bytes, 0, label, &t->mem, err, errlen);
	else if ((r = kvq_backend_host.granularity(0, &g, err, errlen)) < 0 ||
		 (r = kvq_backend_round(bytes, g, &bytes)) < 0)
		close(fd);
	else
		r = kvq_backend_mem_adopt(&kvq_backend_host, fd, bytes, 0, &t->mem, err, errlen);
	fd = -1;
	if (r < 0) {
		kvq_tier_free(t);
		return r;
	}
	*ret = t;
	return 0;
}

void kvq_tier_free(kvq_tier *t)
{
	if (!t)
		return;
	kvq_backend_mem_destroy(&t->mem);
	free(t->state);
	free(t->doomed);
	free(t->has_parent);
	free(t->key);
	free(t->parent);
	free(t->children);
	free(t->tick);
	free(t->heap_pos);
	free(t->next);
	free(t->pnext);
	free(t->work);
	for (int c = 0; c < 2; c++) {
		free(t->heap[c]);
		free(t->free[c]);
	}
	free(t->bucket);
	free(t->pbucket);
	free(t);
}

void kvq_tier_set_leave_hook(kvq_tier *t, void (*hook)(void *arg, uint32_t r, bool gone), void *arg)
{
	t->leave_hook = hook;
	t->leave_arg = arg;
}

void kvq_tier_set_record_hook(kvq_tier *t, void (*hook)(void *arg, uint32_t r, uint32_t cls, const uint8_t *key,
							 const uint8_t *parent),
			      void *arg)
{
	t->record_hook = hook;
	t->record_arg = arg;
}

uint32_t kvq_tier_slots(const kvq_tier *t)
{
	return t->total;
}

int kvq_tier_restore(kvq_tier *t, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent)
{
	if (r >= t->total || cls_of(t, r) != cls)
		return -ERANGE;
	if (t->state[r] != R_FREE || find_any(t, key) >= 0)
		return -EINVAL;
	place(t, r, R_READY, key, parent);
	if (t->record_hook)
		t->record_hook(t->record_arg, r, cls, key, parent);
	return 0;
}

uint32_t kvq_tier_restore_end(kvq_tier *t, int (*in_pool)(void *arg, const uint8_t *key), void *arg)
{
	uint32_t dropped = 0;

	/* the free slots first: the drops below push theirs */
	for (int c = 0; c < 2; c++) {
		t->n_free[c] = 0;
		for (uint32_t i = t->n[c]; i-- > 0;)
			if (t->state[t->first[c] + i] == R_FREE)
				t->free[c][t->n_free[c]++] = t->first[c] + i;
	}
	/* a record whose parent is in neither place goes, with what is below
	 * it: every chain whole again */
	for (uint32_t r = 0; r < t->total; r++)
		if (t->state[r] == R_READY && t->has_parent[r] && find_any(t, t->parent[r]) < 0 &&
		    !in_pool(arg, t->parent[r])) {
			dropped += kvq_tier_drop_under(t, t->key[r]) + 1;
			rec_free(t, r);
		}
	return dropped;
}
