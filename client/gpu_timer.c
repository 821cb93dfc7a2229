/* SPDX-License-Identifier: Apache-2.0 */
/* Event pairs read without waiting (gpu_timer.h). */
#include "gpu_timer.h"

void gpu_timing_poll(struct gpu_timing *g, gpu_timing_add_fn *add, void *arg)
{
	while (g->n) {
		struct gpu_timer *t = &g->t[g->head];
		cudaError_t e = cudaEventQuery(t->end);
		float ms = 0;

		if (e == cudaErrorNotReady) {
			/* not an error; never left for a launch check to find */
			if (cudaPeekAtLastError() == cudaErrorNotReady)
				cudaGetLastError();
			break;
		}
		if (e == cudaSuccess && cudaEventElapsedTime(&ms, t->start, t->end) == cudaSuccess)
			add(arg, t->layer, t->phase, t->kv_bytes, (double)ms * 1e-3);
		g->head = (g->head + 1) % GPU_TIMERS;
		g->n--;
	}
}

struct gpu_timer *gpu_timer_get(struct gpu_timing *g, cudaStream_t stream, gpu_timing_add_fn *add, void *arg)
{
	enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
	struct gpu_timer *t;
	uint32_t i;

	if (g->calls++ % GPU_TIMING_EVERY)
		return NULL;
	gpu_timing_poll(g, add, arg);
	if (g->broken || g->n == GPU_TIMERS ||
	    cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
		return NULL;
	/* slots come into use in ring order: the next one is new until all are made */
	i = (g->head + g->n) % GPU_TIMERS;
	t = &g->t[i];
	if (i >= g->made) {
		if (cudaEventCreate(&t->start) != cudaSuccess) {
			g->broken = true;
			return NULL;
		}
		if (cudaEventCreate(&t->end) != cudaSuccess) {
			cudaEventDestroy(t->start);
			g->broken = true;
			return NULL;
		}
		g->made++;
	}
	return cudaEventRecord(t->start, stream) == cudaSuccess ? t : NULL;
}

void gpu_timer_put(struct gpu_timing *g, struct gpu_timer *t, cudaStream_t stream, uint32_t layer, int phase,
		   uint64_t kv_bytes)
{
	if (cudaEventRecord(t->end, stream) != cudaSuccess)
		return;
	t->layer = layer;
	t->phase = phase;
	t->kv_bytes = kv_bytes;
	g->n++;
}

void gpu_timing_destroy(struct gpu_timing *g)
{
	for (uint32_t i = 0; i < g->made; i++) {
		cudaEventDestroy(g->t[i].start);
		cudaEventDestroy(g->t[i].end);
	}
	g->n = g->made = g->head = 0;
}
