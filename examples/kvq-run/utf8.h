/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: UTF-8 written once, for the tokenizer's byte map and the JSON
 * strings of ab --prompts' files.
 */
#ifndef KVQ_RUN_UTF8_H
#define KVQ_RUN_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Writes code point cp (<= U+10FFFF) as UTF-8 to out (4 bytes of room);
 * returns the bytes written. */
static inline size_t utf8_put(uint32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

#endif
