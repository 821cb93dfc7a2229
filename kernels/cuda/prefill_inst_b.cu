/* SPDX-License-Identifier: Apache-2.0 */
/* Prefill instances of the rows of instances.h in file b. */
#define KVQ_CUDA_FILE_b KVQ_CUDA_THIS_FILE
#include "prefill_inst.cuh"
