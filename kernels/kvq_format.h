/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Format arithmetic shared by the CPU kernels, the CUDA kernels and libkvq:
 * half/bfloat16/FP8 conversion, scale and zero computation, code rounding,
 * bit packing and the order of codes inside a sealed slice.  Everything here
 * is integer or IEEE single-precision arithmetic without fused operations,
 * so host and device produce identical bytes.
 *
 * Rules (docs/DESIGN.md, "Formats"):
 *  - codes are round-to-nearest-even of (x - z) / s, with a true division;
 *  - scales are rounded up and zeros rounded down to FP16, so no code clamps
 *    for inputs within the FP16 range;
 *  - a scale that would exceed the FP16 maximum saturates at 65504 (and a zero
 *    below -65504 at -65504); codes of such inputs clamp.  Only BF16 inputs
 *    can reach this.
 *  - an all-zero range stores scale 0 and code 0.
 */
#ifndef KVQ_FORMAT_H
#define KVQ_FORMAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define KVQ_HD static __host__ __device__ __forceinline__
/* the format table's traits: constant expressions in kernels' templates */
#define KVQ_HD_CONST static __host__ __device__ constexpr
#else
#define KVQ_HD static inline
#define KVQ_HD_CONST static inline
#endif

/* Group of KIVI's V quantization (per token, along the head dimension). */
#define KVQ_KIVI_V_GROUP 32u

/*
 * The format table: one row per storage format of sealed K or V.  Every
 * list of formats (the enum, the names, the traits below, the kernels'
 * dispatch on CPU and GPU) is made from it.  The row order is the
 * numbering, part of the layout version: append, never reorder.
 *
 *   X(ID, NAME, BITS, CODE, K_PARAMS, V_PARAMS, K_GROUP, V_GROUP, SUBDIM)
 *
 *   ID        the format is KVQ_FMT_<ID>
 *   NAME      in policies, kvqctl, kvq-bench and the metrics
 *   BITS      per stored code (16, 8, 4 or 2)
 *   CODE      what a code is before its parameters: KVQ_CODE_<CODE>
 *   K_PARAMS, V_PARAMS   how K and V keep their parameters: KVQ_PARAM_<...>
 *   K_GROUP, V_GROUP     the group along the head dim (KVQ_PARAM_GROUP), else 0
 *   SUBDIM    head-dim elements one code stands for (a codebook format's
 *             subspace dimension, KVQ_PARAM_CODEBOOK), else 1
 *
 * pq2 and pq1 are product quantization (codebook.h): an 8-bit index into
 * 256 centroids per 4 (pq2: 2 bits per value) or 8 (pq1: 1 bit) values.
 *
 * KVQ_FORMATS_EXTRA, when a build defines it, appends rows (the test of
 * the table adds a throwaway format that way).
 */
#ifndef KVQ_FORMATS_EXTRA
#define KVQ_FORMATS_EXTRA(X)
#endif
#define KVQ_FORMATS(X)                                                                 \
	X(F16, "f16", 16, F16, NONE, NONE, 0, 0, 1)                                    \
	X(BF16, "bf16", 16, BF16, NONE, NONE, 0, 0, 1)                                 \
	X(INT8, "int8", 8, SINT, TOKEN, TOKEN, 0, 0, 1)                                \
	X(FP8, "fp8", 8, E4M3, TOKEN, TOKEN, 0, 0, 1)                                  \
	X(FP8E5M2, "fp8e5m2", 8, E5M2, TOKEN, TOKEN, 0, 0, 1)                          \
	X(INT4G32, "int4g32", 4, UINT, GROUP, GROUP, 32, 32, 1)                        \
	X(INT4G64, "int4g64", 4, UINT, GROUP, GROUP, 64, 64, 1)                        \
	X(INT4G128, "int4g128", 4, UINT, GROUP, GROUP, 128, 128, 1)                    \
	X(KIVI4, "kivi4", 4, UINT, CHANNEL, GROUP, 0, KVQ_KIVI_V_GROUP, 1)             \
	X(KIVI2, "kivi2", 2, UINT, CHANNEL, GROUP, 0, KVQ_KIVI_V_GROUP, 1)             \
	X(PQ2, "pq2", 8, INDEX, CODEBOOK, CODEBOOK, 0, 0, 4)                           \
	X(PQ1, "pq1", 8, INDEX, CODEBOOK, CODEBOOK, 0, 0, 8)                           \
	KVQ_FORMATS_EXTRA(X)

