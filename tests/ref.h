/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tests' own decoding of stored values, in double precision: written from
 * the format definitions (docs/DESIGN.md, kvq_format.h's description of the slice),
 * not with the library's conversion code, so a bug there cannot hide here.
 * Only the element and parameter positions come from the layout module.
 */
#ifndef KVQ_TEST_REF_H
#define KVQ_TEST_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "layout.h"

static inline double ref_f16(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return s ? -v : v;
}

static inline double ref_bf16(uint16_t h)
{
	int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
	double v;

	if (e == 255)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -133);
	else
		v = ldexp(128 + m, e - 134);
	return s ? -v : v;
}

/* OCP E4M3 "FN": bias 7, subnormals m * 2^-9, 0x7f / 0xff NaN, no infinities */
static inline double ref_e4m3(uint8_t c)
{
	int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
	double v;

	if ((c & 0x7f) == 0x7f)
		return NAN;
	v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
	return s ? -v : v;
}

/* E5M2: bias 15, IEEE-like (0x7c inf, above NaN) */
static inline double ref_e5m2(uint8_t c)
{
	int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
	double v;

	if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = e ? ldexp(4 + m, e - 17) : ldexp(m, -16);
	return s ? -v : v;
}

static inline unsigned ref_bits(int f)
{
	switch (f) {
	case KVQ_FMT_F16: case KVQ_FMT_BF16: return 16;
	case KVQ_FMT_KIVI2: return 2;
	case KVQ_FMT_INT4G32: case KVQ_FMT_INT4G64: case KVQ_FMT_INT4G128: case KVQ_FMT_KIVI4: return 4;
	default: return 8;
	}
}

static inline uint32_t ref_code(const uint8_t *codes, uint32_t i, unsigned bits)
{
	uint32_t bitpos = i * bits;
	uint32_t v = 0;

	for (unsigned k = 0; k < bits; k++) {
		uint32_t b = bitpos + k;
		v |= (uint32_t)((codes[b / 8] >> (b % 8)) & 1) << k;
	}
	return v;
}

static inline uint16_t ref_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/*
 * Stored value of element (t, d) of K (is_v = 0) or V of the sealed head
 * slice at `head` (a pointer to the slice's start) for layer `layer`.
 */
static inline double ref_sealed_value(const struct kvq_layout *L, uint32_t layer, const uint8_t *head,
				      int is_v, uint32_t t, uint32_t d)
{
	const struct kvq_layer_layout *ll = &L->layer[layer];
	uint32_t B = L->block_tokens, D = L->head_dim;
	int f = is_v ? ll->vfmt : ll->kfmt;
	int kind = kvq_fmt_param_kind(f, is_v);
	unsigned G = kvq_fmt_group(f, is_v);
	const uint8_t *codes = head + ll->off[is_v ? KVQ_V_CODES : KVQ_K_CODES];
	const uint8_t *params = head + ll->off[is_v ? KVQ_V_PARAMS : KVQ_K_PARAMS];
	uint32_t e = is_v ? kvq_v_elem(t, d, B, D) : kvq_k_elem(t, d, B, D);
	uint32_t c = ref_code(codes, e, ref_bits(f));
	uint32_t pi = kvq_param_index(kind, G, is_v, t, d, B, D);

	switch (f) {
	case KVQ_FMT_F16: return ref_f16((uint16_t)c);
	case KVQ_FMT_BF16: return ref_bf16((uint16_t)c);
	case KVQ_FMT_INT8: return (double)(int8_t)(uint8_t)c * ref_f16(ref_u16(params + 2 * pi));
	case KVQ_FMT_FP8: return ref_e4m3((uint8_t)c) * ref_f16(ref_u16(params + 2 * pi));
	case KVQ_FMT_FP8E5M2: return ref_e5m2((uint8_t)c) * ref_f16(ref_u16(params + 2 * pi));
	default:
		return (double)c * ref_f16(ref_u16(params + 4 * pi)) + ref_f16(ref_u16(params + 4 * pi + 2));
	}
}

/* The normalised Walsh-Hadamard transform, in float64, of each n-element
 * block of the rows (D elements each) of x: the reference for a policy's
 * "+rot" (kvq_rotate). */
static inline void ref_rotate(double *x, size_t rows, uint32_t D, unsigned n)
{
	for (size_t r = 0; r < rows; r++)
		for (uint32_t b0 = 0; b0 < D; b0 += n) {
			double *p = x + r * D + b0;
			for (unsigned len = 1; len < n; len <<= 1)
				for (unsigned i = 0; i < n; i += 2 * len)
					for (unsigned j = i; j < i + len; j++) {
						double u = p[j], v = p[j + len];
						p[j] = u + v;
						p[j + len] = u - v;
					}
			for (unsigned i = 0; i < n; i++)
				p[i] /= sqrt((double)n);
		}
}

/* Value of an activation element (open window, inputs). */
static inline double ref_act(int dt, const void *p, size_t i)
{
	if (dt == KVQ_DT_F32)
		return ((const float *)p)[i];
	return dt == KVQ_DT_BF16 ? ref_bf16(((const uint16_t *)p)[i]) : ref_f16(((const uint16_t *)p)[i]);
}

#endif
