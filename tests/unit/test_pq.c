/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The codebook formats (pq2, pq1) on the CPU: encode on seal against a
 * float64 nearest-centroid search, and attention (decode, a short step and a
 * prefill, on both vector paths) against float64 attention over the values
 * the stored codes decode to (the centroids; the open window as FP16), for
 * PQ on K, on V, on both, and beside other formats.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codebook.h"
#include "cpu/cpu.h"
#include "../tap.h"
#include "../ref.h"

#define H 2
#define G_Q 2              /* query heads per KV head */
#define D 64
#define B 16
#define N (5 * B + 7)      /* 5 sealed blocks (window B) and 7 open tokens */

static uint16_t k[N][H][D], v[N][H][D];
static double ks[H][N][D], vs[H][N][D];   /* values as stored */
static float q[N][H * G_Q][D], out[N][H * G_Q][D];

/* Centroid c of subspace m of head h's (layer 0) K or V codebooks, element j. */
static double centroid(const struct kvq_layout *L, const uint8_t *base, int is_v, uint32_t h, uint32_t m,
		       uint32_t c, uint32_t j, unsigned d)
{
	const uint8_t *cb = base + L->layer[0].codebook[is_v];

	return ref_f16(ref_u16(cb + 2 * ((((size_t)h * (D / d) + m) * 256 + c) * d + j)));
}

/* Checks the codes of one sealed head slice against a float64 search and
 * fills the stored values of its tokens; returns the codes that are not a
 * nearest centroid. */
static long check_codes(const struct kvq_layout *L, const uint8_t *base, uint32_t id, uint32_t blk, uint32_t h,
			int is_v)
{
	const struct kvq_layer_layout *ll = &L->layer[0];
	int f = is_v ? ll->vfmt : ll->kfmt;
	unsigned d = kvq_fmt_subdim(f);
	uint32_t M = D / d;
	const uint8_t *head = base + kvq_layout_off(L, KVQ_SEALED, id, 0, h, 0);
	const uint8_t *codes = head + ll->off[is_v ? KVQ_V_CODES : KVQ_K_CODES];
	long bad = 0;

	for (uint32_t t = 0; t < B; t++) {
		uint32_t tok = blk * B + t;
		for (uint32_t m = 0; m < M; m++) {
			uint32_t c = codes[is_v ? m * B + t : t * M + m];
			double best = INFINITY, mine = 0.0;
			for (uint32_t cc = 0; cc < 256; cc++) {
				double dist = 0.0;
				for (uint32_t j = 0; j < d; j++) {
					double e = ref_f16((is_v ? v : k)[tok][h][m * d + j]) -
						   centroid(L, base, is_v, h, m, cc, j, d);
					dist += e * e;
				}
				best = fmin(best, dist);
				if (cc == c)
					mine = dist;
			}
			/* float32 distances: a near tie may go either way */
			bad += mine > best + 1e-5 * (1.0 + best);
			for (uint32_t j = 0; j < d; j++)
				(is_v ? vs : ks)[h][tok][m * d + j] = centroid(L, base, is_v, h, m, c, j, d);
		}
	}
	return bad;
}

/* Max error of out (rows of queries at positions n - m .. n - 1) against
 * float64 attention over ks/vs; *maxref the largest |reference|. */
static double check_attention(uint32_t n, uint32_t m, double *maxref)
{
	double maxerr = 0.0;

	*maxref = 0.0;
	for (uint32_t i = 0; i < m; i++)
		for (uint32_t qh = 0; qh < H * G_Q; qh++) {
			uint32_t h = qh / G_Q, pos = n - m + i;
			double sc[N], mx = -INFINITY, sum = 0.0;

			for (uint32_t t = 0; t <= pos; t++) {
				sc[t] = 0.0;
				for (uint32_t dd = 0; dd < D; dd++)
					sc[t] += (double)q[i][qh][dd] * ks[h][t][dd];
				sc[t] *= 0.125;
				mx = fmax(mx, sc[t]);
			}
			for (uint32_t t = 0; t <= pos; t++)
				sum += sc[t] = exp(sc[t] - mx);
			for (uint32_t dd = 0; dd < D; dd++) {
				double ref = 0.0;
				for (uint32_t t = 0; t <= pos; t++)
					ref += sc[t] / sum * vs[h][t][dd];
				*maxref = fmax(*maxref, fabs(ref));
				maxerr = fmax(maxerr, isnan(out[i][qh][dd]) ? INFINITY : fabs(out[i][qh][dd] - ref));
			}
		}
	return maxerr;
}

