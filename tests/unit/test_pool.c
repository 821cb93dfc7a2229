/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Slot bookkeeping (daemon/pool.h): allocation to exhaustion in both classes
 * with the named error; all-or-nothing batches (a refused batch changes no
 * counter but the failure count, and no out-parameter); the reservation
 * promise (sealing works in a pool filled by everything else); release frees
 * the open slot and its reservation; references and validation; eviction
 * through an attached cache (only the shortfall, never a referenced block,
 * nothing when the batch cannot fit); and a long random run against a
 * reference model of every slot's state, with every invariant checked after
 * every step.
 *
 * Cost is reviewed, not timed: every pool operation pops or pushes its ids
 * on a stack; only kvq_pool_new() loops over the slots.
 */
#include <errno.h>
#include <string.h>

#include "layout.h"
#include "pool.h"
#include "../tap.h"

static int stats_eq(const struct kvq_pool_stats *a, const struct kvq_pool_stats *b)
{
	return memcmp(a, b, sizeof *a) == 0;
}

static struct kvq_pool *new_pool(uint32_t n_sealed, uint32_t n_open)
{
	struct kvq_pool *p = NULL;

	if (kvq_pool_new(n_sealed, n_open, 0, &p) != 0) {
		fprintf(stderr, "kvq_pool_new(%u, %u) failed\n", n_sealed, n_open);
		abort();
	}
	return p;
}

/* ids[n] all < lim and pairwise distinct */
static int distinct_in_range(const uint32_t *ids, uint32_t n, uint32_t lim)
{
	for (uint32_t i = 0; i < n; i++) {
		if (ids[i] >= lim)
			return 0;
		for (uint32_t j = 0; j < i; j++)
			if (ids[i] == ids[j])
				return 0;
	}
	return 1;
}

/* ------------------------------------------------------------ a fake cache */

/* A cache that evicts its unreferenced blocks in the order they were
 * inserted: enough to test the pool's side of the contract. */
#define FAKE_MAX 1024
struct fake_cache {
	struct kvq_pool *pool;
	uint32_t n_sealed;        /* the pool's: its first sink block id */
	uint32_t ids[FAKE_MAX];   /* cached ids, insertion order */
	uint32_t n;
	uint8_t held[FAKE_MAX];   /* by block id */
	uint32_t victims[FAKE_MAX];
	uint32_t n_victims;
	int bad;                  /* held() told something inconsistent */
};

static void fake_held(void *ctx, uint32_t id, int held)
{
	struct fake_cache *f = ctx;

	if (id >= FAKE_MAX || f->held[id] == !!held)
		f->bad = 1;
	else
		f->held[id] = (uint8_t)!!held;
}

/* Class of block b: 0 sealed, 1 sink (pool.h). */
static int fake_cls(const struct fake_cache *f, uint32_t b)
{
	return b >= f->n_sealed;
}

static uint32_t fake_evictable(void *ctx, int cls)
{
	struct fake_cache *f = ctx;
	uint32_t n = 0;

	for (uint32_t i = 0; i < f->n; i++)
		n += !f->held[f->ids[i]] && fake_cls(f, f->ids[i]) == cls;
	return n;
}

/* Evicts in insertion order, either class, until count of cls went. */
static uint32_t fake_evict(void *ctx, int cls, uint32_t count)
{
	struct fake_cache *f = ctx;
	uint32_t done = 0, i = 0;

	while (done < count && i < f->n) {
		uint32_t b = f->ids[i];

		if (f->held[b]) {
			i++;
			continue;
		}
		done += fake_cls(f, b) == cls;
		if (kvq_pool_cache_evicted(f->pool, b) != 0)
			f->bad = 1;
		f->victims[f->n_victims++ % FAKE_MAX] = b;
		memmove(&f->ids[i], &f->ids[i + 1], (f->n - i - 1) * sizeof f->ids[0]);
		f->n--;
	}
	return done;
}

static void fake_attach(struct fake_cache *f, struct kvq_pool *p)
{
	struct kvq_pool_cache c = {
		.ctx = f, .held = fake_held, .evictable = fake_evictable, .evict = fake_evict,
	};

	struct kvq_pool_stats st;

	memset(f, 0, sizeof *f);
	f->pool = p;
	kvq_pool_stats(p, &st);   /* before the cache is attached: no call into it */
	f->n_sealed = st.n_sealed;
	kvq_pool_set_cache(p, &c);
}

static int fake_insert(struct fake_cache *f, uint32_t id)
{
	int r = kvq_pool_cache_insert(f->pool, id);

	if (r == 0) {
		f->ids[f->n++] = id;
		f->held[id] = 1;
	}
	return r;
}

