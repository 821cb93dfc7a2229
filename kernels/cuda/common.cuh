/* SPDX-License-Identifier: Apache-2.0 */
/* What the CUDA kernels share: the layer's layout as a kernel argument,
 * per-format traits, activation loads and stores, error bookkeeping. */
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

/* One layer of the layout, passed by value. */
struct layer_dev {
	uint64_t region, sealed_slice, open_slice, open_base;
	uint32_t sealed_head, open_head;
	uint32_t off[KVQ_NFIELDS], size[KVQ_NFIELDS];
	uint32_t B, D, H, window, n_sealed, n_open;
	int kfmt, vfmt, act;
};

static inline layer_dev layer_of(const struct kvq_layout *L, uint32_t layer)
{
	const struct kvq_layer_layout *ll = &L->layer[layer];
	layer_dev d;

	d.region = ll->region;
	d.sealed_slice = ll->sealed_slice;
	d.open_slice = ll->open_slice;
	d.open_base = ll->region + (uint64_t)L->n_sealed * ll->sealed_slice;
	d.sealed_head = ll->sealed_head;
	d.open_head = ll->open_head;
	for (int f = 0; f < KVQ_NFIELDS; f++) {
		d.off[f] = ll->off[f];
		d.size[f] = ll->size[f];
	}
	d.B = L->block_tokens;
	d.D = L->head_dim;
	d.H = L->kv_heads;
	d.window = L->window;
	d.n_sealed = L->n_sealed;
	d.n_open = L->n_open;
	d.kfmt = ll->kfmt;
	d.vfmt = ll->vfmt;
	d.act = L->act;
	return d;
}

/* Head slice of a sealed or open block (ids already checked). */
__device__ __forceinline__ const uint8_t *sealed_head(const layer_dev &l, const uint8_t *base, uint32_t id, uint32_t h)
{
	return base + l.region + (uint64_t)id * l.sealed_slice + (uint64_t)h * l.sealed_head;
}

__device__ __forceinline__ const uint8_t *open_head(const layer_dev &l, const uint8_t *base, uint32_t id, uint32_t h)
{
	return base + l.open_base + (uint64_t)id * l.open_slice + (uint64_t)h * l.open_head;
}

/* S(n): tokens of a sequence of n that are sealed (kvq_layout_split). */
__device__ __forceinline__ uint32_t split_of(const layer_dev &l, uint32_t n)
{
	return n <= l.window ? 0 : l.B * ((n - l.window + l.B - 1) / l.B);
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
 * One block per format: bits per code, how K and V keep their parameters
 * (kvq_format.h), the group along the head dim, and raw(): the value of a code
 * before its scale and zero, exact in FP16 and BF16. */
template <int F> struct fmt;

template <> struct fmt<KVQ_FMT_F16> {
	static constexpr unsigned bits = 16, group_v = 0, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_NONE, kind_v = KVQ_PARAM_NONE;
	static __device__ __forceinline__ float raw(uint32_t c) { return __half2float(__ushort_as_half((unsigned short)c)); }
};
template <> struct fmt<KVQ_FMT_BF16> {
	static constexpr unsigned bits = 16, group_v = 0, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_NONE, kind_v = KVQ_PARAM_NONE;
	static __device__ __forceinline__ float raw(uint32_t c) { return kvq_bf16_to_f32((uint16_t)c); }
};
template <> struct fmt<KVQ_FMT_INT8> {
	static constexpr unsigned bits = 8, group_v = 0, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_TOKEN, kind_v = KVQ_PARAM_TOKEN;
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)(int8_t)(uint8_t)c; }
};
template <> struct fmt<KVQ_FMT_FP8> {
	static constexpr unsigned bits = 8, group_v = 0, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_TOKEN, kind_v = KVQ_PARAM_TOKEN;
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
template <> struct fmt<KVQ_FMT_FP8E5M2> {
	static constexpr unsigned bits = 8, group_v = 0, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_TOKEN, kind_v = KVQ_PARAM_TOKEN;
	static __device__ __forceinline__ float raw(uint32_t c) { return kvq_fp8_e5m2_dec((uint8_t)c); }
};
template <unsigned G> struct fmt_int4 {
	static constexpr unsigned bits = 4, group_v = G, group_k = G;
	static constexpr int kind_k = KVQ_PARAM_GROUP, kind_v = KVQ_PARAM_GROUP;
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)c; }
};
template <> struct fmt<KVQ_FMT_INT4G32> : fmt_int4<32> {};
template <> struct fmt<KVQ_FMT_INT4G64> : fmt_int4<64> {};
template <> struct fmt<KVQ_FMT_INT4G128> : fmt_int4<128> {};
template <unsigned BITS> struct fmt_kivi {
	static constexpr unsigned bits = BITS, group_v = KVQ_KIVI_V_GROUP, group_k = 0;
	static constexpr int kind_k = KVQ_PARAM_CHANNEL, kind_v = KVQ_PARAM_GROUP;
	static __device__ __forceinline__ float raw(uint32_t c) { return (float)c; }
};
template <> struct fmt<KVQ_FMT_KIVI4> : fmt_kivi<4> {};
template <> struct fmt<KVQ_FMT_KIVI2> : fmt_kivi<2> {};

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

/* ----------------------------------------------------------------- errors */

int fail_launch(void);   /* -EIO after recording cudaGetLastError() */

} /* namespace kvq */

#endif
