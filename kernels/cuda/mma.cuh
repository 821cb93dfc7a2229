/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-core MMA and its fragments (mma.sync m16n8k16, FP32 accumulate),
 * for every attention kernel.  Fragment layouts as the PTX ISA gives them:
 * with lane = 4·qn + qc, A (16 x 16) holds rows qn and qn + 8, columns
 * 2qc, 2qc + 1, 2qc + 8, 2qc + 9; B (16 x 8, k x n) column qn, rows 2qc,
 * 2qc + 1, 2qc + 8, 2qc + 9; C (16 x 8) rows qn and qn + 8, columns 2qc,
 * 2qc + 1.
 */
#ifndef KVQ_CUDA_MMA_CUH
#define KVQ_CUDA_MMA_CUH

#include "common.cuh"

namespace kvq {

template <int ACT> __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <> __device__ __forceinline__ void mma16816<KVQ_DT_F16>(float c[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <> __device__ __forceinline__ void mma16816<KVQ_DT_BF16>(float c[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
		     "{%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A fragment (16 x 16, row-major) at (m0, k0) of a 16-bit matrix with row stride S. */
__device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t *X, uint32_t S, uint32_t m0, uint32_t k0)
{
	const uint32_t lane = threadIdx.x & 31, r = m0 + lane / 4, c = k0 + 2 * (lane % 4);
	a[0] = *reinterpret_cast<const uint32_t *>(X + r * S + c);
	a[1] = *reinterpret_cast<const uint32_t *>(X + (r + 8) * S + c);
	a[2] = *reinterpret_cast<const uint32_t *>(X + r * S + c + 8);
	a[3] = *reinterpret_cast<const uint32_t *>(X + (r + 8) * S + c + 8);
}

/* B fragment (16 x 8, k x n) of a 16-bit matrix stored [n][k] with row stride S. */
__device__ __forceinline__ void frag_b(uint32_t b[2], const uint16_t *Y, uint32_t S, uint32_t n0, uint32_t k0)
{
	const uint32_t lane = threadIdx.x & 31, r = n0 + lane / 4, c = k0 + 2 * (lane % 4);
	b[0] = *reinterpret_cast<const uint32_t *>(Y + r * S + c);
	b[1] = *reinterpret_cast<const uint32_t *>(Y + r * S + c + 8);
}

/* Four 8 x 8 matrices of 16-bit values from shared memory: lane l gives the
 * address of row l % 8 of matrix l / 8; register i holds matrix i in the
 * layout of a C fragment's half (row lane / 4, columns 2(lane % 4) + 0, 1). */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
	const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(a));
}

/* An 8 x 8 matrix of 16-bit values transposed within a warp. */
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x)
{
	uint32_t y;
	asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
	return y;
}

} /* namespace kvq */

#endif
