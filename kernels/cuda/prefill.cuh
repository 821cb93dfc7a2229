/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prefill attention: many query rows per KV head over paged KV as stored,
 * blocks of a multiple of 32 tokens, the pairs of KVQ_CUDA_FAST_PAIRS.
 * dispatch.cu picks it for a step of more than 8 query rows per KV head.
 *
 * One CTA per (KV split, KV head and chunk of query rows, sequence), one
 * or two m-tiles of 16 rows per warp in the MMA's M dimension (S = Q·Kᵀ,
 * O = P·V, the FlashAttention-2 arrangement: the score accumulator is the A
 * fragment of the PV MMA as it stands; with two, each K/V fragment read
 * from shared memory feeds both, and Q's fragments come from shared memory
 * per k-step; pf_traits::MT says where).  The rows of a KV head are its
 * GQA group times the query tokens, so every K/V tile a CTA brings in
 * serves them all.
 * FP16/BF16 pools run 4 warps per CTA and two CTAs per multiprocessor (one
 * CTA's copies and barrier overlap the other's MMAs), the formats converted
 * one CTA of 8 warps (pf_traits::CTAS).
 *
 * KV goes in tiles of PF_TILE tokens (two 32-token segments, each inside
 * one block), double-buffered in shared memory as FP16/BF16: a tile's codes
 * and parameters are copied in asynchronously (cp.async) while the previous
 * tile is computed, then converted once into the buffers the MMAs read
 * (K as [token][dim], V as [dim][token], which is how a sealed slice keeps
 * V); a sealed FP16/BF16 slice in the pool's activation type is copied
 * straight into them.  Scores stay as exact as the CPU's fp32: K with a
 * per-token scale (int8, fp8) goes in as its codes, exact in FP16/BF16, and
 * the scale multiplies the score after the MMA; other K (int4's groups,
 * KIVI's channels) is dequantized in fp32 and split into a high and a low
 * FP16/BF16 part, two MMAs.  V is dequantized (one rounding per value).
 * Open segments are read as they are, tokens past the sequence zeroed.  Fragments come from shared memory by
 * ldmatrix (rows padded by 16 bytes: no bank conflicts).  The causal mask
 * is applied only to tiles that reach past the chunk's first query.
 * Online softmax in fp32 (sm_state), log2 units; split-KV partials are
 * merged by merge_kernel.
 */
#ifndef KVQ_CUDA_PREFILL_CUH
#define KVQ_CUDA_PREFILL_CUH

#include "convert.cuh"
#include "mma.cuh"
#include "state.cuh"

namespace kvq {

#define PF_TILE 64u               /* tokens per tile: two segments */
#define PF_SEG 32u                /* tokens per segment: B is a multiple */

/* What one (K format, V format, head dim, dtype) needs: sizes in bytes. */
template <int KF, int VF, int D, int ACT> struct pf_traits {
	typedef fmt<KF> KT;
	typedef fmt<VF> VT;
	static constexpr int KB = KT::bits, VB = VT::bits, KK = KT::kind_k, VK = VT::kind_v;
	static constexpr int NATIVE = ACT == KVQ_DT_F16 ? KVQ_CODE_F16 : KVQ_CODE_BF16;
	/* sealed parts copied as they are (no parameters, the activation's code) */
	static constexpr bool KNAT = KK == KVQ_PARAM_NONE && KT::code == NATIVE;
	static constexpr bool VNAT = VK == KVQ_PARAM_NONE && VT::code == NATIVE;
	/* K as codes, its per-token scale on the scores; or K in two parts */
	static constexpr bool KEXACT = KK == KVQ_PARAM_TOKEN;
	static constexpr bool KSPLIT = !KNAT && !KEXACT;
	static constexpr uint32_t KS = D + 8, VS = PF_TILE + 8;   /* row strides of the MMA buffers (elements) */
	static constexpr uint32_t KROW = D * KB / 8;               /* bytes of one token's K codes */
	static constexpr uint32_t VSEG = PF_SEG * VB / 8;          /* bytes of one dim's V codes in a segment */
	/* groups along D (int4g128 at D = 64 has an instance that never launches) */
	static constexpr uint32_t KNG = KK == KVQ_PARAM_GROUP && D >= KT::group_k ? D / KT::group_k : 1;
	static constexpr uint32_t VNG = VK == KVQ_PARAM_GROUP && D >= VT::group_v ? D / VT::group_v : 1;
	/* parameter bytes of one segment */
	static constexpr uint32_t KPB = KK == KVQ_PARAM_TOKEN ? PF_SEG * 2
				      : KK == KVQ_PARAM_GROUP ? PF_SEG * KNG * 4
				      : KK == KVQ_PARAM_CHANNEL ? D * 4 : 0;
	static constexpr uint32_t VPB = VK == KVQ_PARAM_TOKEN ? PF_SEG * 2 : VK == KVQ_PARAM_GROUP ? VNG * PF_SEG * 4 : 0;
	/* shared memory: two MMA buffers of K and V, of K's low part or K's
	 * scales, then the staged codes and parameters, then Q (MT = 2) */
	static constexpr uint32_t K_BUF = PF_TILE * KS * 2, V_BUF = D * VS * 2;
	static constexpr uint32_t O_V = 2 * K_BUF;
	static constexpr uint32_t O_KLO = 2 * (K_BUF + V_BUF);
	static constexpr uint32_t O_KSC = O_KLO + (KSPLIT ? 2 * K_BUF : 0);   /* KEXACT: fp16 scales [2][PF_TILE] */
	static constexpr uint32_t O_KST = O_KSC + (KEXACT ? 2 * PF_TILE * 2 : 0);
	static constexpr uint32_t O_VST = O_KST + (KNAT ? 0 : PF_TILE * KROW);
	static constexpr uint32_t O_KP = O_VST + (VNAT ? 0 : D * 2 * VSEG);
	static constexpr uint32_t O_VP = O_KP + 2 * KPB;
	static constexpr uint32_t O_Q = O_VP + 2 * VPB;
	/* m-tiles of 16 query rows per warp.  Two, with Q's fragments read
	 * from shared memory per k-step (in registers they would not fit
	 * beside two m-tiles' accumulators), where the tiles are converted
	 * (each conversion then serves twice the rows) or D = 64; one, with
	 * Q's fragments held in registers, for FP16/BF16 pools read as they
	 * are at D = 128, where two were slower (254 registers and spills;
	 * bench/RESULTS.md, 2026-12-04) */
	static constexpr int MT = KNAT && VNAT && D >= 128 ? 1 : 2;
	static constexpr uint32_t Q_WARP = MT == 2 ? 16 * MT * KS * 2 : 0;
	static constexpr uint32_t SMEM2 = O_Q + 4 * Q_WARP;   /* at two CTAs of 4 warps */
	/* warps per CTA and CTAs per multiprocessor: two CTAs of 4 warps where
	 * no tile needs the conversion pass and two fit (228 KiB of shared
	 * memory, 1 KiB of it reserved per CTA), else one of 8; two CTAs were
	 * faster for f16 but slower at D = 128 for the formats converted
	 * (bench/RESULTS.md, 2026-12-02 and 2026-12-04) */
	static constexpr int CTAS = KNAT && VNAT && 2 * (SMEM2 + 1024) <= 228 * 1024 ? 2 : 1;
	static constexpr int WARPS = CTAS == 2 ? 4 : 8, THREADS = WARPS * 32, ROWS = WARPS * 16 * MT;
	static constexpr uint32_t SMEM = O_Q + WARPS * Q_WARP;
	static_assert(KROW % 16 == 0 && (VSEG % 16 == 0 || VSEG == 8), "copy units");
	static_assert(KPB % 16 == 0 && VPB % 16 == 0, "parameter copy units");
	static_assert(KK != KVQ_PARAM_GROUP || KT::group_k % 8 == 0, "a dequantized run of 8 dims has one K group");
};

#define PF_NONE 0    /* a segment with nothing to read: zeros, masked */
#define PF_SEALED 1
#define PF_OPEN 2

/* A tile's two segments: what each is and where its head slice starts. */
struct pf_tile {
	const uint8_t *hs[2];
	uint32_t tb[2];
	int kind[2];
	bool bad;   /* a segment with tokens to read but no valid block */
};

__device__ __forceinline__ pf_tile pf_tile_of(const attn_args &a, const kvq_seq_table &s, uint32_t h, uint32_t t0,
					      uint32_t kv_end, uint32_t n_sealed_blk)
{
	const layer_dev &l = a.l;
	pf_tile x;
	x.bad = false;
#pragma unroll
	for (int g = 0; g < 2; g++) {
		const uint32_t t = t0 + g * PF_SEG, blk = t / l.B;
		x.tb[g] = t % l.B;
		x.kind[g] = PF_NONE;
		x.hs[g] = NULL;
		if (t >= kv_end)
			continue;
		const bool sink = blk == 0 && s.sink;   /* read as an open block */
		const bool sealed = !sink && blk < n_sealed_blk;
		const int32_t id = block_id(l, s, blk, n_sealed_blk, sink, sealed);
		if (id < 0) {
			x.bad = true;
			continue;
		}
		x.kind[g] = sealed ? PF_SEALED : PF_OPEN;
		x.hs[g] = sealed ? sealed_head(l, a.base, (uint32_t)id, h) : open_head(l, a.base, (uint32_t)id, h);
	}
	return x;
}

/* Whether a tile needs the dequantizing pass after its copies. */
template <class TR> __device__ __forceinline__ bool pf_needs_pass(const pf_tile &x)
{
	return x.kind[0] != PF_SEALED || x.kind[1] != PF_SEALED || !TR::KNAT || !TR::VNAT;
}

/* The asynchronous copies of a tile's sealed segments: codes of the
 * activation's type into the MMA buffers, others and parameters into the
 * staging area. */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void pf_issue(const attn_args &a, const pf_tile &x, uint8_t *smem, uint32_t buf)
{
	typedef pf_traits<KF, VF, D, ACT> TR;
	const layer_dev &l = a.l;
	const uint32_t tid = threadIdx.x;
	uint16_t *Kb = reinterpret_cast<uint16_t *>(smem + buf * TR::K_BUF);
	uint16_t *Vb = reinterpret_cast<uint16_t *>(smem + TR::O_V + buf * TR::V_BUF);

#pragma unroll
	for (int g = 0; g < 2; g++) {
		if (x.kind[g] != PF_SEALED)
			continue;
		const uint8_t *hs = x.hs[g];
		const uint32_t tb = x.tb[g];
		const uint8_t *kc = hs + l.off[KVQ_K_CODES], *vc = hs + l.off[KVQ_V_CODES];
		constexpr uint32_t UK = TR::KROW / 16;
		for (uint32_t i = tid; i < PF_SEG * UK; i += TR::THREADS) {
			const uint32_t t = i / UK, u = i % UK;
			void *dst = TR::KNAT ? (void *)(Kb + (g * PF_SEG + t) * TR::KS + u * 8)
					     : (void *)(smem + TR::O_KST + (g * PF_SEG + t) * TR::KROW + u * 16);
			cp_async16(dst, kc + (size_t)(tb + t) * TR::KROW + u * 16);
		}
		if constexpr (TR::VSEG >= 16) {
			constexpr uint32_t UV = TR::VSEG / 16;
			for (uint32_t i = tid; i < D * UV; i += TR::THREADS) {
				const uint32_t d = i / UV, u = i % UV;
				void *dst = TR::VNAT ? (void *)(Vb + d * TR::VS + g * PF_SEG + u * 8)
						     : (void *)(smem + TR::O_VST + d * 2 * TR::VSEG + g * TR::VSEG + u * 16);
				cp_async16(dst, vc + ((size_t)d * l.B + tb) * TR::VB / 8 + u * 16);
			}
		} else {
			for (uint32_t d = tid; d < D; d += TR::THREADS)
				cp_async8(smem + TR::O_VST + d * 2 * TR::VSEG + g * TR::VSEG,
					  vc + ((size_t)d * l.B + tb) * TR::VB / 8);
		}
		if constexpr (TR::KPB > 0) {
			const uint8_t *kp = hs + l.off[KVQ_K_PARAMS] +
					    (TR::KK == KVQ_PARAM_TOKEN ? tb * 2 : TR::KK == KVQ_PARAM_GROUP ? tb * TR::KNG * 4 : 0);
			for (uint32_t i = tid; i < TR::KPB / 16; i += TR::THREADS)
				cp_async16(smem + TR::O_KP + g * TR::KPB + i * 16, kp + i * 16);
		}
		if constexpr (TR::VK == KVQ_PARAM_TOKEN) {
			for (uint32_t i = tid; i < TR::VPB / 16; i += TR::THREADS)
				cp_async16(smem + TR::O_VP + g * TR::VPB + i * 16, hs + l.off[KVQ_V_PARAMS] + tb * 2 + i * 16);
		} else if constexpr (TR::VK == KVQ_PARAM_GROUP) {
			/* {s, z}[group][token]: one run of PF_SEG entries per group */
			for (uint32_t i = tid; i < TR::VPB / 16; i += TR::THREADS) {
				const uint32_t gi = i / (PF_SEG * 4 / 16), u = i % (PF_SEG * 4 / 16);
				cp_async16(smem + TR::O_VP + g * TR::VPB + i * 16,
					   hs + l.off[KVQ_V_PARAMS] + ((size_t)gi * l.B + tb) * 4 + u * 16);
			}
		}
	}
}

__device__ __forceinline__ float pf_half(const uint8_t *p)
{
	return __half2float(*reinterpret_cast<const __half *>(p));
}

/* The product of two FP16 pairs, each rounded once. */
__device__ __forceinline__ uint32_t pf_mul2(uint32_t a, uint32_t b)
{
	__half2 h = __hmul2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b));
	return *reinterpret_cast<uint32_t *>(&h);
}

