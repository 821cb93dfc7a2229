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

#define TIMEOUT_MS 10000

/* ---------------------------------------------------------------- output */

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
	/* a sink slot is an open slice */
	f->used = ((uint64_t)p->sealed_held + p->cached + p->sealed_reserved) * p->sealed_block_bytes +
		  ((uint64_t)p->open_used + p->sink_held + p->sink_cached) * p->open_block_bytes;
}

/* A pool's codebooks_sha256 in hex, its first n bytes (all: 32), or "-"
 * when it has none. */
static const char *sha_str(const ProtobufCBinaryData *h, size_t n, char *buf, size_t len)
{
	static const char digits[] = "0123456789abcdef";

	if (!h->len || len < 2) {
		snprintf(buf, len, "-");
		return buf;
	}
	if (n > h->len)
		n = h->len;
	if (2 * n + 1 > len)
		n = (len - 1) / 2;
	for (size_t i = 0; i < n; i++) {
		buf[2 * i] = digits[h->data[i] >> 4];
		buf[2 * i + 1] = digits[h->data[i] & 15];
	}
	buf[2 * n] = 0;
	return buf;
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
	char h[2 * KVQ_PROTO_SHA256 + 1];

	pool_figures(p, &f);
	j_open(NULL, '{');
	j_str("name", p->name);
	j_str("model_id", p->model_id);
	j_str("policy", p->policy);
	/* "" without codebooks */
	j_str("codebooks_sha256", p->codebooks_sha256.len ? sha_str(&p->codebooks_sha256, KVQ_PROTO_SHA256, h, sizeof(h))
							   : "");
	/* "" and 0, 0 for a pool of no tensor-parallel group */
	j_str("group", p->group);
	j_u64("rank", p->rank);
	j_u64("world_size", p->world_size);
	j_str("backend", p->backend);
	j_i64("device", p->device);
	j_u64("layers", p->layers);
	j_u64("kv_heads", p->kv_heads);
	j_u64("head_dim", p->head_dim);
	j_u64("block_tokens", p->block_tokens);
	j_u64("window", p->window);
	j_str("window_dtype", p->act == KVQ__DTYPE__DTYPE_BF16 ? "bf16" : "f16");
	j_u64("sink_blocks", p->sink_blocks);
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
	/* sink slots (0 without sink blocks): an open slice each */
	j_u64("sink_slots", p->n_sink);
	j_u64("sink_free", p->sink_free);
	j_u64("sink", p->sink_held);
	j_u64("sink_cached", p->sink_cached);
	j_u64("sink_referenced", p->sink_referenced);
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
	j_open("resident", '{');
	j_u64("sequences", p->sequences);
	j_u64("sequences_max", p->sink_blocks ? p->sequences : p->open_used);
	j_u64("sealed_tokens", p->sealed_tokens);
	j_u64("sealed_distinct_tokens", p->sealed_distinct_tokens);
	j_u64("open_tokens_max", p->open_tokens_max);
	j_u64("sink_tokens_max", p->sink_tokens);
	j_u64("bytes", p->resident_bytes);
	j_u64("f16_bytes", p->resident_f16_bytes);
	j_num("effective_batch_gain", ratio(p->resident_f16_bytes, p->resident_bytes));
	j_num("sharing_factor", ratio(p->sealed_tokens, p->sealed_distinct_tokens));
	j_close('}');
	j_u64("attention_report_ms", p->attention_report_ms);
	j_open("clients", '[');
	for (size_t i = 0; sr && i < sr->n_clients; i++) {
		const Kvq__ClientStats *c = sr->clients[i];

		if (strcmp(c->pool, p->name))
			continue;
		j_open(NULL, '{');
		j_u64("id", c->id);
		j_u64("sealed_blocks", c->sealed_blocks);
		j_u64("open_blocks", c->open_blocks);
		j_u64("sink_blocks", c->sink_blocks);
		j_u64("bytes", c->bytes);
		j_close('}');
	}
	j_close(']');
	j_close('}');
}

/* Totals per device (backend and ordinal) of the pools listed. */
struct dev_total {
	const char *backend;
	int device;
	uint32_t pools;
	uint64_t capacity, used, memory;
};