static void test_policy(const char *policy)
{
	char err[256];
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = 1, .kv_heads = H, .head_dim = D, .block_tokens = B,
					.window = B, .n_sealed = 6, .n_open = 2, .act = KVQ_DT_F16, .policy = &pol };
	struct kvq_layout *L = NULL;
	const int32_t sealed[5] = { 4, 0, 5, 2, 1 }, open_ids[1] = { 1 };
	uint8_t *base;
	long bad = 0;
	int r;

	r = kvq_policy_parse(policy, 1, &pol, err, sizeof(err));
	r = r < 0 ? r : kvq_layout_new(&lp, &L, err, sizeof(err));
	if (!ok(r == 0, "%s: a layout%s%s", policy, r ? ": " : "", r ? err : ""))
		return;
	base = aligned_alloc(256, (L->total_bytes + 255) / 256 * 256);
	memset(base, 0, L->total_bytes);
	/* codebooks: random FP16 centroids in [-1.5, 1.5) */
	for (uint64_t i = 0; i < L->codebook_bytes / 2; i++) {
		uint16_t c = kvq_f16_from_f32((float)(tap_rand() % 3001) / 1000.0f - 1.5f);
		memcpy(base + L->codebook_off + 2 * i, &c, 2);
	}
	for (uint32_t t = 0; t < N; t++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t d = 0; d < D; d++) {
				k[t][h][d] = kvq_f16_from_f32((float)(tap_rand() % 2001) / 1000.0f - 1.0f);
				v[t][h][d] = kvq_f16_from_f32((float)(tap_rand() % 2001) / 700.0f - 1.4f);
				ks[h][t][d] = ref_f16(k[t][h][d]);
				vs[h][t][d] = ref_f16(v[t][h][d]);
			}
	/* 40 tokens (blocks 0 and 1 sealed from the input, 2 into open slot 0:
	 * the window is one block), then the rest (block 2 sealed from the
	 * window, 3 and 4 from the input, 5 into open slot 1) */
	{
		const int32_t open1[3] = { -1, -1, 0 }, open2[4] = { 0, -1, -1, 1 };
		struct kvq_seq_table w1 = { .n = 0, .m = 40, .sealed = sealed, .open = open1 };
		struct kvq_seq_table w2 = { .n = 40, .m = N - 40, .sealed = sealed, .open = open2 };

		ok(kvq_cpu_write(L, base, 0, &w1, k, v) == 0 && kvq_cpu_write(L, base, 0, &w2, k[40], v[40]) == 0,
		   "%s: two writes, %u tokens sealed, %u open", policy, kvq_layout_split(L, N),
		   N - kvq_layout_split(L, N));
	}
	for (uint32_t blk = 0; blk < kvq_layout_split(L, N) / B; blk++)
		for (uint32_t h = 0; h < H; h++)
			for (int is_v = 0; is_v < 2; is_v++) {
				const uint8_t *head = base + kvq_layout_off(L, KVQ_SEALED, (uint32_t)sealed[blk], 0, h, 0);
				if (L->layer[0].codebook[is_v] != UINT64_MAX) {
					bad += check_codes(L, base, (uint32_t)sealed[blk], blk, h, is_v);
					continue;
				}
				for (uint32_t t = 0; t < B; t++)
					for (uint32_t d = 0; d < D; d++)
						(is_v ? vs : ks)[h][blk * B + t][d] =
							ref_sealed_value(L, 0, head, is_v, t, d);
			}
	ok(bad == 0, "%s: every code is a nearest centroid of its subvector (float64 search; %ld not)", policy, bad);

	for (uint32_t i = 0; i < N; i++)
		for (uint32_t qh = 0; qh < H * G_Q; qh++)
			for (uint32_t d = 0; d < D; d++)
				q[i][qh][d] = (float)(tap_rand() % 2001) / 1000.0f - 1.0f;
	for (int isa = 0; isa < 2; isa++) {
		static const uint32_t ms[] = { 1, 3, N };   /* decode, a short step, a prefill */
		const char *name = isa ? "avx2" : "portable";

		if (kvq_cpu_set_isa(name) < 0) {
			ok(1, "%s: attention on the %s path # SKIP not on this CPU", policy, name);
			continue;
		}
		for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
			struct kvq_attn a = { .L = L, .base = base, .layer = 0, .q_heads = H * G_Q, .scale = 0.125f,
					      .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
			struct kvq_seq_table s = { .n = N, .m = ms[mi], .sealed = sealed, .open = open_ids };
			double maxref, maxerr;

			memset(out, 0xff, sizeof(out));   /* NaN: an element left unwritten fails */
			r = kvq_cpu_attention(&a, &s, 1, q, out);
			maxerr = r == 0 ? check_attention(N, ms[mi], &maxref) : INFINITY;
			ok(r == 0 && maxerr <= 2e-5 * maxref + 1e-6,
			   "%s, %s path, %u queries: attention equals float64 attention over the stored values "
			   "(max error %.3g of max |ref| %.3g)", policy, name, ms[mi], maxerr, r == 0 ? maxref : 0.0);
		}
	}
	kvq_cpu_set_isa("auto");
	free(base);
	kvq_layout_free(L);
}