/* Eight codes of BITS bits starting at p (aligned to their size), as words. */
template <int BITS> __device__ __forceinline__ void pf_codes8(uint32_t (&w)[4], const uint8_t *p)
{
	if constexpr (BITS == 16) {
		const uint4 v = *reinterpret_cast<const uint4 *>(p);
		w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
	} else if constexpr (BITS == 8) {
		const uint2 v = *reinterpret_cast<const uint2 *>(p);
		w[0] = v.x, w[1] = v.y;
	} else if constexpr (BITS == 4) {
		w[0] = *reinterpret_cast<const uint32_t *>(p);
	} else {
		w[0] = *reinterpret_cast<const unsigned short *>(p);
	}
}

template <int BITS> __device__ __forceinline__ uint32_t pf_code(const uint32_t (&w)[4], int k)
{
	return (w[k * BITS / 32] >> (k * BITS % 32)) & (BITS == 16 ? 0xffffu : (1u << BITS) - 1u);
}

/* The pass after the copies: staged codes dequantized into the MMA
 * buffers, open segments read, empty ones zeroed. */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void pf_pass(const attn_args &a, const pf_tile &x, uint8_t *smem, uint32_t buf,
					uint32_t t0, uint32_t n)
{
	typedef pf_traits<KF, VF, D, ACT> TR;
	typedef typename TR::KT KT;
	typedef typename TR::VT VT;
	typedef act<ACT> AT;
	const layer_dev &l = a.l;
	const uint32_t tid = threadIdx.x;
	uint16_t *Kb = reinterpret_cast<uint16_t *>(smem + buf * TR::K_BUF);
	uint16_t *Vb = reinterpret_cast<uint16_t *>(smem + TR::O_V + buf * TR::V_BUF);
	uint16_t *Kl = reinterpret_cast<uint16_t *>(smem + TR::O_KLO + buf * TR::K_BUF);
	uint16_t *Ks = reinterpret_cast<uint16_t *>(smem + TR::O_KSC + buf * PF_TILE * 2);

#pragma unroll
	for (int g = 0; g < 2; g++) {
		const int kind = x.kind[g];
		if (kind == PF_SEALED && TR::KNAT && TR::VNAT)
			continue;
		const uint32_t tb = x.tb[g], tg = t0 + g * PF_SEG;
		const uint16_t *ok = kind == PF_OPEN ? reinterpret_cast<const uint16_t *>(x.hs[g]) : NULL;
		const uint16_t *ov = ok ? ok + (size_t)l.B * D : NULL;
		/* K: token t, dims [8c, 8c + 8) */
		if (kind != PF_SEALED || !TR::KNAT)
			for (uint32_t i = tid; i < PF_SEG * D / 8; i += TR::THREADS) {
				const uint32_t t = i / (D / 8), d0 = (i % (D / 8)) * 8;
				uint4 y = make_uint4(0, 0, 0, 0), ylo = make_uint4(0, 0, 0, 0);
				if (kind == PF_OPEN && tg + t < n) {
					y = __ldg(reinterpret_cast<const uint4 *>(ok + (size_t)(tb + t) * D + d0));
				} else if (kind == PF_SEALED) {
					uint32_t w[4];
					pf_codes8<TR::KB>(w, smem + TR::O_KST + (g * PF_SEG + t) * TR::KROW + d0 * TR::KB / 8);
					if constexpr (TR::KEXACT && TR::KB == 8) {
						dec_cvt<KF, ACT>::four(w[0], y.x, y.y);
						dec_cvt<KF, ACT>::four(w[1], y.z, y.w);
					} else {
						const uint8_t *kp = smem + TR::O_KP + g * TR::KPB;
						float v[8], lo[8];
#pragma unroll
						for (int k = 0; k < 8; k++) {
							float r = KT::raw(pf_code<TR::KB>(w, k));
							if constexpr (TR::KK == KVQ_PARAM_GROUP) {
								const uint8_t *e = kp + (t * TR::KNG + d0 * TR::KNG / D) * 4;
								r = r * pf_half(e) + pf_half(e + 2);
							} else if constexpr (TR::KK == KVQ_PARAM_CHANNEL) {
								r = r * pf_half(kp + (d0 + k) * 4) + pf_half(kp + (d0 + k) * 4 + 2);
							}
							v[k] = AT::to_f(AT::from_f(r));
							lo[k] = r - v[k];
						}
						y = make_uint4(AT::pack(v[0], v[1]), AT::pack(v[2], v[3]), AT::pack(v[4], v[5]),
							       AT::pack(v[6], v[7]));
						ylo = make_uint4(AT::pack(lo[0], lo[1]), AT::pack(lo[2], lo[3]),
								 AT::pack(lo[4], lo[5]), AT::pack(lo[6], lo[7]));
					}
				}
				*reinterpret_cast<uint4 *>(Kb + (g * PF_SEG + t) * TR::KS + d0) = y;
				if constexpr (TR::KSPLIT)
					*reinterpret_cast<uint4 *>(Kl + (g * PF_SEG + t) * TR::KS + d0) = ylo;
			}
		/* K's scales for the scores of this buffer (a segment not sealed: ones) */
		if constexpr (TR::KEXACT)
			if (tid < PF_SEG)
				Ks[g * PF_SEG + tid] = kind == PF_SEALED
					? *reinterpret_cast<const unsigned short *>(smem + TR::O_KP + g * TR::KPB + tid * 2)
					: (unsigned short)0x3c00u;
		/* V: dim d, tokens [8c, 8c + 8) of the segment */
		if (kind != PF_SEALED || !TR::VNAT)
			for (uint32_t i = tid; i < D * (PF_SEG / 8); i += TR::THREADS) {
				const uint32_t d = i / (PF_SEG / 8), c0 = (i % (PF_SEG / 8)) * 8;
				float v[8];
				if (kind == PF_OPEN) {
#pragma unroll
					for (int k = 0; k < 8; k++)
						v[k] = tg + c0 + k < n ? AT::to_f(reinterpret_cast<const typename AT::T *>(ov)
										  [(size_t)(tb + c0 + k) * D + d])
								       : 0.0f;
				} else if (kind == PF_SEALED) {
					if constexpr (TR::VK == KVQ_PARAM_TOKEN && TR::VB == 8 && ACT == KVQ_DT_F16) {
						/* codes to exact pairs, times their scales: one rounding each */
						uint32_t w[4], c[4];
						pf_codes8<TR::VB>(w, smem + TR::O_VST + d * 2 * TR::VSEG + g * TR::VSEG + c0);
						dec_cvt<VF, ACT>::four(w[0], c[0], c[1]);
						dec_cvt<VF, ACT>::four(w[1], c[2], c[3]);
						const uint4 sc = *reinterpret_cast<const uint4 *>(smem + TR::O_VP + g * TR::VPB + c0 * 2);
						*reinterpret_cast<uint4 *>(Vb + d * TR::VS + g * PF_SEG + c0) =
							make_uint4(pf_mul2(c[0], sc.x), pf_mul2(c[1], sc.y), pf_mul2(c[2], sc.z),
								   pf_mul2(c[3], sc.w));
						continue;
					}
					uint32_t w[4];
					pf_codes8<TR::VB>(w, smem + TR::O_VST + d * 2 * TR::VSEG + g * TR::VSEG + c0 * TR::VB / 8);
					const uint8_t *vp = smem + TR::O_VP + g * TR::VPB;
#pragma unroll
					for (int k = 0; k < 8; k++) {
						float r = VT::raw(pf_code<TR::VB>(w, k));
						if constexpr (TR::VK == KVQ_PARAM_TOKEN) {
							r *= pf_half(vp + (c0 + k) * 2);
						} else if constexpr (TR::VK == KVQ_PARAM_GROUP) {
							const uint8_t *e = vp + ((d * TR::VNG / D) * PF_SEG + c0 + k) * 4;
							r = r * pf_half(e) + pf_half(e + 2);
						}
						v[k] = r;
					}
				} else {
#pragma unroll
					for (int k = 0; k < 8; k++)
						v[k] = 0.0f;
				}
				*reinterpret_cast<uint4 *>(Vb + d * TR::VS + g * PF_SEG + c0) =
					make_uint4(AT::pack(v[0], v[1]), AT::pack(v[2], v[3]), AT::pack(v[4], v[5]),
						   AT::pack(v[6], v[7]));
			}
	}
}

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__((pf_traits<KF, VF, D, ACT>::THREADS), (pf_traits<KF, VF, D, ACT>::CTAS))
prefill_kernel(attn_args a)
{
	typedef pf_traits<KF, VF, D, ACT> TR;
	typedef act<ACT> AT;
	constexpr int NK = D / 16, NO = D / 8, MT = TR::MT;   /* k-steps of QKᵀ; dim n-tiles of PV; m-tiles */
	extern __shared__ __align__(16) uint8_t smem[];

	const layer_dev &l = a.l;
	const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, qn = lane >> 2, qc = lane & 3;
	const kvq_seq_table s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks, g = a.g;
	const uint32_t rows = s.m * g, r0 = chunk * TR::ROWS;
	if (r0 >= rows || s.m > s.n)
		return;
	const uint32_t nr = rows - r0 < TR::ROWS ? rows - r0 : TR::ROWS;
	const uint32_t qpos0 = s.n - s.m;
	const uint32_t kv_end = qpos0 + (r0 + nr - 1) / g + 1, pos_first = qpos0 + r0 / g;
	const uint32_t ntiles = (kv_end + PF_TILE - 1) / PF_TILE, per = (ntiles + a.splits - 1) / a.splits;
	const uint32_t tile0 = blockIdx.x * per, tile1 = tile0 + per < ntiles ? tile0 + per : ntiles;
	const uint32_t n_sealed_blk = split_of(l, s.n) / l.B;
	/* a row of the CTA: its output row (query token times q_heads plus head) */
#define PF_OROW(R) ((size_t)(s.row0 + (R) / g) * a.q_heads + h * g + (R) % g)

	/* Q: with one m-tile, A fragments in registers (k-step k: dims 16k +
	 * 2qc, +1, +8, +9 of rows qn and qn + 8); with two, its rows in shared
	 * memory (rows past the step zero), read back as A fragments per
	 * k-step, ordered by the first barrier below */
	uint32_t qreg[MT == 1 ? NK : 1][4];
	uint16_t *Qs = reinterpret_cast<uint16_t *>(smem + TR::O_Q);
	if constexpr (MT == 1) {
		const uint32_t *q32 = reinterpret_cast<const uint32_t *>(a.q);
#pragma unroll
		for (int j = 0; j < 2; j++) {
			const uint32_t r = warp * 16 + qn + 8 * j;
			const size_t w = r < nr ? PF_OROW(r0 + r) * D / 2 + qc : 0;
#pragma unroll
			for (int k = 0; k < NK; k++)
#pragma unroll
				for (int hi = 0; hi < 2; hi++)
					qreg[k][2 * hi + j] = r < nr ? __ldg(q32 + w + 8 * k + 4 * hi) : 0u;
		}
	} else {
		for (uint32_t i = tid; i < TR::ROWS * (D / 8); i += TR::THREADS) {
			const uint32_t r = i / (D / 8), c = i % (D / 8);
			uint4 y = make_uint4(0, 0, 0, 0);
			if (r < nr) {   /* words: q need not be 16-byte aligned */
				const uint32_t *q = reinterpret_cast<const uint32_t *>(a.q) + (PF_OROW(r0 + r) * D + 8 * c) / 2;
				y = make_uint4(__ldg(q), __ldg(q + 1), __ldg(q + 2), __ldg(q + 3));
			}
			*reinterpret_cast<uint4 *>(Qs + r * TR::KS + 8 * c) = y;
		}
	}
	/* this thread's rows: m-tile mt's qn and qn + 8; their positions */
	uint32_t pos[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int j = 0; j < 2; j++)
			pos[mt][j] = qpos0 + (r0 + (warp * MT + mt) * 16 + qn + 8 * j) / g;
	const float sl2 = a.scale * KVQ_LOG2E;
	sm_state st[MT][2];
	float o[MT][NO][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
		st[mt][0].init();
		st[mt][1].init();
#pragma unroll
		for (int n = 0; n < NO; n++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				o[mt][n][i] = 0.0f;
	}

	pf_tile cur = pf_tile_of(a, s, h, tile0 * PF_TILE, kv_end, n_sealed_blk);
	if (tile0 < tile1) {
		pf_issue<KF, VF, D, ACT>(a, cur, smem, 0);
		cp_async_wait();
		__syncthreads();
		if (pf_needs_pass<TR>(cur)) {
			pf_pass<KF, VF, D, ACT>(a, cur, smem, 0, tile0 * PF_TILE, s.n);
			__syncthreads();
		}
	}
	/* lane's row address within an ldmatrix x4: of B (K and V, two n-tiles
	 * of 8 over a k-step of 16) and of A (Q, a 16 x 16 fragment) */
	const uint32_t lr = 8 * (lane >> 4) + (lane & 7), lc = 8 * ((lane >> 3) & 1);
	const uint32_t ar = (lane & 7) + 8 * ((lane >> 3) & 1), ac = 8 * (lane >> 4);
	const uint16_t *Qw = Qs + (warp * MT * 16 + ar) * TR::KS + ac;
	for (uint32_t tile = tile0; tile < tile1; tile++) {
		const uint32_t buf = (tile - tile0) & 1, nbuf = buf ^ 1, t0 = tile * PF_TILE;
		pf_tile nxt;
		if (tile + 1 < tile1) {
			nxt = pf_tile_of(a, s, h, t0 + PF_TILE, kv_end, n_sealed_blk);
			pf_issue<KF, VF, D, ACT>(a, nxt, smem, nbuf);
		}
		const uint16_t *Kb = reinterpret_cast<const uint16_t *>(smem + buf * TR::K_BUF);
		const uint16_t *Vb = reinterpret_cast<const uint16_t *>(smem + TR::O_V + buf * TR::V_BUF);
		const uint16_t *Kl = reinterpret_cast<const uint16_t *>(smem + TR::O_KLO + buf * TR::K_BUF);

		/* ---- S = Q·Kᵀ: 8 token n-tiles per m-tile */
		float sc[MT][PF_TILE / 8][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int n = 0; n < (int)PF_TILE / 8; n++)
#pragma unroll
				for (int i = 0; i < 4; i++)
					sc[mt][n][i] = 0.0f;
#pragma unroll
		for (int k = 0; k < NK; k++) {
			uint32_t qa[MT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
				if constexpr (MT == 1)
#pragma unroll
					for (int i = 0; i < 4; i++)
						qa[mt][i] = qreg[k][i];
				else
					ldsm_x4(qa[mt], Qw + mt * 16 * TR::KS + 16 * k);
#pragma unroll
			for (int np = 0; np < (int)PF_TILE / 16; np++) {
				uint32_t b[4];
				ldsm_x4(b, Kb + (16 * np + lr) * TR::KS + 16 * k + lc);
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma16816<ACT>(sc[mt][2 * np], qa[mt], b);
					mma16816<ACT>(sc[mt][2 * np + 1], qa[mt], b + 2);
				}
				if constexpr (TR::KSPLIT) {
					ldsm_x4(b, Kl + (16 * np + lr) * TR::KS + 16 * k + lc);
#pragma unroll
					for (int mt = 0; mt < MT; mt++) {
						mma16816<ACT>(sc[mt][2 * np], qa[mt], b);
						mma16816<ACT>(sc[mt][2 * np + 1], qa[mt], b + 2);
					}
				}
			}
		}
		if constexpr (TR::KEXACT)   /* K's per-token scales on the scores */
#pragma unroll
			for (int n = 0; n < (int)PF_TILE / 8; n++) {
				const uint32_t t = 8 * n + 2 * qc;
				const __half2 s2 = *reinterpret_cast<const __half2 *>(smem + TR::O_KSC + buf * PF_TILE * 2 + t * 2);
				const float2 f = __half22float2(s2);
#pragma unroll
				for (int mt = 0; mt < MT; mt++)
					sc[mt][n][0] *= f.x, sc[mt][n][1] *= f.y, sc[mt][n][2] *= f.x, sc[mt][n][3] *= f.y;
			}

		/* ---- scale, mask (tiles that reach past the first query, or
		 * hold a segment without a valid block), online softmax, then
		 * O += P·V per m-tile */
		const bool mask = t0 + PF_TILE - 1 > pos_first || cur.bad;
		uint32_t pa[MT][PF_TILE / 16][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
			for (int n = 0; n < (int)PF_TILE / 8; n++)
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const int j = i >> 1;
					float y = sc[mt][n][i];
					if (mask) {
						const uint32_t t = t0 + 8 * n + 2 * qc + (i & 1);
						if (t > pos[mt][j] || (cur.bad && cur.kind[(8 * n) / PF_SEG] == PF_NONE))
							y = -INFINITY;
					}
					sc[mt][n][i] = y;
					mx[j] = fmaxf(mx[j], y);
				}
			float alpha[2], base[2];
#pragma unroll
			for (int j = 0; j < 2; j++) {
				mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
				mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
				alpha[j] = st[mt][j].raise(mx[j] * sl2);
				base[j] = st[mt][j].base();
			}
			if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
				for (int n = 0; n < NO; n++)
#pragma unroll
					for (int i = 0; i < 4; i++)
						o[mt][n][i] *= alpha[i >> 1];
#pragma unroll
			for (int n = 0; n < (int)PF_TILE / 8; n++) {
				float p[4];
#pragma unroll
				for (int i = 0; i < 4; i++) {
					p[i] = fast_exp2(fmaf(sc[mt][n][i], sl2, -base[i >> 1]));
					st[mt][i >> 1].l += p[i];
				}
				pa[mt][n / 2][2 * (n & 1)] = AT::pack(p[0], p[1]);
				pa[mt][n / 2][2 * (n & 1) + 1] = AT::pack(p[2], p[3]);
			}
		}

		/* ---- O += P·V: k-steps of 16 tokens, dim n-tiles in pairs */
#pragma unroll
		for (int kt = 0; kt < (int)PF_TILE / 16; kt++)
#pragma unroll
			for (int dp = 0; dp < NO / 2; dp++) {
				uint32_t b[4];
				ldsm_x4(b, Vb + (16 * dp + lr) * TR::VS + 16 * kt + lc);
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma16816<ACT>(o[mt][2 * dp], pa[mt][kt], b);
					mma16816<ACT>(o[mt][2 * dp + 1], pa[mt][kt], b + 2);
				}
			}

		if (tile + 1 < tile1) {
			cp_async_wait();
			__syncthreads();
			if (pf_needs_pass<TR>(nxt)) {
				pf_pass<KF, VF, D, ACT>(a, nxt, smem, nbuf, t0 + PF_TILE, s.n);
				__syncthreads();
			}
			cur = nxt;
		}
	}

	/* ---- the rows' sums over the quad, then results or partials */
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int j = 0; j < 2; j++) {
			st[mt][j].l += __shfl_xor_sync(0xffffffffu, st[mt][j].l, 1);
			st[mt][j].l += __shfl_xor_sync(0xffffffffu, st[mt][j].l, 2);
		}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int j = 0; j < 2; j++) {
			const uint32_t r = (warp * MT + mt) * 16 + qn + 8 * j;
			if (r >= nr)
				continue;
			const size_t orow = PF_OROW(r0 + r);
#pragma unroll
			for (int n = 0; n < NO; n++)
#pragma unroll
				for (int i = 0; i < 2; i++)
					emit<D>(a, blockIdx.x, orow, 8 * n + 2 * qc + i, o[mt][n][2 * j + i], st[mt][j]);
		}
#undef PF_OROW
}

/* Query rows per CTA of an instance. */
template <int KF, int VF, int D, int ACT> int prefill_rows(void)
{
	return pf_traits<KF, VF, D, ACT>::ROWS;
}

template <int KF, int VF, int D, int ACT> int prefill_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	constexpr uint32_t bytes = pf_traits<KF, VF, D, ACT>::SMEM;
	static bool raised;   /* the opt-in above 48 KiB, once per instance */

	if (bytes > 48 * 1024 && !smem_opt_in((const void *)prefill_kernel<KF, VF, D, ACT>, (int)bytes, raised))
		return fail_launch();
	prefill_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H * a.chunks, nseq), pf_traits<KF, VF, D, ACT>::THREADS, bytes,
					 (cudaStream_t)stream>>>(a);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
