/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Rows of activations in the GPU write (write.cu): the staged layout of a
 * block being sealed (SEAL_PAD, xs_at) and its staging (rows, stage_rows),
 * activation words as floats and back
 * (act_f, unpack8, pack8), and the rotation of a layer's rows ("+rot") in
 * kvq_rotate's order, so that the bytes equal the CPU write's: staged rows
 * in place (rotate_staged) and input rows on their way into an open slot
 * (append_rows_rot).
 */
#ifndef KVQ_CUDA_ROWS_CUH
#define KVQ_CUDA_ROWS_CUH

#include <cuda_pipeline_primitives.h>

#include "common.cuh"

namespace kvq {

/* Halves of padding after each staged row: rows stay 16-byte aligned and
 * eight lanes reading a channel down the rows spread over the banks. */
#define SEAL_PAD 8u

/* Index of element (t, d) in a staged part of rows of `row` halves: the
 * 16-byte pieces of row t XORed with (t / 8) % 4, so that lanes reading
 * columns of V's storage order (eight rows from a multiple of 8, several
 * such runs per warp) spread over the banks too.  D % 32 == 0 keeps the
 * XOR inside the row. */
__device__ __forceinline__ uint32_t xs_at(uint32_t t, uint32_t d, uint32_t row)
{
	return t * row + (d ^ ((t >> 3 & 3u) << 3));
}

/* Rows of a block being sealed: token t comes from the open slot while
 * t < from_open, else from input row in_row + (t - from_open). */
struct rows {
	const uint8_t *open;     /* open head slice, or NULL */
	const uint8_t *in_k, *in_v;
	uint32_t from_open;
	uint64_t in_row;         /* input row of token from_open */
	uint32_t in_stride;      /* bytes between input rows (all heads) */

	__device__ const uint16_t *get(const layer_dev &l, uint32_t t, int is_v) const
	{
		uint32_t row = l.D * 2;
		if (t < from_open)
			return reinterpret_cast<const uint16_t *>(open + (is_v ? (size_t)l.B * row : 0) + (size_t)t * row);
		const uint8_t *in = is_v ? in_v : in_k;
		return reinterpret_cast<const uint16_t *>(in + (in_row + t - from_open) * in_stride);
	}
};

/* Stages parts p0 .. p0 + n - 1 (0: K, 1: V) of the block: part p from
 * xs + (p - p0) * B * (D + SEAL_PAD), in xs_at's order.  Asynchronous
 * 16-byte copies: all of a thread's are in flight at once, through no
 * register.  The caller waits (stage_wait) and synchronises. */
__device__ void stage_rows(const layer_dev &l, const rows &src, uint32_t p0, uint32_t n, uint16_t *xs)
{
	const uint32_t vec = l.D / 8, stride = l.D + SEAL_PAD, total = n * l.B * vec;
	/* piece i is piece c of row t of part p0 + p; stepped, not divided,
	 * from one of a thread's pieces to the next */
	const uint32_t dt = blockDim.x / vec, dc = blockDim.x % vec;
	uint32_t c = threadIdx.x % vec, t = threadIdx.x / vec, p = 0;

	for (; t >= l.B; t -= l.B)
		p++;
	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		__pipeline_memcpy_async(xs + p * l.B * stride + xs_at(t, c * 8, stride),
					src.get(l, t, (int)(p0 + p)) + c * 8, 16);
		c += dc;
		t += dt;
		if (c >= vec) {
			c -= vec;
			t++;
		}
		for (; t >= l.B; t -= l.B)
			p++;
	}
	__pipeline_commit();
}

__device__ __forceinline__ void stage_wait(void)
{
	__pipeline_wait_prior(0);
}

/* An activation word as a float: exact (a NaN may lose its payload, which
 * no parameter or code depends on). */
__device__ __forceinline__ float act_f(int act, uint16_t x)
{
	return act == KVQ_DT_BF16 ? __uint_as_float((uint32_t)x << 16) : __half2float(__ushort_as_half(x));
}

/* Eight activation words (a 16-byte piece) as floats. */
__device__ __forceinline__ void unpack8(int act, uint4 v, float f[8])
{
	const uint32_t w[4] = { v.x, v.y, v.z, v.w };

	if (act == KVQ_DT_BF16) {
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			f[e] = __uint_as_float(e % 2 ? w[e / 2] & 0xffff0000u : w[e / 2] << 16);
	} else {
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			f[e] = __half2float(__ushort_as_half((unsigned short)(w[e / 2] >> (e % 2 * 16))));
	}
}

