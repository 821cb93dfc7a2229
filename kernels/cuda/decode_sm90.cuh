/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decode attention on Hopper (sm_90a): decode_kernel's arithmetic (decode.cuh:
 * its fragments, conversions, scores, online softmax, PV and epilogue) fed
 * from a ring of shared-memory stages that the bulk-copy engine fills,
 * instead of from loads into registers.  dispatch.cu takes it in place of
 * decode_kernel on a device of compute capability 9.0 for a row of
 * instances.h with sm90 when KVQ_CUDA_KERNELS=sm90, where the
 * layer's sealed head slice fits two stages and the pool is 16-byte
 * aligned.
 *
 * One CTA per (KV split, KV head, sequence), as decode_kernel, with the
 * same splits (dispatch.cu: decode_splits) rounded up to whole blocks, and
 * the same partials and merge_kernel.  D90_CW consumer warps and one
 * producer warp, around a ring of nst stages in shared memory, each with a
 * full and an empty mbarrier:
 *  - the producer (one lane) fills the stages item by item (d90_fill):
 *    first the CTA's sealed blocks, as many whole head slices to an item
 *    as a stage holds (a head slice, layout.h, is one contiguous, 16-byte
 *    aligned run: K codes, K parameters, V codes, V parameters, so one
 *    cp.async.bulk each); then its chunks of a sink block and of the open
 *    window, one to an item (the chunk's 32 K rows and its 32 V rows: two
 *    copies).  It declares exactly the bytes it copies (expect_tx) on the
 *    stage's full barrier, and reuses a stage only once the consumers have
 *    released it (its empty barrier's previous phase);
 *  - each consumer warp waits for every item (full barrier), computes its
 *    share of the item's 32-token chunks (chunk j of the CTA's stream:
 *    warp j mod D90_CW) with decode_kernel's stages reading the stage
 *    through shared loads (dec_load_k, dec_score, dec_load_v,
 *    dec_softmax, dec_pv), and releases the stage: one arrival per warp on
 *    the empty barrier, which counts D90_CW.
 * A stage is the larger of a sealed head slice and an open chunk
 * (d90_stage_bytes); the ring has as many as fit D90_RING_BYTES (2 ..
 * D90_MAX_STAGES, d90_stages), so tens of KB per CTA are in flight without
 * a register spent on them.  q set-up, the stage functions and the
 * epilogue are decode_kernel's (decode.cuh).
 */
#ifndef KVQ_CUDA_DECODE_SM90_CUH
#define KVQ_CUDA_DECODE_SM90_CUH

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "decode_sm90.cuh is built for sm_90a only (decode_sm90_inst_*.cu)"
#endif

#include "decode.cuh"
#include "decode_sm90.h"
#include "sm90.cuh"

namespace kvq {

/* Five consumer warps and the producer: at two CTAs per multiprocessor
 * (__launch_bounds__) ptxas gives a CTA of five warps 168 registers a
 * thread, as it gives one of six, so the sixth costs none and ten warps per
 * multiprocessor compute.  A ring of 112 KiB: seven stages of 16 KiB (f16
 * at D = 128, B = 32: a chunk each) keep two in flight while five are being
 * computed, and two CTAs still fit the 228 KiB of a multiprocessor. */
#define D90_CW 5                       /* consumer warps */
#define D90_THREADS ((D90_CW + 1) * 32)
#define D90_RING_BYTES (112u << 10)
#define D90_MAX_STAGES 16u
#define D90_SMEM_MAX (200u << 10)      /* dynamic shared memory of one CTA at most */

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
	/* an open row's element: an ordinary load, which the compiler may
	 * schedule (the stage's wait is a compiler barrier too) */
	__device__ __forceinline__ uint32_t h(const uint8_t *p) const { return *reinterpret_cast<const uint16_t *>(p); }
};

/* ------------------------------------------------------------- the ring */

/* Bytes of an open chunk in a stage: its 32 K rows, then its 32 V rows, in
 * the activation dtype ([token][dim], as the open slice holds them). */
__host__ __device__ inline uint32_t d90_open_bytes(uint32_t D)
{
	return 2u * DEC_CHUNK * D * 2u;
}

/* Bytes of a stage: a whole number of sealed head slices of `slice` bytes,
 * or one open chunk, whichever is larger. */
__host__ __device__ inline uint32_t d90_stage_bytes(uint32_t slice, uint32_t D)
{
	return slice > d90_open_bytes(D) ? slice : d90_open_bytes(D);
}

/* Bytes before the ring: a full and an empty barrier per stage. */
__host__ __device__ inline uint32_t d90_ring_off(uint32_t nst)
{
	return (16u * nst + 127u) & ~127u;
}

/* Dynamic shared memory of nst stages of sb bytes; the ring also holds the
 * epilogue's sm_o (dec_finish) once the stages are drained. */
