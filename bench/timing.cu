/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench timing: what libkvq's attention timing (kvqd.conf's
 * attention_timing) costs a worker, measured on libkvq's own event pairs
 * (client/gpu_timer.c).  A token of a 30-layer model on kvq-run's path:
 * one decode attention call per layer on a stream, then a wait for the
 * stream (the worker reads its logits); SmolLM2-135M's heads (9/3, D = 64)
 * over a 1024-token context by default.  Rounds alternate untimed tokens
 * and tokens whose calls go through libkvq's sampling (gpu_timer_get before
 * the launch: one call in GPU_TIMING_EVERY gets a pair, after the poll that
 * bins completed pairs; gpu_timer_put after), as libkvq's cuda backend does;
 * the figures are the medians over the rounds
 * of the wall time per token, the cost per call, and the ratio.  The calls
 * the pairs binned are counted and must equal the calls timed.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/kvq_cuda.h"
#include "policy.h"
#include "layout.h"

extern "C" {
#include "gpu_timer.h"
}

#define TPROG "kvq-bench timing"
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, TPROG ": %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static double wall_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median_of(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void count_call(void *arg, uint32_t layer, int phase, uint64_t kv_bytes, double seconds)
{
	(void)layer, (void)phase, (void)kv_bytes;
	if (seconds >= 0)
		++*(unsigned long *)arg;
}

struct bench {
	struct kvq_cuda_attn a;
	const struct kvq_seq_table *seq;
	const void *q;
	void *out;
	uint32_t layers;
	cudaStream_t stream;
};

/* Seconds for `tokens` tokens, each a call per layer and a wait; g: time
 * every call with it (NULL: untimed). */
static double tokens_s(struct bench *b, int tokens, struct gpu_timing *g, unsigned long *binned,
		       unsigned long *timed)
{
	double t0 = wall_s();

	for (int i = 0; i < tokens; i++) {
		for (uint32_t l = 0; l < b->layers; l++) {
			struct gpu_timer *t = g ? gpu_timer_get(g, b->stream, count_call, binned) : NULL;

			b->a.layer = l;
			int r = kvq_cuda_attention(&b->a, b->seq, 1, b->q, b->out);
			if (r) {
				fprintf(stderr, TPROG ": kvq_cuda_attention: %d (%s)\n", r, kvq_cuda_error());
				exit(1);
			}
			if (t) {
				gpu_timer_put(g, t, b->stream, l, 0, 0);
				++*timed;
			}
		}
		CK(cudaStreamSynchronize(b->stream));
	}
	return wall_s() - t0;
}

static void usage(void)
{
	fprintf(stderr, "usage: kvq-bench timing [--format LIST (f16,int8)] [--context N (16-65536, 1024)] "
			"[--layers N (1-128, 30)] [--tokens N per round (10-10000, 200)] [--rounds N (3-99, 15)] [--json]\n");
}

