/* SPDX-License-Identifier: Apache-2.0 */
/* Decode instances, second half of KVQ_CUDA_DECODE_PAIRS. */
#define KVQ_CUDA_DECODE_HALF KVQ_CUDA_DECODE_PAIRS_B
#include "decode_inst.cuh"
