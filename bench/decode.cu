/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench decode | prefill | append: paged attention and the write on the
 * GPU, per format and shape, on a pool laid out for L = 32 layers (one layer
 * timed: an L = 1 pool would hide the address-range costs), H KV heads,
 * D = 128 (64 in SmolLM2's shapes), B = 32 (--block), the KV written by
 * kvq_cuda_write from random activations and the blocks of every sequence
 * scattered over the pool.  decode: one query token per sequence; prefill:
 * 4 sequences, a 2048- or 512-token chunk over a cached 8192-token prefix,
 * a cold 8192-token prompt, and the first at 9/3 heads and D = 64 (the
 * chunk's KV written first, as a worker does; TFLOP/s as FlashAttention
 * counts them);
 * append: the kvq_cuda_write of a 64 x 2048-token prefill at D = 128 and
 * 64 and of a 256 x 2048 one at D = 128, median of --runs (input read,
 * sealed slices and open rows written) against a device-to-device copy,
 * and a decode step's write on that pool (one token a sequence; with and
 * without a block sealed per sequence) in microseconds.
 * Time: CUDA events around each launch, median of the runs after warm-up,
 * the L2 flushed before each run; the kernel kvq_cuda_attention chose and
 * its KV splits are printed beside.
 * Bytes: what the step must read (sealed slices and the open rows up to n).
 * Read bandwidth: a read-only reduction over 4 GiB in the same run.
 * `--grid` (decode) times the serving grid instead of the short list:
 * batch x context in {1x131072, 8x65536, 64x8192, 256x2048, 256x1024,
 * 128x4096} by heads {32/8, 64/8, 40/8, 8/1} at D = 128 and 9/3 at D = 64,
 * and prints per cell each format's % of read bandwidth against its
 * target and whether a scalar format was slower than one of more bytes per
 * token (a cell whose f16 step reads under 256 MiB is printed, not
 * judged); `--format all` takes every pair with kernels.
 * `--kernels sm90` times the Hopper decode kernel where a pair has it; the
 * default (auto) times the kernels that run on sm_80 and later
 * (KVQ_CUDA_KERNELS, kvq_cuda.h).
 * `--sdpa FILE` takes bench/sdpa.py's PyTorch times for the speed-up column,
 * `--fi FILE` the output of FlashInfer's timing programs (fi_attn, fi_decode)
 * for theirs.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kvq_cuda.h"
#include "format.h"
#include "policy.h"
#include "layout.h"

#define PROG "kvq-bench decode"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, PROG ": %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static __global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
	unsigned x = 0;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		uint4 v = p[i];
		x ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (x == 0x9e3779b9u)   /* practically never: keeps the loads */
		*sink = x;
}

/* Activations in [-2, 2) from a hash of the index (never all zero). */
static __global__ void fill_kernel(uint16_t *p, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = (uint32_t)i * 2654435761u ^ seed;
		h ^= h >> 15;
		h *= 2246822519u;
		h ^= h >> 13;
		float u = (float)(h >> 8) * (1.0f / 16777216.0f);
		p[i] = __half_as_ushort(__float2half_rn(4.0f * u - 2.0f));
	}
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

static float median(float *v, int n)
{
	qsort(v, n, sizeof *v, cmp_float);
	return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* A buffer twice the L2's size, written before every timed call so that no
 * call finds the previous one's KV in the L2 (a hit is not bandwidth). */
static void *l2_buf;
static size_t l2_bytes;

static void l2_flush(int i)
{
	if (!l2_buf) {
		int dev = 0, l2 = 0;
		CK(cudaGetDevice(&dev));
		CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
		l2_bytes = 2 * (size_t)(l2 > 0 ? l2 : 64 << 20);
		CK(cudaMalloc(&l2_buf, l2_bytes));
	}
	CK(cudaMemsetAsync(l2_buf, i & 0xff, l2_bytes));
}

/* Median time (ms) of runs calls of launch() after warm ones, CUDA events
 * around each call, the L2 flushed before each; launch returns 0, or a
 * kvq_cuda code that ends the run. */
template <typename F> static float median_ms(int warm, int runs, const char *what, F launch)
{
	cudaEvent_t e0, e1;
	float t[256];

	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < warm + runs; i++) {
		l2_flush(i);
		CK(cudaEventRecord(e0));
		int rc = launch();
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		if (rc) {
			fprintf(stderr, PROG ": %s: %d (%s)\n", what, rc, kvq_cuda_error());
			exit(1);
		}
		if (i >= warm)
			CK(cudaEventElapsedTime(&t[i - warm], e0, e1));
	}
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
	return median(t, runs);
}

static double read_bandwidth(int runs)
{
	const size_t bytes = (size_t)4 << 30;
	uint4 *buf;
	unsigned *sink;

	CK(cudaMalloc(&buf, bytes));
	CK(cudaMalloc(&sink, 4));
	fill_kernel<<<4096, 256>>>((uint16_t *)buf, bytes / 2, 7);
	float ms = median_ms(2, runs, "read pass", [&] {
		read_kernel<<<132 * 8, 512>>>(buf, bytes / 16, sink);
		CK(cudaPeekAtLastError());
		return 0;
	});
	CK(cudaFree(buf));
	CK(cudaFree(sink));
	return bytes / (ms * 1e-3) / 1e9;
}

