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

	switch (kvq_fmt_code(fmt)) {
	case KVQ_CODE_F16:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_f16(p + 2 * i));
		break;
	case KVQ_CODE_BF16:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_bf16(p + 2 * i));
		break;
	case KVQ_CODE_SINT:   /* of 8 bits, the only one in the table */
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_int8(p + i));
		break;
	case KVQ_CODE_E4M3:
		for (uint32_t i = 0; i < n; i += 8)
			_mm256_storeu_ps(out + i, dec8_e4m3(p + i));
		break;
	case KVQ_CODE_E5M2:
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

static float vmax(const float *x, uint32_t n)
{
	__m256 m8 = _mm256_set1_ps(-INFINITY);
	uint32_t i = 0;
	float m;

	for (; i + 8 <= n; i += 8)
		m8 = _mm256_max_ps(_mm256_loadu_ps(x + i), m8);   /* a NaN is passed over, as below */
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	m = _mm_cvtss_f32(m4);
	for (; i < n; i++)
		m = x[i] > m ? x[i] : m;
	return m;
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

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Elements e .. e+7 of a row of an 8- or 16-bit format. */
static ALWAYS_INLINE __m256 dec8(int F, const uint8_t *row, uint32_t e)
{
	switch (kvq_fmt_code(F)) {
	case KVQ_CODE_F16: return dec8_f16(row + 2 * e);
	case KVQ_CODE_BF16: return dec8_bf16(row + 2 * e);
	case KVQ_CODE_SINT: return dec8_int8(row + e);
	case KVQ_CODE_E4M3: return dec8_e4m3(row + e);
	default: return dec8_e5m2(row + e);
	}
}

/* Elements e .. e+15 of a packed row -> two vectors of unscaled code values.
 * F is a compile-time constant in every caller. */
static ALWAYS_INLINE void dec16(int F, const uint8_t *row, uint32_t e, __m256 *lo, __m256 *hi)
{
	switch (kvq_fmt_bits(F)) {
	case 2:
		dec16_u2(row + e / 4, lo, hi);
		break;
	case 4:
		dec16_u4(row + e / 2, lo, hi);
		break;
	default:   /* the 8- and 16-bit formats */
		*lo = dec8(F, row, e);
		*hi = dec8(F, row, e + 8);
		break;
	}
}

/*
 * The next head slice's lines are prefetched in two halves, the first
 * spread over the K loop's tokens, the second over the V loop's dimension
 * pairs: a cursor over one half that each step advances by its share.
 */
struct pf {
	const uint8_t *p;
	uint32_t left;   /* lines not yet prefetched */
};

static inline struct pf pf_half(const struct kvq_blk *b, int second)
{
	struct pf c = { NULL, 0 };

	if (b->next) {
		uint32_t all = (b->next_bytes + 63) / 64, half = all / 2;
		c.p = b->next + (second ? (size_t)half * 64 : 0);
		c.left = second ? all - half : half;
	}
	return c;
}

static inline void pf_step(struct pf *c, uint32_t lines)
{
	uint32_t n = lines < c->left ? lines : c->left;

	for (uint32_t k = 0; k < n; k++)
		__builtin_prefetch(c->p + (size_t)k * 64);
	c->p += (size_t)n * 64;
	c->left -= n;
}

/* Eight horizontal sums at once: lane i of the result is the sum of v[i]. */
static inline __m256 hsum8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
			   __m256 v7)
{
	__m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
	__m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
	return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/*
 * Dot products of two code rows (a, b: n elements from element e0) with four
 * float rows x + r * ldx: [a.x0 a.x1 a.x2 a.x3 b.x0 b.x1 b.x2 b.x3].  Each x
 * vector is loaded once for both code rows: the loads, not the FMAs, bound
 * a one-row loop on two load ports.
 */
static ALWAYS_INLINE __m256 dot2x4(const int F, const uint8_t *a, const uint8_t *b, uint32_t e0, uint32_t n,
				   const float *x, size_t ldx)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	__m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;

	for (uint32_t e = 0; e < n; e += 16) {
		__m256 alo, ahi, blo, bhi, xl, xh;
		dec16(F, a, e0 + e, &alo, &ahi);
		dec16(F, b, e0 + e, &blo, &bhi);
#define ROW(r, ACC_A, ACC_B)                                                    \
		xl = _mm256_loadu_ps(x + (r) * ldx + e);                        \
		xh = _mm256_loadu_ps(x + (r) * ldx + e + 8);                    \
		ACC_A = _mm256_fmadd_ps(alo, xl, ACC_A);                        \
		ACC_B = _mm256_fmadd_ps(blo, xl, ACC_B);                        \
		ACC_A = _mm256_fmadd_ps(ahi, xh, ACC_A);                        \
		ACC_B = _mm256_fmadd_ps(bhi, xh, ACC_B);
		ROW(0, a0, b0)
		ROW(1, a1, b1)
		ROW(2, a2, b2)
		ROW(3, a3, b3)
#undef ROW
	}
	return hsum8(a0, a1, a2, a3, b0, b1, b2, b3);
}

