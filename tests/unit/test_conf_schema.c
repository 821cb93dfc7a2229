/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf's schema (daemon/conf_keys.h) against what documents it and
 * against itself: kvqd.conf(5) describes every row under its section's
 * heading ([kvqd], [pool NAME]) and describes no key the schema lacks;
 * systemd/kvqd.conf.example shows every key; every row has a meaning, and
 * its default reads as a value of its own type within its range.  And a
 * reload as the rows say: what kvq_config_keep_running applies and keeps.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "../tap.h"

#define MAX_DOC 256

struct doc {
	int sec;                        /* the heading's section kind, -1: another heading */
	char key[64];
};

static const char *top(void)
{
	const char *t = getenv("top_srcdir");

	return t && *t ? t : "..";
}

/* The man page's key entries: the tags (".TP" then ".B key" or
 * ".B a\fR, \fBb") under a heading that names a section kind. */
static size_t read_man(struct doc *docs)
{
	char path[512], line[1024], heading[64];
	size_t n = 0;
	int sec = -1, tag = 0;
	FILE *f;

	snprintf(path, sizeof path, "%s/man/kvqd.conf.5", top());
	f = fopen(path, "r");
	if (!f) {
		perror(path);
		exit(1);
	}
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = '\0';
		if (strncmp(line, ".SH ", 4) == 0) {
			sec = -1;
			for (int s = 0; s < KVQ_CONF_SEC_COUNT; s++) {
				snprintf(heading, sizeof heading, "[%s%s]", conf_schema_sections[s].word,
					 conf_schema_sections[s].named ? " NAME" : "");
				if (strcmp(line + 4, heading) == 0)
					sec = s;
			}
			continue;
		}
		if (strcmp(line, ".TP") == 0) {
			tag = 1;
			continue;
		}
		if (tag && sec >= 0 && strncmp(line, ".B ", 3) == 0) {
			/* "a\fR, \fBb\fR, \fBc" */
			for (char *k = line + 3; k && *k && n < MAX_DOC; ) {
				char *end = strstr(k, "\\fR, \\fB");
				size_t len = end ? (size_t)(end - k) : strlen(k);

				docs[n].sec = sec;
				snprintf(docs[n].key, sizeof docs[n].key, "%.*s", (int)len, k);
				n++;
				k = end ? end + 8 : NULL;
			}
		}
		tag = 0;
	}
	fclose(f);
	return n;
}

/* Whether the example config shows key (set, or commented out: "#key = "). */
static int example_shows(const char *text, const char *key)
{
	size_t kl = strlen(key);

	for (const char *l = text; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *s = l;

		if (*s == '#')
			s++;
		if (*s == ' ')
			s++;
		if (strncmp(s, key, kl) == 0 && strncmp(s + kl, " = ", 3) == 0)
			return 1;
	}
	return 0;
}

static char *read_example(void)
{
	char path[512];
	FILE *f;
	char *text = calloc(1, 1 << 16);
	size_t n;

	snprintf(path, sizeof path, "%s/systemd/kvqd.conf.example", top());
	f = fopen(path, "r");
	if (!f || !text) {
		perror(path);
		exit(1);
	}
	n = fread(text, 1, (1 << 16) - 1, f);
	text[n] = '\0';
	fclose(f);
	return text;
}

/* A minimal pool, for the pool rows' defaults. */
#define POOL "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\n"

/* A minimal remote, its key in a file of this test's (mode 0600). */
static char remote_key_path[] = "/tmp/kvq-conf-schema-XXXXXX";

static const char *remote_section(void)
{
	static char text[256];
	char *path = remote_key_path;
	int fd;

	if (text[0])
		return text;
	fd = mkstemp(path);
	if (fd < 0 || write(fd, "0123456789abcdef0123456789abcdef", 32) != 32) {
		perror(path);
		exit(1);
	}
	close(fd);
	snprintf(text, sizeof text, "[remote r]\nnodes = 127.0.0.1:7000\nhmac_key_file = %s\n", path);
	return text;
}