/* ------------------------------------------------------------ exhaustion */

static void test_exhaustion(void)
{
	struct kvq_pool *p = new_pool(8, 4);
	struct kvq_pool_stats st;
	uint32_t o[8], s[8], ids[8], one;

	kvq_pool_stats(p, &st);
	ok(st.n_sealed == 8 && st.n_open == 4 && st.sealed_free == 8 && st.open_free == 4 && st.open_used == 0,
	   "new pool: 8 sealed and 4 open, all free");
	ok(kvq_pool_alloc_open(p, 4, o, s) == 0, "4 open slots granted");
	ok(distinct_in_range(o, 4, 4) && distinct_in_range(s, 4, 8), "open ids distinct in [0,4), reserved sealed in [0,8)");
	ok(kvq_pool_alloc_open(p, 1, &one, NULL) == -ENOSPC, "open class exhausted: -ENOSPC");
	ok(kvq_pool_alloc_sealed(p, 4, ids) == 0, "the 4 unreserved sealed slots granted");
	memcpy(ids + 4, s, sizeof s[0] * 4);
	ok(distinct_in_range(ids, 8, 8), "sealed and reserved ids together are all 8, once each");
	ok(kvq_pool_alloc_sealed(p, 1, &one) == -ENOSPC, "sealed class exhausted: -ENOSPC");
	kvq_pool_stats(p, &st);
	ok(st.sealed_free == 0 && st.sealed_reserved == 4 && st.sealed_private == 4 && st.open_used == 4 &&
	   st.alloc_failures == 2 && st.refs == 4,
	   "stats: 0 free, 4 reserved, 4 private, 4 open used, 2 failures, 4 refs");
	kvq_pool_free(p);

	/* free open slots are no use without sealed room to reserve */
	p = new_pool(4, 8);
	ok(kvq_pool_alloc_sealed(p, 2, ids) == 0 && kvq_pool_alloc_open(p, 2, o, NULL) == 0,
	   "4 sealed: 2 sealed and 2 open granted");
	ok(kvq_pool_alloc_open(p, 1, o + 2, NULL) == -ENOSPC, "open slots free but no sealed slot to reserve: -ENOSPC");
	ok(kvq_pool_alloc_sealed(p, 0, NULL) == 0 && kvq_pool_alloc_open(p, 0, NULL, NULL) == 0,
	   "count 0 succeeds and needs no room");
	kvq_pool_free(p);

	ok(kvq_pool_new(KVQ_MAX_SLOTS + 1, 1, 0, &p) == -EINVAL && kvq_pool_new(1, KVQ_MAX_SLOTS + 1, 0, &p) == -EINVAL,
	   "more than KVQ_MAX_SLOTS slots in a class: -EINVAL");
	p = new_pool(0, 0);
	ok(kvq_pool_alloc_sealed(p, 1, &one) == -ENOSPC && kvq_pool_alloc_open(p, 1, &one, NULL) == -ENOSPC,
	   "an empty pool refuses with -ENOSPC");
	kvq_pool_free(p);
	kvq_pool_free(NULL);
}

/* --------------------------------------------------------- all or nothing */

static void test_all_or_nothing(void)
{
	struct kvq_pool *p = new_pool(10, 10);
	struct kvq_pool_stats before, after;
	uint32_t ids[16], o[16], s[16];
	int untouched = 1;

	ok(kvq_pool_alloc_sealed(p, 7, ids) == 0, "7 of 10 sealed granted");
	kvq_pool_stats(p, &before);
	for (int i = 0; i < 16; i++)
		ids[i] = o[i] = s[i] = 0xdeadbeef;
	ok(kvq_pool_alloc_sealed(p, 4, ids) == -ENOSPC, "4 more sealed (3 free): -ENOSPC");
	ok(kvq_pool_alloc_open(p, 4, o, s) == -ENOSPC, "4 open (3 sealed to reserve): -ENOSPC");
	ok(kvq_pool_alloc_open(p, 11, o, s) == -ENOSPC, "11 open (10 exist): -ENOSPC");
	kvq_pool_stats(p, &after);
	ok(after.alloc_failures == before.alloc_failures + 3, "three failures counted");
	after.alloc_failures = before.alloc_failures;
	ok(stats_eq(&before, &after), "nothing else changed");
	for (int i = 0; i < 16; i++)
		untouched &= ids[i] == 0xdeadbeef && o[i] == 0xdeadbeef && s[i] == 0xdeadbeef;
	ok(untouched, "out-parameters untouched on failure");
	ok(kvq_pool_alloc_open(p, 3, o, s) == 0, "exactly 3 open still fit");
	kvq_pool_stats(p, &after);
	ok(after.sealed_free == 0 && after.open_used == 3 && after.sealed_reserved == 3, "pool now full");
	kvq_pool_free(p);
}

