/* SPDX-License-Identifier: Apache-2.0 */
/* The kvqd.conf reader: lines, sections, keys and their values (format in
 * conf.h, every key in systemd/kvqd.conf.example); what needs more than one
 * value is conf_check.c's. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "conf_parser.h"
#include "frame.h"
#include "layout.h"

const struct conf_key conf_keys[K_COUNT] = {
	[K_SOCKET] = { "socket", SEC_KVQD },
	[K_BACKEND] = { "backend", SEC_KVQD },
	[K_DEVICE] = { "device", SEC_KVQD | SEC_POOL },
	[K_MEMORY_BUDGET] = { "memory_budget", SEC_KVQD },
	[K_LOG_LEVEL] = { "log_level", SEC_KVQD },
	[K_CREATE_ON_ATTACH] = { "create_on_attach", SEC_KVQD | SEC_POOL },
	[K_CREATE_UIDS] = { "create_uids", SEC_KVQD },
	[K_CREATE_GIDS] = { "create_gids", SEC_KVQD },
	[K_CREATE_CAPACITY] = { "create_capacity", SEC_KVQD },
	[K_CREATE_MEMORY_SHARE] = { "create_memory_share", SEC_KVQD },
	[K_QUOTA_PER_UID] = { "quota_per_uid", SEC_KVQD | SEC_POOL },
	[K_ADMIN_UIDS] = { "admin_uids", SEC_KVQD },
	[K_ADMIN_GIDS] = { "admin_gids", SEC_KVQD },
	[K_METRICS_LISTEN] = { "metrics_listen", SEC_KVQD },
	[K_ATTENTION_TIMING] = { "attention_timing", SEC_KVQD | SEC_POOL },
	[K_ATTENTION_REPORT_MS] = { "attention_report_ms", SEC_KVQD },
	[K_MODEL] = { "model", SEC_POOL },
	[K_LAYERS] = { "layers", SEC_POOL },
	[K_KV_HEADS] = { "kv_heads", SEC_POOL },
	[K_HEAD_DIM] = { "head_dim", SEC_POOL },
	[K_BLOCK_TOKENS] = { "block_tokens", SEC_POOL },
	[K_POLICY] = { "policy", SEC_POOL },
	[K_WINDOW] = { "window", SEC_POOL },
	[K_WINDOW_DTYPE] = { "window_dtype", SEC_POOL },
	[K_SINK_BLOCKS] = { "sink_blocks", SEC_POOL },
	[K_CAPACITY] = { "capacity", SEC_POOL },
	[K_MEMORY_SHARE] = { "memory_share", SEC_POOL },
	[K_ACL_UIDS] = { "acl_uids", SEC_POOL },
	[K_ACL_GIDS] = { "acl_gids", SEC_POOL },
#define K_LIMIT_NAME(key, def, lo, hi, unit, what) [K_LIMIT_##key] = { #key, SEC_KVQD },
	KVQ_LIMITS(K_LIMIT_NAME)
#undef K_LIMIT_NAME
};

int conf_fail(struct conf_parser *p, unsigned line, const char *fmt, ...)
{
	char msg[KVQ_CONFIG_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	kvq_seterr(p->err, p->errlen, "%s:%u: %s", p->file, line, msg);
	return -EINVAL;
}

/* ------------------------------------------------------------ values */

