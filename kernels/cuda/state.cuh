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

/* 2^x by the special-function unit alone: results below 2^-126 flush to
 * zero (ftz), which no softmax here can tell apart (they are weights of
 * under 2^-126 against the row's largest, 1), and which saves the scaling
 * around it that subnormal results would need. */
__device__ __forceinline__ float fast_exp2(float x)
{
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
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
	 * which the accumulator (and l, done here) must be multiplied: 1 where
	 * m stays as it was, -inf included (a query row that sees no token yet,
	 * or a padding row: its sums are 0 either way, and 1 lets the caller
	 * skip a rescale). */
	__device__ __forceinline__ float raise(float mx)
	{
		const float m_old = m;
		m = fmaxf(m, mx);
		const float alpha = m == m_old ? 1.0f : fast_exp2(m_old - base());
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

/* Row r of buf (stride floats apart, D elements) through warp_rotate in
 * blocks of n: lane l's x[i] is element 32 i + l. */
template <int D>
__device__ __forceinline__ void load_rotated(const float *buf, uint32_t stride, uint32_t r, uint32_t n, float x[D / 32])
{
	const uint32_t lane = threadIdx.x & 31;

#pragma unroll
	for (uint32_t i = 0; i < D / 32; i++)
		x[i] = buf[r * stride + 32 * i + lane];
	warp_rotate<D / 32>(x, n);
}

/* Rows 0 .. nr - 1 of buf (stride floats apart, D elements each: q in fp32)
 * into K's basis as rot_rows_kernel puts them (warp_rotate, rounded to the
 * activation dtype), then times mul; a warp per row.  The caller syncs. */
template <int D, int ACT> __device__ void rotate_q_rows(float *buf, uint32_t stride, uint32_t nr, float mul)
{
	const uint32_t lane = threadIdx.x & 31;

	for (uint32_t r = threadIdx.x / 32; r < nr; r += blockDim.x / 32) {
		float x[D / 32];
		load_rotated<D>(buf, stride, r, kvq_rot_block(D, 0), x);
#pragma unroll
		for (uint32_t i = 0; i < D / 32; i++)
			buf[r * stride + 32 * i + lane] = act<ACT>::to_f(act<ACT>::from_f(x[i])) * mul;
	}
}

/* Output row of a CTA's row r (from row r0 of its query rows, g per token):
 * query token times q_heads plus head. */
__device__ __forceinline__ size_t out_row(const attn_args &a, const kvq_seq_table &s, uint32_t h, uint32_t r)
{
	return (size_t)(s.row0 + r / a.g) * a.q_heads + h * a.g + r % a.g;
}

/* The epilogue of a layer whose V the kernel rotates back itself (a.rot)
 * with the KV range whole: rows 0 .. nr - 1 of buf (normalised results,
 * stride floats apart), query rows r0 .. of KV head h, out of V's basis
 * (warp_rotate, as rot_rows_kernel) into out; a warp per row.  The caller
 * syncs before. */
template <int D>
__device__ void emit_rotated(const attn_args &a, const kvq_seq_table &s, uint32_t h, const float *buf,
			     uint32_t stride, uint32_t r0, uint32_t nr)
{
	const uint32_t lane = threadIdx.x & 31;

	for (uint32_t r = threadIdx.x / 32; r < nr; r += blockDim.x / 32) {
		float x[D / 32];
		load_rotated<D>(buf, stride, r, kvq_rot_block(D, 1), x);
		const size_t row = out_row(a, s, h, r0 + r);
#pragma unroll
		for (uint32_t i = 0; i < D / 32; i++)
			store_out(a.out_dtype, a.out, row * D + 32 * i + lane, x[i]);
	}
}

/* x[d] of a row of D elements in shared memory through kvq_rotate's blocks
 * of n (0: none), thread d for element d (blockDim.x == D): warp_rotate's
 * arithmetic, a stage at a time; returns the element. */
__device__ __forceinline__ float cta_rotate(float *x, uint32_t d, uint32_t n)
{
	for (uint32_t len = 1; len < n; len <<= 1) {
		__syncthreads();
		const float v = x[d], o = x[d ^ len];
		__syncthreads();
		x[d] = (d & len) ? __fsub_rn(o, v) : __fadd_rn(v, o);
	}
	return n ? __fmul_rn(x[d], kvq_rot_norm(n)) : x[d];
}

/* Merges split partials: out = Σ_s w_s o_s / Σ_s w_s l_s, rotated back in
 * blocks of rot_n (0: not) when the kernel rotates V itself (a.rot). */
template <int D>
__global__ void merge_kernel(const kvq_seq_table *seqs, const float *ws, void *out, int out_dtype,
			     uint32_t splits, uint32_t total_q, uint32_t q_heads, uint32_t rot_n)
{
	__shared__ float xs[D];
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
	xs[d] = st.normalize(acc);
	store_out(out_dtype, out, row * D + d, cta_rotate(xs, d, rot_n));
}

/* After a launch that wrote split partials: the merge into out. */
template <int D> int merge_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	if (a.splits <= 1)
		return 0;
	merge_kernel<D><<<dim3(a.max_q, a.q_heads, nseq), D, 0, (cudaStream_t)stream>>>(
		a.seqs, a.ws, a.out, a.out_dtype, a.splits, a.total_q, a.q_heads,
		a.rot & KVQ_ROT_V ? kvq_rot_block(D, 1) : 0u);
	return cudaPeekAtLastError() == cudaSuccess ? 0 : fail_launch();
}

} /* namespace kvq */

#endif
