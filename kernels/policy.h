/* SPDX-License-Identifier: Apache-2.0 */
/* KV policies: layer -> (K format, V format), their grammar and canonical form. */
#ifndef KVQ_POLICY_H
#define KVQ_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MAX_LAYERS 256u
/* Longest policy string accepted: the longest canonical form (256 layers,
 * alternating two-format specs, each part rotated) has 8337 characters. */
#define KVQ_POLICY_MAX_LEN 12288u

/* Bits of kvq_policy.rot: the layer's K, V is stored rotated (kvq_rot_block). */
#define KVQ_ROT_K 1u
#define KVQ_ROT_V 2u

struct kvq_policy {
	uint32_t n_layers;
	uint8_t k[KVQ_MAX_LAYERS];
	uint8_t v[KVQ_MAX_LAYERS];
	uint8_t rot[KVQ_MAX_LAYERS];   /* KVQ_ROT_K | KVQ_ROT_V */
};

/*
 * Parses a policy for a model of n_layers layers.  Grammar:
 *   policy := spec | clause (';' clause)*
 *   clause := range ':' spec
 *   range  := N | N '-' | N '-' M          (N- runs to the last layer)
 *   spec   := FORMAT | 'k=' FORMAT ',' 'v=' FORMAT | 'v=' FORMAT ',' 'k=' FORMAT
 *   FORMAT := NAME | NAME '+rot'
 * "+rot" stores that part (K or V; both in a one-format spec) rotated by
 * the normalised Walsh-Hadamard transform (kvq_rot_block).
 * Blanks around tokens are ignored.  Every layer must be covered exactly once.
 * Returns 0, or -EINVAL with a message naming the fault in err (err may be NULL).
 */
int kvq_policy_parse(const char *s, uint32_t n_layers, struct kvq_policy *ret, char *err, size_t errlen);

/* Writes the canonical form ("int8", "k=int8,v=int4g64", "0-9:int8;10-29:kivi2";
 * a layer with rotation always as "k=...,v=...": "k=int4g32+rot,v=int4g32+rot")
 * into buf; returns its length, or -ENOSPC when it does not fit (buf then
 * holds a truncated, terminated string if len > 0), or -EINVAL for a policy
 * with an unknown format or layer count. */
int kvq_policy_format(const struct kvq_policy *p, char *buf, size_t len);

/* 1 if any layer stores K or V in a KIVI format: one whose K takes its
 * parameters per channel (KVQ_PARAM_CHANNEL in the format table). */
int kvq_policy_uses_kivi(const struct kvq_policy *p);

/* 1 if a and b map every layer to the same formats and rotation (the
 * policies pools compare, whatever their spelling). */
int kvq_policy_equal(const struct kvq_policy *a, const struct kvq_policy *b);

/* 1 if any layer stores K or V rotated. */
int kvq_policy_rotates(const struct kvq_policy *p);

/* Elements of the blocks along the head dim that rotation transforms
 * (each by the normalised Walsh-Hadamard transform of that size): for K
 * the largest power of two dividing head_dim, for V the same up to 64;
 * 0 where that is below 16 (such a head dim cannot be rotated). */
KVQ_HD unsigned kvq_rot_block(unsigned head_dim, int is_v)
{
	unsigned b = head_dim & (~head_dim + 1u);

	if (is_v && b > 64u)
		b = 64u;
	return b >= 16u ? b : 0u;
}

/* The subspace dim of (layer, K or V)'s format when it is a codebook format
 * (KVQ_PARAM_CODEBOOK: pq2, pq1), else 0 (also for a layer past the policy's
 * or an unknown format). */
unsigned kvq_policy_subdim(const struct kvq_policy *p, uint32_t layer, int is_v);

#ifdef __cplusplus
}
#endif

#endif