/* Other names a policy may use: X(NAME, ID). */
#define KVQ_FORMAT_ALIASES(X) X("fp8e4m3", FP8)

/* Storage formats of sealed K or V. */
enum kvq_fmt {
#define KVQ_X(ID, ...) KVQ_FMT_##ID,
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	KVQ_FMT_COUNT
};

/* Each row: codes of 16, 8, 4 or 2 bits (what the packing handles), groups
 * of a multiple of 16 elements, a subspace dimension of 1 or more. */
#ifdef __cplusplus
#define KVQ_STATIC_ASSERT static_assert
#else
#define KVQ_STATIC_ASSERT _Static_assert
#endif
#define KVQ_X(ID, NAME, BITS, CODE, KP, VP, KG, VG, SUBDIM)                                      \
	KVQ_STATIC_ASSERT((BITS) == 16 || (BITS) == 8 || (BITS) == 4 || (BITS) == 2,             \
			  "format " NAME ": codes of 16, 8, 4 or 2 bits");                       \
	KVQ_STATIC_ASSERT((KG) % 16 == 0 && (VG) % 16 == 0 && (SUBDIM) >= 1, "format " NAME ": groups");
KVQ_FORMATS(KVQ_X)
#undef KVQ_X

/* What a stored code is, before its scale and zero. */
enum kvq_code {
	KVQ_CODE_F16 = 0,   /* IEEE binary16: the value itself */
	KVQ_CODE_BF16,      /* bfloat16: the value itself */
	KVQ_CODE_SINT,      /* signed integer in [-(2^(bits-1) - 1), 2^(bits-1) - 1], symmetric scale */
	KVQ_CODE_E4M3,      /* FP8 E4M3 (OCP "FN"), symmetric scale */
	KVQ_CODE_E5M2,      /* FP8 E5M2, symmetric scale */
	KVQ_CODE_UINT,      /* unsigned integer in [0, 2^bits - 1], scale and zero */
	KVQ_CODE_INDEX,     /* an index into a codebook (product quantization) */
};

/* Activation dtypes (open window, kernel inputs and outputs). */
enum kvq_dtype {
	KVQ_DT_F16 = 0,
	KVQ_DT_BF16,
	KVQ_DT_F32,
};

/* How a format's parameters are organised. */
enum kvq_param_kind {
	KVQ_PARAM_NONE = 0,   /* f16, bf16: no scales */
	KVQ_PARAM_TOKEN,      /* one FP16 scale per token (per head) */
	KVQ_PARAM_GROUP,      /* (scale, zero) per token per group of the head dim */
	KVQ_PARAM_CHANNEL,    /* (scale, zero) per channel over the block's tokens */
	KVQ_PARAM_CODEBOOK,   /* none in the slice: the pool's codebooks, one per subspace */
};

/* ---------------------------------------------------------------- traits
 * Each a switch made from the table; f is a constant in the kernels, where
 * the switch folds away. */

/* Bits per stored code (0 for a number that is no format). */
KVQ_HD_CONST unsigned kvq_fmt_bits(int f)
{
	switch (f) {
#define KVQ_X(ID, NAME, BITS, ...) case KVQ_FMT_##ID: return BITS;
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	default: return 0;
	}
}

/* What a code is (enum kvq_code). */
KVQ_HD_CONST int kvq_fmt_code(int f)
{
	switch (f) {
#define KVQ_X(ID, NAME, BITS, CODE, ...) case KVQ_FMT_##ID: return KVQ_CODE_##CODE;
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	default: return KVQ_CODE_F16;
	}
}

/* Parameter organisation of a format used for K (is_v = 0) or V (is_v = 1):
 * KIVI quantizes K per channel and V per token in groups. */
KVQ_HD_CONST int kvq_fmt_param_kind(int f, int is_v)
{
	switch (f) {
#define KVQ_X(ID, NAME, BITS, CODE, KP, VP, ...) \
	case KVQ_FMT_##ID: return is_v ? KVQ_PARAM_##VP : KVQ_PARAM_##KP;
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	default: return KVQ_PARAM_NONE;
	}
}

