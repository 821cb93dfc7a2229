/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqctl: the admin CLI of kvqd (kvqctl(1)).  It speaks the wire protocol
 * (proto/kvq.proto) on the control socket directly, because it reports
 * everything Stats carries, and computes bytes per token with the pool
 * layout code (kernels/layout.h), so its figures are the pool's.
 *
 * Exit status: 0 success, 1 a failure (one line on stderr: daemon not
 * running, permission denied, unknown pool, ...), 2 a usage error.
 */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "format.h"
#include "conn.h"
#include "kvq.h"
#include "layout.h"

#define PROG "kvqctl"
#define TIMEOUT_MS 10000
#define MAX_POLICIES 16

static const char *opt_socket;
static bool opt_json;

/* ---------------------------------------------------------------- output */

__attribute__((format(printf, 1, 2)))
static int die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* A minimal JSON writer: one document on stdout, commas by nesting level. */
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

static void j_open(const char *key, char c)
{
	j_sep(key);
	fputc(c, stdout);
	js.first[++js.depth] = true;
}

static void j_close(char c)
{
	js.depth--;
	fputc(c, stdout);
	if (js.depth == 0)
		fputc('\n', stdout);
}

static void j_str(const char *key, const char *v)
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

static void j_u64(const char *key, uint64_t v)
{
	j_sep(key);
	printf("%llu", (unsigned long long)v);
}

static void j_i64(const char *key, int64_t v)
{
	j_sep(key);
	printf("%lld", (long long)v);
}

static void j_num(const char *key, double v)
{
	j_sep(key);
	if (isfinite(v))
		printf("%.15g", v);
	else
		fputs("null", stdout);
}

static void j_bool(const char *key, bool v)
{
	j_sep(key);
	fputs(v ? "true" : "false", stdout);
}

/* "1.50 GiB": binary units for pool sizes, as kvqd.conf takes them. */
static const char *human_bytes(double b, char *buf, size_t len)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	int i = 0;

	while (b >= 1024.0 && i < 4) {
		b /= 1024.0;
		i++;
	}
	snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
	return buf;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : NAN;
}

/* ---------------------------------------------------------------- daemon connection */

/* Says why a request on c failed, in kvqctl's words; returns 1. */
static int conn_fault(const struct kvq_conn *c, int r)
{
	switch (c->fault) {
	case KVQ_CONN_PATH:
		if (r == -ENOENT)
			return die("no socket: give --socket or set KVQ_SOCKET (XDG_RUNTIME_DIR is not set)");
		return die("socket path: %s", kvq_strerror(r));
	case KVQ_CONN_SOCKET:
		return die("socket: %s", strerror(-r));
	case KVQ_CONN_CONNECT:
		if (r == -ENOENT || r == -ECONNREFUSED)
			return die("kvqd is not running (nothing listens on %s)", c->path);
		if (r == -EACCES || r == -EPERM)
			return die("permission denied: %s (members of the socket's group may connect)", c->path);
		return die("%s: %s", c->path, strerror(-r));
	case KVQ_CONN_STATUS:
		if (r == -EPERM || r == -EACCES)
			return die("permission denied: %s", c->msg);
		if (r == -ENOENT)
			return die("unknown pool: %s", c->msg);
		return die("%s", c->msg);
	case KVQ_CONN_PROTOCOL:
		return die("kvqd at %s sent a reply that does not match the request", c->path);
	default:
		return die("talking to kvqd at %s: %s", c->path, kvq_strerror(r));
	}
}

/* One request on a new connection: 0 with *ret (the reply of type want),
 * or 1 after printing why. */
static int request(Kvq__Envelope *req, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	struct kvq_conn c;
	int r;

	kvq_conn_init(&c, TIMEOUT_MS);
	r = kvq_conn_open(&c, opt_socket, PROG);
	if (r == 0)
		r = kvq_conn_call(&c, req, want, ret);
	if (r < 0)
		r = conn_fault(&c, r);
	kvq_conn_close(&c);
	return r;
}

static int get_stats(const char *pool, Kvq__Envelope **ret)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Stats s = KVQ__STATS__INIT;

	s.pool = (char *)(pool ? pool : "");
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	return request(&e, KVQ__ENVELOPE__BODY_STATS_REPLY, ret);
}

/* ---------------------------------------------------------------- pool figures */

/* Sealed bytes per token of a pool, and what the same geometry takes in
 * f16 (the baseline of the ratio), from the layout code. */
struct pool_fig {
	double bpt, bpt_f16;
	uint64_t used;           /* slot bytes in use: held, cached, reserved, open */
};

static void pool_figures(const Kvq__PoolStats *p, struct pool_fig *f)
{
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = p->layers, .kv_heads = p->kv_heads, .head_dim = p->head_dim,
		.block_tokens = p->block_tokens, .window = p->window, .n_sealed = 1, .n_open = 1,
		.act = (int)p->act, .policy = &pol };
	struct kvq_layout *L = NULL;

	f->bpt = p->block_tokens ? (double)p->sealed_block_bytes / p->block_tokens : NAN;
	f->bpt_f16 = NAN;
	if (kvq_policy_parse("f16", p->layers, &pol, NULL, 0) == 0 && kvq_layout_new(&lp, &L, NULL, 0) == 0) {
		f->bpt_f16 = (double)L->sealed_block_bytes / p->block_tokens;
		kvq_layout_free(L);
	}
	f->used = ((uint64_t)p->sealed_held + p->cached + p->sealed_reserved) * p->sealed_block_bytes +
		  (uint64_t)p->open_used * p->open_block_bytes;
}