static char *trim(char *s)
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
int conf_parse_u64(const char *s, uint64_t *ret)
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
	if ((rc = conf_parse_u64(num, &v)) < 0)
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
static int resolve_id(struct conf_parser *p, const char *s, bool group, uint32_t *ret)
{
	uint64_t v;
	size_t size = 4096;
	char *buf = NULL;
	int rc;

	if (isdigit((unsigned char)*s)) {
		if (conf_parse_u64(s, &v) < 0 || v >= UINT32_MAX)
			return conf_fail(p, p->line, "bad %s id '%s'", group ? "group" : "user", s);
		*ret = (uint32_t)v;
		return 0;
	}
	for (;;) {
		struct passwd pw, *pwr = NULL;
		struct group gr, *grr = NULL;
		char *nb = realloc(buf, size);

		if (!nb) {
			free(buf);
			kvq_seterr(p->err, p->errlen, "%s:%u: out of memory", p->file, p->line);
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
			return conf_fail(p, p->line, "no such %s '%s'", group ? "group" : "user", s);
		return conf_fail(p, p->line, "looking up %s '%s': %s", group ? "group" : "user", s, strerror(rc));
	}
}

static int parse_ids(struct conf_parser *p, char *v, bool group, struct kvq_config_acl *acl)
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
		tok = trim(tok);
		if (!*tok)
			return conf_fail(p, p->line, "empty item in the %s list", group ? "group" : "user");
		if (*n >= KVQ_CONFIG_MAX_IDS)
			return conf_fail(p, p->line, "more than %u %ss in one list", KVQ_CONFIG_MAX_IDS,
				         group ? "group" : "user");
		if ((rc = resolve_id(p, tok, group, &id)) < 0)
			return rc;
		if (group)
			acl->gids[(*n)++] = (gid_t)id;
		else
			acl->uids[(*n)++] = (uid_t)id;
	}
	acl->any = false;
	return 0;
}

static int value_u32(struct conf_parser *p, const char *key, const char *v, uint32_t lo, uint32_t hi, uint32_t mult,
		     uint32_t *ret)
{
	uint64_t x;

	if (conf_parse_u64(v, &x) < 0 || x < lo || x > hi || x % mult)
		return mult > 1 ? conf_fail(p, p->line, "%s '%s' is not a multiple of %u in %u-%u", key, v, mult, lo,
					    hi)
				: conf_fail(p, p->line, "%s '%s' is not a number in %u-%u", key, v, lo, hi);
	*ret = (uint32_t)x;
	return 0;
}

static int value_size(struct conf_parser *p, const char *key, const char *v, uint64_t *ret)
{
	int rc = kvq_config_parse_size(v, ret);

	if (rc == -ERANGE)
		return conf_fail(p, p->line, "%s '%s' exceeds 2^64 bytes", key, v);
	if (rc < 0)
		return conf_fail(p, p->line, "%s '%s' is not a size (bytes with an optional K, M, G or T suffix)",
				 key, v);
	if (*ret == 0)
		return conf_fail(p, p->line, "%s must not be 0", key);
	return 0;
}

static int value_percent(struct conf_parser *p, const char *key, const char *v, int sign, double *ret)
{
	int rc = parse_percent(v, sign, ret);

	if (rc == -ERANGE)
		return conf_fail(p, p->line, "%s '%s' is not in (0, 100]%%", key, v);
	if (rc < 0)
		return conf_fail(p, p->line, "%s '%s' is not a percentage%s", key, v, sign == 1 ? " (N%)" : "");
	return 0;
}

/* One of a pair of keys that set one amount, in bytes or as a share of a
 * total (an optional '%'); the other of the pair must not be set too. */
static int value_amount(struct conf_parser *p, int key, int other, const char *v, int kind,
			struct kvq_config_amount *a)
{
	const char *name = conf_keys[key].name;

	if (p->seen[other])
		return conf_fail(p, p->line, "%s and %s (line %u) exclude each other", name, conf_keys[other].name,
				 p->seen[other]);
	a->kind = kind;
	if (kind == KVQ_AMOUNT_PERCENT)
		return value_percent(p, name, v, 2, &a->percent);
	return value_size(p, name, v, &a->bytes);
}

static int value_bool(struct conf_parser *p, const char *key, const char *v, bool *ret)
{
	if (parse_bool(v, ret) < 0)
		return conf_fail(p, p->line, "%s '%s' is not yes or no", key, v);
	return 0;
}

static int value_quota(struct conf_parser *p, const char *v, uint64_t *ret)
{
	if (strcmp(v, "none") == 0) {
		*ret = KVQ_CONFIG_UNLIMITED;
		return 0;
	}
	return value_size(p, "quota_per_uid", v, ret);
}

