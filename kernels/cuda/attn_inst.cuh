/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of attn_launch for the rows of instances.h
 * compiled in the including file (its KVQ_CUDA_FILE_<letter>). */
#include "attention.cuh"
#include "instances.h"

namespace kvq {
KVQ_CUDA_INSTANCES(attn)
}
