/* SPDX-License-Identifier: Apache-2.0 */
#include <math.h>

#include "config.h"
#include "../kvq_format.h"
#include "ops.h"

static void decode(int fmt, const uint8_t *codes, uint32_t first, uint32_t n, float *out)
{
	unsigned bits = kvq_fmt_bits(fmt);

	for (uint32_t i = 0; i < n; i++) {
		uint32_t c = kvq_code_get(codes, first + i, bits);
		switch (kvq_fmt_code(fmt)) {
		case KVQ_CODE_F16: out[i] = kvq_f16_to_f32((uint16_t)c); break;
		case KVQ_CODE_BF16: out[i] = kvq_bf16_to_f32((uint16_t)c); break;
		case KVQ_CODE_SINT: case KVQ_CODE_E4M3: case KVQ_CODE_E5M2:
			out[i] = kvq_decode_sym(fmt, c);
			break;
		default: out[i] = (float)c; break;
		}
	}
}

static void dots(const float *x, const float *y, size_t ys, uint32_t m, uint32_t n, float *ret, size_t rs)
{
	for (uint32_t i = 0; i < m; i++) {
		const float *yi = y + i * ys;
		float s = 0.0f;
		for (uint32_t j = 0; j < n; j++)
			s += x[j] * yi[j];
		ret[i * rs] = s;
	}
}


static void affine(float *x, const float *s, const float *z, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		x[i] = x[i] * s[i] + (z ? z[i] : 0.0f);
}

static void affine1(float *x, float s, float z, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		x[i] = x[i] * s + z;
}

static void params(const uint8_t *p, int kind, uint32_t count, float *s, float *z)
{
	uint16_t w[2];

	for (uint32_t i = 0; i < count; i++) {
		if (kind == KVQ_PARAM_TOKEN) {
			memcpy(w, p + 2 * i, 2);
			s[i] = kvq_f16_to_f32(w[0]);
		} else {
			memcpy(w, p + 4 * i, 4);
			s[i] = kvq_f16_to_f32(w[0]);
			z[i] = kvq_f16_to_f32(w[1]);
		}
	}
}

static float vmax(const float *x, uint32_t n)
{
	float m = -INFINITY;

	for (uint32_t i = 0; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
}

static float expsum(float *x, float mx, uint32_t n)
{
	float sum = 0.0f;

	for (uint32_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

/* K row t of a sealed block, dequantized into row[D]. */
static void k_row(const struct kvq_blk *b, uint32_t t, float *row)
{
	uint32_t B = b->B, D = b->D;

	decode(b->kfmt, b->kc, kvq_k_elem(t, 0, B, D), D, row);
	switch (b->kkind) {
	case KVQ_PARAM_TOKEN:
		affine1(row, b->ks[t], 0.0f, D);
		break;
	case KVQ_PARAM_GROUP:
		for (uint32_t g0 = 0; g0 < D; g0 += b->kgroup) {
			uint32_t i = kvq_param_index(KVQ_PARAM_GROUP, b->kgroup, 0, t, g0, B, D);
			affine1(row + g0, b->ks[i], b->kz[i], b->kgroup);
		}
		break;
	case KVQ_PARAM_CHANNEL:
		affine(row, b->ks, b->kz, D);
		break;
	default:
		break;
	}
}

/* V values of dimension d for the block's B tokens, dequantized into row[B]. */
static void v_col(const struct kvq_blk *b, uint32_t d, float *row)
{
	uint32_t B = b->B, D = b->D;

	decode(b->vfmt, b->vc, kvq_v_elem(0, d, B, D), B, row);
	if (b->vkind == KVQ_PARAM_TOKEN) {
		affine(row, b->vs, NULL, B);
	} else if (b->vkind == KVQ_PARAM_GROUP) {
		uint32_t i = kvq_param_index(KVQ_PARAM_GROUP, b->vgroup, 1, 0, d, B, D);
		affine(row, b->vs + i, b->vz + i, B);
	}
}

static void k_scores4(const struct kvq_blk *b, const float *q, uint32_t tmax, float *sc, size_t ldsc)
{
	float row[256];

	for (uint32_t t = 0; t < tmax; t++) {
		k_row(b, t, row);
		dots(row, q, b->D, 4, b->D, sc + t, ldsc);
	}
}

static void v_accum4(const struct kvq_blk *b, const float *p, size_t ldp, float *accT)
{
	float row[256], sum[4];

	for (uint32_t d = 0; d < b->D; d++) {
		v_col(b, d, row);
		dots(row, p, ldp, 4, b->B, sum, 1);
		for (uint32_t r = 0; r < 4; r++)
			accT[d * 4 + r] += sum[r];
	}
}


static void v_row4(const float *row, const float *p, size_t ldp, uint32_t n, float *accT)
{
	for (uint32_t d = 0; d < n; d++)
		for (uint32_t r = 0; r < 4; r++)
			accT[d * 4 + r] += p[r * ldp] * row[d];
}

static void scale4(float *accT, const float *al, uint32_t n)
{
	for (uint32_t d = 0; d < n; d++)
		for (uint32_t r = 0; r < 4; r++)
			accT[d * 4 + r] *= al[r];
}

const struct kvq_cpu_ops kvq_cpu_ops_portable = {
	.name = "portable",
	.decode = decode,
	.dots = dots,
	.params = params,
	.k_scores4 = k_scores4,
	.v_accum4 = v_accum4,
	.v_row4 = v_row4,
	.scale4 = scale4,
	.max = vmax,
	.expsum = expsum,
};
