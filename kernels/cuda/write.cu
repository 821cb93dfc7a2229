/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Append and seal on the GPU.  One CTA per (block, KV head).  A block that
 * leaves the open window is staged in shared memory by asynchronous 16-byte
 * copies of its rows (from the open slot and from the input alike), K and V
 * together where both fit.
 * At D = 64 and 128, for pairs of scalar formats (tiles_fit says which), a
 * CTA of two warps then seals it by tiles (seal_tiles.cuh): each warp one
 * part, alone, its ranges, parameters and codes from 8 x 8 tiles of the
 * staged rows (on an H100, kivi2 at D = 128: 19 thread instructions an
 * element, staging included, against 66 for the staged seal).  Elsewhere
 * (other head dims, codebook formats, pairs without kernels of their own)
 * the staged seal (seal_staged.cuh), in phases between barriers.  Each
 * format is one instance of the same templates
 * (fmt<F>), and each (K, V) pair of instances.h has a kernel of its own:
 * one holding every format's code was too large for the instruction caches
 * (pairs not listed still take it).  The arithmetic is kvq_format.h's, so
 * the bytes equal the CPU seal's (kernels/cpu/write.c): that header has no
 * expression a compiler could contract into an FMA, min, max and |x| give
 * the same result in any order of reduction (a zero bound's sign, which
 * does depend on it, is dropped by kvq_asym_params), a quotient taken by a
 * reciprocal is used only where it provably rounds as the true division
 * (rint_by_recip), and FP8 codes come from the conversion instruction only
 * where it rounds and saturates as kvq_fp8_encode_generic (fp8_codes).
 */
#include <cuda_pipeline_primitives.h>

#include "codes.cuh"
#include "common.cuh"
#include "instances.h"
#include "rows.cuh"
#include "seal_staged.cuh"
#include "seal_tiles.cuh"

