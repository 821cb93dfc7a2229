/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab --prompts: the prompts file.  One prompt per line, or, when
 * the first line that is not blank starts with '{', JSON lines: an object
 * per line with a string "prompt" and optionally a string "system" (other
 * members are skipped).  Blank lines are skipped in both; a line that does
 * not parse stops the run with its number.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "utf8.h"

#define JSON_MAX_DEPTH 32

struct jp {
	const char *p, *end;
	const char *err;
};

static void jp_ws(struct jp *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n'))
		j->p++;
}

static int hex4(const char *p)
{
	int v = 0;

	for (int i = 0; i < 4; i++) {
		char c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return -1;
	}
	return v;
}

/* A JSON string at j->p (its opening quote), decoded; *out (if not NULL)
 * gets it malloc'ed.  Returns 0, or -1 with j->err. */
static int jp_string(struct jp *j, char **out)
{
	char *s = NULL, *w;

	if (j->p >= j->end || *j->p != '"') {
		j->err = "a string expected";
		return -1;
	}
	j->p++;
	/* decoded, a string is never longer than its JSON */
	if (out && !(s = malloc((size_t)(j->end - j->p) + 1)))
		die("%s", strerror(ENOMEM));
	w = s;
	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p++;
		uint32_t cp;
		int h, l;

		if (c < 0x20) {
			j->err = "a control character in a string (write it as \\n, \\t, \\u00XX)";
			goto fail;
		}
		if (c != '\\') {
			if (w)
				*w++ = (char)c;
			continue;
		}
		if (j->p >= j->end)
			break;
		switch (*j->p++) {
		case '"': cp = '"'; break;
		case '\\': cp = '\\'; break;
		case '/': cp = '/'; break;
		case 'b': cp = '\b'; break;
		case 'f': cp = '\f'; break;
		case 'n': cp = '\n'; break;
		case 'r': cp = '\r'; break;
		case 't': cp = '\t'; break;
		case 'u':
			if (j->end - j->p < 4 || (h = hex4(j->p)) < 0) {
				j->err = "a bad \\u escape";
				goto fail;
			}
			j->p += 4;
			cp = (uint32_t)h;
			if (cp >= 0xd800 && cp < 0xdc00) {
				if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || (l = hex4(j->p + 2)) < 0 ||
				    l < 0xdc00 || l >= 0xe000) {
					j->err = "a high surrogate without its low one";
					goto fail;
				}
				j->p += 6;
				cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)l - 0xdc00);
			} else if (cp >= 0xdc00 && cp < 0xe000) {
				j->err = "a low surrogate alone";
				goto fail;
			}
			if (cp == 0) {
				j->err = "\\u0000 in a string";
				goto fail;
			}
			break;
		default:
			j->err = "a bad escape in a string";
			goto fail;
		}
		if (w)
			w += utf8_put(cp, w);
	}
	if (j->p >= j->end) {
		j->err = "a string not closed";
		goto fail;
	}
	j->p++;
	if (out) {
		*w = 0;
		*out = s;
	}
	return 0;
fail:
	free(s);
	return -1;
}

static size_t digits(struct jp *j)
{
	const char *s = j->p;

	while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
		j->p++;
	return (size_t)(j->p - s);
}

/* Steps over true, false, null or a number.  Returns 0, or -1 with
 * j->err. */
static int jp_scalar(struct jp *j)
{
	static const char *const lit[] = { "true", "false", "null" };

	for (int i = 0; i < 3; i++) {
		size_t l = strlen(lit[i]);

		if ((size_t)(j->end - j->p) >= l && !strncmp(j->p, lit[i], l)) {
			j->p += l;
			return 0;
		}
	}
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p < j->end && *j->p == '0')
		j->p++;
	else if (digits(j) == 0)
		goto bad;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (digits(j) == 0)
			goto bad;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (digits(j) == 0)
			goto bad;
	}
	return 0;
bad:
	j->err = "a bad value";
	return -1;
}

/* The members of an object (obj) or the items of an array at j->p: item
 * is called for each, with the member's key (NULL in an array), to read
 * its value.  Returns 0, or -1 with j->err. */
static int jp_list(struct jp *j, bool obj, int (*item)(struct jp *j, const char *key, void *ctx), void *ctx)
{
	char close = obj ? '}' : ']';

	jp_ws(j);
	if (j->p >= j->end || *j->p != (obj ? '{' : '[')) {
		j->err = obj ? "an object expected" : "an array expected";
		return -1;
	}
	j->p++;
	jp_ws(j);
	if (j->p < j->end && *j->p == close) {
		j->p++;
		return 0;
	}
	for (;;) {
		char *key = NULL;
		int r;

		jp_ws(j);
		if (obj) {
			if (jp_string(j, &key) < 0)
				return -1;
			jp_ws(j);
			if (j->p >= j->end || *j->p++ != ':') {
				free(key);
				j->err = "':' expected";
				return -1;
			}
			jp_ws(j);
		}
		r = item(j, key, ctx);
		free(key);
		if (r < 0)
			return -1;
		jp_ws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == close) {
			j->p++;
			return 0;
		}
		j->err = obj ? "',' or '}' expected" : "',' or ']' expected";
		return -1;
	}
}

