/* SPDX-License-Identifier: Apache-2.0 */
/* What the CUDA kernels share: the layer's layout as a kernel argument,
 * per-format traits, activation loads and stores, the attention kernels'
 * arguments, error bookkeeping. */
#ifndef KVQ_CUDA_COMMON_CUH
#define KVQ_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <errno.h>

#include "../kvq_format.h"
#include "kvq_cuda.h"

namespace kvq {

/* One layer of the layout, passed by value (kernels/layout.h). */
typedef struct kvq_layer_layout layer_dev;

static inline layer_dev layer_of(const struct kvq_layout *L, uint32_t layer)
{
	return L->layer[layer];
}

/* Head slice of a sealed or open block (ids already checked). */
__device__ __forceinline__ const uint8_t *sealed_head(const layer_dev &l, const uint8_t *base, uint32_t id, uint32_t h)
{
	return base + kvq_head_off(l.region, l.sealed_slice, l.sealed_head, id, h);
}

__device__ __forceinline__ const uint8_t *open_head(const layer_dev &l, const uint8_t *base, uint32_t id, uint32_t h)
{
	return base + kvq_head_off(l.open_base, l.open_slice, l.open_head, id, h);
}

/* The id of block blk of table s (n_sealed_blk sealed blocks in it): a
 * sink block's open id (its sink slice, kvq_table_sink_open_id), a
 * sealed id, or an open id; -1 when it is out of its class's range (read
 * as nothing). */
__device__ __forceinline__ int32_t block_id(const layer_dev &l, const kvq_seq_table &s, uint32_t blk,
					    uint32_t n_sealed_blk, bool sink, bool sealed)
{
	if (sink)
		return s.sink <= l.n_sink ? (int32_t)kvq_table_sink_open_id(l.n_open, s.sink) : -1;
	const int32_t id = sealed ? s.sealed[blk] : s.open[blk - n_sealed_blk];
	return id >= 0 && (uint32_t)id < (sealed ? l.n_sealed : l.n_open) ? id : -1;
}

/* Head h's codebooks of the layer's K (is_v 0) or V (1): [subspace][256]
 * [subdim] FP16 (codebook.h), or NULL where that format has none.  Call
 * it with a constant is_v: a computed index would copy l to local memory. */
__device__ __forceinline__ const uint16_t *codebook_of(const layer_dev &l, const uint8_t *base, int is_v, uint32_t h)
{
	const uint64_t off = l.codebook[is_v];

	return off == UINT64_MAX ? NULL
				 : reinterpret_cast<const uint16_t *>(base + off + (uint64_t)h * KVQ_CB_CENTROIDS * l.D * 2u);
}

/* S(n): tokens of a sequence of n that are sealed (kvq_split). */
__device__ __forceinline__ uint32_t split_of(const layer_dev &l, uint32_t n)
{
	return kvq_split(n, l.window, l.B);
}

/* ------------------------------------------------------------ activations */

template <int DT> struct act;
template <> struct act<KVQ_DT_F16> {
	typedef __half T;
	static __device__ __forceinline__ float to_f(T x) { return __half2float(x); }
	static __device__ __forceinline__ T from_f(float x) { return __float2half_rn(x); }
	static __device__ __forceinline__ uint32_t pack(float a, float b)
	{
		__half2 h = __floats2half2_rn(a, b);
		return *reinterpret_cast<uint32_t *>(&h);
	}
};
template <> struct act<KVQ_DT_BF16> {
	typedef __nv_bfloat16 T;
	static __device__ __forceinline__ float to_f(T x) { return __bfloat162float(x); }
	static __device__ __forceinline__ T from_f(float x) { return __float2bfloat16_rn(x); }
	static __device__ __forceinline__ uint32_t pack(float a, float b)
	{
		__nv_bfloat162 h = __floats2bfloat162_rn(a, b);
		return *reinterpret_cast<uint32_t *>(&h);
	}
};

/* ------------------------------------------------------------- format traits
 * A format's traits, from the format table (kvq_format.h): bits per code,
 * how K and V keep their parameters, the group along the head dim, and
 * raw(): the value of a code before its scale and zero, exact in FP16 and
 * BF16, by what the code is (code_raw, one per enum kvq_code). */
template <int C> struct code_raw;
template <> struct code_raw<KVQ_CODE_INDEX> {   /* the index itself: kernels look its centroid up (codebook_of) */
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)c; }
};
template <> struct code_raw<KVQ_CODE_UINT> {
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)c; }
};
template <> struct code_raw<KVQ_CODE_F16> {
	static __device__ __forceinline__ float raw(uint32_t c) { return __half2float(__ushort_as_half((unsigned short)c)); }
};
template <> struct code_raw<KVQ_CODE_BF16> {
	static __device__ __forceinline__ float raw(uint32_t c) { return kvq_bf16_to_f32((uint16_t)c); }
};
template <> struct code_raw<KVQ_CODE_SINT> {   /* of 8 bits, the only one in the table */
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)(int8_t)(uint8_t)c; }
};
template <> struct code_raw<KVQ_CODE_E4M3> {
	static __device__ __forceinline__ float raw(uint32_t c)
	{
#if __CUDA_ARCH__ >= 890
		/* the hardware conversion (cvt e4m3x2 -> f16x2) */
		return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3)));
#else
		return kvq_fp8_e4m3_dec((uint8_t)c);
#endif
	}
};
template <> struct code_raw<KVQ_CODE_E5M2> {
	static __device__ __forceinline__ float raw(uint32_t c) { return kvq_fp8_e5m2_dec((uint8_t)c); }
};