struct shape {
	uint32_t batch, ctx, q_heads, kv_heads;
	uint32_t nq;   /* query tokens per sequence: 1 for decode, a chunk for prefill */
	uint32_t D;    /* head dim */
};

/* FLOP of a step as FlashAttention counts them: 4 · query heads · D per
 * unmasked query-key pair (the chunk attends causally to the prefix and itself). */
static double step_flop(const struct shape *sh)
{
	const double pairs = (double)(sh->ctx - sh->nq) * sh->nq + (double)sh->nq * (sh->nq + 1) / 2;
	return 4.0 * sh->q_heads * sh->D * pairs * sh->batch;
}

struct result {
	const char *format;
	struct shape s;
	const char *kernel;            /* what kvq_cuda_attention launched */
	uint32_t splits;
	double ms, gbps;               /* attention */
	double write_ms, write_bytes;  /* kvq_cuda_write of the whole context (append/seal) */
	double step_us[2];             /* append: a decode step's write, no block sealed [0] or one a sequence [1] */
	double token_bytes;            /* KV bytes of a sealed token (all KV heads of the layer) */
};

static uint32_t force_splits;   /* --splits: 0 lets kvq_cuda_attention choose */

/* The layout of format fmt on shape sh: 32 layers, B tokens a block, a
 * sealed slot for each block of every sequence, the open slots of its
 * window; NULL, with the reason in err, where the layout refuses the format
 * at that shape (int4g128 at D = 64). */
static struct kvq_layout *try_layout(const char *fmt, struct shape sh, uint32_t B, char *err, size_t errlen)
{
	struct kvq_policy pol;
	struct kvq_layout *L = NULL;

	if (kvq_policy_parse(fmt, 32, &pol, err, errlen)) {
		fprintf(stderr, PROG ": %s\n", err);
		exit(2);
	}
	uint32_t R = kvq_layout_default_window(&pol, B), nb = (sh.ctx + B - 1) / B, nw = R / B + 1;
	struct kvq_layout_params lp = { .layers = 32, .kv_heads = sh.kv_heads, .head_dim = sh.D, .block_tokens = B,
		.window = R, .n_sealed = sh.batch * nb, .n_open = sh.batch * nw, .act = KVQ_DT_F16, .policy = &pol };
	return kvq_layout_new(&lp, &L, err, errlen) ? NULL : L;
}

static struct kvq_layout *bench_layout(const char *fmt, struct shape sh, uint32_t B)
{
	char err[256];
	struct kvq_layout *L = try_layout(fmt, sh, B, err, sizeof err);

	if (!L) {
		fprintf(stderr, PROG ": %s\n", err);
		exit(2);
	}
	return L;
}

/* Whether format fmt's pool fits on shape sh beside the inputs (K and V of
 * the whole context) and 1 GiB to spare, out of free_b free bytes; sets
 * *ret_bytes to its size, or to 0 with the reason in why where the layout
 * refuses the format at that shape. */
static bool pool_fits(const char *fmt, struct shape sh, uint32_t B, size_t free_b, size_t *ret_bytes, char *why,
		      size_t whylen)
{
	struct kvq_layout *L = try_layout(fmt, sh, B, why, whylen);

	*ret_bytes = L ? L->total_bytes : 0;
	if (!L)
		return false;
	snprintf(why, whylen, "does not fit in device memory");
	kvq_layout_free(L);
	return *ret_bytes + (size_t)sh.batch * sh.ctx * sh.kv_heads * sh.D * 4 + ((size_t)1 << 30) <= free_b;
}

/* A decode step's write on the pool of a prefill of sh.ctx tokens a
 * sequence (sealed ids dids): one token a sequence at n = ctx - B + 1,
 * which seals nothing, and at n = ctx - B, where each sequence's oldest
 * window block leaves the window and is sealed (the open window given open
 * slots of its own); microseconds, median of 30 after warm-up. */