namespace kvq {

/* Whether a pair's parts are sealed by tiles (seal_tiles.cuh): scalar
 * formats both.  (Its kernels' other conditions, the head dim and the
 * staged rows' size, are tiles_fit's.) */
template <int FK, int FV> struct tiles_pair {
	static constexpr bool ok = FK != ANY_FMT && FV != ANY_FMT && fmt<FK>::kind_k != KVQ_PARAM_CODEBOOK &&
				   fmt<FV>::kind_v != KVQ_PARAM_CODEBOOK;
};

/* Threads of a CTA that seals by tiles: a warp for K, one for V. */
#define TILE_THREADS 64

/* Shared memory of the seal by tiles: both parts' rows. */
static size_t tiles_smem(uint32_t B, uint32_t D)
{
	return 2 * (size_t)B * (D + SEAL_PAD) * 2;
}

/* Whether a layer seals by tiles: at D = 64 or 128 in whole passes
 * (tiling<D>::tokens: 16 tokens at D = 128, 32 at 64) whose rows fit; at
 * D = 128 not where both formats have 8 bits or more, bf16 aside: there
 * the staged seal's four warps a block hide the latency better than the
 * tiles' two, and its few instructions an element are no cost (on an
 * H100, 64 x 2048 prefill: f16 94 % of copy bandwidth staged, 90 % by
 * tiles; int8 67 % and 63 %; fp8 63 % and 56 %; at D = 64 the tiles win
 * for every format, as at D = 128 for 4- and 2-bit ones and bf16). */
static bool tiles_fit(const layer_dev &l)
{
	const uint32_t B = l.B, D = l.D;
	const bool wide = kvq_fmt_bits(l.kfmt) >= 8 && kvq_fmt_bits(l.vfmt) >= 8 && l.kfmt != KVQ_FMT_BF16 &&
			  l.vfmt != KVQ_FMT_BF16;

	return (D == 64 || (D == 128 && !wide)) && B % (2048 / D) == 0 && tiles_smem(B, D) <= 96 * 1024;
}

/* Stages both parts of a block for the seal by tiles: a thread's 16-byte
 * piece of a row is the same in every row it copies, its rows TILE_THREADS
 * / (D / 8) apart, their addresses stepped; asynchronous copies, as
 * stage_rows. */
template <uint32_t D> __device__ void stage_tiles(const layer_dev &l, const rows &src, uint16_t *xs)
{
	constexpr uint32_t vec = D / 8, step = TILE_THREADS / vec, row = D + SEAL_PAD, orow = D * 2;
	const uint32_t c = threadIdx.x % vec, t0 = threadIdx.x / vec;

#pragma unroll
	for (uint32_t p = 0; p < 2; p++) {
		/* rows t0, t0 + step, ...: from the open slot, then the input */
		const uint8_t *po = src.open + (size_t)p * l.B * orow + (size_t)t0 * orow + c * 16;
		const uint8_t *pi = (p ? src.in_v : src.in_k) + ((int64_t)src.in_row - src.from_open + t0) * src.in_stride + c * 16;
		const size_t di = (size_t)step * src.in_stride;
		uint16_t *x = xs + (size_t)p * l.B * row;
		for (uint32_t t = t0; t < l.B; t += step, po += step * orow, pi += di)
			__pipeline_memcpy_async(x + xs_at(t, c * 8, row), t < src.from_open ? po : pi, 16);
	}
	__pipeline_commit();
}

/* Seals one head of one block by tiles: K's and V's rows staged together
 * (a rotated part's from the input rotated there), then warp 0 seals K,
 * warp 1 V, each alone (tile_seal). */
template <int FK, int FV>
__device__ void seal_head_tiles(const layer_dev &l, uint8_t *dst, const rows &src, uint8_t *smem)
{
	const uint32_t B = l.B, D = l.D;
	uint16_t *xs = reinterpret_cast<uint16_t *>(smem);

	zero_gaps(l, dst);
	if (D == 128)
		stage_tiles<128>(l, src, xs);
	else
		stage_tiles<64>(l, src, xs);
	stage_wait();
	__syncthreads();
	if (l.rot && src.from_open < B) {
		for (uint32_t i = 0; i < 2; i++)
			if (l.rot & (i ? KVQ_ROT_V : KVQ_ROT_K))
				rotate_staged(xs + (size_t)i * B * (D + SEAL_PAD), src.from_open, B, D, l.act,
					      kvq_rot_block(D, (int)i));
		__syncthreads();
	}
	if (threadIdx.x < 32)
		tile_seal<FK, 0>(D, l.act, xs, B, dst + l.off[KVQ_K_CODES], dst + l.off[KVQ_K_PARAMS]);
	else
		tile_seal<FV, 1>(D, l.act, xs + (size_t)B * (D + SEAL_PAD), B, dst + l.off[KVQ_V_CODES],
				 dst + l.off[KVQ_V_PARAMS]);
}

/* seal_head_tiles (TILES) or seal_head. */
template <int FK, int FV, int TILES>
__device__ __forceinline__ void seal_one(const layer_dev &l, const uint8_t *base, uint32_t h, uint8_t *dst,
					 const rows &src, uint8_t *smem, uint32_t parts)
{
	if constexpr (TILES && tiles_pair<FK, FV>::ok)
		seal_head_tiles<FK, FV>(l, dst, src, smem);
	else
		seal_head<FK, FV>(l, base, h, dst, src, smem, parts);
}

__device__ __forceinline__ uint8_t *sealed_head_w(const layer_dev &l, uint8_t *base, uint32_t id, uint32_t h)
{
	return const_cast<uint8_t *>(sealed_head(l, base, id, h));
}

/* Copies input rows into an open slot's rows (16 bytes at a time: D % 8 == 0),
 * a rotated layer's through append_rows_rot_g or append_rows_rot (rows.cuh). */
__device__ void append_rows(const layer_dev &l, uint8_t *open, uint32_t r0, uint32_t r1,
			    const uint8_t *in_k, const uint8_t *in_v, uint64_t in_row, uint32_t in_stride)
{
	if (l.rot && (l.D == 64 || l.D == 128)) {
		if (l.D == 64)
			append_rows_rot_g<1>(l, open, r0, r1, in_k, in_v, in_row, in_stride);
		else
			append_rows_rot_g<2>(l, open, r0, r1, in_k, in_v, in_row, in_stride);
		return;
	}
	if (l.rot) {
#define APPEND_ROT(E) append_rows_rot<E>(l, open, r0, r1, in_k, in_v, in_row, in_stride)
		KVQ_LANE_ELEMS(l.D, APPEND_ROT)
#undef APPEND_ROT
		return;
	}
	const uint32_t row = l.D * 2, vec = row / 16;
	const uint32_t total = (r1 - r0) * vec * 2;

	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		uint32_t is_v = i / ((r1 - r0) * vec), j = i % ((r1 - r0) * vec);
		uint32_t r = r0 + j / vec, x = j % vec;
		const uint8_t *in = (is_v ? in_v : in_k) + (in_row + (r - r0)) * in_stride;
		uint8_t *o = open + (is_v ? (size_t)l.B * row : 0) + (size_t)r * row;
		reinterpret_cast<uint4 *>(o)[x] = reinterpret_cast<const uint4 *>(in)[x];
	}
}

