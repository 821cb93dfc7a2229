/* SPDX-License-Identifier: Apache-2.0 */
/* Explicit instances of decode90_launch and decode90_occupancy for the rows
 * of instances.h with sm90 compiled in the including file (its
 * KVQ_CUDA_FILE_<letter>); the build compiles these files for sm_90a only. */
#include "decode_sm90.cuh"
#include "instances.h"

namespace kvq {
KVQ_CUDA_INSTANCES(decode90)
}
