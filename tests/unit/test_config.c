/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf parser (daemon/conf.h): a full config with every value
 * checked; each kind of error with its exact FILE:LINE and nothing returned;
 * the built-in defaults; files (missing, too large, not regular); and
 * systemd/kvqd.conf.example, which must parse.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "conf.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "conf_value.h"
#include "../tap.h"

#define GiB (1ull << 30)

static const char full[] =
	"# SPDX-License-Identifier: Apache-2.0\n"
	"; a comment of the other kind\n"
	"\n"
	"  [ kvqd ]  \n"
	"socket=/tmp/kvqd-test.sock\n"
	"\tbackend  =  host\t\n"
	"device = 1\n"
	"memory_budget = 64G\n"
	"log_level = debug\n"
	"create_on_attach = no\n"
	"create_uids = root, 1001 ,1002\n"
	"create_gids = 0,2000\n"
	"create_capacity = 1536MiB\n"
	"quota_per_uid = 4G\n"
	"\n"
	"[pool llama]\n"
	"model = meta-llama/Llama-3.1-8B-Instruct@0e9e39f\n"
	"layers = 32\n"
	"kv_heads = 8\n"
	"head_dim = 128\n"
	"block_tokens = 16\n"
	"policy = 0-3:int8; 4-:k=kivi4,v=kivi2\n"
	"window = 64\n"
	"window_dtype = bf16\n"
	"capacity = 16G\n"
	"acl_uids = 1001\n"
	"acl_gids = root,3000\n"
	"quota_per_uid = none\n"
	"create_on_attach = yes\n"
	"device = 0\n"
	"\n"
	"[pool qwen.fp8-v2]\n"
	"model = Qwen/Qwen2.5-7B\n"
	"layers = 28\n"
	"kv_heads = 4\n"
	"head_dim = 64\n"
	"policy = fp8\n"
	"memory_share = 12.5%\n";

static void test_full(void)
{
	char err[KVQ_CONFIG_MSG_MAX] = "";
	struct kvq_config *c = NULL;
	const struct kvq_config_pool *a, *b;
	int rc;

	rc = kvq_config_parse_string(full, strlen(full), "full.conf", &c, err, sizeof err);
	if (!ok(rc == 0 && c, "full config parses (%s)", rc ? err : "ok"))
		return;
	ok(strcmp(c->socket, "/tmp/kvqd-test.sock") == 0, "socket");
	ok(strcmp(c->backend, "host") == 0, "backend (blanks and tabs trimmed)");
	ok(c->device == 1, "device");
	ok(c->memory_budget.kind == KVQ_AMOUNT_BYTES && c->memory_budget.bytes == 64 * GiB, "memory_budget 64G");
	ok(c->log_level == LOG_DEBUG, "log_level debug");
	ok(!c->create_on_attach, "create_on_attach no");
	ok(!c->create_acl.any && c->create_acl.n_uids == 3 && c->create_acl.uids[0] == 0 &&
	   c->create_acl.uids[1] == 1001 && c->create_acl.uids[2] == 1002, "create_uids: root (looked up), 1001, 1002");
	ok(c->create_acl.n_gids == 2 && c->create_acl.gids[0] == 0 && c->create_acl.gids[1] == 2000, "create_gids");
	ok(c->create_capacity.kind == KVQ_AMOUNT_BYTES && c->create_capacity.bytes == 1536ull << 20,
	   "create_capacity 1536MiB");
	ok(c->quota_per_uid == 4 * GiB, "quota_per_uid 4G");
	ok(c->n_pools == 2, "two pools");

	a = kvq_config_find_pool(c, "llama");
	b = kvq_config_find_pool(c, "qwen.fp8-v2");
	if (!ok(a && b && !kvq_config_find_pool(c, "nope") && !kvq_config_find_pool(NULL, "llama"),
		"find_pool by name"))
		goto out;
	ok(a->line == 16 && b->line == 32, "pools remember their header lines (%u, %u)", a->line, b->line);
	ok(strcmp(a->model, "meta-llama/Llama-3.1-8B-Instruct@0e9e39f") == 0, "llama: model");
	ok(a->device == 0, "llama: device 0 (its own)");
	ok(a->layers == 32 && a->kv_heads == 8 && a->head_dim == 128 && a->block_tokens == 16, "llama: geometry");
	ok(a->policy.n_layers == 32 && a->policy.k[0] == KVQ_FMT_INT8 && a->policy.v[3] == KVQ_FMT_INT8 &&
	   a->policy.k[4] == KVQ_FMT_KIVI4 && a->policy.v[4] == KVQ_FMT_KIVI2 && a->policy.v[31] == KVQ_FMT_KIVI2,
	   "llama: policy");
	ok(a->window == 64, "llama: window 64");
	ok(a->act == KVQ_DT_BF16, "llama: window_dtype bf16");
	ok(a->capacity.kind == KVQ_AMOUNT_BYTES && a->capacity.bytes == 16 * GiB, "llama: capacity 16G");
	ok(!a->acl.any && a->acl.n_uids == 1 && a->acl.uids[0] == 1001 && a->acl.n_gids == 2 && a->acl.gids[0] == 0 &&
	   a->acl.gids[1] == 3000, "llama: acl_uids, acl_gids (root looked up)");
	ok(a->quota_per_uid == KVQ_CONFIG_UNLIMITED, "llama: quota_per_uid none");
	ok(a->create_on_attach, "llama: create_on_attach yes");

	ok(strcmp(b->model, "Qwen/Qwen2.5-7B") == 0 && b->layers == 28 && b->kv_heads == 4 && b->head_dim == 64,
	   "qwen: model and geometry");
	ok(b->device == 1, "qwen: device from [kvqd]");
	ok(b->block_tokens == 32, "qwen: block_tokens default 32");
	ok(b->policy.n_layers == 28 && b->policy.k[27] == KVQ_FMT_FP8 && b->policy.v[0] == KVQ_FMT_FP8, "qwen: policy fp8");
	ok(b->window == 32, "qwen: default window is one block without kivi (%u)", b->window);
	ok(b->act == KVQ_DT_F16, "qwen: window_dtype default f16");
	ok(b->capacity.kind == KVQ_AMOUNT_PERCENT && b->capacity.percent == 12.5, "qwen: memory_share 12.5%%");
	ok(b->acl.any, "qwen: no ACL: anyone who can connect");
	ok(b->quota_per_uid == 4 * GiB, "qwen: quota from [kvqd]");
	ok(!b->create_on_attach, "qwen: create_on_attach default no");
	ok(kvq_config_amount_bytes(&b->capacity, 64 * GiB) == 8 * GiB, "qwen: 12.5%% of 64G is 8G");
out:
	kvq_config_free(c);
}

