/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of the decode kernel for KVQ_CUDA_DECODE_PAIRS. */
#include "decode.cuh"
#include "instances.h"

namespace kvq {
#define KVQ_INST(KF, VF, D, ACT) \
	template int decode_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *); \
	template int decode_occupancy<KF, VF, D, ACT>(void);
#define KVQ_PAIR(K, V) KVQ_CUDA_EACH(KVQ_INST, K, V)
KVQ_CUDA_DECODE_PAIRS(KVQ_PAIR)
}
