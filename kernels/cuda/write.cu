/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Append and seal on the GPU.  One CTA per (block, KV head): a block that
 * leaves the open window is read once (its rows from the open slot and from
 * the input alike) into shared memory, its parameters are computed there and
 * its codes written in storage order, whole bytes at a time; the format
 * arithmetic is kvq_format.h's, so the bytes equal the CPU seal's
 * (kernels/cpu/write.c): that header has no expression a compiler could
 * contract into an FMA.
 */
#include "common.cuh"

namespace kvq {

#define WRITE_THREADS 256

/* Shared memory of the seal: B x D activations of one part, then parameters. */
static size_t seal_smem(uint32_t B, uint32_t D)
{
	return (size_t)B * D * 2 + (size_t)B * (D / 32 > 1 ? D / 32 : 1) * 4 + (size_t)D * 4 + 16;
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

__device__ __forceinline__ float act_val(int act, uint16_t x)
{
	return act == KVQ_DT_BF16 ? kvq_bf16_to_f32(x) : kvq_f16_to_f32(x);
}

/* Quantizes one part (K or V) from xs ([t][d] activation words) into codes
 * and params, as seal_part() in kernels/cpu/write.c. */
__device__ void seal_part(const layer_dev &l, int f, int is_v, const uint16_t *xs, uint16_t *ps,
			  uint8_t *codes, uint8_t *params, uint32_t code_bytes)
{
	const uint32_t B = l.B, D = l.D;
	const int kind = kvq_fmt_param_kind(f, is_v);
	const unsigned bits = kvq_fmt_bits(f), G = kvq_fmt_group(f, is_v);
	const float qmax = kvq_fmt_qmax(f);
	const uint32_t np = kvq_param_count(kind, G, B, D);

	/* parameters: one thread per entry */
	for (uint32_t j = threadIdx.x; j < np; j += blockDim.x) {
		if (kind == KVQ_PARAM_TOKEN) {
			float amax = 0.0f;
			for (uint32_t d = 0; d < D; d++)
				amax = fmaxf(amax, fabsf(act_val(l.act, xs[j * D + d])));
			ps[j] = kvq_sym_scale(amax, qmax);
			reinterpret_cast<uint16_t *>(params)[j] = ps[j];
			continue;
		}
		/* GROUP entries are [t][g] for K and [g][t] for V; CHANNEL: [d] */
		uint32_t t0, t1, d0, d1;
		if (kind == KVQ_PARAM_CHANNEL) {
			t0 = 0; t1 = B; d0 = j; d1 = j + 1;
		} else if (is_v) {
			t0 = j % B; t1 = t0 + 1; d0 = (j / B) * G; d1 = d0 + G;
		} else {
			t0 = j / (D / G); t1 = t0 + 1; d0 = (j % (D / G)) * G; d1 = d0 + G;
		}
		float mn = INFINITY, mx = -INFINITY;
		for (uint32_t t = t0; t < t1; t++)
			for (uint32_t d = d0; d < d1; d++) {
				float x = act_val(l.act, xs[t * D + d]);
				mn = fminf(mn, x);
				mx = fmaxf(mx, x);
			}
		uint16_t s, z;
		kvq_asym_params(mn, mx, qmax, &s, &z);
		ps[2 * j] = s;
		ps[2 * j + 1] = z;
		reinterpret_cast<uint16_t *>(params)[2 * j] = s;
		reinterpret_cast<uint16_t *>(params)[2 * j + 1] = z;
	}
	__syncthreads();

	/* codes: one thread per byte (per 16-bit word for f16/bf16) */
	const uint32_t per = bits == 16 ? 1 : 8 / bits;
	const uint32_t units = bits == 16 ? B * D : code_bytes;
	for (uint32_t u = threadIdx.x; u < units; u += blockDim.x) {
		uint32_t byte = 0;
		for (uint32_t e = 0; e < per; e++) {
			uint32_t i = u * per + e, t, d;
			if (is_v)
				kvq_v_elem_td(i, B, D, &t, &d);
			else
				kvq_k_elem_td(i, B, D, &t, &d);
			float x = act_val(l.act, xs[t * D + d]);
			uint32_t c;
			if (kind == KVQ_PARAM_NONE) {
				reinterpret_cast<uint16_t *>(codes)[i] =
					f == KVQ_FMT_BF16 ? kvq_bf16_from_f32(x) : kvq_f16_from_f32(x);
				continue;
			}
			uint32_t pi = kvq_param_index(kind, G, is_v, t, d, B, D);
			if (kind == KVQ_PARAM_TOKEN)
				c = kvq_code_sym(f, x, kvq_f16_to_f32(ps[pi]));
			else
				c = kvq_code_asym(x, kvq_f16_to_f32(ps[2 * pi]), kvq_f16_to_f32(ps[2 * pi + 1]), qmax);
			byte |= c << (e * bits);
		}
		if (bits != 16)
			codes[u] = (uint8_t)byte;
	}
	__syncthreads();
}

/* Seals one head of one block into the sealed head slice dst. */
__device__ void seal_head(const layer_dev &l, uint8_t *dst, const rows &src, uint8_t *smem)
{
	const uint32_t B = l.B, D = l.D;
	uint16_t *xs = reinterpret_cast<uint16_t *>(smem);
	uint16_t *ps = xs + (size_t)B * D;

	/* bytes of the slice that belong to no field are zero, as on the CPU */
	for (uint32_t i = threadIdx.x; i < l.sealed_head; i += blockDim.x) {
		bool in = false;
		for (int f = 0; f < KVQ_NFIELDS; f++)
			in |= i >= l.off[f] && i < l.off[f] + l.size[f];
		if (!in)
			dst[i] = 0;
	}
	for (int is_v = 0; is_v < 2; is_v++) {
		for (uint32_t i = threadIdx.x; i < B * D; i += blockDim.x)
			xs[i] = src.get(l, i / D, is_v)[i % D];
		__syncthreads();
		seal_part(l, is_v ? l.vfmt : l.kfmt, is_v, xs, ps,
			  dst + l.off[is_v ? KVQ_V_CODES : KVQ_K_CODES],
			  dst + l.off[is_v ? KVQ_V_PARAMS : KVQ_K_PARAMS],
			  l.size[is_v ? KVQ_V_CODES : KVQ_K_CODES]);
	}
}

__device__ __forceinline__ uint8_t *sealed_head_w(const layer_dev &l, uint8_t *base, uint32_t id, uint32_t h)
{
	return const_cast<uint8_t *>(sealed_head(l, base, id, h));
}

/* Copies input rows into an open slot's rows (16 bytes at a time: D % 8 == 0). */
__device__ void append_rows(const layer_dev &l, uint8_t *open, uint32_t r0, uint32_t r1,
			    const uint8_t *in_k, const uint8_t *in_v, uint64_t in_row, uint32_t in_stride)
{
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

__global__ void write_kernel(layer_dev l, uint8_t *base, const kvq_cuda_write_seq *seqs,
			     const uint8_t *kin, const uint8_t *vin)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const kvq_cuda_write_seq s = seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, B = l.B;
	const uint64_t n = s.n, n2 = (uint64_t)s.n + s.m;
	const uint32_t s0 = split_of(l, s.n), s1 = split_of(l, (uint32_t)n2);
	const uint32_t blk = s0 / B + blockIdx.x;
	const uint32_t stride = l.H * l.D * 2;
	const uint64_t pos0 = (uint64_t)blk * B;

	if (pos0 >= n2)
		return;
	int32_t o = -1;
	if (pos0 < n || blk >= s1 / B) {
		o = s.open[blk - s0 / B];
		if (o < 0 || (uint32_t)o >= l.n_open)
			return;
	}
	if (blk < s1 / B) {
		int32_t sid = s.sealed[blk];
		if (sid < 0 || (uint32_t)sid >= l.n_sealed)
			return;
		rows src;
		src.open = o >= 0 ? open_head(l, base, (uint32_t)o, h) : NULL;
		src.in_k = kin + (size_t)h * l.D * 2;
		src.in_v = vin + (size_t)h * l.D * 2;
		src.from_open = pos0 < n ? (uint32_t)(n - pos0 < B ? n - pos0 : B) : 0;
		src.in_row = (uint64_t)s.in_row0 + (pos0 + src.from_open - n);
		src.in_stride = stride;
		seal_head(l, sealed_head_w(l, base, (uint32_t)sid, h), src, smem);
		return;
	}
	uint64_t p0 = pos0 > n ? pos0 : n, p1 = pos0 + B < n2 ? pos0 + B : n2;
	if (p1 <= p0)
		return;   /* a window block of stored tokens that stays open */
	append_rows(l, const_cast<uint8_t *>(open_head(l, base, (uint32_t)o, h)), (uint32_t)(p0 - pos0),
		    (uint32_t)(p1 - pos0), kin + (size_t)h * l.D * 2, vin + (size_t)h * l.D * 2,
		    s.in_row0 + (p0 - n), stride);
}

__global__ void seal_kernel(layer_dev l, uint8_t *base, const int32_t *pairs)
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
	seal_head(l, sealed_head_w(l, base, (uint32_t)sid, h), src, smem);
}

static int write_args_ok(const struct kvq_layout *L, uint32_t layer)
{
	if (!L || layer >= L->layers || L->head_dim % 8 || seal_smem(L->block_tokens, L->head_dim) > 160 * 1024)
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
			      const struct kvq_cuda_write_seq *seqs, uint32_t nseq, uint32_t max_m,
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
	const size_t smem = seal_smem(B, L->head_dim);
	int r = launch_setup((const void *)write_kernel, smem);
	if (r)
		return r;
	write_kernel<<<dim3(nblk, L->kv_heads, nseq), WRITE_THREADS, smem, (cudaStream_t)stream>>>(
		layer_of(L, layer), (uint8_t *)base, seqs, (const uint8_t *)k, (const uint8_t *)v);
	return cudaPeekAtLastError() == cudaSuccess ? 0 : fail_launch();
}

extern "C" int kvq_cuda_seal(const struct kvq_layout *L, void *base, uint32_t layer,
			     const int32_t *pairs, uint32_t npairs, void *stream)
{
	if (!write_args_ok(L, layer) || !base || (npairs && !pairs) || npairs > (1u << 30) || L->kv_heads > 65535)
		return -EINVAL;
	if (!npairs)
		return 0;
	const size_t smem = seal_smem(L->block_tokens, L->head_dim);
	int r = launch_setup((const void *)seal_kernel, smem);
	if (r)
		return r;
	seal_kernel<<<dim3(npairs, L->kv_heads), WRITE_THREADS, smem, (cudaStream_t)stream>>>(
		layer_of(L, layer), (uint8_t *)base, pairs);
	return cudaPeekAtLastError() == cudaSuccess ? 0 : fail_launch();
}
