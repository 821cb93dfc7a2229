/* SPDX-License-Identifier: Apache-2.0 */
/* AVX2 + FMA + F16C inner loops; this file alone is compiled with those flags
 * and is used only after a run-time CPU check (ops.c). */
#include <immintrin.h>
#include <math.h>

#include "config.h"
#include "../kvq_format.h"
#include "ops.h"

/* 8 codes -> 8 floats */
static inline __m256 dec8_int8(const uint8_t *p)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 dec8_e4m3(const uint8_t *p)
{
	/* sign | (exponent, mantissa) << 20, times 2^120: exact, subnormals included */
	__m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
	__m256i s = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
	__m256i m = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)), 20);
	return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(s, m)), _mm256_set1_ps(1.329227995784916e+36f));
}

static inline __m256 dec8_e5m2(const uint8_t *p)
{
	__m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)), 8);
	return _mm256_cvtph_ps(h);
}

static inline __m256 dec8_f16(const uint8_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 dec8_bf16(const uint8_t *p)
{
	__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* 16 nibbles (8 bytes, element 2i in the low nibble of byte i) -> 2 x 8 floats */
static inline void dec16_u4(const uint8_t *p, __m256 *lo, __m256 *hi)
{
	__m128i b = _mm_loadl_epi64((const __m128i *)p);
	__m128i mask = _mm_set1_epi8(0x0f);
	__m128i l = _mm_and_si128(b, mask);
	__m128i h = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
	__m128i e = _mm_unpacklo_epi8(l, h);
	*lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e));
	*hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e, 8)));
}

/* 16 crumbs (4 bytes, element i in bits 2*(i%4) of byte i/4) -> 2 x 8 floats */
static inline void dec16_u2(const uint8_t *p, __m256 *lo, __m256 *hi)
{
	uint32_t w;
	memcpy(&w, p, 4);
	__m256i v = _mm256_set1_epi32((int)w);
	__m256i three = _mm256_set1_epi32(3);
	__m256i s0 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
	__m256i s1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
	*lo = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, s0), three));
	*hi = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, s1), three));
}

static void decode(int fmt, const uint8_t *codes, uint32_t first, uint32_t n, float *out)
{
	unsigned bits = kvq_fmt_bits(fmt);
	const uint8_t *p = codes + (size_t)first * bits / 8;
	__m256 a, b;

	switch (fmt) {
	case KVQ_FMT_F16:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_f16(p + 2 * i));
		break;
	case KVQ_FMT_BF16:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_bf16(p + 2 * i));
		break;
	case KVQ_FMT_INT8:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_int8(p + i));
		break;
	case KVQ_FMT_FP8:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_e4m3(p + i));
		break;
	case KVQ_FMT_FP8E5M2:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_e5m2(p + i));
		break;
	default:
		if (bits == 4) {
			for (uint32_t i = 0; i < n; i += 16) {
				dec16_u4(p + i / 2, &a, &b);
				_mm256_storeu_ps(out + i, a);
				_mm256_storeu_ps(out + i + 8, b);
			}
		} else {
			for (uint32_t i = 0; i < n; i += 16) {
				dec16_u2(p + i / 4, &a, &b);
				_mm256_storeu_ps(out + i, a);
				_mm256_storeu_ps(out + i + 8, b);
			}
		}
		break;
	}
}

/* Four horizontal sums at once: lane i of the result is the sum of v[i]. */
static inline __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
	__m256 a = _mm256_hadd_ps(v0, v1);
	__m256 b = _mm256_hadd_ps(v2, v3);
	__m256 c = _mm256_hadd_ps(a, b);
	return _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}