static void step_writes(const struct kvq_layout *L, struct shape sh, void *pool, const void *kin, const void *vin,
			const int32_t *dids, double ret_us[2])
{
	const uint32_t B = L->block_tokens, nb = (sh.ctx + B - 1) / B, nw = L->window / B + 1;
	int32_t *oids = (int32_t *)malloc((size_t)sh.batch * nw * sizeof(int32_t)), *doids;
	struct kvq_seq_table *t = (struct kvq_seq_table *)calloc(sh.batch, sizeof *t);
	void *dseq;

	for (uint32_t i = 0; i < sh.batch * nw; i++)
		oids[i] = (int32_t)i;
	CK(cudaMalloc(&doids, (size_t)sh.batch * nw * sizeof(int32_t)));
	CK(cudaMemcpy(doids, oids, (size_t)sh.batch * nw * sizeof(int32_t), cudaMemcpyHostToDevice));
	CK(cudaMalloc(&dseq, sh.batch * sizeof *t));
	for (int seal = 0; seal < 2; seal++) {
		/* S(n + 1) > S(n) where n - R is a multiple of B (kvq_split) */
		const uint32_t n = sh.ctx - B + (seal ? 0 : 1);
		for (uint32_t b = 0; b < sh.batch; b++)
			t[b] = (struct kvq_seq_table){ n, 1, b, 0, dids + b * nb, doids + b * nw };
		CK(cudaMemcpy(dseq, t, sh.batch * sizeof *t, cudaMemcpyHostToDevice));
		ret_us[seal] = 1e3 * median_ms(3, 30, "kvq_cuda_write (a decode step)", [&] {
			return kvq_cuda_write(L, pool, 0, (const struct kvq_seq_table *)dseq, sh.batch, 1, kin, vin, NULL);
		});
	}
	cudaFree(doids);
	cudaFree(dseq);
	free(oids);
	free(t);
}

/* Times one format on one shape in the pool memory `pool` (every format of
 * a shape in the same memory: formats timed in pools allocated one after
 * another decoded up to 17 % apart for the allocation alone). */
static void run_one(const char *fmt, struct shape sh, uint32_t B, void *pool, int runs, int write_runs,
		    struct result *ret)
{
	const uint32_t D = sh.D;
	struct kvq_layout *L = bench_layout(fmt, sh, B);
	const uint32_t nb = (sh.ctx + B - 1) / B, nw = L->window / B + 1;
	const size_t rows = (size_t)sh.batch * sh.ctx, per = (size_t)sh.kv_heads * D;
	void *kin, *vin, *q, *out, *dseq, *ws = NULL;
	int32_t *ids = (int32_t *)malloc((size_t)sh.batch * nb * sizeof(int32_t)), *dids;
	int32_t *oids = (int32_t *)malloc((size_t)sh.batch * nb * sizeof(int32_t)), *doids;
	CK(cudaMalloc(&kin, rows * per * 2));
	CK(cudaMalloc(&vin, rows * per * 2));
	const size_t qel = (size_t)sh.batch * sh.nq * sh.q_heads * D;
	CK(cudaMalloc(&q, qel * 2));
	CK(cudaMalloc(&out, qel * 2));
	CK(cudaMalloc(&dids, (size_t)sh.batch * nb * sizeof(int32_t)));
	CK(cudaMalloc(&doids, (size_t)sh.batch * nb * sizeof(int32_t)));
	/* a codebook format's centroids: values of the activations' range */
	if (L->codebook_bytes)
		fill_kernel<<<256, 256>>>((uint16_t *)((uint8_t *)pool + L->codebook_off), L->codebook_bytes / 2, 4);
	fill_kernel<<<4096, 256>>>((uint16_t *)kin, rows * per, 1);
	fill_kernel<<<4096, 256>>>((uint16_t *)vin, rows * per, 2);
	fill_kernel<<<64, 256>>>((uint16_t *)q, qel, 3);

