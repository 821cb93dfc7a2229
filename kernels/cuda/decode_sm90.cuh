/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decode attention on Hopper (sm_90a): decode_kernel's arithmetic (decode.cuh:
 * its fragments, conversions, scores, online softmax, PV and epilogue) fed
 * from a ring of shared-memory stages that the bulk-copy engine fills,
 * instead of from loads into registers.  dispatch.cu takes it in place of
 * decode_kernel on a device of compute capability 9.0 for a row of
 * instances.h with sm90 (unless KVQ_CUDA_KERNELS=portable), where the
 * layer's sealed head slice fits two stages and the pool is 16-byte
 * aligned.
 *
 * One CTA per (KV split, KV head, sequence), as decode_kernel, with the
 * same splits (dispatch.cu: decode_splits) rounded up to whole blocks, and
 * the same partials and merge_kernel.  D90_CW consumer warps and one
 * producer warp:
 *  - the producer (one lane) copies each sealed block of the CTA's range,
 *    its whole head slice (K codes, K parameters, V codes, V parameters:
 *    one contiguous, 16-byte aligned run of sealed_head bytes, layout.h)
 *    with one cp.async.bulk into the next stage of the ring, completing
 *    on the stage's full mbarrier (expect_tx of exactly those bytes);
 *  - each consumer warp waits for every stage (full barrier), computes
 *    the 32-token chunks of it that are its own (chunk c of the k-th
 *    block of the range: warp (k·B/32 + c) mod D90_CW), reading its
 *    words from the stage with shared loads in decode_kernel's order
 *    (dec_load through dec_shm), and releases the stage (one arrival per
 *    warp on the empty barrier, which counts D90_CW);
 *  - the chunks of a sink block and of the open window (at most a block or
 *    two per sequence) the consumers read straight from global memory as
 *    decode_kernel does (dec_open).
 * A stage is one sealed head slice; the ring has as many as fit in
 * D90_RING_BYTES (2 .. D90_MAX_STAGES, d90_stages), so tens of KB are in
 * flight per CTA without a register spent on them.
 */
#ifndef KVQ_CUDA_DECODE_SM90_CUH
#define KVQ_CUDA_DECODE_SM90_CUH

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "decode_sm90.cuh is built for sm_90a only (decode_sm90_inst_*.cu)"
#endif

#include "decode.cuh"
#include "decode_sm90.h"

namespace kvq {

#define D90_CW 4                       /* consumer warps */
#define D90_THREADS ((D90_CW + 1) * 32)
#define D90_RING_BYTES (96u << 10)     /* a ring per CTA: two CTAs per multiprocessor */
#define D90_MAX_STAGES 16u
#define D90_SMEM_MAX (200u << 10)      /* dynamic shared memory of one CTA at most */

/* ---------------------------------------------- mbarriers and bulk copies
 * (PTX ISA: mbarrier, cp.async.bulk); addresses in the shared window. */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* The barriers' initialisation made visible to the other threads and to
 * the copy engine (then a CTA barrier). */
__device__ __forceinline__ void mbar_init_fence(void)
{
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
	asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(bar) : "memory");
}

/* Arrives and expects `bytes` more of transactions in the current phase. */
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
	asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(bar),
		     "r"(bytes)
		     : "memory");
}

/* Waits until the phase of parity `parity` of the barrier has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
	uint32_t done;
	do {
		asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			     "selp.u32 %0, 1, 0, p;\n\t}"
			     : "=r"(done)
			     : "r"(bar), "r"(parity)
			     : "memory");
	} while (!done);
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global
 * memory to shared memory by the copy engine, counted on barrier bar. */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
		     "l"(src), "r"(bytes), "r"(bar)
		     : "memory");
}

/* Shared memory that ordinary loads and stores used, ordered before the
 * copy engine's writes into it (then a CTA barrier). */
__device__ __forceinline__ void fence_proxy_async(void)
{
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* dec_load's words from a stage in shared memory (p: a generic address in
 * it, aligned as the same offset in global memory is: to the widest vector
 * that divides N).  volatile: no load may move above the stage's wait. */
