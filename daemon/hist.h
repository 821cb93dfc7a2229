/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A latency histogram: fixed buckets, counts per bucket (not cumulative;
 * the metrics exposition sums them), their number and sum.  The server keeps
 * one per request type and fills it; the metrics read it.
 */
#ifndef KVQD_HIST_H
#define KVQD_HIST_H

#include <stdint.h>

/* Upper bounds of the buckets in seconds (+Inf is implied): control
 * requests take microseconds, a pool allocation on attach milliseconds. */
#define KVQ_HIST_BUCKETS 12
extern const double kvq_hist_bucket_le[KVQ_HIST_BUCKETS];

struct kvq_hist {
	uint64_t bucket[KVQ_HIST_BUCKETS];
	uint64_t count;
	double sum;                       /* seconds */
};

/* Counts one observation of seconds. */
void kvq_hist_observe(struct kvq_hist *h, double seconds);

/* The observations of at most le seconds (cumulative, as the metrics'
 * buckets): the buckets whose bound is le or less. */
uint64_t kvq_hist_le(const struct kvq_hist *h, double le);

#endif
