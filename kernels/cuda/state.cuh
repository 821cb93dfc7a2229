/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The online-softmax state of one query row, and what is built on it: the
 * epilogue that writes a row's result (or, with the KV range split, its
 * partial) and the kernel that merges split partials.  Every attention
 * kernel keeps its scores in log2 units (the score times scale · log2 e),
 * so exponentials are ex2.
 */
#ifndef KVQ_CUDA_STATE_CUH
#define KVQ_CUDA_STATE_CUH

#include "common.cuh"

namespace kvq {

#define KVQ_LOG2E 1.4426950408889634f

__device__ __forceinline__ float fast_exp2(float x)
{
	float y;
	asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

/* m: the largest score seen (-inf: none yet); l: the sum of 2^(x - m) over
 * the scores seen.  The accumulator of Σ 2^(x - m) v is the caller's (in
 * registers, in whatever fragment layout), kept under the same m. */
struct sm_state {
	float m, l;

	__device__ __forceinline__ void init()
	{
		m = -INFINITY;
		l = 0.0f;
	}
	/* What exponentials are taken against: m, or 0 while every score is -inf. */
	__device__ __forceinline__ float base() const { return m == -INFINITY ? 0.0f : m; }
	/* Takes in a tile whose largest score is mx: returns the factor by
	 * which the accumulator (and l, done here) must be multiplied. */
	__device__ __forceinline__ float raise(float mx)
	{
		const float m_old = m;
		m = fmaxf(m, mx);
		const float alpha = fast_exp2(m_old - base());
		l *= alpha;
		return alpha;
	}
	/* Merges another partial (its own m and l) into this one: *wa and *wb
	 * are the weights of this partial's accumulator and the other's. */
	__device__ __forceinline__ void merge(const sm_state &o, float *wa, float *wb)
	{
		const float M = fmaxf(m, o.m);
		*wa = m == -INFINITY ? 0.0f : fast_exp2(m - M);
		*wb = o.m == -INFINITY ? 0.0f : fast_exp2(o.m - M);
		l = l * *wa + o.l * *wb;
		m = M;
	}
	/* The row's output of an accumulated value. */
	__device__ __forceinline__ float normalize(float acc) const { return l > 0.0f ? acc / l : 0.0f; }
};

__device__ __forceinline__ void store_out(int dt, void *out, size_t i, float y)
{
	if (dt == KVQ_DT_F16)
		reinterpret_cast<__half *>(out)[i] = __float2half_rn(y);
	else if (dt == KVQ_DT_BF16)
		reinterpret_cast<__nv_bfloat16 *>(out)[i] = __float2bfloat16_rn(y);
	else
		reinterpret_cast<float *>(out)[i] = y;
}

/* Element d of output row `row` (query token times q_heads plus head) with
 * accumulated value acc under st: the result when the KV range is whole,
 * else split `split`'s partial in the workspace, [split][row][D + 2] as
 * (acc..., m, l). */
template <int D>
__device__ __forceinline__ void emit(const attn_args &a, uint32_t split, size_t row, uint32_t d, float acc,
				     const sm_state &st)
{
	if (a.splits == 1) {
		store_out(a.out_dtype, a.out, row * D + d, st.normalize(acc));
	} else {
		float *w = a.ws + ((size_t)split * a.total_q * a.q_heads + row) * (D + 2);
		w[d] = acc;
		if (d == 0) {
			w[D] = st.m;
			w[D + 1] = st.l;
		}
	}
}

/* Merges split partials: out = Σ_s w_s o_s / Σ_s w_s l_s. */
template <int D>
__global__ void merge_kernel(const kvq_seq_table *seqs, const float *ws, void *out, int out_dtype,
			     uint32_t splits, uint32_t total_q, uint32_t q_heads)
{
	const kvq_seq_table s = seqs[blockIdx.z];
	const uint32_t qi = blockIdx.x, head = blockIdx.y, d = threadIdx.x;

	if (qi >= s.m || s.m > s.n)
		return;
	const size_t row = (size_t)(s.row0 + qi) * q_heads + head;
	const size_t stride = (size_t)total_q * q_heads * (D + 2);
	sm_state st;
	float acc = 0.0f;
	st.init();
	for (uint32_t k = 0; k < splits; k++) {
		const float *w = ws + k * stride + row * (D + 2);
		float wa, wb;
		st.merge(sm_state{ w[D], w[D + 1] }, &wa, &wb);
		acc = acc * wa + w[d] * wb;
	}
	store_out(out_dtype, out, row * D + d, st.normalize(acc));
}

/* After a launch that wrote split partials: the merge into out. */
template <int D> int merge_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	if (a.splits <= 1)
		return 0;
	merge_kernel<D><<<dim3(a.max_q, a.q_heads, nseq), D, 0, (cudaStream_t)stream>>>(
		a.seqs, a.ws, a.out, a.out_dtype, a.splits, a.total_q, a.q_heads);
	return cudaPeekAtLastError() == cudaSuccess ? 0 : fail_launch();
}

} /* namespace kvq */

#endif
