/* SPDX-License-Identifier: Apache-2.0 */
/* kvqctl's commands that ask kvqd: one request on a new connection each. */
#include <config.h>

#include <errno.h>
#include <grp.h>
#include <math.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "codebook.h"
#include "conn.h"
#include "json.h"
#include "kvqctl.h"
#include "layout.h"
#include "memfd.h"
#include "show.h"

#define TIMEOUT_MS 10000

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

/* One request on a new connection, with fd (-1: none; not taken) sent with
 * it: 0 with *ret (the reply of type want), or 1 after printing why. */
static int request_fd(const struct cmdline *cl, Kvq__Envelope *req, int fd, Kvq__Envelope__BodyCase want,
		      Kvq__Envelope **ret)
{
	struct kvq_conn c;
	int r;

	kvq_conn_init(&c, TIMEOUT_MS);
	r = kvq_conn_open(&c, cl->socket, PROG);
	if (r == 0)
		r = kvq_conn_call_fd(&c, req, fd, want, ret);
	if (r < 0)
		r = conn_fault(&c, r);
	kvq_conn_close(&c);
	return r;
}

static int request(const struct cmdline *cl, Kvq__Envelope *req, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	return request_fd(cl, req, -1, want, ret);
}

/* stats, pools, clients: the global options and at most max arguments
 * (a pool), then one Stats.  -1 with *ret to go on, else the exit status. */
static int stats_request(struct cmdline *cl, int max, Kvq__Envelope **ret)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Stats s = KVQ__STATS__INIT;
	int r = cmd_args(cl, 0, max);

	if (r >= 0)
		return r;
	s.pool = cl->argc ? cl->argv[0] : "";
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = request(cl, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, ret);
	return r ? r : -1;
}

/* ---------------------------------------------------------------- commands */

