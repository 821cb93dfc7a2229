/* SPDX-License-Identifier: Apache-2.0 */
/* kvqd.conf's values: each read by its row's type (conf_keys.h) into its
 * field, or refused with what is wrong (the reader adds FILE:LINE). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "conf_schema.h"
#include "conf_value.h"
#include "format.h"
#include "seterr.h"

/* What is wrong into m; returns -EINVAL. */
static int fail(struct conf_value_msg *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct conf_value_msg *m, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->msg, sizeof m->msg, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

char *conf_value_trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = '\0';
	return s;
}

/* Decimal digits only: no sign, no blanks, no hex (strtoul takes all three). */
int conf_value_u64(const char *s, uint64_t *ret)
{
	uint64_t v = 0;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	for (; isdigit((unsigned char)*s); s++)
		if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return -ERANGE;
	if (*s)
		return -EINVAL;
	*ret = v;
	return 0;
}

int kvq_config_parse_size(const char *s, uint64_t *ret_bytes)
{
	char num[32];
	uint64_t v, mult = 1;
	size_t n = 0;
	int rc;

	while (isdigit((unsigned char)s[n]))
		n++;
	if (n == 0 || n >= sizeof num)
		return n == 0 ? -EINVAL : -ERANGE;
	memcpy(num, s, n);
	num[n] = '\0';
	if ((rc = conf_value_u64(num, &v)) < 0)
		return rc;
	s += n;
	while (*s == ' ' || *s == '\t')
		s++;
	if (*s) {
		switch (toupper((unsigned char)*s)) {
		case 'K': mult = 1ull << 10; break;
		case 'M': mult = 1ull << 20; break;
		case 'G': mult = 1ull << 30; break;
		case 'T': mult = 1ull << 40; break;
		default: return -EINVAL;
		}
		s++;
		if (strcmp(s, "iB") != 0 && *s)
			return -EINVAL;
	}
	if (__builtin_mul_overflow(v, mult, &v))
		return -ERANGE;
	*ret_bytes = v;
	return 0;
}

/* "12", "12.5", with "%" when percent_sign is 1 (required) or 2 (optional). */
static int parse_percent(const char *s, int percent_sign, double *ret)
{
	const char *q = s;
	size_t n;
	char num[32];
	double v;

	while (isdigit((unsigned char)*q))
		q++;
	if (q == s)
		return -EINVAL;
	if (*q == '.') {
		q++;
		if (!isdigit((unsigned char)*q))
			return -EINVAL;
		while (isdigit((unsigned char)*q))
			q++;
	}
	n = (size_t)(q - s);
	while (*q == ' ' || *q == '\t')
		q++;
	if (*q == '%')
		q++;
	else if (percent_sign == 1)
		return -EINVAL;
	if (*q || n >= sizeof num)
		return -EINVAL;
	memcpy(num, s, n);
	num[n] = '\0';
	v = strtod(num, NULL);
	if (!(v > 0.0 && v <= 100.0))
		return -ERANGE;
	*ret = v;
	return 0;
}