struct dec_shm {
	template <int N> __device__ __forceinline__ void ld(uint32_t *dst, const uint8_t *p) const
	{
		const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
		if constexpr (N % 16 == 0) {
#pragma unroll
			for (int i = 0; i < N / 16; i++)
				asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
					     : "=r"(dst[4 * i]), "=r"(dst[4 * i + 1]), "=r"(dst[4 * i + 2]), "=r"(dst[4 * i + 3])
					     : "r"(a + 16 * i));
		} else if constexpr (N % 8 == 0) {
#pragma unroll
			for (int i = 0; i < N / 8; i++)
				asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
					     : "=r"(dst[2 * i]), "=r"(dst[2 * i + 1])
					     : "r"(a + 8 * i));
		} else if constexpr (N % 4 == 0) {
#pragma unroll
			for (int i = 0; i < N / 4; i++)
				asm volatile("ld.shared.u32 %0, [%1];" : "=r"(dst[i]) : "r"(a + 4 * i));
		} else {
			static_assert(N == 2, "dec_load reads 2, 4, 8 or 16k bytes");
			uint32_t x;
			asm volatile("ld.shared.u16 %0, [%1];" : "=r"(x) : "r"(a));
			dst[0] = __byte_perm(x, 0u, 0x4140);   /* bytes 0 and 2, as dec_ldp */
		}
	}
};

/* ------------------------------------------------------------- the ring */

/* Bytes before the ring: a full and an empty barrier per stage. */
__host__ __device__ inline uint32_t d90_ring_off(uint32_t nst)
{
	return (16u * nst + 127u) & ~127u;
}

/* Dynamic shared memory of nst stages of `slice` bytes; the ring also
 * holds the epilogue's sm_o (dec_finish) once the stages are drained. */
__host__ __device__ inline uint32_t d90_smem_bytes(uint32_t nst, uint32_t slice, uint32_t D)
{
	const uint32_t ring = nst * slice, smo = D90_CW * 8u * (D + 4u) * 4u;
	return d90_ring_off(nst) + (ring > smo ? ring : smo);
}

/* Stages for sealed head slices of `slice` bytes: as many as D90_RING_BYTES
 * holds, at least 2 and at most D90_MAX_STAGES; 0 where two do not fit
 * D90_SMEM_MAX or the slice is no whole number of 16-byte units. */
__host__ __device__ inline uint32_t d90_stages(uint32_t slice, uint32_t D)
{
	if (!slice || slice % 16 || slice > D90_SMEM_MAX)
		return 0;
	uint32_t n = D90_RING_BYTES / slice;
	n = n < 2 ? 2 : n > D90_MAX_STAGES ? D90_MAX_STAGES : n;
	return d90_smem_bytes(n, slice, D) <= D90_SMEM_MAX ? n : 0;
}

/* The chunks of a CTA and the sealed blocks of them that go through the
 * ring. */
struct d90_range {
	uint32_t u0, u1;     /* chunks [u0, u1) */
	uint32_t kb0, kb1;   /* ring blocks [kb0, kb1) */
	uint32_t cpb, nsb;   /* chunks per block; sealed blocks of the sequence */
};

__device__ __forceinline__ d90_range d90_range_of(const attn_args &a, const kvq_seq_table &s)
{
	d90_range r;
	const uint32_t nch = (s.n + DEC_CHUNK - 1) / DEC_CHUNK;
	r.cpb = a.l.B / DEC_CHUNK;
	/* decode_kernel's split, in whole blocks: a block is copied once */
	const uint32_t per = ((nch + a.splits - 1) / a.splits + r.cpb - 1) / r.cpb * r.cpb;
	r.u0 = blockIdx.x * per < nch ? blockIdx.x * per : nch;
	r.u1 = r.u0 + per < nch ? r.u0 + per : nch;
	r.nsb = split_of(a.l, s.n) / a.l.B;
	/* a sink block (block 0) is read as an open one */
	const uint32_t first = s.sink ? 1u : 0u, end = (r.u1 + r.cpb - 1) / r.cpb;
	r.kb0 = r.u0 / r.cpb > first ? r.u0 / r.cpb : first;
	r.kb1 = end < r.nsb ? end : r.nsb;
	if (r.kb1 < r.kb0)
		r.kb1 = r.kb0;
	return r;
}

