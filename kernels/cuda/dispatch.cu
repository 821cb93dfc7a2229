/* SPDX-License-Identifier: Apache-2.0 */
/* The attention dispatcher, the one place that chooses: attention
 * arguments checked, the kernel and the launch shape chosen (rows per CTA,
 * tokens per tile, KV splits), and (K format, V format, head dim, dtype)
 * turned into an instance of instances.h, or -ENOTSUP.  In blocks of a
 * multiple of 32 tokens, pairs with fast kernels whose groups fit the head
 * dim go to decode_kernel for a step of at most 8 query rows per KV head
 * and to prefill_kernel for more, pairs with pq kernels to
 * pq_decode_kernel for such a step; the rest to attn_kernel (choose()).
 * With KVQ_CUDA_KERNELS=sm90, on a device of compute capability 9.0, a
 * row with sm90 takes decode90_kernel (decode_sm90.cuh) for
 * decode_kernel's steps, unless the layer's sealed head slices do not fit
 * its ring.
 * A layer that rotates K or V: decode_kernel (and decode90_kernel, whose
 * stages are its own) and pq_decode_kernel rotate q as they load it and
 * their output in the epilogue (merge_kernel after a split's merge);
 * around prefill_kernel and attn_kernel, q is rotated into the workspace
 * first and the output taken in fp32 into the workspace and rotated back
 * into out after (rot_rows_kernel, rot_in_kernel). */
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"
#include "decode.cuh"
#include "decode_pq.cuh"
#include "decode_sm90.h"
#include "instances.h"
#include "prefill.cuh"

