/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Paged attention over KV as stored, on tensor cores (mma.sync m16n8k16).
 *
 * One CTA per (sequence, KV head, chunk of up to 64 query rows, KV split).
 * Query rows of a KV head are its GQA group times the query tokens; they sit
 * in the MMA's N dimension (8 per tile), tokens and head dims in M:
 * Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ, so a decode step with g ≤ 8 fills whole tiles
 * and the transposed V of a sealed slice is the A operand as stored.
 *
 * Per tile of TT tokens (TT divides B): codes are staged in shared memory as
 * exact FP16/BF16 values (raw codes: scales and zeros stay out of the MMA;
 * a codebook format's centroids, rounded to BF16 with BF16 activations);
 * scores get the per-token K scale after the MMA (per group for int4, whose
 * zero adds Σ_g z·Σ_{c∈g} q_c), KIVI's per-channel K scale goes into q once
 * per tile, split into high and low FP16 parts (plus the bias q·z); probabilities get V's per-token (or
 * per-group) scale before the PV MMA, normalised by the tile's largest scale
 * and 2^14 so FP16 keeps full precision, the accumulator keeping track of
 * that unit.  Online softmax in fp32 (sm_state); split-KV partials are
 * merged by merge_kernel with their log-sum-exp.
 */
#ifndef KVQ_CUDA_ATTENTION_CUH
#define KVQ_CUDA_ATTENTION_CUH

#include "mma.cuh"
#include "state.cuh"

namespace kvq {

#define ATTN_THREADS 128
#define ATTN_MAX_ROWS 64      /* query rows per CTA: 8 MMA n-tiles */


/* Shared memory carve-up (offsets in bytes, each 16-byte aligned). */
struct attn_smem {
	uint32_t qs, qc, ql, ks, vs, ss, kp, vp, qg, kb, vb, al, ls, vu, total;

