/* SPDX-License-Identifier: Apache-2.0 */
/* Hopper decode instances of the rows of instances.h in file a (sm_90a only). */
#define KVQ_CUDA_FILE_a KVQ_CUDA_THIS_FILE
#include "decode_sm90_inst.cuh"
