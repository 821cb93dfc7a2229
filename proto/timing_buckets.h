/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVQ_TIMING_BUCKETS_H
#define KVQ_TIMING_BUCKETS_H

/*
 * Attention timing (kvq.proto, "Attention timings"): the buckets libkvq
 * sorts its calls into and kvqd exports, their upper bounds in seconds
 * (1 us to 1 s, six a decade: a decode call on a GPU takes microseconds),
 * and what kvqd believes of a report.
 */
#define KVQ_TIMING_BUCKETS 37u
extern const double kvq_timing_le[KVQ_TIMING_BUCKETS];
#define KVQ_TIMING_MAX_CALLS_PER_S 1000000u  /* calls a connection may report per second */
#define KVQ_TIMING_MAX_CALL_S 10.0           /* seconds one call past the last bound may take */
#define KVQ_TIMING_MIN_REPORT_MS 100u        /* kvqd.conf attention_report_ms range */
#define KVQ_TIMING_MAX_REPORT_MS 600000u

/* The bucket of a call of seconds: 0 .. KVQ_TIMING_BUCKETS (past every bound). */
unsigned kvq_timing_bucket(double seconds);

#endif
