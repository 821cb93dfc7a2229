/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The attention timings a pool's clients report (kvq.proto, "Attention
 * timings"): one histogram per phase (decode, prefill) and (K, V) format
 * pair of the pool's policy, with the calls' KV bytes.  A report is taken
 * apart bin by bin and only what can be checked is believed: a bin of a
 * pair the pool lacks is dropped, counts are cut to what the time since
 * the sender's last report allows, seconds and bytes are clamped to what
 * the counts allow.  A report never fails.  The metrics read the books.
 */
#ifndef KVQD_ATTN_H
#define KVQD_ATTN_H

#include <stdint.h>

#include "frame.h"
#include "layout.h"
#include "timing_buckets.h"

enum { KVQ_ATTN_DECODE = 0, KVQ_ATTN_PREFILL, KVQ_ATTN_PHASES };

struct kvq_attn_hist {
	int phase, kfmt, vfmt;
	uint64_t max_call_bytes;                /* the most one call may read: a layer's region */
	uint64_t bucket[KVQ_TIMING_BUCKETS + 1]; /* per bucket of kvq_timing_le, the last past them */
	uint64_t count, kv_bytes;
	double seconds;
};

/* A pool's books: n histograms, and what became of the bins sent. */
struct kvq_attn {
	uint64_t reports;                       /* reports taken (not dropped whole) */
	uint64_t bins_taken, bins_clamped, bins_dropped;
	uint32_t n;
	struct kvq_attn_hist h[];
};

/* Books for every (phase, K, V) of L's layers.  Returns 0 and *ret, or
 * -ENOMEM. */
int kvq_attn_new(const struct kvq_layout *L, struct kvq_attn **ret);

/* NULL is fine. */
void kvq_attn_free(struct kvq_attn *a);

/* Takes report r into a, at most max_calls calls over all its bins. */
void kvq_attn_add(struct kvq_attn *a, const Kvq__AttentionReport *r, uint64_t max_calls);

/* Counts a report dropped whole (too many bins, or the pool does not time). */
void kvq_attn_drop(struct kvq_attn *a, const Kvq__AttentionReport *r);

/* "decode", "prefill". */
const char *kvq_attn_phase_name(int phase);

#endif
