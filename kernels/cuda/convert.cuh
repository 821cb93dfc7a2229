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

/* (v & mask) | bits in one instruction (lop3; 0xea is the table of
 * (a & b) | c). */
__device__ __forceinline__ uint32_t lop_and_or(uint32_t v, uint32_t mask, uint32_t bits)
{
	uint32_t d;

	asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(v), "r"(mask), "r"(bits));
	return d;
}

/* a·b + c of pairs of the activation type (f16x2 or bf16x2), rounded once. */
template <int ACT> __device__ __forceinline__ uint32_t fma2(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t d;

	if constexpr (ACT == KVQ_DT_F16)
		asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	else
		asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
	return d;
}

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

/* int8 -> bf16 in pairs: with its code's byte in the low byte of a half,
 * 0x4300 | (c & 0x7f) is 128 + (c & 0x7f), and 0xc300 | (c & 0x80) is
 * -128, or -256 where c's sign bit is set: their sum is c, exact */
__device__ __forceinline__ uint32_t dec_sint_bf16(uint32_t y)
{
	return fma2<KVQ_DT_BF16>(lop_and_or(y, 0x007f007fu, 0x43004300u), 0x3f803f80u,
				 lop_and_or(y, 0x00800080u, 0xc300c300u));
}

template <> struct dec_cvt_code<KVQ_CODE_SINT, KVQ_DT_BF16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = dec_sint_bf16(__byte_perm(w, 0u, 0x4140));
		hi = dec_sint_bf16(__byte_perm(w, 0u, 0x4342));
	}
};

/* An f16 pair as a bf16 pair, through fp32; exact for the fp8 codes'
 * values (at most 4 significant bits), NaN kept. */
__device__ __forceinline__ uint32_t dec_f16x2_bf16(uint32_t h)
{
	return act<KVQ_DT_BF16>::pack(__half2float(__ushort_as_half((unsigned short)(h & 0xffffu))),
				      __half2float(__ushort_as_half((unsigned short)(h >> 16))));
}

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

/* e4m3 -> bf16: the same conversion to f16 pairs, then to bf16 */
template <> struct dec_cvt_code<KVQ_CODE_E4M3, KVQ_DT_BF16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		uint32_t a, b;
		dec_cvt_code<KVQ_CODE_E4M3, KVQ_DT_F16>::four(w, a, b);
		lo = dec_f16x2_bf16(a);
		hi = dec_f16x2_bf16(b);
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

template <> struct dec_cvt_code<KVQ_CODE_E5M2, KVQ_DT_BF16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = dec_f16x2_bf16(__byte_perm(w, 0u, 0x1404));
		hi = dec_f16x2_bf16(__byte_perm(w, 0u, 0x3424));
	}
};

} /* namespace kvq */

#endif