static size_t dev_totals(const Kvq__StatsReply *sr, struct dev_total *d, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < sr->n_pools; i++) {
		const Kvq__PoolStats *p = sr->pools[i];
		struct pool_fig f;
		size_t j = 0;

		while (j < n && (d[j].device != p->device || strcmp(d[j].backend, p->backend)))
			j++;
		if (j == n) {
			if (n == max)
				continue;
			d[n++] = (struct dev_total){ .backend = p->backend, .device = p->device, .memory = p->device_memory };
		}
		pool_figures(p, &f);
		d[j].pools++;
		d[j].capacity += p->total_bytes;
		d[j].used += f.used;
	}
	return n;
}

/* The document of stats and pools: the daemon, then each pool, with its
 * clients when with_clients. */
static void json_stats(const Kvq__StatsReply *sr, bool with_clients)
{
	struct dev_total t[64];
	size_t n = dev_totals(sr, t, sizeof(t) / sizeof(t[0]));

	j_open(NULL, '{');
	j_str("daemon_version", sr->daemon_version);
	j_u64("uptime_ms", sr->uptime_ms);
	j_str("backend", sr->backend);
	j_i64("device", sr->device);
	/* the pools listed, by device */
	j_open("devices", '[');
	for (size_t j = 0; j < n; j++) {
		j_open(NULL, '{');
		j_str("backend", t[j].backend);
		j_i64("device", t[j].device);
		j_u64("pools", t[j].pools);
		j_u64("capacity_bytes", t[j].capacity);
		j_u64("used_bytes", t[j].used);
		j_u64("device_memory_bytes", t[j].memory);
		j_close('}');
	}
	j_close(']');
	j_open("pools", '[');
	for (size_t i = 0; i < sr->n_pools; i++)
		json_pool(sr->pools[i], with_clients ? sr : NULL);
	j_close(']');
	j_close('}');
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
	struct dev_total t[64];
	char d[16], a[32], b[32], m[32];
	size_t n = dev_totals(sr, t, sizeof(t) / sizeof(t[0]));

	printf("kvqd %s, up ", sr->daemon_version);
	print_uptime(sr->uptime_ms);
	printf(", backend %s, device %s\n", sr->backend, dev_str(sr->device, d, sizeof(d)));
	for (size_t j = 0; j < n; j++)
		printf("device %s %s: %u pool%s, capacity %s (%.2f%% of %s), in use %s\n", t[j].backend,
		       dev_str(t[j].device, d, sizeof(d)), t[j].pools, t[j].pools == 1 ? "" : "s",
		       human_bytes((double)t[j].capacity, a, sizeof(a)), 100.0 * ratio(t[j].capacity, t[j].memory),
		       human_bytes((double)t[j].memory, m, sizeof(m)), human_bytes((double)t[j].used, b, sizeof(b)));
}

