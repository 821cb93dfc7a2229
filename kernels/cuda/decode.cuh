/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decode attention: at most 8 query rows per KV head (one MMA n-tile), every
 * stored format, blocks of a multiple of 32 tokens.  dispatch.cu picks it
 * when all of that holds and the format's groups fit the head dim (more
 * rows go to prefill_kernel, other blocks to attn_kernel).
 *
 * One CTA per (KV split, KV head, sequence), DEC_WARPS warps.  Each warp
 * streams its own 32-token chunks (no CTA-wide barrier until the end) with
 * its own online softmax, and the warps are merged through shared memory at
 * the end (the split's result, or its partial for merge_kernel).
 *
 * Codes go from global memory straight into registers (8-bit K and V at
 * D = 64: through two stages of shared memory per warp, dec_tune), are converted to
 * exact FP16/BF16 pairs in registers (4- and 2-bit codes with the 0x6400 /
 * 0x4300 magic: one mask-or and one f16x2 subtract or fma per pair) and fed
 * to mma.sync as A fragments: Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ with query rows in N.
 * The fragment order is free where it does not change the sums: thread
 * (lane / 4, lane % 4) = (qn, qc) loads head dims [c·S/4, (c+1)·S/4) of each
 * span of S dims of its K rows (S = D, or the int4 group: one k-step never
 * mixes groups), in the order its code width unpacks best (dec_kdim), and
 * the query fragments use the same order.  It loads tokens [8c, 8c + 8) of
 * its V rows; the chunk's tokens sit at QKᵀ m-rows chosen so that the score
 * accumulator, moved to the B layout with movmatrix, is exactly the PV k
 * order of those V codes (dec_lay::tok):
 *   8/16-bit V: m-row i (i < 8) token 8·(i / 2) + 4·s + (i % 2), i + 8: + 2
 *   4/2-bit V:  m-row i (i < 8) token 8·(i / 2) + 2·s + 4·(i % 2), i + 8: + 1
 * (m-tile s = 0, 1), so a 4-bit word unpacks to the pairs (t, t + 4).
 * Scales and zeros stay out of the MMA as in attn_kernel: K's per-token scale
 * on the scores; int4 K per group (one accumulator per group, plus z·Σq of
 * the group); KIVI's per-channel K scale folded into q once per block as a
 * high and a low FP16 part (two MMAs) plus the bias q·z; V's per-token or
 * per-group scale on the probabilities (one P fragment per V group, plus
 * Σ p·z per group, which each lane keeps for its own scores until the
 * epilogue sums the lanes), divided by the warp's unit per V group: the
 * largest scale seen so far over 2^14, rounded up to a power of two
 * (probabilities times scale stay normal FP16 at most 2^14; the unit only
 * grows, so the accumulator is rescaled only when it or a row's maximum
 * moves).
 */
#ifndef KVQ_CUDA_DECODE_CUH
#define KVQ_CUDA_DECODE_CUH

#include "decode_frag.cuh"
#include "mma.cuh"
#include "state.cuh"

namespace kvq {

#define DEC_WARPS 4
#define DEC_CHUNK 32u   /* tokens per warp step: two m-tiles of QKᵀ, two k-steps of PV */

/* N bytes at p (aligned to the widest vector that divides N) into registers. */
template <int N> __device__ __forceinline__ void dec_ld(uint32_t (&r)[N / 4], const uint8_t *p)
{
	if constexpr (N % 16 == 0) {
#pragma unroll
		for (int i = 0; i < N / 16; i++) {
			const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p) + i);
			r[4 * i] = v.x;
			r[4 * i + 1] = v.y;
			r[4 * i + 2] = v.z;
			r[4 * i + 3] = v.w;
		}
	} else if constexpr (N % 8 == 0) {
#pragma unroll
		for (int i = 0; i < N / 8; i++) {
			const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p) + i);
			r[2 * i] = v.x;
			r[2 * i + 1] = v.y;
		}
	} else {
#pragma unroll
		for (int i = 0; i < N / 4; i++)
			r[i] = __ldg(reinterpret_cast<const uint32_t *>(p) + i);
	}
}

/* What one warp carries from chunk to chunk. */
template <int D, int NGV> struct dec_state {
	sm_state sm[2];   /* per query column 2c, 2c + 1 */
	float unit[NGV];  /* per V group */
	float acc[D / 16][4];
	/* V with group parameters: Σ p·z per group and query column over this
	 * lane's scores only, in the accumulator's units; dec_finish sums the
	 * lanes and adds it to the group's dims */
	float zp[NGV][2];
};

/* KIVI K: q·s of the current block as high and low parts, and q·z. */
template <int D> struct dec_kch {
	uint32_t qh[D / 8], ql[D / 8];
	float kb[2];
	uint32_t slot;
};

/* One 32-token chunk's codes and parameters as loaded (raw words).  KF/VF
 * are the chunk's formats: the layer's for a sealed block; the activation's,
 * with no parameters, for an open one, whose V rows are not transposed.  LY
 * is the layer's layout (dec_lay), which open chunks follow too. */
template <int KF, int VF, int D, bool OPEN, class LY> struct dec_raw {
	static constexpr int KBITS = fmt<KF>::bits, VBITS = fmt<VF>::bits;
	static constexpr int KPB = LY::KSPAN / 4 * KBITS / 8;   /* bytes of one span of one K row */
	static constexpr int KN = KPB * LY::KPARTS;              /* bytes of one K row this thread loads */
	static constexpr int VN = 8 * VBITS / 8;                 /* bytes of one V row this thread loads */
	static constexpr bool KTOK = !OPEN && fmt<KF>::kind_k == KVQ_PARAM_TOKEN;
	static constexpr bool KGRP = !OPEN && fmt<KF>::kind_k == KVQ_PARAM_GROUP;
	static constexpr bool KCH = !OPEN && fmt<KF>::kind_k == KVQ_PARAM_CHANNEL;
	static constexpr bool VTOK = !OPEN && fmt<VF>::kind_v == KVQ_PARAM_TOKEN;
	static constexpr bool VGRP = !OPEN && fmt<VF>::kind_v == KVQ_PARAM_GROUP;
	static_assert(!KGRP || LY::VNIB, "int4 K parameters are loaded for the 4/2-bit V token order");
	uint32_t kw[2][2][KN / 4];
	uint32_t vw[D / 16][2][VN >= 4 ? VN / 4 : 1];
	uint32_t kpw[KGRP ? 4 * LY::KPARTS : 4], vpw[VGRP ? 4 * LY::NGV : 4];
};