	/* every sequence's sealed blocks scattered over the pool; its open
	 * window in open slots of its own (the write reads open ids only for
	 * blocks from S(ctx)/B on) */
	for (uint32_t i = 0; i < sh.batch * nb; i++)
		ids[i] = (int32_t)i;
	srand(42);
	for (uint32_t i = sh.batch * nb; i > 1; i--) {
		uint32_t j = (uint32_t)rand() % i;
		int32_t t = ids[i - 1];
		ids[i - 1] = ids[j];
		ids[j] = t;
	}
	const uint32_t first_open = kvq_layout_split(L, sh.ctx) / B;
	for (uint32_t b = 0; b < sh.batch; b++)
		for (uint32_t j = 0; j < nb; j++)
			oids[b * nb + j] = j >= first_open ? (int32_t)(b * nw + j - first_open) : -1;
	CK(cudaMemcpy(dids, ids, (size_t)sh.batch * nb * sizeof(int32_t), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(doids, oids, (size_t)sh.batch * nb * sizeof(int32_t), cudaMemcpyHostToDevice));
	struct kvq_seq_table *w = (struct kvq_seq_table *)calloc(sh.batch, sizeof *w);
	struct kvq_seq_table *s = (struct kvq_seq_table *)calloc(sh.batch, sizeof *s);
	for (uint32_t b = 0; b < sh.batch; b++) {
		w[b] = (struct kvq_seq_table){ 0, sh.ctx, b * sh.ctx, 0, dids + b * nb, doids + b * nb };
		s[b] = (struct kvq_seq_table){ sh.ctx, sh.nq, b * sh.nq, 0, dids + b * nb, doids + b * nb + first_open };
	}
	CK(cudaMalloc(&dseq, sh.batch * (sizeof *w > sizeof *s ? sizeof *w : sizeof *s)));
	CK(cudaMemcpy(dseq, w, sh.batch * sizeof *w, cudaMemcpyHostToDevice));
	/* the prefill's write (the same bytes each time), timed too */
	ret->write_ms = median_ms(1, write_runs, "kvq_cuda_write", [&] {
		return kvq_cuda_write(L, pool, 0, (const struct kvq_seq_table *)dseq, sh.batch, sh.ctx, kin, vin,
				      NULL);
	});
	{
		/* input K and V read, sealed slices and open rows written */
		uint32_t sealed = kvq_layout_split(L, sh.ctx);
		ret->write_bytes = (double)rows * per * 2 * 2 +
				   (double)sh.batch * ((double)(sealed / B) * L->layer[0].sealed_slice +
						       (double)(sh.ctx - sealed) * per * 2 * 2);
	}
	if (write_runs > 4)   /* append */
		step_writes(L, sh, pool, kin, vin, dids, ret->step_us);
	CK(cudaMemcpy(dseq, s, sh.batch * sizeof *s, cudaMemcpyHostToDevice));

	struct kvq_cuda_attn a = { L, pool, 0, sh.q_heads, 1.0f / sqrtf((float)D), KVQ_DT_F16, KVQ_DT_F16,
				   sh.ctx, sh.nq, sh.batch * sh.nq, force_splits, NULL, 0, NULL };
	a.workspace_bytes = kvq_cuda_attention_workspace(&a, sh.batch);
	if (a.workspace_bytes)
		CK(cudaMalloc(&ws, a.workspace_bytes));
	a.workspace = ws;
	ret->kernel = kvq_cuda_attention_plan(&a, sh.batch, &ret->splits);
	char what[96];
	snprintf(what, sizeof what, "kvq_cuda_attention (%s)", fmt);
	ret->ms = median_ms(3, runs, what, [&] {
		return kvq_cuda_attention(&a, (const struct kvq_seq_table *)dseq, sh.batch, q, out);
	});
	/* bytes the step reads: sealed slices, and open rows up to n */
	uint32_t sealed = kvq_layout_split(L, sh.ctx);
	double bytes = (double)sh.batch * ((double)(sealed / B) * L->layer[0].sealed_slice +
					   (double)(sh.ctx - sealed) * sh.kv_heads * D * 2 * 2);
	ret->format = fmt;
	ret->s = sh;
	ret->token_bytes = (double)L->layer[0].sealed_slice / B;
	ret->gbps = bytes / (ret->ms * 1e-3) / 1e9;

	cudaFree(kin);
	cudaFree(vin);
	cudaFree(q);
	cudaFree(out);
	cudaFree(dids);
	cudaFree(doids);
	free(oids);
	cudaFree(dseq);
	if (ws)
		cudaFree(ws);
	free(ids);
	free(w);
	free(s);
	kvq_layout_free(L);
}

/* Copy bandwidth: a device-to-device cudaMemcpy of 2 GiB, bytes read + written. */
static double copy_bandwidth(int runs)
{
	const size_t bytes = (size_t)2 << 30;
	void *a, *b;

	CK(cudaMalloc(&a, bytes));
	CK(cudaMalloc(&b, bytes));
	fill_kernel<<<4096, 256>>>((uint16_t *)a, bytes / 2, 9);
	float ms = median_ms(2, runs, "copy", [&] {
		CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
		return 0;
	});
	CK(cudaFree(a));
	CK(cudaFree(b));
	return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

/* PyTorch SDPA times from bench/sdpa.py: lines "MODE batch context q_heads
 * kv_heads nq ms"; 0 when the shape is not there. */
static double sdpa_ms(const char *file, const char *mode, const struct shape *sh)
{
	FILE *f = file ? fopen(file, "r") : NULL;
	char m[32], line[256];
	unsigned b, c, qh, kh, nq;
	double ms, found = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "%31s %u %u %u %u %u %lf", m, &b, &c, &qh, &kh, &nq, &ms) == 7 && !strcmp(m, mode) &&
		    b == sh->batch && c == sh->ctx && qh == sh->q_heads && kh == sh->kv_heads && nq == sh->nq)
			found = ms;
	fclose(f);
	return found;
}

/* FlashInfer's decode times (the JSON lines of its timing programs fi_attn
 * and fi_decode, given with --fi): the fastest of its paths at this shape
 * (D = 128, one query token) for KV "f16" or "fp8"; 0 when none. */
#define MAX_FI 4
static const char *fi_files[MAX_FI];
static int n_fi;

static double fi_ms(const struct shape *sh, const char *kv)
{
	double best = 0;

	if (sh->D != 128 || sh->nq != 1)
		return 0;
	for (int i = 0; i < n_fi; i++) {
		FILE *f = fopen(fi_files[i], "r");
		static char line[1 << 16];
		if (!f)
			continue;
		while (fgets(line, sizeof line, f)) {
			const char *p = line;
			while ((p = strstr(p, "{\"kv\":\""))) {
				char k[16];
				unsigned b, c, qh = 0, kh = 0;
				double ms;
				const char *h = strstr(p, "\"qo_heads\":"), *e = strchr(p, '}');
				if (sscanf(p, "{\"kv\":\"%15[^\"]\",\"batch\":%u,\"context\":%u,\"ms\":%lf", k, &b, &c, &ms) == 4 &&
				    h && e && h < e && sscanf(h, "\"qo_heads\":%u,\"kv_heads\":%u", &qh, &kh) == 2 &&
				    !strcmp(k, kv) && b == sh->batch && c == sh->ctx && qh == sh->q_heads && kh == sh->kv_heads &&
				    ms > 0 && (!best || ms < best))
					best = ms;
				p++;
			}
		}
		fclose(f);
	}
	return best;
}