/* Group size along the head dimension for KVQ_PARAM_GROUP, else 0. */
KVQ_HD_CONST unsigned kvq_fmt_group(int f, int is_v)
{
	switch (f) {
#define KVQ_X(ID, NAME, BITS, CODE, KP, VP, KG, VG, ...) \
	case KVQ_FMT_##ID: return is_v ? (VG) : (KG);
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	default: return 0;
	}
}

/* Head-dim elements one code stands for: 1, or a codebook format's
 * subspace dimension. */
KVQ_HD_CONST unsigned kvq_fmt_subdim(int f)
{
	switch (f) {
#define KVQ_X(ID, NAME, BITS, CODE, KP, VP, KG, VG, SUBDIM) case KVQ_FMT_##ID: return SUBDIM;
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
	default: return 1;
	}
}

/* The format whose codes are an activation dtype's values as they are: how
 * an open slot's rows (F16 or BF16) are read. */
KVQ_HD_CONST int kvq_act_fmt(int dt)
{
	return dt == KVQ_DT_BF16 ? KVQ_FMT_BF16 : KVQ_FMT_F16;
}

/* ------------------------------------------------------ bit reinterpretation */

KVQ_HD uint32_t kvq_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(x);
#else
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
#endif
}

KVQ_HD float kvq_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
#endif
}

KVQ_HD float kvq_rint(float x)
{
	return rintf(x);   /* round to nearest even on host (default mode) and device */
}

/* -------------------------------------------------------------------- FP16 */

enum kvq_round { KVQ_RNE = 0, KVQ_RUP, KVQ_RDOWN };

#define KVQ_F16_MAX 65504.0f

/* float -> IEEE binary16 bits with the given rounding (IEEE overflow rules:
 * a rounding away from the value's sign never produces an infinity). */
KVQ_HD uint16_t kvq_f16_from_f32_mode(float x, int mode)
{
	uint32_t b = kvq_f32_bits(x);
	uint32_t sgn = (b >> 16) & 0x8000u;
	uint32_t a = b & 0x7fffffffu;
	uint32_t h, rem, halfway;
	int neg = sgn != 0;

	if (a > 0x7f800000u)
		return (uint16_t)(sgn | 0x7e00u);
	if (a >= 0x47800000u) {   /* |x| >= 65536 (or inf): beyond every rounding */
		int to_inf = mode == KVQ_RNE || (mode == KVQ_RUP && !neg) || (mode == KVQ_RDOWN && neg);
		if (a == 0x7f800000u)
			to_inf = 1;
		return (uint16_t)(sgn | (to_inf ? 0x7c00u : 0x7bffu));
	}
	if (a >= 0x38800000u) {   /* normal half */
		h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu);
		rem = a & 0x1fffu;
		halfway = 0x1000u;
	} else {                  /* subnormal half or zero */
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
		uint32_t shift = 126u - (e ? e : 1u);
		if (shift > 31u) {
			h = 0;
			rem = m;
			halfway = 0xffffffffu;   /* far below half of the smallest step */
		} else {
			h = m >> shift;
			rem = m & ((1u << shift) - 1u);
			halfway = 1u << (shift - 1u);
		}
	}
	if (mode == KVQ_RNE) {
		if (rem > halfway || (rem == halfway && (h & 1u)))
			h++;
	} else if (rem != 0 && ((mode == KVQ_RUP && !neg) || (mode == KVQ_RDOWN && neg))) {
		h++;
	}
	return (uint16_t)(sgn | h);
}

/* On the GPU by the conversion instruction, which rounds every number as
 * kvq_f16_from_f32_mode does (tests/gpu/test_format_gpu compares them; a
 * tenth of the instructions: the rotated write converts every row it
 * rotates); a NaN keeps this header's quieting. */
KVQ_HD uint16_t kvq_f16_from_f32(float x)
{
#ifdef __CUDA_ARCH__
	if (x == x)
		return __half_as_ushort(__float2half_rn(x));
#endif
	return kvq_f16_from_f32_mode(x, KVQ_RNE);
}

KVQ_HD float kvq_f16_to_f32(uint16_t h)
{
	uint32_t sgn = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0x1f)
		return kvq_bits_f32(sgn | 0x7f800000u | (m << 13));
	if (e == 0) {   /* zero or subnormal: m * 2^-24, exact in float */
		float v = (float)m * 5.9604644775390625e-8f;
		return sgn ? -v : v;
	}
	return kvq_bits_f32(sgn | ((e + 112u) << 23) | (m << 13));
}

