/* SPDX-License-Identifier: Apache-2.0 */
#include <math.h>
#include <stdio.h>

#include "json.h"

static struct {
	int depth;
	bool first[16];
} js;

static void j_sep(const char *key)
{
	if (js.depth > 0 && !js.first[js.depth])
		fputc(',', stdout);
	if (js.depth > 0)
		js.first[js.depth] = false;
	if (key)
		printf("\"%s\":", key);
}

void j_open(const char *key, char c)
{
	j_sep(key);
	fputc(c, stdout);
	js.first[++js.depth] = true;
}

void j_close(char c)
{
	js.depth--;
	fputc(c, stdout);
	if (js.depth == 0)
		fputc('\n', stdout);
}

void j_str(const char *key, const char *v)
{
	j_sep(key);
	fputc('"', stdout);
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			fputc(*p, stdout);
	}
	fputc('"', stdout);
}

void j_u64(const char *key, uint64_t v)
{
	j_sep(key);
	printf("%llu", (unsigned long long)v);
}

void j_i64(const char *key, int64_t v)
{
	j_sep(key);
	printf("%lld", (long long)v);
}

void j_num(const char *key, double v)
{
	j_sep(key);
	if (isfinite(v))
		printf("%.15g", v);
	else
		fputs("null", stdout);
}

void j_bool(const char *key, bool v)
{
	j_sep(key);
	fputs(v ? "true" : "false", stdout);
}
