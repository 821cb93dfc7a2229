/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Synthetic K/V for the integration tests: a pure function of (token,
 * position, layer, head, dim, K or V), so that every worker process
 * computes the same values for the same prompt.
 */
#ifndef KVQ_TEST_SYNTH_H
#define KVQ_TEST_SYNTH_H

#include <stdint.h>

/* Uniform in [-2, 2), from a 64-bit mix of the arguments. */
static inline double synth_kv(uint32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t d, int is_v)
{
	uint64_t x = ((uint64_t)tok << 32) ^ ((uint64_t)pos << 20) ^ (layer << 12) ^ (h << 8) ^ (d << 1) ^
		     (uint64_t)is_v;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (double)(x >> 11) / (double)(1ull << 53) * 4.0 - 2.0;
}

#endif
