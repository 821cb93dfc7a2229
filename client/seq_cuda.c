/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend (struct client_backend, libkvq_internal.h): the CUDA side of a
 * sequence on a cuda pool.  Everything runs on the client's stream, in
 * order; libkvq drains that stream before it tells kvqd a block is sealed
 * or published (no one may find a block before its bytes are there) and
 * before it releases slots (no kernel of ours may still read them when
 * another client gets them).  When the pool times attention, a pair of
 * events brackets each attention kernel and is read once it has completed,
 * with a query that never waits: timing adds no synchronisation.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/kvq_cuda.h"
#include "cuda_import.h"
#include "gpu_timer.h"

/* A sequence's device memory: the record and block table a kernel reads,
 * staging for inputs and outputs in host memory, the attention workspace. */
struct seq_cuda {
	void *table, *stage, *work;
	size_t table_cap, stage_cap, work_cap;
};

static int gpu_err(kvq_client *c, const char *what, cudaError_t e)
{
	return client_fail(c, -EIO, "%s: %s", what, cudaGetErrorString(e));
}

static int gpu_drain(kvq_client *c)
{
	cudaError_t e = cudaStreamSynchronize(c->stream);

	return e == cudaSuccess ? 0 : gpu_err(c, "waiting for the pool's CUDA work", e);
}

/* Before a sequence's CUDA work: the pool's context current in the calling
 * thread, the sequence's device buffers made. */
static int gpu_begin(kvq_seq *s)
{
	int r = cuda_ready(s->c);

	if (r == 0 && !s->cuda && !(s->cuda = calloc(1, sizeof(*s->cuda))))
		r = -ENOMEM;
	return r;
}

/* Grows a device buffer to need bytes; its old contents are dropped, after
 * the work that may still read them. */
static int gpu_grow(kvq_client *c, void **buf, size_t *cap, size_t need)
{
	cudaError_t e;
	int r;

	if (need <= *cap)
		return 0;
	if ((r = gpu_drain(c)) < 0)
		return r;
	cudaFree(*buf);
	*buf = NULL;
	*cap = 0;
	need = need < 4096 ? 4096 : need + need / 2;
	if ((e = cudaMalloc(buf, need)) != cudaSuccess)
		return gpu_err(c, "cudaMalloc", e);
	*cap = need;
	return 0;
}

/*
 * Sends a sequence's table (struct kvq_seq_table) with its ns sealed and no
 * open ids to device memory: [table][sealed ids][open ids], one copy, the
 * table's id pointers the device addresses; *ret is the table's.
 */
static int gpu_table(kvq_seq *s, const struct kvq_seq_table *t, uint32_t ns, uint32_t no, void **ret)
{
	kvq_client *c = s->c;
	const int32_t *sealed = t->sealed, *open = t->open;
	struct kvq_seq_table rec = *t;
	size_t bytes = sizeof(rec) + ((size_t)ns + no) * sizeof(int32_t);
	uint8_t *h = malloc(bytes);
	cudaError_t e;
	int r;

	if (!h)
		return -ENOMEM;
	r = gpu_grow(c, &s->cuda->table, &s->cuda->table_cap, bytes);
	if (r == 0) {
		uint8_t *d = s->cuda->table;
		rec.sealed = (const int32_t *)(d + sizeof(rec));
		rec.open = (const int32_t *)(d + sizeof(rec) + (size_t)ns * sizeof(int32_t));
		memcpy(h, &rec, sizeof(rec));
		if (ns)
			memcpy(h + sizeof(rec), sealed, (size_t)ns * sizeof(int32_t));
		if (no)
			memcpy(h + sizeof(rec) + (size_t)ns * sizeof(int32_t), open, (size_t)no * sizeof(int32_t));
		e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->stream);
		r = e == cudaSuccess ? 0 : gpu_err(c, "copying the block table", e);
		*ret = d;
	}
	free(h);
	return r;
}

static bool gpu_is_device(const void *p)
{
	struct cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		cudaGetLastError();   /* a plain host pointer on older runtimes */
		return false;
	}
	return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* One layer's write on the GPU: k and v in device memory are read where
 * they are, host arrays are copied first. */
