/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench batch: libkvq's batch API (kvq_batch, kvq.h) on a cuda pool of
 * a running kvqd, against the kernels' own interface (kernels/cuda/
 * kvq_cuda.h) on the same pool, the same block tables and the same KV, in
 * one run: what a worker reaches through the library, and what the kernels
 * reach (kvq-bench decode and append time them alike on pools of their
 * own; run them in the same call to compare).
 *
 * decode: NSEQ sequences of CTX tokens (a prefill step through the batch,
 * committed: published and sealed as a worker's), then decode steps of one
 * token each; every layer's kvq_batch_attention_device is timed by CUDA
 * events around it, and after the steps kvq_cuda_attention over the same
 * tables (built from kvq_seq_blocks) is timed the same way.  Each timed
 * call reads another layer's KV than the last (an L2 of 50 MB holds none
 * of it): the median over layers and steps is printed, with the KV bytes
 * read per ms.
 * write: a 64 x 2048-token prefill step's kvq_batch_write per layer, against
 * kvq_cuda_write of the same rows into the same slots (tables made from the
 * committed sequences: the same blocks written again).
 */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench.h"
#include "cuda/kvq_cuda.h"
#include "kvq.h"
#include "layout.h"

#define BB_LAYERS 8u
#define BB_KV_HEADS 8u
#define BB_Q_HEADS 32u
#define BB_D 128u
#define BB_B 32u
#define BB_STEPS 4u
#define BB_MAX_TOKENS (64u * 8192u)

struct bb_shape {
	uint32_t nseq, ctx;
};

static const struct bb_shape bb_decode_shapes[] = { { 64, 8192 }, { 256, 2048 }, { 256, 1024 } };
static const struct bb_shape bb_write_shape = { 64, 2048 };

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, PROG " batch: %s: %s\n", #x, cudaGetErrorString(e_)); return -EIO; } } while (0)
#define KQ(x, c) do { int r_ = (x); if (r_ < 0) { \
	fprintf(stderr, PROG " batch: %s: %s (%s)\n", #x, kvq_strerror(r_), (c) ? kvq_client_error(c) : ""); \
	return r_; } } while (0)

struct bb {
	kvq_client *c;
	const struct kvq_layout *L;
	kvq_batch *b;
	kvq_seq **s;
	uint32_t nseq;
	uint64_t rng;
	void *k, *v, *q, *out;          /* device: K/V rows, q and out of a decode step */
	size_t kv_rows;
	cudaEvent_t e0, e1;
};

/* Fills n halves of device memory with random activations in [-2, 2). */
static int fill_device(void *d, size_t n, uint64_t *rng)
{
	const size_t chunk = (size_t)1 << 22;
	uint16_t *h = malloc(chunk * sizeof(*h));

	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < chunk; i++)
		h[i] = kvq_f16_from_f32((float)(4.0 * rng_unit(rng) - 2.0));
	for (size_t at = 0; at < n; at += chunk) {
		size_t k = n - at < chunk ? n - at : chunk;
		if (cudaMemcpy((uint16_t *)d + at, h, k * sizeof(*h), cudaMemcpyHostToDevice) != cudaSuccess) {
			free(h);
			return -EIO;
		}
	}
	free(h);
	return 0;
}

static void bb_seqs_free(struct bb *x)
{
	kvq_batch_clear(x->b);
	for (uint32_t i = 0; i < x->nseq; i++)
		kvq_seq_free(x->s[i]);
	free(x->s);
	x->s = NULL;
	x->nseq = 0;
}

/* nseq new sequences of m random tokens each, added to the batch. */
static int bb_add_new(struct bb *x, uint32_t nseq, uint32_t m)
{
	uint32_t *tok = malloc((size_t)m * sizeof(*tok));

	bb_seqs_free(x);
	if (!tok || !(x->s = calloc(nseq, sizeof(*x->s)))) {
		free(tok);
		return -ENOMEM;
	}
	x->nseq = nseq;
	for (uint32_t i = 0; i < nseq; i++) {
		for (uint32_t t = 0; t < m; t++)
			tok[t] = (uint32_t)rng_next(&x->rng);
		KQ(kvq_seq_new(x->c, NULL, 0, &x->s[i]), x->c);
		KQ(kvq_batch_add(x->b, x->s[i], tok, m, 0), x->c);
	}
	free(tok);
	return 0;
}