/* ------------------------------------------------------------ keys */

/* A row of KVQ_LIMITS: a count, a size or milliseconds within its range. */
static int value_limit(struct conf_parser *p, const struct kvq_limit_row *row, const char *v)
{
	uint64_t x;
	int rc;

	if (row->unit == KVQ_LIMIT_BYTES) {
		if ((rc = value_size(p, row->key, v, &x)) < 0)
			return rc;
	} else if (conf_parse_u64(v, &x) < 0) {
		return conf_fail(p, p->line, "%s '%s' is not a number%s", row->key, v,
				 row->unit == KVQ_LIMIT_MS ? " of milliseconds" : "");
	}
	if (x < row->lo || x > row->hi)
		return conf_fail(p, p->line, "%s '%s' is not in %llu-%llu%s", row->key, v, (unsigned long long)row->lo,
				 (unsigned long long)row->hi, row->unit == KVQ_LIMIT_BYTES ? " bytes" : "");
	*(uint64_t *)((char *)&p->c->limits + row->offset) = x;
	return 0;
}

static int set_kvqd(struct conf_parser *p, int k, char *v)
{
	struct kvq_config *c = p->c;
	uint32_t u;
	uint64_t x;
	int rc;

	if (k >= K_FIRST_LIMIT)
		return value_limit(p, &kvq_limit_rows[k - K_FIRST_LIMIT], v);
	switch (k) {
	case K_SOCKET:
		if (v[0] != '/' || strlen(v) > KVQ_CONFIG_PATH_MAX)
			return conf_fail(p, p->line, "socket must be an absolute path of at most %u bytes",
				         KVQ_CONFIG_PATH_MAX);
		strcpy(c->socket, v);
		return 0;
	case K_BACKEND:
		if (strcmp(v, "auto") && strcmp(v, "host") && strcmp(v, "cuda"))
			return conf_fail(p, p->line, "backend '%s' is not auto, host or cuda", v);
		strcpy(c->backend, v);
		return 0;
	case K_DEVICE:
		if ((rc = value_u32(p, "device", v, 0, KVQ_CONFIG_MAX_DEVICE, 1, &u)) < 0)
			return rc;
		c->device = (int)u;
		return 0;
	case K_MEMORY_BUDGET:
		if (strchr(v, '%')) {
			c->memory_budget.kind = KVQ_AMOUNT_PERCENT;
			return value_percent(p, "memory_budget", v, 1, &c->memory_budget.percent);
		}
		c->memory_budget.kind = KVQ_AMOUNT_BYTES;
		return value_size(p, "memory_budget", v, &c->memory_budget.bytes);
	case K_LOG_LEVEL:
		if (parse_log_level(v, &c->log_level) < 0)
			return conf_fail(p, p->line, "log_level '%s' is not a syslog level (emerg .. debug, or 0-7)",
					 v);
		return 0;
	case K_CREATE_ON_ATTACH:
		return value_bool(p, "create_on_attach", v, &c->create_on_attach);
	case K_CREATE_UIDS:
		return parse_ids(p, v, false, &c->create_acl);
	case K_CREATE_GIDS:
		return parse_ids(p, v, true, &c->create_acl);
	case K_CREATE_CAPACITY:
		return value_amount(p, k, K_CREATE_MEMORY_SHARE, v, KVQ_AMOUNT_BYTES, &c->create_capacity);
	case K_CREATE_MEMORY_SHARE:
		return value_amount(p, k, K_CREATE_CAPACITY, v, KVQ_AMOUNT_PERCENT, &c->create_capacity);
	case K_QUOTA_PER_UID:
		if ((rc = value_quota(p, v, &x)) < 0)
			return rc;
		c->quota_per_uid = x;
		return 0;
	case K_ADMIN_UIDS:
		return parse_ids(p, v, false, &c->admin_acl);
	case K_ADMIN_GIDS:
		return parse_ids(p, v, true, &c->admin_acl);
	case K_METRICS_LISTEN: {
		char addr[KVQ_CONFIG_LISTEN_MAX + 1], why[128];
		uint16_t port;

		if (kvq_config_parse_listen(v, addr, sizeof(addr), &port, why, sizeof(why)) < 0)
			return conf_fail(p, p->line, "metrics_listen '%s': %s", v, why);
		strcpy(c->metrics_listen, v);
		return 0;
	}
	case K_ATTENTION_TIMING:
		return value_bool(p, "attention_timing", v, &c->attention_timing);
	case K_ATTENTION_REPORT_MS:
		return value_u32(p, "attention_report_ms", v, KVQ_TIMING_MIN_REPORT_MS, KVQ_TIMING_MAX_REPORT_MS, 1,
				 &c->attention_report_ms);
	}
	return conf_fail(p, p->line, "internal: key %d in [kvqd]", k);
}

