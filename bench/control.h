/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench control: what its two halves share.  control.c speaks the
 * protocol itself (proto/conn.h) for block operations, round trips and
 * attaches; cycle.c runs batched decode steps through libkvq's public
 * batch API (kvq_batch) and counts the requests and waits it reports.
 * Both use the same pool geometry, each its own pool.
 */
#ifndef KVQ_BENCH_CONTROL_H
#define KVQ_BENCH_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#define CTL_MODEL "kvq-bench"
#define CTL_LAYERS 2u
#define CTL_HEADS 2u
#define CTL_HEAD_DIM 64u
#define CTL_BLOCK_TOKENS 16u
#define CTL_POLICY "int8"

/* Sequences of the batched cycle end (and are replaced) at this many
 * tokens: 8 blocks, 7 of them sealed and published. */
#define CYCLE_SEQ_TOKENS 128u

/* One batch size's run (cycle_run). */
struct cycle_result {
	uint32_t size;              /* sequences per step */
	uint64_t steps;
	double seconds;             /* the steps and the releases between them */
	/* block operations: each block once in each */
	uint64_t allocs;            /* slots a begin allocated */
	uint64_t seals, publishes;  /* blocks a commit sealed, published */
	uint64_t releases;          /* blocks and slots released by ended sequences */
	/* what kvq_batch_requests reported, summed over the steps */
	uint64_t begin_requests, begin_waits, commit_requests, commit_waits;
	uint64_t ended;             /* sequences ended: one Release each, outside the steps */
};

/*
 * Runs batched decode steps of size sequences for seconds on pool (created
 * when needed, CTL_* geometry) of the kvqd at socket, through libkvq: a
 * step appends one token to every sequence (kvq_batch_add, _begin, a
 * kvq_batch_write of each layer, _commit); a sequence that reached
 * CYCLE_SEQ_TOKENS is freed and replaced by an empty one.  Lengths start
 * spread over 1 .. CYCLE_SEQ_TOKENS (one prefill step, not timed), so the
 * steps where sequences cross a block boundary are spread too.  Returns 0
 * and *ret, or a negative code with a one-line reason in err[errlen].
 */
int cycle_run(const char *socket, const char *pool, uint32_t size, double seconds, struct cycle_result *ret,
	      char *err, size_t errlen);

#endif