static void test_defaults(void)
{
	char text[512], err[KVQ_CONFIG_MSG_MAX];

	for (int k = 0; k < K_COUNT; k++) {
		const struct conf_schema_key *r = &conf_schema_keys[k];
		struct kvq_config *c = NULL;
		int rc;

		ok(r->what && *r->what, "%s: has a meaning", r->name);
		if (!r->def[0])
			continue;
		if (r->sec == KVQ_CONF_SEC_POOL && strncmp(r->name, "remote_", 7) == 0)
			snprintf(text, sizeof text, "%s" POOL "memory_share = 1\nremote = r\nremote_namespace = n\n%s = %s\n",
				 remote_section(), r->name, r->def);
		else if (r->sec == KVQ_CONF_SEC_POOL)
			snprintf(text, sizeof text, POOL "%s%s = %s\n",
				 strcmp(r->name, "memory_share") && strcmp(r->name, "capacity") ? "memory_share = 1\n" : "",
				 r->name, r->def);
		else if (r->sec == KVQ_CONF_SEC_REMOTE)
			snprintf(text, sizeof text, "%s%s = %s\n", remote_section(), r->name, r->def);
		else
			snprintf(text, sizeof text, "[%s]\n%s = %s\n", conf_schema_sections[r->sec].word, r->name, r->def);
		rc = kvq_config_parse_string(text, strlen(text), "def.conf", &c, err, sizeof err);
		ok(rc == 0, "%s: its default '%s' reads as its own value (%s)", r->name, r->def, rc ? err : "ok");
		kvq_config_free(c);
	}
}

struct notes {
	int n;
	char all[512];
};

static void note(void *arg, const char *word, const char *name, const char *key)
{
	struct notes *n = arg;
	size_t l = strlen(n->all);

	n->n++;
	snprintf(n->all + l, sizeof n->all - l, "%s[%s%s%s] %s", l ? ", " : "", word, name ? " " : "", name ? name : "",
		 key);
}

/* A running config and a reloaded file that changes keys of both kinds. */
static void test_reload(void)
{
	static const char running[] =
		"[kvqd]\nlog_level = info\nmetrics_listen = 127.0.0.1:9464\nmax_output = 1M\n"
		POOL "capacity = 64M\nacl_uids = 1\n";
	static const char next[] =
		"[kvqd]\nlog_level = debug\nmetrics_listen = 127.0.0.1:9465\nmax_output = 2M\n"
		POOL "capacity = 128M\nacl_uids = 2\n"
		"[pool q]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 64M\n";
	char err[KVQ_CONFIG_MSG_MAX] = "ok";
	struct kvq_config *r = NULL, *n = NULL;
	struct notes notes = { 0 };

	if (!ok(kvq_config_parse_string(running, strlen(running), "r.conf", &r, err, sizeof err) == 0 &&
		kvq_config_parse_string(next, strlen(next), "n.conf", &n, err, sizeof err) == 0, "reload: both parse (%s)",
		err))
		return;
	kvq_config_keep_running(r, n, note, &notes);
	ok(n->log_level == r->log_level && strcmp(n->metrics_listen, "127.0.0.1:9464") == 0,
	   "reload: log_level and metrics_listen keep their running values");
	ok(n->max_output == 2u << 20, "reload: a limit takes its new value");
	ok(n->pools[0].capacity.bytes == 64u << 20 && n->pools[0].acl.n_uids == 1 && n->pools[0].acl.uids[0] == 2,
	   "reload: a pool keeps its capacity, takes its new ACL");
	ok(n->pools[1].capacity.bytes == 64u << 20, "reload: a new pool is left as read");
	ok(notes.n == 3 && strcmp(notes.all, "[kvqd] log_level, [kvqd] metrics_listen, [pool p] capacity") == 0,
	   "reload: the keys kept are noted: %s", notes.all);
	kvq_config_free(r);
	kvq_config_free(n);
}

int main(void)
{
	static struct doc docs[MAX_DOC];
	size_t n = read_man(docs);
	char *example = read_example();

	ok(n > 0, "kvqd.conf(5) has key entries under the section headings (%zu)", n);
	for (int k = 0; k < K_COUNT; k++) {
		const struct conf_schema_key *r = &conf_schema_keys[k];
		int found = 0;

		for (size_t i = 0; i < n; i++)
			found |= docs[i].sec == r->sec && strcmp(docs[i].key, r->name) == 0;
		ok(found, "kvqd.conf(5) documents %s under [%s%s]", r->name, conf_schema_sections[r->sec].word,
		   conf_schema_sections[r->sec].named ? " NAME" : "");
		ok(example_shows(example, r->name), "kvqd.conf.example shows %s", r->name);
	}
	for (size_t i = 0; i < n; i++)
		ok(conf_schema_find(docs[i].sec, docs[i].key) >= 0, "%s, which kvqd.conf(5) documents under [%s%s], is "
		   "a key of the schema", docs[i].key, conf_schema_sections[docs[i].sec].word,
		   conf_schema_sections[docs[i].sec].named ? " NAME" : "");
	free(example);
	test_defaults();
	test_reload();
	unlink(remote_key_path);
	return done_testing();
}