/*
 * As dot2x4 for three code rows of an 8- or 16-bit format and R (3 or 4)
 * float rows, 8 elements a step: up to twelve accumulators, three code
 * vectors and one x vector fill the sixteen registers, and each x load serves
 * three FMAs.  ret[k] holds [k.x0 k.x1 k.x2 k.x3] (0 for a row past R).
 */
static ALWAYS_INLINE void dot3xR(const int F, const int R, const uint8_t *a, const uint8_t *b, const uint8_t *c,
				 uint32_t n, const float *x, size_t ldx, __m128 ret[3])
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	__m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
	__m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;

	for (uint32_t e = 0; e < n; e += 8) {
		__m256 av = dec8(F, a, e), bv = dec8(F, b, e), cv = dec8(F, c, e), xv;
#define ROW(r, A, B_, C)                                   \
		xv = _mm256_loadu_ps(x + (r) * ldx + e);  \
		A = _mm256_fmadd_ps(av, xv, A);          \
		B_ = _mm256_fmadd_ps(bv, xv, B_);        \
		C = _mm256_fmadd_ps(cv, xv, C);
		ROW(0, a0, b0, c0)
		ROW(1, a1, b1, c1)
		ROW(2, a2, b2, c2)
		if (R == 4) {
			ROW(3, a3, b3, c3)
		}
#undef ROW
	}
	__m256 ab = hsum8(a0, a1, a2, a3, b0, b1, b2, b3);
	ret[0] = _mm256_castps256_ps128(ab);
	ret[1] = _mm256_extractf128_ps(ab, 1);
	ret[2] = hsum4(c0, c1, c2, c3);
}

/*
 * Scores of 4 query rows against a sealed block's K, three tokens at a time
 * for the 8- and 16-bit formats (R of the rows real: 3 skips the padding
 * row's FMAs), two at a time for the rest.
 * Scales stay out of the inner product (KERNELS.md): per-token scales
 * multiply the scores, group scales multiply each group's partial dot and add
 * zero * sum(q over the group), per-channel KIVI scales are folded into q
 * once per block.
 */