/* ------------------------------------------------------------ reservation */

static void test_reservation(void)
{
	struct kvq_pool *p = new_pool(6, 3);
	struct kvq_pool_stats st;
	uint32_t o[3], s[3], ids[3], sid, one, r;
	int good = 1;

	ok(kvq_pool_alloc_open(p, 3, o, s) == 0 && kvq_pool_alloc_sealed(p, 3, ids) == 0,
	   "3 open (3 sealed reserved) and 3 sealed: everything taken");
	ok(kvq_pool_alloc_sealed(p, 1, &one) == -ENOSPC, "no sealed slot left for anyone else");
	for (int i = 0; i < 3; i++) {
		good &= kvq_pool_open_reserved(p, o[i], &r) == 0 && r == s[i];
		good &= kvq_pool_seal(p, o[i], &sid) == 0 && sid == s[i];
		good &= kvq_pool_state(p, sid) == KVQ_POOL_PRIVATE && kvq_pool_refs(p, sid) == 1;
		good &= kvq_pool_check_open(p, o[i]) == -EINVAL;
	}
	ok(good, "each seal succeeds in the full pool, returns the reserved id, a private block with one ref");
	kvq_pool_stats(p, &st);
	ok(st.sealed_private == 6 && st.sealed_reserved == 0 && st.open_used == 0 && st.open_free == 3 &&
	   st.sealed_free == 0 && st.refs == 6,
	   "after sealing: 6 private, open slots free, no sealed slot free");
	ok(kvq_pool_alloc_open(p, 1, &one, NULL) == -ENOSPC, "open slot free but nothing to reserve: -ENOSPC");
	ok(kvq_pool_seal(p, o[0], &sid) == -EINVAL, "sealing a sealed (freed) open slot: -EINVAL");
	ok(kvq_pool_seal(p, 3, &sid) == -ERANGE, "sealing open id 3 of 3: -ERANGE");
	kvq_pool_free(p);
}

/* ---------------------------------------------------------------- release */

static void test_release(void)
{
	struct kvq_pool *p = new_pool(4, 4);
	struct kvq_pool_stats st0, st;
	uint32_t o = 0, s = 0, b = 0, sid = 0;

	kvq_pool_stats(p, &st0);
	ok(kvq_pool_alloc_open(p, 1, &o, &s) == 0 && kvq_pool_state(p, s) == KVQ_POOL_RESERVED,
	   "open slot granted, its sealed slot reserved");
	ok(kvq_pool_check_sealed(p, s, KVQ_POOL_SEALED_BLOCK) == -EINVAL && kvq_pool_ref(p, s) == -EINVAL,
	   "a reserved slot is no block: cannot be referenced");
	ok(kvq_pool_release_open(p, o) == 0, "released");
	kvq_pool_stats(p, &st);
	ok(stats_eq(&st0, &st), "stats back to a fresh pool's");
	ok(kvq_pool_state(p, s) == KVQ_POOL_FREE && kvq_pool_check_open(p, o) == -EINVAL,
	   "both the open slot and its reservation are free");
	ok(kvq_pool_release_open(p, o) == -EINVAL, "second release: -EINVAL");
	ok(kvq_pool_release_open(p, 4) == -ERANGE && kvq_pool_release_open(p, UINT32_MAX) == -ERANGE,
	   "release of ids out of range: -ERANGE");
	ok(kvq_pool_alloc_open(p, 4, (uint32_t[4]){0}, NULL) == 0, "all 4 open slots can be granted again");

	kvq_pool_free(p);

	/* references on private blocks */
	p = new_pool(4, 4);
	ok(kvq_pool_alloc_sealed(p, 1, &b) == 0 && kvq_pool_ref(p, b) == 0 && kvq_pool_refs(p, b) == 2,
	   "a private block referenced twice");
	ok(kvq_pool_unref(p, b) == 0 && kvq_pool_state(p, b) == KVQ_POOL_PRIVATE, "one unref: still private");
	ok(kvq_pool_unref(p, b) == 0 && kvq_pool_state(p, b) == KVQ_POOL_FREE, "last unref frees it");
	ok(kvq_pool_unref(p, b) == -EINVAL && kvq_pool_ref(p, b) == -EINVAL, "ref/unref of a free slot: -EINVAL");
	ok(kvq_pool_ref(p, 4) == -ERANGE && kvq_pool_unref(p, 4) == -ERANGE && kvq_pool_state(p, 4) == -ERANGE &&
	   kvq_pool_check_sealed(p, 4, ~0u) == -ERANGE,
	   "sealed id 4 of 4: -ERANGE everywhere");
	ok(kvq_pool_alloc_open(p, 1, &o, NULL) == 0 && kvq_pool_seal(p, o, &sid) == 0 &&
	   kvq_pool_cache_evicted(p, sid) == -EINVAL && kvq_pool_cache_insert(p, sid) == 0 &&
	   kvq_pool_cache_insert(p, sid) == -EINVAL,
	   "cache side: only private blocks enter, only cached ones leave");
	ok(kvq_pool_cache_evicted(p, sid) == -EINVAL, "a cached block with a reference cannot be evicted");
	kvq_pool_stats(p, &st);
	ok(st.sealed_cached == 1 && st.cached_referenced == 1 && st.sealed_private == 0, "one cached referenced block");
	kvq_pool_free(p);
}

