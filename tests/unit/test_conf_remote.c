/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf's [remote NAME] sections and the pools' remote keys
 * (daemon/conf_keys.h): what is accepted, every refusal with its message,
 * the key and password files' permission and size rules, the limits' ends,
 * and a reload that keeps every remote key until the next start.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "../tap.h"

static char dir[] = "/tmp/kvq-conf-remote-XXXXXX";
static char paths[16][128];
static int n_paths;

/* A file of dir called name holding data[len], with mode; its path. */
static const char *file(const char *name, const void *data, size_t len, mode_t mode)
{
	char *p = paths[n_paths++];
	int fd;

	snprintf(p, sizeof paths[0], "%s/%s", dir, name);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len || fchmod(fd, mode) < 0) {
		perror(p);
		exit(1);
	}
	close(fd);
	return p;
}

static const char *key32, *key31, *key1024, *key1025, *key640, *key604, *key620, *pass, *pass_crlf, *pass_empty,
	*pass_lines, *pass_nul, *pass400;

static void make_files(void)
{
	static char big[1100];

	if (!mkdtemp(dir)) {
		perror(dir);
		exit(1);
	}
	memset(big, 'k', sizeof big);
	key32 = file("key32", big, 32, 0600);
	key31 = file("key31", big, 31, 0600);
	key1024 = file("key1024", big, 1024, 0400);
	key1025 = file("key1025", big, 1025, 0600);
	key640 = file("key640", big, 32, 0640);
	key604 = file("key604", big, 32, 0604);
	key620 = file("key620", big, 32, 0620);
	pass = file("pass", "s3cret\n", 7, 0600);
	pass_crlf = file("pass_crlf", "s3cret\r\n", 8, 0600);
	pass_empty = file("pass_empty", "\n", 1, 0600);
	pass_lines = file("pass_lines", "a\nb\n", 4, 0600);
	pass_nul = file("pass_nul", "a\0b", 3, 0600);
	pass400 = file("pass400", "pw", 2, 0400);
}

static void remove_files(void)
{
	for (int i = 0; i < n_paths; i++)
		unlink(paths[i]);
	rmdir(dir);
}

/* text, formatted, into a static buffer */
static const char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static const char *fmt(const char *f, ...)
{
	static char buf[4][2048];
	static int i;
	va_list ap;

	i = (i + 1) % 4;
	va_start(ap, f);
	vsnprintf(buf[i], sizeof buf[i], f, ap);
	va_end(ap);
	return buf[i];
}

/* A minimal valid pool (header on line 1, 7 lines), followed by extra. */
#define POOL "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 64M\n"

static struct kvq_config *parse(const char *text, char *err, size_t errlen)
{
	struct kvq_config *c = NULL;

	if (kvq_config_parse_string(text, strlen(text), "r.conf", &c, err, errlen) < 0)
		return NULL;
	return c;
}

static void accepted(const char *what, const char *text)
{
	char err[KVQ_CONFIG_MSG_MAX] = "";
	struct kvq_config *c = parse(text, err, sizeof err);

	ok(c != NULL, "accepted: %s%s%s", what, c ? "" : ": ", c ? "" : err);
	kvq_config_free(c);
}

static void refused(const char *text, const char *want)
{
	char err[KVQ_CONFIG_MSG_MAX] = "", w[KVQ_CONFIG_MSG_MAX + 16];
	struct kvq_config *c = parse(text, err, sizeof err);

	snprintf(w, sizeof w, "r.conf:%s", want);
	ok(!c && strcmp(err, w) == 0, "refused: %s%s%s", err, strcmp(err, w) == 0 ? "" : " -- wanted: ",
	   strcmp(err, w) == 0 ? "" : w);
	kvq_config_free(c);
}