/* Room for rows of K and V on the device, random. */
static int bb_rows(struct bb *x, size_t rows)
{
	const size_t n = rows * BB_KV_HEADS * BB_D;

	if (rows <= x->kv_rows)
		return 0;
	cudaFree(x->k);
	cudaFree(x->v);
	x->k = x->v = NULL;
	CK(cudaMalloc(&x->k, n * 2));
	CK(cudaMalloc(&x->v, n * 2));
	x->kv_rows = rows;
	if (fill_device(x->k, n, &x->rng) < 0 || fill_device(x->v, n, &x->rng) < 0)
		return -EIO;
	return 0;
}

/* A step that writes every layer (its attention untimed) and commits. */
static int bb_step_all(struct bb *x)
{
	const uint32_t *ip;

	KQ(kvq_batch_begin(x->b, NULL), x->c);
	ip = kvq_batch_indptr(x->b, NULL);
	if (bb_rows(x, ip[x->nseq]) < 0)
		return -EIO;
	for (uint32_t l = 0; l < BB_LAYERS; l++)
		KQ(kvq_batch_write(x->b, l, x->k, x->v), x->c);
	KQ(kvq_batch_commit(x->b), x->c);
	return 0;
}

/* The committed sequences' attention tables (n tokens, the last m
 * queries), on the device; *ret_max_n the longest. */
static int bb_tables(struct bb *x, uint32_t m, bool write, void **ret, uint32_t *ret_max_n)
{
	struct kvq_seq_table *t = calloc(x->nseq, sizeof(*t));
	size_t ids = 0, at = 0;
	int32_t *all;
	uint8_t *d = NULL;

	*ret_max_n = 0;
	for (uint32_t i = 0; i < x->nseq; i++) {
		uint32_t ns, no;
		kvq_seq_blocks(x->s[i], NULL, &ns, NULL, &no);
		ids += (size_t)(write ? 2 : 1) * ns + no + 1;   /* a write's open entries: -1 for each sealed block too */
	}
	all = calloc(ids, sizeof(*all));
	if (!t || !all || cudaMalloc((void **)&d, ids * sizeof(*all) + x->nseq * sizeof(*t)) != cudaSuccess) {
		free(t);
		free(all);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < x->nseq; i++) {
		const int32_t *sl, *op;
		uint32_t ns, no, n = kvq_seq_tokens(x->s[i]);

		kvq_seq_blocks(x->s[i], &sl, &ns, &op, &no);
		t[i] = (struct kvq_seq_table){ .n = n, .m = m, .row0 = i * m };
		if (write) {
			/* the same blocks written again: n = 0, every token new, sealed
			 * blocks straight from the input, the window's through its open slots */
			t[i].n = 0;
			t[i].m = n;
			t[i].row0 = (uint32_t)((size_t)i * n);
		}
		t[i].sealed = (const int32_t *)(d + x->nseq * sizeof(*t) + at * sizeof(*all));
		memcpy(all + at, sl, ns * sizeof(*all));
		at += ns;
		t[i].open = (const int32_t *)(d + x->nseq * sizeof(*t) + at * sizeof(*all));
		if (write)
			for (uint32_t j = 0; j < ns; j++)
				all[at++] = -1;
		memcpy(all + at, op, no * sizeof(*all));
		at += no;
		*ret_max_n = n > *ret_max_n ? n : *ret_max_n;
	}
	if (cudaMemcpy(d, t, x->nseq * sizeof(*t), cudaMemcpyHostToDevice) != cudaSuccess ||
	    cudaMemcpy(d + x->nseq * sizeof(*t), all, at * sizeof(*all), cudaMemcpyHostToDevice) != cudaSuccess) {
		cudaFree(d);
		d = NULL;
	}
	free(t);
	free(all);
	*ret = d;
	return d ? 0 : -EIO;
}

static double bb_elapsed(struct bb *x)
{
	float ms = 0;

	cudaEventSynchronize(x->e1);
	cudaEventElapsedTime(&ms, x->e0, x->e1);
	return ms;
}

/* KV bytes one layer's decode reads over the committed sequences. */
static uint64_t bb_kv_bytes(const struct bb *x)
{
	const struct kvq_layer_layout *ll = &x->L->layer[0];
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < x->nseq; i++) {
		uint32_t ns, no;
		kvq_seq_blocks(x->s[i], NULL, &ns, NULL, &no);
		bytes += (uint64_t)ns * ll->sealed_slice + (uint64_t)no * ll->open_slice;
	}
	return bytes;
}

