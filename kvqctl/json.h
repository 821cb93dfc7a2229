/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqctl's JSON writer: one document on standard output, written as it
 * goes; commas are placed by nesting level.  key NULL: an array element
 * (or the document itself).
 */
#ifndef KVQCTL_JSON_H
#define KVQCTL_JSON_H

#include <stdbool.h>
#include <stdint.h>

/* Opens an object ('{') or array ('['); j_close with the closing character. */
void j_open(const char *key, char c);
void j_close(char c);

void j_str(const char *key, const char *v);
void j_u64(const char *key, uint64_t v);
void j_i64(const char *key, int64_t v);
/* A number; null when not finite. */
void j_num(const char *key, double v);
void j_bool(const char *key, bool v);

#endif