static ALWAYS_INLINE void k_scores4_impl(const struct kvq_blk *b, const float *q, uint32_t tmax,
					 float *sc, size_t ldsc, const int F, const int KIND, const int R)
{
	const uint32_t B = b->B, D = b->D, G = KIND == KVQ_PARAM_GROUP ? b->kgroup : D;
	const unsigned bits = kvq_fmt_bits(F);
	float qs[4 * KVQ_MAX_HEAD_DIM] __attribute__((aligned(32)));
	float qsum[KVQ_MAX_HEAD_DIM / 32 * 4] __attribute__((aligned(16)));
	float bias[4] __attribute__((aligned(16))) = { 0, 0, 0, 0 };
	const float *qq = q;

	if (KIND == KVQ_PARAM_CHANNEL) {
		for (uint32_t r = 0; r < 4; r++) {
			float acc = 0.0f;
			for (uint32_t d = 0; d < D; d++) {
				qs[r * D + d] = q[r * D + d] * b->ks[d];
				acc += q[r * D + d] * b->kz[d];
			}
			bias[r] = acc;
		}
		qq = qs;
	} else if (KIND == KVQ_PARAM_GROUP) {
		for (uint32_t g0 = 0; g0 < D; g0 += G)
			for (uint32_t r = 0; r < 4; r++) {
				float acc = 0.0f;
				for (uint32_t d = g0; d < g0 + G; d++)
					acc += q[r * D + d];
				qsum[g0 / G * 4 + r] = acc;
			}
	}
	struct pf pf = pf_half(b, 0);
	const uint32_t per_tok = (pf.left + tmax - 1) / tmax;
	uint32_t t = 0;

	if (bits >= 8) {   /* the 8- and 16-bit formats: per-token scales or none */
		for (; t + 3 <= tmax; t += 3) {
			const uint8_t *r0 = b->kc + (size_t)kvq_k_elem(t, 0, B, D) * bits / 8;
			__m128 h[3];
			pf_step(&pf, 3 * per_tok);
			dot3xR(F, R, r0, r0 + (size_t)D * bits / 8, r0 + (size_t)2 * D * bits / 8, D, q, D, h);
			for (uint32_t k = 0; k < 3; k++) {
				__m128 v = h[k];
				if (KIND == KVQ_PARAM_TOKEN)
					v = _mm_mul_ps(v, _mm_set1_ps(b->ks[t + k]));
				_mm_store_ss(sc + t + k, v);
				_mm_store_ss(sc + ldsc + t + k, _mm_shuffle_ps(v, v, 1));
				_mm_store_ss(sc + 2 * ldsc + t + k, _mm_shuffle_ps(v, v, 2));
				_mm_store_ss(sc + 3 * ldsc + t + k, _mm_shuffle_ps(v, v, 3));
			}
		}
	}
	for (; t < tmax; t += 2) {
		uint32_t u = t + 1 < tmax ? t + 1 : t;   /* an odd tail computes its token twice */
		pf_step(&pf, 2 * per_tok);
		const uint8_t *ra = b->kc + (size_t)kvq_k_elem(t, 0, B, D) * bits / 8;
		const uint8_t *rb = b->kc + (size_t)kvq_k_elem(u, 0, B, D) * bits / 8;
		__m128 bias4 = _mm_load_ps(bias);
		__m256 score = _mm256_set_m128(bias4, bias4);
		float out[8];

		for (uint32_t g0 = 0; g0 < D; g0 += G) {
			__m256 h = dot2x4(F, ra, rb, g0, G, qq + g0, D);
			if (KIND == KVQ_PARAM_GROUP) {
				uint32_t ia = kvq_param_index(KVQ_PARAM_GROUP, G, 0, t, g0, B, D);
				uint32_t ib = kvq_param_index(KVQ_PARAM_GROUP, G, 0, u, g0, B, D);
				__m128 qs4 = _mm_load_ps(qsum + g0 / G * 4);
				__m256 sv = _mm256_set_m128(_mm_set1_ps(b->ks[ib]), _mm_set1_ps(b->ks[ia]));
				__m256 zv = _mm256_set_m128(_mm_set1_ps(b->kz[ib]), _mm_set1_ps(b->kz[ia]));
				h = _mm256_fmadd_ps(h, sv, _mm256_mul_ps(zv, _mm256_set_m128(qs4, qs4)));
			}
			score = _mm256_add_ps(score, h);
		}
		if (KIND == KVQ_PARAM_TOKEN)
			score = _mm256_mul_ps(score, _mm256_set_m128(_mm_set1_ps(b->ks[u]), _mm_set1_ps(b->ks[t])));
		_mm256_storeu_ps(out, score);
		sc[t] = out[0];
		sc[ldsc + t] = out[1];
		sc[2 * ldsc + t] = out[2];
		sc[3 * ldsc + t] = out[3];
		sc[u] = out[4];
		sc[ldsc + u] = out[5];
		sc[2 * ldsc + u] = out[6];
		sc[3 * ldsc + u] = out[7];
	}
}