/* ------------------------------------------- rotation by 8 lanes a row
 * kvq_rotate of a row of D = 64·K elements by the 8 lanes of a group
 * (lanes 8g .. 8g + 7 of a warp), bit for bit as warp_rotate: lane j of
 * the group holds the 8-element chunks c = j + 8k (k < K), chunk k in
 * x[8k .. 8k + 7].  Butterflies of stride 1, 2, 4 pair elements of a chunk,
 * 8, 16, 32 the chunks of lanes j and j ^ (stride / 8) (shuffles among the
 * group's lanes only: groups may take other paths), 64 and 128 a lane's
 * chunks k and k ^ (stride / 64); stage after stage in kvq_rotate's order,
 * each sum rounded alone.  Against warp_rotate (a row per warp, E = D / 32
 * elements a lane, five shuffle stages of E shuffles): three shuffle stages
 * of 8K, a quarter of the shuffles per row, loads and stores of 16 bytes.
 * n: the block (kvq_rot_block; 0: the row is left as it is). */
template <uint32_t K> __device__ __forceinline__ void group_rotate(float x[8 * K], uint32_t n)
{
	const uint32_t lane = threadIdx.x & 31, j = lane & 7, mask = 0xffu << (lane & 24u);

#pragma unroll
	for (uint32_t len = 1; len < 8; len <<= 1)
		if (len < n)
#pragma unroll
			for (uint32_t i = 0; i < 8 * K; i++)
				if (!(i & len)) {
					const float u = x[i], v = x[i | len];
					x[i] = __fadd_rn(u, v);
					x[i | len] = __fsub_rn(u, v);
				}
#pragma unroll
	for (uint32_t len = 8; len < 64; len <<= 1)
		if (len < n) {
			/* the lower lane keeps x + o, the upper o - x: fma(±1, x, o) */
			const float sgn = j & (len / 8) ? -1.0f : 1.0f;
#pragma unroll
			for (uint32_t i = 0; i < 8 * K; i++)
				x[i] = __fmaf_rn(sgn, x[i], __shfl_xor_sync(mask, x[i], len / 8));
		}
#pragma unroll
	for (uint32_t s = 1; s < K; s <<= 1)
		if (64 * s < n)
#pragma unroll
			for (uint32_t k = 0; k < K; k++)
				if (!(k & s) && (k | s) < K)
#pragma unroll
					for (uint32_t e = 0; e < 8; e++) {
						const float u = x[8 * k + e], v = x[8 * (k | s) + e];
						x[8 * k + e] = __fadd_rn(u, v);
						x[8 * (k | s) + e] = __fsub_rn(u, v);
					}
	if (n) {
		const float norm = kvq_rot_norm(n);
#pragma unroll
		for (uint32_t i = 0; i < 8 * K; i++)
			x[i] = __fmul_rn(x[i], norm);
	}
}

/* Two floats as a word of two activations, rounded as act_bits: by the
 * paired conversion instruction (round to nearest even, as kvq_format.h)
 * unless one is a NaN (act_bits quiets it as the host does). */
__device__ __forceinline__ uint32_t pack2(int act, float a, float b)
{
	if (a == a && b == b) {
		uint32_t w;
		if (act == KVQ_DT_BF16) {
			const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
			memcpy(&w, &h, 4);
		} else {
			const __half2 h = __floats2half2_rn(a, b);
			memcpy(&w, &h, 4);
		}
		return w;
	}
	return (uint32_t)act_bits(act, a) | (uint32_t)act_bits(act, b) << 16;
}

__device__ __forceinline__ uint4 pack8(int act, const float *x)
{
	return make_uint4(pack2(act, x[0], x[1]), pack2(act, x[2], x[3]), pack2(act, x[4], x[5]),
			  pack2(act, x[6], x[7]));
}

/* Rows t0 .. B - 1 of a staged part, D = 64·K (row stride `row` halves,
 * xs_at's order: its XOR moves whole 16-byte pieces) rotated in place,
 * blocks of n, 8 lanes a row (group_rotate); every lane of the CTA takes
 * as many turns (a lane without a row rotates zeros), so the shuffles'
 * groups are whole. */
template <uint32_t K>
__device__ void rotate_staged_g(uint16_t *xs, uint32_t t0, uint32_t B, uint32_t row, int act, uint32_t n)
{
	const uint32_t j = threadIdx.x & 7;

	for (uint32_t base = t0; base < B; base += blockDim.x / 8) {
		const uint32_t t = base + threadIdx.x / 8;
		float x[8 * K];
#pragma unroll
		for (uint32_t k = 0; k < K; k++) {
			const uint4 w = t < B ? *reinterpret_cast<const uint4 *>(xs + xs_at(t, 8 * (j + 8 * k), row))
					      : make_uint4(0, 0, 0, 0);
			unpack8(act, w, x + 8 * k);
		}
		group_rotate<K>(x, n);
		if (t < B)
#pragma unroll
			for (uint32_t k = 0; k < K; k++)
				*reinterpret_cast<uint4 *>(xs + xs_at(t, 8 * (j + 8 * k), row)) = pack8(act, x + 8 * k);
	}
}

/* Rows t0 .. B - 1 of a staged part (row stride `row` halves, xs_at's
 * order) rotated in place, blocks of n (kvq_rotate by warp_rotate), a warp
 * per row. */