/* ------------------------------------------------------------ errors */

/* A minimal valid pool, followed by extra lines (line numbers: the header
 * is on line 1, the last key below on line 7). */
#define POOL(extra)                                                                            \
	"[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 64M\n" extra

static const struct bad {
	const char *text;
	const char *msg;    /* the message after "bad.conf:" (all of it, or its start) */
} bad[] = {
	{ "[kvqd]\nsockets = /x\n", "2: unknown key 'sockets' in [kvqd]" },
	{ POOL("colour = red\n"), "8: unknown key 'colour' in [pool p]" },
	{ POOL("socket = /x\n"), "8: unknown key 'socket' in [pool p]" },
	{ "[kvqd]\nmodel = m\n", "2: unknown key 'model' in [kvqd]" },
	{ "\n[daemon]\n", "2: unknown section [daemon] (kvqd, pool NAME or remote NAME)" },
	{ "[pools x]\n", "1: unknown section [pools x] (kvqd, pool NAME or remote NAME)" },
	{ "[kvqd]\ndevice = 0\n# c\ndevice = 1\n", "4: duplicate key 'device' (first on line 2)" },
	{ POOL("layers = 4\n"), "8: duplicate key 'layers' (first on line 3)" },
	{ POOL("") "[pool p]\n", "8: duplicate pool 'p' (first on line 1)" },
	{ "[kvqd]\n[kvqd]\n", "2: duplicate section [kvqd] (first on line 1)" },
	{ "[pool p]\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 1G\n",
	  "1: pool 'p': missing key 'model'" },
	{ "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\ncapacity = 1G\n[kvqd]\n",
	  "1: pool 'p': missing key 'policy'" },
	{ "\n[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\n",
	  "2: pool 'p': missing key 'capacity' or 'memory_share'" },
	{ POOL("memory_share = 10\n"), "8: memory_share and capacity (line 7) exclude each other" },
	{ "[kvqd]\ncreate_memory_share = 5\ncreate_capacity = 1G\n",
	  "3: create_capacity and create_memory_share (line 2) exclude each other" },
	{ "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int9\ncapacity = 64M\n",
	  "6: policy: clause 1: unknown format 'int9'" },
	{ "[pool p]\nmodel = m\npolicy = 0-2:int8\nlayers = 4\nkv_heads = 2\nhead_dim = 64\ncapacity = 64M\n",
	  "3: policy: layer 3 is not covered by any clause" },
	{ "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int4g128\ncapacity = 64M\n",
	  "6: policy: layer 0: int4g128 needs a head dim that is a multiple of 128, not 64" },
	{ "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = 0-1:int8;2-:k=int8,v=pq2\n"
	  "capacity = 64M\n",
	  "6: pool 'p': policy 0-1:int8;2-:k=int8,v=pq2 uses a codebook format: pools with codebook formats are "
	  "created by a client that sends the codebooks (kvqctl pool create --codebooks)" },
	{ POOL("window = 48\n"), "8: window 48 is not a multiple of block_tokens (32) up to 64 blocks" },
	{ POOL("window = 4096\n"), "8: window 4096 is not a multiple of block_tokens (32) up to 64 blocks" },
	{ POOL("window = 0\n"), "8: window '0' is not a number in 1-16384" },
	{ POOL("head_dim = 96\n"), "8: duplicate key 'head_dim' (first on line 5)" },
	{ "[pool p]\nhead_dim = 80\n", "2: head_dim '80' is not a multiple of 32 in 32-256" },
	{ "[pool p]\nblock_tokens = 20\n", "2: block_tokens '20' is not a multiple of 16 in 16-256" },
	{ "[pool p]\nlayers = 0\n", "2: layers '0' is not a number in 1-256" },
	{ "[pool p]\nlayers = 257\n", "2: layers '257' is not a number in 1-256" },
	{ "[pool p]\nkv_heads = -1\n", "2: kv_heads '-1' is not a number in 1-256" },
	{ "[pool p]\nkv_heads = 0x8\n", "2: kv_heads '0x8' is not a number in 1-256" },
	{ "[pool p]\nlayers = 99999999999999999999999\n", "2: layers '99999999999999999999999' is not a number in 1-256" },
	{ "[kvqd]\ndevice = 1024\n", "2: device '1024' is not a number in 0-1023" },
	{ "[pool p]\ncapacity = 12Q\n",
	  "2: capacity '12Q' is not a size (bytes with an optional K, M, G or T suffix)" },
	{ "[pool p]\ncapacity = 1.5G\n",
	  "2: capacity '1.5G' is not a size (bytes with an optional K, M, G or T suffix)" },
	{ "[pool p]\ncapacity = 99999999999T\n", "2: capacity '99999999999T' exceeds 2^64 bytes" },
	{ "[pool p]\ncapacity = 0\n", "2: capacity must not be 0" },
	{ "[kvqd]\nmemory_budget = 150%\n", "2: memory_budget '150%' is not in (0, 100]%" },
	{ "[kvqd]\nmemory_budget = 0%\n", "2: memory_budget '0%' is not in (0, 100]%" },
	{ "[kvqd]\nmemory_budget = lots%\n", "2: memory_budget 'lots%' is not a percentage (N%)" },
	{ POOL("") "[pool q]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\nmemory_share = 1.\n",
	  "14: memory_share '1.' is not a percentage" },
	{ "[kvqd]\nbackend = gpu\n", "2: backend 'gpu' is not auto, host or cuda" },
	{ "[kvqd]\nlog_level = loud\n", "2: log_level 'loud' is not a syslog level (emerg .. debug, or 0-7)" },
	{ "[kvqd]\nlog_level = 8\n", "2: log_level '8' is not a syslog level (emerg .. debug, or 0-7)" },
	{ "[kvqd]\ncreate_on_attach = maybe\n", "2: create_on_attach 'maybe' is not yes or no" },
	{ "[kvqd]\ncreate_uids = kvq-no-such-user-xyz\n", "2: no such user 'kvq-no-such-user-xyz'" },
	{ "[kvqd]\ncreate_gids = kvq-no-such-group-xyz\n", "2: no such group 'kvq-no-such-group-xyz'" },
	{ "[kvqd]\ncreate_uids = 1,,2\n", "2: empty item in the user list" },
	{ "[kvqd]\ncreate_uids = 4294967295\n", "2: bad user id '4294967295'" },
	{ "socket = /x\n", "1: key 'socket' outside a section" },
	{ "[kvqd]\njust words\n", "2: expected 'key = value', a [section] or a comment" },
	{ "[kvqd]\nsocket =\n", "2: key 'socket' without a value" },
	{ "[kvqd]\nsocket = run/kvqd.sock\n", "2: socket must be an absolute path of at most 107 bytes" },
	{ "[kvqd\n", "1: section header without ']'" },
	{ "[pool]\n", "1: pool section without a name: [pool NAME]" },
	{ "[pool a/b]\n", "1: pool name 'a/b' is not 1-63 of A-Z a-z 0-9 . _ -" },
	{ "[pool 0123456789012345678901234567890123456789012345678901234567890123]\n",
	  "1: pool name '0123456789012345678901234567890123456789012345678901234567890123' is not 1-63 of "
	  "A-Z a-z 0-9 . _ -" },
	{ "[pool p]\nmodel = a\tb\n", "2: model id holds a control character" },
	{ "[pool p]\nwindow_dtype = f32\n", "2: window_dtype 'f32' is not f16 or bf16" },
	{ "[kvqd]\nquota_per_uid = 0\n", "2: quota_per_uid must not be 0" },
	{ "[kvqd]\nadmin_gids = kvq-no-such-group-xyz\n", "2: no such group 'kvq-no-such-group-xyz'" },
	{ "[pool p]\nadmin_uids = 0\n", "2: unknown key 'admin_uids' in [pool p]" },
	{ "[kvqd]\nmetrics_listen = 0.0.0.0:9464\n",
	  "2: metrics_listen '0.0.0.0:9464': 0.0.0.0 is not a loopback address (127.0.0.0/8)" },
	{ "[kvqd]\nmetrics_listen = [::]:9464\n", "2: metrics_listen '[::]:9464': :: is not the loopback address ::1" },
	{ "[kvqd]\nmetrics_listen = ::1:9464\n",
	  "2: metrics_listen '::1:9464': '::1' is not an IPv4 address or a bracketed IPv6 address" },
	{ "[kvqd]\nmetrics_listen = localhost:9464\n",
	  "2: metrics_listen 'localhost:9464': 'localhost' is not an IPv4 address" },
	{ "[kvqd]\nmetrics_listen = 127.0.0.1\n", "2: metrics_listen '127.0.0.1': not ADDRESS:PORT" },
	{ "[kvqd]\nmetrics_listen = 127.0.0.1:0\n", "2: metrics_listen '127.0.0.1:0': port is not a number in 1-65535" },
	{ "[kvqd]\nmetrics_listen = 127.0.0.1:65536\n",
	  "2: metrics_listen '127.0.0.1:65536': port is not a number in 1-65535" },
	{ "[kvqd]\nmax_connections = 0\n", "2: max_connections '0' is not in 1-1024" },
	{ "[kvqd]\nmax_connections = 1025\n", "2: max_connections '1025' is not in 1-1024" },
	{ "[kvqd]\nmax_connections_per_uid = many\n", "2: max_connections_per_uid 'many' is not a number" },
	{ "[kvqd]\nmax_output = 1K\n", "2: max_output '1K' is not in 65536-67108864 bytes" },
	{ "[kvqd]\nmax_output = lots\n", "2: max_output 'lots' is not a size" },
	{ "[kvqd]\nhandshake_timeout_ms = 5s\n", "2: handshake_timeout_ms '5s' is not a number of milliseconds" },
	{ "[kvqd]\nidle_timeout_ms = 86400001\n", "2: idle_timeout_ms '86400001' is not in 0-86400000" },
	{ "[pool p]\nmax_output = 1M\n", "2: unknown key 'max_output' in [pool p]" },
	{ "[kvqd]\nframes_per_wakeup = 8\nframes_per_wakeup = 9\n",
	  "3: duplicate key 'frames_per_wakeup' (first on line 2)" },
	/* 4 layers x (sealed slice: 2 heads x (2048 + 64 + 2048 + 64) + open: 2 heads x 2 x 32 x 64 x 2) */
	{ "[pool p]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 64K\n",
	  "7: capacity 65536 bytes is less than one sealed block and one open window (99328 bytes)" },
	{ "[pool a]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\nmemory_share = 60\n"
	  "[pool b]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\nmemory_share = 50\n",
	  "8: pool 'b': memory_share of the pools on device 0 adds up to 110%" },
	{ "[pool a]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 1G\n"
	  "[pool b]\nmodel = m\nlayers = 4\nkv_heads = 2\nhead_dim = 64\npolicy = int8\ncapacity = 2G\n"
	  "[kvqd]\nmemory_budget = 2G\n",
	  "8: pool 'b': capacity of the pools on device 0 adds up to 3221225472 bytes, over memory_budget "
	  "(2147483648)" },
};