template <int N> __device__ __forceinline__ void dec_ldp(uint32_t *r, const uint8_t *p)
{
	if constexpr (N == 2) {
		const uint32_t x = __ldg(reinterpret_cast<const unsigned short *>(p));
		r[0] = __byte_perm(x, 0u, 0x4140);   /* bytes 0 and 2: dec_vfrag */
	} else {
		uint32_t t[N / 4];
		dec_ld<N>(t, p);
#pragma unroll
		for (int i = 0; i < N / 4; i++)
			r[i] = t[i];
	}
}

/* Where dec_load puts a chunk's words: straight into registers (dec_reg),
 * or (dec_stg) copied asynchronously into the lane's words of a stage in
 * shared memory, in the order of dec_raw's words: word w at 16-byte unit
 * w / 4 of the lane, the units of a warp's 32 lanes side by side, so that
 * every lane reads its own words back (dec_unstage) with conflict-free
 * 16-byte loads and no barrier. */
struct dec_reg {
	template <int N> __device__ __forceinline__ void ld(uint32_t *dst, const uint8_t *p) const
	{
		dec_ldp<N>(dst, p);
	}
	/* one 16-bit value (an open row's element) */
	__device__ __forceinline__ uint32_t h(const uint8_t *p) const { return *reinterpret_cast<const uint16_t *>(p); }
};

struct dec_stg {
	uint32_t lane_base;     /* shared address of the stage's unit 0 of this lane */
	const uint32_t *words;  /* the dec_raw the word indices are taken from (never read) */
	template <int N> __device__ __forceinline__ void ld(uint32_t *dst, const uint8_t *p) const
	{
		static_assert(N == 4 || N == 8 || N % 16 == 0, "staged loads copy 4, 8 or 16k bytes");
		const uint32_t w = (uint32_t)(dst - words);
		if constexpr (N % 16 == 0) {
#pragma unroll
			for (int i = 0; i < N / 16; i++)
				cp_async<16>(lane_base + (w / 4 + i) * 512, p + 16 * i);
		} else {
			cp_async<N>(lane_base + (w / 4) * 512 + (w % 4) * 4, p);
		}
	}
};

/* Issues the loads of a chunk's K codes and parameters (tb: its offset in
 * the block). */
template <int KF, int VF, int D, bool OPEN, class LY, class LD>
__device__ __forceinline__ void dec_load_k(dec_raw<KF, VF, D, OPEN, LY> &r, const uint8_t *kc, const uint8_t *kpar,
					   uint32_t tb, const LD &ld)
{
	typedef dec_raw<KF, VF, D, OPEN, LY> R;
	constexpr int KBITS = R::KBITS, KPB = R::KPB;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, qc = lane & 3, tg = lane >> 3, te = qn & 1;

#pragma unroll
	for (int s = 0; s < 2; s++)
#pragma unroll
		for (int hi = 0; hi < 2; hi++) {
			const uint8_t *kr = kc + (size_t)(tb + tg * 8 + LY::tok(s, hi, te)) * (D * KBITS / 8);
#pragma unroll
			for (int j = 0; j < LY::KPARTS; j++)
				ld.template ld<KPB>(&r.kw[s][hi][j * (KPB / 4)],
						    kr + (j * LY::KSPAN + qc * (LY::KSPAN / 4)) * KBITS / 8);
		}
	if constexpr (R::KTOK)
		ld.template ld<16>(r.kpw, kpar + (tb + tg * 8) * 2);
	if constexpr (R::KGRP)   /* {s, z}[t][part] of the tokens 4·te + 0..3 of the thread's eight */
		ld.template ld<16 * LY::KPARTS>(r.kpw, kpar + (size_t)(tb + tg * 8 + 4 * te) * LY::KPARTS * 4);
}

/* Issues the loads of a chunk's V codes and parameters (t0: its first
 * token, tb: its offset in the block, n: the sequence's tokens). */
template <int KF, int VF, int D, bool OPEN, class LY, class LD>
__device__ __forceinline__ void dec_load_v(dec_raw<KF, VF, D, OPEN, LY> &r, const uint8_t *vc, const uint8_t *vpar,
					   uint32_t B, uint32_t tb, uint32_t t0, uint32_t n, const LD &ld)
{
	typedef dec_raw<KF, VF, D, OPEN, LY> R;
	constexpr int VBITS = R::VBITS, VN = R::VN, MT = D / 16;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, qc = lane & 3, tg = lane >> 3, te = qn & 1;

	if constexpr (!OPEN) {
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hi = 0; hi < 2; hi++) {
				const size_t e = (size_t)(mt * 16 + qn + 8 * hi) * B + tb + qc * 8;
				ld.template ld<VN>(r.vw[mt][hi], vc + e * VBITS / 8);
			}
	} else {
		/* open rows are [token][dim]: 16-bit loads, tokens past n zeroed
		 * (the open block's unwritten rows are junk) */
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hi = 0; hi < 2; hi++) {
				const uint32_t d = mt * 16 + qn + 8 * hi;
#pragma unroll
				for (int j = 0; j < 4; j++) {
					const uint32_t ta = qc * 8 + LY::vt(j, 0), tb1 = qc * 8 + LY::vt(j, 1);
					const uint32_t x0 = t0 + ta < n ? ld.h(vc + ((size_t)(tb + ta) * D + d) * 2) : 0u;
					const uint32_t x1 = t0 + tb1 < n ? ld.h(vc + ((size_t)(tb + tb1) * D + d) * 2) : 0u;
					r.vw[mt][hi][j] = x0 | x1 << 16;
				}
			}
	}
	if constexpr (R::VTOK)
		ld.template ld<16>(r.vpw, vpar + (tb + tg * 8) * 2);
	if constexpr (R::VGRP) {   /* {s, z}[group][t], the same four tokens */
#pragma unroll
		for (int gv = 0; gv < LY::NGV; gv++)
			ld.template ld<16>(&r.vpw[4 * gv], vpar + ((size_t)gv * B + tb + tg * 8 + 4 * te) * 4);
	}
}

/* Issues every load of a chunk. */
template <int KF, int VF, int D, bool OPEN, class LY, class LD = dec_reg>
__device__ __forceinline__ void dec_load(dec_raw<KF, VF, D, OPEN, LY> &r, const uint8_t *kc, const uint8_t *vc,
					 const uint8_t *kpar, const uint8_t *vpar, uint32_t B, uint32_t tb, uint32_t t0,
					 uint32_t n, const LD &ld = LD())
{
	dec_load_k(r, kc, kpar, tb, ld);
	dec_load_v(r, vc, vpar, B, tb, t0, n, ld);
}

/* KIVI K: q·s (high and low parts) and q·z of the block whose channel
 * parameters start at kpar (read through ld, dec_load's policy); q as B
 * fragments (qf: k-step k, slot e holds dim dec_kdim(k, e) of the thread's
 * span). */
template <int D, int ACT, int P, class LD>
__device__ __forceinline__ void dec_kch_set(dec_kch<D> &kq, const uint32_t (&qf)[D / 8], const uint8_t *kpar,
					    const LD &ld)
{
	typedef act<ACT> AT;
	const uint32_t lane = threadIdx.x & 31, qc = lane & 3;
	uint32_t cp[D / 4];
	ld.template ld<D>(cp, kpar + qc * D);
	float bias = 0.0f;
#pragma unroll
	for (int k = 0; k < D / 16; k++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const uint32_t qw = qf[2 * k + h];
			float hv[2], lv[2];
#pragma unroll
			for (int b = 0; b < 2; b++) {
				const int dd = dec_kdim<P>(k, 2 * h + b);
				const unsigned short qb = (unsigned short)(b ? qw >> 16 : qw & 0xffffu);
				const float qv = AT::to_f(*reinterpret_cast<const typename AT::T *>(&qb));
				const float zc = __half2float(__ushort_as_half((unsigned short)(cp[dd] >> 16)));
				if constexpr (ACT != KVQ_DT_F16) {
					const float sc = __half2float(__ushort_as_half((unsigned short)(cp[dd] & 0xffffu)));
					const float x = qv * sc;
					hv[b] = AT::to_f(AT::from_f(x));
					lv[b] = x - hv[b];
				}
				bias += qv * zc;
			}
			if constexpr (ACT == KVQ_DT_F16) {
				/* the same parts in pairs: q·s (exact in FP32) rounded
				 * once is the high part, and q·s less it (exact too)
				 * rounded once the low */
				const uint32_t s2 = __byte_perm(cp[dec_kdim<P>(k, 2 * h)], cp[dec_kdim<P>(k, 2 * h + 1)], 0x5410);
				uint32_t hi;
				asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(qw), "r"(s2));
				kq.qh[2 * k + h] = hi;
				kq.ql[2 * k + h] = fma2<ACT>(qw, s2, hi ^ 0x80008000u);
			} else {
				kq.qh[2 * k + h] = AT::pack(hv[0], hv[1]);
				kq.ql[2 * k + h] = AT::pack(lv[0], lv[1]);
			}
		}
	bias += __shfl_xor_sync(0xffffffffu, bias, 1);
	bias += __shfl_xor_sync(0xffffffffu, bias, 2);
	kq.kb[0] = __shfl_sync(0xffffffffu, bias, 8 * qc);
	kq.kb[1] = __shfl_sync(0xffffffffu, bias, 8 * qc + 4);
}

/* Scores Sᵀ = K·Qᵀ of a chunk whose K words and parameters are loaded:
 * x[s][i], the C fragment of m-tile s, in log2 units, -inf where a query
 * column must not see the token. */
template <int KF, int VF, int D, int ACT, bool OPEN, class LY>
__device__ __forceinline__ void dec_score(float (&x)[2][4], const dec_raw<KF, VF, D, OPEN, LY> &r, uint32_t t0,
					  const uint32_t (&qf)[D / 8], const dec_kch<D> &kq,
					  const float (&qg)[LY::KPARTS][2], const uint32_t (&lim)[2], float sl2)
{
	typedef dec_raw<KF, VF, D, OPEN, LY> R;
	constexpr int KPS = LY::KSPAN / 16;
	constexpr bool KTOK = R::KTOK, KGRP = R::KGRP, KCH = R::KCH;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, tg = lane >> 3, te = qn & 1;

	/* ---- scores Sᵀ = K·Qᵀ: x[s][i], C fragment of m-tile s */
#pragma unroll
	for (int s = 0; s < 2; s++) {
		float c[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
		for (int j = 0; j < LY::KPARTS; j++) {
			float cg[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
			for (int k = j * KPS; k < (j + 1) * KPS; k++) {
				uint32_t fa[4];
				dec_kfrag<KF, ACT, LY::KP>(fa, r.kw[s][0], r.kw[s][1], k);
				if constexpr (KCH) {
					const uint32_t fh[2] = { kq.qh[2 * k], kq.qh[2 * k + 1] };
					const uint32_t fl[2] = { kq.ql[2 * k], kq.ql[2 * k + 1] };
					mma16816<ACT>(cg, fa, fh);
					mma16816<ACT>(cg, fa, fl);
				} else {
					const uint32_t fb[2] = { qf[2 * k], qf[2 * k + 1] };
					mma16816<ACT>(cg, fa, fb);
				}
			}
#pragma unroll
			for (int i = 0; i < 4; i++) {
				if constexpr (KGRP) {
					const uint32_t w = r.kpw[(2 * s + (i >> 1)) * LY::KPARTS + j];
					const float sc = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
					const float zc = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
					c[i] += cg[i] * sc + zc * qg[j][i & 1];
				} else {
					c[i] += cg[i];
				}
			}
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int hi = i >> 1;
			const uint32_t t = t0 + tg * 8 + LY::tok(s, hi, te);
			float y = c[i];
			if constexpr (KCH)
				y += kq.kb[i & 1];
			y *= sl2;
			if (KTOK)
				y *= dec_half(r.kpw, (int)LY::tok(s, hi, te));
			x[s][i] = t < lim[i & 1] ? y : -INFINITY;
		}
	}
}

/* The least power of two at or above x, a positive float (+inf stays). */
__device__ __forceinline__ float pow2_ceil(float x)
{
	return __uint_as_float((__float_as_uint(x) + 0x007fffffu) & 0xff800000u);
}

/* 1 / x, exactly, of a normal power of two x below 2^127. */
__device__ __forceinline__ float pow2_inv(float x)
{
	return __uint_as_float(0x7f000000u - __float_as_uint(x));
}

/* The online softmax of a chunk's scores x per query column, with its V
 * parameters loaded: e, the chunk's probabilities under the new maximum;
 * rs, one over the warp's V unit per group; the accumulator rescaled where
 * a maximum or a unit moved. */
template <int KF, int VF, int D, int ACT, bool OPEN, class LY>
__device__ __forceinline__ void dec_softmax(dec_state<D, LY::NGV> &st, const dec_raw<KF, VF, D, OPEN, LY> &r,
					    const float (&x)[2][4], float (&e)[2][4], float (&rs)[LY::NGV])
{
	typedef dec_raw<KF, VF, D, OPEN, LY> R;
	constexpr int MT = D / 16, NGV = LY::NGV;
	constexpr bool VTOK = R::VTOK, VGRP = R::VGRP;

	/* ---- online softmax per query column; the chunk's V unit per group */
	float alpha[2], mu[2];
#pragma unroll
	for (int j = 0; j < 2; j++) {
		float mx = fmaxf(fmaxf(x[0][j], x[0][j + 2]), fmaxf(x[1][j], x[1][j + 2]));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
		alpha[j] = st.sm[j].raise(mx);
		mu[j] = st.sm[j].base();
	}
#pragma unroll
	for (int s = 0; s < 2; s++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			e[s][i] = fast_exp2(x[s][i] - mu[i & 1]);
			st.sm[i & 1].l += e[s][i];
		}
	float ratio[NGV];
	bool moved = alpha[0] != 1.0f || alpha[1] != 1.0f;
#pragma unroll
	for (int gv = 0; gv < NGV; gv++) {
		float S = 1.0f;
		if constexpr (VTOK) {
			S = 0.0f;
#pragma unroll
			for (int i = 0; i < 8; i++)
				S = fmaxf(S, dec_half(r.vpw, i));
			S = fmaxf(S, __shfl_xor_sync(0xffffffffu, S, 8));
			S = fmaxf(S, __shfl_xor_sync(0xffffffffu, S, 16));
			if (!(S > 0.0f))
				S = 1.0f;
		} else if constexpr (VGRP) {
			S = 0.0f;
#pragma unroll
			for (int i = 0; i < 4; i++)
				S = fmaxf(S, dec_half(r.vpw, 2 * (4 * gv + i)));
			S = fmaxf(S, __shfl_xor_sync(0xffffffffu, S, 4));
			S = fmaxf(S, __shfl_xor_sync(0xffffffffu, S, 8));
			S = fmaxf(S, __shfl_xor_sync(0xffffffffu, S, 16));
			if (!(S > 0.0f))
				S = 1.0f;
		}
		/* the unit only grows, so most chunks leave the accumulator as it
		 * is; a power of two, so that its reciprocal and the ratio are
		 * exact and take no division */
		const float unit = fmaxf(st.unit[gv], pow2_ceil(S * (1.0f / ATTN_P_UNIT)));
		rs[gv] = unit < INFINITY ? pow2_inv(unit) : 0.0f;
		ratio[gv] = st.unit[gv] * rs[gv];
		st.unit[gv] = unit;
		moved = moved || ratio[gv] != 1.0f;
	}
	if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				st.acc[mt][i] *= alpha[i & 1] * ratio[mt * 16 / LY::VGS];
#pragma unroll
		for (int gv = 0; gv < NGV; gv++)
#pragma unroll
			for (int j = 0; j < 2; j++)
				st.zp[gv][j] *= alpha[j] * ratio[gv];
	}
}

/* The value accumulation of a chunk whose V words are loaded: Oᵀ += Vᵀ·Pᵀ
 * with P = e, one P per V group (plus Σ p·z of the group, this lane's
 * share into st.zp). */
template <int KF, int VF, int D, int ACT, bool OPEN, class LY>
__device__ __forceinline__ void dec_pv(dec_state<D, LY::NGV> &st, const dec_raw<KF, VF, D, OPEN, LY> &r,
				       const float (&e)[2][4], const float (&rs)[LY::NGV])
{
	typedef dec_raw<KF, VF, D, OPEN, LY> R;
	constexpr int NGV = LY::NGV;
	constexpr bool VTOK = R::VTOK, VGRP = R::VGRP;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, te = qn & 1;

	/* ---- Oᵀ += Vᵀ·Pᵀ, one P per V group (plus Σ p·z of the group, st.zp) */
#pragma unroll
	for (int gv = 0; gv < NGV; gv++) {
		uint32_t pb[2][2];
		float zs[2] = { 0.0f, 0.0f };   /* Σ p·z of this lane's scores */
#pragma unroll
		for (int s = 0; s < 2; s++) {
			float p[4];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int hi = i >> 1;
				/* rs is a power of two: e·(sc·rs) is (e·sc)·rs, and
				 * sc·rs serves both query columns of the token */
				if constexpr (VTOK) {
					p[i] = e[s][i] * (dec_half(r.vpw, (int)LY::tok(s, hi, te)) * rs[gv]);
				} else if constexpr (VGRP) {
					const uint32_t w = r.vpw[4 * gv + 2 * s + hi];
					const float sc = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
					const float zc = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
					p[i] = e[s][i] * (sc * rs[gv]);
					zs[i & 1] += e[s][i] * zc;
				} else {
					p[i] = e[s][i] * rs[gv];
				}
			}
			pb[s][0] = movmatrix_t(act<ACT>::pack(p[0], p[1]));
			pb[s][1] = movmatrix_t(act<ACT>::pack(p[2], p[3]));
		}
		if constexpr (VGRP) {
#pragma unroll
			for (int j = 0; j < 2; j++)
				st.zp[gv][j] += zs[j] * rs[gv];
		}
#pragma unroll
		for (int mt = gv * LY::VGS / 16; mt < (gv + 1) * LY::VGS / 16; mt++) {
#pragma unroll
			for (int s = 0; s < 2; s++) {
				uint32_t fa[4];
				dec_vfrag<VF, ACT>(fa, r.vw[mt][0], r.vw[mt][1], s);
				mma16816<ACT>(st.acc[mt], fa, pb[s]);
			}
		}
	}
}

