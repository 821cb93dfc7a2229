/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench rotation: which block of the head dim the Walsh-Hadamard
 * rotation (a policy's "+rot") should work on, at D = 128, where K's
 * (the largest power of two dividing D) and llama.cpp's V block (64)
 * differ from the whole vector.
 *
 * Synthetic K and V of one KV head with the outlier structure of real
 * models: K after RoPE, with per-channel offsets and a few channels tens of
 * times larger than the rest, in the low-frequency pairs, where RoPE
 * turns them slowly, so they stay outliers over a block (the structure
 * KIVI and QuaRot report in Llama-family K); V about Gaussian with
 * per-channel spread and some tokens several times larger.  For each
 * per-token format and each rotation block (none, 16, 32, 64, 128), K
 * (or V) is rotated in blocks of that size as libkvq would, written through
 * the real CPU write and seal into a pool with that format for the part
 * measured (FP16 for the other), and decoded by the real CPU attention
 * with q rotated alike (or the output rotated back); the figure is the
 * output's error against attention in float64 on the unrotated, unquantized
 * K and V: RMS of the difference over RMS of the reference, over 16 query
 * tokens of 4 query heads at the end of a 2048-token sequence, the mean
 * over three data sets.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cpu/cpu.h"
#include "format.h"
#include "layout.h"
#include "policy.h"

#define RD 128u         /* head dim */
#define RB 32u          /* tokens per block, and the open window */
#define RT 2048u        /* tokens */
#define RM 16u          /* query tokens (the last RM positions) */
#define RQ 4u           /* query heads (one KV head) */
#define NBLK 5
#define NSEED 3        /* data sets, errors averaged */          /* rotation blocks measured: none, 16, 32, 64, 128 */

static const unsigned blocks[NBLK] = { 0, 16, 32, 64, 128 };
static const char *const formats[] = { "int4g32", "int4g64", "int8", "fp8" };
#define NFMT (sizeof(formats) / sizeof(formats[0]))

struct data {
	float k[RT][RD], v[RT][RD];   /* FP16 values, unrotated */
	float q[RM * RQ][RD];
	double ref[RM * RQ][RD];
	double eff;   /* exp(entropy) of the reference's softmax, the mean over rows */
};

static double normal(uint64_t *s)
{
	double u = rng_unit(s), w = rng_unit(s);

	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* K: offsets N(0, 1) per channel, spread 1; channel pairs 56..63 (the
 * lowest RoPE frequencies) offset by 8-20 with spread 3; RoPE at base
 * 10000 on adjacent pairs.  V: spread 0.5-2 per channel, every 97th token
 * five times larger.  q: N(0, 1), twice as large in K's outlier
 * channels (queries meet those channels too).  All rounded to FP16. */
static void make_data(struct data *x, uint64_t seed)
{
	uint64_t s = 0x726f74ull + seed;
	double mu[RD], sd[RD], vs[RD];

	for (unsigned d = 0; d < RD; d++) {
		const int out = d / 2 >= 56;
		mu[d] = out ? (8.0 + 12.0 * rng_unit(&s)) * (rng_unit(&s) < 0.5 ? -1.0 : 1.0) : normal(&s);
		sd[d] = out ? 3.0 : 1.0;
		vs[d] = 0.5 + 1.5 * rng_unit(&s);
	}
	for (unsigned t = 0; t < RT; t++) {
		double pre[RD];
		for (unsigned d = 0; d < RD; d++)
			pre[d] = mu[d] + sd[d] * normal(&s);
		for (unsigned i = 0; i < RD / 2; i++) {
			const double th = t * pow(10000.0, -2.0 * i / RD), c = cos(th), n = sin(th);
			x->k[t][2 * i] = kvq_f16_to_f32(kvq_f16_from_f32((float)(pre[2 * i] * c - pre[2 * i + 1] * n)));
			x->k[t][2 * i + 1] = kvq_f16_to_f32(kvq_f16_from_f32((float)(pre[2 * i] * n + pre[2 * i + 1] * c)));
		}
		for (unsigned d = 0; d < RD; d++)
			x->v[t][d] = kvq_f16_to_f32(kvq_f16_from_f32((float)(vs[d] * normal(&s) * (t % 97 == 3 ? 5.0 : 1.0))));
	}
	for (unsigned r = 0; r < RM * RQ; r++)
		for (unsigned d = 0; d < RD; d++)
			x->q[r][d] = kvq_f16_to_f32(kvq_f16_from_f32((float)(normal(&s) * (d / 2 >= 56 ? 2.0 : 1.0))));
	/* the reference: query token i at position RT - RM + i sees 0 .. itself */
	for (unsigned r = 0; r < RM * RQ; r++) {
		const unsigned last = RT - RM + r / RQ;
		double *sc = malloc(sizeof(double) * RT), mx = -INFINITY, sum = 0.0;
		if (!sc)
			abort();
		for (unsigned t = 0; t <= last; t++) {
			double dot = 0.0;
			for (unsigned d = 0; d < RD; d++)
				dot += (double)x->q[r][d] * x->k[t][d];
			sc[t] = dot / sqrt((double)RD);
			mx = sc[t] > mx ? sc[t] : mx;
		}
		memset(x->ref[r], 0, sizeof(x->ref[r]));
		for (unsigned t = 0; t <= last; t++) {
			const double p = exp(sc[t] - mx);
			sum += p;
			for (unsigned d = 0; d < RD; d++)
				x->ref[r][d] += p * x->v[t][d];
		}
		for (unsigned d = 0; d < RD; d++)
			x->ref[r][d] /= sum;
		double ent = 0.0;
		for (unsigned t = 0; t <= last; t++) {
			const double p = exp(sc[t] - mx) / sum;
			ent -= p > 0 ? p * log(p) : 0.0;
		}
		x->eff += exp(ent) / (RM * RQ);
		free(sc);
	}
}

/* Rows of x (n of them) into FP16 words, each rotated in blocks of blk
 * first (0: as they are). */
static void to_f16(const float (*x)[RD], unsigned n, unsigned blk, uint16_t *out)
{
	for (unsigned r = 0; r < n; r++) {
		float y[RD];
		memcpy(y, x[r], sizeof(y));
		if (blk)
			kvq_rotate(y, RD, blk);
		for (unsigned d = 0; d < RD; d++)
			out[(size_t)r * RD + d] = kvq_f16_from_f32(y[d]);
	}
}

/* The output error of format fmt on K (is_v 0) or V (1) rotated in blocks
 * of blk: < 0 on an error. */
static double measure(const struct data *x, int fmt, int is_v, unsigned blk)
{
	struct kvq_policy pol = { .n_layers = 1 };
	struct kvq_layout_params p = { .layers = 1, .kv_heads = 1, .head_dim = RD, .block_tokens = RB,
				       .window = RB, .n_sealed = RT / RB, .n_open = 2, .act = KVQ_DT_F16,
				       .policy = &pol };
	struct kvq_layout *L = NULL;
	uint16_t *k16 = malloc(sizeof(uint16_t) * RT * RD), *v16 = malloc(sizeof(uint16_t) * RT * RD);
	float *q = malloc(sizeof(float) * RM * RQ * RD), *out = malloc(sizeof(float) * RM * RQ * RD);
	int32_t sealed[RT / RB], open[RT / RB];
	void *base = NULL;
	double num = 0.0, den = 0.0;
	int r = -ENOMEM;

	pol.k[0] = is_v ? KVQ_FMT_F16 : (uint8_t)fmt;
	pol.v[0] = is_v ? (uint8_t)fmt : KVQ_FMT_F16;
	if (!k16 || !v16 || !q || !out || (r = kvq_layout_new(&p, &L, NULL, 0)) < 0 ||
	    posix_memalign(&base, 256, L->total_bytes)) {
		r = r < 0 ? r : -ENOMEM;
		goto out;
	}
	memset(base, 0, L->total_bytes);
	to_f16(x->k, RT, is_v ? 0 : blk, k16);
	to_f16(x->v, RT, is_v ? blk : 0, v16);
	/* every block straight to its sealed slot but the last, in open slot 0 */
	const uint32_t S = kvq_layout_split(L, RT);
	for (uint32_t b = 0; b < RT / RB; b++) {
		sealed[b] = (int32_t)b;
		open[b] = b * RB < S ? -1 : (int32_t)(b - S / RB);
	}
	struct kvq_seq_table w = { .n = 0, .m = RT, .row0 = 0, .sealed = sealed, .open = open };
	if ((r = kvq_cpu_write(L, base, 0, &w, k16, v16)) < 0)
		goto out;
	for (unsigned i = 0; i < RM * RQ; i++) {
		memcpy(q + (size_t)i * RD, x->q[i], sizeof(x->q[i]));
		if (!is_v && blk)
			kvq_rotate(q + (size_t)i * RD, RD, blk);
	}
	struct kvq_seq_table t = { .n = RT, .m = RM, .row0 = 0, .sealed = sealed, .open = open + S / RB };
	struct kvq_attn a = { .L = L, .base = base, .layer = 0, .q_heads = RQ, .scale = 1.0f / sqrtf((float)RD),
			      .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	if ((r = kvq_cpu_attention(&a, &t, 1, q, out)) < 0)
		goto out;
	for (unsigned i = 0; i < RM * RQ; i++) {
		float *o = out + (size_t)i * RD;
		if (is_v && blk)
			kvq_rotate(o, RD, blk);
		for (unsigned d = 0; d < RD; d++) {
			num += (o[d] - x->ref[i][d]) * (o[d] - x->ref[i][d]);
			den += x->ref[i][d] * x->ref[i][d];
		}
	}
out:
	free(base);
	kvq_layout_free(L);
	free(k16);
	free(v16);
	free(q);
	free(out);
	return r < 0 ? (double)r : sqrt(num / den);
}

int cmd_rotation(int argc, char **argv)
{
	struct data *x = malloc(sizeof(*x));
	int json = argc > 1 && !strcmp(argv[1], "--json");
	double e[NFMT][2][NBLK], eff = 0.0;

	if (argc > 1 && !json) {
		fprintf(stderr, PROG " rotation: unknown option '%s' (--json)\n", argv[1]);
		free(x);
		return 2;
	}
	if (!x)
		return 1;
	memset(e, 0, sizeof(e));
	for (uint64_t seed = 0; seed < NSEED; seed++) {
		x->eff = 0.0;
		make_data(x, seed);
		eff += x->eff / NSEED;
		for (unsigned f = 0; f < NFMT; f++)
			for (int is_v = 0; is_v < 2; is_v++)
				for (int b = 0; b < NBLK; b++) {
					double r = measure(x, kvq_fmt_from_name(formats[f], strlen(formats[f])), is_v,
							   blocks[b]);
					if (r < 0) {
						fprintf(stderr, PROG " rotation: %s: %s\n", formats[f], strerror((int)-r));
						free(x);
						return 1;
					}
					e[f][is_v][b] += r / NSEED;
				}
	}
	free(x);
	printf("kvq-bench rotation: D=%u, B=%u, %u tokens, %u query tokens x %u heads, %u data sets (softmax "
	       "spread exp(entropy): %.0f tokens);\nattention output error (RMS of the difference / RMS of float64 "
	       "attention on unquantized K, V, the mean over the data sets),\none part quantized, the other FP16\n"
	       "%-8s %-2s", RD, RB, RT, RM, RQ, NSEED, eff, "format", "");
	for (int b = 0; b < NBLK; b++)
		printf(blocks[b] ? "   block %3u" : "  no rotation", blocks[b]);
	printf("\n");
	for (unsigned f = 0; f < NFMT; f++)
		for (int is_v = 0; is_v < 2; is_v++) {
			printf("%-8s %-2s", formats[f], is_v ? "V" : "K");
			for (int b = 0; b < NBLK; b++)
				printf("  %11.3e", e[f][is_v][b]);
			printf("\n");
		}
	printf("libkvq's blocks at D=%u: K %u, V %u (kvq_rot_block)\n", RD, kvq_rot_block(RD, 0), kvq_rot_block(RD, 1));
	if (json) {
		printf("{\"head_dim\":%u,\"blocks\":[0,16,32,64,128],\"results\":[", RD);
		for (unsigned f = 0; f < NFMT; f++)
			for (int is_v = 0; is_v < 2; is_v++) {
				printf("%s{\"format\":\"%s\",\"part\":\"%s\",\"error\":[", f || is_v ? "," : "", formats[f],
				       is_v ? "v" : "k");
				for (int b = 0; b < NBLK; b++)
					printf("%s%.6e", b ? "," : "", e[f][is_v][b]);
				printf("]}");
			}
		printf("]}\n");
	}
	return 0;
}