/* x rounded up (KVQ_RUP) or down (KVQ_RDOWN) to FP16.  On the GPU by the
 * conversion instruction, which rounds as kvq_f16_from_f32_mode does for
 * every number (tests/gpu/test_format_gpu compares them); a NaN keeps this
 * header's quieting. */
KVQ_HD uint16_t kvq_f16_directed(float x, int mode)
{
#ifdef __CUDA_ARCH__
	if (x == x)
		return __half_as_ushort(mode == KVQ_RUP ? __float2half_ru(x) : __float2half_rd(x));
#endif
	return kvq_f16_from_f32_mode(x, mode);
}

/* Scale: rounded up to FP16, saturating at the FP16 maximum. */
KVQ_HD uint16_t kvq_f16_scale(float s)
{
	uint16_t h = kvq_f16_directed(s, KVQ_RUP);
	return h == 0x7c00u ? (uint16_t)0x7bffu : h;
}

/* Zero: rounded down to FP16, saturating at the FP16 minimum. */
KVQ_HD uint16_t kvq_f16_zero(float z)
{
	uint16_t h = kvq_f16_directed(z, KVQ_RDOWN);
	if (h == 0xfc00u)
		return 0xfbffu;
	if (h == 0x7c00u)
		return 0x7bffu;
	return h;
}

/* ---------------------------------------------------------------- bfloat16 */

KVQ_HD uint16_t kvq_bf16_from_f32(float x)
{
	uint32_t b = kvq_f32_bits(x);

	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40u);
	b += 0x7fffu + ((b >> 16) & 1u);
	return (uint16_t)(b >> 16);
}

KVQ_HD float kvq_bf16_to_f32(uint16_t h)
{
	return kvq_bits_f32((uint32_t)h << 16);
}

/* --------------------------------------------------------------------- FP8 */

/*
 * Generic float -> FP8 (1 sign, EB exponent bits, MB mantissa bits), round to
 * nearest even, saturating: values beyond the largest finite code and
 * infinities become +-max_code, NaN becomes 0x7f (as cvt.rn.satfinite).
 */
KVQ_HD uint8_t kvq_fp8_encode_generic(float x, unsigned eb, unsigned mb, uint32_t max_code)
{
	uint32_t b = kvq_f32_bits(x);
	uint32_t sgn = (b >> 24) & 0x80u;
	uint32_t a = b & 0x7fffffffu;
	uint32_t bias = (1u << (eb - 1u)) - 1u;
	uint32_t code;

	if (a > 0x7f800000u)
		return 0x7f;
	/* smallest normal of the FP8 format: 2^(1 - bias) */
	if (a < ((128u - bias) << 23)) {
		/* subnormal range: multiples of 2^(1 - bias - mb); scaling by a
		 * power of two is exact, so one rint gives the correctly rounded code */
		float q = kvq_bits_f32(a) * kvq_bits_f32((127u + bias - 1u + mb) << 23);
		code = (uint32_t)kvq_rint(q);   /* 0 .. 2^mb (2^mb is the smallest normal) */
	} else {
		uint32_t shift = 23u - mb;
		uint32_t t = a - ((127u - bias) << 23);
		t += (1u << (shift - 1u)) - 1u + ((t >> shift) & 1u);
		code = t >> shift;
		if (code > max_code)
			code = max_code;
	}
	return (uint8_t)(sgn | code);
}

KVQ_HD uint8_t kvq_fp8_e4m3_enc(float x)
{
	/* max 448 = 0x7e; 0x7f is NaN */
	return kvq_fp8_encode_generic(x, 4, 3, 0x7eu);
}

KVQ_HD uint8_t kvq_fp8_e5m2_enc(float x)
{
	/* max 57344 = 0x7b; 0x7c is inf, above it NaN */
	return kvq_fp8_encode_generic(x, 5, 2, 0x7bu);
}