static int gpu_write(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *w, uint32_t ns, uint32_t no,
		     const void *k, const void *v)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const size_t bytes = (size_t)w->m * L->kv_heads * L->head_dim * kvq_dtype_bytes(L->act);
	struct seq_cuda *d;
	void *rec = NULL;
	cudaError_t e;
	int r;

	if ((r = gpu_begin(s)) < 0)
		return r;
	d = s->cuda;
	if (!gpu_is_device(k) || !gpu_is_device(v)) {
		if ((r = gpu_grow(c, &d->stage, &d->stage_cap, 2 * bytes)) < 0)
			return r;
		if ((e = cudaMemcpyAsync(d->stage, k, bytes, cudaMemcpyDefault, c->stream)) != cudaSuccess ||
		    (e = cudaMemcpyAsync((uint8_t *)d->stage + bytes, v, bytes, cudaMemcpyDefault, c->stream)) !=
			    cudaSuccess)
			return gpu_err(c, "copying K and V to the device", e);
		k = d->stage;
		v = (uint8_t *)d->stage + bytes;
	}
	if ((r = gpu_table(s, w, ns, no, &rec)) < 0)
		return r;
	client_trace(c, KVQ_TRACE_WRITE, layer, true, k, v, NULL, NULL);
	r = kvq_cuda_write(L, c->base, layer, rec, 1, w->m, k, v, c->stream);
	return r < 0 ? client_fail(c, r, "kvq_cuda_write: %s", r == -EIO ? kvq_cuda_error() : "refused") : 0;
}

/* Attention timing (libkvq_internal.h, struct client_timing's gpu: a struct
 * gpu_timing, gpu_timer.h): the pairs whose calls completed go to their
 * bins. */
static void gpu_timing_add(void *arg, uint32_t layer, int phase, uint64_t kv_bytes, double seconds)
{
	timing_add(arg, layer, phase, kv_bytes, seconds);
}

static void gpu_timing_poll_client(kvq_client *c)
{
	if (c->timing.gpu)
		gpu_timing_poll(c->timing.gpu, gpu_timing_add, c);
}

/* A pair for a call about to be queued, or NULL (not timing, no memory,
 * gpu_timer_get's reasons). */
static struct gpu_timer *gpu_timer_begin(kvq_client *c)
{
	if (!c->timing.report_ms)
		return NULL;
	if (!c->timing.gpu && !(c->timing.gpu = calloc(1, sizeof(struct gpu_timing))))
		return NULL;
	return gpu_timer_get(c->timing.gpu, c->stream, gpu_timing_add, c);
}

static void gpu_timing_free(kvq_client *c)
{
	if (c->timing.gpu)
		gpu_timing_destroy(c->timing.gpu);
	free(c->timing.gpu);
	c->timing.gpu = NULL;
}

/* Attention on the GPU with q (activation dtype) and out (f32 or the
 * activation dtype) in device memory, queued on the client's stream. */
static int gpu_attention(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *as, uint32_t ns, uint32_t no,
			 uint32_t q_heads, float scale, const void *q, void *out, bool out_f32)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const struct kvq_layer_layout *ll = &L->layer[layer];
	struct kvq_cuda_attn a = { .L = L, .base = c->base, .layer = layer, .q_heads = q_heads, .scale = scale,
		.q_dtype = L->act, .out_dtype = out_f32 ? KVQ_DT_F32 : L->act, .max_n = as->n, .max_q = as->m,
		.total_q = as->row0 + as->m, .stream = c->stream };
	struct gpu_timer *t;
	void *rec = NULL;
	size_t ws;
	int r;

	if ((r = gpu_begin(s)) < 0)
		return r;
	ws = kvq_cuda_attention_workspace(&a, 1);
	if ((r = gpu_grow(c, &s->cuda->work, &s->cuda->work_cap, ws)) < 0)
		return r;
	a.workspace = ws ? s->cuda->work : NULL;
	a.workspace_bytes = ws;
	if ((r = gpu_table(s, as, ns, no, &rec)) < 0)
		return r;
	client_trace(c, KVQ_TRACE_ATTENTION, layer, true, NULL, NULL, q, out);
	t = gpu_timer_begin(c);
	r = kvq_cuda_attention(&a, rec, 1, q, out);
	if (t && r == 0)
		gpu_timer_put(c->timing.gpu, t, c->stream, layer, timing_phase(as->m), timing_kv_bytes(c, layer, as, ns, no));
	if (r == -ENOTSUP)
		return client_fail(c, r, "no CUDA attention for k=%s,v=%s at head dim %u", kvq_fmt_name(ll->kfmt),
				   kvq_fmt_name(ll->vfmt), L->head_dim);
	if (r < 0)
		return client_fail(c, r, "kvq_cuda_attention: %s", r == -EIO ? kvq_cuda_error() : "refused");
	return 0;
}

