/* SPDX-License-Identifier: Apache-2.0 */
/* The attention-timing buckets (timing_buckets.h). */
#include "timing_buckets.h"

const double kvq_timing_le[KVQ_TIMING_BUCKETS] = {
	1e-6, 1.5e-6, 2e-6, 3e-6, 5e-6, 7e-6,
	1e-5, 1.5e-5, 2e-5, 3e-5, 5e-5, 7e-5,
	1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7e-4,
	1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7e-3,
	1e-2, 1.5e-2, 2e-2, 3e-2, 5e-2, 7e-2,
	0.1, 0.15, 0.2, 0.3, 0.5, 0.7,
	1.0,
};

unsigned kvq_timing_bucket(double seconds)
{
	unsigned lo = 0, hi = KVQ_TIMING_BUCKETS;

	/* the first bound >= seconds; NaN goes past every bound */
	if (!(seconds <= kvq_timing_le[KVQ_TIMING_BUCKETS - 1]))
		return KVQ_TIMING_BUCKETS;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (seconds > kvq_timing_le[mid])
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}