/* Sealed id of ring block kb, or DEC_NOSLOT (an id outside the pool). */
__device__ __forceinline__ uint32_t d90_slot(const attn_args &a, const kvq_seq_table &s, const d90_range &rg,
					     uint32_t kb)
{
	return dec_slot(a, s, kb * rg.cpb, rg.u1, rg.nsb);
}

/* ---------------------------------------------------------------- stages */

/* The producer (one lane): block k of the ring range into stage k mod nst,
 * once the consumers released that stage's previous use.  bars: the full
 * barriers, then the empty ones; ring: the stages, sealed_head bytes each. */
__device__ __forceinline__ void d90_produce(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					    const d90_range &rg, uint32_t bars, uint32_t ring, uint32_t nst)
{
	const uint32_t bytes = a.l.sealed_head;
	uint32_t st = 0, ph = 0;   /* the stage, and the parity of its current use */

	for (uint32_t kb = rg.kb0; kb < rg.kb1; kb++) {
		const uint32_t full = bars + 8 * st, empty = bars + 8 * (nst + st);
		/* use r ≥ 1 of a stage waits for the consumers' phase r - 1 */
		if (kb - rg.kb0 >= nst)
			mbar_wait(empty, ph ^ 1);
		const uint32_t slot = d90_slot(a, s, rg, kb);
		if (slot == DEC_NOSLOT) {
			mbar_arrive(full);   /* nothing to copy: the consumers skip it */
		} else {
			mbar_arrive_tx(full, bytes);
			bulk_copy(ring + st * bytes, sealed_head(a.l, a.base, slot, h), bytes, full);
		}
		if (++st == nst) {
			st = 0;
			ph ^= 1;
		}
	}
}

/* A sealed chunk u of block `slot` from its stage (a generic address). */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void d90_chunk(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					  dec_state<D, dec_lay<KF, VF, D>::NGV> &st, const uint8_t *stage,
					  uint32_t slot, uint32_t u,
					  const dec_qset<D, dec_lay<KF, VF, D>::KPARTS> &q, dec_kch<D> &kq)
{
	typedef dec_lay<KF, VF, D> LY;
	const layer_dev &l = a.l;
	const uint32_t t0 = u * DEC_CHUNK;
	dec_raw<KF, VF, D, false, LY> r;

	dec_load(r, stage + l.off[KVQ_K_CODES], stage + l.off[KVQ_V_CODES], stage + l.off[KVQ_K_PARAMS],
		 stage + l.off[KVQ_V_PARAMS], l.B, t0 % l.B, t0, s.n, dec_shm());
	/* KIVI K's channel parameters are read from global memory, once per
	 * block and warp (dec_sealed) */
	dec_sealed<KF, VF, D, ACT, LY>(a, st, r, slot, u, h, q.qf, kq, q.qg, q.lim, q.sl2);
}

/* A consumer warp: every stage of the ring range waited for, its own
 * chunks of it computed, the stage released; then its chunks of a sink
 * block and of the open window, from global memory. */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void d90_consume(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					    const d90_range &rg, uint32_t bars, const uint8_t *ring, uint32_t nst,
					    dec_state<D, dec_lay<KF, VF, D>::NGV> &st,
					    const dec_qset<D, dec_lay<KF, VF, D>::KPARTS> &q)
{
	typedef dec_lay<KF, VF, D> LY;
	const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, bytes = a.l.sealed_head;
	dec_kch<D> kq;
	uint32_t stg = 0, ph = 0, base = 0;   /* base: (k · chunks per block) mod D90_CW */

	kq.slot = DEC_NOSLOT;
	for (uint32_t kb = rg.kb0; kb < rg.kb1; kb++) {
		mbar_wait(bars + 8 * stg, ph);
		const uint32_t slot = d90_slot(a, s, rg, kb);
		if (slot != DEC_NOSLOT)
			for (uint32_t c = (warp + D90_CW - base) % D90_CW; c < rg.cpb; c += D90_CW)
				d90_chunk<KF, VF, D, ACT>(a, s, h, st, ring + stg * bytes, slot, kb * rg.cpb + c, q, kq);
		/* every lane's reads of the stage done before it is released */
		__syncwarp();
		if (lane == 0)
			mbar_arrive(bars + 8 * (nst + stg));
		base = (base + rg.cpb) % D90_CW;
		if (++stg == nst) {
			stg = 0;
			ph ^= 1;
		}
	}
	for (uint32_t u = rg.u0 + warp; u < rg.u1; u += D90_CW) {
		const uint32_t kb = u / rg.cpb;
		if (kb >= rg.kb0 && kb < rg.kb1)
			continue;
		const uint32_t sl = dec_slot(a, s, u, rg.u1, rg.nsb);
		if (sl != DEC_NOSLOT)
			dec_open<D, ACT, LY>(a, s, h, st, sl, u, q, kq);
	}
}