__host__ __device__ inline uint32_t d90_smem_bytes(uint32_t nst, uint32_t sb, uint32_t D)
{
	const uint32_t ring = nst * sb, smo = D90_CW * 8u * (D + 4u) * 4u;
	return d90_ring_off(nst) + (ring > smo ? ring : smo);
}

/* Stages for sealed head slices of `slice` bytes: as many as D90_RING_BYTES
 * holds, at least 2 and at most D90_MAX_STAGES; 0 where two do not fit
 * D90_SMEM_MAX or the slice is no whole number of 16-byte units (the bulk
 * copies' unit). */
__host__ __device__ inline uint32_t d90_stages(uint32_t slice, uint32_t D)
{
	const uint32_t sb = d90_stage_bytes(slice, D);

	if (!slice || slice % 16 || sb > D90_SMEM_MAX)
		return 0;
	uint32_t n = D90_RING_BYTES / sb;
	n = n < 2 ? 2 : n > D90_MAX_STAGES ? D90_MAX_STAGES : n;
	return d90_smem_bytes(n, sb, D) <= D90_SMEM_MAX ? n : 0;
}

/* What a CTA streams through the ring, item by item (an item fills one
 * stage): first its sealed blocks [kb0, kb1), grp to an item; then its
 * open chunks, one to an item: those of a sink block, [u0, lo1), and those
 * of the open window, [hi0, u1). */
struct d90_range {
	uint32_t u0, u1;         /* the CTA's chunks [u0, u1) */
	uint32_t kb0, kb1;       /* its sealed blocks */
	uint32_t lo1, hi0;       /* its open chunks: [u0, lo1) and [hi0, u1) */
	uint32_t cpb, nsb, grp;  /* chunks per block; sealed blocks of the sequence; sealed blocks per item */
	uint32_t nsi, items;     /* items of sealed blocks; all items */
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
	/* sealed blocks are whole, so [kb0·cpb, kb1·cpb) lies in [u0, u1):
	 * the chunks before it and after it are the open ones */
	const uint32_t lo = r.kb0 * r.cpb < r.u1 ? r.kb0 * r.cpb : r.u1;
	r.lo1 = lo > r.u0 ? lo : r.u0;
	r.hi0 = r.kb1 * r.cpb > r.u0 ? r.kb1 * r.cpb : r.u0;
	if (r.hi0 > r.u1)
		r.hi0 = r.u1;
	r.grp = d90_stage_bytes(a.l.sealed_head, a.l.D) / a.l.sealed_head;
	r.nsi = (r.kb1 - r.kb0 + r.grp - 1) / r.grp;
	r.items = r.nsi + (r.lo1 - r.u0) + (r.u1 - r.hi0);
	return r;
}

/* The chunk of open item i (i ≥ nsi). */
__device__ __forceinline__ uint32_t d90_open_chunk(const d90_range &rg, uint32_t i)
{
	const uint32_t j = i - rg.nsi;

	return j < rg.lo1 - rg.u0 ? rg.u0 + j : rg.hi0 + (j - (rg.lo1 - rg.u0));
}

/* Sealed id of sealed block kb, or DEC_NOSLOT (an id outside the pool). */
__device__ __forceinline__ uint32_t d90_slot(const attn_args &a, const kvq_seq_table &s, const d90_range &rg,
					     uint32_t kb)
{
	return dec_slot(a, s, kb * rg.cpb, rg.u1, rg.nsb);
}

/* ---------------------------------------------------------------- stages */

/* Copies item i into the stage at shared address dst, completing on
 * barrier full: the expected bytes are exactly those copied (a block with
 * no slot is not copied; its chunks are skipped by the consumers too). */
__device__ __forceinline__ void d90_fill(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					 const d90_range &rg, uint32_t i, uint32_t dst, uint32_t full)
{
	const layer_dev &l = a.l;

	if (i < rg.nsi) {
		const uint32_t kb = rg.kb0 + i * rg.grp, ke = kb + rg.grp < rg.kb1 ? kb + rg.grp : rg.kb1;
		uint32_t bytes = 0;
		for (uint32_t b = kb; b < ke; b++)
			bytes += d90_slot(a, s, rg, b) != DEC_NOSLOT ? l.sealed_head : 0u;
		mbar_arrive_tx(full, bytes);
		for (uint32_t b = kb; b < ke; b++) {
			const uint32_t slot = d90_slot(a, s, rg, b);
			if (slot != DEC_NOSLOT)
				bulk_copy(dst + (b - kb) * l.sealed_head, sealed_head(l, a.base, slot, h), l.sealed_head,
					  full);
		}
		return;
	}
	const uint32_t u = d90_open_chunk(rg, i), sl = dec_slot(a, s, u, rg.u1, rg.nsb);
	if (sl == DEC_NOSLOT) {
		mbar_arrive(full);
		return;
	}
	/* K rows, then V rows, of the chunk (an open slice: B rows of K, B of V) */
	const uint32_t half = DEC_CHUNK * l.D * 2u;
	const uint8_t *oh = open_head(l, a.base, sl & 0x7fffffffu, h) + (size_t)(u * DEC_CHUNK % l.B) * l.D * 2u;
	mbar_arrive_tx(full, 2u * half);
	bulk_copy(dst, oh, half, full);
	bulk_copy(dst + half, oh + (size_t)l.B * l.D * 2u, half, full);
}