/* Staged seal: eleven CTAs of 128 threads per SM, as many as the staged
 * rows' shared memory allows (40 registers; some pairs' kernels spill a few
 * bytes): the more blocks in different phases at once, the more their
 * staging, barriers and arithmetic overlap (on an H200, 6 CTAs of 256
 * threads were 8-16 % slower).  By tiles (TILES): CTAs of two warps, twelve
 * per SM.
 * FK, FV: the formats of K and V, or ANY_FMT (chosen per part inside). */
template <int FK, int FV, int TILES>
__global__ void __launch_bounds__(TILES ? TILE_THREADS : WRITE_THREADS, TILES ? 12 : 11)
	write_kernel(layer_dev l, uint8_t *base, const kvq_seq_table *seqs, const uint8_t *kin, const uint8_t *vin,
		     uint32_t parts)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const kvq_seq_table s = seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, B = l.B;
	const uint64_t n = s.n, n2 = (uint64_t)s.n + s.m;
	const uint32_t s0 = split_of(l, s.n), s1 = split_of(l, (uint32_t)n2);
	const uint32_t blk = s0 / B + blockIdx.x;
	const uint32_t stride = l.H * l.D * 2;
	const uint64_t pos0 = (uint64_t)blk * B;

	if (pos0 >= n2)
		return;
	/* a sink block (kernels/layout.h) lives in its sink slice, an open
	 * one, and is never sealed */
	const bool sink = blk == 0 && s.sink;
	int32_t o = -1;
	if (sink) {
		if (s.sink > l.n_sink)
			return;
		o = (int32_t)kvq_table_sink_open_id(l.n_open, s.sink);
	} else if (pos0 < n || blk >= s1 / B) {
		o = s.open[blk - s0 / B];
		if (o < 0 || (uint32_t)o >= l.n_open)
			return;
	}
	if (blk < s1 / B && !sink) {
		int32_t sid = s.sealed[blk];
		if (sid < 0 || (uint32_t)sid >= l.n_sealed)
			return;
		rows src;
		src.open = o >= 0 ? open_head(l, base, (uint32_t)o, h) : NULL;
		src.in_k = kin + (size_t)h * l.D * 2;
		src.in_v = vin + (size_t)h * l.D * 2;
		src.from_open = pos0 < n ? (uint32_t)(n - pos0 < B ? n - pos0 : B) : 0;
		src.in_row = (uint64_t)s.row0 + (pos0 + src.from_open - n);
		src.in_stride = stride;
		seal_one<FK, FV, TILES>(l, base, h, sealed_head_w(l, base, (uint32_t)sid, h), src, smem, parts);
		return;
	}
	uint64_t p0 = pos0 > n ? pos0 : n, p1 = pos0 + B < n2 ? pos0 + B : n2;
	if (p1 <= p0)
		return;   /* a window block of stored tokens that stays open */
	append_rows(l, const_cast<uint8_t *>(open_head(l, base, (uint32_t)o, h)), (uint32_t)(p0 - pos0),
		    (uint32_t)(p1 - pos0), kin + (size_t)h * l.D * 2, vin + (size_t)h * l.D * 2,
		    s.row0 + (p0 - n), stride);
}

template <int FK, int FV, int TILES>
__global__ void __launch_bounds__(TILES ? TILE_THREADS : WRITE_THREADS)
	seal_kernel(layer_dev l, uint8_t *base, const int32_t *pairs, uint32_t parts)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const int32_t o = pairs[2 * blockIdx.x], sid = pairs[2 * blockIdx.x + 1];
	const uint32_t h = blockIdx.y;

	if (o < 0 || (uint32_t)o >= l.n_open || sid < 0 || (uint32_t)sid >= l.n_sealed)
		return;
	rows src;
	src.open = open_head(l, base, (uint32_t)o, h);
	src.in_k = src.in_v = NULL;
	src.from_open = l.B;
	src.in_row = 0;
	src.in_stride = 0;
	seal_one<FK, FV, TILES>(l, base, h, sealed_head_w(l, base, (uint32_t)sid, h), src, smem, parts);
}

/* The write and seal kernels for a layer: its pair's own where the pair has
 * attention kernels (instances.h), else the one that chooses per part. */
template <int FK, int FV> static const void *tiles_write(void)
{
	if constexpr (tiles_pair<FK, FV>::ok)
		return (const void *)write_kernel<FK, FV, 1>;
	return NULL;
}

template <int FK, int FV> static const void *tiles_seal(void)
{
	if constexpr (tiles_pair<FK, FV>::ok)
		return (const void *)seal_kernel<FK, FV, 1>;
	return NULL;
}

