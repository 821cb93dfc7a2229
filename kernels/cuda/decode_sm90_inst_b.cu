/* SPDX-License-Identifier: Apache-2.0 */
/* Hopper decode instances of the rows of instances.h in file b (sm_90a only). */
#define KVQ_CUDA_FILE_b KVQ_CUDA_THIS_FILE
#include "decode_sm90_inst.cuh"