/* y[t] = x[t] * s[t] for t < n (n a multiple of 8) */
static ALWAYS_INLINE void mul_rows(float *y, const float *x, const float *s, uint32_t n)
{
	for (uint32_t t = 0; t < n; t += 8)
		_mm256_store_ps(y + t, _mm256_mul_ps(_mm256_loadu_ps(x + t), _mm256_loadu_ps(s + t)));
}

/*
 * V of a sealed block (stored transposed: dimension-major) into the 4 rows'
 * accumulators, two dimensions at a time.  Per-token scales are folded into
 * the probabilities once per block, group scales once per group, and a
 * group's zero adds sum_t p_t z_t to each of its dimensions.  B is a
 * compile-time constant for the default block size (the token loop unrolls).
 */
static ALWAYS_INLINE void v_accum4_impl(const struct kvq_blk *b, const float *p, size_t ldp, float *accT,
					const int F, const int KIND, const uint32_t B, const int R)
{
	const uint32_t D = b->D, G = KIND == KVQ_PARAM_GROUP ? b->vgroup : D;
	const unsigned bits = kvq_fmt_bits(F);
	float pp[4 * KVQ_MAX_BLOCK_TOKENS] __attribute__((aligned(32)));
	const float *x = p;
	size_t ld = ldp;
	struct pf pf = pf_half(b, 1);
	const uint32_t per_pair = (pf.left + D / 2 - 1) / (D / 2);

	if (KIND == KVQ_PARAM_TOKEN) {
		for (uint32_t r = 0; r < 4; r++)
			mul_rows(pp + r * B, p + r * ldp, b->vs, B);
		x = pp;
		ld = B;
	}
	for (uint32_t g0 = 0; g0 < D; g0 += G) {
		__m256 z8 = _mm256_setzero_ps();
		if (KIND == KVQ_PARAM_GROUP) {
			uint32_t base = kvq_param_index(KVQ_PARAM_GROUP, G, 1, 0, g0, B, D);
			__m256 zr[4];
			for (uint32_t r = 0; r < 4; r++) {
				__m256 acc = _mm256_setzero_ps();
				mul_rows(pp + r * B, p + r * ldp, b->vs + base, B);
				for (uint32_t t = 0; t < B; t += 8)
					acc = _mm256_fmadd_ps(_mm256_loadu_ps(p + r * ldp + t),
							      _mm256_loadu_ps(b->vz + base + t), acc);
				zr[r] = acc;
			}
			__m128 z4 = hsum4(zr[0], zr[1], zr[2], zr[3]);
			z8 = _mm256_set_m128(z4, z4);
			x = pp;
			ld = B;
		}
		uint32_t d = g0;
		if (R == 3 && bits >= 8) {
			/* three dimensions a step, leaving an even rest for the pairs */
			for (uint32_t tri = G / 3 - (G / 3) % 2; d < g0 + 3 * tri; d += 3) {
				const uint8_t *r0 = b->vc + (size_t)kvq_v_elem(0, d, B, D) * bits / 8;
				__m128 h[3];
				pf_step(&pf, (3 * per_pair + 1) / 2);
				dot3xR(F, 3, r0, r0 + (size_t)B * bits / 8, r0 + (size_t)2 * B * bits / 8, B, x, ld, h);
				for (uint32_t k = 0; k < 3; k++)
					_mm_storeu_ps(accT + (d + k) * 4,
						      _mm_add_ps(_mm_loadu_ps(accT + (d + k) * 4), h[k]));
			}
		}
		for (; d < g0 + G; d += 2) {
			pf_step(&pf, per_pair);
			const uint8_t *ra = b->vc + (size_t)kvq_v_elem(0, d, B, D) * bits / 8;
			const uint8_t *rb = b->vc + (size_t)kvq_v_elem(0, d + 1, B, D) * bits / 8;
			__m256 h = dot2x4(F, ra, rb, 0, B, x, ld);
			if (KIND == KVQ_PARAM_GROUP)
				h = _mm256_add_ps(h, z8);
			_mm256_storeu_ps(accT + d * 4, _mm256_add_ps(_mm256_loadu_ps(accT + d * 4), h));
		}
	}
}