/* kvq_pq_encode's own rules: the lowest index among equal distances, NaN. */
static void test_encode_rules(void)
{
	static uint16_t cb[256 * 4];
	float x[4] = { 0.5f, -0.25f, 1.0f, 2.0f }, nan4[4] = { NAN, NAN, NAN, NAN };

	for (uint32_t c = 0; c < 256; c++)
		for (uint32_t j = 0; j < 4; j++)
			cb[c * 4 + j] = kvq_f16_from_f32((float)c + (float)j);
	for (uint32_t j = 0; j < 4; j++)
		cb[9 * 4 + j] = cb[5 * 4 + j] = kvq_f16_from_f32(x[j]);
	ok(kvq_pq_encode(x, cb, 4) == 5, "an exact tie goes to the lower index (5 and 9 equal: %u)",
	   kvq_pq_encode(x, cb, 4));
	ok(kvq_pq_encode(nan4, cb, 4) == 0, "a NaN subvector gets code 0");
	x[0] = 254.4f; x[1] = 255.4f; x[2] = 256.4f; x[3] = 257.4f;
	ok(kvq_pq_encode(x, cb, 4) == 254, "the nearest of 256 (254)");
	ok(kvq_fmt_subdim(KVQ_FMT_PQ2) == 4 && kvq_fmt_subdim(KVQ_FMT_PQ1) == 8 &&
	   kvq_fmt_param_kind(KVQ_FMT_PQ2, 0) == KVQ_PARAM_CODEBOOK && kvq_fmt_param_kind(KVQ_FMT_PQ1, 1) ==
	   KVQ_PARAM_CODEBOOK && fabs(kvq_fmt_bytes_per_value(KVQ_FMT_PQ2, 0, 32, 128) - 0.25) < 1e-12 &&
	   fabs(kvq_fmt_bytes_per_value(KVQ_FMT_PQ1, 1, 32, 128) - 0.125) < 1e-12,
	   "pq2: 4 values per 8-bit code (0.25 bytes per value), pq1: 8 (0.125), codebooks of the pool");
}

int main(void)
{
	tap_seed();
	test_encode_rules();
	test_policy("pq2");
	test_policy("k=pq1,v=pq2");
	test_policy("k=int8,v=pq2");
	test_policy("k=pq2,v=kivi2");
	test_policy("k=kivi4,v=pq1");
	return done_testing();
}