static int bb_decode(struct bb *x, const char *fmt, struct bb_shape sh)
{
	const uint32_t nt = BB_STEPS * BB_LAYERS;
	double api[BB_STEPS * BB_LAYERS], own[BB_STEPS * BB_LAYERS], api_ms, own_ms;
	uint32_t tok, max_n = 0, ms_splits = 0;
	struct kvq_cuda_attn a;
	void *tab = NULL, *ws = NULL;
	size_t wsb;
	uint64_t bytes;
	int r;

	if ((r = bb_add_new(x, sh.nseq, sh.ctx - 1)) < 0 || (r = bb_step_all(x)) < 0)
		return r;
	for (uint32_t st = 0; st < BB_STEPS; st++) {
		kvq_batch_clear(x->b);
		for (uint32_t i = 0; i < x->nseq; i++) {
			tok = (uint32_t)rng_next(&x->rng);
			KQ(kvq_batch_add(x->b, x->s[i], &tok, 1, 0), x->c);
		}
		KQ(kvq_batch_begin(x->b, NULL), x->c);
		for (uint32_t l = 0; l < BB_LAYERS; l++) {
			KQ(kvq_batch_write(x->b, l, x->k, x->v), x->c);
			cudaEventRecord(x->e0, NULL);
			KQ(kvq_batch_attention_device(x->b, l, BB_Q_HEADS, 0.0f, x->q, x->out, 0), x->c);
			cudaEventRecord(x->e1, NULL);
			api[st * BB_LAYERS + l] = bb_elapsed(x);
		}
		KQ(kvq_batch_commit(x->b), x->c);
	}
	/* the kernels' own interface over the same tables, after the last step */
	if ((r = bb_tables(x, 1, false, &tab, &max_n)) < 0)
		return r;
	a = (struct kvq_cuda_attn){ .L = x->L, .base = kvq_client_base(x->c), .q_heads = BB_Q_HEADS,
		.scale = 0.088388f, .q_dtype = x->L->act, .out_dtype = x->L->act, .max_n = max_n, .max_q = 1,
		.total_q = x->nseq };
	wsb = kvq_cuda_attention_workspace(&a, x->nseq);
	if (wsb && cudaMalloc(&ws, wsb) != cudaSuccess) {
		cudaFree(tab);
		return -ENOMEM;
	}
	a.workspace = ws;
	a.workspace_bytes = wsb;
	for (uint32_t st = 0; st < BB_STEPS; st++)
		for (uint32_t l = 0; l < BB_LAYERS; l++) {
			a.layer = l;
			cudaEventRecord(x->e0, NULL);
			r = kvq_cuda_attention(&a, tab, x->nseq, x->q, x->out);
			cudaEventRecord(x->e1, NULL);
			own[st * BB_LAYERS + l] = bb_elapsed(x);
			if (r < 0)
				break;
		}
	kvq_cuda_attention_plan(&a, x->nseq, &ms_splits);
	cudaFree(tab);
	cudaFree(ws);
	if (r < 0) {
		fprintf(stderr, PROG " batch: kvq_cuda_attention: %s\n", kvq_strerror(r));
		return r;
	}
	bytes = bb_kv_bytes(x);
	api_ms = median(api, nt);
	own_ms = median(own, nt);
	printf("decode  %-9s %4u x %-6u %9.4f %9.4f %8.3f %8.0f %8.0f %6u\n", fmt, sh.nseq, sh.ctx, api_ms, own_ms,
	       api_ms / own_ms, bytes / api_ms * 1e-6, bytes / own_ms * 1e-6, ms_splits);
	return 0;
}

static int bb_write(struct bb *x, const char *fmt)
{
	double api[BB_LAYERS * BB_STEPS], own[BB_LAYERS * BB_STEPS], api_ms, own_ms;
	uint32_t max_n = 0;
	void *tab = NULL;
	int r;

	for (uint32_t st = 0; st < BB_STEPS; st++) {
		const uint32_t *ip;

		if ((r = bb_add_new(x, bb_write_shape.nseq, bb_write_shape.ctx)) < 0)
			return r;
		KQ(kvq_batch_begin(x->b, NULL), x->c);
		ip = kvq_batch_indptr(x->b, NULL);
		if (bb_rows(x, ip[x->nseq]) < 0)
			return -EIO;
		for (uint32_t l = 0; l < BB_LAYERS; l++) {
			cudaEventRecord(x->e0, NULL);
			KQ(kvq_batch_write(x->b, l, x->k, x->v), x->c);
			cudaEventRecord(x->e1, NULL);
			api[st * BB_LAYERS + l] = bb_elapsed(x);
		}
		KQ(kvq_batch_commit(x->b), x->c);
	}
	if ((r = bb_tables(x, 0, true, &tab, &max_n)) < 0)
		return r;
	for (uint32_t st = 0; st < BB_STEPS; st++)
		for (uint32_t l = 0; l < BB_LAYERS; l++) {
			cudaEventRecord(x->e0, NULL);
			r = kvq_cuda_write(x->L, kvq_client_base(x->c), l, tab, x->nseq, bb_write_shape.ctx, x->k, x->v, NULL);
			cudaEventRecord(x->e1, NULL);
			own[st * BB_LAYERS + l] = bb_elapsed(x);
			if (r < 0)
				break;
		}
	cudaFree(tab);
	if (r < 0) {
		fprintf(stderr, PROG " batch: kvq_cuda_write: %s\n", kvq_strerror(r));
		return r;
	}
	api_ms = median(api, BB_LAYERS * BB_STEPS);
	own_ms = median(own, BB_LAYERS * BB_STEPS);
	printf("write   %-9s %4u x %-6u %9.4f %9.4f %8.3f\n", fmt, bb_write_shape.nseq, bb_write_shape.ctx, api_ms, own_ms,
	       api_ms / own_ms);
	return 0;
}

