/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of pq_decode_launch for the rows of instances.h
 * compiled in the including file (its KVQ_CUDA_FILE_<letter>). */
#include "decode_pq.cuh"
#include "instances.h"

namespace kvq {
KVQ_CUDA_INSTANCES(pq)
}
