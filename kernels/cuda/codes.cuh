/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The codes of one element in the GPU seals (seal_staged.cuh, seal_tiles.cuh), as
 * kvq_format.h makes them on the CPU, bit for bit: an F16/BF16 code
 * (code16), an integer code by the reciprocal of its scale where that
 * provably rounds as the true division (rint_by_recip, recip_in_range),
 * FP8 codes by the conversion instruction (fp8_codes).
 */
#ifndef KVQ_CUDA_CODES_CUH
#define KVQ_CUDA_CODES_CUH

#include <cuda_fp8.h>

#include "common.cuh"

namespace kvq {

/* The F16 or BF16 code of an activation word: its bits when the types agree
 * (a NaN quieted as kvq_f16_from_f32 and kvq_bf16_from_f32 do), else the
 * conversion. */
template <int F> __device__ __forceinline__ uint32_t code16(int act, uint16_t x)
{
	if (fmt<F>::code == KVQ_CODE_F16 && act == KVQ_DT_F16)
		return (x & 0x7fffu) > 0x7c00u ? (x & 0x8000u) | 0x7e00u : x;
	if (fmt<F>::code == KVQ_CODE_BF16 && act == KVQ_DT_BF16)
		return (x & 0x7fffu) > 0x7f80u ? x | 0x40u : x;
	/* an FP16 word by the conversion instruction, exact, but for a NaN,
	 * whose payload kvq_f16_to_f32 keeps (a BF16 code keeps part of it) */
	const float f = act == KVQ_DT_BF16	   ? kvq_bf16_to_f32(x)
			: (x & 0x7fffu) > 0x7c00u ? kvq_f16_to_f32(x)
						  : __half2float(__ushort_as_half(x));
	return fmt<F>::code == KVQ_CODE_BF16 ? kvq_bf16_from_f32(f) : kvq_f16_from_f32(f);
}

/* Formats whose codes are a quotient rounded to an integer: they take the
 * reciprocal of the scale (FP8 rounds to its own grid: a true division). */
template <int F> struct recip {
	static constexpr bool ok = fmt<F>::code == KVQ_CODE_SINT || fmt<F>::code == KVQ_CODE_UINT;
};

/* rint(y / s) from r, 1 / s rounded, for a code of at most qmax: y * r,
 * exact, lies within |y / s| 2^-24 of y / s (r is within 2^-24 relative of
 * 1 / s), and the CPU's quotient, rounded, as far again; with |y / s| <=
 * qmax (1 + 2^-22), within qmax 2^-22 of each other.  So both round to the
 * same integer unless y * r lies that close to a half-integer: then, and
 * for a NaN or an infinity, false (recip_sure(qmax) is the largest distance
 * from the integer that is sure, the rounding of the distance, 2^-25,
 * taken off too), and the caller takes the reference.  The integer comes
 * from one fma, y * r + 1.5 * 2^23, which rounds y * r to an integer as
 * rintf does (to nearest, ties to even, while |y * r| < 2^22) and leaves it
 * in the low bits of the sum's encoding, two's complement when negative,
 * biased by the encoding of 1.5 * 2^23 (CODE_BIAS; its low 22 bits are 0):
 * *ret_bits.  The distance is a second fma, y * r less that integer,
 * rounded once.  No clamp: the parameters give every entry whose codes
 * could leave [-127, 127] (sym) or [0, qmax] (asym) a NaN reciprocal, which
 * fails here; for the others |y| / s <= qmax (1 + 2^-22) (the scale rounded
 * up from the range).  (r = 0 for a zero scale gives code 0, as there.)
 * The band is 2 qmax 2^-22 wide: one element in 16,500 at int8's 127, in
 * 140,000 at 4 bits' 15. */
#define CODE_BIAS 0x4b400000u

__host__ __device__ constexpr float recip_sure(float qmax)
{
	return 0.5f - qmax * 0x1p-22f - 0x1p-25f;   /* exact: multiples of 2^-25 */
}

__device__ __forceinline__ bool rint_by_recip(float y, float r, float sure, uint32_t *ret_bits)
{
	const float M = 0x1.8p23f, t = __fmaf_rn(y, r, M);

	*ret_bits = __float_as_uint(t);
	return fabsf(__fmaf_rn(y, r, -__fsub_rn(t, M))) <= sure;
}

/* A scale as the codes use it: 1 / s (0 for a scale that is not positive,
 * which kvq_code_sym/asym turn into code 0) or s itself. */
template <int F> __device__ __forceinline__ float scale_f(uint16_t h)
{
	const float s = kvq_f16_to_f32(h);

	return recip<F>::ok ? (s > 0.0f ? 1.0f / s : 0.0f) : s;
}

/* Whether codes by the reciprocal stay in range for an entry (see
 * rint_by_recip): its scale did not saturate, its zero is at or below its
 * minimum, its range is not empty.  Else its reciprocal is NaN and its codes
 * are the reference's. */
__device__ __forceinline__ bool recip_in_range(int kind, float2 range, uint16_t s, uint16_t z)
{
	if (s == 0x7bffu)
		return false;
	return kind == KVQ_PARAM_TOKEN || (z != 0xfbffu && range.x <= range.y);
}

/* FP8 codes by the conversion instruction (sm_89 on), else kvq_code_sym. */
template <int F> struct fp8_hw {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	static constexpr bool ok = fmt<F>::code == KVQ_CODE_E4M3 || fmt<F>::code == KVQ_CODE_E5M2;
#else
	static constexpr bool ok = false;
#endif
};

/* kvq_code_sym's FP8 codes of eight elements, s[e].x their scales: the
 * quotient (the same true division), then cvt.rn.satfinite, which rounds
 * to nearest even, subnormals included, and saturates at the largest
 * finite value as kvq_fp8_encode_generic does; a NaN is 0x7f there, of
 * either sign, and a scale that is not positive gives 0. */
template <int F> __device__ __forceinline__ void fp8_codes(const float f[8], const float2 s[8], uint32_t code[8])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	constexpr __nv_fp8_interpretation_t kind = fmt<F>::code == KVQ_CODE_E4M3 ? __NV_E4M3 : __NV_E5M2;
#pragma unroll
	for (unsigned e = 0; e < 8; e += 2) {
		const float q0 = s[e].x > 0.0f ? __fdiv_rn(f[e], s[e].x) : 0.0f;
		const float q1 = s[e + 1].x > 0.0f ? __fdiv_rn(f[e + 1], s[e + 1].x) : 0.0f;
		const uint32_t two = __nv_cvt_float2_to_fp8x2(make_float2(q0, q1), __NV_SATFINITE, kind);
		code[e] = q0 != q0 ? 0x7fu : two & 0xffu;
		code[e + 1] = q1 != q1 ? 0x7fu : two >> 8;
	}
#endif
}

} /* namespace kvq */

#endif