static int bb_format(const char *sock, const char *fmt)
{
	char pool[64];
	/* the largest shape's blocks, the decode steps' and the windows' */
	const uint32_t nb = BB_MAX_TOKENS / BB_B + 4 * 256;
	struct kvq_attach_params p = { .pool = pool, .model_id = "kvq-bench-batch", .layers = BB_LAYERS,
		.kv_heads = BB_KV_HEADS, .head_dim = BB_D, .block_tokens = BB_B, .policy = fmt,
		.act = KVQ_ACT_F16, .create = 1, .n_sealed = nb, .n_open = 6 * 256, .backend = "cuda",
		.device = -1 };
	struct bb x = { .rng = 0x6b7671ull };
	const size_t qn = (size_t)256 * BB_Q_HEADS * BB_D;
	int r;

	snprintf(pool, sizeof pool, "kvq-bench-batch-%s", fmt);
	KQ(kvq_client_connect(sock, "kvq-bench-batch", &x.c), NULL);
	if ((r = kvq_client_attach(x.c, &p)) < 0) {
		fprintf(stderr, PROG " batch: attach %s: %s\n", pool, kvq_client_error(x.c));
		kvq_client_free(x.c);
		return r;
	}
	x.L = kvq_client_layout(x.c);
	r = kvq_batch_new(x.c, &x.b);
	if (r == 0 && (cudaMalloc(&x.q, qn * 2) != cudaSuccess || cudaMalloc(&x.out, qn * 2) != cudaSuccess ||
		       cudaEventCreate(&x.e0) != cudaSuccess || cudaEventCreate(&x.e1) != cudaSuccess ||
		       fill_device(x.q, qn, &x.rng) < 0))
		r = -EIO;
	for (size_t i = 0; r == 0 && i < sizeof bb_decode_shapes / sizeof bb_decode_shapes[0]; i++)
		r = bb_decode(&x, fmt, bb_decode_shapes[i]);
	if (r == 0)
		r = bb_write(&x, fmt);
	bb_seqs_free(&x);
	kvq_batch_free(x.b);
	cudaFree(x.k);
	cudaFree(x.v);
	cudaFree(x.q);
	cudaFree(x.out);
	if (x.e0)
		cudaEventDestroy(x.e0);
	if (x.e1)
		cudaEventDestroy(x.e1);
	kvq_client_free(x.c);
	return r;
}

int bench_batch(int argc, char **argv)
{
	const char *sock = NULL, *formats = "int8,int4g32";
	char list[256], *save = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
			sock = argv[++i];
		} else if (!strcmp(argv[i], "--format") && i + 1 < argc) {
			formats = argv[++i];
		} else {
			fprintf(stderr, "usage: " PROG " batch [--socket PATH] [--format LIST]\n");
			return 2;
		}
	}
	snprintf(list, sizeof list, "%s", formats);
	printf("# kvq-bench batch: L=%u pool layers, %u/%u heads, D=%u, B=%u; median of %u steps x %u layers\n",
	       BB_LAYERS, BB_Q_HEADS, BB_KV_HEADS, BB_D, BB_B, BB_STEPS, BB_LAYERS);
	printf("# ms per layer: libkvq's batch API (api) and the kernels' interface on the same tables (kernels)\n");
	printf("# phase  format    shape            api_ms kernels_ms api/kern  api_GB/s kern_GB/s splits\n");
	for (char *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save))
		if (bb_format(sock, f) < 0)
			return 1;
	return 0;
}