/* ---------------------------------------------------------------- eviction */

static void test_eviction(void)
{
	struct kvq_pool *p = new_pool(8, 4);
	struct fake_cache *f = calloc(1, sizeof *f);
	struct kvq_pool_stats before, after;
	uint32_t ids[8], o[4];

	fake_attach(f, p);
	kvq_pool_alloc_sealed(p, 8, ids);
	for (int i = 0; i < 8; i++)
		fake_insert(f, ids[i]);
	/* release 0..4 (evictable); 5..7 stay referenced */
	for (int i = 0; i < 5; i++)
		kvq_pool_unref(p, ids[i]);
	kvq_pool_stats(p, &before);
	ok(before.sealed_free == 0 && before.sealed_cached == 8 && before.cached_referenced == 3 &&
	   before.sealed_evictable == 5 && !f->bad,
	   "8 cached blocks, 3 referenced, 5 evictable, held() told each release");
	ok(kvq_pool_alloc_sealed(p, 6, ids) == -ENOSPC && kvq_pool_alloc_open(p, 6, o, NULL) == -ENOSPC,
	   "6 blocks with 5 evictable: -ENOSPC");
	kvq_pool_stats(p, &after);
	ok(after.evictions == 0 && f->n == 8 && f->n_victims == 0, "the refusal evicted nothing");
	ok(kvq_pool_alloc_open(p, 2, o, ids) == 0, "2 open slots fit by evicting");
	kvq_pool_stats(p, &after);
	ok(after.evictions == 2 && f->n_victims == 2 && after.sealed_evictable == 3 && after.sealed_free == 0,
	   "exactly the shortfall (2) evicted");
	ok((f->victims[0] == ids[0] && f->victims[1] == ids[1]) || (f->victims[0] == ids[1] && f->victims[1] == ids[0]),
	   "the slots reserved are the two evicted");
	ok(kvq_pool_refs(p, f->victims[0]) == 0 && kvq_pool_refs(p, f->victims[1]) == 0 &&
	   kvq_pool_state(p, f->victims[0]) == KVQ_POOL_RESERVED, "victims were unreferenced, now reserved");
	ok(kvq_pool_alloc_sealed(p, 3, ids) == 0 && f->n == 3 && fake_evictable(f, 0) == 0,
	   "3 more sealed take the last evictable blocks");
	ok(kvq_pool_alloc_sealed(p, 1, ids) == -ENOSPC, "only referenced blocks left: -ENOSPC");
	for (uint32_t i = 0; i < f->n; i++)
		ok(kvq_pool_state(p, f->ids[i]) == KVQ_POOL_CACHED && kvq_pool_refs(p, f->ids[i]) == 1,
		   "referenced block %u still cached", f->ids[i]);
	ok(!f->bad, "held() was consistent throughout");
	kvq_pool_set_cache(p, NULL);
	kvq_pool_free(p);
	free(f);
}

/* Sink slots: their own id space after the sealed one, their own free
 * slots, the states and references of sealed blocks, eviction by class. */