int cmd_stats(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	int r = stats_request(cl, 1, &rep);

	if (r >= 0)
		return r;
	sr = rep->stats_reply;
	if (cl->json) {
		json_stats(sr, true);
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

int cmd_pools(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	char a[32], b[32], d[16], h[2 * KVQ_PROTO_SHA256 + 1];
	int r = stats_request(cl, 0, &rep);

	if (r >= 0)
		return r;
	sr = rep->stats_reply;
	if (cl->json) {
		json_stats(sr, false);
	} else {
		printf("%-20s %-8s %-4s %-24s %12s %12s %7s %13s %7s %7s %-9s\n", "POOL", "BACKEND", "DEV", "POLICY",
		       "CAPACITY", "IN USE", "CACHED", "SINKS", "HIT%", "CLIENTS", "CODEBOOKS");
		for (size_t i = 0; i < sr->n_pools; i++) {
			const Kvq__PoolStats *p = sr->pools[i];
			const struct figs fs = { p, NULL };
			uint64_t lookup = fig(&fs, "lookup_tokens");
			struct pool_fig f;
			char sk[32] = "-";

			pool_figures(&fs, &f);
			/* sink slots in use (held or cached) of all */
			if (p->sink_blocks)
				snprintf(sk, sizeof(sk), "%u/%u", fig32(&fs, "sink_held") + fig32(&fs, "sink_cached"),
					 fig32(&fs, "n_sink"));
			printf("%-20s %-8s %-4s %-24s %12s %12s %7u %13s %7.1f %7u %-9s\n", p->name, p->backend,
			       dev_str(p->device, d, sizeof(d)), p->policy,
			       human_bytes((double)fig(&fs, "total_bytes"), a, sizeof(a)),
			       human_bytes((double)f.used, b, sizeof(b)), fig32(&fs, "cached") + fig32(&fs, "sink_cached"),
			       sk, lookup ? 100.0 * ratio(fig(&fs, "hit_tokens"), lookup) : 0.0, fig32(&fs, "clients"),
			       sha_str(&p->codebooks_sha256, 4, h, sizeof(h)));
		}
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

int cmd_clients(struct cmdline *cl)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__StatsReply *sr;
	char a[32];
	int r = stats_request(cl, 1, &rep);

	if (r >= 0)
		return r;
	sr = rep->stats_reply;
	if (cl->json) {
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
			j_u64("sink_blocks", c->sink_blocks);
			j_u64("bytes", c->bytes);
			j_bool("exiting", c->exiting);
			j_close('}');
		}
		j_close(']');
		j_close('}');
	} else {
		printf("%-6s %-16s %-8s %-6s %-20s %8s %6s %6s %12s %s\n", "ID", "NAME", "PID", "UID", "POOL", "SEALED",
		       "OPEN", "SINK", "BYTES", "STATE");
		for (size_t i = 0; i < sr->n_clients; i++) {
			const Kvq__ClientStats *c = sr->clients[i];

			printf("%-6llu %-16s %-8u %-6u %-20s %8u %6u %6u %12s %s\n", (unsigned long long)c->id,
			       *c->name ? c->name : "-", c->pid, c->uid, *c->pool ? c->pool : "-", c->sealed_blocks,
			       c->open_blocks, c->sink_blocks, human_bytes((double)c->bytes, a, sizeof(a)),
			       c->exiting ? "exiting" : "live");
		}
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

/* evict POOL [N], flush POOL (all that can go: no N), demote POOL [N] (to
 * the pool's host tier). */
int cmd_evict(struct cmdline *cl)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Evict ev = KVQ__EVICT__INIT;
	bool flush = !strcmp(cl->cmd->name, "flush");
	int r = cmd_args(cl, 1, flush ? 1 : 2);

	if (r >= 0)
		return r;
	ev.pool = cl->argv[0];
	ev.demote = !strcmp(cl->cmd->name, "demote");
	if (cl->argc == 2 && parse_u32(cl->argv[1], 1, UINT32_MAX, &ev.blocks) < 0)
		return die("%s: '%s' is not a block count (1 or more)", cl->cmd->name, cl->argv[1]), 2;
	e.body_case = KVQ__ENVELOPE__BODY_EVICT;
	e.evict = &ev;
	r = request(cl, &e, KVQ__ENVELOPE__BODY_EVICT_REPLY, &rep);
	if (r)
		return r;
	if (cl->json) {
		j_open(NULL, '{');
		j_str("pool", ev.pool);
		j_u64(ev.demote ? "demoted" : "evicted", rep->evict_reply->evicted);
		j_close('}');
	} else {
		printf("pool %s: %u cached blocks %s\n", ev.pool, rep->evict_reply->evicted,
		       ev.demote ? "sent to the host tier" : "evicted");
	}
	kvq_frame_envelope_free(rep);
	return 0;
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

const struct option pool_create_opts[] = {
	{ "model", required_argument, NULL, 'm' },       { "layers", required_argument, NULL, 'L' },
	{ "kv-heads", required_argument, NULL, 'H' },    { "head-dim", required_argument, NULL, 'D' },
	{ "block-tokens", required_argument, NULL, 'B' }, { "policy", required_argument, NULL, 'p' },
	{ "window", required_argument, NULL, 'w' },      { "window-dtype", required_argument, NULL, 't' },
	{ "capacity", required_argument, NULL, 'c' },    { "sealed", required_argument, NULL, 'S' },
	{ "open", required_argument, NULL, 'O' },        { "backend", required_argument, NULL, 'b' },
	{ "device", required_argument, NULL, 'd' },      { "acl-uids", required_argument, NULL, 'u' },
	{ "acl-gids", required_argument, NULL, 'g' },    { "codebooks", required_argument, NULL, 'k' },
	{ "sink-blocks", required_argument, NULL, 'K' }, { "sinks", required_argument, NULL, 'N' },
	{ "host-capacity", required_argument, NULL, 'T' },
	{ NULL, 0, NULL, 0 },
};
CTL_OPTS_FIT(pool_create_opts);

int cmd_pool_create(struct cmdline *cl)
{
	const struct option *lo = pool_create_opts;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__PoolAdd add = KVQ__POOL_ADD__INIT;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	uint32_t uids[KVQ_PROTO_MAX_ACL], gids[KVQ_PROTO_MAX_ACL], dev;
	const char *codebooks = NULL;
	char err[512];
	size_t nu = 0, ng = 0;
	int ch, r, cb_fd = -1;

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
		case 'T':
			r = parse_size(optarg, &size);
			pc.host_capacity = (uint64_t)size;
			break;
		case 'S': r = parse_u32(optarg, 1, KVQ_MAX_SLOTS, &pc.n_sealed); break;
		case 'O': r = parse_u32(optarg, 1, KVQ_MAX_SLOTS, &pc.n_open); break;
		case 'K': r = parse_u32(optarg, 0, 1, &a.sink_blocks); break;
		case 'N': r = parse_u32(optarg, 1, KVQ_MAX_SLOTS, &pc.n_sink); break;
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
		case 'k': codebooks = optarg; break;
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
	if (pc.n_sink && (!pc.n_sealed || !a.sink_blocks))
		return die("pool create: --sinks goes with --sink-blocks 1, --sealed and --open"), 2;
	/* sealed: what kvqd checks is what it copies into the pool */
	if (codebooks) {
		r = kvq_memfd_from_file(codebooks, KVQ_CB_MAX_FILE, "kvq-codebooks", &cb_fd, err, sizeof(err));
		if (r < 0)
			return die("pool create: codebooks: %s", err);
		a.codebooks = true;
	}
	add.spec = &a;
	add.acl_uids = uids;
	add.n_acl_uids = nu;
	add.acl_gids = gids;
	add.n_acl_gids = ng;
	e.body_case = KVQ__ENVELOPE__BODY_POOL_ADD;
	e.pool_add = &add;
	r = request_fd(cl, &e, cb_fd, KVQ__ENVELOPE__BODY_POOL_ADD_REPLY, &rep);
	if (cb_fd >= 0)
		close(cb_fd);
	if (r)
		return r;
	if (cl->json) {
		j_open(NULL, '{');
		j_open("pools", '[');
		json_pool(rep->pool_add_reply->pool, NULL);
		j_close(']');
		j_close('}');
	} else {
		const Kvq__PoolStats *p = rep->pool_add_reply->pool;
		const struct figs fs = { p, NULL };
		char b[32], h[2 * KVQ_PROTO_SHA256 + 1];

		printf("pool %s created: %s, %u sealed + %u open slots", a.pool,
		       human_bytes((double)fig(&fs, "total_bytes"), b, sizeof(b)), fig32(&fs, "n_sealed"),
		       fig32(&fs, "n_open"));
		if (fig(&fs, "n_sink"))
			printf(" + %u sink slots", fig32(&fs, "n_sink"));
		if (p->codebooks_sha256.len)
			printf(", codebooks sha256 %s...", sha_str(&p->codebooks_sha256, 8, h, sizeof(h)));
		printf("\n");
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

int cmd_pool_drop(struct cmdline *cl)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__PoolDrop d = KVQ__POOL_DROP__INIT;
	int r = cmd_args(cl, 1, 1);

	if (r >= 0)
		return r;
	d.pool = cl->argv[0];
	e.body_case = KVQ__ENVELOPE__BODY_POOL_DROP;
	e.pool_drop = &d;
	r = request(cl, &e, KVQ__ENVELOPE__BODY_POOL_DROP_REPLY, &rep);
	if (r)
		return r;
	if (cl->json) {
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