static void test_errors(void)
{
	static const char nul[] = "[kvqd]\nsocket = /x\0y\n";
	char err[KVQ_CONFIG_MSG_MAX], want[KVQ_CONFIG_MSG_MAX + 16];
	struct kvq_config *c = NULL;
	int rc;

	rc = kvq_config_parse_string(nul, sizeof nul - 1, "bad.conf", &c, err, sizeof err);
	ok(rc == -EINVAL && !c && strcmp(err, "bad.conf:2: NUL byte") == 0, "a NUL byte: %s", err);

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		size_t len = strlen(bad[i].text);
		int same;

		c = (struct kvq_config *)&err;   /* a sentinel that must stay */

		strcpy(err, "untouched");
		rc = kvq_config_parse_string(bad[i].text, len, "bad.conf", &c, err, sizeof err);
		snprintf(want, sizeof want, "bad.conf:%s", bad[i].msg);
		same = strncmp(err, want, strlen(want)) == 0;
		ok(rc == -EINVAL && c == (struct kvq_config *)&err && same, "error %zu: %s%s%s", i, err,
		   same ? "" : " -- wanted: ", same ? "" : want);
	}
}

static void test_limits(void)
{
	char err[KVQ_CONFIG_MSG_MAX];
	struct kvq_config *c = NULL;
	size_t cap = (KVQ_CONFIG_MAX_POOLS + 1) * 128 + KVQ_CONFIG_MAX_LINE + 64, n = 0;
	char *text = malloc(cap);
	int rc;

	if (!text)
		abort();
	for (unsigned i = 0; i <= KVQ_CONFIG_MAX_POOLS; i++)
		n += (size_t)snprintf(text + n, cap - n,
				      "[pool p%u]\nmodel=m\nlayers=1\nkv_heads=1\nhead_dim=32\npolicy=int8\n"
				      "memory_share=1\n", i);
	rc = kvq_config_parse_string(text, n, "many.conf", &c, err, sizeof err);
	ok(rc == -EINVAL && !c && strcmp(err, "many.conf:449: more than 64 pools") == 0, "65 pools: %s", err);
	/* 64 pools of 1%: fine */
	n = 0;
	for (unsigned i = 0; i < KVQ_CONFIG_MAX_POOLS; i++)
		n += (size_t)snprintf(text + n, cap - n,
				      "[pool p%u]\nmodel=m\nlayers=1\nkv_heads=1\nhead_dim=32\npolicy=int8\n"
				      "memory_share=1\n", i);
	rc = kvq_config_parse_string(text, n, "many.conf", &c, err, sizeof err);
	ok(rc == 0 && c && c->n_pools == KVQ_CONFIG_MAX_POOLS, "64 pools parse (%s)", rc ? err : "ok");
	kvq_config_free(c);
	c = NULL;

	/* a line one byte too long, then one that just fits (a comment) */
	n = (size_t)snprintf(text, cap, "[kvqd]\n#");
	memset(text + n, 'x', KVQ_CONFIG_MAX_LINE);
	n += KVQ_CONFIG_MAX_LINE;
	text[n++] = '\n';
	rc = kvq_config_parse_string(text, n, "long.conf", &c, err, sizeof err);
	ok(rc == -EINVAL && !c && strstr(err, "long.conf:2: line longer than"), "overlong line: %s", err);
	rc = kvq_config_parse_string(text, n - 2, "long.conf", &c, err, sizeof err);
	ok(rc == 0 && c, "a line of the maximum length is fine (%s)", rc ? err : "ok");
	kvq_config_free(c);
	free(text);
}

