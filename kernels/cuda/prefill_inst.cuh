/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of prefill_launch and prefill_rows for the rows of
 * instances.h compiled in the including file (its KVQ_CUDA_FILE_<letter>). */
#include "prefill.cuh"
#include "instances.h"

namespace kvq {
KVQ_CUDA_INSTANCES(prefill)
}