/* The producer (one lane): item i into stage i mod nst, once the consumers
 * released that stage's previous use.  bars: the full barriers, then the
 * empty ones; ring: the stages, sb bytes each. */
__device__ __forceinline__ void d90_produce(const attn_args &a, const kvq_seq_table &s, uint32_t h,
					    const d90_range &rg, uint32_t bars, uint32_t ring, uint32_t nst)
{
	const uint32_t sb = d90_stage_bytes(a.l.sealed_head, a.l.D);
	uint32_t st = 0, ph = 0;   /* the stage, and the parity of its current use */

	for (uint32_t i = 0; i < rg.items; i++) {
		/* use r ≥ 1 of a stage waits for the consumers' phase r - 1 */
		if (i >= nst)
			mbar_wait(bars + 8 * (nst + st), ph ^ 1);
		d90_fill(a, s, h, rg, i, ring + st * sb, bars + 8 * st);
		if (++st == nst) {
			st = 0;
			ph ^= 1;
		}
	}
}

/* Chunk u from a stage (generic addresses of its K codes and parameters,
 * V codes and parameters; tb: the chunk's first row there; B: rows per V
 * row of codes, sealed): K's words read and scored before V's are read,
 * so that only one half is in registers at a time.  OPEN: an open chunk
 * (KF = VF = the activation's format), whose rows past the sequence's end
 * are junk that dec_load_v and the scores' limits keep out. */
template <int KF, int VF, int D, int ACT, bool OPEN, class LY>
__device__ __forceinline__ void d90_chunk(const kvq_seq_table &s, dec_state<D, LY::NGV> &st, const uint8_t *kc,
					  const uint8_t *kpar, const uint8_t *vc, const uint8_t *vpar, uint32_t B,
					  uint32_t tb, uint32_t slot, uint32_t u, const dec_qset<D, LY::KPARTS> &q,
					  dec_kch<D> &kq)
{
	const uint32_t t0 = u * DEC_CHUNK;
	dec_raw<KF, VF, D, OPEN, LY> r;
	float x[2][4], e[2][4], rs[LY::NGV];

	dec_load_k(r, kc, kpar, tb, dec_shm());
	/* KIVI K's channel parameters, from the stage, once per block and warp */
	if constexpr (!OPEN)
		dec_kch_update<KF, VF, D, ACT, LY>(kq, slot, q.qf, kpar, dec_shm());
	dec_score<KF, VF, D, ACT, OPEN, LY>(x, r, t0, q.qf, kq, q.qg, q.lim, q.sl2);
	dec_load_v(r, vc, vpar, B, tb, t0, s.n, dec_shm());
	dec_softmax<KF, VF, D, ACT, OPEN, LY>(st, r, x, e, rs);
	dec_pv<KF, VF, D, ACT, OPEN, LY>(st, r, e, rs);
}

/* A consumer warp's place in the ring: the stage of its next item and the
 * parity of that stage's current use. */
struct d90_cursor {
	uint32_t stg, ph;
};

/* Waits for the next item; returns its stage. */
__device__ __forceinline__ const uint8_t *d90_take(const d90_cursor &c, uint32_t bars, const uint8_t *ring, uint32_t sb)
{
	mbar_wait(bars + 8 * c.stg, c.ph);
	return ring + c.stg * sb;
}

/* Releases the stage of the item taken (one arrival per warp, once every
 * lane's reads of it are done) and moves on. */
__device__ __forceinline__ void d90_release(d90_cursor &c, uint32_t bars, uint32_t nst)
{
	__syncwarp();
	if ((threadIdx.x & 31) == 0)
		mbar_arrive(bars + 8 * (nst + c.stg));
	if (++c.stg == nst) {
		c.stg = 0;
		c.ph ^= 1;
	}
}

