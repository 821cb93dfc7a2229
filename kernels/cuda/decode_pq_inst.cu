/* SPDX-License-Identifier: Apache-2.0 */
/* Instances of the product-quantized decode kernel (KVQ_CUDA_PQ_PAIRS). */
#include "decode_pq.cuh"
#include "instances.h"

namespace kvq {
#define KVQ_INST(KF, VF, D, ACT) template int pq_decode_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *);
#define KVQ_PAIR(K, V) KVQ_CUDA_EACH(KVQ_INST, K, V)
KVQ_CUDA_PQ_PAIRS(KVQ_PAIR)
}