KVQ_HD float kvq_fp8_e4m3_dec(uint8_t c)
{
	/* sign | exponent+mantissa << 20, times 2^(127 - 7): exact for normals
	 * and subnormals alike */
	uint32_t mag = c & 0x7fu;
	if (mag == 0x7fu)
		return kvq_bits_f32(0x7fc00000u | ((uint32_t)(c & 0x80u) << 24));
	return kvq_bits_f32(((uint32_t)(c & 0x80u) << 24) | (mag << 20)) * 1.329227995784916e+36f;
}

KVQ_HD float kvq_fp8_e5m2_dec(uint8_t c)
{
	return kvq_f16_to_f32((uint16_t)((uint16_t)c << 8));   /* E5M2 is FP16's top byte */
}

/* ------------------------------------------------------- scales and codes */

#define KVQ_FP8_E4M3_MAX 448.0f
#define KVQ_FP8_E5M2_MAX 57344.0f

/* Largest magnitude a format's codes represent before scaling. */
KVQ_HD float kvq_fmt_qmax(int f)
{
	switch (kvq_fmt_code(f)) {
	case KVQ_CODE_SINT: return (float)((1u << (kvq_fmt_bits(f) - 1u)) - 1u);   /* int8: 127 */
	case KVQ_CODE_E4M3: return KVQ_FP8_E4M3_MAX;
	case KVQ_CODE_E5M2: return KVQ_FP8_E5M2_MAX;
	default: return (float)((1u << kvq_fmt_bits(f)) - 1u);
	}
}

/* Symmetric scale for a range with maximum magnitude amax. */
KVQ_HD uint16_t kvq_sym_scale(float amax, float qmax)
{
	return kvq_f16_scale(amax / qmax);
}

/* Asymmetric (scale, zero) for [mn, mx]: zero rounded down, then the scale
 * from the rounded zero, rounded up.  A zero bound is taken as +0 (x + 0 is
 * +0 for both zeros): which zero a min or max over +0 and -0 returns depends
 * on the order of the reduction, and the CPU's loop and the GPU's lanes
 * reduce in different orders. */
KVQ_HD void kvq_asym_params(float mn, float mx, float qmax, uint16_t *ret_s, uint16_t *ret_z)
{
	mn += 0.0f;
	mx += 0.0f;
	uint16_t z = kvq_f16_zero(mn);
	*ret_z = z;
	*ret_s = kvq_f16_scale((mx - kvq_f16_to_f32(z)) / qmax);
}

/* Code of x under a symmetric per-token scale (s as float, from FP16). */
KVQ_HD uint32_t kvq_code_sym(int f, float x, float s)
{
	float q;

	if (!(s > 0.0f))
		return 0;
	q = x / s;
	switch (kvq_fmt_code(f)) {
	case KVQ_CODE_E4M3: return kvq_fp8_e4m3_enc(q);
	case KVQ_CODE_E5M2: return kvq_fp8_e5m2_enc(q);
	default:   /* KVQ_CODE_SINT of 8 bits, the only one in the table */
		q = kvq_rint(q);
		q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : (q == q ? q : 0.0f));   /* NaN -> 0 */
		return (uint32_t)(uint8_t)(int8_t)(int)q;
	}
}

/* Unsigned code of x under (s, z) with qmax = 2^bits - 1. */
KVQ_HD uint32_t kvq_code_asym(float x, float s, float z, float qmax)
{
	float q;

	if (!(s > 0.0f))
		return 0;
	q = kvq_rint((x - z) / s);
	q = q > qmax ? qmax : (q >= 0.0f ? q : 0.0f);   /* NaN -> 0 */
	return (uint32_t)q;
}

/* Value of a symmetric code (scale not applied). */
KVQ_HD float kvq_decode_sym(int f, uint32_t c)
{
	switch (kvq_fmt_code(f)) {
	case KVQ_CODE_E4M3: return kvq_fp8_e4m3_dec((uint8_t)c);
	case KVQ_CODE_E5M2: return kvq_fp8_e5m2_dec((uint8_t)c);
	default: return (float)(int8_t)(uint8_t)c;
	}
}

