/* SPDX-License-Identifier: Apache-2.0 */
/* Prefill instances, first half of KVQ_CUDA_FAST_PAIRS. */
#define KVQ_CUDA_FAST_HALF KVQ_CUDA_FAST_PAIRS_A
#include "prefill_inst.cuh"