static void test_lexical(void)
{
	static const char crlf[] = "[kvqd]\r\nlog_level = 3\r\n\r\n  # indented comment\r\n\t; another\r\n";
	static const char late[] =
		"[pool a]\nmodel = m\nlayers = 2\nkv_heads = 1\nhead_dim = 32\npolicy = kivi2\nmemory_share = 50\n"
		"[kvqd]\ndevice = 3\nquota_per_uid = 1G\nmemory_budget = 33.5 %\n";
	char err[KVQ_CONFIG_MSG_MAX];
	struct kvq_config *c = NULL;
	int rc;

	rc = kvq_config_parse_string(crlf, strlen(crlf), "crlf.conf", &c, err, sizeof err);
	ok(rc == 0 && c && c->log_level == LOG_ERR, "CRLF lines, indented comments (%s)", rc ? err : "ok");
	kvq_config_free(c);
	c = NULL;
	rc = kvq_config_parse_string(late, strlen(late), "late.conf", &c, err, sizeof err);
	ok(rc == 0 && c && c->pools[0].device == 3 && c->pools[0].quota_per_uid == 1ull << 30,
	   "[kvqd] after a pool still gives it device and quota (%s)", rc ? err : "ok");
	ok(c && c->pools[0].window == 4 * 32, "kivi policy: default window 4 blocks");
	ok(c && c->memory_budget.kind == KVQ_AMOUNT_PERCENT && c->memory_budget.percent == 33.5,
	   "memory_budget 33.5 %%");
	kvq_config_free(c);
}