static const char *dev_str(int device, char *buf, size_t len)
{
	if (device < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%d", device);
	return buf;
}

static void json_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr)
{
	struct pool_fig f;

	pool_figures(p, &f);
	j_open(NULL, '{');
	j_str("name", p->name);
	j_str("model_id", p->model_id);
	j_str("policy", p->policy);
	j_str("backend", p->backend);
	j_i64("device", p->device);
	j_u64("layers", p->layers);
	j_u64("kv_heads", p->kv_heads);
	j_u64("head_dim", p->head_dim);
	j_u64("block_tokens", p->block_tokens);
	j_u64("window", p->window);
	j_str("window_dtype", p->act == KVQ__DTYPE__DTYPE_BF16 ? "bf16" : "f16");
	j_u64("capacity_bytes", p->total_bytes);
	j_u64("device_memory_bytes", p->device_memory);
	j_num("capacity_share_of_device", ratio(p->total_bytes, p->device_memory));
	j_u64("used_bytes", f.used);
	j_num("used_share_of_device", ratio(f.used, p->device_memory));
	j_open("blocks", '{');
	j_u64("sealed_slots", p->n_sealed);
	j_u64("open_slots", p->n_open);
	j_u64("free", p->sealed_free);
	j_u64("reserved", p->sealed_reserved);
	j_u64("sealed", p->sealed_held);
	j_u64("cached", p->cached);
	j_u64("referenced", p->referenced);
	j_u64("open", p->open_used);
	j_close('}');
	j_num("bytes_per_token", f.bpt);
	j_num("f16_bytes_per_token", f.bpt_f16);
	j_num("ratio_to_f16", f.bpt / f.bpt_f16);
	j_u64("lookup_tokens", p->lookup_tokens);
	j_u64("hit_tokens", p->hit_tokens);
	j_num("hit_rate", ratio(p->hit_tokens, p->lookup_tokens));
	j_u64("evictions", p->evictions);
	j_u64("alloc_failures", p->alloc_failures);
	j_u64("clients_attached", p->clients);
	j_open("clients", '[');
	for (size_t i = 0; sr && i < sr->n_clients; i++) {
		const Kvq__ClientStats *c = sr->clients[i];

		if (strcmp(c->pool, p->name))
			continue;
		j_open(NULL, '{');
		j_u64("id", c->id);
		j_u64("sealed_blocks", c->sealed_blocks);
		j_u64("open_blocks", c->open_blocks);
		j_u64("bytes", c->bytes);
		j_close('}');
	}
	j_close(']');
	j_close('}');
}

static void json_daemon(const Kvq__StatsReply *sr)
{
	j_str("daemon_version", sr->daemon_version);
	j_u64("uptime_ms", sr->uptime_ms);
	j_str("backend", sr->backend);
	j_i64("device", sr->device);
}

static void print_uptime(uint64_t ms)
{
	uint64_t s = ms / 1000;

	if (s >= 86400)
		printf("%llud ", (unsigned long long)(s / 86400));
	printf("%02llu:%02llu:%02llu", (unsigned long long)(s / 3600 % 24), (unsigned long long)(s / 60 % 60),
	       (unsigned long long)(s % 60));
}

static void print_daemon(const Kvq__StatsReply *sr)
{
	char d[16];

	printf("kvqd %s, up ", sr->daemon_version);
	print_uptime(sr->uptime_ms);
	printf(", backend %s, device %s\n", sr->backend, dev_str(sr->device, d, sizeof(d)));
}

static void print_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr)
{
	struct pool_fig f;
	char a[32], b[32], d[16];

	pool_figures(p, &f);
	printf("\npool %s\n", p->name);
	printf("  model           %s\n", p->model_id);
	printf("  policy          %s\n", p->policy);
	printf("  geometry        %u layers, %u KV heads, head dim %u, %u tokens/block, window %u (%s)\n", p->layers,
	       p->kv_heads, p->head_dim, p->block_tokens, p->window,
	       p->act == KVQ__DTYPE__DTYPE_BF16 ? "bf16" : "f16");
	printf("  backend         %s, device %s\n", p->backend, dev_str(p->device, d, sizeof(d)));
	printf("  capacity        %s, %u sealed + %u open slots, %.2f%% of device memory (%s)\n",
	       human_bytes((double)p->total_bytes, a, sizeof(a)), p->n_sealed, p->n_open,
	       100.0 * ratio(p->total_bytes, p->device_memory), human_bytes((double)p->device_memory, b, sizeof(b)));
	printf("  in use          %s, %.2f%% of device memory\n", human_bytes((double)f.used, a, sizeof(a)),
	       100.0 * ratio(f.used, p->device_memory));
	printf("  blocks          free %u, open %u, sealed %u, cached %u (referenced %u), reserved %u\n",
	       p->sealed_free, p->open_used, p->sealed_held, p->cached, p->referenced, p->sealed_reserved);
	printf("  bytes/token     %.1f sealed, f16 %.1f: ratio %.3f (%.2fx the tokens of f16)\n", f.bpt, f.bpt_f16,
	       f.bpt / f.bpt_f16, f.bpt_f16 / f.bpt);
	printf("  prefix          %llu of %llu tokens looked up were cached: hit rate %.1f%%\n",
	       (unsigned long long)p->hit_tokens, (unsigned long long)p->lookup_tokens,
	       p->lookup_tokens ? 100.0 * ratio(p->hit_tokens, p->lookup_tokens) : 0.0);
	printf("  evictions       %llu\n", (unsigned long long)p->evictions);
	printf("  alloc failures  %llu\n", (unsigned long long)p->alloc_failures);
	printf("  clients         %u\n", p->clients);
	for (size_t i = 0; sr && i < sr->n_clients; i++) {
		const Kvq__ClientStats *c = sr->clients[i];

		if (strcmp(c->pool, p->name))
			continue;
		printf("    client %-6llu %-16s pid %-7u uid %-6u sealed %-7u open %-5u %s%s\n",
		       (unsigned long long)c->id, c->name, c->pid, c->uid, c->sealed_blocks, c->open_blocks,
		       human_bytes((double)c->bytes, a, sizeof(a)), c->exiting ? " (exiting)" : "");
	}
}

/* ---------------------------------------------------------------- command line */

