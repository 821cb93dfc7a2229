/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"

static const char *const fmt_names[KVQ_FMT_COUNT] = {
#define KVQ_X(ID, NAME, ...) [KVQ_FMT_##ID] = NAME,
	KVQ_FORMATS(KVQ_X)
#undef KVQ_X
};

static const struct {
	const char *name;
	int fmt;
} fmt_aliases[] = {
#define KVQ_X(NAME, ID) { NAME, KVQ_FMT_##ID },
	KVQ_FORMAT_ALIASES(KVQ_X)
#undef KVQ_X
};

const char *kvq_fmt_name(int fmt)
{
	return fmt >= 0 && fmt < KVQ_FMT_COUNT ? fmt_names[fmt] : NULL;
}

int kvq_fmt_from_name(const char *s, size_t len)
{
	for (int f = 0; f < KVQ_FMT_COUNT; f++)
		if (strlen(fmt_names[f]) == len && memcmp(fmt_names[f], s, len) == 0)
			return f;
	for (size_t i = 0; i < sizeof(fmt_aliases) / sizeof(fmt_aliases[0]); i++)
		if (strlen(fmt_aliases[i].name) == len && memcmp(fmt_aliases[i].name, s, len) == 0)
			return fmt_aliases[i].fmt;
	return -EINVAL;
}

char *kvq_fmt_names(char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int f = 0; f < KVQ_FMT_COUNT && n < len; f++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", f ? " " : "", fmt_names[f]);
	return buf;
}

static uint32_t align16(uint32_t x)
{
	return (x + 15u) & ~15u;
}

double kvq_fmt_bytes_per_value(int fmt, int is_v, uint32_t B, uint32_t D)
{
	int kind = kvq_fmt_param_kind(fmt, is_v);
	uint32_t codes = align16(B * (D / kvq_fmt_subdim(fmt)) * kvq_fmt_bits(fmt) / 8u);
	uint32_t params = align16(kvq_param_count(kind, kvq_fmt_group(fmt, is_v), B, D) *
				  kvq_param_entry_bytes(kind));

	return (double)(codes + params) / ((double)B * D);
}