static void test_accepted(void)
{
	char err[KVQ_CONFIG_MSG_MAX] = "";
	struct kvq_config *c;
	const struct kvq_config_remote *r;
	const struct kvq_config_pool *pl;

	c = parse(fmt("[remote fleet]\nnodes = 10.0.1.1:7000, 10.0.1.2:7001,[::1]:7002\nuser = kvqd\n"
		      "password_file = %s\nhmac_key_file = %s\nconnect_timeout_ms = 250\nrequest_timeout_ms = 200\n"
		      "max_inflight = 64\nmax_value_bytes = 8M\nttl_s = 86400\n"
		      POOL "remote = fleet\nremote_namespace = llama3-8b.prod/v1\nremote_write = off\n",
		      pass, key32), err, sizeof err);
	ok(c != NULL, "a full remote and a sharing pool parse (%s)", c ? "ok" : err);
	if (!c)
		return;
	r = kvq_config_find_remote(c, "fleet");
	pl = kvq_config_find_pool(c, "p");
	ok(c->n_remotes == 1 && r && strcmp(r->nodes, "10.0.1.1:7000, 10.0.1.2:7001,[::1]:7002") == 0 &&
	   strcmp(r->user, "kvqd") == 0 && strcmp(r->password_file, pass) == 0 && strcmp(r->hmac_key_file, key32) == 0,
	   "its text keys");
	ok(r && r->connect_timeout_ms == 250 && r->request_timeout_ms == 200 && r->max_inflight == 64 &&
	   r->max_value_bytes == 8u << 20 && r->ttl_s == 86400, "its limits");
	ok(r && strcmp(r->password, "s3cret") == 0, "the password, without its line end");
	ok(r && r->hmac_key_len == 32 && memcmp(r->hmac_key, "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk", 32) == 0,
	   "the HMAC key, every byte of its file");
	ok(pl && strcmp(pl->remote, "fleet") == 0 && strcmp(pl->remote_namespace, "llama3-8b.prod/v1") == 0 &&
	   pl->remote_write == KVQ_REMOTE_WRITE_OFF, "the pool's remote keys");
	ok(!kvq_config_find_remote(c, "other"), "no remote called other");
	kvq_config_free(c);

	c = parse(fmt("[remote r]\nnodes = 127.0.0.1:7000\nhmac_key_file = %s\n" POOL, key32), err, sizeof err);
	r = c ? kvq_config_find_remote(c, "r") : NULL;
	pl = c ? kvq_config_find_pool(c, "p") : NULL;
	ok(r && r->connect_timeout_ms == 1000 && r->request_timeout_ms == 1000 && r->max_inflight == 1024 &&
	   r->max_value_bytes == 64u << 20 && r->ttl_s == 0 && !r->user[0] && !r->password_file[0] &&
	   !r->password[0], "a remote's defaults: 1000 ms, 1000 ms, 1024, 64M, no TTL, no AUTH");
	ok(pl && !pl->remote[0] && !pl->remote_namespace[0] && pl->remote_write == KVQ_REMOTE_WRITE_THROUGH,
	   "a pool shares nothing unless it says (remote_write through by default)");
	kvq_config_free(c);

	accepted("a pool before the remote it names",
		 fmt(POOL "remote = r\nremote_namespace = n\n[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n",
		     key32));
	c = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n" POOL
		      "remote = r\nremote_namespace = n\nremote_write = back\n", key32), err, sizeof err);
	pl = c ? kvq_config_find_pool(c, "p") : NULL;
	ok(pl && pl->remote_write == KVQ_REMOTE_WRITE_BACK, "remote_write = back (%s)", c ? "ok" : err);
	kvq_config_free(c);
	accepted("remote_write through, off",
		 fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n" POOL
		     "remote = r\nremote_namespace = n\nremote_write = off\n"
		     "[pool q]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 64M\n"
		     "remote = r\nremote_namespace = n\nremote_write = through\n", key32));
	accepted("a key of 1024 bytes, mode 0400", fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n", key1024));
	accepted("a password of mode 0400 without a line end",
		 fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\npassword_file = %s\n", key32, pass400));
	c = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\npassword_file = %s\n", key32, pass_crlf),
		  err, sizeof err);
	ok(c && strcmp(c->remotes[0].password, "s3cret") == 0, "a CRLF line end is not the password's");
	kvq_config_free(c);
	accepted("two remotes", fmt("[remote a]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n"
				    "[remote b]\nnodes = 127.0.0.1:2\nhmac_key_file = %s\n", key32, key32));
}

