/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A new format is one row of the format table (kvq_format.h): this test's
 * build adds a throwaway row (tests/unit/format_row.h, force-included here
 * and into a copy of the kernels built for this test only) and shows,
 * with no other edit, that the row has a name, parses in policies, gets a
 * layout, is written (quantized on append and on seal) and is read by both
 * CPU attention paths.  The stored values are decoded by this test from the
 * row's definition (4-bit codes packed little-end first, a scale and a zero
 * in FP16 per group: kvq_format.h's order inside a sealed slice), each is
 * checked against its input (within half a step), and attention is compared
 * with float64 attention over those decoded values.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "../tap.h"
#include "../ref.h"

#ifndef KVQ_TEST_FORMAT_ROW_H
#error "build with -include tests/unit/format_row.h"
#endif

#define H 2
#define G_Q 2              /* query heads per KV head */
#define D 64
#define B 16
#define N (3 * B + 5)      /* 3 sealed blocks and 5 tokens in the open window */
#define NQ 4

static double kin[N][H][D], vin[N][H][D];     /* inputs as F16 values */
static double ks[H][N][D], vs[H][N][D];       /* values as stored */

/* Element (t, d) of a sealed head slice of the row, from its definition. */
static double row_value(const struct kvq_layout *L, const uint8_t *head, int is_v, uint32_t t, uint32_t d,
			double *step)
{
	const struct kvq_layer_layout *ll = &L->layer[0];
	const uint8_t *codes = head + ll->off[is_v ? KVQ_V_CODES : KVQ_K_CODES];
	const uint8_t *params = head + ll->off[is_v ? KVQ_V_PARAMS : KVQ_K_PARAMS];
	uint32_t e = is_v ? d * B + t : t * D + d;
	uint32_t p = is_v ? (d / TEST_ROW_GROUP) * B + t : t * (D / TEST_ROW_GROUP) + d / TEST_ROW_GROUP;
	uint32_t c = (codes[e / 2] >> (e % 2 * 4)) & 0xfu;
	double s = ref_f16(ref_u16(params + 4 * p)), z = ref_f16(ref_u16(params + 4 * p + 2));

	*step = s;
	return c * s + z;
}

