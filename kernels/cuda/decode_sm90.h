/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Hopper (sm_90a) decode kernels' entry points, for the dispatcher
 * (dispatch.cu), which is built for every architecture: the kernels
 * themselves (decode_sm90.cuh) are compiled for sm_90a only, in
 * decode_sm90_inst_*.cu, and only when 90 is among the build's
 * architectures (KVQ_CUDA_SM90 is then defined for every CUDA file).
 */
#ifndef KVQ_CUDA_DECODE_SM90_H
#define KVQ_CUDA_DECODE_SM90_H

#include "common.cuh"

namespace kvq {

/* Launches decode90_kernel and, with splits, merge_kernel: 0, -EIO (the
 * CUDA error kept for kvq_cuda_error), or -ENOTSUP where the layer's
 * sealed head slice does not fit two stages (decode90_occupancy is 0). */
template <int KF, int VF, int D, int ACT> int decode90_launch(const attn_args &a, uint32_t nseq, void *stream);

/* CTAs of decode90_kernel per multiprocessor for sealed head slices of
 * `slice` bytes (kvq_layer_layout.sealed_head); 0 where they do not fit
 * the ring or on a CUDA error. */
template <int KF, int VF, int D, int ACT> int decode90_occupancy(uint32_t slice);

} /* namespace kvq */

#endif
