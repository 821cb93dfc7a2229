/* SPDX-License-Identifier: Apache-2.0 */
/* The kvqd.conf reader: lines, sections and keys (format in conf.h), each
 * value read by conf_value.c, the rows' defaults and inheritance; what
 * needs more than one value is conf_check.c's. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf_check.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "conf_value.h"
#include "format.h"
#include "seterr.h"

struct conf_parser {
	const char *file;
	char *err;
	size_t errlen;
	struct kvq_config *c;
	int sec;                        /* enum kvq_conf_section of the open section, -1: none */
	void *item;                     /* its struct: c, or the open named section */
	unsigned line, sec_line;
	unsigned single_line[KVQ_CONF_SEC_COUNT]; /* header line of each unnamed kind */
	unsigned *seen;                 /* line where each key of the open section was set */
	unsigned single_seen[K_COUNT];  /* the unnamed kinds' */
	unsigned *item_seen[KVQ_CONF_SEC_COUNT]; /* each named section's, max x K_COUNT */
	char policy[KVQ_POLICY_MAX_LEN + 1];  /* kept until layers is known */
	char buf[KVQ_CONFIG_MAX_LINE + 1];
};

/* The section kinds' hooks (KVQ_CONF_SECTIONS). */
static const struct {
	void (*init)(void *item);
	int (*check)(const struct conf_check_section *sec, struct conf_check_error *e);
} hooks[KVQ_CONF_SEC_COUNT] = {
#define HOOKS(id, word, items, n_items, max, init, check) [KVQ_CONF_SEC_##id] = { init, check },
	KVQ_CONF_SECTIONS(HOOKS)
#undef HOOKS
};