/* ---------------------------------------------------------------- kernel */

template <int KF, int VF, int D, int ACT>
__global__ void __launch_bounds__(D90_THREADS, 2) decode90_kernel(attn_args a, uint32_t nst)
{
	typedef dec_lay<KF, VF, D> LY;
	__shared__ float sm_m[D90_CW][8], sm_l[D90_CW][8];
	extern __shared__ __align__(128) uint8_t d90_smem[];
	const uint32_t bars = (uint32_t)__cvta_generic_to_shared(d90_smem);
	uint8_t *const ring = d90_smem + d90_ring_off(nst);
	float *const sm_o = reinterpret_cast<float *>(ring);   /* q's rotation, then the epilogue */

	const kvq_seq_table s = a.seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, warp = threadIdx.x >> 5;
	if (s.m * a.g == 0 || s.m > s.n)
		return;
	const d90_range rg = d90_range_of(a, s);
	dec_qset<D, LY::KPARTS> q;
	dec_q_setup<KF, VF, D, ACT>(a, s, h, sm_o, q);
	if (threadIdx.x == 0) {
		for (uint32_t i = 0; i < nst; i++) {
			mbar_init(bars + 8 * i, 1);                /* full: the producer's arrival, plus bytes */
			mbar_init(bars + 8 * (nst + i), D90_CW);   /* empty: one arrival per consumer warp */
		}
		mbar_init_fence();
	}
	/* q's rotation wrote the ring through ordinary stores */
	fence_proxy_async();
	__syncthreads();

	dec_state<D, LY::NGV> st;
	dec_state_init(st);
	if (warp == D90_CW) {
		if ((threadIdx.x & 31) == 0)
			d90_produce(a, s, h, rg, bars, bars + d90_ring_off(nst), nst);
		__syncwarp();
	} else {
		d90_consume<KF, VF, D, ACT>(a, s, h, rg, bars, ring, nst, st, q);
	}
	/* every copy was waited for by the consumers: the ring is free for sm_o */
	__syncthreads();
	dec_finish<D, LY, D90_CW, D90_THREADS>(a, s, h, st, sm_m, sm_l, sm_o);
}

/* ------------------------------------------------------------------ host */

/* The opt-in to D90_SMEM_MAX bytes of dynamic shared memory, once per
 * instance (every ring fits under it); false on error. */
template <int KF, int VF, int D, int ACT> bool decode90_raise(void)
{
	static bool raised;

	return smem_opt_in((const void *)decode90_kernel<KF, VF, D, ACT>, (int)D90_SMEM_MAX, raised);
}

template <int KF, int VF, int D, int ACT> int decode90_occupancy(uint32_t slice)
{
	/* the last answer, per thread: a pool's layers mostly share a slice size */
	static thread_local uint32_t last_slice;
	static thread_local int last_n;
	const uint32_t nst = d90_stages(slice, D);
	int n = 0;

	if (!nst)
		return 0;
	if (slice == last_slice)
		return last_n;
	if (!decode90_raise<KF, VF, D, ACT>() ||
	    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode90_kernel<KF, VF, D, ACT>, D90_THREADS,
							  d90_smem_bytes(nst, slice, D)) != cudaSuccess)
		return 0;
	last_slice = slice;
	last_n = n;
	return n;
}

template <int KF, int VF, int D, int ACT> int decode90_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	const uint32_t nst = d90_stages(a.l.sealed_head, D);

	if (!nst)
		return -ENOTSUP;
	if (!decode90_raise<KF, VF, D, ACT>())
		return fail_launch();
	decode90_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H, nseq), D90_THREADS,
					  d90_smem_bytes(nst, a.l.sealed_head, D), (cudaStream_t)stream>>>(a, nst);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
