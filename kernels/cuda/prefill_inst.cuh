/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of the prefill kernel for one half of
 * KVQ_CUDA_FAST_PAIRS (KVQ_CUDA_FAST_HALF is KVQ_CUDA_FAST_PAIRS_A or
 * KVQ_CUDA_FAST_PAIRS_B). */
#include "prefill.cuh"
#include "instances.h"

namespace kvq {
#define KVQ_INST(KF, VF, D, ACT) \
	template int prefill_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *); \
	template int prefill_rows<KF, VF, D, ACT>(void);
#define KVQ_PAIR(K, V) KVQ_CUDA_EACH(KVQ_INST, K, V)
KVQ_CUDA_FAST_HALF(KVQ_PAIR)
}
