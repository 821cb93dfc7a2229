/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A new kvqd.conf key is one row of the schema (daemon/conf_keys.h): this
 * test's build adds a throwaway row (tests/unit/conf_row.h, force-included
 * here and into a copy of the configuration code built for this test only)
 * and shows, with no other edit, that the key has a field, is read from a
 * kvqd.conf file in its section only, gets its default when absent, is
 * refused out of its range with FILE:LINE and the range, and that a reload
 * applies it or keeps the running value as its row says.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "../tap.h"

#ifndef KVQ_TEST_CONF_ROW_H
#error "build with -include tests/unit/conf_row.h"
#endif

static char dir[] = "/tmp/kvq-test-conf-row-XXXXXX";

/* text as a kvqd.conf file, parsed the way kvqd reads it */
static int parse(const char *text, struct kvq_config **ret, char *path, char *err, size_t errlen)
{
	FILE *f;

	snprintf(path, 128, "%s/kvqd.conf", dir);
	f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		abort();
	return kvq_config_parse_file(path, ret, err, errlen);
}

/* text is refused with "PATH:" msg, and nothing returned */
static void refused(const char *text, const char *msg, const char *what)
{
	char path[128], err[KVQ_CONFIG_MSG_MAX + 128], want[256];
	struct kvq_config *c = NULL;
	int rc = parse(text, &c, path, err, sizeof err);

	snprintf(want, sizeof want, "%s:%s", path, msg);
	ok(rc == -EINVAL && !c && strcmp(err, want) == 0, "%s is refused: %s", what, err);
}

struct notes {
	int n;
	char key[64];
	const char *name;
};

static void note(void *arg, const char *word, const char *name, const char *key)
{
	struct notes *n = arg;

	(void)word;
	n->n++;
	n->name = name;
	snprintf(n->key, sizeof n->key, "%s", key);
}

int main(void)
{
	char path[128], err[KVQ_CONFIG_MSG_MAX + 128];
	struct kvq_config *a = NULL, *b = NULL;
	struct notes notes = { 0 };
	int k, rc;

	if (!mkdtemp(dir))
		abort();
	k = conf_schema_find(KVQ_CONF_SEC_KVQD, "test_row_ms");
	ok(k >= 0 && conf_schema_find(KVQ_CONF_SEC_POOL, "test_row_ms") < 0 &&
	   strcmp(conf_schema_keys[k].what, "a throwaway key of the test build") == 0,
	   "the row is a [kvqd] key of the schema");

	rc = parse("[kvqd]\nlog_level = info\ntest_row_ms = 120\n", &a, path, err, sizeof err);
	ok(rc == 0 && a && a->test_row_ms == 120, "test_row_ms = 120 is read from %s (%s)", path, rc ? err : "ok");

	rc = parse("[kvqd]\nlog_level = info\n", &b, path, err, sizeof err);
	ok(rc == 0 && b && b->test_row_ms == 250, "absent, it has its default 250 (%u)", b ? b->test_row_ms : 0);
	kvq_config_free(b);
	b = NULL;
	ok(kvq_config_new(&b) == 0 && b->test_row_ms == 250, "the built-in config has the default too");
	kvq_config_free(b);
	b = NULL;

	refused("[kvqd]\n\ntest_row_ms = 5001\n", "3: test_row_ms '5001' is not a number in 10-5000", "5001");
	refused("[kvqd]\ntest_row_ms = 9\n", "2: test_row_ms '9' is not a number in 10-5000", "9");
	refused("[kvqd]\ntest_row_ms = 10\ntest_row_ms = 20\n", "3: duplicate key 'test_row_ms' (first on line 2)",
		"given twice");
	refused("[pool p]\ntest_row_ms = 100\n", "2: unknown key 'test_row_ms' in [pool p]", "in [pool NAME]");

	/* a reload: a running config with 120, a new file with 4000 */
	rc = parse("[kvqd]\ntest_row_ms = 4000\n", &b, path, err, sizeof err);
	ok(rc == 0 && b && b->test_row_ms == 4000, "the new file reads (%s)", rc ? err : "ok");
	if (a && b) {
		kvq_config_keep_running(a, b, note, &notes);
		if (TEST_ROW_RELOAD)
			ok(b->test_row_ms == 4000 && notes.n == 0, "reloadable: the new value applies, nothing noted");
		else
			ok(b->test_row_ms == 120 && notes.n == 1 && !notes.name && strcmp(notes.key, "test_row_ms") == 0,
			   "not reloadable: the running value stays, noted as changing at the next start (%d notes)",
			   notes.n);
		ok(!(conf_schema_keys[k].flags & KVQ_CONF_RELOAD) == !TEST_ROW_RELOAD, "as its row says");
	}
	kvq_config_free(a);
	kvq_config_free(b);
	unlink(path);
	rmdir(dir);
	return done_testing();
}