/* Scores, online softmax and PV of a loaded chunk. */
template <int KF, int VF, int D, int ACT, bool OPEN, class LY>
__device__ __forceinline__ void dec_compute(dec_state<D, LY::NGV> &st, const dec_raw<KF, VF, D, OPEN, LY> &r,
					    uint32_t t0, const uint32_t (&qf)[D / 8], const dec_kch<D> &kq,
					    const float (&qg)[LY::KPARTS][2], const uint32_t (&lim)[2], float sl2)
{
	float x[2][4], e[2][4], rs[LY::NGV];

	dec_score<KF, VF, D, ACT, OPEN, LY>(x, r, t0, qf, kq, qg, lim, sl2);
	dec_softmax<KF, VF, D, ACT, OPEN, LY>(st, r, x, e, rs);
	dec_pv<KF, VF, D, ACT, OPEN, LY>(st, r, e, rs);
}

#define DEC_NOSLOT 0xffffffffu

/* Slot of chunk u (below end): the sealed id, or the open id with bit 31
 * set; DEC_NOSLOT past end or for an id outside the pool. */
__device__ __forceinline__ uint32_t dec_slot(const attn_args &a, const kvq_seq_table &s, uint32_t u, uint32_t end,
					     uint32_t n_sealed_blk)
{
	if (u >= end)
		return DEC_NOSLOT;
	const uint32_t blk = u * DEC_CHUNK / a.l.B;
	const bool sink = blk == 0 && s.sink;   /* read as an open block */
	const bool sealed = !sink && blk < n_sealed_blk;
	const int32_t id = block_id(a.l, s, blk, n_sealed_blk, sink, sealed);
	if (id < 0)
		return DEC_NOSLOT;
	return (uint32_t)id | (sealed ? 0u : 0x80000000u);
}

template <int KF, int VF, int D, class LY>
__device__ __forceinline__ void dec_load_sealed(const attn_args &a, dec_raw<KF, VF, D, false, LY> &r, uint32_t slot,
						uint32_t u, uint32_t h, uint32_t n)
{
	if (slot == DEC_NOSLOT)
		return;
	const layer_dev &l = a.l;
	const uint8_t *hs = sealed_head(l, a.base, slot, h);
	const uint32_t t0 = u * DEC_CHUNK;
	dec_load(r, hs + l.off[KVQ_K_CODES], hs + l.off[KVQ_V_CODES], hs + l.off[KVQ_K_PARAMS], hs + l.off[KVQ_V_PARAMS],
		 l.B, t0 % l.B, t0, n);
}

/* Bytes of one lane's words of a chunk in a stage (16-byte units). */
template <class R> __host__ __device__ constexpr uint32_t dec_units(void)
{
	return (uint32_t)(sizeof(R) + 15) / 16;
}

/* Copies sealed chunk u into a stage (lane_base: this lane's unit 0 there). */
template <int KF, int VF, int D, class LY>
__device__ __forceinline__ void dec_stage(const attn_args &a, uint32_t lane_base, uint32_t slot, uint32_t u, uint32_t h,
					  uint32_t n)
{
	if (slot == DEC_NOSLOT)
		return;
	dec_raw<KF, VF, D, false, LY> r;   /* for its word indices only */
	const layer_dev &l = a.l;
	const uint8_t *hs = sealed_head(l, a.base, slot, h);
	const uint32_t t0 = u * DEC_CHUNK;
	dec_load(r, hs + l.off[KVQ_K_CODES], hs + l.off[KVQ_V_CODES], hs + l.off[KVQ_K_PARAMS], hs + l.off[KVQ_V_PARAMS],
		 l.B, t0 % l.B, t0, n, dec_stg{ lane_base, reinterpret_cast<const uint32_t *>(&r) });
}

/* A staged chunk's words back into registers. */
template <class R> __device__ __forceinline__ void dec_unstage(R &r, uint32_t lane_base)
{
	constexpr uint32_t W = sizeof(R) / 4;
	uint32_t *w = reinterpret_cast<uint32_t *>(&r);
#pragma unroll
	for (uint32_t i = 0; i < dec_units<R>(); i++) {
		uint32_t x[4];
		asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
			     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
			     : "r"(lane_base + i * 512)
			     : "memory");
#pragma unroll
		for (uint32_t j = 0; j < 4; j++)
			if (4 * i + j < W)
				w[4 * i + j] = x[j];
	}
}

/* KIVI K: the channel parameters of block `slot` (at kpar, read through
 * ld) folded into q when the block changes; nothing for other formats. */
template <int KF, int VF, int D, int ACT, class LY, class LD>
__device__ __forceinline__ void dec_kch_update(dec_kch<D> &kq, uint32_t slot, const uint32_t (&qf)[D / 8],
					       const uint8_t *kpar, const LD &ld)
{
	if constexpr (dec_raw<KF, VF, D, false, LY>::KCH) {
		if (slot != kq.slot) {
			dec_kch_set<D, ACT, LY::KP>(kq, qf, kpar, ld);
			kq.slot = slot;
		}
	}
}

/* A loaded sealed chunk (slot: its block). */
template <int KF, int VF, int D, int ACT, class LY>
__device__ __forceinline__ void dec_sealed(const attn_args &a, dec_state<D, LY::NGV> &st,
					   const dec_raw<KF, VF, D, false, LY> &r, uint32_t slot, uint32_t u, uint32_t h,
					   const uint32_t (&qf)[D / 8], dec_kch<D> &kq,
					   const float (&qg)[LY::KPARTS][2], const uint32_t (&lim)[2], float sl2)
{
	dec_kch_update<KF, VF, D, ACT, LY>(kq, slot, qf, sealed_head(a.l, a.base, slot, h) + a.l.off[KVQ_K_PARAMS],
					   dec_reg());
	dec_compute<KF, VF, D, ACT, false, LY>(st, r, u * DEC_CHUNK, qf, kq, qg, lim, sl2);
}

/* The query side of a decode CTA, set up once: q as B fragments of every
 * k-step (qf), Σ q of each K span for int4 K (qg), the tokens the thread's
 * score columns see (lim: query rows 2c, 2c + 1) and the score factor in
 * log2 units (sl2). */
template <int D, int KPARTS> struct dec_qset {
	uint32_t qf[D / 8];
	float qg[KPARTS][2];
	uint32_t lim[2];
	float sl2;
};