static int parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = { "yes", "true", "on", "1" }, *const no[] = { "no", "false", "off", "0" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_log_level(const char *s, int *ret)
{
	static const struct { const char *name; int level; } levels[] = {
		{ "emerg", LOG_EMERG }, { "alert", LOG_ALERT }, { "crit", LOG_CRIT }, { "err", LOG_ERR },
		{ "error", LOG_ERR }, { "warning", LOG_WARNING }, { "warn", LOG_WARNING },
		{ "notice", LOG_NOTICE }, { "info", LOG_INFO }, { "debug", LOG_DEBUG },
	};

	if (s[0] >= '0' && s[0] <= '7' && !s[1]) {
		*ret = s[0] - '0';
		return 0;
	}
	for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
		if (strcasecmp(s, levels[i].name) == 0) {
			*ret = levels[i].level;
			return 0;
		}
	return -EINVAL;
}

/* A user or group name or number; names are looked up now, so a reload
 * (SIGHUP) picks up renamed or new accounts. */
static int resolve_id(struct conf_value_msg *m, const char *s, bool group, uint32_t *ret)
{
	uint64_t v;
	size_t size = 4096;
	char *buf = NULL;
	int rc;

	if (isdigit((unsigned char)*s)) {
		if (conf_value_u64(s, &v) < 0 || v >= UINT32_MAX)
			return fail(m, "bad %s id '%s'", group ? "group" : "user", s);
		*ret = (uint32_t)v;
		return 0;
	}
	for (;;) {
		struct passwd pw, *pwr = NULL;
		struct group gr, *grr = NULL;
		char *nb = realloc(buf, size);

		if (!nb) {
			free(buf);
			snprintf(m->msg, sizeof m->msg, "out of memory");
			return -ENOMEM;
		}
		buf = nb;
		if (group)
			rc = getgrnam_r(s, &gr, buf, size, &grr);
		else
			rc = getpwnam_r(s, &pw, buf, size, &pwr);
		if (rc == ERANGE && size < (1u << 20)) {
			size *= 2;
			continue;
		}
		free(buf);
		if (rc == 0 && group && grr) {
			*ret = (uint32_t)grr->gr_gid;
			return 0;
		}
		if (rc == 0 && !group && pwr) {
			*ret = (uint32_t)pwr->pw_uid;
			return 0;
		}
		if (rc == 0 || rc == ENOENT || rc == ESRCH)
			return fail(m, "no such %s '%s'", group ? "group" : "user", s);
		return fail(m, "looking up %s '%s': %s", group ? "group" : "user", s, strerror(rc));
	}
}

static int parse_ids(struct conf_value_msg *m, char *v, bool group, struct kvq_config_acl *acl)
{
	uint32_t *n = group ? &acl->n_gids : &acl->n_uids;
	char *save = NULL, *tok;
	int rc;

	*n = 0;
	/* strtok_r would skip empty items; "1,,2" is a typo worth reporting */
	for (tok = v; tok; tok = save) {
		uint32_t id = 0;

		save = strchr(tok, ',');
		if (save)
			*save++ = '\0';
		tok = conf_value_trim(tok);
		if (!*tok)
			return fail(m, "empty item in the %s list", group ? "group" : "user");
		if (*n >= KVQ_CONFIG_MAX_IDS)
			return fail(m, "more than %u %ss in one list", KVQ_CONFIG_MAX_IDS,
				         group ? "group" : "user");
		if ((rc = resolve_id(m, tok, group, &id)) < 0)
			return rc;
		if (group)
			acl->gids[(*n)++] = (gid_t)id;
		else
			acl->uids[(*n)++] = (uid_t)id;
	}
	acl->any = false;
	return 0;
}

static int value_u32(struct conf_value_msg *m, const char *key, const char *v, uint32_t lo, uint32_t hi, uint32_t mult,
		     uint32_t *ret)
{
	uint64_t x;

	if (conf_value_u64(v, &x) < 0 || x < lo || x > hi || x % mult)
		return mult > 1 ? fail(m, "%s '%s' is not a multiple of %u in %u-%u", key, v, mult, lo,
					    hi)
				: fail(m, "%s '%s' is not a number in %u-%u", key, v, lo, hi);
	*ret = (uint32_t)x;
	return 0;
}

static int value_size(struct conf_value_msg *m, const char *key, const char *v, uint64_t *ret)
{
	int rc = kvq_config_parse_size(v, ret);

	if (rc == -ERANGE)
		return fail(m, "%s '%s' exceeds 2^64 bytes", key, v);
	if (rc < 0)
		return fail(m, "%s '%s' is not a size (bytes with an optional K, M, G or T suffix)",
				 key, v);
	if (*ret == 0)
		return fail(m, "%s must not be 0", key);
	return 0;
}

static int value_percent(struct conf_value_msg *m, const char *key, const char *v, int sign, double *ret)
{
	int rc = parse_percent(v, sign, ret);

	if (rc == -ERANGE)
		return fail(m, "%s '%s' is not in (0, 100]%%", key, v);
	if (rc < 0)
		return fail(m, "%s '%s' is not a percentage%s", key, v, sign == 1 ? " (N%)" : "");
	return 0;
}

/* One of a pair of keys that set one amount, in bytes or as a share of a
 * total (an optional '%'); the reader refuses the pair set together. */
static int value_amount(struct conf_value_msg *m, int key, const char *v, int kind, struct kvq_config_amount *a)
{
	const char *name = conf_schema_keys[key].name;

	a->kind = kind;
	if (kind == KVQ_AMOUNT_PERCENT)
		return value_percent(m, name, v, 2, &a->percent);
	return value_size(m, name, v, &a->bytes);
}

static int value_bool(struct conf_value_msg *m, const char *key, const char *v, bool *ret)
{
	if (parse_bool(v, ret) < 0)
		return fail(m, "%s '%s' is not yes or no", key, v);
	return 0;
}

static int value_quota(struct conf_value_msg *m, const char *key, const char *v, uint64_t *ret)
{
	if (strcmp(v, "none") == 0) {
		*ret = KVQ_CONFIG_UNLIMITED;
		return 0;
	}
	return value_size(m, key, v, ret);
}

/* A limit: a count, a size or milliseconds within the row's range. */
static int value_limit(struct conf_value_msg *m, const struct conf_schema_key *row, const char *v, uint64_t *ret)
{
	uint64_t x;
	int rc;

	if (row->type == KVQ_CONF_T_BYTES) {
		if ((rc = value_size(m, row->name, v, &x)) < 0)
			return rc;
	} else if (conf_value_u64(v, &x) < 0) {
		return fail(m, "%s '%s' is not a number%s", row->name, v,
				 row->type == KVQ_CONF_T_MS ? " of milliseconds" : "");
	}
	if (x < row->lo || x > row->hi)
		return fail(m, "%s '%s' is not in %llu-%llu%s", row->name, v,
				 (unsigned long long)row->lo, (unsigned long long)row->hi,
				 row->type == KVQ_CONF_T_BYTES ? " bytes" : "");
	*ret = x;
	return 0;
}

/* A remote's seeds: ADDRESS:PORT items, comma-separated, each an IPv4
 * address or a bracketed IPv6 one (hiredis would resolve a name with a
 * blocking lookup on the daemon's loop). */
static int value_nodes(struct conf_value_msg *m, const char *key, const char *v, size_t size)
{
	char item[KVQ_CONFIG_NODES_MAX + 1], host[64];
	const char *p = v;

	if (strlen(v) >= size)
		return fail(m, "%s longer than %zu bytes", key, size - 1);
	for (;;) {
		size_t len = strcspn(p, ",");
		char *t, *colon;
		uint64_t port;
		size_t hl;
		union { struct in_addr a4; struct in6_addr a6; } a;

		memcpy(item, p, len);
		item[len] = '\0';
		t = conf_value_trim(item);
		if (!*t)
			return fail(m, "%s: empty item in the list", key);
		colon = strrchr(t, ':');
		if (!colon || conf_value_u64(colon + 1, &port) < 0 || port == 0 || port > 65535)
			return fail(m, "%s: '%s' is not ADDRESS:PORT with a port in 1-65535", key, t);
		hl = (size_t)(colon - t);
		if (hl >= 2 && t[0] == '[' && t[hl - 1] == ']' && hl - 2 < sizeof host) {
			memcpy(host, t + 1, hl - 2);
			host[hl - 2] = '\0';
			if (inet_pton(AF_INET6, host, &a.a6) != 1)
				return fail(m, "%s: '%s' is not an IPv6 address", key, host);
		} else {
			if (hl >= sizeof host)
				hl = sizeof host - 1;
			memcpy(host, t, hl);
			host[hl] = '\0';
			if (inet_pton(AF_INET, host, &a.a4) != 1)
				return fail(m, "%s: '%s' is not an IPv4 address or a bracketed IPv6 address (names are not "
					    "resolved)", key, host);
		}
		p += len;
		if (!*p)
			return 0;
		p++;
	}
}

/* Printable characters and no blanks, within the field. */
static int value_word(struct conf_value_msg *m, const char *key, const char *v, size_t size)
{
	if (strlen(v) >= size)
		return fail(m, "%s longer than %zu bytes", key, size - 1);
	for (const char *c = v; *c; c++)
		if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
			return fail(m, "%s '%s' holds a blank or a character that is not printable ASCII", key, v);
	return 0;
}

/* Text into a char field, zero-filled past it (a reload compares fields
 * byte for byte). */
static void set_text(char *field, size_t size, const char *v)
{
	memset(field, 0, size);
	memcpy(field, v, strlen(v));
}

/* ------------------------------------------------------------ keys */

int conf_value_read(struct conf_value_msg *m, int k, const char *v, void *item, char *policy)
{
	const struct conf_schema_key *row = &conf_schema_keys[k];
	const char *key = row->name;
	void *f = (char *)item + row->offset;
	char s[KVQ_CONFIG_MAX_LINE + 1];
	uint32_t u;
	int rc;

	switch (row->type) {
	case KVQ_CONF_T_PATH:
		if (v[0] != '/' || strlen(v) >= row->size)
			return fail(m, "%s must be an absolute path of at most %zu bytes", key,
					 row->size - 1);
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_BACKEND:
		if (strcmp(v, "auto") && strcmp(v, "host") && strcmp(v, "cuda"))
			return fail(m, "%s '%s' is not auto, host or cuda", key, v);
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_INT:
		if ((rc = value_u32(m, key, v, (uint32_t)row->lo, (uint32_t)row->hi, (uint32_t)row->step, &u)) < 0)
			return rc;
		*(int *)f = (int)u;
		return 0;
	case KVQ_CONF_T_U32:
		return value_u32(m, key, v, (uint32_t)row->lo, (uint32_t)row->hi, (uint32_t)row->step, f);
	case KVQ_CONF_T_BOOL:
		return value_bool(m, key, v, f);
	case KVQ_CONF_T_LOGLEVEL:
		if (parse_log_level(v, f) < 0)
			return fail(m, "%s '%s' is not a syslog level (emerg .. debug, or 0-7)", key, v);
		return 0;
	case KVQ_CONF_T_BUDGET: {
		struct kvq_config_amount *a = f;

		if (strchr(v, '%')) {
			a->kind = KVQ_AMOUNT_PERCENT;
			return value_percent(m, key, v, 1, &a->percent);
		}
		a->kind = KVQ_AMOUNT_BYTES;
		return value_size(m, key, v, &a->bytes);
	}
	case KVQ_CONF_T_AMOUNT:
		return value_amount(m, k, v, KVQ_AMOUNT_BYTES, f);
	case KVQ_CONF_T_SHARE:
		return value_amount(m, k, v, KVQ_AMOUNT_PERCENT, f);
	case KVQ_CONF_T_UIDS:
	case KVQ_CONF_T_GIDS:
		/* the list is cut in place */
		snprintf(s, sizeof s, "%s", v);
		return parse_ids(m, s, row->type == KVQ_CONF_T_GIDS, f);
	case KVQ_CONF_T_QUOTA:
		return value_quota(m, key, v, f);
	case KVQ_CONF_T_LISTEN: {
		char addr[KVQ_CONFIG_LISTEN_MAX + 1], why[128];
		uint16_t port;

		if (kvq_config_parse_listen(v, addr, sizeof(addr), &port, why, sizeof(why)) < 0)
			return fail(m, "%s '%s': %s", key, v, why);
		set_text(f, row->size, v);
		return 0;
	}
	case KVQ_CONF_T_MODEL:
		if (strlen(v) >= row->size)
			return fail(m, "%s id longer than %zu bytes", key, row->size - 1);
		for (const char *c = v; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				return fail(m, "%s id holds a control character", key);
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_POLICY:
		if (strlen(v) > KVQ_POLICY_MAX_LEN)
			return fail(m, "%s longer than %u bytes", key, KVQ_POLICY_MAX_LEN);
		strcpy(policy, v);      /* parsed once layers is known (conf_check_pool) */
		return 0;
	case KVQ_CONF_T_DTYPE:
		if (strcmp(v, "f16") == 0)
			*(int *)f = KVQ_DT_F16;
		else if (strcmp(v, "bf16") == 0)
			*(int *)f = KVQ_DT_BF16;
		else
			return fail(m, "%s '%s' is not f16 or bf16", key, v);
		return 0;
	case KVQ_CONF_T_COUNT:
	case KVQ_CONF_T_BYTES:
	case KVQ_CONF_T_MS:
		return value_limit(m, row, v, f);
	case KVQ_CONF_T_NODES:
		if ((rc = value_nodes(m, key, v, row->size)) < 0)
			return rc;
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_WORD:
		if ((rc = value_word(m, key, v, row->size)) < 0)
			return rc;
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_FILE:
		if (v[0] != '/' || strlen(v) >= row->size)
			return fail(m, "%s must be an absolute path of at most %zu bytes", key, row->size - 1);
		set_text(f, row->size, v);
		return 0;
	case KVQ_CONF_T_WRITE:
		if (strcmp(v, "through") == 0)
			*(int *)f = KVQ_REMOTE_WRITE_THROUGH;
		else if (strcmp(v, "back") == 0)
			*(int *)f = KVQ_REMOTE_WRITE_BACK;
		else if (strcmp(v, "off") == 0)
			*(int *)f = KVQ_REMOTE_WRITE_OFF;
		else
			return fail(m, "%s '%s' is not through, back or off", key, v);
		return 0;
	}
	return fail(m, "internal: key %s of type %d", key, row->type);
}

int kvq_config_parse_listen(const char *s, char *addr, size_t addrlen, uint16_t *ret_port, char *err,
			    size_t errlen)
{
	const char *colon, *host = s;
	size_t hlen;
	uint64_t port;
	struct in_addr a4;
	struct in6_addr a6;
	char h[KVQ_CONFIG_LISTEN_MAX + 1];

	if (strlen(s) > KVQ_CONFIG_LISTEN_MAX)
		return kvq_seterr(err, errlen, "longer than %u bytes", KVQ_CONFIG_LISTEN_MAX), -EINVAL;
	colon = strrchr(s, ':');
	if (!colon)
		return kvq_seterr(err, errlen, "not ADDRESS:PORT"), -EINVAL;
	if (conf_value_u64(colon + 1, &port) < 0 || port == 0 || port > 65535)
		return kvq_seterr(err, errlen, "port is not a number in 1-65535"), -EINVAL;
	hlen = (size_t)(colon - s);
	if (hlen >= 2 && s[0] == '[' && s[hlen - 1] == ']') {
		host++;
		hlen -= 2;
	}
	memcpy(h, host, hlen);
	h[hlen] = '\0';
	if (inet_pton(AF_INET, h, &a4) == 1) {
		if ((ntohl(a4.s_addr) >> 24) != 127)
			return kvq_seterr(err, errlen, "%s is not a loopback address (127.0.0.0/8)", h), -EINVAL;
	} else if (inet_pton(AF_INET6, h, &a6) == 1 && host != s) {
		if (!IN6_IS_ADDR_LOOPBACK(&a6))
			return kvq_seterr(err, errlen, "%s is not the loopback address ::1", h), -EINVAL;
	} else {
		return kvq_seterr(err, errlen, "'%s' is not an IPv4 address or a bracketed IPv6 address", h), -EINVAL;
	}
	if (hlen >= addrlen)
		return kvq_seterr(err, errlen, "address too long"), -EINVAL;
	memcpy(addr, h, hlen + 1);
	*ret_port = (uint16_t)port;
	return 0;
}
