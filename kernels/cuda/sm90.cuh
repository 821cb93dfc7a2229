/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hopper's asynchronous copies and transaction barriers as thin PTX
 * wrappers (PTX ISA: mbarrier, cp.async.bulk, fence.proxy.async), for the
 * sm_90a kernels, as mma.cuh is for the MMA.  Addresses are in the shared
 * window (__cvta_generic_to_shared); a barrier is 8 bytes of shared memory.
 */
#ifndef KVQ_CUDA_SM90_CUH
#define KVQ_CUDA_SM90_CUH

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sm90.cuh is built for sm_90a only"
#endif

#include "common.cuh"

namespace kvq {

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

#define MBAR_WAIT_NS 10000000000ull   /* a wait this long is a bug: the launch fails (mbar_wait) */

__device__ __forceinline__ uint64_t global_ns(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* Waits until the phase of parity `parity` of the barrier has completed.
 * A phase that never completes (bytes expected that no copy delivers)
 * would hang the GPU: after MBAR_WAIT_NS the kernel traps instead, so the
 * launch fails with an error. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
	uint64_t t0 = 0;
	for (uint32_t spins = 1;; spins++) {
		uint32_t done;
		asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
			     "selp.u32 %0, 1, 0, p;\n\t}"
			     : "=r"(done)
			     : "r"(bar), "r"(parity)
			     : "memory");
		if (done)
			return;
		if (spins % 1024 == 0) {   /* the clock now and then only */
			const uint64_t t = global_ns();
			if (!t0)
				t0 = t;
			else if (t - t0 > MBAR_WAIT_NS)
				__trap();
		}
	}
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

} /* namespace kvq */

#endif
