/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decode attention: at most 8 query rows per KV head (one MMA n-tile), the
 * per-token formats (f16, bf16, int8, fp8 e4m3, fp8 e5m2), blocks of a
 * multiple of 32 tokens.  attention.cu picks it over attn_kernel when all of
 * that holds; everything else stays with attn_kernel.
 *
 * One CTA per (KV split, KV head, sequence), DEC_WARPS warps.  Each warp
 * streams its own 32-token chunks (no CTA-wide barrier until the end) with
 * its own online softmax, and the warps are merged through shared memory at
 * the end (the split's result, or its partial for merge_kernel).
 *
 * Codes go from global memory straight into registers (16-byte loads for K,
 * 8 or 16 for V), are converted to exact FP16/BF16 pairs in registers and fed
 * to mma.sync as A fragments: Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ with query rows in N.
 * The fragment order is free where it does not change the sums: thread
 * (lane / 4, lane % 4) loads head dims [c·D/4, (c+1)·D/4) of its K rows and
 * tokens [8c, 8c + 8) of its V rows (c = lane % 4), and the query fragments
 * use the same head-dim order.  The chunk's tokens sit at QKᵀ m-rows chosen
 * so that the score accumulator, moved to the B layout with movmatrix, is
 * exactly the PV k order of those V loads:
 *   m-row i (i < 8):  token 8·(i / 2) + 4·s + (i % 2)   (m-tile s = 0, 1)
 *   m-row i + 8:      the same token + 2.
 * Scales stay out of the MMA as in attn_kernel: K's per-token scale on the
 * scores, V's per-token scale on the probabilities, divided by the warp's
 * unit: the largest V scale seen so far over 2^14 (probabilities times scale
 * stay normal FP16 at most 2^14; the unit only grows, so the accumulator is
 * rescaled only when it or a row's maximum moves).
 */
#ifndef KVQ_CUDA_DECODE_CUH
#define KVQ_CUDA_DECODE_CUH

#include "attention.cuh"

namespace kvq {

#define DEC_WARPS 4
#define DEC_CHUNK 32u   /* tokens per warp step: two m-tiles of QKᵀ, two k-steps of PV */
#define DEC_LOG2E 1.4426950408889634f

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

/* Codes to exact activation-type pairs: four() turns a word of four 8-bit
 * codes into pairs (c0, c1) and (c2, c3); two() a word of two 16-bit codes
 * into one pair.  The generic form goes through fp32; the common ones are
 * specialised to a few logic ops. */
template <int F, int ACT> struct dec_cvt {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = act<ACT>::pack(fmt<F>::raw(w & 0xffu), fmt<F>::raw((w >> 8) & 0xffu));
		hi = act<ACT>::pack(fmt<F>::raw((w >> 16) & 0xffu), fmt<F>::raw(w >> 24));
	}
	static __device__ __forceinline__ uint32_t two(uint32_t w)
	{
		return act<ACT>::pack(fmt<F>::raw(w & 0xffffu), fmt<F>::raw(w >> 16));
	}
};

template <> struct dec_cvt<KVQ_FMT_F16, KVQ_DT_F16> {
	static __device__ __forceinline__ uint32_t two(uint32_t w) { return w; }
};
template <> struct dec_cvt<KVQ_FMT_BF16, KVQ_DT_BF16> {
	static __device__ __forceinline__ uint32_t two(uint32_t w) { return w; }
};

/* int8 -> f16: 0x6400 | (c ^ 0x80) is 1024 + c + 128, exact; one subtraction per pair */
template <> struct dec_cvt<KVQ_FMT_INT8, KVQ_DT_F16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		const uint32_t x = w ^ 0x80808080u, bias = 0x64806480u;   /* 1152 in each half */
		const uint32_t a = __byte_perm(x, 0x64646464u, 0x4140), b = __byte_perm(x, 0x64646464u, 0x4342);
		asm("sub.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(a), "r"(bias));
		asm("sub.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(b), "r"(bias));
	}
};

/* int8 -> bf16: 2^23 + 128 + c as fp32 (exact), less 2^23 + 128, packed */
template <> struct dec_cvt<KVQ_FMT_INT8, KVQ_DT_BF16> {
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
template <> struct dec_cvt<KVQ_FMT_FP8, KVQ_DT_F16> {
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
template <> struct dec_cvt<KVQ_FMT_FP8E5M2, KVQ_DT_F16> {
	static __device__ __forceinline__ void four(uint32_t w, uint32_t &lo, uint32_t &hi)
	{
		lo = __byte_perm(w, 0u, 0x1404);
		hi = __byte_perm(w, 0u, 0x3424);
	}
};

/* The A fragment of one k-step from raw words: for 8-bit codes word k of
 * each row (hi = 0: the lower m-row or dim, 1: the upper), for 16-bit codes
 * words 2k and 2k + 1. */
template <int F, int ACT, int NW>
__device__ __forceinline__ void dec_frag(uint32_t fa[4], const uint32_t (&r0)[NW], const uint32_t (&r1)[NW], int k)
{
	if constexpr (fmt<F>::bits == 8) {
		dec_cvt<F, ACT>::four(r0[k], fa[0], fa[2]);
		dec_cvt<F, ACT>::four(r1[k], fa[1], fa[3]);
	} else {
		fa[0] = dec_cvt<F, ACT>::two(r0[2 * k]);
		fa[2] = dec_cvt<F, ACT>::two(r0[2 * k + 1]);
		fa[1] = dec_cvt<F, ACT>::two(r1[2 * k]);
		fa[3] = dec_cvt<F, ACT>::two(r1[2 * k + 1]);
	}
}

__device__ __forceinline__ uint32_t dec_trans(uint32_t x)
{
	uint32_t y;
	asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
	return y;
}

__device__ __forceinline__ float dec_exp2(float x)
{
	float y;
	asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

__device__ __forceinline__ float dec_half(const uint32_t (&w)[4], int i)
{
	const uint32_t x = w[i >> 1];
	return __half2float(__ushort_as_half((unsigned short)(i & 1 ? x >> 16 : x & 0xffffu)));
}

/* What one warp carries from chunk to chunk. */
template <int D> struct dec_state {
	float m[2], l[2], unit;   /* per query column 2c, 2c + 1 (log2 units) */
	float acc[D / 16][4];
};

/* One 32-token chunk's codes and parameters as loaded (raw words).  KF/VF
 * are the chunk's formats: the layer's for a sealed block; the activation's,
 * with no parameters, for an open one, whose V rows are not transposed. */
template <int KF, int VF, int D, bool OPEN> struct dec_raw {
	static constexpr int KB = fmt<KF>::bits / 8, VB = fmt<VF>::bits / 8;
	static constexpr int KN = D / 4 * KB;    /* bytes of one K row this thread loads */
	static constexpr int VN = 8 * VB;        /* bytes of one V row this thread loads */
	static constexpr bool KTOK = !OPEN && fmt<KF>::kind_k == KVQ_PARAM_TOKEN;
	static constexpr bool VTOK = !OPEN && fmt<VF>::kind_v == KVQ_PARAM_TOKEN;
	uint32_t kw[2][2][KN / 4];
	uint32_t vw[D / 16][2][VN / 4];
	uint32_t kpw[4], vpw[4];
};

/* Issues every load of a chunk (t0: its first token, tb: its offset in the
 * block, n: the sequence's tokens). */
template <int KF, int VF, int D, bool OPEN>
__device__ __forceinline__ void dec_load(dec_raw<KF, VF, D, OPEN> &r, const uint8_t *kc, const uint8_t *vc,
					 const uint8_t *kpar, const uint8_t *vpar, uint32_t B, uint32_t tb, uint32_t t0,
					 uint32_t n)
{
	typedef dec_raw<KF, VF, D, OPEN> R;
	constexpr int KB = R::KB, VB = R::VB, KN = R::KN, VN = R::VN, MT = D / 16;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, qc = lane & 3, tg = lane >> 3, te = qn & 1;

	const uint8_t *kb = kc + (size_t)(tb + tg * 8 + te) * (D * KB) + qc * KN;
#pragma unroll
	for (int s = 0; s < 2; s++)
#pragma unroll
		for (int hi = 0; hi < 2; hi++)
			dec_ld<KN>(r.kw[s][hi], kb + (4 * s + 2 * hi) * (D * KB));
	if constexpr (!OPEN) {
		const uint8_t *vb = vc + ((size_t)qn * B + tb + qc * 8) * VB;
		const size_t v8 = (size_t)8 * B * VB;
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hi = 0; hi < 2; hi++)
				dec_ld<VN>(r.vw[mt][hi], vb + (2 * mt + hi) * v8);
	} else {
		/* open rows are [token][dim]: 16-bit loads, tokens past n zeroed
		 * (the open block's unwritten rows are junk) */
		const uint16_t *vr = reinterpret_cast<const uint16_t *>(vc);
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int hi = 0; hi < 2; hi++) {
				const uint32_t d = mt * 16 + qn + 8 * hi;
#pragma unroll
				for (int j = 0; j < 4; j++) {
					const uint32_t t = tb + qc * 8 + 2 * j;
					const uint32_t x0 = t0 + qc * 8 + 2 * j < n ? vr[(size_t)t * D + d] : 0u;
					const uint32_t x1 = t0 + qc * 8 + 2 * j + 1 < n ? vr[(size_t)(t + 1) * D + d] : 0u;
					r.vw[mt][hi][j] = x0 | x1 << 16;
				}
			}
	}
	if constexpr (R::KTOK)
		dec_ld<16>(r.kpw, kpar + (tb + tg * 8) * 2);
	if constexpr (R::VTOK)
		dec_ld<16>(r.vpw, vpar + (tb + tg * 8) * 2);
}

/* Scores, online softmax and PV of a loaded chunk. */
template <int KF, int VF, int D, int ACT, bool OPEN>
__device__ __forceinline__ void dec_compute(dec_state<D> &st, const dec_raw<KF, VF, D, OPEN> &r, uint32_t t0,
					    const uint32_t (&qf)[D / 8], const uint32_t (&lim)[2], float sl2)
{
	typedef dec_raw<KF, VF, D, OPEN> R;
	constexpr int KS = D / 16, MT = D / 16;
	constexpr bool KTOK = R::KTOK, VTOK = R::VTOK;
	const uint32_t lane = threadIdx.x & 31, qn = lane >> 2, tg = lane >> 3, te = qn & 1;

	/* ---- scores Sᵀ = K·Qᵀ: x[s][i], C fragment of m-tile s */
	float x[2][4];
#pragma unroll
	for (int s = 0; s < 2; s++) {
		float c[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
		for (int k = 0; k < KS; k++) {
			uint32_t fa[4];
			const uint32_t fb[2] = { qf[2 * k], qf[2 * k + 1] };
			dec_frag<KF, ACT>(fa, r.kw[s][0], r.kw[s][1], k);
			mma16816<ACT>(c, fa, fb);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int hi = i >> 1;
			const uint32_t t = t0 + tg * 8 + 4 * s + 2 * hi + te;
			float y = c[i] * sl2;
			if (KTOK)
				y *= dec_half(r.kpw, 4 * s + 2 * hi + (int)te);
			x[s][i] = t < lim[i & 1] ? y : -INFINITY;
		}
	}

	/* ---- online softmax per query column; the chunk's V unit */
	float alpha[2], mu[2];
#pragma unroll
	for (int j = 0; j < 2; j++) {
		float mx = fmaxf(fmaxf(x[0][j], x[0][j + 2]), fmaxf(x[1][j], x[1][j + 2]));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
		const float m_new = fmaxf(st.m[j], mx);
		mu[j] = m_new == -INFINITY ? 0.0f : m_new;
		alpha[j] = dec_exp2(st.m[j] - mu[j]);
		st.m[j] = m_new;
		st.l[j] *= alpha[j];
	}
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
	}
	/* the unit only grows, so most chunks leave the accumulator as it is */
	const float unit = fmaxf(st.unit, S * (1.0f / ATTN_P_UNIT)), rs = 1.0f / unit, ratio = st.unit / unit;
	st.unit = unit;
	uint32_t pb[2][2];
#pragma unroll
	for (int s = 0; s < 2; s++) {
		float p[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int hi = i >> 1;
			const float e = dec_exp2(x[s][i] - mu[i & 1]);
			st.l[i & 1] += e;
			p[i] = VTOK ? e * dec_half(r.vpw, 4 * s + 2 * hi + (int)te) * rs : e * rs;
		}
		pb[s][0] = dec_trans(act<ACT>::pack(p[0], p[1]));
		pb[s][1] = dec_trans(act<ACT>::pack(p[2], p[3]));
	}
	const float f0 = alpha[0] * ratio, f1 = alpha[1] * ratio;
	if (__any_sync(0xffffffffu, f0 != 1.0f || f1 != 1.0f))
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				st.acc[mt][i] *= i & 1 ? f1 : f0;

	/* ---- Oᵀ += Vᵀ·Pᵀ */
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int s = 0; s < 2; s++) {
			uint32_t fa[4];
			dec_frag<VF, ACT>(fa, r.vw[mt][0], r.vw[mt][1], s);
			mma16816<ACT>(st.acc[mt], fa, pb[s]);
		}
}

#define DEC_NOSLOT 0xffffffffu

/* Slot of chunk u (below end): the sealed id, or the open id with bit 31
 * set; DEC_NOSLOT past end or for an id outside the pool. */
__device__ __forceinline__ uint32_t dec_slot(const attn_args &a, const kvq_cuda_seq &s, uint32_t u, uint32_t end,
					     uint32_t n_sealed_blk)
{
	if (u >= end)
		return DEC_NOSLOT;
	const uint32_t blk = u * DEC_CHUNK / a.l.B;
	const bool sealed = blk < n_sealed_blk;
	const int32_t id = sealed ? s.sealed[blk] : s.open[blk - n_sealed_blk];
	if (id < 0 || (uint32_t)id >= (sealed ? a.l.n_sealed : a.l.n_open))
		return DEC_NOSLOT;
	return (uint32_t)id | (sealed ? 0u : 0x80000000u);
}

template <int KF, int VF, int D>
__device__ __forceinline__ void dec_load_sealed(const attn_args &a, dec_raw<KF, VF, D, false> &r, uint32_t slot,
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

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_kernel(attn_args a)
{
	constexpr int OF = ACT == KVQ_DT_F16 ? KVQ_FMT_F16 : KVQ_FMT_BF16;   /* open rows */
	constexpr int MT = D / 16, DQ = D / 4;
	__shared__ float sm_m[DEC_WARPS][8], sm_l[DEC_WARPS][8];
	__shared__ float sm_o[DEC_WARPS][8][D + 4];

	const layer_dev &l = a.l;
	const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, qn = lane >> 2, qc = lane & 3;
	const kvq_cuda_seq s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, g = a.g, nr = s.n_q * g;
	if (nr == 0 || s.n_q > s.n)
		return;
	const uint32_t qpos0 = s.n - s.n_q;
	const uint32_t nch = (s.n + DEC_CHUNK - 1) / DEC_CHUNK, per = (nch + a.splits - 1) / a.splits;
	const uint32_t u0 = blockIdx.x * per, u1 = u0 + per < nch ? u0 + per : nch;
	const uint32_t n_sealed_blk = split_of(l, s.n) / l.B;

	/* query row qn, head dims [qc·D/4, (qc+1)·D/4): the B fragments of every k-step */
	uint32_t qf[D / 8];
	if (qn < nr) {
		const size_t qix = ((size_t)(s.q_row0 + qn / g) * a.q_heads + h * g + qn % g) * D + qc * DQ;
		dec_ld<DQ * 2>(qf, reinterpret_cast<const uint8_t *>(a.q) + qix * 2);
	} else {
#pragma unroll
		for (int i = 0; i < D / 8; i++)
			qf[i] = 0;
	}
	/* tokens visible to this thread's score columns (query rows 2c, 2c + 1) */
	uint32_t lim[2];
#pragma unroll
	for (int j = 0; j < 2; j++) {
		const uint32_t r = 2 * qc + j;
		lim[j] = r < nr ? qpos0 + r / g + 1 : 0;
	}
	const float sl2 = a.scale * DEC_LOG2E;

	dec_state<D> st;
	st.m[0] = st.m[1] = -INFINITY;
	st.l[0] = st.l[1] = 0.0f;
	st.unit = 0.0f;
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			st.acc[mt][i] = 0.0f;

	/* Slots are read two chunks ahead (a dependent load off the critical
	 * path); 8-bit formats also load a sealed chunk while the previous one
	 * is computed (two register buffers: twice the bytes in flight). */
	const uint32_t us = n_sealed_blk * l.B / DEC_CHUNK < u1 ? n_sealed_blk * l.B / DEC_CHUNK : u1;
	uint32_t u = u0 + warp;
	if constexpr (fmt<KF>::bits == 8 && fmt<VF>::bits == 8) {
		if (u < us) {
			dec_raw<KF, VF, D, false> A, B;
			uint32_t sa = dec_slot(a, s, u, us, n_sealed_blk), sb = dec_slot(a, s, u + DEC_WARPS, us, n_sealed_blk);
			dec_load_sealed(a, A, sa, u, h, s.n);
			for (;;) {
				const uint32_t sc = dec_slot(a, s, u + 2 * DEC_WARPS, us, n_sealed_blk);
				dec_load_sealed(a, B, sb, u + DEC_WARPS, h, s.n);
				if (sa != DEC_NOSLOT)
					dec_compute<KF, VF, D, ACT, false>(st, A, u * DEC_CHUNK, qf, lim, sl2);
				u += DEC_WARPS;
				if (u >= us)
					break;
				const uint32_t sd = dec_slot(a, s, u + 2 * DEC_WARPS, us, n_sealed_blk);
				dec_load_sealed(a, A, sc, u + DEC_WARPS, h, s.n);
				if (sb != DEC_NOSLOT)
					dec_compute<KF, VF, D, ACT, false>(st, B, u * DEC_CHUNK, qf, lim, sl2);
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
		const uint32_t t0 = u * DEC_CHUNK, tb = t0 % l.B;
		if (!(sl >> 31)) {
			dec_raw<KF, VF, D, false> r;
			dec_load_sealed(a, r, sl, u, h, s.n);
			dec_compute<KF, VF, D, ACT, false>(st, r, t0, qf, lim, sl2);
		} else {
			const uint8_t *oh = open_head(l, a.base, sl & 0x7fffffffu, h);
			dec_raw<OF, OF, D, true> r;
			dec_load(r, oh, oh + (size_t)l.B * D * 2, NULL, NULL, l.B, tb, t0, s.n);
			dec_compute<OF, OF, D, ACT, true>(st, r, t0, qf, lim, sl2);
		}
	}

	/* ---- the warps' (m, l, o) through shared memory */
#pragma unroll
	for (int j = 0; j < 2; j++) {
		float x = st.l[j];
		x += __shfl_xor_sync(0xffffffffu, x, 4);
		x += __shfl_xor_sync(0xffffffffu, x, 8);
		x += __shfl_xor_sync(0xffffffffu, x, 16);
		if (qn == 0) {
			sm_m[warp][2 * qc + j] = st.m[j];
			sm_l[warp][2 * qc + j] = x;
		}
	}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			sm_o[warp][2 * qc + (i & 1)][mt * 16 + qn + 8 * (i >> 1)] = st.acc[mt][i] * st.unit;
	__syncthreads();

	for (uint32_t idx = threadIdx.x; idx < nr * D; idx += DEC_WARPS * 32) {
		const uint32_t r = idx / D, d = idx % D;
		float M = -INFINITY;
#pragma unroll
		for (int w = 0; w < DEC_WARPS; w++)
			M = fmaxf(M, sm_m[w][r]);
		float o = 0.0f, L = 0.0f;
		if (M != -INFINITY)
#pragma unroll
			for (int w = 0; w < DEC_WARPS; w++) {
				const float f = exp2f(sm_m[w][r] - M);
				o += f * sm_o[w][r][d];
				L += f * sm_l[w][r];
			}
		const size_t row = (size_t)(s.q_row0 + r / g) * a.q_heads + h * g + r % g;
		if (a.splits == 1) {
			store_out(a.out_dtype, a.out, row * D + d, L > 0.0f ? o / L : 0.0f);
		} else {
			float *w = a.ws + ((size_t)blockIdx.x * a.total_q * a.q_heads + row) * (D + 2);
			w[d] = o;
			if (d == 0) {
				w[D] = M == -INFINITY ? -INFINITY : M * 0.6931471805599453f;
				w[D + 1] = L;
			}
		}
	}
}

/* CTAs of one instance that fit on a multiprocessor (0 on error). */
template <int KF, int VF, int D, int ACT> int decode_occupancy(void)
{
	static int n;

	if (!n && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<KF, VF, D, ACT>, DEC_WARPS * 32,
								 0) != cudaSuccess)
		n = 0;
	return n;
}

template <int KF, int VF, int D, int ACT> int decode_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	decode_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H, nseq), DEC_WARPS * 32, 0, (cudaStream_t)stream>>>(a);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	if (a.splits > 1) {
		merge_kernel<D><<<dim3(a.max_q, a.q_heads, nseq), D, 0, (cudaStream_t)stream>>>(
			a.seqs, a.ws, a.out, a.out_dtype, a.splits, a.total_q, a.q_heads);
		if (cudaPeekAtLastError() != cudaSuccess)
			return fail_launch();
	}
	return 0;
}

} /* namespace kvq */

#endif