static int set_pool(struct conf_parser *p, int k, char *v)
{
	struct kvq_config_pool *pl = p->pool;
	size_t idx = (size_t)(pl - p->c->pools);
	uint32_t u;
	int rc;

	switch (k) {
	case K_DEVICE:
		if ((rc = value_u32(p, "device", v, 0, KVQ_CONFIG_MAX_DEVICE, 1, &u)) < 0)
			return rc;
		pl->device = (int)u;
		p->pool_device_line[idx] = p->line;
		return 0;
	case K_CREATE_ON_ATTACH:
		return value_bool(p, "create_on_attach", v, &pl->create_on_attach);
	case K_ATTENTION_TIMING:
		p->pool_timing_line[idx] = p->line;
		return value_bool(p, "attention_timing", v, &pl->attention_timing);
	case K_QUOTA_PER_UID:
		if ((rc = value_quota(p, v, &pl->quota_per_uid)) < 0)
			return rc;
		p->pool_quota_line[idx] = p->line;
		return 0;
	case K_MODEL:
		if (strlen(v) > KVQ_CONFIG_MODEL_MAX)
			return conf_fail(p, p->line, "model id longer than %u bytes", KVQ_CONFIG_MODEL_MAX);
		for (const char *s = v; *s; s++)
			if ((unsigned char)*s < 0x20 || *s == 0x7f)
				return conf_fail(p, p->line, "model id holds a control character");
		strcpy(pl->model, v);
		return 0;
	case K_LAYERS:
		return value_u32(p, "layers", v, 1, KVQ_MAX_LAYERS, 1, &pl->layers);
	case K_KV_HEADS:
		return value_u32(p, "kv_heads", v, 1, KVQ_MAX_HEADS, 1, &pl->kv_heads);
	case K_HEAD_DIM:
		return value_u32(p, "head_dim", v, 32, KVQ_MAX_HEAD_DIM, 32, &pl->head_dim);
	case K_BLOCK_TOKENS:
		return value_u32(p, "block_tokens", v, 16, KVQ_MAX_BLOCK_TOKENS, 16, &pl->block_tokens);
	case K_POLICY:
		if (strlen(v) > KVQ_POLICY_MAX_LEN)
			return conf_fail(p, p->line, "policy longer than %u bytes", KVQ_POLICY_MAX_LEN);
		strcpy(p->policy, v);   /* parsed once layers is known */
		return 0;
	case K_WINDOW:
		/* checked against block_tokens and the policy at the section's end */
		return value_u32(p, "window", v, 1, 64 * KVQ_MAX_BLOCK_TOKENS, 1, &pl->window);
	case K_WINDOW_DTYPE:
		if (strcmp(v, "f16") == 0)
			pl->act = KVQ_DT_F16;
		else if (strcmp(v, "bf16") == 0)
			pl->act = KVQ_DT_BF16;
		else
			return conf_fail(p, p->line, "window_dtype '%s' is not f16 or bf16", v);
		return 0;
	case K_SINK_BLOCKS:
		return value_u32(p, "sink_blocks", v, 0, 1, 1, &pl->sink_blocks);
	case K_CAPACITY:
		return value_amount(p, k, K_MEMORY_SHARE, v, KVQ_AMOUNT_BYTES, &pl->capacity);
	case K_MEMORY_SHARE:
		return value_amount(p, k, K_CAPACITY, v, KVQ_AMOUNT_PERCENT, &pl->capacity);
	case K_ACL_UIDS:
		return parse_ids(p, v, false, &pl->acl);
	case K_ACL_GIDS:
		return parse_ids(p, v, true, &pl->acl);
	}
	return conf_fail(p, p->line, "internal: key %d in [pool]", k);
}