	__host__ __device__ attn_smem(uint32_t nrp, uint32_t tt, uint32_t D)
	{
		uint32_t o = 0, ng = D / 32;
		auto take = [&o](uint32_t bytes) { uint32_t r = o; o += (bytes + 15u) & ~15u; return r; };
		qs = take(nrp * (D + 8) * 2);
		qc = take(nrp * (D + 8) * 2);
		ql = take(nrp * (D + 8) * 2);
		ks = take(tt * (D + 8) * 2);
		vs = take(D * (tt + 8) * 2);
		ss = take(nrp * (tt + 4) * 4);
		kp = take((tt * ng * 2 > 2 * D ? tt * ng * 2 : 2 * D) * 4);
		vp = take(tt * ng * 2 * 4);
		qg = take(nrp * ng * 4);
		kb = take(nrp * 4);
		vb = take(nrp * ng * 4);
		al = take(nrp * 4);
		ls = take(nrp * 4);
		vu = take(2 * ng * 4);
		total = o;
	}
};

/* Element d of the centroid that code i of a codebook part stands for
 * (cb: the head's codebooks, codebook_of). */
template <unsigned SD>
__device__ __forceinline__ float centroid(const uint16_t *cb, const uint8_t *codes, uint32_t i, uint32_t d)
{
	return half_bits(reinterpret_cast<const uint8_t *>(cb),
			 ((d / SD) * KVQ_CB_CENTROIDS + codes[i]) * SD + d % SD);
}

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(ATTN_THREADS) attn_kernel(attn_args a)
{
	typedef fmt<KF> KT;
	typedef fmt<VF> VT;
	typedef act<ACT> AT;
	constexpr int KK = KT::kind_k, VK = VT::kind_v;
	constexpr uint32_t KG = KT::group_k, VG = VT::group_v;
	constexpr uint32_t NG = D / 32;          /* most parameter groups along D */
	/* groups along D (int4g128 at D = 64 has no instance that launches) */
	constexpr uint32_t KNG = KG && D >= KG ? D / KG : 1, VNG = VG && D >= VG ? D / VG : 1;
	constexpr uint32_t QS = D + 8;           /* row stride of Qs, Qc, Ks (16-bit words) */
	constexpr uint32_t MT = D / 64;          /* dim m-tiles per warp in PV */

	extern __shared__ __align__(16) uint8_t smem[];
	const layer_dev &l = a.l;
	const uint32_t nrp = a.nrp, tt = a.tt, VS = tt + 8, SS = tt + 4, nt_act = nrp / 8;
	const attn_smem sm(nrp, tt, D);
	uint16_t *Qs = reinterpret_cast<uint16_t *>(smem + sm.qs);
	uint16_t *Qc = reinterpret_cast<uint16_t *>(smem + sm.qc);
	uint16_t *Ql = reinterpret_cast<uint16_t *>(smem + sm.ql);
	uint16_t *Ks = reinterpret_cast<uint16_t *>(smem + sm.ks);
	uint16_t *Vs = reinterpret_cast<uint16_t *>(smem + sm.vs);
	float *Ss = reinterpret_cast<float *>(smem + sm.ss);
	float *kp = reinterpret_cast<float *>(smem + sm.kp);
	float *vp = reinterpret_cast<float *>(smem + sm.vp);
	float *qg = reinterpret_cast<float *>(smem + sm.qg);
	float *kb = reinterpret_cast<float *>(smem + sm.kb);
	float *vb = reinterpret_cast<float *>(smem + sm.vb);
	float *al = reinterpret_cast<float *>(smem + sm.al);
	float *ls = reinterpret_cast<float *>(smem + sm.ls);
	float *uold = reinterpret_cast<float *>(smem + sm.vu), *unew = uold + NG;

	const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
	const kvq_seq_table s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks, g = a.g;
	const uint32_t rows = s.m * g, r0 = chunk * nrp;
	if (r0 >= rows || s.m > s.n)
		return;
	const uint32_t nr = rows - r0 < nrp ? rows - r0 : nrp;
	const uint32_t qpos0 = s.n - s.m;                    /* position of query 0 */
	const uint32_t kv_end = qpos0 + (r0 + nr - 1) / g + 1;  /* tokens this chunk sees */
	const uint32_t ntiles = (kv_end + tt - 1) / tt, per = (ntiles + a.splits - 1) / a.splits;
	const uint32_t tile0 = blockIdx.x * per, tile1 = tile0 + per < ntiles ? tile0 + per : ntiles;
	const uint32_t n_sealed_blk = split_of(l, s.n) / l.B;

	/* queries of the chunk; padding rows are zero */
	for (uint32_t i = tid; i < nrp * D; i += ATTN_THREADS) {
		uint32_t r = i / D, d = i % D;
		uint16_t x = 0;
		if (r < nr) {
			uint32_t qi = (r0 + r) / g, j = (r0 + r) % g;
			size_t qix = ((size_t)(s.row0 + qi) * a.q_heads + h * g + j) * D + d;
			x = reinterpret_cast<const uint16_t *>(a.q)[qix];
		}
		Qs[r * QS + d] = x;
	}
	if (tid < NG) {
		uold[tid] = 1.0f;
		unew[tid] = 1.0f;
	}
	__syncthreads();
	if (KK == KVQ_PARAM_GROUP)
		for (uint32_t i = tid; i < nrp * (KNG); i += ATTN_THREADS) {
			uint32_t r = i / (KNG), gi = i % (KNG);
			float sum = 0.0f;
			for (uint32_t d = gi * KG; d < gi * KG + KG; d++)
				sum += AT::to_f(reinterpret_cast<const typename AT::T *>(Qs)[r * QS + d]);
			qg[r * NG + gi] = sum;
		}

	sm_state st;   /* thread r < nrp: row r */
	st.init();
	float acc[MT][8][4];
#pragma unroll
	for (int mi = 0; mi < MT; mi++)
#pragma unroll
		for (int nt = 0; nt < 8; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++)
				acc[mi][nt][i] = 0.0f;

	for (uint32_t tile = tile0; tile < tile1; tile++) {
		const uint32_t t0 = tile * tt, blk = t0 / l.B, tb = t0 % l.B;
		const bool sink = blk == 0 && s.sink;   /* read as an open block */
		const bool sealed = !sink && blk < n_sealed_blk;
		const int32_t id = block_id(l, s, blk, n_sealed_blk, sink, sealed);
		const bool ok = id >= 0;
		const uint32_t nvalid = !ok ? 0 : (kv_end - t0 < tt ? kv_end - t0 : tt);
		const int kk = sealed && ok ? KK : KVQ_PARAM_NONE, vk = sealed && ok ? VK : KVQ_PARAM_NONE;

		if (tid < NG)
			uold[tid] = unew[tid];
		/* ---- stage codes (raw values) and parameters */
		if (sealed && ok) {
			const uint8_t *hs = sealed_head(l, a.base, (uint32_t)id, h);
			const uint8_t *kc = hs + l.off[KVQ_K_CODES], *vc = hs + l.off[KVQ_V_CODES];
			const uint8_t *kpar = hs + l.off[KVQ_K_PARAMS], *vpar = hs + l.off[KVQ_V_PARAMS];
			for (uint32_t i = tid; i < tt * D; i += ATTN_THREADS) {
				uint32_t t = i / D, d = i % D;
				float x = 0.0f;
				if (t < nvalid && KK == KVQ_PARAM_CODEBOOK)
					x = centroid<KT::subdim>(codebook_of(l, a.base, 0, h), kc,
								 kvq_k_elem(tb + t, d / KT::subdim, l.B, D / KT::subdim), d);
				else if (t < nvalid)
					x = KT::raw(code_at<KT::bits>(kc, kvq_k_elem(tb + t, d, l.B, D)));
				reinterpret_cast<typename AT::T *>(Ks)[t * QS + d] = AT::from_f(x);
			}
			for (uint32_t i = tid; i < tt * D; i += ATTN_THREADS) {
				uint32_t d = i / tt, t = i % tt;
				float x = 0.0f;
				if (t < nvalid && VK == KVQ_PARAM_CODEBOOK)
					x = centroid<VT::subdim>(codebook_of(l, a.base, 1, h), vc,
								 kvq_v_elem(tb + t, d / VT::subdim, l.B, D / VT::subdim), d);
				else if (t < nvalid)
					x = VT::raw(code_at<VT::bits>(vc, kvq_v_elem(tb + t, d, l.B, D)));
				reinterpret_cast<typename AT::T *>(Vs)[d * VS + t] = AT::from_f(x);
			}
			if (KK == KVQ_PARAM_TOKEN)
				for (uint32_t t = tid; t < tt; t += ATTN_THREADS)
					kp[t] = half_bits(kpar, tb + t);
			if (KK == KVQ_PARAM_GROUP)
				for (uint32_t i = tid; i < tt * (KNG) * 2; i += ATTN_THREADS) {
					uint32_t t = i / (2 * (KNG)), gi = (i / 2) % (KNG);
					uint32_t e = kvq_param_index(KVQ_PARAM_GROUP, KG, 0, tb + t, gi * KG, l.B, D);
					kp[i] = half_bits(kpar, 2 * e + (i & 1));
				}
			if (KK == KVQ_PARAM_CHANNEL)
				for (uint32_t i = tid; i < 2 * D; i += ATTN_THREADS)
					kp[i] = half_bits(kpar, i);
			if (VK == KVQ_PARAM_TOKEN)
				for (uint32_t t = tid; t < tt; t += ATTN_THREADS)
					vp[t] = t < nvalid ? half_bits(vpar, tb + t) : 0.0f;
			if (VK == KVQ_PARAM_GROUP)
				for (uint32_t i = tid; i < (VNG) * tt * 2; i += ATTN_THREADS) {
					uint32_t gi = i / (2 * tt), t = (i / 2) % tt;
					uint32_t e = kvq_param_index(KVQ_PARAM_GROUP, VG, 1, tb + t, gi * VG, l.B, D);
					vp[i] = t < nvalid ? half_bits(vpar, 2 * e + (i & 1)) : 0.0f;
				}
		} else {
			const uint8_t *oh = ok ? open_head(l, a.base, (uint32_t)id, h) : NULL;
			const uint16_t *krow = reinterpret_cast<const uint16_t *>(oh);
			const uint16_t *vrow = krow ? krow + (size_t)l.B * D : NULL;
			for (uint32_t i = tid; i < tt * D; i += ATTN_THREADS) {
				uint32_t t = i / D, d = i % D;
				Ks[t * QS + d] = t < nvalid ? krow[(tb + t) * D + d] : 0;
			}
			for (uint32_t i = tid; i < tt * D; i += ATTN_THREADS) {
				uint32_t d = i / tt, t = i % tt;
				Vs[d * VS + t] = t < nvalid ? vrow[(tb + t) * D + d] : 0;
			}
		}
		__syncthreads();

		/* ---- per-tile preparation: KIVI's scaled queries, V's unit */
		if (kk == KVQ_PARAM_CHANNEL) {
			for (uint32_t i = tid; i < nrp * D; i += ATTN_THREADS) {
				uint32_t r = i / D, d = i % D;
				/* q·s as a high and a low part: two MMAs keep the score
				 * as exact as the CPU's fp32, outlier tokens included */
				float x = AT::to_f(reinterpret_cast<const typename AT::T *>(Qs)[r * QS + d]) * kp[2 * d];
				typename AT::T hi = AT::from_f(x);
				reinterpret_cast<typename AT::T *>(Qc)[r * QS + d] = hi;
				reinterpret_cast<typename AT::T *>(Ql)[r * QS + d] = AT::from_f(x - AT::to_f(hi));
			}
			for (uint32_t r = tid; r < nrp; r += ATTN_THREADS) {
				float sum = 0.0f;
				for (uint32_t d = 0; d < D; d++)
					sum += AT::to_f(reinterpret_cast<const typename AT::T *>(Qs)[r * QS + d]) *
					       kp[2 * d + 1];
				kb[r] = sum;
			}
		}
		if (tid < NG) {
			/* largest V scale of the group in this tile: probabilities are
			 * multiplied by scale / largest * 2^14 */
			float S = 0.0f;
			if (vk == KVQ_PARAM_TOKEN)
				for (uint32_t t = 0; t < tt; t++)
					S = fmaxf(S, vp[t]);
			else if (vk == KVQ_PARAM_GROUP && tid < VNG)
				for (uint32_t t = 0; t < tt; t++)
					S = fmaxf(S, vp[(tid * tt + t) * 2]);
			if (!(S > 0.0f))
				S = 1.0f;
			unew[tid] = S / ATTN_P_UNIT;
		}
		__syncthreads();

		/* ---- scores: Sᵀ = K·Qᵀ, one (token m-tile, row n-tile) pair per warp turn */
		const uint32_t npairs = (tt / 16) * nt_act;
		for (uint32_t p = warp; p < npairs; p += ATTN_THREADS / 32) {
			const uint32_t m0 = (p / nt_act) * 16, n0 = (p % nt_act) * 8;
			float c[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
			uint32_t fa[4], fb[2];
			const uint32_t tr = m0 + lane / 4, rc = n0 + 2 * (lane % 4);
			if (kk == KVQ_PARAM_GROUP) {
				for (uint32_t gi = 0; gi < KNG; gi++) {
					float cg[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
					for (uint32_t k0 = gi * KG; k0 < gi * KG + KG; k0 += 16) {
						frag_a(fa, Ks, QS, m0, k0);
						frag_b(fb, Qs, QS, n0, k0);
						mma16816<ACT>(cg, fa, fb);
					}
#pragma unroll
					for (int i = 0; i < 4; i++) {
						uint32_t t = tr + (i >= 2 ? 8 : 0), r = rc + (i & 1);
						uint32_t e = (t * (KNG) + gi) * 2;
						c[i] += cg[i] * kp[e] + kp[e + 1] * qg[r * NG + gi];
					}
				}
			} else {
				const uint16_t *qsrc = kk == KVQ_PARAM_CHANNEL ? Qc : Qs;
#pragma unroll
				for (uint32_t k0 = 0; k0 < D; k0 += 16) {
					frag_a(fa, Ks, QS, m0, k0);
					frag_b(fb, qsrc, QS, n0, k0);
					mma16816<ACT>(c, fa, fb);
					if (kk == KVQ_PARAM_CHANNEL) {
						frag_b(fb, Ql, QS, n0, k0);
						mma16816<ACT>(c, fa, fb);
					}
				}
			}
#pragma unroll
			for (int i = 0; i < 4; i++) {
				uint32_t t = tr + (i >= 2 ? 8 : 0), r = rc + (i & 1);
				float x = c[i];
				if (kk == KVQ_PARAM_TOKEN)
					x *= kp[t];
				if (kk == KVQ_PARAM_CHANNEL)
					x += kb[r];
				x *= a.scale * KVQ_LOG2E;
				if (r >= nr || t >= nvalid || t0 + t > qpos0 + (r0 + r) / g)
					x = -INFINITY;
				Ss[r * SS + t] = x;
			}
		}
		__syncthreads();

		/* ---- online softmax, one thread per row */
		if (tid < nrp) {
			const uint32_t r = tid;
			float mx = -INFINITY;
			for (uint32_t t = 0; t < tt; t++)
				mx = fmaxf(mx, Ss[r * SS + t]);
			const float alpha = st.raise(mx), base = st.base();
			float sum = 0.0f;
			for (uint32_t t = 0; t < tt; t++) {
				const float p = fast_exp2(Ss[r * SS + t] - base);
				Ss[r * SS + t] = p;
				sum += p;
			}
			st.l += sum;
			al[r] = alpha;
			if (vk == KVQ_PARAM_GROUP)
				for (uint32_t gi = 0; gi < VNG; gi++) {
					float bsum = 0.0f;
					for (uint32_t t = 0; t < tt; t++)
						bsum += Ss[r * SS + t] * vp[(gi * tt + t) * 2 + 1];
					vb[r * NG + gi] = bsum / unew[gi];
				}
		}
		__syncthreads();

		/* ---- Oᵀ += Vᵀ·Pᵀ: warp w owns dim m-tiles w, w + 4, ... */
#pragma unroll
		for (int mi = 0; mi < MT; mi++) {
			const uint32_t dm0 = (warp + 4 * mi) * 16;
			/* the dims' V group: its unit is tracked across sealed and open tiles */
			const uint32_t gi = VK == KVQ_PARAM_GROUP ? dm0 / (VG ? VG : D) : 0;
			const float ratio = uold[gi] / unew[gi];
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				if (nt >= (int)nt_act)
					break;
#pragma unroll
				for (int i = 0; i < 4; i++)
					acc[mi][nt][i] *= al[nt * 8 + 2 * (lane % 4) + (i & 1)] * ratio;
			}
			for (uint32_t k0 = 0; k0 < tt; k0 += 16) {
				uint32_t fa[4];
				frag_a(fa, Vs, VS, dm0, k0);
				const uint32_t kc = k0 + 2 * (lane % 4);
				float w[4];
#pragma unroll
				for (int j = 0; j < 4; j++) {
					uint32_t t = kc + (j & 1) + (j >= 2 ? 8 : 0);
					float sv = ATTN_P_UNIT;
					if (vk == KVQ_PARAM_TOKEN)
						sv = vp[t] / unew[gi];
					else if (vk == KVQ_PARAM_GROUP)
						sv = vp[(gi * tt + t) * 2] / unew[gi];
					w[j] = sv;
				}
#pragma unroll
				for (int nt = 0; nt < 8; nt++) {
					if (nt >= (int)nt_act)
						break;
					const float *prow = Ss + (nt * 8 + lane / 4) * SS;
					uint32_t fb[2];
					fb[0] = AT::pack(prow[kc] * w[0], prow[kc + 1] * w[1]);
					fb[1] = AT::pack(prow[kc + 8] * w[2], prow[kc + 9] * w[3]);
					mma16816<ACT>(acc[mi][nt], fa, fb);
				}
			}
			if (vk == KVQ_PARAM_GROUP)
#pragma unroll
				for (int nt = 0; nt < 8; nt++) {
					if (nt >= (int)nt_act)
						break;
#pragma unroll
					for (int i = 0; i < 4; i++)
						acc[mi][nt][i] += vb[(nt * 8 + 2 * (lane % 4) + (i & 1)) * NG + gi];
				}
		}
		__syncthreads();
	}

	/* ---- results: normalised rows, or the split's partial (o, m, l) */
	if (tid < nrp) {
		al[tid] = st.m;
		ls[tid] = st.l;
	}
	__syncthreads();
#pragma unroll
	for (int mi = 0; mi < MT; mi++) {
		const uint32_t dm0 = (warp + 4 * mi) * 16;
		const uint32_t gi = VK == KVQ_PARAM_GROUP ? dm0 / (VG ? VG : D) : 0;
		const float unit = unew[gi];   /* the last tile's unit */
#pragma unroll
		for (int nt = 0; nt < 8; nt++) {
			if (nt >= (int)nt_act)
				break;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const uint32_t d = dm0 + lane / 4 + (i >= 2 ? 8 : 0);
				const uint32_t r = nt * 8 + 2 * (lane % 4) + (i & 1);
				if (r >= nr)
					continue;
				const uint32_t qi = (r0 + r) / g, j = (r0 + r) % g;
				const size_t row = (size_t)(s.row0 + qi) * a.q_heads + h * g + j;
				emit<D>(a, blockIdx.x, row, d, acc[mi][nt][i] * unit, sm_state{ al[r], ls[r] });
			}
		}
	}
}

/* Launches one (K format, V format, head dim, dtype) instance (and the
 * merge when the KV range is split).  Explicitly instantiated for the pairs
 * of instances.h, one file per half of the list. */
template <int KF, int VF, int D, int ACT> int attn_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	const attn_smem sm(a.nrp, a.tt, D);
	static bool raised;   /* the opt-in above 48 KiB, once per instance */

	if (sm.total > 48 * 1024 && !smem_opt_in((const void *)attn_kernel<KF, VF, D, ACT>, 160 * 1024, raised))
		return fail_launch();
	attn_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H * a.chunks, nseq), ATTN_THREADS, sm.total,
				      (cudaStream_t)stream>>>(a);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