/* "BATCHxCONTEXTxHQ/HKVxD" into a decode shape; 0, or -1 when malformed. */
static int parse_shape(const char *arg, struct shape *sh)
{
	unsigned b, c, qh, kh, d;
	char tail;

	if (sscanf(arg, "%ux%ux%u/%ux%u%c", &b, &c, &qh, &kh, &d, &tail) != 5 || b < 1 || b > 4096 || c < 1 ||
	    c > (1u << 22) || kh < 1 || kh > 64 || qh % kh || qh / kh < 1 || qh / kh > 8 || (d != 64 && d != 128))
		return -1;
	*sh = (struct shape){ b, c, qh, kh, 1, d };
	return 0;
}

/* --grid: the serving shapes the decode targets are judged on, batch x
 * context by heads (D = 128, and SmolLM2's 9/3 at D = 64). */
static int grid_shapes(struct shape *out)
{
	static const uint32_t bc[][2] = { { 1, 131072 }, { 8, 65536 }, { 64, 8192 },
					  { 256, 2048 }, { 256, 1024 }, { 128, 4096 } };
	static const uint32_t heads[][3] = { { 32, 8, 128 }, { 64, 8, 128 }, { 40, 8, 128 }, { 8, 1, 128 }, { 9, 3, 64 } };
	int n = 0;

	for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
		for (size_t i = 0; i < sizeof bc / sizeof bc[0]; i++)
			out[n++] = (struct shape){ bc[i][0], bc[i][1], heads[h][0], heads[h][1], 1, heads[h][2] };
	return n;
}
#define GRID_SHAPES 30

/* A cell is judged where the f16 step of one layer reads at least 256 MiB
 * (below, launch latency dominates). */
static bool judged(const struct shape *sh)
{
	return (double)sh->batch * sh->ctx * sh->kv_heads * sh->D * 2 * 2 >= 256.0 * (1 << 20);
}

/* The target of a format (a --format entry), % of read bandwidth; 0 where
 * none is set.  A pair with a codebook part is held to the codebook
 * formats' (and not slower than int8); a mixed pair with a 4- or 2-bit
 * part to kivi2's. */
static double target_pct(const char *fmt, bool *codebook)
{
	static const struct { const char *name; double pct; } t[] = {
		{ "f16", 95 }, { "bf16", 95 }, { "int8", 93 }, { "fp8", 93 }, { "fp8e5m2", 93 },
		{ "int4g32", 85 }, { "int4g64", 85 }, { "int4g128", 85 }, { "kivi4", 80 }, { "kivi2", 70 },
		{ "pq2", 50 }, { "pq1", 50 },
	};
	struct kvq_policy pol;

	*codebook = false;
	if (kvq_policy_parse(fmt, 1, &pol, NULL, 0))
		return 0;
	const int k = pol.k[0], v = pol.v[0];
	*codebook = kvq_fmt_code(k) == KVQ_CODE_INDEX || kvq_fmt_code(v) == KVQ_CODE_INDEX;
	if (k == v) {
		for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
			if (!strcmp(kvq_fmt_name(k), t[i].name))
				return t[i].pct;
		return 0;
	}
	return *codebook ? 50 : kvq_fmt_bits(k) <= 4 || kvq_fmt_bits(v) <= 4 ? 70 : 0;
}

/* The checks of one cell of the grid, its n results in r: each format
 * against its target, codebook formats not slower than int8, and no scalar
 * format slower than one of more bytes per token. */
static void grid_checks(const struct result *r, int n, double rbw)
{
	const struct shape *sh = &r[0].s;
	const double f16_mib = (double)sh->batch * sh->ctx * sh->kv_heads * sh->D * 4 / (1 << 20);
	const bool judge = judged(sh);
	double int8_ms = 0, want[64];
	bool cb[64];

	n = n < 64 ? n : 64;
	for (int i = 0; i < n; i++) {
		want[i] = target_pct(r[i].format, &cb[i]);
		if (!strcmp(r[i].format, "int8"))
			int8_ms = r[i].ms;
	}
	printf("cell %ux%u %u/%u D=%u: the f16 step reads %.0f MiB%s\n", sh->batch, sh->ctx, sh->q_heads, sh->kv_heads,
	       sh->D, f16_mib, judge ? "" : ", not judged (under 256 MiB)");
	printf("  %-16s %7s %7s %6s %-6s %-6s %s\n", "format", "%read", "target", "B/tok", "target", "order",
	       "slower than");
	for (int i = 0; i < n; i++) {
		const double pct = 100.0 * r[i].gbps / rbw;
		const char *slower = NULL;   /* a scalar format of more bytes per token that was faster */
		for (int j = 0; j < n && !cb[i] && !slower; j++)
			if (!cb[j] && r[j].token_bytes > r[i].token_bytes && r[j].ms < r[i].ms)
				slower = r[j].format;
		const bool hit = pct >= want[i] && !(cb[i] && int8_ms > 0 && r[i].ms > int8_ms);
		printf("  %-16s %6.1f%% %6.0f%% %6.0f %-6s %-6s %s\n", r[i].format, pct, want[i], r[i].token_bytes,
		       !judge ? "-" : want[i] > 0 ? (hit ? "PASS" : "MISS") : "none",
		       !judge || cb[i] ? "-" : slower ? "MISS" : "PASS", slower ? slower : "");
	}
}