static void dots(const float *x, const float *y, size_t ys, uint32_t m, uint32_t n, float *ret, size_t rs)
{
	uint32_t i = 0;

	for (; i + 4 <= m; i += 4) {
		const float *y0 = y + i * ys, *y1 = y0 + ys, *y2 = y1 + ys, *y3 = y2 + ys;
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		float r[4];
		for (uint32_t j = 0; j < n; j += 8) {
			__m256 xv = _mm256_loadu_ps(x + j);
			a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y0 + j), a0);
			a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y1 + j), a1);
			a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y2 + j), a2);
			a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y3 + j), a3);
		}
		_mm_storeu_ps(r, hsum4(a0, a1, a2, a3));
		ret[i * rs] = r[0];
		ret[(i + 1) * rs] = r[1];
		ret[(i + 2) * rs] = r[2];
		ret[(i + 3) * rs] = r[3];
	}
	for (; i < m; i++) {
		const float *yi = y + i * ys;
		__m256 a = _mm256_setzero_ps();
		float r[4];
		for (uint32_t j = 0; j < n; j += 8)
			a = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(yi + j), a);
		_mm_storeu_ps(r, hsum4(a, a, a, a));
		ret[i * rs] = r[0];
	}
}

static void axpys(const float *x, const float *c, size_t cs, uint32_t m, uint32_t n, float *acc, size_t as)
{
	for (uint32_t i = 0; i < m; i++) {
		__m256 ci = _mm256_set1_ps(c[i * cs]);
		float *a = acc + i * as;
		for (uint32_t j = 0; j < n; j += 8)
			_mm256_storeu_ps(a + j, _mm256_fmadd_ps(ci, _mm256_loadu_ps(x + j), _mm256_loadu_ps(a + j)));
	}
}

static void affine(float *x, const float *s, const float *z, uint32_t n)
{
	if (z) {
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(x + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(s + i),
								_mm256_loadu_ps(z + i)));
	} else {
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(s + i)));
	}
}

static void affine1(float *x, float s, float z, uint32_t n)
{
	__m256 sv = _mm256_set1_ps(s), zv = _mm256_set1_ps(z);

	for (uint32_t i = 0; i < n; i += 8)
		_mm256_storeu_ps(x + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), sv, zv));
}

static void params(const uint8_t *p, int kind, uint32_t count, float *s, float *z)
{
	if (kind == KVQ_PARAM_TOKEN) {
		for (uint32_t i = 0; i < count; i += 8)
			_mm256_storeu_ps(s + i, dec8_f16(p + 2 * i));
		return;
	}
	/* {s, z} pairs: 8 pairs -> [s0 z0 .. s3 z3 | ...], then de-interleave */
	for (uint32_t i = 0; i < count; i += 8) {
		__m256 a = dec8_f16(p + 4 * i), b = dec8_f16(p + 4 * i + 16);
		__m256 sv = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
		__m256 zv = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
		sv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sv), _MM_SHUFFLE(3, 1, 2, 0)));
		zv = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(zv), _MM_SHUFFLE(3, 1, 2, 0)));
		_mm256_storeu_ps(s + i, sv);
		_mm256_storeu_ps(z + i, zv);
	}
}

/* exp(x) for x <= 0, relative error about 2e-7 (Cody-Waite reduction and a
 * degree-6 polynomial); inputs below -87 give 0. */
static inline __m256 exp8(__m256 x)
{
	__m256 zero_mask = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
	__m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
	x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
	__m256 y = _mm256_set1_ps(1.9875691500e-4f);
	y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
	y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
	y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
	y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
	y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
	y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
	y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
	return _mm256_andnot_ps(zero_mask, y);
}

static float expsum(float *x, float mx, uint32_t n)
{
	__m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
	uint32_t i = 0;
	float r[4], sum;

	for (; i + 8 <= n; i += 8) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
		_mm256_storeu_ps(x + i, e);
		acc = _mm256_add_ps(acc, e);
	}
	_mm_storeu_ps(r, hsum4(acc, acc, acc, acc));
	sum = r[0];
	for (; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

const struct kvq_cpu_ops kvq_cpu_ops_avx2 = {
	.name = "avx2",
	.decode = decode,
	.dots = dots,
	.axpys = axpys,
	.affine = affine,
	.affine1 = affine1,
	.params = params,
	.expsum = expsum,
};
