/* SPDX-License-Identifier: Apache-2.0 */
/* Attention instances, second half of instances.h. */
#define KVQ_CUDA_HALF KVQ_CUDA_PAIRS_B
#include "attn_inst.cuh"