/* ------------------------------------------------------------ defaults */

static void check_defaults(const struct kvq_config *c, const char *what)
{
	ok(c && strcmp(c->socket, "/run/kvqd/kvqd.sock") == 0 && strcmp(c->backend, "auto") == 0 && c->device == 0 &&
	   c->memory_budget.kind == KVQ_AMOUNT_PERCENT && c->memory_budget.percent == 90.0 &&
	   c->log_level == LOG_INFO && c->create_on_attach && !c->create_acl.any && c->create_acl.n_gids == 0 &&
	   c->create_acl.uids[0] == 0 &&
	   (geteuid() == 0 ? c->create_acl.n_uids == 1 : c->create_acl.n_uids == 2 && c->create_acl.uids[1] == geteuid()) &&
	   c->create_capacity.kind == KVQ_AMOUNT_PERCENT && c->create_capacity.percent == 25.0 &&
	   c->quota_per_uid == KVQ_CONFIG_UNLIMITED && c->n_pools == 0,
	   "%s: built-in defaults (auto backend, 90%% budget, pools created on attach by root and kvqd's user, 25%% each)", what);
	ok(c && c->max_connections == 1024 && c->max_connections_per_uid == 512 &&
	   c->max_output == 1u << 20 && c->frames_per_wakeup == 32 &&
	   c->handshake_timeout_ms == 5000 && c->idle_timeout_ms == 0 && c->accept_pause_ms == 200,
	   "%s: the limits' defaults (kvqd.conf(5))", what);
}

