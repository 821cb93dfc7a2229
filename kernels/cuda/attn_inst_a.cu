/* SPDX-License-Identifier: Apache-2.0 */
/* Attention instances, first half of instances.h. */
#define KVQ_CUDA_HALF KVQ_CUDA_PAIRS_A
#include "attn_inst.cuh"