extern "C" int bench_timing(int argc, char **argv)
{
	const char *list = "f16,int8";
	uint32_t ctx = 1024, layers = 30, B = 32;
	int tokens = 200, rounds = 15, json = 0;

	for (int i = 1; i < argc; i++) {
		long v = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 0;

		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!strcmp(argv[i], "--format") && i + 1 < argc)
			list = argv[++i];
		else if (!strcmp(argv[i], "--context") && v >= 16 && v <= 65536)
			ctx = (uint32_t)v, i++;
		else if (!strcmp(argv[i], "--layers") && v >= 1 && v <= 128)
			layers = (uint32_t)v, i++;
		else if (!strcmp(argv[i], "--tokens") && v >= 10 && v <= 10000)
			tokens = (int)v, i++;
		else if (!strcmp(argv[i], "--rounds") && v >= 3 && v <= 99)
			rounds = (int)v, i++;
		else {
			usage();
			return 2;
		}
	}
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		fprintf(stderr, TPROG ": no usable GPU\n");
		return 1;
	}
	struct cudaDeviceProp p;
	CK(cudaGetDeviceProperties(&p, 0));
	FILE *tab = json ? stderr : stdout;
	fprintf(tab, "device: %s; a token: %u decode attention calls (9/3 heads, D=64, context %u, B=%u) and a "
		"stream wait; %d rounds of %d tokens, untimed and timed (1 call in %d) alternating; medians\n", p.name,
		layers, ctx, B, rounds, tokens, GPU_TIMING_EVERY);
	fprintf(tab, "%-8s %14s %14s %12s %8s %s\n", "format", "untimed us/tok", "timed us/tok", "cost us/call",
		"ratio", "binned/timed");
	if (json)
		printf("{\"context\":%u,\"layers\":%u,\"every\":%d,\"results\":[", ctx, layers, GPU_TIMING_EVERY);

	char buf[256], *save = NULL;
	int first = 1;
	snprintf(buf, sizeof buf, "%s", list);
	for (char *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
		struct kvq_policy pol;
		struct kvq_layout *L = NULL;
		char err[256];

		if (kvq_policy_parse(f, layers, &pol, err, sizeof err)) {
			fprintf(stderr, TPROG ": %s\n", err);
			return 2;
		}
		uint32_t R = kvq_layout_default_window(&pol, B), nb = (ctx + B - 1) / B;
		struct kvq_layout_params lp = { .layers = layers, .kv_heads = 3, .head_dim = 64, .block_tokens = B,
			.window = R, .n_sealed = nb, .n_open = R / B + 1, .act = KVQ_DT_F16, .policy = &pol };
		if (kvq_layout_new(&lp, &L, err, sizeof err)) {
			fprintf(stderr, TPROG ": %s\n", err);
			return 2;
		}
		/* one sequence: sealed blocks 0..S/B-1, the rest in open slots 0.. */
		const uint32_t first_open = kvq_layout_split(L, ctx) / B;
		int32_t *ids = (int32_t *)malloc(2 * nb * sizeof(int32_t));
		for (uint32_t j = 0; j < nb; j++) {
			ids[j] = (int32_t)j;
			ids[nb + j] = j >= first_open ? (int32_t)(j - first_open) : -1;
		}
		void *pool, *q, *out, *dids, *dseq, *ws = NULL;
		CK(cudaMalloc(&pool, L->total_bytes));
		CK(cudaMemset(pool, 0, L->total_bytes));
		CK(cudaMalloc(&q, 9 * 64 * 2));
		CK(cudaMemset(q, 0, 9 * 64 * 2));
		CK(cudaMalloc(&out, 9 * 64 * 2));
		CK(cudaMalloc(&dids, 2 * nb * sizeof(int32_t)));
		CK(cudaMemcpy(dids, ids, 2 * nb * sizeof(int32_t), cudaMemcpyHostToDevice));
		struct kvq_seq_table st = { ctx, 1, 0, 0, (const int32_t *)dids, (const int32_t *)dids + nb + first_open };
		CK(cudaMalloc(&dseq, sizeof st));
		CK(cudaMemcpy(dseq, &st, sizeof st, cudaMemcpyHostToDevice));

		struct bench b;
		memset(&b, 0, sizeof b);
		CK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
		b.a.L = L;
		b.a.base = pool;
		b.a.q_heads = 9;
		b.a.scale = 0.125f;
		b.a.q_dtype = KVQ_DT_F16;
		b.a.out_dtype = KVQ_DT_F16;
		b.a.max_n = ctx;
		b.a.max_q = 1;
		b.a.total_q = 1;
		b.a.stream = b.stream;
		b.a.workspace_bytes = kvq_cuda_attention_workspace(&b.a, 1);
		if (b.a.workspace_bytes)
			CK(cudaMalloc(&ws, b.a.workspace_bytes));
		b.a.workspace = ws;
		b.seq = (const struct kvq_seq_table *)dseq;
		b.q = q;
		b.out = out;
		b.layers = layers;

		struct gpu_timing *g = (struct gpu_timing *)calloc(1, sizeof *g);
		unsigned long binned = 0, timed = 0;
		double plain[99], with[99];
		tokens_s(&b, tokens / 4 + 1, NULL, NULL, NULL);    /* warm-up, both ways */
		tokens_s(&b, tokens / 4 + 1, g, &binned, &timed);
		gpu_timing_poll(g, count_call, &binned);
		binned = timed = 0;
		for (int r = 0; r < rounds; r++) {
			plain[r] = tokens_s(&b, tokens, NULL, NULL, NULL) / tokens;
			with[r] = tokens_s(&b, tokens, g, &binned, &timed) / tokens;
		}
		gpu_timing_poll(g, count_call, &binned);
		if (g->broken || g->n) {
			fprintf(stderr, TPROG ": %s: event pairs %s\n", f, g->broken ? "could not be made" : "still in flight");
			return 1;
		}
		double up = median_of(plain, rounds) * 1e6, ut = median_of(with, rounds) * 1e6;
		fprintf(json ? stderr : stdout, "%-8s %14.2f %14.2f %12.3f %8.4f %lu/%lu\n", f, up, ut, (ut - up) / layers,
			ut / up, binned, timed);
		if (json)
			printf("%s{\"format\":\"%s\",\"untimed_us_per_token\":%.3f,\"timed_us_per_token\":%.3f,"
			       "\"cost_us_per_call\":%.4f,\"ratio\":%.5f,\"binned\":%lu,\"timed\":%lu}", first ? "" : ",", f,
			       up, ut, (ut - up) / layers, ut / up, binned, timed);
		first = 0;
		if (binned != timed) {
			fprintf(stderr, TPROG ": %s: %lu calls timed, %lu binned\n", f, timed, binned);
			return 1;
		}
		gpu_timing_destroy(g);
		free(g);
		CK(cudaStreamDestroy(b.stream));
		cudaFree(pool);
		cudaFree(q);
		cudaFree(out);
		cudaFree(dids);
		cudaFree(dseq);
		if (ws)
			cudaFree(ws);
		free(ids);
		kvq_layout_free(L);
	}
	if (json)
		printf("]}\n");
	fprintf(tab, "cost us/call: (timed - untimed) / calls per token, averaged over the calls (1 in %d gets a pair);"
		" a worker's tokens carry the rest of the model too, so its share of a real token is smaller than "
		"ratio - 1 here\n", GPU_TIMING_EVERY);
	return 0;
}
