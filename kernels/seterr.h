/* SPDX-License-Identifier: Apache-2.0 */
/* The error text of the parsers, the layout and the daemon's checks: one
 * printf-style setter at the ground floor, so a module that reports into a
 * caller's buffer needs nothing else of the kernels. */
#ifndef KVQ_SETERR_H
#define KVQ_SETERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* printf-style message into err[errlen] (nothing when err is NULL or
 * errlen is 0). */
void kvq_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif
