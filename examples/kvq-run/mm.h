/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Matrix products with GGUF weights: rows are dequantized on the fly (a few
 * at a time, reused for every token of a batch) and multiplied in float;
 * AVX2+FMA where the CPU has it (chosen at run time), portable C elsewhere.
 */
#ifndef KVQ_RUN_MM_H
#define KVQ_RUN_MM_H

#include <stdint.h>

#include "gguf.h"

/* Uses up to n threads for large products (1: none); returns the count. */
unsigned mm_set_threads(unsigned n);

/* Name of the path in use ("avx2" or "portable"). */
const char *mm_path(void);

/* out[0..n) = row of n elements of type (F32, F16, BF16, Q4_0, Q4_1, Q8_0). */
void mm_dequant_row(uint32_t type, const uint8_t *row, uint32_t n, float *out);

/* y[t * W->rows + r] = dot(row r of W, x + t * W->ne[0]) for t < T. */
void mm_matmul(const struct gguf_tensor *W, const float *x, uint32_t T, float *y);

#endif