/* ------------------------------------------------------------ sections */

static int end_section(struct conf_parser *p)
{
	int rc = 0;

	if (p->sec == SEC_POOL)
		rc = conf_check_pool(p);
	p->sec = SEC_NONE;
	p->pool = NULL;
	memset(p->seen, 0, sizeof p->seen);
	return rc;
}

static int begin_section(struct conf_parser *p, char *s)
{
	struct kvq_config *c = p->c;
	struct kvq_config_pool *pl;
	char *name;
	int rc;

	if ((rc = end_section(p)) < 0)
		return rc;
	s = trim(s);
	if (strcmp(s, "kvqd") == 0) {
		if (p->kvqd_line)
			return conf_fail(p, p->line, "duplicate section [kvqd] (first on line %u)", p->kvqd_line);
		p->kvqd_line = p->line;
		p->sec = SEC_KVQD;
		p->sec_line = p->line;
		return 0;
	}
	if (strncmp(s, "pool", 4) != 0 || (s[4] && s[4] != ' ' && s[4] != '\t'))
		return conf_fail(p, p->line, "unknown section [%s] (kvqd or pool NAME)", s);
	name = trim(s + 4);
	if (!*name)
		return conf_fail(p, p->line, "pool section without a name: [pool NAME]");
	if (!conf_valid_name(name))
		return conf_fail(p, p->line, "pool name '%s' is not 1-%u of A-Z a-z 0-9 . _ -", name,
			         KVQ_CONFIG_NAME_MAX);
	for (uint32_t i = 0; i < c->n_pools; i++)
		if (strcmp(c->pools[i].name, name) == 0)
			return conf_fail(p, p->line, "duplicate pool '%s' (first on line %u)", name, c->pools[i].line);
	if (c->n_pools >= KVQ_CONFIG_MAX_POOLS)
		return conf_fail(p, p->line, "more than %u pools", KVQ_CONFIG_MAX_POOLS);

	pl = &c->pools[c->n_pools++];
	memset(pl, 0, sizeof *pl);
	strcpy(pl->name, name);
	pl->line = p->line;
	conf_pool_defaults(pl);
	p->pool = pl;
	p->sec = SEC_POOL;
	p->sec_line = p->line;
	p->policy[0] = '\0';
	return 0;
}

static int key_value(struct conf_parser *p, char *s)
{
	char *eq = strchr(s, '='), *k, *v;
	int key = -1, rc;

	if (!eq)
		return conf_fail(p, p->line, "expected 'key = value', a [section] or a comment");
	*eq = '\0';
	k = trim(s);
	v = trim(eq + 1);
	if (p->sec == SEC_NONE)
		return conf_fail(p, p->line, "key '%s' outside a section", k);
	for (int i = 0; i < K_COUNT; i++)
		if ((conf_keys[i].sections & p->sec) && strcmp(conf_keys[i].name, k) == 0)
			key = i;
	if (key < 0) {
		if (p->sec == SEC_KVQD)
			return conf_fail(p, p->line, "unknown key '%s' in [kvqd]", k);
		return conf_fail(p, p->line, "unknown key '%s' in [pool %s]", k, p->pool->name);
	}
	if (p->seen[key])
		return conf_fail(p, p->line, "duplicate key '%s' (first on line %u)", k, p->seen[key]);
	if (!*v)
		return conf_fail(p, p->line, "key '%s' without a value", k);
	rc = p->sec == SEC_KVQD ? set_kvqd(p, key, v) : set_pool(p, key, v);
	if (rc < 0)
		return rc;
	p->seen[key] = p->line;
	return 0;
}

