/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Timing CUDA work without waiting for it: a ring of event pairs, each
 * bracketing one queued kernel, read once its end has completed with a
 * query that never blocks.  libkvq's cuda backend (seq_cuda.c) times its
 * attention calls with it; kvq-bench timing measures what it costs.
 */
#ifndef KVQ_GPU_TIMER_H
#define KVQ_GPU_TIMER_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#define GPU_TIMERS 64   /* pairs in flight; a call finding all in use goes untimed */
/* One call in GPU_TIMING_EVERY is timed: a pair costs the worker about
 * 3.4 us of host time (two records, a capture check, a query and the
 * elapsed time; kvq-bench timing on an H200), 2.4 % of a 30-layer token at
 * 240 tokens/s if every call were timed. */
#define GPU_TIMING_EVERY 16

struct gpu_timer {
	cudaEvent_t start, end;
	uint32_t layer;
	int phase;
	uint64_t kv_bytes;
};

struct gpu_timing {
	struct gpu_timer t[GPU_TIMERS];
	uint32_t head, n, made;     /* oldest in flight, in flight, pairs created */
	uint32_t calls;             /* calls seen, timed or not (the sampling's count) */
	bool broken;                /* an event could not be made: no more timing */
};

/* Called for each completed pair, oldest first, with its seconds. */
typedef void gpu_timing_add_fn(void *arg, uint32_t layer, int phase, uint64_t kv_bytes, double seconds);

/* Hands the completed pairs to add; stops at the first still running. */
void gpu_timing_poll(struct gpu_timing *g, gpu_timing_add_fn *add, void *arg);

/* For one call in GPU_TIMING_EVERY, after a poll, a free pair with its
 * start recorded on stream, for a call about to be queued; NULL: not this
 * call's turn, the ring full, timing broken, or the stream being captured
 * into a graph (its events are not recorded then). */
struct gpu_timer *gpu_timer_get(struct gpu_timing *g, cudaStream_t stream, gpu_timing_add_fn *add, void *arg);

/* The call's kernel is queued: its end is recorded and the pair is in flight. */
void gpu_timer_put(struct gpu_timing *g, struct gpu_timer *t, cudaStream_t stream, uint32_t layer, int phase,
		   uint64_t kv_bytes);

/* Destroys the events (none may be in flight: the stream drained first). */
void gpu_timing_destroy(struct gpu_timing *g);

#endif
