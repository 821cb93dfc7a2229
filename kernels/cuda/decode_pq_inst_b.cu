/* SPDX-License-Identifier: Apache-2.0 */
/* Product-quantized decode instances of the rows of instances.h in file b. */
#define KVQ_CUDA_FILE_b KVQ_CUDA_THIS_FILE
#include "decode_pq_inst.cuh"
