/* SPDX-License-Identifier: Apache-2.0 */
/* daemon/lease.c: the lease maps against a plain array, under random churn
 * (insertions, removals with backward shifts, growth). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "lease.h"

#define IDS 4096u

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
	return done_testing();
}
