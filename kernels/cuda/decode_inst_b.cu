/* SPDX-License-Identifier: Apache-2.0 */
/* Decode instances, second half of KVQ_CUDA_FAST_PAIRS. */
#define KVQ_CUDA_FAST_HALF KVQ_CUDA_FAST_PAIRS_B
#include "decode_inst.cuh"
