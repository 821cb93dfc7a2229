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
		switch (fmt) {
		case KVQ_FMT_F16: out[i] = kvq_f16_to_f32((uint16_t)c); break;
		case KVQ_FMT_BF16: out[i] = kvq_bf16_to_f32((uint16_t)c); break;
		case KVQ_FMT_INT8: case KVQ_FMT_FP8: case KVQ_FMT_FP8E5M2:
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

static void axpys(const float *x, const float *c, size_t cs, uint32_t m, uint32_t n, float *acc, size_t as)
{
	for (uint32_t i = 0; i < m; i++) {
		float ci = c[i * cs];
		float *a = acc + i * as;
		for (uint32_t j = 0; j < n; j++)
			a[j] += ci * x[j];
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

static float expsum(float *x, float mx, uint32_t n)
{
	float sum = 0.0f;

	for (uint32_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

const struct kvq_cpu_ops kvq_cpu_ops_portable = {
	.name = "portable",
	.decode = decode,
	.dots = dots,
	.axpys = axpys,
	.affine = affine,
	.affine1 = affine1,
	.params = params,
	.expsum = expsum,
};