int main(void)
{
	char err[256], names[KVQ_FMT_NAMES_LEN], canon[64];
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = 1, .kv_heads = H, .head_dim = D, .block_tokens = B,
					.n_sealed = 4, .n_open = 2, .act = KVQ_DT_F16, .policy = &pol };
	struct kvq_layout *L = NULL;
	static uint16_t k[N][H][D], v[N][H][D];
	static float q[NQ][H * G_Q][D], out[NQ][H * G_Q][D];
	const int32_t sealed[3] = { 2, 0, 3 }, open_a[1] = { 1 };
	int f = kvq_fmt_from_name(TEST_ROW_NAME, strlen(TEST_ROW_NAME));
	double worst = 0.0;
	uint8_t *base;
	int r;

	tap_seed();
	ok(f == KVQ_FMT_TESTG16 && f == KVQ_FMT_COUNT - 1 && !strcmp(kvq_fmt_name(f), TEST_ROW_NAME),
	   "the row is format %d of %d, named %s", f, KVQ_FMT_COUNT, TEST_ROW_NAME);
	ok(kvq_fmt_bits(f) == TEST_ROW_BITS && kvq_fmt_group(f, 0) == TEST_ROW_GROUP &&
	   kvq_fmt_group(f, 1) == TEST_ROW_GROUP && kvq_fmt_param_kind(f, 1) == KVQ_PARAM_GROUP &&
	   kvq_fmt_qmax(f) == 15.0f, "its traits come from the row");
	ok(strstr(kvq_fmt_names(names, sizeof(names)), TEST_ROW_NAME) != NULL, "the list of names has it: %s", names);
	ok(kvq_policy_parse("k=int8,v=" TEST_ROW_NAME, 1, &pol, err, sizeof(err)) == 0 &&
	   kvq_policy_format(&pol, canon, sizeof(canon)) > 0 && !strcmp(canon, "k=int8,v=" TEST_ROW_NAME),
	   "a policy names it (canonical form %s)", canon);
	ok(kvq_policy_parse("nosuch", 1, &pol, err, sizeof(err)) == -EINVAL && strstr(err, TEST_ROW_NAME),
	   "an unknown format's message lists it: %s", err);

	err[0] = '\0';
	r = kvq_policy_parse(TEST_ROW_NAME, 1, &pol, err, sizeof(err));
	r = r < 0 ? r : kvq_layout_new(&lp, &L, err, sizeof(err));
	if (!ok(r == 0, "a layout of it%s%s", r ? ": " : "", err))
		return done_testing();
	ok(L->layer[0].size[KVQ_K_CODES] == B * D / 2 && L->layer[0].size[KVQ_V_PARAMS] == B * (D / TEST_ROW_GROUP) * 4,
	   "its fields: %u bytes of K codes, %u of V parameters", L->layer[0].size[KVQ_K_CODES],
	   L->layer[0].size[KVQ_V_PARAMS]);
	ok(fabs(kvq_fmt_bytes_per_value(f, 0, B, D) - (0.5 + 4.0 / TEST_ROW_GROUP)) < 1e-12,
	   "bytes per value %.4f", kvq_fmt_bytes_per_value(f, 0, B, D));

	base = aligned_alloc(256, (L->total_bytes + 255) / 256 * 256);
	memset(base, 0, L->total_bytes);
	for (uint32_t t = 0; t < N; t++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t d = 0; d < D; d++) {
				k[t][h][d] = kvq_f16_from_f32((float)(tap_rand() % 2001) / 1000.0f - 1.0f);
				v[t][h][d] = kvq_f16_from_f32((float)(tap_rand() % 2001) / 500.0f - 2.0f);
				kin[t][h][d] = ref_f16(k[t][h][d]);
				vin[t][h][d] = ref_f16(v[t][h][d]);
			}
	/* the first 20 tokens in one write (block 0 sealed straight from the
	 * input, block 1 into open slot 0), the rest in a second (block 1
	 * sealed from the open window, block 2 from the input, block 3 open) */
	{
		const int32_t open1[2] = { -1, 0 }, open2[3] = { 0, -1, 1 };
		struct kvq_seq_table w1 = { .n = 0, .m = 20, .sealed = sealed, .open = open1 };
		struct kvq_seq_table w2 = { .n = 20, .m = N - 20, .sealed = sealed, .open = open2 };

		ok(kvq_cpu_write(L, base, 0, &w1, k, v) == 0 && kvq_cpu_write(L, base, 0, &w2, k[20], v[20]) == 0,
		   "two writes of %d tokens: %u sealed blocks, %u tokens open", N, kvq_layout_split(L, N) / B,
		   N - kvq_layout_split(L, N));
	}

	/* every stored value decoded by the row's definition, within half a step of its input */
	for (uint32_t h = 0; h < H; h++)
		for (uint32_t t = 0; t < N; t++)
			for (uint32_t d = 0; d < D; d++) {
				uint32_t b = t / B;
				double sk = 0.0, sv = 0.0;

				if (t < kvq_layout_split(L, N)) {
					const uint8_t *head = base + kvq_layout_off(L, KVQ_SEALED, (uint32_t)sealed[b], 0, h, 0);

					ks[h][t][d] = row_value(L, head, 0, t % B, d, &sk);
					vs[h][t][d] = row_value(L, head, 1, t % B, d, &sv);
				} else {
					ks[h][t][d] = kin[t][h][d];
					vs[h][t][d] = vin[t][h][d];
				}
				worst = fmax(worst, fabs(ks[h][t][d] - kin[t][h][d]) - sk * (0.5 + 1e-3));
				worst = fmax(worst, fabs(vs[h][t][d] - vin[t][h][d]) - sv * (0.5 + 1e-3));
			}
	ok(worst <= 1e-6, "every stored value is within half a step of its input (excess %.3g)", worst);

	for (uint32_t i = 0; i < NQ; i++)
		for (uint32_t qh = 0; qh < H * G_Q; qh++)
			for (uint32_t d = 0; d < D; d++)
				q[i][qh][d] = (float)(tap_rand() % 2001) / 1000.0f - 1.0f;
	for (int isa = 0; isa < 2; isa++) {
		const char *name = isa ? "avx2" : "portable";
		struct kvq_attn a = { .L = L, .base = base, .layer = 0, .q_heads = H * G_Q, .scale = 0.125f,
				      .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
		struct kvq_seq_table s = { .n = N, .m = NQ, .sealed = sealed, .open = open_a };
		double maxref = 0.0, maxerr = 0.0;

		if (kvq_cpu_set_isa(name) < 0) {
			ok(1, "attention on the %s path # SKIP not on this CPU", name);
			continue;
		}
		memset(out, 0xff, sizeof(out));   /* NaN: an element left unwritten fails */
		if (!ok(kvq_cpu_attention(&a, &s, 1, q, out) == 0, "attention on the %s path runs", name))
			continue;
		for (uint32_t i = 0; i < NQ; i++)
			for (uint32_t qh = 0; qh < H * G_Q; qh++) {
				uint32_t h = qh / G_Q, pos = N - NQ + i;
				double sc[N], mx = -INFINITY, sum = 0.0;

				for (uint32_t t = 0; t <= pos; t++) {
					sc[t] = 0.0;
					for (uint32_t d = 0; d < D; d++)
						sc[t] += (double)q[i][qh][d] * ks[h][t][d];
					sc[t] *= 0.125;
					mx = fmax(mx, sc[t]);
				}
				for (uint32_t t = 0; t <= pos; t++)
					sum += sc[t] = exp(sc[t] - mx);
				for (uint32_t d = 0; d < D; d++) {
					double ref = 0.0;

					for (uint32_t t = 0; t <= pos; t++)
						ref += sc[t] / sum * vs[h][t][d];
					maxref = fmax(maxref, fabs(ref));
					maxerr = fmax(maxerr, isnan(out[i][qh][d]) ? INFINITY : fabs(out[i][qh][d] - ref));
				}
			}
		ok(maxerr <= 1e-5 * maxref + 1e-6, "%s attention equals float64 attention over the stored values "
		   "(max error %.3g of max |ref| %.3g)", name, maxerr, maxref);
	}
	free(base);
	kvq_layout_free(L);
	return done_testing();
}
