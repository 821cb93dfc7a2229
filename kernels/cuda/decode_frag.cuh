/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode_kernel's register layout: 4- and 2-bit codes unpacked to exact
 * FP16/BF16 pairs with the 0x6400 / 0x4300 magic (dec_magic), the order
 * of K's head dims in a k-step (dec_kdim) and of a chunk's tokens in the
 * m-rows (dec_lay), and the A fragments of K and V built from a chunk's raw
 * words (decode.cuh explains the orders).
 */
#ifndef KVQ_CUDA_DECODE_FRAG_CUH
#define KVQ_CUDA_DECODE_FRAG_CUH

#include "convert.cuh"

namespace kvq {

/* Codes of `bits` bits at bit `pos` of each half of v to an exact pair of
 * the activation type, in two instructions: one lop3 puts them in the
 * mantissa of the magic M (FP16 0x6400 = 1024, BF16 0x4300 = 128; they must
 * lie inside it: pos + bits <= 10, or 7), giving M + c·2^pos, and one fma
 * by 2^-pos less M·2^-pos, whose exact result c is the pair.  pos is a
 * constant once the callers' loops are unrolled. */
template <int ACT> __device__ __forceinline__ uint32_t dec_magic(uint32_t v, uint32_t bits, uint32_t pos)
{
	const bool f16 = ACT == KVQ_DT_F16;
	/* exponent fields of 1 and of M; 2^-pos and -M·2^-pos as pairs */
	const uint32_t one = f16 ? 15u : 127u, mexp = f16 ? 25u : 134u, sh = f16 ? 10u : 7u;
	const uint32_t mask = ((1u << bits) - 1u) << pos, magic = f16 ? 0x6400u : 0x4300u;
	const uint32_t scale = (one - pos) << sh, bias = 0x8000u | (mexp - pos) << sh;

	return fma2<ACT>(lop_and_or(v, mask | mask << 16, magic | magic << 16), scale | scale << 16, bias | bias << 16);
}

/* 4-bit codes to pairs: x_i = (code i, code i + 4) of a word of 8 codes
 * (i < 4), exact.  FP16 takes nibbles 0 and 1 in place and 2 and 3 from
 * w >> 8 (one shift a word); BF16's 7-bit mantissa takes a nibble at bit 0
 * only. */
template <int ACT> __device__ __forceinline__ uint32_t dec_nib(uint32_t w, int i)
{
	if constexpr (ACT == KVQ_DT_F16)
		return dec_magic<ACT>(i >= 2 ? w >> 8 : w, 4, 4 * (i & 1));
	else
		return dec_magic<ACT>(w >> (4 * i), 4, 0);
}

/* 2-bit codes to pairs: x_i = (code i, code i + H) for the crumbs of w
 * (H = 8: a word of 16 codes; H = 4: 8 codes in bytes 0 and 2).  FP16
 * takes crumbs 0 .. 4 in place and 5 .. 7 from w >> 8; BF16 crumbs 0 .. 2
 * in place, 3 .. 5 from w >> 6 and 6, 7 from w >> 12. */
template <int ACT> __device__ __forceinline__ uint32_t dec_crumb(uint32_t w, int i)
{
	if constexpr (ACT == KVQ_DT_F16)
		return i < 5 ? dec_magic<ACT>(w, 2, 2 * i) : dec_magic<ACT>(w >> 8, 2, 2 * (i - 4));
	else
		return dec_magic<ACT>(w >> (6 * (i / 3)), 2, 2 * (i % 3));
}

/* Where K's k-step k, slot e (fa[0] low/high, fa[2] low/high) sits among the
 * thread's dims of a span, by K code width P: 16 and 8 in order; 4 and 2 as
 * their words unpack (dec_nib, dec_crumb). */
template <int P> __host__ __device__ constexpr int dec_kdim(int k, int e)
{
	return P == 4 ? 8 * (k >> 1) + 2 * (k & 1) + (e >> 1) + 4 * (e & 1)
	     : P == 2 ? 16 * (k >> 2) + 2 * (k & 3) + (e >> 1) + 8 * (e & 1)
		      : 4 * k + e;
}

/* Pairs (k-step k) of 16-bit values kept in dim order, put in the order P. */
template <int P, int N>
__device__ __forceinline__ void dec_perm16(const uint32_t (&w)[N], int k, uint32_t &lo, uint32_t &hi)
{
	if constexpr (P == 4) {
		const uint32_t a = w[(k >> 1) * 4 + (k & 1)], b = w[(k >> 1) * 4 + (k & 1) + 2];
		lo = __byte_perm(a, b, 0x5410);
		hi = __byte_perm(a, b, 0x7632);
	} else if constexpr (P == 2) {
		const uint32_t a = w[(k >> 2) * 8 + (k & 3)], b = w[(k >> 2) * 8 + (k & 3) + 4];
		lo = __byte_perm(a, b, 0x5410);
		hi = __byte_perm(a, b, 0x7632);
	} else {
		lo = w[2 * k];
		hi = w[2 * k + 1];
	}
}

/* The layout one (K, V) pair imposes on a chunk, sealed or open. */
template <int KF, int VF, int D> struct dec_lay {
	static constexpr int KBITS = fmt<KF>::bits, VBITS = fmt<VF>::bits;
	static constexpr bool VNIB = VBITS < 8;
	static constexpr int KP = KBITS < 8 ? KBITS : 16;
	static constexpr int KSPAN = fmt<KF>::kind_k == KVQ_PARAM_GROUP && fmt<KF>::group_k < D ? fmt<KF>::group_k : D;
	static constexpr int KPARTS = D / KSPAN;
	static constexpr int VGS = fmt<VF>::kind_v == KVQ_PARAM_GROUP && fmt<VF>::group_v < D ? fmt<VF>::group_v : D;
	static constexpr int NGV = D / VGS;
	/* token (within the 8 of m-row pair group lane / 8) of m-tile s, upper half hi, m-row parity te */
	static __device__ __forceinline__ uint32_t tok(int s, int hi, uint32_t te)
	{
		return VNIB ? 2 * s + hi + 4 * te : 4 * s + 2 * hi + te;
	}
	/* tokens (a, b) of V word j of a thread's 8 (16-bit codes) */
	static __host__ __device__ constexpr int vt(int j, int b) { return VNIB ? j + 4 * b : 2 * j + b; }
};

/* The A fragment of one k-step of K (rows r0, r1: m-row qn and qn + 8). */
template <int F, int ACT, int P, int NW>
__device__ __forceinline__ void dec_kfrag(uint32_t fa[4], const uint32_t (&r0)[NW], const uint32_t (&r1)[NW], int k)
{
	if constexpr (fmt<F>::bits == 16) {
		dec_perm16<P>(r0, k, fa[0], fa[2]);
		dec_perm16<P>(r1, k, fa[1], fa[3]);
		if constexpr (!((fmt<F>::code == KVQ_CODE_F16 && ACT == KVQ_DT_F16) ||
				(fmt<F>::code == KVQ_CODE_BF16 && ACT == KVQ_DT_BF16))) {
#pragma unroll
			for (int i = 0; i < 4; i++)
				fa[i] = dec_cvt<F, ACT>::two(fa[i]);
		}
	} else if constexpr (fmt<F>::bits == 8) {
		dec_cvt<F, ACT>::four(r0[k], fa[0], fa[2]);
		dec_cvt<F, ACT>::four(r1[k], fa[1], fa[3]);
	} else if constexpr (fmt<F>::bits == 4) {
		fa[0] = dec_nib<ACT>(r0[k >> 1], 2 * (k & 1));
		fa[2] = dec_nib<ACT>(r0[k >> 1], 2 * (k & 1) + 1);
		fa[1] = dec_nib<ACT>(r1[k >> 1], 2 * (k & 1));
		fa[3] = dec_nib<ACT>(r1[k >> 1], 2 * (k & 1) + 1);
	} else {
		fa[0] = dec_crumb<ACT>(r0[k >> 2], 2 * (k & 3));
		fa[2] = dec_crumb<ACT>(r0[k >> 2], 2 * (k & 3) + 1);
		fa[1] = dec_crumb<ACT>(r1[k >> 2], 2 * (k & 3));
		fa[3] = dec_crumb<ACT>(r1[k >> 2], 2 * (k & 3) + 1);
	}
}

/* The A fragment of k-step s of V (rows: dims qn and qn + 8 of an m-tile). */
template <int F, int ACT, int NW>
__device__ __forceinline__ void dec_vfrag(uint32_t fa[4], const uint32_t (&r0)[NW], const uint32_t (&r1)[NW], int s)
{
	if constexpr (fmt<F>::bits == 16) {
		fa[0] = dec_cvt<F, ACT>::two(r0[2 * s]);
		fa[2] = dec_cvt<F, ACT>::two(r0[2 * s + 1]);
		fa[1] = dec_cvt<F, ACT>::two(r1[2 * s]);
		fa[3] = dec_cvt<F, ACT>::two(r1[2 * s + 1]);
	} else if constexpr (fmt<F>::bits == 8) {
		dec_cvt<F, ACT>::four(r0[s], fa[0], fa[2]);
		dec_cvt<F, ACT>::four(r1[s], fa[1], fa[3]);
	} else if constexpr (fmt<F>::bits == 4) {
		fa[0] = dec_nib<ACT>(r0[0], 2 * s);
		fa[2] = dec_nib<ACT>(r0[0], 2 * s + 1);
		fa[1] = dec_nib<ACT>(r1[0], 2 * s);
		fa[3] = dec_nib<ACT>(r1[0], 2 * s + 1);
	} else {
		/* 16 bits of 8 codes: bytes 0 and 2 (dec_load), pairs (t, t + 4) */
		fa[0] = dec_crumb<ACT>(r0[0], 2 * s);
		fa[2] = dec_crumb<ACT>(r0[0], 2 * s + 1);
		fa[1] = dec_crumb<ACT>(r1[0], 2 * s);
		fa[3] = dec_crumb<ACT>(r1[0], 2 * s + 1);
	}
}

/* Half i of an array of words (FP16 parameters: s, or {s, z} pairs). */
template <int N> __device__ __forceinline__ float dec_half(const uint32_t (&w)[N], int i)
{
	const uint32_t x = w[i >> 1];
	return __half2float(__ushort_as_half((unsigned short)(i & 1 ? x >> 16 : x & 0xffffu)));
}

} /* namespace kvq */

#endif
