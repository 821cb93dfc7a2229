/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decode attention over product-quantized V (pq2, pq1: codebook.h) and K
 * of the same kind or of 8 bits with a per-token scale (int8, fp8), on CUDA
 * cores, for steps of at most 8 query rows per KV head in blocks of
 * a multiple of 32 tokens.  One CTA per (sequence, KV head, PQ_ROWS query
 * rows, KV split); its warps take 32-token chunks in turn, each with its own
 * online-softmax state, merged at the end.
 *
 * K: a table of q·centroid (times the softmax scale, in log2 units) for
 * every (code, subspace, row), fp32 in shared memory [code][subspace][row],
 * built once per CTA: a token's score is the sum of its M entries, no
 * centroid read per token.  Lane t scores token t and visits subspace
 * (t + j) mod M at step j (its codes rotated by t bytes in registers), so
 * the lanes of a phase read different banks.  8-bit K: lane t takes the
 * dot product of token t's codes with q, times its scale.
 * V: the head's centroids in shared memory [code][subspace][d]; lane m owns
 * subspace m (where M < 32, for a share of the chunk's tokens) and adds
 * p · centroid for each token in fp32: one gather of d values per token and
 * subspace, no histogram (a histogram over the codes must be rescaled, all
 * 256 · M counts, whenever a row's maximum rises).
 * The open window's FP16 rows take the same loops, read from the pool.
 */
#ifndef KVQ_CUDA_DECODE_PQ_CUH
#define KVQ_CUDA_DECODE_PQ_CUH

#include "state.cuh"

namespace kvq {

#define PQ_WARPS 8
#define PQ_ROWS 4    /* query rows per CTA */
#define PQ_CHUNK 32  /* tokens per warp turn */

/* Shared memory (bytes): the K table, V's centroids, q, each warp's
 * probabilities; at the end the warps' partials over the first two. */
template <int KF, int VF, int D> struct pq_smem {
	/* K's subspaces (0: K is not a codebook format, no table) and V's */
	static constexpr uint32_t MK = fmt<KF>::kind_k == KVQ_PARAM_CODEBOOK ? D / fmt<KF>::subdim : 0;
	static constexpr uint32_t MV = D / fmt<VF>::subdim;
	static constexpr uint32_t lut = 0, lut_bytes = KVQ_CB_CENTROIDS * MK * PQ_ROWS * 4;
	static constexpr uint32_t cbv = lut + lut_bytes, cbv_bytes = KVQ_CB_CENTROIDS * D * 2;
	static constexpr uint32_t q = cbv + cbv_bytes, q_bytes = PQ_ROWS * D * 4;
	static constexpr uint32_t ps = q + q_bytes, ps_bytes = PQ_WARPS * PQ_CHUNK * PQ_ROWS * 4;
	static constexpr uint32_t total = ps + ps_bytes;
	static constexpr uint32_t part_bytes = PQ_WARPS * PQ_ROWS * (D + 2) * 4;
	static_assert(part_bytes <= lut_bytes + cbv_bytes, "the partials fit over the tables");
};

template <int KF, int VF, int D> constexpr uint32_t pq_smem_bytes(void)
{
	return pq_smem<KF, VF, D>::total;
}

/* Byte j of w (MW words) becomes byte (j + k) mod 4·MW: words by the bits
 * of k / 4, one conditional move each, then bytes by a funnel shift. */
template <uint32_t MW> __device__ __forceinline__ void pq_rotate(uint32_t w[MW], uint32_t k)
{
#pragma unroll
	for (uint32_t s = 1; s < MW; s <<= 1) {
		const bool on = (k >> 2) & s;
		uint32_t t[MW];
#pragma unroll
		for (uint32_t i = 0; i < MW; i++)
			t[i] = on ? w[(i + s) % MW] : w[i];
#pragma unroll
		for (uint32_t i = 0; i < MW; i++)
			w[i] = t[i];
	}
	const uint32_t sh = 8 * (k & 3);
	uint32_t t[MW];
#pragma unroll
	for (uint32_t i = 0; i < MW; i++)
		t[i] = __funnelshift_r(w[i], w[(i + 1) % MW], sh);
#pragma unroll
	for (uint32_t i = 0; i < MW; i++)
		w[i] = t[i];
}

/* N bytes (4, 8, 16 or 32) from p (aligned to min(N, 16)) into w. */
template <uint32_t N> __device__ __forceinline__ void pq_load(uint32_t w[N / 4], const uint8_t *p)
{
	if constexpr (N >= 16) {
#pragma unroll
		for (uint32_t i = 0; i < N / 16; i++) {
			const uint4 v = reinterpret_cast<const uint4 *>(p)[i];
			w[4 * i] = v.x;
			w[4 * i + 1] = v.y;
			w[4 * i + 2] = v.z;
			w[4 * i + 3] = v.w;
		}
	} else if constexpr (N == 8) {
		const uint2 v = *reinterpret_cast<const uint2 *>(p);
		w[0] = v.x;
		w[1] = v.y;
	} else {
		w[0] = *reinterpret_cast<const uint32_t *>(p);
	}
}

/* N 16-bit values (4 or 8, 8- or 16-byte aligned) of dtype DT (FP16: the
 * codebooks; the activations' in the open window) as floats. */
template <uint32_t N, int DT = KVQ_DT_F16> __device__ __forceinline__ void pq_halves(float f[N], const uint16_t *p)
{
	uint32_t w[N / 2];
	pq_load<2 * N>(w, reinterpret_cast<const uint8_t *>(p));
#pragma unroll
	for (uint32_t i = 0; i < N / 2; i++) {
		if (DT == KVQ_DT_BF16) {
			f[2 * i] = __uint_as_float(w[i] << 16);
			f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
		} else {
			const float2 x = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
			f[2 * i] = x.x;
			f[2 * i + 1] = x.y;
		}
	}
}

/* K's table (a codebook format's K): entry (code, m) of row r is
 * Σ_j q[r][m·DK + j] · centroid[m][code][j], q from qf (fp32, [row][D]),
 * the head's codebooks cb; the CTA's threads share the entries, reading
 * the codebooks in their order (coalesced), several loads in flight. */
template <int KF, int D> __device__ void pq_table(float4 *lut, const float *qf, const uint16_t *cb)
{
	constexpr uint32_t DK = fmt<KF>::subdim, MK = D / DK;

#pragma unroll 8
	for (uint32_t i = threadIdx.x; i < KVQ_CB_CENTROIDS * MK; i += PQ_WARPS * 32) {
		const uint32_t m = i / KVQ_CB_CENTROIDS, c = i % KVQ_CB_CENTROIDS;
		float x[DK], e[PQ_ROWS];
		pq_halves<DK>(x, cb + ((size_t)m * KVQ_CB_CENTROIDS + c) * DK);
#pragma unroll
		for (uint32_t r = 0; r < PQ_ROWS; r++) {
			e[r] = 0.0f;
#pragma unroll
			for (uint32_t j = 0; j < DK; j++)
				e[r] += qf[r * D + m * DK + j] * x[j];
		}
		lut[c * MK + m] = make_float4(e[0], e[1], e[2], e[3]);
	}
}

/* What a warp needs of one chunk, read a chunk ahead so that its loads
 * are in flight while the warp works on the one before: the head slice
 * (NULL: a bad id, nothing read), whether it is sealed, and this lane's
 * sealed codes (K of its token, V of its subspace and stream; codebook K
 * only, 8-bit K is read as it is used). */
template <uint32_t KW, uint32_t VW> struct pq_chunk {
	const uint8_t *hs;
	bool sealed;
	uint32_t k[KW], v[VW];
};

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(PQ_WARPS * 32, 1) pq_decode_kernel(attn_args a)
{
	typedef act<ACT> AT;
	typedef pq_smem<KF, VF, D> SM;
	typedef fmt<KF> KT;
	constexpr bool KPQ = KT::kind_k == KVQ_PARAM_CODEBOOK;
	constexpr uint32_t DV = fmt<VF>::subdim, MK = SM::MK, MV = SM::MV;
	constexpr uint32_t MW = KPQ ? MK / 4 : 1;          /* words of a token's K codes */
	constexpr uint32_t TS = 32 / MV, TPL = PQ_CHUNK / TS;   /* V: token streams, tokens per lane */
	static_assert(fmt<VF>::kind_v == KVQ_PARAM_CODEBOOK, "pq V");
	static_assert(KPQ || (KT::kind_k == KVQ_PARAM_TOKEN && KT::bits == 8), "pq K, or 8-bit K by token");
	static_assert((!KPQ || (MK % 4 == 0 && MK <= 32)) && MV <= 32 && 32 % MV == 0 && TPL >= 4, "subspaces");

	extern __shared__ __align__(16) uint8_t smem[];
	float4 *lut = reinterpret_cast<float4 *>(smem + SM::lut);      /* [code][m]: rows 0..3 */
	uint16_t *cbv = reinterpret_cast<uint16_t *>(smem + SM::cbv);  /* [code][m][DV] */
	float *qf = reinterpret_cast<float *>(smem + SM::q);           /* [row][D] */
	float4 *ps = reinterpret_cast<float4 *>(smem + SM::ps);        /* [warp][token]: rows 0..3 */

	const layer_dev &l = a.l;
	const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
	const kvq_seq_table s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks, g = a.g;
	const uint32_t rows = s.m * g, r0 = chunk * PQ_ROWS;
	if (r0 >= rows || s.m > s.n)
		return;
	const uint32_t nr = rows - r0 < PQ_ROWS ? rows - r0 : PQ_ROWS;
	const uint32_t qpos0 = s.n - s.m;
	const uint32_t kv_end = qpos0 + (r0 + nr - 1) / g + 1;   /* tokens this CTA sees */
	const uint32_t nch = (kv_end + PQ_CHUNK - 1) / PQ_CHUNK, per = (nch + a.splits - 1) / a.splits;
	const uint32_t c0 = blockIdx.x * per, c1 = c0 + per < nch ? c0 + per : nch;
	const uint32_t n_sealed_blk = split_of(l, s.n) / l.B;

	/* q in fp32 times scale · log2 e (rotated into K's basis first where
	 * the kernel rotates, a.rot); padding rows zero */
	const float qmul = a.scale * KVQ_LOG2E;
	for (uint32_t i = tid; i < PQ_ROWS * D; i += blockDim.x) {
		const uint32_t r = i / D, d = i % D;
		float x = 0.0f;
		if (r < nr) {
			x = AT::to_f(reinterpret_cast<const typename AT::T *>(a.q)[out_row(a, s, h, r0 + r) * D + d]);
			if (!(a.rot & KVQ_ROT_K))
				x *= qmul;
		}
		qf[i] = x;
	}
	if (a.rot & KVQ_ROT_K) {
		__syncthreads();
		rotate_q_rows<D, ACT>(qf, D, nr, qmul);
	}
	/* V's centroids, [m][code][DV] in the pool, [code][m][DV] here */
	{
		const uint16_t *cb = codebook_of(l, a.base, 1, h);
#pragma unroll 8
		for (uint32_t i = tid; i < KVQ_CB_CENTROIDS * MV; i += PQ_WARPS * 32) {
			const uint32_t m = i / KVQ_CB_CENTROIDS, c = i % KVQ_CB_CENTROIDS;
			const uint16_t *src = cb + ((size_t)m * KVQ_CB_CENTROIDS + c) * DV;
			uint16_t *dst = cbv + ((size_t)c * MV + m) * DV;
			if constexpr (DV == 8)
				*reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
			else
				*reinterpret_cast<uint2 *>(dst) = *reinterpret_cast<const uint2 *>(src);
		}
	}
	__syncthreads();
	if constexpr (KPQ)
		pq_table<KF, D>(lut, qf, codebook_of(l, a.base, 0, h));
	__syncthreads();

	/* the last position each row sees (causal within the step) */
	uint32_t last[PQ_ROWS];
#pragma unroll
	for (uint32_t r = 0; r < PQ_ROWS; r++)
		last[r] = r < nr ? qpos0 + (r0 + r) / g : 0;
	const bool row_ok[PQ_ROWS] = { 0 < nr, 1 < nr, 2 < nr, 3 < nr };
	float mrow[PQ_ROWS], lsum[PQ_ROWS], acc[PQ_ROWS][DV];
#pragma unroll
	for (uint32_t r = 0; r < PQ_ROWS; r++) {
		mrow[r] = -INFINITY;
		lsum[r] = 0.0f;
#pragma unroll
		for (uint32_t j = 0; j < DV; j++)
			acc[r][j] = 0.0f;
	}
	const uint32_t mv = lane % MV, ts = lane / MV;   /* V: this lane's subspace and token stream */
	const uint32_t tl0 = ts * TPL;   /* first token of this lane's V stream, in the chunk */
	typedef pq_chunk<MW, TPL / 4> chunk_t;
	auto fetch = [&](uint32_t c, chunk_t &x) {
		const uint32_t t0 = c * PQ_CHUNK, blk = t0 / l.B, tb = t0 % l.B;
		const bool sink = blk == 0 && s.sink;   /* read as an open block */
		x.sealed = !sink && blk < n_sealed_blk;
		const int32_t id = block_id(l, s, blk, n_sealed_blk, sink, x.sealed);
		x.hs = NULL;
		if (id < 0)
			return;   /* a bad id reads nothing (the others' kernels: zeros) */
		x.hs = x.sealed ? sealed_head(l, a.base, (uint32_t)id, h) : open_head(l, a.base, (uint32_t)id, h);
		if (!x.sealed)
			return;
		if constexpr (KPQ)
			pq_load<4 * MW>(x.k, x.hs + l.off[KVQ_K_CODES] + (size_t)(tb + lane) * MK);
		pq_load<TPL>(x.v, x.hs + l.off[KVQ_V_CODES] + (size_t)mv * l.B + tb + tl0);
	};
	chunk_t next;
	if (c0 + warp < c1)
		fetch(c0 + warp, next);

	for (uint32_t c = c0 + warp; c < c1; c += PQ_WARPS) {
		const uint32_t t0 = c * PQ_CHUNK, tb = t0 % l.B;
		const chunk_t cur = next;
		if (c + PQ_WARPS < c1)
			fetch(c + PQ_WARPS, next);
		if (!cur.hs)
			continue;
		const uint8_t *hs = cur.hs;
		const bool sealed = cur.sealed;

		/* ---- scores of token t0 + lane */
		float sc[PQ_ROWS] = { 0.0f, 0.0f, 0.0f, 0.0f };
		if (sealed) {
			if constexpr (KPQ) {
				uint32_t w[MW];
#pragma unroll
				for (uint32_t i = 0; i < MW; i++)
					w[i] = cur.k[i];
				pq_rotate<MW>(w, lane % MK);
#pragma unroll
				for (uint32_t j = 0; j < MK; j++) {
					const uint32_t code = (w[j / 4] >> (8 * (j % 4))) & 0xffu;
					const float4 e = lut[code * MK + (lane + j) % MK];
					sc[0] += e.x;
					sc[1] += e.y;
					sc[2] += e.z;
					sc[3] += e.w;
				}
			} else {   /* 8-bit codes, a scale per token */
				const uint8_t *kc = hs + l.off[KVQ_K_CODES] + (size_t)(tb + lane) * D;
#pragma unroll 2
				for (uint32_t d = 0; d < D; d += 16) {
					uint32_t w[4];
					pq_load<16>(w, kc + d);
#pragma unroll
					for (uint32_t e = 0; e < 16; e++) {
						const float x = KT::raw((w[e / 4] >> (8 * (e % 4))) & 0xffu);
#pragma unroll
						for (uint32_t r = 0; r < PQ_ROWS; r++)
							sc[r] += qf[r * D + d + e] * x;
					}
				}
				const float sk = half_bits(hs + l.off[KVQ_K_PARAMS], tb + lane);
#pragma unroll
				for (uint32_t r = 0; r < PQ_ROWS; r++)
					sc[r] *= sk;
			}
		} else {
			const uint16_t *kr = reinterpret_cast<const uint16_t *>(hs) + (size_t)(tb + lane) * D;
#pragma unroll 4
			for (uint32_t d = 0; d < D; d += 8) {
				float x[8];
				pq_halves<8, ACT>(x, kr + d);
#pragma unroll
				for (uint32_t r = 0; r < PQ_ROWS; r++)
#pragma unroll
					for (uint32_t j = 0; j < 8; j++)
						sc[r] += qf[r * D + d + j] * x[j];
			}
		}
		/* ---- online softmax: the chunk's maximum per row, then p */
		const uint32_t pos = t0 + lane;
		float p[PQ_ROWS];
#pragma unroll
		for (uint32_t r = 0; r < PQ_ROWS; r++) {
			float x = row_ok[r] && pos <= last[r] ? sc[r] : -INFINITY, mx = x;
#pragma unroll
			for (uint32_t o = 16; o; o >>= 1)
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
			const float m_new = fmaxf(mrow[r], mx), base = m_new == -INFINITY ? 0.0f : m_new;
			const float alpha = fast_exp2(mrow[r] - base);
			mrow[r] = m_new;
			p[r] = fast_exp2(x - base);
			lsum[r] = lsum[r] * alpha + p[r];
#pragma unroll
			for (uint32_t j = 0; j < DV; j++)
				acc[r][j] *= alpha;
		}
		ps[warp * PQ_CHUNK + lane] = make_float4(p[0], p[1], p[2], p[3]);
		__syncwarp();

		/* ---- V: lane (ts, mv) adds its tokens' centroids of subspace mv */
		auto add = [&](uint32_t i, const float v[DV]) {   /* token tl0 + i of the chunk */
			const float4 pt = ps[warp * PQ_CHUNK + tl0 + i];
#pragma unroll
			for (uint32_t j = 0; j < DV; j++) {
				acc[0][j] += pt.x * v[j];
				acc[1][j] += pt.y * v[j];
				acc[2][j] += pt.z * v[j];
				acc[3][j] += pt.w * v[j];
			}
		};
		if (sealed) {
#pragma unroll
			for (uint32_t i = 0; i < TPL; i++) {
				const uint32_t code = (cur.v[i / 4] >> (8 * (i % 4))) & 0xffu;
				float v[DV];
				pq_halves<DV>(v, cbv + ((size_t)code * MV + mv) * DV);
				add(i, v);
			}
		} else {
			/* rows past what the step sees may hold anything: not read */
			const uint16_t *vr = reinterpret_cast<const uint16_t *>(hs) + (size_t)l.B * D;
			for (uint32_t i = 0; i < TPL && t0 + tl0 + i < kv_end; i++) {
				float v[DV];
				pq_halves<DV, ACT>(v, vr + (size_t)(tb + tl0 + i) * D + mv * DV);
				add(i, v);
			}
		}
		__syncwarp();
	}

	/* ---- the warps' partials merged; the result, or the split's partial */
#pragma unroll
	for (uint32_t r = 0; r < PQ_ROWS; r++) {
#pragma unroll
		for (uint32_t o = 16; o; o >>= 1)
			lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], o);
#pragma unroll
		for (uint32_t o = MV; o < 32; o <<= 1)   /* the token streams of one subspace */
#pragma unroll
			for (uint32_t j = 0; j < DV; j++)
				acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
	}
	__syncthreads();   /* every warp is done with the tables */
	float *part = reinterpret_cast<float *>(smem);   /* [warp][row][D], then m and l [warp][row] */
	float *pm = part + PQ_WARPS * PQ_ROWS * D, *pl = pm + PQ_WARPS * PQ_ROWS;
	if (ts == 0)
#pragma unroll
		for (uint32_t r = 0; r < PQ_ROWS; r++)
#pragma unroll
			for (uint32_t j = 0; j < DV; j++)
				part[(warp * PQ_ROWS + r) * D + mv * DV + j] = acc[r][j];
	if (lane < PQ_ROWS) {
		float mm = mrow[0], ll = lsum[0];
#pragma unroll
		for (uint32_t r = 1; r < PQ_ROWS; r++)
			if (lane == r) {
				mm = mrow[r];
				ll = lsum[r];
			}
		pm[warp * PQ_ROWS + lane] = mm;
		pl[warp * PQ_ROWS + lane] = ll;
	}
	__syncthreads();
	/* V rotated back here (a.rot, the range whole): the rows' results
	 * through warp 0's rows of part first */
	const bool rot_out = (a.rot & KVQ_ROT_V) && a.splits == 1;
	constexpr uint32_t PER = (PQ_ROWS * D + PQ_WARPS * 32 - 1) / (PQ_WARPS * 32);
	float y[PER];
#pragma unroll
	for (uint32_t k = 0; k < PER; k++) {
		const uint32_t i = tid + k * PQ_WARPS * 32, r = i / D, d = i % D;
		if (i >= nr * D)
			break;
		sm_state st;
		float o = 0.0f;
		st.init();
		for (uint32_t w = 0; w < PQ_WARPS; w++) {
			float wa, wb;
			st.merge(sm_state{ pm[w * PQ_ROWS + r], pl[w * PQ_ROWS + r] }, &wa, &wb);
			o = o * wa + part[(w * PQ_ROWS + r) * D + d] * wb;
		}
		if (rot_out)
			y[k] = st.normalize(o);
		else
			emit<D>(a, blockIdx.x, out_row(a, s, h, r0 + r), d, o, st);
	}
	if (!rot_out)
		return;
	__syncthreads();
#pragma unroll
	for (uint32_t k = 0; k < PER; k++) {
		const uint32_t i = tid + k * PQ_WARPS * 32;
		if (i < nr * D)
			part[i] = y[k];
	}
	__syncthreads();
	emit_rotated<D>(a, s, h, part, D, r0, nr);
}

template <int KF, int VF, int D, int ACT> int pq_decode_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	static bool raised;

	if (!smem_opt_in((const void *)pq_decode_kernel<KF, VF, D, ACT>, (int)pq_smem_bytes<KF, VF, D>(), raised))
		return fail_launch();
	pq_decode_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H * a.chunks, nseq), PQ_WARPS * 32,
					   pq_smem_bytes<KF, VF, D>(), (cudaStream_t)stream>>>(a);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
