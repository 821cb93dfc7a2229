/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of attn_launch for one half of instances.h
 * (KVQ_CUDA_HALF is KVQ_CUDA_PAIRS_A or KVQ_CUDA_PAIRS_B). */
#include "attention.cuh"
#include "instances.h"

namespace kvq {
#define KVQ_INST(KF, VF, D, ACT) template int attn_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *);
#define KVQ_PAIR(K, V) KVQ_CUDA_EACH(KVQ_INST, K, V)
KVQ_CUDA_HALF(KVQ_PAIR)
}
