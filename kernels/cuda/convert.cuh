/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Codes to exact FP16/BF16 pairs in registers, by what the codes are (enum
 * kvq_code), for the kernels that convert codes before an MMA (decode,
 * prefill).  Every conversion here is exact: the values a code stands for
 * before its scale and zero fit the activation type.
 */
#ifndef KVQ_CUDA_CONVERT_CUH
#define KVQ_CUDA_CONVERT_CUH

#include "common.cuh"

namespace kvq {

/* Codes to exact activation-type pairs, by what the codes are (enum
 * kvq_code): four() turns a word of four 8-bit codes into pairs (c0, c1)
 * and (c2, c3); two() a word of two 16-bit codes into one pair.  The
 * generic form goes through fp32; the common ones are specialised to a few
 * logic ops.  dec_cvt<F, ACT> is the one of format F. */
template <int C, int ACT> struct dec_cvt_code {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = act<ACT>::pack(code_raw<C>::raw(w & 0xffu), code_raw<C>::raw((w >> 8) & 0xffu));
		hi = act<ACT>::pack(code_raw<C>::raw((w >> 16) & 0xffu), code_raw<C>::raw(w >> 24));
	}
	static __device__ __forceinline__ uint32_t two(uint32_t w)
	{
		return act<ACT>::pack(code_raw<C>::raw(w & 0xffffu), code_raw<C>::raw(w >> 16));
	}
};
template <int F, int ACT> using dec_cvt = dec_cvt_code<kvq_fmt_code(F), ACT>;

template <> struct dec_cvt_code<KVQ_CODE_F16, KVQ_DT_F16> {
	static __device__ __forceinline__ uint32_t two(uint32_t w) { return w; }
};
template <> struct dec_cvt_code<KVQ_CODE_BF16, KVQ_DT_BF16> {
	static __device__ __forceinline__ uint32_t two(uint32_t w) { return w; }
};

/* int8 -> f16: 0x6400 | (c ^ 0x80) is 1024 + c + 128, exact; one subtraction per pair */
template <> struct dec_cvt_code<KVQ_CODE_SINT, KVQ_DT_F16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		const uint32_t x = w ^ 0x80808080u, bias = 0x64806480u;   /* 1152 in each half */
		const uint32_t a = __byte_perm(x, 0x64646464u, 0x4140), b = __byte_perm(x, 0x64646464u, 0x4342);
		asm("sub.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(a), "r"(bias));
		asm("sub.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(b), "r"(bias));
	}
};

/* int8 -> bf16: 2^23 + 128 + c as fp32 (exact), less 2^23 + 128, packed */
template <> struct dec_cvt_code<KVQ_CODE_SINT, KVQ_DT_BF16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		const uint32_t x = w ^ 0x80808080u;
		const float f0 = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7540)) - 8388736.0f;
		const float f1 = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7541)) - 8388736.0f;
		const float f2 = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7542)) - 8388736.0f;
		const float f3 = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7543)) - 8388736.0f;
		lo = act<KVQ_DT_BF16>::pack(f0, f1);
		hi = act<KVQ_DT_BF16>::pack(f2, f3);
	}
};

#if __CUDA_ARCH__ >= 890
/* e4m3 -> f16: the hardware conversion, two codes per instruction */
template <> struct dec_cvt_code<KVQ_CODE_E4M3, KVQ_DT_F16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
		const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
		lo = (uint32_t)a.x | (uint32_t)a.y << 16;
		hi = (uint32_t)b.x | (uint32_t)b.y << 16;
	}
};
#endif

/* e5m2 is the top byte of an f16 */
template <> struct dec_cvt_code<KVQ_CODE_E5M2, KVQ_DT_F16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = __byte_perm(w, 0u, 0x1404);
		hi = __byte_perm(w, 0u, 0x3424);
	}
};

} /* namespace kvq */

#endif
