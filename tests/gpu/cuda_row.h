/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Throwaway rows of the CUDA instance table (kernels/cuda/instances.h), for
 * tests/gpu/test_cuda_row.c only: the build force-includes this header into
 * that test's own copy of the dispatcher and into the one file that builds
 * the rows' instances (cuda_row_inst.cu, file t), and nowhere else.  Two
 * pairs no row of the table has: one with the fast kernels, one with the
 * product-quantized decode kernel.
 */
#ifndef KVQ_TEST_CUDA_ROW_H
#define KVQ_TEST_CUDA_ROW_H

#define KVQ_CUDA_PAIRS_EXTRA(X, ...) \
	X(FP8,  INT8, 1, 1, 0, 0, t, __VA_ARGS__) \
	X(INT8, PQ1,  1, 0, 1, 0, t, __VA_ARGS__)

#endif