/*
 * The options every command takes, before the command or anywhere after it
 * (kvqctl --json stats, kvqctl stats --json); a command's own options come
 * after the command (pool create NAME --model ID ...).  "--" ends the
 * options: every word after it is an argument.
 */
#define GLOBAL_SHORT "s:jhV"
static const struct option global_opts[] = {
	{ "socket", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
	{ "help", no_argument, NULL, 'h' },         { "version", no_argument, NULL, 'V' },
};
#define N_GLOBAL (sizeof(global_opts) / sizeof(global_opts[0]))
#define MAX_OPTS 32

struct cmdline;

struct command {
	const char *name, *sub;        /* "pool", "create"; sub NULL: a one-word command */
	const char *args;              /* the synopsis after the command's words */
	const char *summary;           /* one line */
	const char *details;           /* its options and more, for COMMAND --help (or NULL) */
	const struct option *opts;     /* its own options, NULL-terminated (or NULL) */
	int (*run)(struct cmdline *);
};

/* A command line being read: cmd_next() returns the command's options one
 * at a time; at the end argc/argv hold the command's arguments. */
struct cmdline {
	const struct command *cmd;     /* NULL: before the command */
	int argc, status;              /* status: the exit status after CL_EXIT */
	char **argv;
	struct option lo[MAX_OPTS + 1];
};

enum { CL_END = -1, CL_EXIT = -2 };

static void usage(FILE *f);
static void command_help(FILE *f, const struct command *c);

/* The next option of the command (its val), CL_END when the options end
 * (cl->argc/argv: the arguments), CL_EXIT when kvqctl should exit with
 * cl->status (--help or --version printed, or a usage error). */
static int cmd_next(struct cmdline *cl)
{
	for (;;) {
		int ch = getopt_long(cl->argc, cl->argv, cl->cmd ? GLOBAL_SHORT : "+" GLOBAL_SHORT, cl->lo, NULL);

		switch (ch) {
		case -1:
			cl->argc -= optind;
			cl->argv += optind;
			return CL_END;
		case 's':
			opt_socket = optarg;
			continue;
		case 'j':
			opt_json = true;
			continue;
		case 'h':
			if (cl->cmd)
				command_help(stdout, cl->cmd);
			else
				usage(stdout);
			cl->status = 0;
			return CL_EXIT;
		case 'V':
			printf("kvqctl %s (protocol %u)\n", PACKAGE_VERSION, KVQ_PROTOCOL_VERSION);
			cl->status = 0;
			return CL_EXIT;
		case '?':   /* getopt said which option */
			if (cl->cmd)
				fprintf(stderr, "Try 'kvqctl %s%s%s --help'.\n", cl->cmd->name, cl->cmd->sub ? " " : "",
					cl->cmd->sub ? cl->cmd->sub : "");
			else
				fprintf(stderr, "Try 'kvqctl --help'.\n");
			cl->status = 2;
			return CL_EXIT;
		default:
			return ch;
		}
	}
}

/* A wrong number of arguments: the command's synopsis, exit status 2. */
static int cmd_usage(const struct cmdline *cl)
{
	const struct command *c = cl->cmd;

	return die("usage: kvqctl %s%s%s %s (kvqctl %s%s%s --help)", c->name, c->sub ? " " : "", c->sub ? c->sub : "",
		   c->args, c->name, c->sub ? " " : "", c->sub ? c->sub : ""), 2;
}

/* For a command without options of its own: reads the global ones, then
 * checks that min..max arguments follow.  -1 to go on, else the exit
 * status. */
static int cmd_args(struct cmdline *cl, int min, int max)
{
	if (cmd_next(cl) == CL_EXIT)
		return cl->status;
	if (cl->argc < min || cl->argc > max)
		return cmd_usage(cl);
	return -1;
}

/* ---------------------------------------------------------------- commands */

static int cmd_stats(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	int r = cmd_args(cl, 0, 1);

	if (r >= 0)
		return r;
	r = get_stats(cl->argc ? cl->argv[0] : NULL, &rep);
	if (r)
		return r;
	sr = rep->stats_reply;
	if (opt_json) {
		j_open(NULL, '{');
		json_daemon(sr);
		j_open("pools", '[');
		for (size_t i = 0; i < sr->n_pools; i++)
			json_pool(sr->pools[i], sr);
		j_close(']');
		j_close('}');
	} else {
		print_daemon(sr);
		if (!sr->n_pools)
			printf("no pools (pools are created by kvqd.conf or by the first attach)\n");
		for (size_t i = 0; i < sr->n_pools; i++)
			print_pool(sr->pools[i], sr);
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

static int cmd_pools(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	char a[32], b[32], d[16];
	int r = cmd_args(cl, 0, 0);

	if (r >= 0)
		return r;
	r = get_stats(NULL, &rep);
	if (r)
		return r;
	sr = rep->stats_reply;
	if (opt_json) {
		j_open(NULL, '{');
		json_daemon(sr);
		j_open("pools", '[');
		for (size_t i = 0; i < sr->n_pools; i++)
			json_pool(sr->pools[i], NULL);
		j_close(']');
		j_close('}');
	} else {
		printf("%-20s %-8s %-4s %-24s %12s %12s %7s %7s %7s\n", "POOL", "BACKEND", "DEV", "POLICY",
		       "CAPACITY", "IN USE", "CACHED", "HIT%", "CLIENTS");
		for (size_t i = 0; i < sr->n_pools; i++) {
			const Kvq__PoolStats *p = sr->pools[i];
			struct pool_fig f;

			pool_figures(p, &f);
			printf("%-20s %-8s %-4s %-24s %12s %12s %7u %7.1f %7u\n", p->name, p->backend,
			       dev_str(p->device, d, sizeof(d)), p->policy, human_bytes((double)p->total_bytes, a, sizeof(a)),
			       human_bytes((double)f.used, b, sizeof(b)), p->cached,
			       p->lookup_tokens ? 100.0 * ratio(p->hit_tokens, p->lookup_tokens) : 0.0, p->clients);
		}
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

static int cmd_clients(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	char a[32];
	int r = cmd_args(cl, 0, 1);

	if (r >= 0)
		return r;
	r = get_stats(cl->argc ? cl->argv[0] : NULL, &rep);
	if (r)
		return r;
	sr = rep->stats_reply;
	if (opt_json) {
		j_open(NULL, '{');
		j_open("clients", '[');
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Kvq__ClientStats *c = sr->clients[i];

			j_open(NULL, '{');
			j_u64("id", c->id);
			j_str("name", c->name);
			j_u64("pid", c->pid);
			j_u64("uid", c->uid);
			j_str("pool", c->pool);
			j_u64("sealed_blocks", c->sealed_blocks);
			j_u64("open_blocks", c->open_blocks);
			j_u64("bytes", c->bytes);
			j_bool("exiting", c->exiting);
			j_close('}');
		}
		j_close(']');
		j_close('}');
	} else {
		printf("%-6s %-16s %-8s %-6s %-20s %8s %6s %12s %s\n", "ID", "NAME", "PID", "UID", "POOL", "SEALED",
		       "OPEN", "BYTES", "STATE");
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Kvq__ClientStats *c = sr->clients[i];

			printf("%-6llu %-16s %-8u %-6u %-20s %8u %6u %12s %s\n", (unsigned long long)c->id,
			       *c->name ? c->name : "-", c->pid, c->uid, *c->pool ? c->pool : "-", c->sealed_blocks,
			       c->open_blocks, human_bytes((double)c->bytes, a, sizeof(a)),
			       c->exiting ? "exiting" : "live");
		}
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

/* Decimal count in [lo, hi]: 0 or -EINVAL. */
static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-' || *s == '+')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

/* evict POOL [N], and flush POOL (all that can go: no N). */
static int cmd_evict(struct cmdline *cl)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Evict ev = KVQ__EVICT__INIT;
	bool flush = !strcmp(cl->cmd->name, "flush");
	int r = cmd_args(cl, 1, flush ? 1 : 2);

	if (r >= 0)
		return r;
	ev.pool = cl->argv[0];
	if (cl->argc == 2 && parse_u32(cl->argv[1], 1, UINT32_MAX, &ev.blocks) < 0)
		return die("evict: '%s' is not a block count (1 or more)", cl->argv[1]), 2;
	e.body_case = KVQ__ENVELOPE__BODY_EVICT;
	e.evict = &ev;
	r = request(&e, KVQ__ENVELOPE__BODY_EVICT_REPLY, &rep);
	if (r)
		return r;
	if (opt_json) {
		j_open(NULL, '{');
		j_str("pool", ev.pool);
		j_u64("evicted", rep->evict_reply->evicted);
		j_close('}');
	} else {
		printf("pool %s: %u cached blocks evicted\n", ev.pool, rep->evict_reply->evicted);
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

static const char *opt_name(const struct option *lo, int ch)
{
	for (size_t i = 0; lo[i].name; i++)
		if (lo[i].val == ch)
			return lo[i].name;
	return "?";
}

/*
 * A size: a number (decimals allowed) with an optional unit.  K, M, G, T
 * and KiB .. TiB are powers of 1024, as in kvqd.conf; KB, MB, GB, TB are
 * powers of 1000, as GPU memory and model weights are usually quoted.
 */
static int parse_size(const char *s, double *ret)
{
	static const struct { const char *u; double m; } units[] = {
		{ "", 1 }, { "B", 1 }, { "K", 0x1p10 }, { "KiB", 0x1p10 }, { "M", 0x1p20 }, { "MiB", 0x1p20 },
		{ "G", 0x1p30 }, { "GiB", 0x1p30 }, { "T", 0x1p40 }, { "TiB", 0x1p40 }, { "KB", 1e3 },
		{ "MB", 1e6 }, { "GB", 1e9 }, { "TB", 1e12 },
	};
	char *end;
	double v;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || !isfinite(v))
		return -EINVAL;
	while (*end == ' ')
		end++;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcasecmp(end, units[i].u)) {
			if (v * units[i].m >= 0x1p64)
				return -ERANGE;
			*ret = v * units[i].m;
			return 0;
		}
	return -EINVAL;
}

/* A list of user or group names or numbers, comma-separated. */
static int parse_id_list(const char *s, bool group, uint32_t *ids, size_t *n)
{
	char buf[4096], *save = NULL;

	if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
		return -E2BIG;
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint32_t id;

		if (*n >= KVQ_PROTO_MAX_ACL)
			return -E2BIG;
		if (parse_u32(t, 0, UINT32_MAX - 1, &id) < 0) {
			struct passwd *pw = group ? NULL : getpwnam(t);
			struct group *gr = group ? getgrnam(t) : NULL;

			if (!pw && !gr)
				return die("no such %s '%s'", group ? "group" : "user", t), -ENOENT;
			id = group ? (uint32_t)gr->gr_gid : (uint32_t)pw->pw_uid;
		}
		ids[(*n)++] = id;
	}
	return 0;
}

static const struct option pool_create_opts[] = {
	{ "model", required_argument, NULL, 'm' },       { "layers", required_argument, NULL, 'L' },
	{ "kv-heads", required_argument, NULL, 'H' },    { "head-dim", required_argument, NULL, 'D' },
	{ "block-tokens", required_argument, NULL, 'B' }, { "policy", required_argument, NULL, 'p' },
	{ "window", required_argument, NULL, 'w' },      { "window-dtype", required_argument, NULL, 't' },
	{ "capacity", required_argument, NULL, 'c' },    { "sealed", required_argument, NULL, 'S' },
	{ "open", required_argument, NULL, 'O' },        { "backend", required_argument, NULL, 'b' },
	{ "device", required_argument, NULL, 'd' },      { "acl-uids", required_argument, NULL, 'u' },
	{ "acl-gids", required_argument, NULL, 'g' },    { NULL, 0, NULL, 0 },
};

static int cmd_pool_create(struct cmdline *cl)
{
	const struct option *lo = pool_create_opts;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__PoolAdd add = KVQ__POOL_ADD__INIT;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	uint32_t uids[KVQ_PROTO_MAX_ACL], gids[KVQ_PROTO_MAX_ACL], dev;
	size_t nu = 0, ng = 0;
	int ch, r;

	a.block_tokens = 32;
	a.layout_version = KVQ_LAYOUT_VERSION;
	a.create = &pc;
	pc.device = -1;
	while ((ch = cmd_next(cl)) >= 0) {
		double size;

		r = 0;
		switch (ch) {
		case 'm': a.model_id = optarg; break;
		case 'L': r = parse_u32(optarg, 1, KVQ_MAX_LAYERS, &a.layers); break;
		case 'H': r = parse_u32(optarg, 1, KVQ_MAX_HEADS, &a.kv_heads); break;
		case 'D': r = parse_u32(optarg, 1, KVQ_MAX_HEAD_DIM, &a.head_dim); break;
		case 'B': r = parse_u32(optarg, 1, KVQ_MAX_BLOCK_TOKENS, &a.block_tokens); break;
		case 'p': a.policy = optarg; break;
		case 'w': r = parse_u32(optarg, 1, UINT32_MAX, &a.window); break;
		case 't':
			if (!strcmp(optarg, "f16"))
				a.act = KVQ__DTYPE__DTYPE_F16;
			else if (!strcmp(optarg, "bf16"))
				a.act = KVQ__DTYPE__DTYPE_BF16;
			else
				r = -EINVAL;
			break;
		case 'c':
			/* binary units, as kvqd.conf */
			r = parse_size(optarg, &size);
			add.capacity = (uint64_t)size;
			break;
		case 'S': r = parse_u32(optarg, 1, KVQ_MAX_SLOTS, &pc.n_sealed); break;
		case 'O': r = parse_u32(optarg, 1, KVQ_MAX_SLOTS, &pc.n_open); break;
		case 'b':
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda"))
				r = -EINVAL;
			pc.backend = optarg;
			break;
		case 'd':
			r = parse_u32(optarg, 0, 1023, &dev);
			pc.device = (int32_t)dev;
			break;
		case 'u':
			r = parse_id_list(optarg, false, uids, &nu);
			if (r == -ENOENT)
				return 1;
			break;
		case 'g':
			r = parse_id_list(optarg, true, gids, &ng);
			if (r == -ENOENT)
				return 1;
			break;
		}
		if (r < 0)
			return die("pool create: bad value '%s' for --%s", optarg, opt_name(lo, ch)), 2;
	}
	if (ch == CL_EXIT)
		return cl->status;
	if (cl->argc != 1)
		return cmd_usage(cl);
	a.pool = cl->argv[0];
	if (!a.model_id || !a.layers || !a.kv_heads || !a.head_dim || !a.policy)
		return die("pool create needs --model, --layers, --kv-heads, --head-dim and --policy"), 2;
	if (!pc.n_sealed != !pc.n_open)
		return die("pool create: give both --sealed and --open, or neither"), 2;
	add.spec = &a;
	add.acl_uids = uids;
	add.n_acl_uids = nu;
	add.acl_gids = gids;
	add.n_acl_gids = ng;
	e.body_case = KVQ__ENVELOPE__BODY_POOL_ADD;
	e.pool_add = &add;
	r = request(&e, KVQ__ENVELOPE__BODY_POOL_ADD_REPLY, &rep);
	if (r)
		return r;
	if (opt_json) {
		j_open(NULL, '{');
		j_open("pools", '[');
		json_pool(rep->pool_add_reply->pool, NULL);
		j_close(']');
		j_close('}');
	} else {
		char b[32];

		printf("pool %s created: %s, %u sealed + %u open slots\n", a.pool,
		       human_bytes((double)rep->pool_add_reply->pool->total_bytes, b, sizeof(b)),
		       rep->pool_add_reply->pool->n_sealed, rep->pool_add_reply->pool->n_open);
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

static int cmd_pool_drop(struct cmdline *cl)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__PoolDrop d = KVQ__POOL_DROP__INIT;
	int r = cmd_args(cl, 1, 1);

	if (r >= 0)
		return r;
	d.pool = cl->argv[0];
	e.body_case = KVQ__ENVELOPE__BODY_POOL_DROP;
	e.pool_drop = &d;
	r = request(&e, KVQ__ENVELOPE__BODY_POOL_DROP_REPLY, &rep);
	if (r)
		return r;
	if (opt_json) {
		j_open(NULL, '{');
		j_str("pool", d.pool);
		j_bool("dropped", true);
		j_close('}');
	} else {
		printf("pool %s dropped\n", d.pool);
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

/* ---------------------------------------------------------------- plan */

struct model {
	const char *name;
	uint32_t layers, kv_heads, head_dim;
	double params;
};

/* Geometry from each model's published configuration. */
static const struct model presets[] = {
	{ "Llama-3-8B", 32, 8, 128, 8.03e9 },
	{ "Llama-3-70B", 80, 8, 128, 70.55e9 },
	{ "SmolLM2-135M", 30, 3, 64, 134.5e6 },
};

struct plan_row {
	char policy[KVQ_POLICY_MAX_LEN + 1];
	double bytes_per_value;      /* K and V averaged over layers (kvq_fmt_bytes_per_value) */
	double bytes_per_token;      /* sealed, all layers (layout) */
	double seq_bytes;            /* one sequence of the context length, as the pool counts it */
	double tokens;               /* sealed tokens the KV budget holds */
	uint64_t sequences;
};

/*
 * One policy's figures from the pool layout: a sequence of n tokens holds
 * S(n)/B sealed blocks and its open window in open blocks, each open block
 * with the sealed slot reserved for its seal (what kvqd allocates and what
 * quotas count).
 */
static int plan_policy(const struct model *m, uint32_t B, const char *policy, uint32_t n, double budget,
		       struct plan_row *row)
{
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = m->layers, .kv_heads = m->kv_heads, .head_dim = m->head_dim,
		.block_tokens = B, .n_sealed = 1, .n_open = 1, .act = KVQ_DT_F16, .policy = &pol };
	struct kvq_layout *L = NULL;
	char err[256];
	uint32_t S;
	double bpv = 0;

	if (kvq_policy_parse(policy, m->layers, &pol, err, sizeof(err)) < 0)
		return die("plan: policy %s: %s", policy, err);
	if (kvq_layout_new(&lp, &L, err, sizeof(err)) < 0)
		return die("plan: policy %s: %s", policy, err);
	kvq_policy_format(&pol, row->policy, sizeof(row->policy));
	for (uint32_t l = 0; l < m->layers; l++)
		bpv += kvq_fmt_bytes_per_value(pol.k[l], 0, B, m->head_dim) +
		       kvq_fmt_bytes_per_value(pol.v[l], 1, B, m->head_dim);
	row->bytes_per_value = bpv / (2.0 * m->layers);
	row->bytes_per_token = (double)L->sealed_block_bytes / B;
	S = kvq_layout_split(L, n);
	row->seq_bytes = (double)(S / B) * (double)L->sealed_block_bytes +
			 (double)((n - S + B - 1) / B) * (double)(L->open_block_bytes + L->sealed_block_bytes);
	row->tokens = budget > 0 ? budget / row->bytes_per_token : 0;
	row->sequences = budget > 0 ? (uint64_t)floor(budget / row->seq_bytes) : 0;
	kvq_layout_free(L);
	return 0;
}

static const struct option plan_opts[] = {
	{ "model", required_argument, NULL, 'm' },       { "layers", required_argument, NULL, 'L' },
	{ "kv-heads", required_argument, NULL, 'H' },    { "head-dim", required_argument, NULL, 'D' },
	{ "params", required_argument, NULL, 'P' },      { "weight-bits", required_argument, NULL, 'w' },
	{ "gpu-memory", required_argument, NULL, 'g' },  { "gpus", required_argument, NULL, 'n' },
	{ "utilization", required_argument, NULL, 'u' }, { "context", required_argument, NULL, 'c' },
	{ "block-tokens", required_argument, NULL, 'B' }, { "policy", required_argument, NULL, 'p' },
	{ NULL, 0, NULL, 0 },
};

static int cmd_plan(struct cmdline *cl)
{
	const struct option *lo = plan_opts;
	static const char *const uniform[] = { "f16", "bf16", "int8", "fp8", "fp8e5m2", "int4g32", "int4g64",
					       "int4g128", "kivi4", "kivi2" };
	struct model m = { .name = "custom" };
	const char *policies[MAX_POLICIES + 10];
	struct plan_row rows[MAX_POLICIES + 10];
	size_t n_pol = 0, n_extra = 0;
	const char *extra[MAX_POLICIES];
	double wbits = 16, gpu_mem = 80e9, util = 0.9, weights, usable, budget, params = 0;
	uint32_t gpus = 1, context = 8192, B = 32, L = 0, H = 0, D = 0;
	bool preset = false;
	int ch, r;

	while ((ch = cmd_next(cl)) >= 0) {
		char *end;

		r = 0;
		switch (ch) {
		case 'm':
			for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
				if (!strcasecmp(optarg, presets[i].name)) {
					m = presets[i];
					preset = true;
				}
			if (!preset)
				return die("plan: unknown model '%s' (presets: Llama-3-8B, Llama-3-70B, SmolLM2-135M; "
					   "or give --layers, --kv-heads, --head-dim and --params)", optarg), 2;
			break;
		case 'L': r = parse_u32(optarg, 1, KVQ_MAX_LAYERS, &L); break;
		case 'H': r = parse_u32(optarg, 1, KVQ_MAX_HEADS, &H); break;
		case 'D': r = parse_u32(optarg, 1, KVQ_MAX_HEAD_DIM, &D); break;
		case 'P':
			/* 8e9, 8B, 135M: a parameter count, not bytes */
			errno = 0;
			params = strtod(optarg, &end);
			if (!strcasecmp(end, "B"))
				params *= 1e9;
			else if (!strcasecmp(end, "M"))
				params *= 1e6;
			else if (*end)
				r = -EINVAL;
			if (errno || !(params > 0) || params > 1e15)
				r = -EINVAL;
			break;
		case 'w':
			errno = 0;
			wbits = strtod(optarg, &end);
			if (errno || *end || !(wbits >= 1 && wbits <= 32))
				r = -EINVAL;
			break;
		case 'g':
			r = parse_size(optarg, &gpu_mem);
			if (r == 0 && !(gpu_mem > 0))
				r = -EINVAL;
			break;
		case 'n': r = parse_u32(optarg, 1, 1024, &gpus); break;
		case 'u':
			errno = 0;
			util = strtod(optarg, &end);
			if (*end == '%') {
				util /= 100;
				end++;
			}
			if (errno || *end || !(util > 0 && util <= 1))
				r = -EINVAL;
			break;
		case 'c': r = parse_u32(optarg, 1, 1u << 24, &context); break;
		case 'B':
			r = parse_u32(optarg, 16, KVQ_MAX_BLOCK_TOKENS, &B);
			if (r == 0 && B % 16)
				r = -EINVAL;
			break;
		case 'p':
			if (n_extra >= MAX_POLICIES)
				return die("plan: at most %d --policy options", MAX_POLICIES), 2;
			extra[n_extra++] = optarg;
			break;
		}
		if (r < 0)
			return die("plan: bad value '%s' for --%s", optarg, opt_name(lo, ch)), 2;
	}
	if (ch == CL_EXIT)
		return cl->status;
	if (cl->argc)
		return die("plan: unexpected argument %s", cl->argv[0]), 2;
	if (L)
		m.layers = L;
	if (H)
		m.kv_heads = H;
	if (D)
		m.head_dim = D;
	if (params > 0)
		m.params = params;
	if (!m.layers || !m.kv_heads || !m.head_dim || !(m.params > 0))
		return die("plan: give --model PRESET, or --layers, --kv-heads, --head-dim and --params"), 2;
	if (preset && (L || H || D || params > 0))
		m.name = "custom (from a preset)";

	weights = m.params * wbits / 8.0;
	usable = gpu_mem * gpus * util;
	budget = usable - weights;
	for (size_t i = 0; i < sizeof(uniform) / sizeof(uniform[0]); i++)
		policies[n_pol++] = uniform[i];
	for (size_t i = 0; i < n_extra; i++)
		policies[n_pol++] = extra[i];
	for (size_t i = 0; i < n_pol; i++) {
		/* some formats need head dims they divide (int4g128 on a 64-wide head) */
		char err[256];
		struct kvq_policy pol;

		if (i < sizeof(uniform) / sizeof(uniform[0]) &&
		    (kvq_policy_parse(policies[i], m.layers, &pol, err, sizeof(err)) < 0 ||
		     kvq_fmt_group(pol.k[0], 0) > m.head_dim || kvq_fmt_group(pol.v[0], 1) > m.head_dim ||
		     m.head_dim % (kvq_fmt_group(pol.k[0], 0) ? kvq_fmt_group(pol.k[0], 0) : 1) ||
		     m.head_dim % (kvq_fmt_group(pol.v[0], 1) ? kvq_fmt_group(pol.v[0], 1) : 1))) {
			rows[i].policy[0] = 0;
			continue;
		}
		if (plan_policy(&m, B, policies[i], context, budget, &rows[i]))
			return 1;
	}

	if (opt_json) {
		j_open(NULL, '{');
		j_open("model", '{');
		j_str("name", m.name);
		j_u64("layers", m.layers);
		j_u64("kv_heads", m.kv_heads);
		j_u64("head_dim", m.head_dim);
		j_num("params", m.params);
		j_close('}');
		j_num("weight_bits", wbits);
		j_num("weights_bytes", weights);
		j_num("gpu_memory_bytes", gpu_mem);
		j_u64("gpus", gpus);
		j_num("utilization", util);
		j_num("kv_budget_bytes", budget);
		j_bool("fits", budget > 0);
		j_u64("context_tokens", context);
		j_u64("block_tokens", B);
		j_open("policies", '[');
		for (size_t i = 0; i < n_pol; i++) {
			if (!rows[i].policy[0])
				continue;
			j_open(NULL, '{');
			j_str("policy", rows[i].policy);
			j_num("bytes_per_value", rows[i].bytes_per_value);
			j_num("kv_bytes_per_token", rows[i].bytes_per_token);
			j_num("ratio_to_f16", rows[i].bytes_per_token / rows[0].bytes_per_token);
			j_num("kv_bytes_per_sequence", rows[i].seq_bytes);
			j_num("tokens_in_budget", floor(rows[i].tokens));
			j_u64("sequences", rows[i].sequences);
			j_close('}');
		}
		j_close(']');
		j_close('}');
		return 0;
	}
	printf("model     %s: %u layers, %u KV heads, head dim %u, %.4g B parameters\n", m.name, m.layers,
	       m.kv_heads, m.head_dim, m.params / 1e9);
	printf("weights   %.4g-bit: %.2f GB\n", wbits, weights / 1e9);
	printf("memory    %u x %.2f GB at %.0f%% = %.2f GB; KV budget %.2f GB\n", gpus, gpu_mem / 1e9, util * 100,
	       usable / 1e9, budget / 1e9);
	printf("context   %u tokens, blocks of %u tokens\n", context, B);
	if (budget <= 0)
		printf("the weights do not fit: no room for KV\n");
	printf("\n%-26s %9s %12s %7s %13s %14s %10s\n", "POLICY", "B/VALUE", "KV/TOKEN", "VS F16", "KV/SEQUENCE",
	       "TOKENS", "SEQUENCES");
	for (size_t i = 0; i < n_pol; i++) {
		if (!rows[i].policy[0])
			continue;
		printf("%-26s %9.4f %10.0f B %6.2fx %10.2f MB %14.0f %10llu\n", rows[i].policy,
		       rows[i].bytes_per_value, rows[i].bytes_per_token,
		       rows[0].bytes_per_token / rows[i].bytes_per_token, rows[i].seq_bytes / 1e6, floor(rows[i].tokens),
		       (unsigned long long)rows[i].sequences);
	}
	return 0;
}

/* ---------------------------------------------------------------- main */

static const struct command commands[] = {
	{ "stats", NULL, "[POOL]", "daemon and pools: blocks, bytes per token, hits, evictions, clients", NULL, NULL,
	  cmd_stats },
	{ "pools", NULL, "", "one line per pool", NULL, NULL, cmd_pools },
	{ "clients", NULL, "[POOL]", "connections and the blocks they hold", NULL, NULL, cmd_clients },
	{ "evict", NULL, "POOL [N]", "evict up to N unreferenced cached blocks (admin)", NULL, NULL, cmd_evict },
	{ "flush", NULL, "POOL", "evict every unreferenced cached block (admin)", NULL, NULL, cmd_evict },
	{ "pool", "create", "NAME --model ID --layers L --kv-heads H --head-dim D --policy P\n"
	  "       [--block-tokens B] [--window R] [--window-dtype f16|bf16] [--capacity SIZE]\n"
	  "       [--sealed N --open N] [--backend host|cuda] [--device N]\n"
	  "       [--acl-uids LIST] [--acl-gids LIST]",
	  "create a pool (admin)",
	  "  --block-tokens B     tokens per block (default 32)\n"
	  "  --window R           the open window in tokens (default: the policy's)\n"
	  "  --window-dtype T     f16 or bf16: the open window's values\n"
	  "  --capacity SIZE      bytes (K, M, G, T: powers of 1024; default create_capacity)\n"
	  "  --sealed N --open N  slot counts instead of --capacity (both or neither)\n"
	  "  --backend B          host or cuda;  --device N  the GPU\n"
	  "  --acl-uids LIST      users who may attach (names or numbers, comma-separated)\n"
	  "  --acl-gids LIST      groups who may attach (default: the caller, root and kvqd)\n",
	  pool_create_opts, cmd_pool_create },
	{ "pool", "drop", "NAME", "free a pool nobody is attached to (admin)", NULL, NULL, cmd_pool_drop },
	{ "plan", NULL, "[--model Llama-3-8B|Llama-3-70B|SmolLM2-135M] [--layers L] [--kv-heads H]\n"
	  "       [--head-dim D] [--params N] [--weight-bits BITS] [--gpu-memory SIZE]\n"
	  "       [--gpus N] [--utilization U] [--context TOKENS] [--block-tokens B]\n"
	  "       [--policy P]...",
	  "memory for weights and KV; sequences per KV policy (no daemon needed)",
	  "  --model M            a preset, or --layers, --kv-heads, --head-dim and --params\n"
	  "                       (these also override a preset's values; --params 8e9, 8B, 135M)\n"
	  "  --weight-bits BITS   bits per weight (default 16)\n"
	  "  --gpu-memory SIZE    per GPU (KB, MB, GB: powers of 1000; default 80GB)\n"
	  "  --gpus N             GPUs (default 1)\n"
	  "  --utilization U      share of GPU memory to plan with: 0.9 or 90% (default)\n"
	  "  --context TOKENS     tokens per sequence (default 8192)\n"
	  "  --block-tokens B     tokens per block (default 32)\n"
	  "  --policy P           a KV policy as in kvqd.conf(5), beside every format (repeatable)\n",
	  plan_opts, cmd_plan },
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))
/* room for the global options, a command's own and the terminating row */
_Static_assert(N_GLOBAL + sizeof(pool_create_opts) / sizeof(pool_create_opts[0]) <= MAX_OPTS + 1 &&
	       N_GLOBAL + sizeof(plan_opts) / sizeof(plan_opts[0]) <= MAX_OPTS + 1, "MAX_OPTS is too small");

static const char global_help[] =
	"  -s, --socket PATH   kvqd's socket (default $KVQ_SOCKET, " KVQ_ROOT_SOCKET " for root,\n"
	"                      $XDG_RUNTIME_DIR/kvqd.sock otherwise)\n"
	"  -j, --json          one JSON document on standard output\n"
	"  -h, --help          this text\n"
	"  -V, --version       the version\n"
	"  --                  the end of the options: the words after it are arguments\n";

static void synopsis(FILE *f, const struct command *c)
{
	fprintf(f, "%s%s%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "", *c->args ? " " : "", c->args);
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvqctl [OPTION]... COMMAND [ARG]... [OPTION]...\n"
		   "Report on and manage the KV-cache pools of kvqd.\n\n"
		   "Options (before the command or after it):\n%s\n"
		   "Commands (kvqctl COMMAND --help: one command and its options):\n", global_help);
	for (size_t i = 0; i < N_COMMANDS; i++) {
		fputs("  ", f);
		synopsis(f, &commands[i]);
		fprintf(f, "\n        %s\n", commands[i].summary);
	}
}

static void command_help(FILE *f, const struct command *c)
{
	fputs("Usage: kvqctl [OPTION]... ", f);
	synopsis(f, c);
	fprintf(f, "\n%c%s.\n", toupper((unsigned char)c->summary[0]), c->summary + 1);
	if (c->details)
		fprintf(f, "\n%s", c->details);
	fprintf(f, "\nOptions of every command, here or before the command:\n%s", global_help);
}

int main(int argc, char **argv)
{
	struct cmdline cl = { .argc = argc, .argv = argv };
	const struct command *c = NULL;
	bool has_sub = false;
	size_t n = 0;
	int words;

	memcpy(cl.lo, global_opts, sizeof(global_opts));

	/* the options before the command ("+": stop at the command) */
	if (cmd_next(&cl) == CL_EXIT)
		return cl.status;
	if (cl.argc < 1) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < N_COMMANDS && !c; i++) {
		if (strcmp(cl.argv[0], commands[i].name))
			continue;
		has_sub |= commands[i].sub != NULL;
		if (!commands[i].sub || (cl.argc > 1 && !strcmp(cl.argv[1], commands[i].sub)))
			c = &commands[i];
	}
	if (!c && has_sub && cl.argc > 1 && (!strcmp(cl.argv[1], "--help") || !strcmp(cl.argv[1], "-h"))) {
		/* kvqctl pool --help: each of its commands */
		for (size_t i = 0; i < N_COMMANDS; i++)
			if (!strcmp(cl.argv[0], commands[i].name))
				command_help(stdout, &commands[i]);
		return 0;
	}
	if (!c) {
		die("unknown command '%s%s%s' (kvqctl --help lists them)", cl.argv[0], has_sub && cl.argc > 1 ? " " : "",
		    has_sub && cl.argc > 1 ? cl.argv[1] : "");
		return 2;
	}
	/* the command's own options beside the global ones; getopt_long
	 * reads from argv[1], so the slot of the command's last word holds
	 * the program's name (getopt's messages start with it) */
	words = c->sub ? 2 : 1;
	for (; c->opts && c->opts[n].name; n++)
		cl.lo[N_GLOBAL + n] = c->opts[n];
	cl.cmd = c;
	cl.argc -= words - 1;
	cl.argv += words - 1;
	cl.argv[0] = (char *)PROG;
	optind = 0;   /* 0: GNU getopt starts over */
	return c->run(&cl);
}