/* Every [kvqd] limit (a row of type COUNT, BYTES or MS, conf_keys.h)
 * takes its range's ends ([remote]'s: tests/unit/test_conf_remote.c). */
static void test_limit_keys(void)
{
	char text[256], err[KVQ_CONFIG_MSG_MAX];

	for (size_t i = 0; i < K_COUNT; i++) {
		const struct conf_schema_key *row = &conf_schema_keys[i];
		struct kvq_config *lo = NULL, *hi = NULL, *def = NULL;
		uint64_t d;
		int r1, r2;

		if ((row->type != KVQ_CONF_T_COUNT && row->type != KVQ_CONF_T_BYTES && row->type != KVQ_CONF_T_MS) ||
		    row->sec != KVQ_CONF_SEC_KVQD)
			continue;
		snprintf(text, sizeof(text), "[kvqd]\n%s = %llu\n", row->name, (unsigned long long)row->lo);
		r1 = kvq_config_parse_string(text, strlen(text), "l.conf", &lo, err, sizeof err);
		snprintf(text, sizeof(text), "[kvqd]\n%s = %llu\n", row->name, (unsigned long long)row->hi);
		r2 = kvq_config_parse_string(text, strlen(text), "l.conf", &hi, err, sizeof err);
		kvq_config_new(&def);
		d = *(const uint64_t *)((const char *)def + row->offset);
		ok(row->sec == KVQ_CONF_SEC_KVQD && r1 == 0 && r2 == 0 &&
		   *(const uint64_t *)((const char *)lo + row->offset) == row->lo &&
		   *(const uint64_t *)((const char *)hi + row->offset) == row->hi && d >= row->lo && d <= row->hi,
		   "limit %s: %llu and %llu parse, default %llu within", row->name, (unsigned long long)row->lo,
		   (unsigned long long)row->hi, (unsigned long long)d);
		kvq_config_free(lo);
		kvq_config_free(hi);
		kvq_config_free(def);
	}
}