/* "FILE:LINE: what is wrong" into p->err; returns -EINVAL. */
static int conf_fail(struct conf_parser *p, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int conf_fail(struct conf_parser *p, unsigned line, const char *fmt, ...)
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

/* Row k's value v into item, or FILE:LINE and what is wrong. */
static int read_value(struct conf_parser *p, int k, const char *v, void *item)
{
	struct conf_value_msg m;
	int rc = conf_value_read(&m, k, v, item, p->policy);

	if (rc < 0)
		conf_fail(p, p->line, "%s", m.msg);
	return rc;
}

/* The defaults of section kind sec's rows into item, then the kind's init
 * hook.  0, or what conf_value_read returns (a row's default that does not
 * read is a bug tests/unit/test_conf_schema.c catches). */
static int conf_parse_defaults(struct conf_parser *p, int sec, void *item)
{
	int rc;

	for (int k = 0; k < K_COUNT; k++)
		if (conf_schema_keys[k].sec == sec && conf_schema_keys[k].def[0] &&
		    (rc = read_value(p, k, conf_schema_keys[k].def, item)) < 0)
			return rc;
	if (hooks[sec].init)
		hooks[sec].init(item);
	return 0;
}

/* ------------------------------------------------------------ sections */

/* The open section's required keys: all there (one of a pair). */
static int check_required(struct conf_parser *p)
{
	const struct conf_schema_section *s = &conf_schema_sections[p->sec];
	char where[KVQ_CONFIG_NAME_MAX + 32];

	if (s->named)
		snprintf(where, sizeof where, "%s '%s': ", s->word, ((const char *)p->item));
	else
		snprintf(where, sizeof where, "[%s]: ", s->word);
	for (int k = 0; k < K_COUNT; k++) {
		const struct conf_schema_key *r = &conf_schema_keys[k];
		int twin = conf_schema_twin(k);

		if (r->sec != p->sec || !(r->flags & KVQ_CONF_REQUIRED) || p->seen[k] || !conf_schema_owns_field(k))
			continue;
		if (twin < 0)
			return conf_fail(p, p->sec_line, "%smissing key '%s'", where, r->name);
		if (!p->seen[twin])
			return conf_fail(p, p->sec_line, "%smissing key '%s' or '%s'", where, r->name,
					 conf_schema_keys[twin].name);
	}
	return 0;
}

static int end_section(struct conf_parser *p)
{
	int rc = 0;

	if (p->sec >= 0) {
		struct conf_check_section sec = { p->item, p->seen, p->policy, p->sec_line };
		struct conf_check_error e;

		rc = check_required(p);
		if (rc == 0 && hooks[p->sec].check && hooks[p->sec].check(&sec, &e) < 0)
			rc = conf_fail(p, e.line, "%s", e.msg);
	}
	p->sec = -1;
	p->item = NULL;
	p->seen = NULL;
	return rc;
}

/* A new named section of kind sec called name: its place, defaults and
 * seen keys. */
static int begin_named(struct conf_parser *p, int sec, const char *name)
{
	const struct conf_schema_section *s = &conf_schema_sections[sec];
	uint32_t *n = (uint32_t *)((char *)p->c + s->n_items);
	struct kvq_config_named *item;
	void *other;
	int rc;

	if (!*name)
		return conf_fail(p, p->line, "%s section without a name: [%s NAME]", s->word, s->word);
	if (!conf_valid_name(name))
		return conf_fail(p, p->line, "%s name '%s' is not 1-%u of A-Z a-z 0-9 . _ -", s->word, name,
			         KVQ_CONFIG_NAME_MAX);
	for (uint32_t i = 0; (other = conf_schema_item(p->c, sec, i)); i++)
		if (strcmp(((struct kvq_config_named *)other)->name, name) == 0)
			return conf_fail(p, p->line, "duplicate %s '%s' (first on line %u)", s->word, name,
					 ((struct kvq_config_named *)other)->line);
	if (*n >= s->max)
		return conf_fail(p, p->line, "more than %u %ss", s->max, s->word);

	memcpy(&item, (char *)p->c + s->items, sizeof item);
	item = (struct kvq_config_named *)((char *)item + (size_t)(*n) * s->size);
	p->seen = p->item_seen[sec] + (size_t)(*n) * K_COUNT;
	(*n)++;
	memset(item, 0, s->size);
	strcpy(item->name, name);
	item->line = p->line;
	p->sec = sec;
	p->item = item;
	if ((rc = conf_parse_defaults(p, sec, item)) < 0)
		return rc;
	p->sec_line = p->line;
	p->policy[0] = '\0';
	return 0;
}

static int begin_section(struct conf_parser *p, char *s)
{
	size_t wlen;
	char *arg;
	int sec, rc;

	if ((rc = end_section(p)) < 0)
		return rc;
	s = conf_value_trim(s);
	wlen = strcspn(s, " \t");
	arg = conf_value_trim(s + wlen);
	for (sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++) {
		const struct conf_schema_section *k = &conf_schema_sections[sec];

		if (strlen(k->word) == wlen && strncmp(s, k->word, wlen) == 0 && (k->named || !*arg))
			break;
	}
	if (sec == KVQ_CONF_SEC_COUNT)
		return conf_fail(p, p->line, "unknown section [%s] (%s)", s, conf_schema_section_list());
	if (conf_schema_sections[sec].named)
		return begin_named(p, sec, arg);
	if (p->single_line[sec])
		return conf_fail(p, p->line, "duplicate section [%s] (first on line %u)", s, p->single_line[sec]);
	p->single_line[sec] = p->line;
	p->sec = sec;
	p->item = p->c;
	p->seen = p->single_seen;
	p->sec_line = p->line;
	return 0;
}

static int key_value(struct conf_parser *p, char *s)
{
	const struct conf_schema_section *sec;
	char *eq = strchr(s, '='), *k, *v;
	int key, twin, rc;

	if (!eq)
		return conf_fail(p, p->line, "expected 'key = value', a [section] or a comment");
	*eq = '\0';
	k = conf_value_trim(s);
	v = conf_value_trim(eq + 1);
	if (p->sec < 0)
		return conf_fail(p, p->line, "key '%s' outside a section", k);
	sec = &conf_schema_sections[p->sec];
	key = conf_schema_find(p->sec, k);
	if (key < 0) {
		if (!sec->named)
			return conf_fail(p, p->line, "unknown key '%s' in [%s]", k, sec->word);
		return conf_fail(p, p->line, "unknown key '%s' in [%s %s]", k, sec->word, (const char *)p->item);
	}
	if (p->seen[key])
		return conf_fail(p, p->line, "duplicate key '%s' (first on line %u)", k, p->seen[key]);
	if (!*v)
		return conf_fail(p, p->line, "key '%s' without a value", k);
	/* the keys of one amount (bytes, or a share) exclude each other */
	if ((conf_schema_keys[key].type == KVQ_CONF_T_AMOUNT || conf_schema_keys[key].type == KVQ_CONF_T_SHARE) &&
	    (twin = conf_schema_twin(key)) >= 0 && p->seen[twin])
		return conf_fail(p, p->line, "%s and %s (line %u) exclude each other", k, conf_schema_keys[twin].name,
				 p->seen[twin]);
	if ((rc = read_value(p, key, v, p->item)) < 0)
		return rc;
	p->seen[key] = p->line;
	return 0;
}

/* The [kvqd] row that row k inherits from. */
static int parent(int k)
{
	return conf_schema_find(KVQ_CONF_SEC_KVQD, conf_schema_keys[k].name);
}

/* The KVQ_CONF_INHERIT rows that no named section set: from [kvqd], once
 * the whole file is read, since [kvqd] may come last. */
static void inherit(struct conf_parser *p)
{
	for (int sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++) {
		void *item;

		if (!conf_schema_sections[sec].named)
			continue;
		for (uint32_t i = 0; (item = conf_schema_item(p->c, sec, i)); i++)
			for (int k = 0; k < K_COUNT; k++) {
				const struct conf_schema_key *r = &conf_schema_keys[k];
				int from;

				if (r->sec != sec || !(r->flags & KVQ_CONF_INHERIT) ||
				    p->item_seen[sec][(size_t)i * K_COUNT + (size_t)k] || (from = parent(k)) < 0)
					continue;
				memcpy((char *)item + r->offset, (char *)p->c + conf_schema_keys[from].offset, r->size);
			}
	}
}

/* Settings that span sections: [kvqd] may come after the pools it gives
 * defaults to, and shares of one device must fit in its budget. */
static int parse(struct conf_parser *p, const char *text, size_t len)
{
	struct conf_check_error e;
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

		line = conf_value_trim(p->buf);
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
	inherit(p);
	if (conf_check_all(p->c, &e) < 0)
		return conf_fail(p, e.line, "%s", e.msg);
	return 0;
}

/* ------------------------------------------------------------ public */

int kvq_config_new(struct kvq_config **ret_config)
{
	struct kvq_config *c = calloc(1, sizeof *c);
	struct conf_parser *p = calloc(1, sizeof *p);
	int rc = -ENOMEM;

	if (c && p) {
		p->file = "(defaults)";
		p->c = c;
		p->sec = KVQ_CONF_SEC_KVQD;
		p->seen = p->single_seen;
		rc = conf_parse_defaults(p, KVQ_CONF_SEC_KVQD, c);
	}
	free(p);
	if (rc < 0) {
		free(c);
		return rc;
	}
	*ret_config = c;
	return 0;
}

void kvq_config_free(struct kvq_config *c)
{
	if (!c)
		return;
	for (int sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++)
		if (conf_schema_sections[sec].named) {
			void *items;

			memcpy(&items, (char *)c + conf_schema_sections[sec].items, sizeof items);
			/* a remote's section holds its secrets */
			if (items)
				explicit_bzero(items, (size_t)conf_schema_sections[sec].max * conf_schema_sections[sec].size);
			free(items);
		}
	free(c);
}

/* Room for the most named sections of each kind, and their seen keys. */
static int alloc_named(struct conf_parser *p, struct kvq_config *c)
{
	for (int sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++) {
		const struct conf_schema_section *s = &conf_schema_sections[sec];
		void *items;

		if (!s->named)
			continue;
		items = calloc(s->max, s->size);
		memcpy((char *)c + s->items, &items, sizeof items);
		if (!items || !(p->item_seen[sec] = calloc((size_t)s->max * K_COUNT, sizeof(unsigned))))
			return -ENOMEM;
	}
	return 0;
}

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
	if (!p || kvq_config_new(&c) < 0 || alloc_named(p, c) < 0) {
		kvq_seterr(err, errlen, "%s: out of memory", name);
		goto out;
	}
	p->file = name;
	p->err = err;
	p->errlen = errlen;
	p->c = c;
	p->sec = -1;
	rc = parse(p, text, len);
	if (rc == 0) {
		*ret_config = c;
		c = NULL;
	}
out:
	kvq_config_free(c);
	if (p)
		for (int sec = 0; sec < KVQ_CONF_SEC_COUNT; sec++)
			free(p->item_seen[sec]);
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