namespace kvq {

static thread_local cudaError_t last_error = cudaSuccess;

int fail_launch(void)
{
	last_error = cudaGetLastError();
	if (last_error == cudaSuccess)
		last_error = cudaErrorUnknown;
	return -EIO;
}

/* Every instance of instances.h, declared (the compile files build them). */
#define KVQ_EXTERN(KF, VF, D, ACT, attn, fast, pq, sm90) \
	KVQ_CUDA_IF(attn, KVQ_CUDA_DECL_attn(KF, VF, D, ACT, extern template)) \
	KVQ_CUDA_IF(fast, KVQ_CUDA_DECL_decode(KF, VF, D, ACT, extern template) \
			  KVQ_CUDA_DECL_prefill(KF, VF, D, ACT, extern template)) \
	KVQ_CUDA_IF(pq, KVQ_CUDA_DECL_pq(KF, VF, D, ACT, extern template)) \
	KVQ_CUDA_IF(KVQ_CUDA_SM90_COL(fast, sm90), KVQ_CUDA_DECL_decode90(KF, VF, D, ACT, extern template))
KVQ_CUDA_ALL(KVQ_EXTERN)
#undef KVQ_EXTERN

typedef int (*attn_fn)(const attn_args &, uint32_t, void *);

/* The kernels of one instance (K format, V format, head dim, dtype), each
 * NULL where its row in instances.h has none. */
struct kernels {
	attn_fn attn;            /* attn_kernel */
	attn_fn decode;          /* decode_kernel */
	int (*decode_occupancy)(void);
	attn_fn prefill;         /* prefill_kernel */
	int (*prefill_rows)(void);   /* query rows per CTA */
	attn_fn pq;              /* pq_decode_kernel */
	attn_fn decode90;        /* decode90_kernel (Hopper) */
	int (*decode90_occupancy)(uint32_t slice);
	bool hopper;             /* decode is decode90 (choose()) */
};

static kernels find(int kf, int vf, uint32_t D, int act)
{
#define KVQ_FIND(KF, VF, DD, ACT, attn, fast, pq, sm90) \
	if (kf == KF && vf == VF && D == DD && act == ACT) \
		return kernels{ KVQ_CUDA_OR_NULL(attn, attn_launch<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(fast, decode_launch<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(fast, decode_occupancy<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(fast, prefill_launch<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(fast, prefill_rows<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(pq, pq_decode_launch<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(KVQ_CUDA_SM90_COL(fast, sm90), decode90_launch<KF, VF, DD, ACT>), \
				KVQ_CUDA_OR_NULL(KVQ_CUDA_SM90_COL(fast, sm90), decode90_occupancy<KF, VF, DD, ACT>), \
				false };
	KVQ_CUDA_ALL(KVQ_FIND)
#undef KVQ_FIND
	return kernels{ NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false };
}

/* Tokens per tile: the largest of 64, 48, 32, 16 that divides B. */
static uint32_t tile_tokens(uint32_t B)
{
	return B % 64 == 0 ? 64 : B % 48 == 0 ? 48 : B % 32 == 0 ? 32 : 16;
}

/* KVQ_CUDA_KERNELS, read once: "sm90" takes the Hopper (sm_90a) decode
 * kernel of a row with sm90 on a device of compute capability 9.0;
 * anything else is "auto", which keeps every call on the kernels above,
 * which run on sm_80 and later: on an H200 the Hopper kernel is correct
 * but slower than them for every quantized format (bench/RESULTS.md,
 * 2026-12-06, issue 41), so it is opt-in until it wins. */
static const char *kernels_mode(void)
{
	static const char *const mode = [] {
		const char *e = getenv("KVQ_CUDA_KERNELS");
		return e && !strcmp(e, "sm90") ? "sm90" : "auto";
	}();
	return mode;
}

/* Whether the current device is a Hopper GPU (compute capability exactly
 * 9.0, what sm_90a code runs on); false on a CUDA error. */
static bool hopper_device(void)
{
	int dev = 0, major = 0, minor = 0;

	return cudaGetDevice(&dev) == cudaSuccess &&
	       cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
	       cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
	       minor == 0;
}

/* The one place that chooses the kernels of a call, the rest cleared from
 * its instance's: in blocks of a multiple of 32 tokens whose groups fit
 * the head dim, decode_kernel or pq_decode_kernel for at most 8 query rows
 * per KV head and prefill_kernel for more; attn_kernel always.  The family
 * too (kernels_mode()): with "sm90" on a Hopper device, decode90_kernel in place of
 * decode_kernel where the row has it, the pool (base) is 16-byte aligned
 * for the bulk copies and the layer's sealed head slices fit its ring. */
static kernels choose(int kf, int vf, const struct kvq_layout *L, const struct kvq_layer_layout *ll,
		      const void *base, uint32_t rows)
{
	const bool fast = L->block_tokens % DEC_CHUNK == 0 && kvq_fmt_group(kf, 0) <= L->head_dim &&
			  kvq_fmt_group(vf, 1) <= L->head_dim;
	kernels k = find(kf, vf, L->head_dim, L->act);

	if (!fast || rows > 8) {
		k.decode = k.pq = NULL;
		k.decode_occupancy = NULL;
	}
	if (!fast || rows <= 8) {
		k.prefill = NULL;
		k.prefill_rows = NULL;
	}
	if (k.decode && k.decode90 && !strcmp(kernels_mode(), "sm90") && !((uintptr_t)base & 15) &&
	    hopper_device() && k.decode90_occupancy(ll->sealed_head) > 0) {
		k.decode = k.decode90;
		k.hopper = true;
	}
	return k;
}

struct shape {
	uint32_t g, nrp, chunks, tt, splits;
	kernels k;   /* choose() */
};

/* Splits for decode_kernel: CTAs of equal work fill the GPU in whole waves,
 * so choose the split count whose last wave is fullest, counting a small
 * cost per split (the partials and their merge). */
static uint32_t decode_splits(uint64_t ctas, uint32_t slots, uint32_t nch)
{
	uint32_t most = nch / (2 * DEC_WARPS), best = 1;
	double best_cost = 1e30;

	most = most < 1 ? 1 : most > 64 ? 64 : most;
	for (uint32_t s = 1; s <= most; s++) {
		uint64_t waves = (ctas * s + slots - 1) / slots;
		double cost = (double)waves / s * (1.0 + 0.01 * s) + (s > 1 ? 0.03 : 0.0);
		if (cost < best_cost) {
			best_cost = cost;
			best = s;
		}
	}
	return best;
}

static int shape_of(const struct kvq_cuda_attn *a, uint32_t nseq, struct shape *ret)
{
	const struct kvq_layout *L = a->L;
	struct shape s;

	if (!L || a->layer >= L->layers || !a->base || !L->kv_heads || a->q_heads % L->kv_heads)
		return -EINVAL;
	s.g = a->q_heads / L->kv_heads;
	if (s.g < 1 || s.g > 8 || a->max_q < 1 || a->max_q > (1u << 20) || a->max_q > a->max_n ||
	    a->max_n > (1u << 30) || a->total_q < a->max_q || a->total_q > (1u << 24) || nseq > 65535 ||
	    a->q_dtype != L->act || !(a->scale > 0.0f) || isinf(a->scale) ||
	    (a->out_dtype != KVQ_DT_F16 && a->out_dtype != KVQ_DT_BF16 && a->out_dtype != KVQ_DT_F32))
		return -EINVAL;
	const int kf = L->layer[a->layer].kfmt, vf = L->layer[a->layer].vfmt;
	uint32_t rows = a->max_q * s.g;
	s.k = choose(kf, vf, L, &L->layer[a->layer], a->base, rows);
	if (s.k.prefill) {
		s.nrp = (uint32_t)s.k.prefill_rows();
		s.tt = PF_TILE;
	} else if (s.k.pq) {
		s.nrp = PQ_ROWS;
		s.tt = PQ_CHUNK;
	} else {
		s.nrp = rows >= ATTN_MAX_ROWS ? ATTN_MAX_ROWS : (rows + 7) / 8 * 8;
		s.tt = tile_tokens(L->block_tokens);
	}
	s.chunks = (rows + s.nrp - 1) / s.nrp;
	if ((uint64_t)s.chunks * L->kv_heads > 65535)
		return -EINVAL;
	uint32_t ntiles = (a->max_n + s.tt - 1) / s.tt;
	if (s.k.decode || s.k.pq) {
		uint32_t nch = (a->max_n + DEC_CHUNK - 1) / DEC_CHUNK;
		if (a->splits) {
			s.splits = a->splits < nch ? a->splits : nch;
		} else {
			/* pq_decode_kernel: one CTA per SM (its tables) */
			int dev = 0, sms = 132;
			const int occ = s.k.hopper   ? s.k.decode90_occupancy(L->layer[a->layer].sealed_head)
					: s.k.decode ? s.k.decode_occupancy()
						     : 1;
			if (cudaGetDevice(&dev) != cudaSuccess ||
			    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
				return fail_launch();
			uint64_t ctas = (uint64_t)(nseq ? nseq : 1) * L->kv_heads * (s.k.pq ? s.chunks : 1);
			s.splits = decode_splits(ctas, (uint32_t)(sms * (occ > 0 ? occ : 1)), nch);
		}
	} else if (a->splits) {
		s.splits = a->splits < ntiles ? a->splits : ntiles;
	} else {
		/* enough CTAs for two waves, each split at least four tiles long */
		int dev = 0, sms = 132;
		if (cudaGetDevice(&dev) != cudaSuccess ||
		    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
			return fail_launch();
		uint64_t ctas = (uint64_t)(nseq ? nseq : 1) * L->kv_heads * s.chunks;
		uint64_t want = (2ull * sms + ctas - 1) / ctas;
		uint32_t most = ntiles / 4 ? ntiles / 4 : 1;
		s.splits = (uint32_t)(want < most ? want : most);
		if (s.splits > 64)
			s.splits = 64;
	}
	if (s.splits < 1)
		s.splits = 1;
	*ret = s;
	return 0;
}

/* The rotation (KVQ_ROT_K, KVQ_ROT_V) the launched kernel does itself: the
 * decode and pq-decode kernels rotate q as they load it and the output in
 * their epilogue (and merge_kernel after the merge); around the others
 * dispatch runs rot_rows_kernel before and after. */
static uint32_t rot_in_kernel(const struct kvq_cuda_attn *a, const struct shape &s)
{
	return (s.k.decode || (!s.k.prefill && s.k.pq)) && a->L->head_dim % 32 == 0 ? a->L->layer[a->layer].rot : 0;
}

/* The workspace: split partials, then a rotated layer's q (K rotated) and
 * fp32 output (V rotated) where the kernel does not rotate them itself,
 * each 256-byte aligned. */
struct ws_parts {
	size_t partials, q, out, total;
};

static ws_parts ws_layout(const struct kvq_cuda_attn *a, const struct shape &s)
{
	const size_t rows = (size_t)a->total_q * a->q_heads, D = a->L->head_dim;
	const uint32_t rot = a->L->layer[a->layer].rot & ~rot_in_kernel(a, s);
	ws_parts w;

	w.partials = s.splits > 1 ? ((size_t)s.splits * rows * (D + 2) * sizeof(float) + 255) & ~(size_t)255 : 0;
	w.q = rot & KVQ_ROT_K ? (rows * D * 2 + 255) & ~(size_t)255 : 0;
	w.out = rot & KVQ_ROT_V ? rows * D * sizeof(float) : 0;
	w.total = w.partials + w.q + w.out;
	return w;
}

static size_t ws_bytes(const struct kvq_cuda_attn *a, const struct shape &s)
{
	return ws_layout(a, s).total;
}

/* Rows (query token, head) of every sequence's queries, D elements each,
 * from src (dtype sdt) rotated into dst (dtype ddt), blocks of n
 * (warp_rotate): a warp per row, rows of nothing left untouched. */
template <uint32_t E>
__global__ void rot_rows_kernel(const kvq_seq_table *seqs, const void *src, int sdt, void *dst, int ddt,
				uint32_t q_heads, uint32_t n)
{
	const kvq_seq_table s = seqs[blockIdx.z];
	const uint32_t qi = blockIdx.x, head = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
	const uint32_t lane = threadIdx.x & 31, D = 32 * E;

	if (qi >= s.m || s.m > s.n || head >= q_heads)
		return;
	const size_t r = ((size_t)(s.row0 + qi) * q_heads + head) * D;
	float x[E];
#pragma unroll
	for (uint32_t i = 0; i < E; i++) {
		const size_t j = r + 32 * i + lane;
		const uint16_t h = sdt == KVQ_DT_F32 ? 0 : reinterpret_cast<const uint16_t *>(src)[j];
		x[i] = sdt == KVQ_DT_F32 ? reinterpret_cast<const float *>(src)[j]
		       : sdt == KVQ_DT_BF16 ? kvq_bf16_to_f32(h) : kvq_f16_to_f32(h);
	}
	warp_rotate<E>(x, n);
#pragma unroll
	for (uint32_t i = 0; i < E; i++)
		store_out(ddt, dst, r + 32 * i + lane, x[i]);
}

} /* namespace kvq */

using namespace kvq;

extern "C" const char *kvq_cuda_error(void)
{
	return cudaGetErrorString(last_error);
}

extern "C" const char *kvq_cuda_kernels(void)
{
	return kernels_mode();
}

extern "C" int kvq_cuda_attention_supported(int kfmt, int vfmt, uint32_t head_dim, int act)
{
	unsigned gk = kvq_fmt_group(kfmt, 0), gv = kvq_fmt_group(vfmt, 1);

	if ((gk && head_dim % gk) || (gv && head_dim % gv))
		return 0;
	return find(kfmt, vfmt, head_dim, act).attn != NULL;
}

extern "C" size_t kvq_cuda_attention_workspace(const struct kvq_cuda_attn *a, uint32_t nseq)
{
	struct shape s;

	if (!a || shape_of(a, nseq, &s))
		return 0;
	return ws_bytes(a, s);
}

/* The splits the launch uses: those chosen, or one when the workspace
 * does not hold them (-EINVAL when the caller asked for them). */
static int launch_splits(const struct kvq_cuda_attn *a, struct shape &s)
{
	if (ws_bytes(a, s) > a->workspace_bytes || (ws_bytes(a, s) && !a->workspace)) {
		if (a->splits)
			return -EINVAL;
		s.splits = 1;
		/* a rotated layer's buffers are not optional */
		if (ws_bytes(a, s) > a->workspace_bytes || (ws_bytes(a, s) && !a->workspace))
			return -EINVAL;
	}
	return 0;
}

/* rot_rows_kernel over every sequence's query rows. */
static int rot_rows(const struct kvq_cuda_attn *a, const struct kvq_seq_table *seqs, uint32_t nseq,
		    const void *src, int sdt, void *dst, int ddt, int is_v)
{
	const uint32_t D = a->L->head_dim, n = kvq_rot_block(D, is_v), hpb = 4;
	const dim3 grid(a->max_q, (a->q_heads + hpb - 1) / hpb, nseq);
	cudaStream_t st = (cudaStream_t)a->stream;

#define ROT_ROWS(E) rot_rows_kernel<E><<<grid, 32 * hpb, 0, st>>>(seqs, src, sdt, dst, ddt, a->q_heads, n)
	KVQ_LANE_ELEMS(D, ROT_ROWS)
#undef ROT_ROWS
	return cudaPeekAtLastError() == cudaSuccess ? 0 : fail_launch();
}

extern "C" const char *kvq_cuda_attention_plan(const struct kvq_cuda_attn *a, uint32_t nseq, uint32_t *splits)
{
	struct shape s;

	if (!a || shape_of(a, nseq, &s) || launch_splits(a, s))
		return NULL;
	const struct kvq_layer_layout *ll = &a->L->layer[a->layer];
	if (!kvq_cuda_attention_supported(ll->kfmt, ll->vfmt, a->L->head_dim, a->L->act))
		return NULL;
	if (splits)
		*splits = s.splits;
	return s.k.hopper ? "decode-sm90" : s.k.decode ? "decode" : s.k.prefill ? "prefill" : s.k.pq ? "pq-decode" : "generic";
}

extern "C" int kvq_cuda_attention(const struct kvq_cuda_attn *a, const struct kvq_seq_table *seqs, uint32_t nseq,
				  const void *q, void *out)
{
	struct shape s;
	int r;

	if (!a || (nseq && (!seqs || !q || !out)))
		return -EINVAL;
	if ((r = shape_of(a, nseq, &s)))
		return r;
	if (!nseq)
		return 0;
	const struct kvq_layer_layout *ll = &a->L->layer[a->layer];
	if (!kvq_cuda_attention_supported(ll->kfmt, ll->vfmt, a->L->head_dim, a->L->act))
		return -ENOTSUP;
	if ((r = launch_splits(a, s)))
		return r;
	const ws_parts w = ws_layout(a, s);
	const uint32_t fused = rot_in_kernel(a, s), around = ll->rot & ~fused;
	uint8_t *wsb = (uint8_t *)a->workspace;
	if (around & KVQ_ROT_K) {   /* q into K's basis */
		if ((r = rot_rows(a, seqs, nseq, q, a->q_dtype, wsb + w.partials, a->q_dtype, 0)))
			return r;
		q = wsb + w.partials;
	}
	attn_args x;
	x.l = layer_of(a->L, a->layer);
	x.base = (const uint8_t *)a->base;
	x.seqs = seqs;
	x.q = q;
	x.out = around & KVQ_ROT_V ? wsb + w.partials + w.q : out;   /* fp32, rotated back below */
	x.ws = (float *)a->workspace;
	x.scale = a->scale;
	x.out_dtype = around & KVQ_ROT_V ? KVQ_DT_F32 : a->out_dtype;
	x.rot = fused;
	x.g = s.g;
	x.q_heads = a->q_heads;
	x.chunks = s.chunks;
	x.nrp = s.nrp;
	x.tt = s.tt;
	x.splits = s.splits;
	x.total_q = a->total_q;
	x.max_q = a->max_q;
	attn_fn launch = s.k.decode ? s.k.decode : s.k.prefill ? s.k.prefill : s.k.pq ? s.k.pq : s.k.attn;
	if ((r = launch(x, nseq, a->stream)))
		return r;
	if (around & KVQ_ROT_V)   /* the output out of V's basis, then to its dtype */
		return rot_rows(a, seqs, nseq, x.out, KVQ_DT_F32, out, a->out_dtype, 1);
	return 0;
}