/* --format all: every (K, V) pair with CUDA attention kernels at D = 128,
 * as --format entries, into fmts (allocated); returns their number. */
static int all_formats(char **fmts, int max)
{
	int n = 0;

	for (int k = 0; k < KVQ_FMT_COUNT; k++)
		for (int v = 0; v < KVQ_FMT_COUNT && n < max; v++)
			if (kvq_cuda_attention_supported(k, v, 128, KVQ_DT_F16)) {
				char f[64];
				if (k == v)
					snprintf(f, sizeof f, "%s", kvq_fmt_name(k));
				else
					snprintf(f, sizeof f, "k=%s,v=%s", kvq_fmt_name(k), kvq_fmt_name(v));
				fmts[n++] = strdup(f);
			}
	return n;
}

static void usage(const char *mode)
{
	fprintf(stderr, "usage: kvq-bench %s [--json] [--quick] [--format LIST|all] [--runs N (1-200)] [--block B (16-256, "
			"a multiple of 16)] [--splits N (1-64 KV splits, not chosen)] [--sdpa FILE (bench/sdpa.py's output)] "
			"[--kernels auto|sm90 (KVQ_CUDA_KERNELS)]%s%s\n", mode,
		strcmp(mode, "prefill") ? " [--shape BATCHxCONTEXTxHQ/HKVxD]..." : "",
		strcmp(mode, "decode") ? "" : " [--fi FILE (fi_attn or fi_decode output)]... [--grid (the serving grid: "
		"batch x context x heads, targets checked)]");
}

/* The entries of a --format list into fmts (allocated; a k=X,v=Y spec is
 * one entry), at most max; returns their number. */
static int split_formats(const char *list, char **fmts, int max)
{
	char buf[1024], *save = NULL;
	int n = 0;

	snprintf(buf, sizeof buf, "%s", list);
	for (char *f = strtok_r(buf, ",", &save); f && n < max; f = strtok_r(NULL, ",", &save)) {
		char pair[128];
		if (!strncmp(f, "k=", 2) || !strncmp(f, "v=", 2)) {
			const char *o = strtok_r(NULL, ",", &save);
			snprintf(pair, sizeof pair, "%s,%s", f, o ? o : "");
			f = pair;
		}
		fmts[n++] = strdup(f);
	}
	return n;
}

