/* SPDX-License-Identifier: Apache-2.0 */
/* Format names, KV policies (layer -> (K format, V format)) and their parser. */
#ifndef KVQ_FORMAT_NAMES_H
#define KVQ_FORMAT_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_format.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MAX_LAYERS 256u
/* Longest policy string accepted: the longest canonical form (256 layers,
 * alternating two-format specs) is about 6300 characters. */
#define KVQ_POLICY_MAX_LEN 8192u

/* printf-style message into err[errlen] (nothing when err is NULL): the
 * error text of the parsers and of the layout. */
void kvq_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Canonical name of a format ("int8"), or NULL for an unknown value. */
const char *kvq_fmt_name(int fmt);

/* Format named by s[0..len) (canonical names, plus KVQ_FORMAT_ALIASES:
 * "fp8e4m3" for fp8); returns the enum value or -EINVAL. */
int kvq_fmt_from_name(const char *s, size_t len);

/* Every canonical name, blank-separated, into buf (truncated to len);
 * returns buf.  KVQ_FMT_NAMES_LEN holds them all. */
#define KVQ_FMT_NAMES_LEN (KVQ_FMT_COUNT * 16)
char *kvq_fmt_names(char *buf, size_t len);

/* Bytes per element of a format, scales and zeros included, for a block of
 * B tokens and head dim D, as stored by the layout (K or V). */
double kvq_fmt_bytes_per_value(int fmt, int is_v, uint32_t B, uint32_t D);

struct kvq_policy {
	uint32_t n_layers;
	uint8_t k[KVQ_MAX_LAYERS];
	uint8_t v[KVQ_MAX_LAYERS];
};

/*
 * Parses a policy for a model of n_layers layers.  Grammar:
 *   policy := spec | clause (';' clause)*
 *   clause := range ':' spec
 *   range  := N | N '-' | N '-' M          (N- runs to the last layer)
 *   spec   := FORMAT | 'k=' FORMAT ',' 'v=' FORMAT | 'v=' FORMAT ',' 'k=' FORMAT
 * Blanks around tokens are ignored.  Every layer must be covered exactly once.
 * Returns 0, or -EINVAL with a message naming the fault in err (err may be NULL).
 */
int kvq_policy_parse(const char *s, uint32_t n_layers, struct kvq_policy *ret, char *err, size_t errlen);

/* Writes the canonical form ("int8", "k=int8,v=int4g64", "0-9:int8;10-29:kivi2")
 * into buf; returns its length, or -ENOSPC when it does not fit (buf then
 * holds a truncated, terminated string if len > 0), or -EINVAL for a policy
 * with an unknown format or layer count. */
int kvq_policy_format(const struct kvq_policy *p, char *buf, size_t len);

/* 1 if any layer stores K or V in a KIVI format: one whose K takes its
 * parameters per channel (KVQ_PARAM_CHANNEL in the format table). */
int kvq_policy_uses_kivi(const struct kvq_policy *p);

#ifdef __cplusplus
}
#endif

#endif