/* One place turns a format into the constants above: FORMAT_CALL(F), a
 * macro the caller defines, in a case per row of the format table (groups
 * are read from the block, so the int4 rows' instances are alike). */
#define FORMAT_CASE(ID, ...) case KVQ_FMT_##ID: FORMAT_CALL(KVQ_FMT_##ID); break;
#define FORMAT_DISPATCH(fmt)                                                             \
	switch (fmt) {                                                                   \
	KVQ_FORMATS(FORMAT_CASE)                                                         \
	default: break;                                                                  \
	}

/* Three-row quads (GQA 3, as SmolLM2's 9 query / 3 KV heads) skip the
 * padding row's FMAs where the kernel has a three-row form. */
static void k_scores4(const struct kvq_blk *b, const float *q, uint32_t tmax, float *sc, size_t ldsc)
{
#define K_CALL(F) k_scores4_impl(b, q, tmax, sc, ldsc, F, kvq_fmt_param_kind(F, 0), 4)
#define K_CALL3(F) k_scores4_impl(b, q, tmax, sc, ldsc, F, kvq_fmt_param_kind(F, 0), 3)
	if (b->rows == 3) {
#define FORMAT_CALL K_CALL3
		FORMAT_DISPATCH(b->kfmt)
#undef FORMAT_CALL
	} else {
#define FORMAT_CALL K_CALL
		FORMAT_DISPATCH(b->kfmt)
#undef FORMAT_CALL
	}
#undef K_CALL
#undef K_CALL3
}

static void v_accum4(const struct kvq_blk *b, const float *p, size_t ldp, float *accT)
{
#define V_CALL(F) v_accum4_impl(b, p, ldp, accT, F, kvq_fmt_param_kind(F, 1), b->B, 4)
#define V_CALL32(F) v_accum4_impl(b, p, ldp, accT, F, kvq_fmt_param_kind(F, 1), 32, 4)
#define V_CALL32R3(F) v_accum4_impl(b, p, ldp, accT, F, kvq_fmt_param_kind(F, 1), 32, 3)
	if (b->B == 32 && b->rows == 3) {
#define FORMAT_CALL V_CALL32R3
		FORMAT_DISPATCH(b->vfmt)
#undef FORMAT_CALL
	} else if (b->B == 32) {
#define FORMAT_CALL V_CALL32
		FORMAT_DISPATCH(b->vfmt)
#undef FORMAT_CALL
	} else {
#define FORMAT_CALL V_CALL
		FORMAT_DISPATCH(b->vfmt)
#undef FORMAT_CALL
	}
#undef V_CALL
#undef V_CALL32
#undef V_CALL32R3
}

static void v_row4(const float *row, const float *p, size_t ldp, uint32_t n, float *accT)
{
	__m128 p4 = _mm_setr_ps(p[0], p[ldp], p[2 * ldp], p[3 * ldp]);
	__m256 pv = _mm256_set_m128(p4, p4);

	for (uint32_t d = 0; d < n; d += 2) {
		__m256 v = _mm256_set_m128(_mm_set1_ps(row[d + 1]), _mm_set1_ps(row[d]));
		_mm256_storeu_ps(accT + d * 4, _mm256_fmadd_ps(pv, v, _mm256_loadu_ps(accT + d * 4)));
	}
}

static void scale4(float *accT, const float *al, uint32_t n)
{
	__m128 a4 = _mm_loadu_ps(al);
	__m256 av = _mm256_set_m128(a4, a4);

	for (uint32_t d = 0; d < n; d += 2)
		_mm256_storeu_ps(accT + d * 4, _mm256_mul_ps(_mm256_loadu_ps(accT + d * 4), av));
}

const struct kvq_cpu_ops kvq_cpu_ops_avx2 = {
	.name = "avx2",
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