/* Sets q up for query rows of sequence s at KV head h; every thread of the
 * CTA calls it (a rotated K: q goes through buf, which holds 8 rows of
 * D + 4 floats, with CTA barriers). */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void dec_q_setup(const attn_args &a, const kvq_seq_table &s, uint32_t h, float *buf,
					    dec_qset<D, dec_lay<KF, VF, D>::KPARTS> &q)
{
	typedef dec_lay<KF, VF, D> LY;
	constexpr int SQ = LY::KSPAN / 4;
	constexpr uint32_t OSTRIDE = D + 4;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, qc = lane & 3;
	const uint32_t g = a.g, nr = s.m * g, qpos0 = s.n - s.m;

	/* query row qn, head dims [qc·S/4, (qc+1)·S/4) of each span of S dims, in
	 * dim order (qd), then as B fragments of every k-step (qf) */
	uint32_t qd[D / 8];
	if (a.rot & KVQ_ROT_K) {
		/* q into K's basis here (a.rot), through buf: the caller's stages
		 * are not in use yet */
		for (uint32_t i = threadIdx.x; i < nr * D; i += blockDim.x)
			buf[(i / D) * OSTRIDE + i % D] =
				act<ACT>::to_f(reinterpret_cast<const typename act<ACT>::T *>(a.q)[out_row(a, s, h, i / D) * D + i % D]);
		__syncthreads();
		rotate_q_rows<D, ACT>(buf, OSTRIDE, nr, 1.0f);
		__syncthreads();
#pragma unroll
		for (int j = 0; j < LY::KPARTS; j++)
#pragma unroll
			for (int i = 0; i < SQ / 2; i++) {
				const float *p = buf + qn * OSTRIDE + j * LY::KSPAN + qc * SQ + 2 * i;
				qd[j * (SQ / 2) + i] = qn < nr ? act<ACT>::pack(p[0], p[1]) : 0u;
			}
		__syncthreads();   /* read before the stages are copied into */
	} else if (qn < nr) {
		const size_t qix = ((size_t)(s.row0 + qn / g) * a.q_heads + h * g + qn % g) * D + qc * SQ;
#pragma unroll
		for (int j = 0; j < LY::KPARTS; j++)
			dec_ldp<SQ * 2>(&qd[j * (SQ / 2)], reinterpret_cast<const uint8_t *>(a.q) + (qix + j * LY::KSPAN) * 2);
	} else {
#pragma unroll
		for (int i = 0; i < D / 8; i++)
			qd[i] = 0;
	}
#pragma unroll
	for (int k = 0; k < D / 16; k++)
		dec_perm16<LY::KP>(qd, k, q.qf[2 * k], q.qf[2 * k + 1]);
	/* int4 K: Σ q of each span for the thread's score columns */
#pragma unroll
	for (int j = 0; j < LY::KPARTS; j++) {
		float sum = 0.0f;
		q.qg[j][0] = q.qg[j][1] = 0.0f;
		if constexpr (dec_raw<KF, VF, D, false, LY>::KGRP) {
#pragma unroll
			for (int i = 0; i < SQ / 2; i++) {
				const uint32_t w = qd[j * (SQ / 2) + i];
				const unsigned short lo = (unsigned short)(w & 0xffffu), hi = (unsigned short)(w >> 16);
				sum += act<ACT>::to_f(*reinterpret_cast<const typename act<ACT>::T *>(&lo)) +
				       act<ACT>::to_f(*reinterpret_cast<const typename act<ACT>::T *>(&hi));
			}
			sum += __shfl_xor_sync(0xffffffffu, sum, 1);
			sum += __shfl_xor_sync(0xffffffffu, sum, 2);
			q.qg[j][0] = __shfl_sync(0xffffffffu, sum, 8 * qc);
			q.qg[j][1] = __shfl_sync(0xffffffffu, sum, 8 * qc + 4);
		}
	}
#pragma unroll
	for (int j = 0; j < 2; j++) {
		const uint32_t r = 2 * qc + j;
		q.lim[j] = r < nr ? qpos0 + r / g + 1 : 0;
	}
	q.sl2 = a.scale * KVQ_LOG2E;
}