/* A consumer warp's share of sealed item i in stage `stage`: the chunks
 * whose running index (cnt, the same in every consumer warp) is its own
 * modulo D90_CW. */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void d90_sealed_item(const attn_args &a, const kvq_seq_table &s, const d90_range &rg,
						uint32_t i, const uint8_t *stage, uint32_t &cnt,
						dec_state<D, dec_lay<KF, VF, D>::NGV> &st,
						const dec_qset<D, dec_lay<KF, VF, D>::KPARTS> &q, dec_kch<D> &kq)
{
	typedef dec_lay<KF, VF, D> LY;
	const layer_dev &l = a.l;
	const uint32_t warp = threadIdx.x >> 5;
	const uint32_t kb = rg.kb0 + i * rg.grp, ke = kb + rg.grp < rg.kb1 ? kb + rg.grp : rg.kb1;

	for (uint32_t b = kb; b < ke; b++) {
		const uint32_t slot = d90_slot(a, s, rg, b);
		const uint8_t *hs = stage + (b - kb) * l.sealed_head;
		for (uint32_t c = 0; c < rg.cpb; c++)
			if (cnt++ % D90_CW == warp && slot != DEC_NOSLOT)
				d90_chunk<KF, VF, D, ACT, false, LY>(s, st, hs + l.off[KVQ_K_CODES],
								     hs + l.off[KVQ_K_PARAMS], hs + l.off[KVQ_V_CODES],
								     hs + l.off[KVQ_V_PARAMS], l.B, c * DEC_CHUNK, slot,
								     b * rg.cpb + c, q, kq);
	}
}

/* A consumer warp: every item waited for in its stage, its share of it
 * computed, the stage released.  The sealed items first, then the open
 * ones (each an open chunk's K rows, then its V rows), in two loops: KIVI
 * K's folded q (kq) is dead in the second, which needs the registers. */
template <int KF, int VF, int D, int ACT>
__device__ __forceinline__ void d90_consume(const attn_args &a, const kvq_seq_table &s, const d90_range &rg,
					    uint32_t bars, const uint8_t *ring, uint32_t nst,
					    dec_state<D, dec_lay<KF, VF, D>::NGV> &st,
					    const dec_qset<D, dec_lay<KF, VF, D>::KPARTS> &q)
{
	typedef dec_lay<KF, VF, D> LY;
	constexpr int OF = kvq_act_fmt(ACT);   /* open rows */
	const uint32_t warp = threadIdx.x >> 5, sb = d90_stage_bytes(a.l.sealed_head, D);
	d90_cursor c = { 0, 0 };
	uint32_t cnt = 0, i = 0;
	dec_kch<D> kq;

	kq.slot = DEC_NOSLOT;
	for (; i < rg.nsi; i++) {
		const uint8_t *stage = d90_take(c, bars, ring, sb);
		d90_sealed_item<KF, VF, D, ACT>(a, s, rg, i, stage, cnt, st, q, kq);
		d90_release(c, bars, nst);
	}
	for (; i < rg.items; i++) {
		const uint8_t *stage = d90_take(c, bars, ring, sb);
		const uint32_t u = d90_open_chunk(rg, i);
		if (cnt++ % D90_CW == warp && dec_slot(a, s, u, rg.u1, rg.nsb) != DEC_NOSLOT)
			d90_chunk<OF, OF, D, ACT, true, LY>(s, st, stage, NULL, stage + DEC_CHUNK * D * 2, NULL,
							    DEC_CHUNK, 0, DEC_NOSLOT, u, q, kq);
		d90_release(c, bars, nst);
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
		d90_consume<KF, VF, D, ACT>(a, s, rg, bars, ring, nst, st, q);
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
	const void *f = (const void *)decode90_kernel<KF, VF, D, ACT>;

	/* and all of the unified L1/shared memory as shared memory: the two
	 * rings of two CTAs need nearly all of it */
	if (!raised && cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout,
					    cudaSharedmemCarveoutMaxShared) != cudaSuccess)
		return false;
	return smem_opt_in(f, (int)D90_SMEM_MAX, raised);
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
							  d90_smem_bytes(nst, d90_stage_bytes(slice, D), D)) != cudaSuccess)
		return 0;
	last_slice = slice;
	last_n = n;
	return n;
}

template <int KF, int VF, int D, int ACT> int decode90_launch(const attn_args &a, uint32_t nseq, void *stream)
{
	const uint32_t nst = d90_stages(a.l.sealed_head, D);

	if (!nst || ((uintptr_t)a.base & 15))   /* dispatch.cu checks both first */
		return -ENOTSUP;
	if (!decode90_raise<KF, VF, D, ACT>())
		return fail_launch();
	decode90_kernel<KF, VF, D, ACT><<<dim3(a.splits, a.l.H, nseq), D90_THREADS,
					  d90_smem_bytes(nst, d90_stage_bytes(a.l.sealed_head, D), D),
					  (cudaStream_t)stream>>>(a, nst);
	if (cudaPeekAtLastError() != cudaSuccess)
		return fail_launch();
	return merge_launch<D>(a, nseq, stream);
}

} /* namespace kvq */

#endif
