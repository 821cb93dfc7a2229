/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/lease.c: the lease maps against a plain array, under random churn
 * (insertions, removals with backward shifts, growth); holds taken and given
 * back in a pool and a lease together, and a dropped lease leaving the pool
 * as it found it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "lease.h"

#define IDS 4096u

/* Pool and lease agree: every reference and used open slot is the lease's. */
static int balanced(const kvq_pool *p, const kvq_lease *l)
{
	struct kvq_pool_stats st;
	uint32_t pos = 0, id, n;
	uint64_t refs = 0;

	kvq_pool_stats(p, &st);
	while (kvq_lease_next_sealed(l, &pos, &id, &n)) {
		if (kvq_pool_refs(p, id) != n)
			return 0;
		refs += n;
	}
	return st.refs == refs && st.open_used == kvq_lease_n_open(l);
}

static void holds(void)
{
	struct kvq_lease_dropped d;
	struct kvq_pool_stats st;
	uint32_t open[2], resv[2], sealed[2];
	kvq_pool *p = NULL;
	kvq_lease *l = NULL;

	ok(kvq_pool_new(8, 4, 0, &p) == 0 && kvq_lease_new(&l) == 0, "a pool of 8 + 4 slots and a lease");
	kvq_pool_alloc_open(p, 2, open, resv);
	kvq_pool_alloc_sealed(p, 2, sealed);
	ok(kvq_lease_take(l, p, KVQ_LEASE_OPEN, open[0], 1) == 0 &&
	   kvq_lease_take(l, p, KVQ_LEASE_OPEN, open[1], 1) == 0 &&
	   kvq_lease_take(l, p, KVQ_LEASE_GRANTED, sealed[0], 1) == 0 &&
	   kvq_lease_take(l, p, KVQ_LEASE_GRANTED, sealed[1], 1) == 0 && balanced(p, l),
	   "granted slots taken: the pool is not asked twice, pool and lease agree");
	ok(kvq_lease_take(l, p, KVQ_LEASE_REF, sealed[0], 3) == 0 && kvq_pool_refs(p, sealed[0]) == 4 &&
	   kvq_lease_sealed(l, sealed[0]) == 4 && balanced(p, l), "three more references, in both");
	ok(kvq_lease_take(l, p, KVQ_LEASE_REF, 7, 1) == -EINVAL && !kvq_lease_sealed(l, 7) && balanced(p, l),
	   "a reference on a free slot: the pool's -EINVAL, nothing taken");
	ok(kvq_lease_give(l, p, KVQ_LEASE_REF, sealed[1], 2) == -EINVAL && kvq_pool_refs(p, sealed[1]) == 1 &&
	   balanced(p, l), "giving back more than held: -EINVAL, nothing changed");
	ok(kvq_lease_give(l, p, KVQ_LEASE_SEALING, open[0], 1) == 0 &&
	   kvq_lease_take(l, p, KVQ_LEASE_GRANTED, resv[0], 1) == 0 &&
	   kvq_pool_state(p, resv[0]) == KVQ_POOL_PRIVATE && !kvq_lease_open_has(l, open[0]) && balanced(p, l),
	   "sealing: the open slot leaves, its reservation comes back as a held block");
	ok(kvq_lease_take(l, p, KVQ_LEASE_SEALING, open[1], 1) == -EINVAL && kvq_lease_open_has(l, open[1]),
	   "sealing is a give only");
	ok(kvq_lease_give(l, p, KVQ_LEASE_REF, sealed[0], 1) == 0 && kvq_pool_refs(p, sealed[0]) == 3 &&
	   balanced(p, l), "one reference given back, in both");
	kvq_lease_drop(l, p, &d);
	kvq_pool_stats(p, &st);
	ok(d.open == 1 && d.sealed == 3 && !d.open_refused && !d.sealed_refused && st.refs == 0 &&
	   st.sealed_free == 8 && st.open_free == 4, "drop: 1 open slot, 3 sealed blocks back, the pool is empty");
	kvq_lease_drop(NULL, p, NULL);
	kvq_pool_free(p);
}

int main(void)
{
	static uint32_t ref_sealed[IDS];
	static uint8_t ref_open[IDS];
	kvq_lease *s = NULL;
	int bad = 0, r;
	uint32_t n_sealed = 0, n_open = 0, pos, id, cnt, seen;

	tap_seed();
	ok(kvq_lease_new(&s) == 0, "new");
	ok(kvq_lease_sealed(s, 7) == 0 && !kvq_lease_open_has(s, 7), "empty lease holds nothing");
	ok(kvq_lease_sealed_sub(s, 7, 1) == -EINVAL && kvq_lease_open_del(s, 7) == -ENOENT,
	   "dropping what is not held: -EINVAL / -ENOENT");
	for (int step = 0; step < 200000; step++) {
		/* a small id range keeps collisions, removals and re-insertions frequent */
		uint32_t x = (uint32_t)(tap_rand() % (step < 100000 ? 300 : IDS));
		uint32_t k = (uint32_t)(tap_rand() % 3) + 1;

		switch (tap_rand() % 4) {
		case 0:
			r = kvq_lease_sealed_add(s, x, k);
			bad += r != (ref_sealed[x] == 0);
			n_sealed += ref_sealed[x] == 0;
			ref_sealed[x] += k;
			break;
		case 1:
			r = kvq_lease_sealed_sub(s, x, k);
			if (ref_sealed[x] < k) {
				bad += r != -EINVAL;
			} else {
				ref_sealed[x] -= k;
				bad += r != (ref_sealed[x] == 0);
				n_sealed -= ref_sealed[x] == 0;
			}
			break;
		case 2:
			r = kvq_lease_open_add(s, x);
			bad += r != (ref_open[x] ? -EEXIST : 0);
			n_open += !ref_open[x];
			ref_open[x] = 1;
			break;
		default:
			r = kvq_lease_open_del(s, x);
			bad += r != (ref_open[x] ? 0 : -ENOENT);
			n_open -= ref_open[x];
			ref_open[x] = 0;
			break;
		}
		if (step % 997 == 0)
			for (uint32_t i = 0; i < IDS; i++)
				bad += kvq_lease_sealed(s, i) != ref_sealed[i] ||
				       kvq_lease_open_has(s, i) != ref_open[i];
	}
	ok(!bad, "200000 random operations agree with the reference (%d mismatches)", bad);
	ok(kvq_lease_n_sealed(s) == n_sealed && kvq_lease_n_open(s) == n_open, "counts: %u sealed, %u open",
	   n_sealed, n_open);
	seen = 0;
	bad = 0;
	pos = 0;
	while (kvq_lease_next_sealed(s, &pos, &id, &cnt)) {
		bad += id >= IDS || ref_sealed[id] != cnt;
		seen++;
	}
	ok(!bad && seen == n_sealed, "iteration visits every sealed id once with its count");
	seen = 0;
	pos = 0;
	while (kvq_lease_next_open(s, &pos, &id)) {
		bad += id >= IDS || !ref_open[id];
		seen++;
	}
	ok(!bad && seen == n_open, "iteration visits every open id once");
	ok(kvq_lease_reserve(s, 100000, 100000) == 0, "reserve");
	ok(kvq_lease_sealed_add(s, 999999, 1) == 1 && kvq_lease_sealed_add(s, 999999, UINT32_MAX) == -EOVERFLOW &&
	   kvq_lease_sealed(s, 999999) == 1, "a count that would wrap: -EOVERFLOW, unchanged");
	kvq_lease_free(s);
	kvq_lease_free(NULL);
	holds();
	return done_testing();
}