template <uint32_t E>
__device__ void rotate_staged_e(uint16_t *xs, uint32_t t0, uint32_t B, uint32_t row, int act, uint32_t n)
{
	const uint32_t lane = threadIdx.x & 31;

	for (uint32_t t = t0 + threadIdx.x / 32; t < B; t += blockDim.x / 32) {
		float x[E];
#pragma unroll
		for (uint32_t i = 0; i < E; i++)
			x[i] = act_f(act, xs[xs_at(t, 32 * i + lane, row)]);
		warp_rotate<E>(x, n);
#pragma unroll
		for (uint32_t i = 0; i < E; i++)
			xs[xs_at(t, 32 * i + lane, row)] = act_bits(act, x[i]);
	}
}

/* The same for any head dim (a multiple of 32 up to 256): 8 lanes a row
 * at D = 64 and 128, a warp a row otherwise (at 192 and 256 the 8-lane
 * version's 24 or 32 elements a lane spill in the write kernels). */
__device__ void rotate_staged(uint16_t *xs, uint32_t t0, uint32_t B, uint32_t D, int act, uint32_t n)
{
	if (D == 64)
		return rotate_staged_g<1>(xs, t0, B, D + SEAL_PAD, act, n);
	if (D == 128)
		return rotate_staged_g<2>(xs, t0, B, D + SEAL_PAD, act, n);
#define ROT_STAGED(E) rotate_staged_e<E>(xs, t0, B, D + SEAL_PAD, act, n)
	KVQ_LANE_ELEMS(D, ROT_STAGED)
#undef ROT_STAGED
}

/* Input rows [r0, r1) of a layer that rotates K or V into an open slot's
 * rows: a warp per row, a rotated part's row through warp_rotate on its
 * way, the other part's copied as it came. */
template <uint32_t E>
__device__ void append_rows_rot(const layer_dev &l, uint8_t *open, uint32_t r0, uint32_t r1, const uint8_t *in_k,
				const uint8_t *in_v, uint64_t in_row, uint32_t in_stride)
{
	const uint32_t lane = threadIdx.x & 31, nrows = (r1 - r0) * 2;

	for (uint32_t j = threadIdx.x / 32; j < nrows; j += blockDim.x / 32) {
		const uint32_t is_v = j % 2, r = r0 + j / 2;
		const uint16_t *in = reinterpret_cast<const uint16_t *>((is_v ? in_v : in_k) + (in_row + (r - r0)) * in_stride);
		uint16_t *o = reinterpret_cast<uint16_t *>(open + (is_v ? (size_t)l.B * l.D * 2 : 0) + (size_t)r * l.D * 2);
		if (!(l.rot & (is_v ? KVQ_ROT_V : KVQ_ROT_K))) {
			for (uint32_t d = lane; d < l.D; d += 32)
				o[d] = in[d];
			continue;
		}
		float x[E];
#pragma unroll
		for (uint32_t i = 0; i < E; i++)
			x[i] = act_f(l.act, in[32 * i + lane]);
		warp_rotate<E>(x, kvq_rot_block(l.D, (int)is_v));
#pragma unroll
		for (uint32_t i = 0; i < E; i++)
			o[32 * i + lane] = act_bits(l.act, x[i]);
	}
}

/* The same, D = 64·K (64 and 128: see rotate_staged): 8 lanes a row
 * (group_rotate), every lane of the CTA taking as many turns. */
template <uint32_t K>
__device__ void append_rows_rot_g(const layer_dev &l, uint8_t *open, uint32_t r0, uint32_t r1, const uint8_t *in_k,
				  const uint8_t *in_v, uint64_t in_row, uint32_t in_stride)
{
	const uint32_t j = threadIdx.x & 7, nrows = (r1 - r0) * 2;

	for (uint32_t base = 0; base < nrows; base += blockDim.x / 8) {
		const uint32_t jr = base + threadIdx.x / 8, is_v = jr % 2, r = r0 + jr / 2;
		const bool have = jr < nrows;
		const uint4 *in = reinterpret_cast<const uint4 *>((is_v ? in_v : in_k) + (in_row + (r - r0)) * in_stride);
		uint4 *o = reinterpret_cast<uint4 *>(open + (is_v ? (size_t)l.B * l.D * 2 : 0) + (size_t)r * l.D * 2);
		uint4 w[K];
#pragma unroll
		for (uint32_t k = 0; k < K; k++)
			w[k] = have ? in[j + 8 * k] : make_uint4(0, 0, 0, 0);
		if (l.rot & (is_v ? KVQ_ROT_V : KVQ_ROT_K)) {   /* the same for the group's 8 lanes */
			float x[8 * K];
#pragma unroll
			for (uint32_t k = 0; k < K; k++)
				unpack8(l.act, w[k], x + 8 * k);
			group_rotate<K>(x, kvq_rot_block(l.D, (int)is_v));
#pragma unroll
			for (uint32_t k = 0; k < K; k++)
				w[k] = pack8(l.act, x + 8 * k);
		}
		if (have)   /* a part not rotated as it came, bit for bit */
#pragma unroll
			for (uint32_t k = 0; k < K; k++)
				o[j + 8 * k] = w[k];
	}
}

} /* namespace kvq */

#endif