static void test_sinks(void)
{
	struct kvq_pool *p;
	struct fake_cache *f = calloc(1, sizeof *f);
	struct kvq_pool_stats st;
	uint32_t sk[6], sl[6], extra, o[2];

	if (!f || kvq_pool_new(6, 2, 3, &p) != 0) {
		ok(0, "a pool of 6 sealed, 2 open, 3 sink slots");
		free(f);
		return;
	}
	fake_attach(f, p);
	kvq_pool_stats(p, &st);
	ok(st.n_sink == 3 && st.sink_free == 3 && st.sealed_free == 6 && st.n_sealed == 6,
	   "3 sink slots, all free, beside 6 sealed");
	ok(kvq_pool_alloc_sink(p, 3, sk) == 0 && sk[0] >= 6 && sk[1] >= 6 && sk[2] >= 6 && sk[0] < 9 &&
	   sk[1] < 9 && sk[2] < 9 && sk[0] != sk[1] && sk[1] != sk[2] && sk[0] != sk[2],
	   "sinks are block ids 6 .. 8, distinct");
	kvq_pool_stats(p, &st);
	ok(st.sink_free == 0 && st.sink_private == 3 && st.sealed_free == 6 && st.sealed_private == 0 &&
	   kvq_pool_state(p, sk[0]) == KVQ_POOL_PRIVATE && kvq_pool_refs(p, sk[0]) == 1 && st.sink_refs == 3 &&
	   st.refs == 0, "taken as private blocks with one reference (counted as sink references); the sealed class "
	   "untouched");
	ok(kvq_pool_alloc_sink(p, 1, &extra) == -ENOSPC && kvq_pool_alloc_sealed(p, 6, sl) == 0,
	   "a fourth sink: -ENOSPC; the 6 sealed slots still all there");
	/* chains: sink sk[i] then sealed sl[2i], sl[2i+1], all cached, released */
	for (int i = 0; i < 3; i++) {
		fake_insert(f, sk[i]);
		fake_insert(f, sl[2 * i]);
		fake_insert(f, sl[2 * i + 1]);
	}
	for (int i = 0; i < 3; i++)
		kvq_pool_unref(p, sk[i]);
	for (int i = 0; i < 6; i++)
		kvq_pool_unref(p, sl[i]);
	kvq_pool_ref(p, sk[2]);   /* one chain's sink stays in use */
	kvq_pool_stats(p, &st);
	ok(st.sink_cached == 3 && st.sink_referenced == 1 && st.sink_evictable == 2 && st.sealed_cached == 6 &&
	   st.sealed_evictable == 6 && st.cached_referenced == 0 && st.sink_refs == 1 && st.refs == 0,
	   "3 cached sinks (1 referenced, 2 evictable), 6 cached sealed (the counts keep the classes apart)");
	ok(kvq_pool_alloc_sink(p, 3, sk + 3) == -ENOSPC && f->n_victims == 0,
	   "3 sinks with 2 evictable: -ENOSPC, nothing evicted");
	ok(kvq_pool_alloc_sink(p, 1, &extra) == 0 && extra == sk[0] && f->n_victims == 1,
	   "a sink short evicts until one sink went (the oldest)");
	ok(kvq_pool_alloc_open(p, 2, o, sl) == 0, "2 open slots reserve sealed slots");
	kvq_pool_stats(p, &st);
	ok(st.sealed_free == 0 && st.sealed_cached == 4 && st.sink_cached == 2 && st.sink_evictable == 1 &&
	   st.evictions == 3, "sealed slots came from eviction too (3 evicted in all, 4 sealed cached)");
	kvq_pool_unref(p, extra);
	kvq_pool_stats(p, &st);
	ok(st.sink_free == 1 && st.sink_private == 0 && kvq_pool_state(p, extra) == KVQ_POOL_FREE,
	   "a private sink's last reference frees its slot to the sink class");
	ok(kvq_pool_check_sealed(p, 9, KVQ_POOL_SEALED_BLOCK) == -ERANGE && kvq_pool_refs(p, 9) == 0,
	   "block id n_sealed + n_sink is out of range");
	ok(!f->bad, "held() was consistent throughout");
	kvq_pool_set_cache(p, NULL);
	kvq_pool_free(p);
	free(f);
}

/* ---------------------------------------------- random run against a model */

#define RS 48   /* sealed slots */
#define RO 16   /* open slots */

struct model {
	uint8_t st[RS];          /* enum kvq_pool_state */
	uint32_t refs[RS];
	int32_t res[RO];         /* reserved sealed id, -1 when free */
	uint64_t failures, evictions;
};

struct bad {
	int n;
	int step;
	char what[160];
};

__attribute__((format(printf, 4, 5)))
static void expect(struct bad *b, int step, int cond, const char *fmt, ...)
{
	va_list ap;

	if (cond)
		return;
	if (b->n++ == 0) {
		b->step = step;
		va_start(ap, fmt);
		vsnprintf(b->what, sizeof b->what, fmt, ap);
		va_end(ap);
	}
}