template <int F> struct fmt : code_raw<kvq_fmt_code(F)> {
	static constexpr unsigned bits = kvq_fmt_bits(F), group_k = kvq_fmt_group(F, 0), group_v = kvq_fmt_group(F, 1);
	static constexpr int code = kvq_fmt_code(F), kind_k = kvq_fmt_param_kind(F, 0), kind_v = kvq_fmt_param_kind(F, 1);
	static constexpr unsigned subdim = kvq_fmt_subdim(F);   /* head-dim elements per code */
};

/* Code i of a packed array of BITS-bit codes. */
template <unsigned BITS> __device__ __forceinline__ uint32_t code_at(const uint8_t *p, uint32_t i)
{
	if (BITS == 16)
		return *reinterpret_cast<const uint16_t *>(p + 2 * i);
	if (BITS == 8)
		return p[i];
	if (BITS == 4)
		return (p[i >> 1] >> ((i & 1u) * 4u)) & 0xfu;
	return (p[i >> 2] >> ((i & 3u) * 2u)) & 0x3u;
}

__device__ __forceinline__ float half_bits(const uint8_t *p, uint32_t i)
{
	return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(p)[i]));
}

/* ----------------------------------------------------------------- rotation
 * kvq_rotate (a policy's "+rot") by one warp, bit for bit: a row of 32·E
 * elements, element 32·i + lane in x[i] of that lane; butterflies of stride
 * 1 .. 16 across lanes (shuffles), of 32 and more inside a lane; each stage
 * rounds every sum alone, in the order kvq_rotate's stages go, so the
 * result is the serial one's.  n: the block (kvq_rot_block). */
template <uint32_t E> __device__ __forceinline__ void warp_rotate(float x[E], uint32_t n)
{
	const uint32_t lane = threadIdx.x & 31;
	const float norm = kvq_rot_norm(n);

	/* the lower lane of a pair keeps x + o, the upper o - x: both are
	 * fma(±1, x, o), one rounding of the same sum, with no select */
	for (uint32_t len = 1; len < n && len < 32; len <<= 1) {
		const float sgn = lane & len ? -1.0f : 1.0f;
#pragma unroll
		for (uint32_t i = 0; i < E; i++)
			x[i] = __fmaf_rn(sgn, x[i], __shfl_xor_sync(0xffffffffu, x[i], len));
	}
#pragma unroll
	for (uint32_t s = 1; s < E; s <<= 1)
		if (32 * s < n)
#pragma unroll
			for (uint32_t i = 0; i < E; i++)
				if (!(i & s) && (i | s) < E) {
					const float u = x[i], v = x[i | s];
					x[i] = __fadd_rn(u, v);
					x[i | s] = __fsub_rn(u, v);
				}
#pragma unroll
	for (uint32_t i = 0; i < E; i++)
		x[i] = __fmul_rn(x[i], norm);
}

/* CASE(E) with E = D / 32 as a constant (D a multiple of 32 up to 256):
 * the rows' elements per lane of warp_rotate. */
#define KVQ_LANE_ELEMS(D, CASE) \
	switch ((D) / 32) { \
	case 1: CASE(1); break; \
	case 2: CASE(2); break; \
	case 3: CASE(3); break; \
	case 4: CASE(4); break; \
	case 5: CASE(5); break; \
	case 6: CASE(6); break; \
	case 7: CASE(7); break; \
	default: CASE(8); break; \
	}

/* An activation (F16 or BF16 bits) from a float, as kvq_format.h rounds it. */
__device__ __forceinline__ uint16_t act_bits(int act, float x)
{
	return act == KVQ_DT_BF16 ? kvq_bf16_from_f32(x) : kvq_f16_from_f32(x);
}

/* ---------------------------------------------------- asynchronous copies */

/* N bytes (4, 8 or 16, aligned to N) from global to shared memory (dst: a
 * shared-window address), not waited for. */
template <int N> __device__ __forceinline__ void cp_async(uint32_t dst, const void *src)
{
	static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
	if constexpr (N == 16)
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
	else
		asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(N));
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
	cp_async<16>((uint32_t)__cvta_generic_to_shared(dst), src);
}

__device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
	cp_async<8>((uint32_t)__cvta_generic_to_shared(dst), src);
}

/* Closes the group of the copies issued since the last commit. */
__device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Waits until at most N of this thread's groups are in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait_group(void)
{
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Every copy this thread issued, landed. */
__device__ __forceinline__ void cp_async_wait(void)
{
	cp_async_commit();
	cp_async_wait_group<0>();
}

/* The opt-in of kernel f to bytes of dynamic shared memory (needed above
 * 48 KiB, its static arrays counted), once: raised is the caller's flag for
 * that kernel.  False on a CUDA error. */
inline bool smem_opt_in(const void *f, int bytes, bool &raised)
{
	if (!raised) {
		if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
			return false;
		raised = true;
	}
	return true;
}

/* ------------------------------------------------- the attention kernels' arguments */

#define ATTN_P_UNIT 16384.0f  /* 2^14: probabilities times a V scale over this stay normal FP16 */

struct attn_args {
	layer_dev l;
	const uint8_t *base;
	const kvq_seq_table *seqs;
	const void *q;
	void *out;
	float *ws;               /* splits > 1: [split][total_q][q_heads][D + 2] */
	float scale;
	int out_dtype;
	uint32_t g, q_heads, chunks, nrp, tt, splits, total_q, max_q;
	/* KVQ_ROT_K, KVQ_ROT_V: what the kernel (and merge_kernel) rotate
	 * themselves, q on load and the output in the epilogue (decode and
	 * pq-decode kernels); 0 where dispatch rotates around the launch */
	uint32_t rot;
};

/* ----------------------------------------------------------------- errors */

int fail_launch(void);   /* -EIO after recording cudaGetLastError() */

} /* namespace kvq */

#endif
