/* SPDX-License-Identifier: Apache-2.0 */
/* Every instance of the throwaway rows (cuda_row.h, file t): what the
 * compile files of file a or b would build for them. */
#define KVQ_CUDA_FILE_t KVQ_CUDA_THIS_FILE
#include "cuda/attn_inst.cuh"
#include "cuda/decode_inst.cuh"
#include "cuda/prefill_inst.cuh"
#include "cuda/decode_pq_inst.cuh"