static void test_refused(void)
{
	static char longns[80], longnodes[1100];
	const char *R = fmt("[remote r]\nnodes = 127.0.0.1:7000\nhmac_key_file = %s\n", key32);
	char Rc[256];

	snprintf(Rc, sizeof Rc, "%s", R);      /* fmt's buffers rotate */
	memset(longns, 'n', 65);
	memset(longnodes, '1', 1024);

	/* the section */
	refused("[remote]\nnodes = 127.0.0.1:1\n", "1: remote section without a name: [remote NAME]");
	refused("[remote a b]\n", "1: remote name 'a b' is not 1-63 of A-Z a-z 0-9 . _ -");
	refused(fmt("%s%s", Rc, Rc), "4: duplicate remote 'r' (first on line 1)");
	refused(fmt("[remote r]\nhmac_key_file = %s\n", key32), "1: remote 'r': missing key 'nodes'");
	refused("[remote r]\nnodes = 127.0.0.1:1\n", "1: remote 'r': missing key 'hmac_key_file'");
	refused(fmt("%scolour = red\n", Rc), "4: unknown key 'colour' in [remote r]");
	refused(fmt("%sremote = r\n", Rc), "4: unknown key 'remote' in [remote r]");
	refused("[kvqd]\nnodes = 127.0.0.1:1\n", "2: unknown key 'nodes' in [kvqd]");
	refused(POOL "nodes = 127.0.0.1:1\n", "8: unknown key 'nodes' in [pool p]");
	{
		char many[1024] = "";

		for (int i = 0; i <= (int)KVQ_CONFIG_MAX_REMOTES; i++)
			snprintf(many + strlen(many), sizeof many - strlen(many),
				 "[remote r%d]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n", i, key32);
		refused(many, "25: more than 8 remotes");
	}

	/* nodes */
	refused("[remote r]\nnodes = redis.local:7000\n",
		"2: nodes: 'redis.local' is not an IPv4 address or a bracketed IPv6 address (names are not resolved)");
	refused("[remote r]\nnodes = 127.0.0.1\n", "2: nodes: '127.0.0.1' is not ADDRESS:PORT with a port in 1-65535");
	refused("[remote r]\nnodes = 127.0.0.1:0\n", "2: nodes: '127.0.0.1:0' is not ADDRESS:PORT with a port in 1-65535");
	refused("[remote r]\nnodes = 127.0.0.1:65536\n",
		"2: nodes: '127.0.0.1:65536' is not ADDRESS:PORT with a port in 1-65535");
	refused("[remote r]\nnodes = 127.0.0.1:1,,127.0.0.1:2\n", "2: nodes: empty item in the list");
	refused("[remote r]\nnodes = 127.0.0.1:1,\n", "2: nodes: empty item in the list");
	refused("[remote r]\nnodes = ::1:7000\n",
		"2: nodes: '::1' is not an IPv4 address or a bracketed IPv6 address (names are not resolved)");
	refused("[remote r]\nnodes = [10.0.0.1]:7000\n", "2: nodes: '10.0.0.1' is not an IPv6 address");
	refused(fmt("[remote r]\nnodes = %s\n", longnodes), "2: nodes longer than 1023 bytes");

	/* user, files */
	refused(fmt("%suser = a b\n", Rc), "4: user 'a b' holds a blank or a character that is not printable ASCII");
	refused(fmt("%suser = kvqd\n", Rc), "4: remote 'r': user without password_file");
	refused("[remote r]\nhmac_key_file = key\n", "2: hmac_key_file must be an absolute path of at most 255 bytes");
	refused("[remote r]\npassword_file = ./p\n", "2: password_file must be an absolute path of at most 255 bytes");
	{
		char none[160];
		const struct { const char *path, *why; } keys[] = {
			{ none, "No such file or directory" },
			{ dir, "not a regular file" },
			{ key640, "group or others may access it (mode 0640): it must be 0600 or 0400" },
			{ key604, "group or others may access it (mode 0604): it must be 0600 or 0400" },
			{ key620, "group or others may access it (mode 0620): it must be 0600 or 0400" },
			{ key31, "31 bytes, fewer than 32" },
			{ key1025, "longer than 1024 bytes" },
		};

		snprintf(none, sizeof none, "%s/none", dir);
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
			refused(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n", keys[i].path),
				fmt("3: hmac_key_file %s: %s", keys[i].path, keys[i].why));
	}
	refused(fmt("%spassword_file = %s\n", Rc, key640),
		fmt("4: password_file %s: group or others may access it (mode 0640): it must be 0600 or 0400", key640));
	refused(fmt("%spassword_file = %s\n", Rc, pass_empty),
		fmt("4: password_file %s: not one line of 1-512 bytes without NUL bytes", pass_empty));
	refused(fmt("%spassword_file = %s\n", Rc, pass_lines),
		fmt("4: password_file %s: not one line of 1-512 bytes without NUL bytes", pass_lines));
	refused(fmt("%spassword_file = %s\n", Rc, pass_nul),
		fmt("4: password_file %s: not one line of 1-512 bytes without NUL bytes", pass_nul));
	refused(fmt("%spassword_file = %s\n", Rc, key1025),
		fmt("4: password_file %s: longer than 514 bytes", key1025));

	/* limits */
	refused(fmt("%sconnect_timeout_ms = 9\n", Rc), "4: connect_timeout_ms '9' is not in 10-60000");
	refused(fmt("%srequest_timeout_ms = 60001\n", Rc), "4: request_timeout_ms '60001' is not in 10-60000");
	refused(fmt("%srequest_timeout_ms = 1s\n", Rc), "4: request_timeout_ms '1s' is not a number of milliseconds");
	refused(fmt("%smax_inflight = 0\n", Rc), "4: max_inflight '0' is not in 1-65536");
	refused(fmt("%smax_value_bytes = 1K\n", Rc), "4: max_value_bytes '1K' is not in 65536-536870912 bytes");
	refused(fmt("%smax_value_bytes = 1G\n", Rc), "4: max_value_bytes '1G' is not in 65536-536870912 bytes");
	refused(fmt("%sttl_s = 315360001\n", Rc), "4: ttl_s '315360001' is not in 0-315360000");
	refused(fmt("%sttl_s = -1\n", Rc), "4: ttl_s '-1' is not a number");

	/* the pools' keys */
	refused(POOL "remote = fleet\nremote_namespace = n\n", "1: pool 'p': remote 'fleet' names no [remote fleet] section");
	refused(fmt("%s" POOL "remote = r\n", Rc), "11: pool 'p': remote needs remote_namespace");
	refused(POOL "remote_namespace = n\n", "8: pool 'p': remote_namespace without remote");
	refused(POOL "remote_write = off\n", "8: pool 'p': remote_write without remote");
	refused(fmt("%s" POOL "remote = r\nremote_namespace = a b\n", Rc),
		"12: remote_namespace 'a b' holds a blank or a character that is not printable ASCII");
	refused(fmt("%s" POOL "remote = r\nremote_namespace = caf\xc3\xa9\n", Rc),
		"12: remote_namespace 'caf\xc3\xa9' holds a blank or a character that is not printable ASCII");
	refused(fmt("%s" POOL "remote = r\nremote_namespace = %s\n", Rc, longns),
		"12: remote_namespace longer than 64 bytes");
	refused(fmt("%s" POOL "remote = r\nremote_namespace = n\nremote_write = sometimes\n", Rc),
		"13: remote_write 'sometimes' is not through, back or off");
	refused(fmt("%s" POOL "remote = R\nremote_namespace = n\n", Rc), "4: pool 'p': remote 'R' names no [remote R] section");
}

