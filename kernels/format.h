/* SPDX-License-Identifier: Apache-2.0 */
/* The host side of the format table: names, the list of names, bytes per
 * value.  KV policies are policy.h; the error text, seterr.h. */
#ifndef KVQ_FORMAT_NAMES_H
#define KVQ_FORMAT_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_format.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * B tokens and head dim D, as stored by the layout (K or V); a codebook
 * format's codebooks are the pool's, not the block's, and not counted. */
double kvq_fmt_bytes_per_value(int fmt, int is_v, uint32_t B, uint32_t D);

#ifdef __cplusplus
}
#endif

#endif
