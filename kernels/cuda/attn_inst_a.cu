/* SPDX-License-Identifier: Apache-2.0 */
/* Attention instances of the rows of instances.h in file a. */
#define KVQ_CUDA_FILE_a KVQ_CUDA_THIS_FILE
#include "attn_inst.cuh"