/* kvq-bench decode | prefill | append: the command name is argv[0]. */
extern "C" int bench_decode(int argc, char **argv)
{
	const char *mode = argv[0], *list = "f16,int8,fp8,int4g32,kivi4,kivi2", *sdpa = NULL;
	int json = 0, quick = 0, runs = 30;
	uint32_t B = 32;
	/* FlashInfer's four shapes; one long request (split-KV must fill the
	 * GPU); SmolLM2-135M's heads (9/3, D = 64) */
	static const struct shape decode_shapes[] = {
		{ 64, 8192, 32, 8, 1, 128 }, { 16, 32768, 32, 8, 1, 128 }, { 256, 2048, 32, 8, 1, 128 },
		{ 4, 131072, 64, 8, 1, 128 }, { 1, 131072, 32, 8, 1, 128 }, { 64, 8192, 9, 3, 1, 64 },
	};
	/* 4 sequences: a 2048-token chunk over a cached 8192-token prefix (the
	 * first shape, the one --quick runs), a 512-token chunk over 8192, a cold
	 * 8192-token prompt, and the first at SmolLM2's shape (9/3 heads, D = 64);
	 * append: a 64 x 2048 prefill, at D = 128 (32/8 heads) and SmolLM2's
	 * D = 64 (9/3), and 256 x 2048 at D = 128 (a decode step's write at
	 * 256 sequences) */
	static const struct shape prefill_shapes[] = {
		{ 4, 10240, 32, 8, 2048, 128 }, { 4, 8704, 32, 8, 512, 128 }, { 4, 8192, 32, 8, 8192, 128 },
		{ 4, 10240, 9, 3, 2048, 64 },
	};
	static const struct shape append_shapes[] = { { 64, 2048, 32, 8, 1, 128 }, { 64, 2048, 9, 3, 1, 64 },
						      { 256, 2048, 32, 8, 1, 128 } };
	const int is_prefill = !strcmp(mode, "prefill"), is_append = !strcmp(mode, "append");
	const struct shape *shapes = is_prefill ? prefill_shapes : is_append ? append_shapes : decode_shapes;
	int nshapes_all = is_prefill ? 4 : is_append ? 3 : 6;
	struct shape given[16], grid[GRID_SHAPES];
	int ngiven = 0, use_grid = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--format") && i + 1 < argc)
			list = argv[++i];
		else if (!strcmp(argv[i], "--sdpa") && i + 1 < argc)
			sdpa = argv[++i];
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc && atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 200)
			runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--block") && i + 1 < argc && atoi(argv[i + 1]) >= 16 &&
			 atoi(argv[i + 1]) <= 256 && atoi(argv[i + 1]) % 16 == 0)
			B = (uint32_t)atoi(argv[++i]);
		else if (!is_prefill && !strcmp(argv[i], "--shape") && i + 1 < argc && ngiven < 16 &&
			 !parse_shape(argv[i + 1], &given[ngiven]))
			ngiven++, i++;
		else if (!strcmp(argv[i], "--splits") && i + 1 < argc && atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 64)
			force_splits = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(mode, "decode") && !strcmp(argv[i], "--fi") && i + 1 < argc && n_fi < MAX_FI)
			fi_files[n_fi++] = argv[++i];
		else if (!strcmp(mode, "decode") && !strcmp(argv[i], "--grid"))
			use_grid = 1;
		else if (!strcmp(argv[i], "--kernels") && i + 1 < argc &&
			 (!strcmp(argv[i + 1], "sm90") || !strcmp(argv[i + 1], "auto")))
			setenv("KVQ_CUDA_KERNELS", argv[++i], 1);   /* read once, before the kernels are used */
		else {
			usage(mode);
			return 2;
		}
	}
	if (ngiven) {
		shapes = given;
		nshapes_all = ngiven;
	}
	if (use_grid) {   /* --grid takes the place of the list (and of --shape) */
		shapes = grid;
		nshapes_all = grid_shapes(grid);
	}
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		fprintf(stderr, "kvq-bench %s: no usable GPU\n", mode);
		return 1;
	}
	struct cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	double rbw = read_bandwidth(quick ? 3 : 10), cbw = is_append ? copy_bandwidth(quick ? 3 : 10) : 0;
	printf("device: %s, %d SMs; read-only bandwidth %.0f GB/s (4 GiB reduction)", p.name, p.multiProcessorCount, rbw);
	if (is_append)
		printf("; copy %.0f GB/s (2 GiB cudaMemcpy, read + written)", cbw);
	printf("\npool: L=32 (layer 0 timed), B=%u, f16 activations; median of %d runs, L2 flushed before each; "
	       "kernels %s\n", B, runs, kvq_cuda_kernels());
	if (is_append)
		printf("%-8s %5s %7s %6s %9s %8s %8s %8s %8s\n", "format", "batch", "tokens", "heads", "write ms", "GB/s", "%copy",
		       "step us", "seal us");
	else
		printf("%-16s %5s %7s %5s %6s %4s %9s %8s %7s %7s %6s %6s %6s %6s %-8s\n", "format", "batch", "context",
		       "nq", "heads", "D", "ms", "GB/s", "%read", "TFLOP/s", "vsf16", "vsSDPA", "vsFI16", "vsFI8", "kernel");

	const int nshapes = quick ? 1 : nshapes_all;
	char *fmts[64];
	int nf = !strcmp(list, "all") ? all_formats(fmts, 64) : split_formats(list, fmts, 64);
	const int max_res = nf * nshapes;
	struct result *res = (struct result *)calloc(max_res ? max_res : 1, sizeof *res);
	int nres = 0;
	for (int si = 0; si < nshapes; si++) {
		double f16_ms = 0;
		struct shape sh = shapes[si];
		if (quick)
			sh.batch = 2;
		/* one pool for the shape, as large as its largest format that fits */
		size_t free_b = 0, total_b = 0, need = 0, bytes;
		bool fits[64];
		char why[64][160];   /* why a format is not timed at the shape */
		CK(cudaMemGetInfo(&free_b, &total_b));
		for (int fi = 0; fi < nf; fi++)
			if ((fits[fi] = pool_fits(fmts[fi], sh, B, free_b, &bytes, why[fi], sizeof why[fi])) && bytes > need)
				need = bytes;
		void *pool = NULL;
		if (need)
			CK(cudaMalloc(&pool, need));
		const int cell0 = nres;
		for (int fi = 0; fi < nf && nres < max_res; fi++) {
			const char *f = fmts[fi];
			struct result *r = &res[nres];
			if (!fits[fi]) {
				printf("%-16s %5u %7u  (%s)\n", f, sh.batch, sh.ctx, why[fi]);
				continue;
			}
			run_one(f, sh, B, pool, quick ? 5 : runs, is_append ? (quick ? 5 : runs) : 4, r);
			if (!strcmp(f, "f16"))
				f16_ms = r->ms;
			if (is_append) {
				double g = r->write_bytes / (r->write_ms * 1e-3) / 1e9;
				printf("%-8s %5u %7u %3u/%-2u %9.3f %8.0f %7.1f%% %8.1f %8.1f\n", f, sh.batch, sh.ctx, sh.q_heads,
				       sh.kv_heads, r->write_ms, g, 100.0 * g / cbw, r->step_us[0], r->step_us[1]);
			} else {
				double sd = sdpa_ms(sdpa, mode, &sh), f1 = fi_ms(&sh, "f16"), f8 = fi_ms(&sh, "fp8");
				printf("%-16s %5u %7u %5u %3u/%-2u %4u %9.3f %8.0f %6.1f%% %7.1f %5.2fx %5.2fx %5.2fx %5.2fx "
				       "%s/%u\n", f, sh.batch, sh.ctx, sh.nq, sh.q_heads, sh.kv_heads, sh.D, r->ms, r->gbps,
				       100.0 * r->gbps / rbw, step_flop(&sh) / (r->ms * 1e-3) / 1e12,
				       f16_ms > 0 ? f16_ms / r->ms : 0.0, sd > 0 ? sd / r->ms : 0.0, f1 / r->ms, f8 / r->ms,
				       r->kernel ? r->kernel : "?", r->splits);
			}
			fflush(stdout);
			nres++;
		}
		if (pool)
			CK(cudaFree(pool));
		if (use_grid && nres > cell0) {
			grid_checks(res + cell0, nres - cell0, rbw);
			fflush(stdout);
		}
	}
	if (is_prefill || !is_append)
		printf("GB/s: bytes of KV the step reads per second; TFLOP/s: 4 x query heads x D per unmasked query-key "
		       "pair; vsSDPA: PyTorch SDPA FP16 (contiguous K/V) time / ours%s; vsFI16, vsFI8: FlashInfer's "
		       "fastest decode at the shape with FP16 or FP8 KV / ours%s; kernel: what ran / its KV splits\n",
		       sdpa ? "" : " (no --sdpa file: 0)", n_fi ? "" : " (no --fi file: 0)");
	if (json) {
		printf("{\"read_gbps\":%.1f,\"block\":%u,\"kernels\":\"%s\",", rbw, B, kvq_cuda_kernels());
		if (is_append)
			printf("\"copy_gbps\":%.1f,", cbw);
		printf("\"%s\":[", mode);
		for (int i = 0; i < nres; i++) {
			double f16_ms = 0, sd = sdpa_ms(sdpa, mode, &res[i].s);
			for (int j = 0; j < nres; j++)
				if (!strcmp(res[j].format, "f16") && res[j].s.batch == res[i].s.batch && res[j].s.ctx == res[i].s.ctx &&
				    res[j].s.nq == res[i].s.nq && res[j].s.q_heads == res[i].s.q_heads && res[j].s.D == res[i].s.D)
					f16_ms = res[j].ms;
			printf("%s{\"format\":\"%s\",\"batch\":%u,\"context\":%u,\"n_q\":%u,\"q_heads\":%u,\"kv_heads\":%u,"
			       "\"head_dim\":%u,", i ? "," : "", res[i].format, res[i].s.batch, res[i].s.ctx, res[i].s.nq,
			       res[i].s.q_heads, res[i].s.kv_heads, res[i].s.D);
			if (is_append) {
				double g = res[i].write_bytes / (res[i].write_ms * 1e-3) / 1e9;
				printf("\"ms\":%.4f,\"gbps\":%.1f,\"pct_copy_bw\":%.1f,\"step_us\":%.2f,\"step_seal_us\":%.2f}",
				       res[i].write_ms, g, 100.0 * g / cbw, res[i].step_us[0], res[i].step_us[1]);
			} else {
				printf("\"ms\":%.4f,\"gbps\":%.1f,\"pct_read_bw\":%.1f,\"tflops\":%.1f,\"speedup_vs_f16\":%.3f,"
				       "\"speedup_vs_sdpa\":%.3f,\"speedup_vs_fi_f16\":%.3f,\"speedup_vs_fi_fp8\":%.3f,"
				       "\"kernel\":\"%s\",\"splits\":%u}", res[i].ms, res[i].gbps, 100.0 * res[i].gbps / rbw,
				       step_flop(&res[i].s) / (res[i].ms * 1e-3) / 1e12,
				       f16_ms > 0 ? f16_ms / res[i].ms : 0.0, sd > 0 ? sd / res[i].ms : 0.0,
				       fi_ms(&res[i].s, "f16") / res[i].ms, fi_ms(&res[i].s, "fp8") / res[i].ms,
				       res[i].kernel ? res[i].kernel : "?", res[i].splits);
			}
		}
		printf("]}\n");
	}
	for (int fi = 0; fi < nf; fi++)   /* the results' format names */
		free(fmts[fi]);
	free(res);
	return 0;
}