struct write_fns {
	int k, v;
	const void *write, *seal;       /* staged */
	const void *write_t, *seal_t;   /* by tiles, or NULL */
};
#define WRITE_PAIR(K, V) \
	{ KVQ_FMT_##K, KVQ_FMT_##V, (const void *)write_kernel<KVQ_FMT_##K, KVQ_FMT_##V, 0>, \
	  (const void *)seal_kernel<KVQ_FMT_##K, KVQ_FMT_##V, 0>, tiles_write<KVQ_FMT_##K, KVQ_FMT_##V>(), \
	  tiles_seal<KVQ_FMT_##K, KVQ_FMT_##V>() },
static const write_fns fns_by_pair[] = { KVQ_CUDA_PAIRS(WRITE_PAIR) };
#undef WRITE_PAIR
static const write_fns fns_any = { ANY_FMT, ANY_FMT, (const void *)write_kernel<ANY_FMT, ANY_FMT, 0>,
				   (const void *)seal_kernel<ANY_FMT, ANY_FMT, 0>, NULL, NULL };

/* The kernel of a layer's write (or seal), its CTA's threads, its parts
 * staged at once and its shared memory: by tiles where its pair has them
 * and they fit, else staged. */
struct write_plan {
	const void *fn;
	uint32_t threads, parts;
	size_t smem;
};

static write_plan plan_for(const layer_dev &l, bool seal)
{
	const write_fns *f = &fns_any;

	for (const write_fns &p : fns_by_pair)
		if (p.k == l.kfmt && p.v == l.vfmt)
			f = &p;
	if (f->write_t && tiles_fit(l))
		return { seal ? f->seal_t : f->write_t, TILE_THREADS, 2, tiles_smem(l.B, l.D) };
	const uint32_t parts = seal_parts(l.B, l.D);
	return { seal ? f->seal : f->write, WRITE_THREADS, parts, seal_smem(l.B, l.D, parts) };
}

static int write_args_ok(const struct kvq_layout *L, uint32_t layer)
{
	if (!L || layer >= L->layers || L->head_dim % 8 || seal_smem(L->block_tokens, L->head_dim, 1) > 160 * 1024)
		return 0;
	return 1;
}

static int launch_setup(const void *fn, size_t smem)
{
	if (smem > 48 * 1024 &&
	    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
		return fail_launch();
	return 0;
}

} /* namespace kvq */

using namespace kvq;

extern "C" int kvq_cuda_write(const struct kvq_layout *L, void *base, uint32_t layer,
			      const struct kvq_seq_table *seqs, uint32_t nseq, uint32_t max_m,
			      const void *k, const void *v, void *stream)
{
	if (!write_args_ok(L, layer) || !base || (nseq && !seqs) || (max_m && (!k || !v)) ||
	    max_m > (1u << 24) || nseq > 65535 || L->kv_heads > 65535)
		return -EINVAL;
	if (!nseq)
		return 0;
	const uint32_t B = L->block_tokens;
	/* blocks from S(n)/B to the last one holding a new token */
	const uint32_t nblk = (L->window + max_m) / B + 2;
	layer_dev ld = layer_of(L, layer);
	write_plan w = plan_for(ld, false);
	int r = launch_setup(w.fn, w.smem);
	if (r)
		return r;
	uint8_t *b = (uint8_t *)base;
	const uint8_t *kin = (const uint8_t *)k, *vin = (const uint8_t *)v;
	void *args[] = { &ld, &b, &seqs, &kin, &vin, &w.parts };
	return cudaLaunchKernel(w.fn, dim3(nblk, L->kv_heads, nseq), dim3(w.threads), args, w.smem,
				(cudaStream_t)stream) == cudaSuccess ? 0 : fail_launch();
}

extern "C" int kvq_cuda_seal(const struct kvq_layout *L, void *base, uint32_t layer,
			     const int32_t *pairs, uint32_t npairs, void *stream)
{
	if (!write_args_ok(L, layer) || !base || (npairs && !pairs) || npairs > (1u << 30) || L->kv_heads > 65535)
		return -EINVAL;
	if (!npairs)
		return 0;
	layer_dev ld = layer_of(L, layer);
	write_plan w = plan_for(ld, true);
	int r = launch_setup(w.fn, w.smem);
	if (r)
		return r;
	uint8_t *b = (uint8_t *)base;
	void *args[] = { &ld, &b, &pairs, &w.parts };
	return cudaLaunchKernel(w.fn, dim3(npairs, L->kv_heads), dim3(w.threads), args, w.smem,
				(cudaStream_t)stream) == cudaSuccess ? 0 : fail_launch();
}
