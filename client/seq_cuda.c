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

/* A table set's device memory (struct client_tables: a sequence's own
 * calls, or a batch's write or attention): the tables a kernel reads,
 * staging for inputs and outputs in host memory, the attention workspace,
 * and the attention plan of each layer, made once per step. */
struct attn_plan {
	bool made;
	uint32_t q_heads, splits;
	int out_dtype;
	size_t workspace;
};

struct tables_cuda {
	void *table, *stage, *work;
	size_t table_cap, stage_cap, work_cap;
	bool uploaded;                  /* table holds the host tables as they are */
	uint32_t n_plan;
	struct attn_plan *plan;         /* per layer */
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

/* Before CUDA work on the tables t: the pool's context current in the
 * calling thread, t's device buffers made. */
static int gpu_begin(kvq_client *c, struct client_tables *t)
{
	int r = cuda_ready(c);

	if (r == 0 && !t->dev && !(t->dev = calloc(1, sizeof(*t->dev))))
		r = -ENOMEM;
	if (r == 0 && t->dirty) {
		t->dev->uploaded = false;
		for (uint32_t l = 0; l < t->dev->n_plan; l++)
			t->dev->plan[l].made = false;
		t->dirty = false;
	}
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
 * Sends the tables t (struct kvq_seq_table) with their sealed and open ids
 * to device memory once after they changed: [tables][ids of table 0][ids
 * of table 1].., one copy, the tables' id pointers the device addresses.
 * Returns the device tables in *ret.
 */
static int gpu_tables(kvq_client *c, struct client_tables *t, void **ret)
{
	struct tables_cuda *d = t->dev;
	size_t ids = 0, bytes;
	uint8_t *h, *dp;
	cudaError_t e;
	int r;

	*ret = d->table;
	if (d->uploaded)
		return 0;
	for (uint32_t i = 0; i < t->nseq; i++)
		ids += (size_t)t->ns[i] + t->no[i];
	bytes = (size_t)t->nseq * sizeof(struct kvq_seq_table) + ids * sizeof(int32_t);
	if (!(h = malloc(bytes)))
		return -ENOMEM;
	if ((r = gpu_grow(c, &d->table, &d->table_cap, bytes)) == 0) {
		struct kvq_seq_table *rec = (struct kvq_seq_table *)h;
		size_t at = (size_t)t->nseq * sizeof(*rec);

		dp = d->table;
		for (uint32_t i = 0; i < t->nseq; i++) {
			rec[i] = t->t[i];
			rec[i].sealed = (const int32_t *)(dp + at);
			if (t->ns[i])
				memcpy(h + at, t->t[i].sealed, (size_t)t->ns[i] * sizeof(int32_t));
			at += (size_t)t->ns[i] * sizeof(int32_t);
			rec[i].open = (const int32_t *)(dp + at);
			if (t->no[i])
				memcpy(h + at, t->t[i].open, (size_t)t->no[i] * sizeof(int32_t));
			at += (size_t)t->no[i] * sizeof(int32_t);
		}
		/* pageable memory: the call returns once h is read */
		e = cudaMemcpyAsync(dp, h, bytes, cudaMemcpyHostToDevice, c->stream);
		r = e == cudaSuccess ? 0 : gpu_err(c, "copying the block tables", e);
		d->uploaded = r == 0;
		*ret = dp;
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

/* One layer's write of every sequence of w in one launch: k and v in
 * device memory are read where they are, host arrays are copied first. */
static int gpu_write(kvq_client *c, struct client_tables *w, uint32_t layer, const void *k, const void *v)
{
	const struct kvq_layout *L = c->L;
	const size_t bytes = (size_t)w->rows * L->kv_heads * L->head_dim * kvq_dtype_bytes(L->act);
	struct tables_cuda *d;
	void *rec = NULL;
	cudaError_t e;
	int r;

	if ((r = gpu_begin(c, w)) < 0)
		return r;
	d = w->dev;
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
	if ((r = gpu_tables(c, w, &rec)) < 0)
		return r;
	client_trace(c, KVQ_TRACE_WRITE, layer, true, k, v, NULL, NULL);
	r = kvq_cuda_write(L, c->base, layer, rec, w->nseq, w->max_m, k, v, c->stream);
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

/* KV splits fixed for every call (KVQ_CUDA_SPLITS, read once; 0: the
 * plan chooses): a test's plan that does not depend on the batch, so a
 * batch's output can be compared with each sequence's own call bit for
 * bit. */
static uint32_t fixed_splits(void)
{
	static int v = -1;

	if (v < 0) {
		const char *e = getenv("KVQ_CUDA_SPLITS");
		long n = e ? strtol(e, NULL, 10) : 0;

		v = n > 0 && n <= 64 ? (int)n : 0;
	}
	return (uint32_t)v;
}

/* The attention plan of layer for the tables a (kernel, KV splits,
 * workspace), made on the step's first call for the layer and kept for
 * the others; the workspace grown to hold it. */
static int gpu_plan(kvq_client *c, struct client_tables *t, struct kvq_cuda_attn *a)
{
	struct tables_cuda *d = t->dev;
	struct attn_plan *p;
	size_t ws;
	int r;

	if (d->n_plan < c->L->layers) {
		struct attn_plan *np = realloc(d->plan, c->L->layers * sizeof(*np));

		if (!np)
			return -ENOMEM;
		memset(np + d->n_plan, 0, (c->L->layers - d->n_plan) * sizeof(*np));
		d->plan = np;
		d->n_plan = c->L->layers;
	}
	p = &d->plan[a->layer];
	if (!p->made || p->q_heads != a->q_heads || p->out_dtype != a->out_dtype) {
		a->splits = fixed_splits();
		ws = kvq_cuda_attention_workspace(a, t->nseq);
		if ((r = gpu_grow(c, &d->work, &d->work_cap, ws)) < 0)
			return r;
		a->workspace = ws ? d->work : NULL;
		a->workspace_bytes = ws;
		*p = (struct attn_plan){ .made = true, .q_heads = a->q_heads, .out_dtype = a->out_dtype,
			.workspace = ws };
		/* NULL for a pair without a kernel: the launch says so */
		if (!kvq_cuda_attention_plan(a, t->nseq, &p->splits))
			p->splits = a->splits;
	}
	a->splits = p->splits;
	a->workspace = p->workspace ? d->work : NULL;
	a->workspace_bytes = p->workspace;
	return 0;
}

/* Attention on the GPU over the tables t in one launch (and a merge when
 * split), q (activation dtype) and out (f32 or the activation dtype) in
 * device memory, queued on the client's stream. */
static int gpu_attention(kvq_client *c, struct client_tables *t, uint32_t layer, uint32_t q_heads, float scale,
			 const void *q, void *out, bool out_f32)
{
	const struct kvq_layout *L = c->L;
	const struct kvq_layer_layout *ll = &L->layer[layer];
	struct kvq_cuda_attn a = { .L = L, .base = c->base, .layer = layer, .q_heads = q_heads, .scale = scale,
		.q_dtype = L->act, .out_dtype = out_f32 ? KVQ_DT_F32 : L->act, .max_n = t->max_n, .max_q = t->max_m,
		.total_q = t->rows, .stream = c->stream };
	struct gpu_timer *tm;
	void *rec = NULL;
	int r;

	if ((r = gpu_begin(c, t)) < 0 || (r = gpu_plan(c, t, &a)) < 0 || (r = gpu_tables(c, t, &rec)) < 0)
		return r;
	client_trace(c, KVQ_TRACE_ATTENTION, layer, true, NULL, NULL, q, out);
	tm = gpu_timer_begin(c);
	r = kvq_cuda_attention(&a, rec, t->nseq, q, out);
	if (tm && r == 0)
		gpu_timer_put(c->timing.gpu, tm, c->stream, layer, timing_phase(t->max_m), timing_kv_bytes(c, layer, t));
	if (r == -ENOTSUP)
		return client_fail(c, r, "no CUDA attention for k=%s,v=%s at head dim %u", kvq_fmt_name(ll->kfmt),
				   kvq_fmt_name(ll->vfmt), L->head_dim);
	if (r < 0)
		return client_fail(c, r, "kvq_cuda_attention: %s", r == -EIO ? kvq_cuda_error() : "refused");
	return 0;
}

/* The same for float host arrays, converted to and from the activation
 * dtype around the kernel; returns when out is written. */
static int gpu_attention_host(kvq_client *c, struct client_tables *t, uint32_t layer, uint32_t q_heads,
			      float scale, const float *q, float *out)
{
	const struct kvq_layout *L = c->L;
	const size_t nel = (size_t)t->rows * q_heads * L->head_dim, bytes = nel * 2;
	uint16_t *h = NULL;
	uint8_t *stage;
	cudaError_t e;
	int r;

	if ((r = gpu_begin(c, t)) < 0 || (r = gpu_grow(c, &t->dev->stage, &t->dev->stage_cap, 2 * bytes)) < 0)
		return r;
	stage = t->dev->stage;
	h = malloc(bytes);
	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < nel; i++)
		h[i] = L->act == KVQ_DT_BF16 ? kvq_bf16_from_f32(q[i]) : kvq_f16_from_f32(q[i]);
	if ((e = cudaMemcpyAsync(stage, h, bytes, cudaMemcpyHostToDevice, c->stream)) != cudaSuccess) {
		r = gpu_err(c, "copying q to the device", e);
		goto out;
	}
	r = gpu_attention(c, t, layer, q_heads, scale, stage, stage + bytes, false);
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

/* The caller drained the stream (client_tables_free's rule). */
static void gpu_tables_free(kvq_client *c, struct tables_cuda *d)
{
	if (cuda_ready(c) == 0) {
		cudaFree(d->table);
		cudaFree(d->stage);
		cudaFree(d->work);
	}
	free(d->plan);
	free(d);
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
	.tables_free = gpu_tables_free,
	.timing_poll = gpu_timing_poll_client,
};