/* Every [remote] limit takes its range's ends and its default is within. */
static void test_limit_ends(void)
{
	for (int k = 0; k < K_COUNT; k++) {
		const struct conf_schema_key *row = &conf_schema_keys[k];
		char err[KVQ_CONFIG_MSG_MAX] = "";
		struct kvq_config *lo, *hi, *def;
		uint64_t l = 1, h = 0, d = 0;

		if (row->sec != KVQ_CONF_SEC_REMOTE ||
		    (row->type != KVQ_CONF_T_COUNT && row->type != KVQ_CONF_T_BYTES && row->type != KVQ_CONF_T_MS))
			continue;
		lo = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n%s = %llu\n", key32, row->name,
			       (unsigned long long)row->lo), err, sizeof err);
		hi = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n%s = %llu\n", key32, row->name,
			       (unsigned long long)row->hi), err, sizeof err);
		def = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\n", key32), err, sizeof err);
		if (lo)
			memcpy(&l, (const char *)lo->remotes + row->offset, sizeof l);
		if (hi)
			memcpy(&h, (const char *)hi->remotes + row->offset, sizeof h);
		if (def)
			memcpy(&d, (const char *)def->remotes + row->offset, sizeof d);
		ok(lo && hi && def && l == row->lo && h == row->hi && d >= row->lo && d <= row->hi,
		   "limit %s: %llu and %llu parse, default %llu within", row->name, (unsigned long long)row->lo,
		   (unsigned long long)row->hi, (unsigned long long)d);
		kvq_config_free(lo);
		kvq_config_free(hi);
		kvq_config_free(def);
	}
}