static uint32_t model_count(const struct model *m, int state)
{
	uint32_t n = 0;

	for (int i = 0; i < RS; i++)
		n += m->st[i] == state;
	return n;
}

static uint32_t model_evictable(const struct model *m)
{
	uint32_t n = 0;

	for (int i = 0; i < RS; i++)
		n += m->st[i] == KVQ_POOL_CACHED && m->refs[i] == 0;
	return n;
}

/* every invariant, checked after each step */
static void check_all(struct kvq_pool *p, struct fake_cache *f, const struct model *m, struct bad *b, int step)
{
	struct kvq_pool_stats st;
	uint64_t refs = 0;
	uint32_t used = 0, cref = 0;
	uint8_t owner[RS] = {0};

	for (uint32_t i = 0; i < RS; i++) {
		expect(b, step, kvq_pool_state(p, i) == m->st[i], "sealed %u state %d, model %d", i,
		       kvq_pool_state(p, i), m->st[i]);
		expect(b, step, kvq_pool_refs(p, i) == m->refs[i], "sealed %u refs %u, model %u", i,
		       kvq_pool_refs(p, i), m->refs[i]);
		expect(b, step, m->st[i] != KVQ_POOL_PRIVATE || m->refs[i] > 0, "private %u without refs", i);
		expect(b, step, m->st[i] == KVQ_POOL_PRIVATE || m->st[i] == KVQ_POOL_CACHED || m->refs[i] == 0,
		       "sealed %u: refs on a non-block", i);
		expect(b, step, m->st[i] == KVQ_POOL_CACHED || !f->held[i], "cache holds non-cached %u", i);
		if (m->st[i] == KVQ_POOL_CACHED)
			expect(b, step, f->held[i] == (m->refs[i] > 0), "cache's held[%u] %d, refs %u", i, f->held[i],
			       m->refs[i]);
		refs += m->refs[i];
		cref += m->st[i] == KVQ_POOL_CACHED && m->refs[i] > 0;
	}
	for (uint32_t o = 0; o < RO; o++) {
		uint32_t r;

		if (m->res[o] < 0) {
			expect(b, step, kvq_pool_check_open(p, o) == -EINVAL, "open %u should be free", o);
			continue;
		}
		used++;
		expect(b, step, kvq_pool_open_reserved(p, o, &r) == 0 && r == (uint32_t)m->res[o],
		       "open %u reservation", o);
		expect(b, step, m->st[m->res[o]] == KVQ_POOL_RESERVED, "open %u reserves a non-reserved slot", o);
		expect(b, step, !owner[m->res[o]]++, "sealed %d reserved twice", m->res[o]);
	}
	kvq_pool_stats(p, &st);
	expect(b, step,
	       st.sealed_free == model_count(m, KVQ_POOL_FREE) &&
	       st.sealed_reserved == model_count(m, KVQ_POOL_RESERVED) &&
	       st.sealed_private == model_count(m, KVQ_POOL_PRIVATE) &&
	       st.sealed_cached == model_count(m, KVQ_POOL_CACHED) && st.cached_referenced == cref,
	       "state counters");
	expect(b, step, st.sealed_free + st.sealed_reserved + st.sealed_private + st.sealed_cached == RS,
	       "sealed counters sum to capacity");
	expect(b, step, st.open_used == used && st.open_free == RO - used && st.sealed_reserved == used,
	       "open counters (used %u)", used);
	expect(b, step, st.refs == refs && st.sealed_evictable == model_evictable(m), "refs and evictable");
	expect(b, step, st.evictions == m->evictions && st.alloc_failures == m->failures,
	       "evictions %llu/%llu failures %llu/%llu", (unsigned long long)st.evictions,
	       (unsigned long long)m->evictions, (unsigned long long)st.alloc_failures,
	       (unsigned long long)m->failures);
	expect(b, step, !f->bad, "cache told something inconsistent");
}

/* the model's part of an allocation that may evict: mark the cache's victims free */
static void model_take_victims(struct model *m, struct fake_cache *f, uint32_t before, struct bad *b, int step)
{
	for (uint32_t v = before; v < f->n_victims; v++) {
		uint32_t id = f->victims[v % FAKE_MAX];

		expect(b, step, m->st[id] == KVQ_POOL_CACHED && m->refs[id] == 0, "victim %u not evictable", id);
		m->st[id] = KVQ_POOL_FREE;
		m->evictions++;
	}
}