static void test_defaults(void)
{
	static const char comments[] = "# nothing but comments\n\n;\n";
	char err[KVQ_CONFIG_MSG_MAX];
	struct kvq_config *c = NULL;
	int rc;

	ok(kvq_config_new(&c) == 0, "config_new");
	check_defaults(c, "config_new");
	ok(c && kvq_config_amount_bytes(&c->memory_budget, 100 * GiB) == 90 * GiB, "90%% of 100G");
	kvq_config_free(c);
	kvq_config_free(NULL);
	c = NULL;
	rc = kvq_config_parse_string("", 0, "empty.conf", &c, err, sizeof err);
	ok(rc == 0, "an empty file parses");
	check_defaults(c, "empty file");
	kvq_config_free(c);
	c = NULL;
	rc = kvq_config_parse_string(comments, strlen(comments), "c.conf", &c, err, sizeof err);
	ok(rc == 0, "a file of comments parses");
	check_defaults(c, "comments only");
	kvq_config_free(c);
}

static void test_helpers(void)
{
	struct kvq_config_acl acl = { .any = false, .n_uids = 1, .uids = { 1000 }, .n_gids = 2, .gids = { 50, 60 } };
	struct kvq_config_amount pct = { .kind = KVQ_AMOUNT_PERCENT, .percent = 100.0 };
	gid_t g1[] = { 10, 60 }, g2[] = { 10, 20 };
	uint64_t v = 7;

	ok(kvq_config_acl_allows(&acl, 1000, NULL, 0), "acl: listed uid");
	ok(kvq_config_acl_allows(&acl, 1, g1, 2), "acl: member of a listed group (supplementary)");
	ok(!kvq_config_acl_allows(&acl, 1, g2, 2), "acl: neither");
	acl.any = true;
	ok(kvq_config_acl_allows(&acl, 1, NULL, 0), "acl: any");
	ok(kvq_config_amount_bytes(&pct, UINT64_MAX) == UINT64_MAX, "100%% of 2^64-1");
	ok(kvq_config_parse_size("64G", &v) == 0 && v == 64 * GiB, "size 64G");
	ok(kvq_config_parse_size("2 t", &v) == 0 && v == 2ull << 40, "size '2 t'");
	ok(kvq_config_parse_size("3KiB", &v) == 0 && v == 3072, "size 3KiB");
	ok(kvq_config_parse_size("18446744073709551615", &v) == 0 && v == UINT64_MAX, "size 2^64-1");
	v = 7;
	ok(kvq_config_parse_size("16777216T", &v) == -ERANGE && v == 7, "size 2^64 T: -ERANGE, untouched");
	ok(kvq_config_parse_size("18446744073709551616", &v) == -ERANGE, "size 2^64: -ERANGE");
	ok(kvq_config_parse_size("1KB", &v) == -EINVAL && kvq_config_parse_size("", &v) == -EINVAL &&
	   kvq_config_parse_size("-1", &v) == -EINVAL && kvq_config_parse_size("G", &v) == -EINVAL,
	   "sizes '1KB', '', '-1', 'G': -EINVAL");
}

/* ------------------------------------------------------------ files */

static void write_file(const char *path, const char *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	if (fd < 0 || write(fd, data, len) != (ssize_t)len) {
		perror(path);
		abort();
	}
	close(fd);
}