static int notes;

static void note(void *arg, const char *word, const char *name, const char *key)
{
	(void)arg;
	(void)word;
	(void)name;
	(void)key;
	notes++;
}

/* No remote key reloads: a SIGHUP keeps each until the next start. */
static void test_reload(void)
{
	char err[KVQ_CONFIG_MSG_MAX] = "";
	struct kvq_config *r, *n;

	for (int k = 0; k < K_COUNT; k++)
		if (conf_schema_keys[k].sec == KVQ_CONF_SEC_REMOTE || strncmp(conf_schema_keys[k].name, "remote", 6) == 0)
			ok(!(conf_schema_keys[k].flags & KVQ_CONF_RELOAD), "%s changes at the next start, not on SIGHUP",
			   conf_schema_keys[k].name);
	r = parse(fmt("[remote r]\nnodes = 127.0.0.1:1\nhmac_key_file = %s\nrequest_timeout_ms = 100\n" POOL
		      "remote = r\nremote_namespace = a\n", key32), err, sizeof err);
	n = parse(fmt("[remote r]\nnodes = 127.0.0.1:2\nhmac_key_file = %s\nrequest_timeout_ms = 200\n" POOL
		      "remote = r\nremote_namespace = b\nremote_write = off\n", key1024), err, sizeof err);
	if (!ok(r && n, "reload: both parse (%s)", err))
		goto out;
	kvq_config_keep_running(r, n, note, NULL);
	ok(strcmp(n->remotes[0].nodes, "127.0.0.1:1") == 0 && n->remotes[0].request_timeout_ms == 100 &&
	   strcmp(n->remotes[0].hmac_key_file, key32) == 0, "reload: the remote keeps its running keys");
	ok(n->remotes[0].hmac_key_len == 32, "reload: and the key its file held at the start, not the new file's");
	ok(strcmp(n->pools[0].remote_namespace, "a") == 0 && n->pools[0].remote_write == KVQ_REMOTE_WRITE_THROUGH,
	   "reload: the pool keeps its remote keys");
	ok(notes == 5, "reload: each kept key is noted (%d)", notes);
out:
	kvq_config_free(r);
	kvq_config_free(n);
}

int main(void)
{
	make_files();
	test_accepted();
	test_refused();
	test_limit_ends();
	test_reload();
	remove_files();
	return done_testing();
}
