/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of decode_launch and decode_occupancy for the rows of
 * instances.h compiled in the including file (its KVQ_CUDA_FILE_<letter>). */
#include "decode.cuh"
#include "instances.h"

namespace kvq {
KVQ_CUDA_INSTANCES(decode)
}