/* Settings that span sections: [kvqd] may come after the pools it gives
 * defaults to, and shares of one device must fit in its budget. */
static int parse(struct conf_parser *p, const char *text, size_t len)
{
	const char *s = text, *end = text + len;
	int rc;

	while (s < end) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		size_t n = (size_t)((nl ? nl : end) - s);
		char *line;

		p->line++;
		if (n && s[n - 1] == '\r')
			n--;
		if (n > KVQ_CONFIG_MAX_LINE)
			return conf_fail(p, p->line, "line longer than %u bytes", KVQ_CONFIG_MAX_LINE);
		if (memchr(s, '\0', n))
			return conf_fail(p, p->line, "NUL byte");
		memcpy(p->buf, s, n);
		p->buf[n] = '\0';
		s = nl ? nl + 1 : end;

		line = trim(p->buf);
		if (!*line || *line == '#' || *line == ';')
			continue;
		if (*line == '[') {
			size_t l = strlen(line);

			if (line[l - 1] != ']')
				return conf_fail(p, p->line, "section header without ']'");
			line[l - 1] = '\0';
			rc = begin_section(p, line + 1);
		} else {
			rc = key_value(p, line);
		}
		if (rc < 0)
			return rc;
	}
	if ((rc = end_section(p)) < 0)
		return rc;
	conf_inherit(p);
	return conf_check_all(p);
}

/* ------------------------------------------------------------ public */

int kvq_config_parse_string(const char *text, size_t len, const char *name, struct kvq_config **ret_config,
			    char *err, size_t errlen)
{
	struct kvq_config *c = NULL;
	struct conf_parser *p;
	int rc = -ENOMEM;

	if (!name)
		name = "(string)";
	if (len > KVQ_CONFIG_MAX_FILE) {
		kvq_seterr(err, errlen, "%s: larger than %u bytes", name, KVQ_CONFIG_MAX_FILE);
		return -EFBIG;
	}
	p = calloc(1, sizeof *p);
	if (!p || kvq_config_new(&c) < 0 || !(c->pools = calloc(KVQ_CONFIG_MAX_POOLS, sizeof *c->pools))) {
		kvq_seterr(err, errlen, "%s: out of memory", name);
		goto out;
	}
	p->file = name;
	p->err = err;
	p->errlen = errlen;
	p->c = c;
	rc = parse(p, text, len);
	if (rc == 0) {
		*ret_config = c;
		c = NULL;
	}
out:
	kvq_config_free(c);
	free(p);
	return rc;
}

int kvq_config_parse_file(const char *path, struct kvq_config **ret_config, char *err, size_t errlen)
{
	struct stat st;
	char *text = NULL;
	size_t got = 0;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		rc = -errno;
		kvq_seterr(err, errlen, "%s: %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		kvq_seterr(err, errlen, "%s: %s", path, strerror(-rc));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		kvq_seterr(err, errlen, "%s: not a regular file", path);
		goto out;
	}
	/* read one byte past the limit to tell a file that grew from one that fits */
	text = malloc(KVQ_CONFIG_MAX_FILE + 1);
	if (!text) {
		rc = -ENOMEM;
		kvq_seterr(err, errlen, "%s: out of memory", path);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, text + got, KVQ_CONFIG_MAX_FILE + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			kvq_seterr(err, errlen, "%s: %s", path, strerror(-rc));
			goto out;
		}
		if (n == 0 || (got += (size_t)n) > KVQ_CONFIG_MAX_FILE)
			break;
	}
	if (got > KVQ_CONFIG_MAX_FILE) {
		rc = -EFBIG;
		kvq_seterr(err, errlen, "%s: larger than %u bytes", path, KVQ_CONFIG_MAX_FILE);
		goto out;
	}
	rc = kvq_config_parse_string(text, got, path, ret_config, err, errlen);
out:
	free(text);
	close(fd);
	return rc;
}