template <int D, int NGV> __device__ __forceinline__ void dec_state_init(dec_state<D, NGV> &st)
{
	st.sm[0].init();
	st.sm[1].init();
#pragma unroll
	for (int gv = 0; gv < NGV; gv++) {
		st.unit[gv] = 0.0f;
		st.zp[gv][0] = st.zp[gv][1] = 0.0f;
	}
#pragma unroll
	for (int mt = 0; mt < D / 16; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			st.acc[mt][i] = 0.0f;
}

/* A chunk of the open window (or of a sink block: slot sl, bit 31 set),
 * read as stored from global memory. */
template <int D, int ACT, class LY>
__device__ __forceinline__ void dec_open(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					 dec_state<D, LY::NGV> &st, uint32_t sl, uint32_t uc,
					 const dec_qset<D, LY::KPARTS> &q, const dec_kch<D> &kq)
{
	constexpr int OF = kvq_act_fmt(ACT);
	const layer_dev &l = a.l;
	const uint32_t t0 = uc * DEC_CHUNK, tb = t0 % l.B;
	const uint8_t *oh = open_head(l, a.base, sl & 0x7fffffffu, h);
	dec_raw<OF, OF, D, true, LY> r;
	dec_load(r, oh, oh + (size_t)l.B * D * 2, NULL, NULL, l.B, tb, t0, s.n);
	dec_compute<OF, OF, D, ACT, true, LY>(st, r, t0, q.qf, kq, q.qg, q.lim, q.sl2);
}

/* The epilogue of a decode CTA of NT threads, every one of them calling
 * it: the (m, l, o) of its first NW warps (the rest hold no state) merged
 * through shared memory (sm_o: NW·8 rows of D + 4 floats), then the
 * result, rotated out of V's basis here (a.rot, the range whole), or the
 * split's partial for merge_kernel. */
template <int D, class LY, int NW, int NT>
__device__ __forceinline__ void dec_finish(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					   const dec_state<D, LY::NGV> &st, float (*sm_m)[8], float (*sm_l)[8],
					   float *sm_o)
{
	constexpr int MT = D / 16;
	constexpr uint32_t OSTRIDE = D + 4;
	const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, qn = lane >> 2, qc = lane & 3;
	const uint32_t nr = s.m * a.g;

	if (warp < NW) {
		/* Σ p·z of each group and query column, over the lanes of the column */
		float zp[LY::NGV][2];
#pragma unroll
		for (int gv = 0; gv < LY::NGV; gv++)
#pragma unroll
			for (int j = 0; j < 2; j++) {
				zp[gv][j] = st.zp[gv][j];
				zp[gv][j] += __shfl_xor_sync(0xffffffffu, zp[gv][j], 4);
				zp[gv][j] += __shfl_xor_sync(0xffffffffu, zp[gv][j], 8);
				zp[gv][j] += __shfl_xor_sync(0xffffffffu, zp[gv][j], 16);
			}
#pragma unroll
		for (int j = 0; j < 2; j++) {
			float x = st.sm[j].l;
			x += __shfl_xor_sync(0xffffffffu, x, 4);
			x += __shfl_xor_sync(0xffffffffu, x, 8);
			x += __shfl_xor_sync(0xffffffffu, x, 16);
			if (qn == 0) {
				sm_m[warp][2 * qc + j] = st.sm[j].m;
				sm_l[warp][2 * qc + j] = x;
			}
		}
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				sm_o[(warp * 8 + 2 * qc + (i & 1)) * OSTRIDE + mt * 16 + qn + 8 * (i >> 1)] =
					(st.acc[mt][i] + zp[mt * 16 / LY::VGS][i & 1]) * st.unit[mt * 16 / LY::VGS];
	}
	__syncthreads();

	/* V rotated back here (a.rot, the range whole): the rows' results
	 * through warp 0's rows of sm_o first */
	const bool rot_out = (a.rot & KVQ_ROT_V) && a.splits == 1;
	constexpr uint32_t PER = (8 * D + NT - 1) / NT;
	float y[PER];
#pragma unroll
	for (uint32_t k = 0; k < PER; k++) {
		const uint32_t idx = threadIdx.x + k * NT, r = idx / D, d = idx % D;
		if (idx >= nr * D)
			break;
		sm_state m;
		float o = 0.0f;
		m.init();
#pragma unroll
		for (int w = 0; w < NW; w++) {
			float wa, wb;
			m.merge(sm_state{ sm_m[w][r], sm_l[w][r] }, &wa, &wb);
			o = o * wa + sm_o[(w * 8 + r) * OSTRIDE + d] * wb;
		}
		if (rot_out)
			y[k] = m.normalize(o);
		else
			emit<D>(a, blockIdx.x, out_row(a, s, h, r), d, o, m);
	}
	if (!rot_out)
		return;
	__syncthreads();
#pragma unroll
	for (uint32_t k = 0; k < PER; k++) {
		const uint32_t idx = threadIdx.x + k * NT;
		if (idx < nr * D)
			sm_o[(idx / D) * OSTRIDE + idx % D] = y[k];
	}
	__syncthreads();
	emit_rotated<D>(a, s, h, sm_o, OSTRIDE, 0, nr);
}

/* Per instance: how sealed chunks reach the registers, and the CTAs per
 * multiprocessor the registers are held to.  8-bit K and V at D = 64: two
 * stages in shared memory (cp.async; 3 CTAs/SM), 1.37x the register double
 * buffer; at D = 128 the stages were slower (2 stages, 3 CTAs: 0.78x; 3
 * stages, 2 CTAs: DRAM 44 % against 64 % under the profiler), so there
 * 8-bit chunks are double-buffered in registers (twice the bytes in flight;
 * single-buffered at 3 CTAs/SM was slower).  4/2-bit codes: three CTAs,
 * single-buffered (KIVI K spills at the 168 registers that leaves, but at
 * two CTAs and 255 registers it was no faster, and slower at D = 64).  The
 * measurements: bench/RESULTS.md, 2026-11-29 and 2026-12-02. */
template <int KF, int VF, int D> struct dec_tune {
	static constexpr bool sub8 = fmt<KF>::bits < 8 || fmt<VF>::bits < 8;
	static constexpr bool both8 = fmt<KF>::bits == 8 && fmt<VF>::bits == 8;
	static constexpr int stages = both8 && D == 64 ? 2 : 0;
	static constexpr bool dbuf = both8 && !stages;
	static constexpr int minb = stages || sub8 ? 3 : 1;
};

/* Dynamic shared memory of an instance: its stages (which hold the warps'
 * partial results at the end), or none. */
template <int KF, int VF, int D> __host__ __device__ constexpr uint32_t dec_smem_bytes(void)
{
	typedef dec_lay<KF, VF, D> LY;
	return dec_tune<KF, VF, D>::stages * dec_units<dec_raw<KF, VF, D, false, LY>>() * 512u * DEC_WARPS;
}

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(DEC_WARPS * 32, (dec_tune<KF, VF, D>::minb)) decode_kernel(attn_args a)
{
	typedef dec_lay<KF, VF, D> LY;
	typedef dec_raw<KF, VF, D, false, LY> RS;
	constexpr int NGV = LY::NGV;
	constexpr int NS = dec_tune<KF, VF, D>::stages;
	constexpr uint32_t OSTRIDE = D + 4, UNITS = dec_units<RS>();
	static_assert(!NS || dec_smem_bytes<KF, VF, D>() >= DEC_WARPS * 8 * OSTRIDE * 4, "the stages hold sm_o");
	__shared__ float sm_m[DEC_WARPS][8], sm_l[DEC_WARPS][8];
	__shared__ __align__(16) float sm_os[NS ? 4 : DEC_WARPS * 8 * OSTRIDE];
	extern __shared__ __align__(16) uint8_t dec_smem[];
	float *const sm_o = NS ? reinterpret_cast<float *>(dec_smem) : sm_os;   /* [warp][row][OSTRIDE] */

	const layer_dev &l = a.l;
	const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const kvq_seq_table s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, nr = s.m * a.g;
	if (nr == 0 || s.m > s.n)
		return;
	const uint32_t nch = (s.n + DEC_CHUNK - 1) / DEC_CHUNK, per = (nch + a.splits - 1) / a.splits;
	const uint32_t u0 = blockIdx.x * per, u1 = u0 + per < nch ? u0 + per : nch;
	const uint32_t n_sealed_blk = split_of(l, s.n) / l.B;

	dec_qset<D, LY::KPARTS> q;
	dec_q_setup<KF, VF, D, ACT>(a, s, h, sm_o, q);
	dec_kch<D> kq;
	kq.slot = DEC_NOSLOT;

	dec_state<D, NGV> st;
	dec_state_init(st);

	/* Slots are read two chunks ahead (a dependent load off the critical
	 * path); 8-bit formats also load a sealed chunk while the previous one
	 * is computed (two register buffers: twice the bytes in flight;
	 * dec_tune). */
	const uint32_t us = n_sealed_blk * l.B / DEC_CHUNK < u1 ? n_sealed_blk * l.B / DEC_CHUNK : u1;
	/* a chunk of the open window (or of a sink block), read as stored */
	auto open_chunk = [&](uint32_t sl, uint32_t uc) { dec_open<D, ACT, LY>(a, s, h, st, sl, uc, q, kq); };
	uint32_t u = u0 + warp;
	/* a sink block's chunks (kernels/layout.h) first, as open ones: the
	 * sealed pipelines below start past them */
	const uint32_t ue = !s.sink ? 0 : l.B / DEC_CHUNK < u1 ? l.B / DEC_CHUNK : u1;
	for (; u < ue; u += DEC_WARPS) {
		const uint32_t sl = dec_slot(a, s, u, u1, n_sealed_blk);
		if (sl != DEC_NOSLOT)
			open_chunk(sl, u);
	}
	if constexpr (NS > 0) {
		/* NS stages per warp: chunk u + (NS - 1)·W is copied in while
		 * chunk u is computed (W = DEC_WARPS); a lane reads back only the
		 * words it copied itself, so waiting for its own groups suffices */
		const uint32_t ring = (uint32_t)__cvta_generic_to_shared(dec_smem) + (warp * NS * UNITS * 32 + lane) * 16;
		uint32_t sl[NS - 1], cur = 0;   /* slots of chunks u, u + W, ...; the stage of chunk u */
#pragma unroll
		for (int j = 0; j < NS - 1; j++) {
			sl[j] = dec_slot(a, s, u + j * DEC_WARPS, us, n_sealed_blk);
			dec_stage<KF, VF, D, LY>(a, ring + j * UNITS * 512, sl[j], u + j * DEC_WARPS, h, s.n);
			cp_async_commit();
		}
		for (; u < us; u += DEC_WARPS) {
			const uint32_t sn = dec_slot(a, s, u + (NS - 1) * DEC_WARPS, us, n_sealed_blk);
			const uint32_t back = cur ? cur - 1 : NS - 1;   /* the stage chunk u - W was in */
			dec_stage<KF, VF, D, LY>(a, ring + back * UNITS * 512, sn, u + (NS - 1) * DEC_WARPS, h, s.n);
			cp_async_commit();
			cp_async_wait_group<NS - 1>();
			if (sl[0] != DEC_NOSLOT) {
				RS r;
				dec_unstage(r, ring + cur * UNITS * 512);
				__syncwarp();   /* read before the stage is copied into again */
				dec_sealed<KF, VF, D, ACT, LY>(a, st, r, sl[0], u, h, q.qf, kq, q.qg, q.lim, q.sl2);
			}
#pragma unroll
			for (int j = 0; j < NS - 2; j++)
				sl[j] = sl[j + 1];
			sl[NS - 2] = sn;
			cur = cur + 1 < NS ? cur + 1 : 0;
		}
		cp_async_wait_group<0>();
		__syncthreads();   /* every warp's copies landed: the stages become sm_o */
	}
	if constexpr (dec_tune<KF, VF, D>::dbuf) {
		if (u < us) {
			RS A, B;
			uint32_t sa = dec_slot(a, s, u, us, n_sealed_blk), sb = dec_slot(a, s, u + DEC_WARPS, us, n_sealed_blk);
			dec_load_sealed(a, A, sa, u, h, s.n);
			for (;;) {
				const uint32_t sc = dec_slot(a, s, u + 2 * DEC_WARPS, us, n_sealed_blk);
				dec_load_sealed(a, B, sb, u + DEC_WARPS, h, s.n);
				if (sa != DEC_NOSLOT)
					dec_sealed<KF, VF, D, ACT, LY>(a, st, A, sa, u, h, q.qf, kq, q.qg, q.lim, q.sl2);
				u += DEC_WARPS;
				if (u >= us)
					break;
				const uint32_t sd = dec_slot(a, s, u + 2 * DEC_WARPS, us, n_sealed_blk);
				dec_load_sealed(a, A, sc, u + DEC_WARPS, h, s.n);
				if (sb != DEC_NOSLOT)
					dec_sealed<KF, VF, D, ACT, LY>(a, st, B, sb, u, h, q.qf, kq, q.qg, q.lim, q.sl2);
				u += DEC_WARPS;
				if (u >= us)
					break;
				sa = sc;
				sb = sd;
			}
		}
	}
	for (uint32_t sn = dec_slot(a, s, u, u1, n_sealed_blk); u < u1; u += DEC_WARPS) {
		const uint32_t sl = sn;
		sn = dec_slot(a, s, u + DEC_WARPS, u1, n_sealed_blk);
		if (sl == DEC_NOSLOT)
			continue;
		if (!(sl >> 31)) {
			RS r;
			dec_load_sealed(a, r, sl, u, h, s.n);
			dec_sealed<KF, VF, D, ACT, LY>(a, st, r, sl, u, h, q.qf, kq, q.qg, q.lim, q.sl2);
		} else {
			open_chunk(sl, u);
		}
	}

	dec_finish<D, LY, DEC_WARPS, DEC_WARPS * 32>(a, s, h, st, sm_m, sm_l, sm_o);
}

/* CTAs of one instance that fit on a multiprocessor (0 on error). */
/* The opt-in to the stages' dynamic shared memory, once per instance;
 * false on error. */
template <int KF, int VF, int D, int ACT> bool decode_raise(void)
{
	constexpr uint32_t bytes = dec_smem_bytes<KF, VF, D>();
	static bool raised;

	/* any stages at all: the static arrays count against the 48 KiB too */
	return !bytes || smem_opt_in((const void *)decode_kernel<KF, VF, D, ACT>, (int)bytes, raised);
}

template <int KF, int VF, int D, int ACT> int decode_occupancy(void)
{
	static int n;

	if (!n && (!decode_raise<KF, VF, D, ACT>() ||
		   cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<KF, VF, D, ACT>, DEC_WARPS * 32,
								 dec_smem_bytes<KF, VF, D>()) != cudaSuccess))
		n = 0;
	return n;
}

template <int KF, int VF, int D, int ACT> int decode_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	if (!decode_raise<KF, VF, D, ACT>())
		return fail_launch();
	decode_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H, nseq), DEC_WARPS * 32, dec_smem_bytes<KF, VF, D>(),
					(cudaStream_t)stream>>>(a);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