static void print_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr)
{
	struct pool_fig f;
	char a[32], b[32], d[16], h[2 * KVQ_PROTO_SHA256 + 1], sk[32] = "";

	pool_figures(p, &f);
	printf("\npool %s\n", p->name);
	printf("  model           %s\n", p->model_id);
	printf("  policy          %s\n", p->policy);
	if (p->codebooks_sha256.len)
		printf("  codebooks       sha256 %s...\n", sha_str(&p->codebooks_sha256, 8, h, sizeof(h)));
	if (p->world_size)
		printf("  group           %s, rank %u of %u (this pool: the rank's shard of the KV heads)\n", p->group,
		       p->rank, p->world_size);
	printf("  geometry        %u layers, %u KV heads, head dim %u, %u tokens/block, window %u (%s)\n", p->layers,
	       p->kv_heads, p->head_dim, p->block_tokens, p->window,
	       p->act == KVQ__DTYPE__DTYPE_BF16 ? "bf16" : "f16");
	printf("  backend         %s, device %s\n", p->backend, dev_str(p->device, d, sizeof(d)));
	if (p->n_sink)
		snprintf(sk, sizeof(sk), " + %u sink", p->n_sink);
	printf("  capacity        %s, %u sealed + %u open%s slots, %.2f%% of device memory (%s)\n",
	       human_bytes((double)p->total_bytes, a, sizeof(a)), p->n_sealed, p->n_open, sk,
	       100.0 * ratio(p->total_bytes, p->device_memory), human_bytes((double)p->device_memory, b, sizeof(b)));
	printf("  in use          %s, %.2f%% of device memory\n", human_bytes((double)f.used, a, sizeof(a)),
	       100.0 * ratio(f.used, p->device_memory));
	printf("  blocks          free %u, open %u, sealed %u, cached %u (referenced %u), reserved %u\n",
	       p->sealed_free, p->open_used, p->sealed_held, p->cached, p->referenced, p->sealed_reserved);
	if (p->sink_blocks)
		printf("  sink blocks     %u slots (first blocks kept exact): free %u, held %u, cached %u "
		       "(referenced %u)\n", p->n_sink, p->sink_free, p->sink_held, p->sink_cached, p->sink_referenced);
	printf("  bytes/token     %.1f sealed, f16 %.1f: ratio %.3f (%.2fx the tokens of f16)\n", f.bpt, f.bpt_f16,
	       f.bpt / f.bpt_f16, f.bpt_f16 / f.bpt);
	printf("  prefix          %llu of %llu tokens looked up were cached: hit rate %.1f%%\n",
	       (unsigned long long)p->hit_tokens, (unsigned long long)p->lookup_tokens,
	       p->lookup_tokens ? 100.0 * ratio(p->hit_tokens, p->lookup_tokens) : 0.0);
	printf("  resident        %u sequences (at most %u), %llu sealed tokens (%llu distinct), at most %llu open\n",
	       p->sequences, p->sink_blocks ? p->sequences : p->open_used, (unsigned long long)p->sealed_tokens,
	       (unsigned long long)p->sealed_distinct_tokens, (unsigned long long)p->open_tokens_max);
	if (p->resident_bytes)
		printf("  batch gain      %.2fx: f16 would take %s for what takes %s here (open window and "
		       "reservations included)\n", ratio(p->resident_f16_bytes, p->resident_bytes),
		       human_bytes((double)p->resident_f16_bytes, a, sizeof(a)),
		       human_bytes((double)p->resident_bytes, b, sizeof(b)));
	else
		printf("  batch gain      - (nothing resident)\n");
	if (p->sealed_distinct_tokens)
		printf("  sharing         %.2fx: sealed tokens as the sequences see them / as stored\n",
		       ratio(p->sealed_tokens, p->sealed_distinct_tokens));
	else
		printf("  sharing         - (no sealed token resident)\n");
	if (p->attention_report_ms)
		printf("  attention       timed, reported every %u ms (kvq_attention_seconds in the metrics)\n",
		       p->attention_report_ms);
	else
		printf("  attention       not timed (kvqd.conf attention_timing)\n");
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
			struct pool_fig f;
			char sk[32] = "-";

			pool_figures(p, &f);
			/* sink slots in use (held or cached) of all */
			if (p->sink_blocks)
				snprintf(sk, sizeof(sk), "%u/%u", p->sink_held + p->sink_cached, p->n_sink);
			printf("%-20s %-8s %-4s %-24s %12s %12s %7u %13s %7.1f %7u %-9s\n", p->name, p->backend,
			       dev_str(p->device, d, sizeof(d)), p->policy, human_bytes((double)p->total_bytes, a, sizeof(a)),
			       human_bytes((double)f.used, b, sizeof(b)), p->cached + p->sink_cached, sk,
			       p->lookup_tokens ? 100.0 * ratio(p->hit_tokens, p->lookup_tokens) : 0.0, p->clients,
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

/* evict POOL [N], and flush POOL (all that can go: no N). */
int cmd_evict(struct cmdline *cl)
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
	r = request(cl, &e, KVQ__ENVELOPE__BODY_EVICT_REPLY, &rep);
	if (r)
		return r;
	if (cl->json) {
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
		char b[32], h[2 * KVQ_PROTO_SHA256 + 1];

		printf("pool %s created: %s, %u sealed + %u open slots", a.pool,
		       human_bytes((double)p->total_bytes, b, sizeof(b)), p->n_sealed, p->n_open);
		if (p->n_sink)
			printf(" + %u sink slots", p->n_sink);
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