static void test_files(void)
{
	char dir[] = "/tmp/kvq-test-config-XXXXXX", path[128], err[KVQ_CONFIG_MSG_MAX + 128], want[256];
	const char *top = getenv("top_srcdir");
	struct kvq_config *c = NULL;
	char *big;
	int rc;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		abort();
	}
	snprintf(path, sizeof path, "%s/missing.conf", dir);
	rc = kvq_config_parse_file(path, &c, err, sizeof err);
	snprintf(want, sizeof want, "%s: %s", path, strerror(ENOENT));
	ok(rc == -ENOENT && !c && strcmp(err, want) == 0, "missing file: -ENOENT (%s)", err);

	rc = kvq_config_parse_file(dir, &c, err, sizeof err);
	ok(rc == -EINVAL && !c && strstr(err, "not a regular file"), "a directory: %s", err);

	snprintf(path, sizeof path, "%s/bad.conf", dir);
	write_file(path, "[kvqd]\n\nbackend = tpu\n", 23);
	rc = kvq_config_parse_file(path, &c, err, sizeof err);
	snprintf(want, sizeof want, "%s:3: backend 'tpu' is not auto, host or cuda", path);
	ok(rc == -EINVAL && !c && strcmp(err, want) == 0, "file error names the path and line (%s)", err);

	big = malloc(KVQ_CONFIG_MAX_FILE + 1);
	if (!big)
		abort();
	memset(big, '\n', KVQ_CONFIG_MAX_FILE + 1);
	write_file(path, big, KVQ_CONFIG_MAX_FILE + 1);
	rc = kvq_config_parse_file(path, &c, err, sizeof err);
	ok(rc == -EFBIG && !c, "a file over %u bytes: -EFBIG (%s)", KVQ_CONFIG_MAX_FILE, err);
	write_file(path, big, KVQ_CONFIG_MAX_FILE);
	rc = kvq_config_parse_file(path, &c, err, sizeof err);
	ok(rc == 0 && c && c->n_pools == 0, "a file of exactly %u bytes parses", KVQ_CONFIG_MAX_FILE);
	kvq_config_free(c);
	c = NULL;
	free(big);
	unlink(path);
	rmdir(dir);

	snprintf(path, sizeof path, "%s/systemd/kvqd.conf.example", top && *top ? top : "..");
	rc = kvq_config_parse_file(path, &c, err, sizeof err);
	ok(rc == 0 && c, "%s parses (%s)", path, rc ? err : "ok");
	if (c) {
		const struct kvq_config_pool *p = kvq_config_find_pool(c, "llama3-8b");

		ok(c->n_pools == 2 && p && p->layers == 32 && p->window == 128 && p->act == KVQ_DT_BF16 &&
		   p->capacity.bytes == 16 * GiB && kvq_config_find_pool(c, "qwen-fp8"),
		   "the example's pools are what it says");
	} else {
		ok(0, "the example's pools are what it says");
	}
	kvq_config_free(c);
}

/* Keys for operating kvqd: who is an admin, where the metrics listen. */
static void test_operations(void)
{
	static const char text[] = "[kvqd]\nadmin_uids = 0, 4242\nadmin_gids = 77\nmetrics_listen = [::1]:9464\n";
	struct kvq_config *c = NULL, *d = NULL;
	char err[KVQ_CONFIG_MSG_MAX] = "", addr[64];
	gid_t g77 = 77, g78 = 78;
	uint16_t port = 0;

	ok(kvq_config_parse_string(text, sizeof text - 1, "ops.conf", &c, err, sizeof err) == 0, "admin and metrics keys "
	   "parse: %s", err);
	if (c) {
		ok(kvq_config_acl_allows(&c->admin_acl, 4242, &g78, 1) && kvq_config_acl_allows(&c->admin_acl, 1000, &g77, 1) &&
		   !kvq_config_acl_allows(&c->admin_acl, 1000, &g78, 1), "admin_uids and admin_gids name the admins");
		ok(!strcmp(c->metrics_listen, "[::1]:9464"), "metrics_listen kept as written");
	}
	ok(kvq_config_new(&d) == 0 && !d->metrics_listen[0] && kvq_config_acl_allows(&d->admin_acl, 0, &g78, 1) &&
	   kvq_config_acl_allows(&d->admin_acl, geteuid(), &g78, 1) &&
	   (geteuid() == 12345 || !kvq_config_acl_allows(&d->admin_acl, 12345, &g78, 1)),
	   "defaults: no metrics; admins are root and kvqd's own user");
	ok(kvq_config_parse_listen("127.1.2.3:80", addr, sizeof addr, &port, err, sizeof err) == 0 &&
	   !strcmp(addr, "127.1.2.3") && port == 80, "127.0.0.0/8 is loopback");
	ok(kvq_config_parse_listen("[::1]:9464", addr, sizeof addr, &port, err, sizeof err) == 0 && !strcmp(addr, "::1") &&
	   port == 9464, "[::1] is loopback, brackets dropped");
	kvq_config_free(c);
	kvq_config_free(d);
}

int main(void)
{
	test_operations();
	test_full();
	test_errors();
	test_limits();
	test_lexical();
	test_defaults();
	test_limit_keys();
	test_helpers();
	test_files();
	return done_testing();
}
