/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab: what a continuation shows without the model: its repeated
 * 4-grams, its decoded text and whether that text is broken UTF-8, and the
 * text written out safely (JSON strings, plain UTF-8).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ab.h"

void ab_rep4(const uint32_t *x, uint32_t n, uint64_t *ngrams, uint64_t *repeats)
{
	for (uint32_t i = 3; i < n; i++) {
		bool rep = false;

		for (uint32_t j = 3; j < i && !rep; j++)
			rep = !memcmp(x + i - 3, x + j - 3, 4 * sizeof(*x));
		(*ngrams)++;
		*repeats += rep;
	}
}

char *ab_decode(const uint32_t *ids, uint32_t n, size_t *ret_len)
{
	size_t len = 0, cap = 256;
	char *s = malloc(cap);

	if (!s)
		die("%s", strerror(ENOMEM));
	for (uint32_t i = 0; i < n; i++) {
		int b;

		while ((b = tok_decode(tk, ids[i], s + len, cap - len)) >= 0 && (size_t)b >= cap - len) {
			cap *= 2;
			if (!(s = realloc(s, cap)))
				die("%s", strerror(ENOMEM));
		}
		if (b < 0)
			die("token %u beyond the vocabulary", ids[i]);
		len += (size_t)b;
	}
	s[len] = 0;
	*ret_len = len;
	return s;
}

/* The length of the UTF-8 character at s[0..len) and *cp, or 0 when the
 * bytes are not one (*incomplete: a correct start that len cuts short). */
static size_t u8_char(const unsigned char *s, size_t len, uint32_t *cp, bool *incomplete)
{
	size_t need;
	uint32_t c = s[0], min;

	*incomplete = false;
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xc2 && c < 0xe0)
		need = 2, c &= 0x1f, min = 0x80;
	else if (c >= 0xe0 && c < 0xf0)
		need = 3, c &= 0x0f, min = 0x800;
	else if (c >= 0xf0 && c < 0xf5)
		need = 4, c &= 0x07, min = 0x10000;
	else
		return 0;
	for (size_t i = 1; i < need; i++) {
		if (i == len) {
			*incomplete = true;
			return 0;
		}
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (s[i] & 0x3f);
		/* overlong, surrogate or beyond U+10FFFF, known from the first
		 * two bytes */
		if (i == 1 && ((need == 3 && (c < 0x20 || (c >= 0x360 && c < 0x380))) ||
			       (need == 4 && (c < 0x10 || c > 0x10f))))
			return 0;
	}
	if (c < min)
		return 0;
	*cp = c;
	return need;
}

bool ab_utf8_bad(const char *s, size_t len, bool cut)
{
	const unsigned char *u = (const unsigned char *)s;

	for (size_t i = 0; i < len;) {
		uint32_t cp;
		bool inc;
		size_t k = u8_char(u + i, len - i, &cp, &inc);

		if (k == 0)
			return !(inc && cut);
		if (cp == 0xfffd)
			return true;
		i += k;
	}
	return false;
}

/* Writes s[0..len) to f, invalid bytes as U+FFFD; json: escaped for a
 * JSON string. */
static void put_utf8(FILE *f, const char *s, size_t len, bool json)
{
	const unsigned char *u = (const unsigned char *)s;

	for (size_t i = 0; i < len;) {
		uint32_t cp;
		bool inc;
		size_t k = u8_char(u + i, len - i, &cp, &inc);

		if (k == 0) {
			fputs(json ? "\\ufffd" : "\xef\xbf\xbd", f);
			i++;
			continue;
		}
		if (json && (cp == '"' || cp == '\\'))
			fprintf(f, "\\%c", (char)cp);
		else if (json && cp == '\n')
			fputs("\\n", f);
		else if (json && cp == '\t')
			fputs("\\t", f);
		else if (json && cp < 0x20)
			fprintf(f, "\\u%04x", cp);
		else
			fwrite(u + i, 1, k, f);
		i += k;
	}
}

void ab_put_json(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	put_utf8(f, s, len, true);
	fputc('"', f);
}

void ab_put_text(FILE *f, const char *s, size_t len)
{
	put_utf8(f, s, len, false);
}