/* ------------------------------------------------ order inside a sealed slice
 *
 * A sealed head slice (one layer, one KV head, one block of B tokens) holds:
 *   K codes   B x D, token-major: element (t, d) at t * D + d
 *   K params  PARAM_TOKEN: fp16 s[t]; PARAM_GROUP: {s, z}[t][g];
 *             PARAM_CHANNEL: {s, z}[d]
 *   V codes   D x B, transposed: element (t, d) at d * B + t
 *   V params  PARAM_TOKEN: fp16 s[t]; PARAM_GROUP: {s, z}[g][t]
 * Elements of 4 and 2 bits are packed little-end first within a byte
 * (element i in bits (i % per_byte) * bits).  F16/BF16 codes are 16-bit words.
 * A codebook format (SUBDIM d > 1) stores one code per subvector, as if the
 * head dim were M = D / d: K codes B x M (code of subspace m of token t at
 * t * M + m), V codes M x B (at m * B + t), no parameters; its centroids
 * are the pool's (codebook.h).
 * Each array starts 16-byte aligned (layout.c).  Changing any of this changes
 * KVQ_LAYOUT_VERSION.  The CPU vector path (kernels/cpu/ops_avx2.c) reads a
 * row as consecutive elements from kvq_k_elem(t, 0) (K of token t) or
 * kvq_v_elem(0, d) (V of dimension d), 16 at a time: a reorder that breaks
 * that must change its dec16() too (test_attention compares both paths).
 */
/* 2: the codebook formats and the pool's codebook region (layout.h).
 * 3: the sink slices after each layer's open slices (layout.h). */
#define KVQ_LAYOUT_VERSION 3u

KVQ_HD uint32_t kvq_k_elem(uint32_t t, uint32_t d, uint32_t B, uint32_t D)
{
	(void)B;
	return t * D + d;
}

KVQ_HD uint32_t kvq_v_elem(uint32_t t, uint32_t d, uint32_t B, uint32_t D)
{
	(void)D;
	return d * B + t;
}

/* Index (in parameter entries: fp16 words for PARAM_TOKEN, {s, z} pairs
 * otherwise) of the parameters that apply to element (t, d). */
KVQ_HD uint32_t kvq_param_index(int kind, unsigned group, int is_v, uint32_t t, uint32_t d,
				uint32_t B, uint32_t D)
{
	switch (kind) {
	case KVQ_PARAM_TOKEN: return t;
	case KVQ_PARAM_CHANNEL: return d;
	case KVQ_PARAM_GROUP:
		return is_v ? (d / group) * B + t : t * (D / group) + d / group;
	default: return 0;
	}
}

/* Number of parameter entries of one head slice's K or V. */
KVQ_HD uint32_t kvq_param_count(int kind, unsigned group, uint32_t B, uint32_t D)
{
	switch (kind) {
	case KVQ_PARAM_TOKEN: return B;
	case KVQ_PARAM_CHANNEL: return D;
	case KVQ_PARAM_GROUP: return B * (D / group);
	default: return 0;
	}
}

/* Bytes of one parameter entry. */
KVQ_HD uint32_t kvq_param_entry_bytes(int kind)
{
	return kind == KVQ_PARAM_TOKEN ? 2u : (kind == KVQ_PARAM_GROUP || kind == KVQ_PARAM_CHANNEL ? 4u : 0u);
}

/* Read element i of a packed code array. */
KVQ_HD uint32_t kvq_code_get(const uint8_t *codes, uint32_t i, unsigned bits)
{
	switch (bits) {
	case 16: return (uint32_t)codes[2 * i] | (uint32_t)codes[2 * i + 1] << 8;
	case 8: return codes[i];
	case 4: return (codes[i >> 1] >> ((i & 1u) * 4u)) & 0xfu;
	case 2: return (codes[i >> 2] >> ((i & 3u) * 2u)) & 0x3u;
	default: return 0;
	}
}

/* Write element i of a packed code array (the other elements of its byte are kept). */
KVQ_HD void kvq_code_put(uint8_t *codes, uint32_t i, unsigned bits, uint32_t c)
{
	switch (bits) {
	case 16:
		codes[2 * i] = (uint8_t)c;
		codes[2 * i + 1] = (uint8_t)(c >> 8);
		break;
	case 8:
		codes[i] = (uint8_t)c;
		break;
	case 4: {
		unsigned sh = (i & 1u) * 4u;
		codes[i >> 1] = (uint8_t)((codes[i >> 1] & ~(0xfu << sh)) | ((c & 0xfu) << sh));
		break;
	}
	case 2: {
		unsigned sh = (i & 3u) * 2u;
		codes[i >> 2] = (uint8_t)((codes[i >> 2] & ~(0x3u << sh)) | ((c & 0x3u) << sh));
		break;
	}
	default:
		break;
	}
}

/* Dequantized value of a code given its parameter words (s, z as FP16 bits;
 * z unused for symmetric kinds). */
KVQ_HD float kvq_dequant(int f, int kind, uint32_t c, uint16_t s, uint16_t z)
{
	switch (kind) {
	case KVQ_PARAM_NONE:
		return kvq_fmt_code(f) == KVQ_CODE_BF16 ? kvq_bf16_to_f32((uint16_t)c) : kvq_f16_to_f32((uint16_t)c);
	case KVQ_PARAM_TOKEN:
		return kvq_decode_sym(f, c) * kvq_f16_to_f32(s);
	default:
		return (float)c * kvq_f16_to_f32(s) + kvq_f16_to_f32(z);
	}
}

/* Product quantization: the code of subvector x[0 .. d-1] is the index of
 * the nearest of 256 centroids cb[c * d + j] (FP16 bits), by squared
 * distance summed over j in order without fused operations (so host and
 * device agree), the lowest index among equals; a NaN distance never wins
 * (all-NaN input: code 0). */
KVQ_HD uint32_t kvq_pq_encode(const float *x, const uint16_t *cb, unsigned d)
{
	float best = INFINITY;
	uint32_t code = 0;

	for (uint32_t c = 0; c < 256u; c++) {
		float dist = 0.0f;
		for (unsigned j = 0; j < d; j++) {
#ifdef __CUDA_ARCH__
			float e = __fsub_rn(x[j], kvq_f16_to_f32(cb[c * d + j]));
			dist = __fadd_rn(dist, __fmul_rn(e, e));
#else
			float e = x[j] - kvq_f16_to_f32(cb[c * d + j]);
			dist = dist + e * e;   /* the host builds with -ffp-contract=off */
#endif
		}
		if (dist < best) {
			best = dist;
			code = c;
		}
	}
	return code;
}

/* 1/sqrt(n) rounded to float, for n = 16 .. 256 (kvq_rotate's last step). */
KVQ_HD float kvq_rot_norm(unsigned n)
{
	return n == 16 ? 0.25f : n == 32 ? 0.17677669529663688f : n == 64 ? 0.125f
	       : n == 128 ? 0.088388347648318440f : 0.0625f;
}

/* Rotation (a policy's "+rot", policy.h): the normalised Walsh-Hadamard
 * transform of each block of n elements of x[0 .. D - 1] (n = 16 .. 256, a
 * power of two dividing D: kvq_rot_block), in place: butterflies of
 * stride 1, 2, 4, ..., then a product by 1/sqrt(n) rounded to float, each
 * step rounded alone (no fused operation), so that host and device agree
 * bit for bit.  Its own inverse, to rounding. */
KVQ_HD void kvq_rotate(float *x, unsigned D, unsigned n)
{
	const float norm = kvq_rot_norm(n);

	for (unsigned b0 = 0; b0 < D; b0 += n) {
		float *p = x + b0;
		for (unsigned len = 1; len < n; len <<= 1)
			for (unsigned i = 0; i < n; i += 2 * len)
				for (unsigned j = i; j < i + len; j++) {
					const float u = p[j], v = p[j + len];
#ifdef __CUDA_ARCH__
					p[j] = __fadd_rn(u, v);
					p[j + len] = __fsub_rn(u, v);
#else
					p[j] = u + v;
					p[j + len] = u - v;
#endif
				}
		for (unsigned i = 0; i < n; i++)
#ifdef __CUDA_ARCH__
			p[i] = __fmul_rn(p[i], norm);
#else
			p[i] = p[i] * norm;
#endif
	}
}

/* Activation element -> float. */
KVQ_HD float kvq_act_to_f32(int dt, const void *p, uint32_t i)
{
	switch (dt) {
	case KVQ_DT_F16: return kvq_f16_to_f32(((const uint16_t *)p)[i]);
	case KVQ_DT_BF16: return kvq_bf16_to_f32(((const uint16_t *)p)[i]);
	default: return ((const float *)p)[i];
	}
}

KVQ_HD uint32_t kvq_dtype_bytes(int dt)
{
	return dt == KVQ_DT_F32 ? 4u : 2u;
}

#endif /* KVQ_FORMAT_H */