/* The same for float host arrays, converted to and from the activation
 * dtype around the kernel; returns when out is written. */
static int gpu_attention_host(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *as, uint32_t ns,
			      uint32_t no, uint32_t q_heads, float scale, const float *q, float *out)
{
	kvq_client *c = s->c;
	const struct kvq_layout *L = c->L;
	const size_t nel = (size_t)as->m * q_heads * L->head_dim, bytes = nel * 2;
	uint16_t *h = NULL;
	uint8_t *stage;
	cudaError_t e;
	int r;

	if ((r = gpu_begin(s)) < 0 || (r = gpu_grow(c, &s->cuda->stage, &s->cuda->stage_cap, 2 * bytes)) < 0)
		return r;
	stage = s->cuda->stage;
	h = malloc(bytes);
	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < nel; i++)
		h[i] = L->act == KVQ_DT_BF16 ? kvq_bf16_from_f32(q[i]) : kvq_f16_from_f32(q[i]);
	if ((e = cudaMemcpyAsync(stage, h, bytes, cudaMemcpyHostToDevice, c->stream)) != cudaSuccess) {
		r = gpu_err(c, "copying q to the device", e);
		goto out;
	}
	r = gpu_attention(s, layer, as, ns, no, q_heads, scale, stage, stage + bytes, false);
	if (r < 0)
		goto out;
	if ((e = cudaMemcpyAsync(h, stage + bytes, bytes, cudaMemcpyDeviceToHost, c->stream)) != cudaSuccess ||
	    (e = cudaStreamSynchronize(c->stream)) != cudaSuccess) {
		r = gpu_err(c, "attention output", e);
		goto out;
	}
	for (size_t i = 0; i < nel; i++)
		out[i] = L->act == KVQ_DT_BF16 ? kvq_bf16_to_f32(h[i]) : kvq_f16_to_f32(h[i]);
out:
	free(h);
	return r;
}

static void gpu_unmap(kvq_client *c)
{
	/* the CUDA work on the pool is drained before the mapping goes */
	if (cuda_ready(c) == 0)
		cudaStreamSynchronize(c->stream);
	gpu_timing_free(c);
	cuda_unimport(c);
}

static int gpu_copy(kvq_client *c, void *to, const void *from, size_t n)
{
	cudaError_t e;
	int r;

	if ((r = cuda_ready(c)) < 0)
		return r;
	/* in stream order: later kernels see the copy */
	e = cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, c->stream);
	return e == cudaSuccess ? 0 : gpu_err(c, "copying the open window", e);
}

static int gpu_wait(kvq_client *c)
{
	int r = cuda_ready(c);

	return r < 0 ? r : gpu_drain(c);
}

static void gpu_seq_free(kvq_seq *s)
{
	/* no kernel of ours may read the slots once they are released */
	if (cuda_ready(s->c) == 0) {
		gpu_drain(s->c);
		if (s->cuda) {
			cudaFree(s->cuda->table);
			cudaFree(s->cuda->stage);
			cudaFree(s->cuda->work);
		}
	}
	free(s->cuda);
	s->cuda = NULL;
}

const struct client_backend client_cuda = {
	.name = "cuda",
	.compiled = true,
	.sinks = true,
	.map = cuda_import,
	.unmap = gpu_unmap,
	.write = gpu_write,
	.attention = gpu_attention_host,
	.attention_device = gpu_attention,
	.copy = gpu_copy,
	.drain = gpu_wait,
	.seq_free = gpu_seq_free,
	.timing_poll = gpu_timing_poll_client,
};
