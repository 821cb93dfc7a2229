/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq: the client library of kvqd.
 *
 * Functions return 0 (or a non-negative value) on success and a negative
 * errno-style code on failure; kvq_strerror() names it.
 */
#ifndef KVQ_H
#define KVQ_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Project error codes, beyond errno's. */
#define KVQ_EBASE 1000
enum {
	KVQ_ELAYOUT = -(KVQ_EBASE + 1),   /* layout version or geometry mismatch */
	KVQ_EPOLICY = -(KVQ_EBASE + 2),   /* bad KV policy string */
};

/* Version string of the library ("0.1.0"). */
const char *kvq_version(void);

/* Static description of an error code (never NULL). */
const char *kvq_strerror(int err);

/*
 * FP8 conversions, bit-exact with the kernels (and with the GPU's
 * cvt.rn.satfinite): round to nearest even; finite values beyond the largest
 * finite value and infinities saturate to +-max (448 for E4M3, 57344 for
 * E5M2); NaN becomes 0x7f.  E4M3 is the OCP "FN" format (bias 7, no
 * infinities, NaN only 0x7f/0xff).
 */
uint8_t kvq_fp8_e4m3_encode(float x);
float kvq_fp8_e4m3_decode(uint8_t code);   /* 0x7f/0xff -> NaN */
uint8_t kvq_fp8_e5m2_encode(float x);
float kvq_fp8_e5m2_decode(uint8_t code);   /* IEEE-like: 0x7c inf, above NaN */

#ifdef __cplusplus
}
#endif

#endif