static int32_t pick(const struct model *m, int state, int need_refs)
{
	int32_t c[RS];
	int n = 0;

	for (int i = 0; i < RS; i++)
		if (m->st[i] == state && (!need_refs || m->refs[i] > 0))
			c[n++] = i;
	return n ? c[tap_rand() % (uint64_t)n] : -1;
}

static int32_t pick_open(const struct model *m, int used)
{
	int32_t c[RO];
	int n = 0;

	for (int i = 0; i < RO; i++)
		if ((m->res[i] >= 0) == used)
			c[n++] = i;
	return n ? c[tap_rand() % (uint64_t)n] : -1;
}

static void test_random(void)
{
	struct kvq_pool *p = new_pool(RS, RO);
	struct fake_cache *f = calloc(1, sizeof *f);
	struct model m;
	struct bad b = {0};
	const int steps = 20000;
	int n_ok[10] = {0};

	memset(&m, 0, sizeof m);
	for (int i = 0; i < RO; i++)
		m.res[i] = -1;
	fake_attach(f, p);
	for (int step = 0; step < steps; step++) {
		int op = (int)(tap_rand() % 10);
		uint32_t k = (uint32_t)(tap_rand() % 6), ids[8], sids[8], v0 = f->n_victims;
		uint32_t room = model_count(&m, KVQ_POOL_FREE) + model_evictable(&m);
		int32_t x;
		int r;

		switch (op) {
		case 0: /* alloc open */
		case 1: {
			uint32_t free_open = 0;

			for (int i = 0; i < RO; i++)
				free_open += m.res[i] < 0;
			r = kvq_pool_alloc_open(p, k, ids, sids);
			if (k > free_open || k > room) {
				expect(&b, step, r == -ENOSPC, "alloc_open(%u) gave %d, want -ENOSPC", k, r);
				m.failures++;
				break;
			}
			expect(&b, step, r == 0, "alloc_open(%u) gave %d", k, r);
			model_take_victims(&m, f, v0, &b, step);
			for (uint32_t i = 0; r == 0 && i < k; i++) {
				expect(&b, step, ids[i] < RO && m.res[ids[i]] < 0, "open id %u not free", ids[i]);
				expect(&b, step, sids[i] < RS && m.st[sids[i]] == KVQ_POOL_FREE, "sealed id %u not free",
				       sids[i]);
				if (ids[i] >= RO || sids[i] >= RS)
					break;
				m.res[ids[i]] = (int32_t)sids[i];
				m.st[sids[i]] = KVQ_POOL_RESERVED;
			}
			n_ok[op] += r == 0;
			break;
		}
		case 2: /* alloc sealed */
			r = kvq_pool_alloc_sealed(p, k, ids);
			if (k > room) {
				expect(&b, step, r == -ENOSPC, "alloc_sealed(%u) gave %d, want -ENOSPC", k, r);
				m.failures++;
				break;
			}
			expect(&b, step, r == 0, "alloc_sealed(%u) gave %d", k, r);
			model_take_victims(&m, f, v0, &b, step);
			for (uint32_t i = 0; r == 0 && i < k; i++) {
				expect(&b, step, ids[i] < RS && m.st[ids[i]] == KVQ_POOL_FREE, "sealed id %u not free",
				       ids[i]);
				if (ids[i] >= RS)
					break;
				m.st[ids[i]] = KVQ_POOL_PRIVATE;
				m.refs[ids[i]] = 1;
			}
			n_ok[op] += r == 0;
			break;
		case 3: /* seal */
			x = pick_open(&m, 1);
			if (x < 0)
				break;
			r = kvq_pool_seal(p, (uint32_t)x, &ids[0]);
			expect(&b, step, r == 0 && ids[0] == (uint32_t)m.res[x], "seal(%d) gave %d", x, r);
			m.st[m.res[x]] = KVQ_POOL_PRIVATE;
			m.refs[m.res[x]] = 1;
			m.res[x] = -1;
			n_ok[op]++;
			break;
		case 4: /* release open */
			x = pick_open(&m, 1);
			if (x < 0)
				break;
			r = kvq_pool_release_open(p, (uint32_t)x);
			expect(&b, step, r == 0, "release_open(%d) gave %d", x, r);
			m.st[m.res[x]] = KVQ_POOL_FREE;
			m.res[x] = -1;
			n_ok[op]++;
			break;
		case 5: /* ref a block */
			x = pick(&m, tap_rand() & 1 ? KVQ_POOL_PRIVATE : KVQ_POOL_CACHED, 0);
			if (x < 0)
				break;
			r = kvq_pool_ref(p, (uint32_t)x);
			expect(&b, step, r == 0, "ref(%d) gave %d", x, r);
			m.refs[x]++;
			n_ok[op]++;
			break;
		case 6: /* unref a block */
		case 7:
			x = pick(&m, tap_rand() & 1 ? KVQ_POOL_PRIVATE : KVQ_POOL_CACHED, 1);
			if (x < 0)
				break;
			r = kvq_pool_unref(p, (uint32_t)x);
			expect(&b, step, r == 0, "unref(%d) gave %d", x, r);
			if (--m.refs[x] == 0 && m.st[x] == KVQ_POOL_PRIVATE)
				m.st[x] = KVQ_POOL_FREE;
			n_ok[op]++;
			break;
		case 8: /* a private block enters the cache */
			x = pick(&m, KVQ_POOL_PRIVATE, 0);
			if (x < 0)
				break;
			r = fake_insert(f, (uint32_t)x);
			expect(&b, step, r == 0, "cache_insert(%d) gave %d", x, r);
			m.st[x] = KVQ_POOL_CACHED;
			n_ok[op]++;
			break;
		case 9: { /* bad requests change nothing */
			uint32_t id = (uint32_t)(tap_rand() % (RS + 4)), oid = (uint32_t)(tap_rand() % (RO + 4));
			int want_s = id >= RS ? -ERANGE : -EINVAL, want_o = oid >= RO ? -ERANGE : -EINVAL;

			if (id >= RS || m.st[id] == KVQ_POOL_FREE || m.st[id] == KVQ_POOL_RESERVED) {
				expect(&b, step, kvq_pool_ref(p, id) == want_s, "ref of bad sealed %u", id);
				expect(&b, step, kvq_pool_unref(p, id) == want_s, "unref of bad sealed %u", id);
				expect(&b, step, kvq_pool_check_sealed(p, id, KVQ_POOL_SEALED_BLOCK) == want_s,
				       "check of bad sealed %u", id);
				n_ok[op]++;
			}
			if (oid >= RO || m.res[oid] < 0) {
				expect(&b, step, kvq_pool_seal(p, oid, &ids[0]) == want_o, "seal of bad open %u", oid);
				expect(&b, step, kvq_pool_release_open(p, oid) == want_o, "release of bad open %u", oid);
			}
			break;
		}
		}
		check_all(p, f, &m, &b, step);
		if (b.n)
			break;   /* the first fault is the one worth reading */
	}
	diag("random run: alloc_open %d, alloc_sealed %d, seal %d, release %d, ref %d, unref %d, cache %d, bad %d; "
	     "evictions %llu, failures %llu",
	     n_ok[0] + n_ok[1], n_ok[2], n_ok[3], n_ok[4], n_ok[5], n_ok[6] + n_ok[7], n_ok[8], n_ok[9],
	     (unsigned long long)m.evictions, (unsigned long long)m.failures);
	ok(b.n == 0, "%d steps: pool matches the model after every step%s%s", steps, b.n ? "; first fault: " : "",
	   b.what);
	if (b.n)
		diag("first fault at step %d", b.step);
	ok(m.evictions > 0 && m.failures > 0 && n_ok[3] > 0 && n_ok[8] > 0,
	   "the run exercised eviction, refusals, seals and caching");

	/* drain: everything back to free, every id once */
	for (int o = 0; o < RO; o++)
		if (m.res[o] >= 0)
			kvq_pool_release_open(p, (uint32_t)o);
	for (int i = 0; i < RS; i++)
		while (kvq_pool_refs(p, (uint32_t)i) > 0)
			kvq_pool_unref(p, (uint32_t)i);
	{
		uint32_t all[RS], got;
		struct kvq_pool_stats st;

		kvq_pool_stats(p, &st);
		ok(st.sealed_evictable + st.sealed_free == RS && st.open_free == RO && st.refs == 0,
		   "drained: every sealed slot free or evictable, every open slot free");
		ok(kvq_pool_alloc_sealed(p, RS, all) == 0 && distinct_in_range(all, RS, RS),
		   "all %d sealed ids granted once each (evicting the rest)", RS);
		ok(kvq_pool_alloc_sealed(p, 1, &got) == -ENOSPC, "and none more");
	}
	kvq_pool_set_cache(p, NULL);
	kvq_pool_free(p);
	free(f);
}

int main(void)
{
	tap_seed();
	test_exhaustion();
	test_all_or_nothing();
	test_reservation();
	test_release();
	test_eviction();
	test_sinks();
	test_random();
	return done_testing();
}
