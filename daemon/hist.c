/* SPDX-License-Identifier: Apache-2.0 */
#include "hist.h"

const double kvq_hist_bucket_le[KVQ_HIST_BUCKETS] = {
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0,
};

void kvq_hist_observe(struct kvq_hist *h, double seconds)
{
	int i = 0;

	while (i < KVQ_HIST_BUCKETS && seconds > kvq_hist_bucket_le[i])
		i++;
	if (i < KVQ_HIST_BUCKETS)
		h->bucket[i]++;
	h->count++;
	h->sum += seconds;
}

uint64_t kvq_hist_le(const struct kvq_hist *h, double le)
{
	uint64_t n = 0;

	for (int i = 0; i < KVQ_HIST_BUCKETS && kvq_hist_bucket_le[i] <= le; i++)
		n += h->bucket[i];
	return n;
}