static int jp_skip(struct jp *j, int depth);

static int skip_item(struct jp *j, const char *key, void *depth)
{
	(void)key;
	return jp_skip(j, *(int *)depth + 1);
}

/* Steps over any JSON value.  Returns 0, or -1 with j->err. */
static int jp_skip(struct jp *j, int depth)
{
	jp_ws(j);
	if (j->p >= j->end) {
		j->err = "a value expected";
		return -1;
	}
	if (*j->p == '"')
		return jp_string(j, NULL);
	if (*j->p == '{' || *j->p == '[') {
		if (depth >= JSON_MAX_DEPTH) {
			j->err = "nested too deep";
			return -1;
		}
		return jp_list(j, *j->p == '{', skip_item, &depth);
	}
	return jp_scalar(j);
}

/* A member of a prompt's line: "prompt" and "system" kept, others
 * skipped. */
static int prompt_member(struct jp *j, const char *key, void *ctx)
{
	struct prompt *p = ctx;
	bool is_prompt = !strcmp(key, "prompt"), is_system = !strcmp(key, "system");
	char **dst = is_prompt ? &p->text : is_system ? &p->system : NULL;
	int depth = 1;

	if (!dst)
		return skip_item(j, key, &depth);
	if (*dst) {
		j->err = is_prompt ? "\"prompt\" twice" : "\"system\" twice";
		return -1;
	}
	if (is_system && j->end - j->p >= 4 && !strncmp(j->p, "null", 4)) {
		j->p += 4;
		return 0;
	}
	if (j->p >= j->end || *j->p != '"') {
		j->err = is_prompt ? "\"prompt\" is not a string" : "\"system\" is not a string or null";
		return -1;
	}
	return jp_string(j, dst);
}

/* One JSON line into p.  Returns 0, or -1 with j->err. */
static int jp_prompt(struct jp *j, struct prompt *p)
{
	if (jp_list(j, true, prompt_member, p) < 0)
		return -1;
	jp_ws(j);
	if (j->p < j->end) {
		j->err = "more after the object (one object per line)";
		return -1;
	}
	if (!p->text) {
		j->err = "no \"prompt\"";
		return -1;
	}
	if (!*p->text) {
		j->err = "\"prompt\" is empty";
		return -1;
	}
	return 0;
}

struct prompt *prompts_read(const char *path, size_t *ret_n)
{
	size_t len, n = 0, cap = 0;
	char *buf = read_file(path, &len), *line = buf, *end = buf + len;
	struct prompt *ps = NULL;
	int json = -1;   /* not yet known */

	if (memchr(buf, 0, len))
		die("%s: a NUL byte (not a text file)", path);
	for (unsigned no = 1; line < end; no++) {
		char *nl = memchr(line, '\n', (size_t)(end - line)), *e = nl ? nl : end, *s = line, *start = line;

		line = nl ? nl + 1 : end;
		if (e > s && e[-1] == '\r')
			e--;
		while (s < e && (*s == ' ' || *s == '\t'))
			s++;
		if (s == e)
			continue;
		if (json < 0)
			json = *s == '{';
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			ps = realloc(ps, cap * sizeof(*ps));
			if (!ps)
				die("%s", strerror(ENOMEM));
		}
		struct prompt *p = &ps[n];

		memset(p, 0, sizeof(*p));
		p->line = no;
		if (json) {
			struct jp j = { .p = s, .end = e };

			if (jp_prompt(&j, p) < 0)
				die("%s:%u: %s (JSON lines: {\"prompt\": \"...\", \"system\": \"...\"}, the file's first "
				    "line started with '{')", path, no, j.err);
		} else {
			/* a plain prompt is the whole line, as written */
			p->text = strndup(start, (size_t)(e - start));
			if (!p->text)
				die("%s", strerror(ENOMEM));
		}
		n++;
	}
	free(buf);
	if (n == 0)
		die("%s: no prompts (one a line, or JSON lines with \"prompt\")", path);
	*ret_n = n;
	return ps;
}

void prompts_free(struct prompt *p, size_t n)
{
	for (size_t i = 0; p && i < n; i++) {
		free(p[i].text);
		free(p[i].system);
	}
	free(p);
}
