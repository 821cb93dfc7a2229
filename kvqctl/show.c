/* SPDX-License-Identifier: Apache-2.0 */
/* What Stats carries as kvqctl shows it: the daemon, its devices and each
 * pool, as JSON or text (show.h). */
#include <config.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "figure.h"
#include "frame.h"
#include "json.h"
#include "layout.h"
#include "show.h"

const char *human_bytes(double b, char *buf, size_t len)
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

double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : NAN;
}

uint64_t fig(const struct figs *fs, const char *name)
{
	ssize_t k = kvq_figure_index(fs->p, name);

	if (k < 0)
		return 0;
	if (fs->shown)
		fs->shown[k] = true;
	return fs->p->figures[k]->value;
}

uint32_t fig32(const struct figs *fs, const char *name)
{
	uint64_t v = fig(fs, name);

	return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* The host tier's figures (kvqd.conf host_capacity), as one object. */
static void json_tier(const struct figs *fs)
{
	uint64_t us = fig(fs, "tier_copy_us");

	j_open("host_tier", '{');
	j_u64("capacity_bytes", fig(fs, "tier_capacity"));
	j_u64("records", fig(fs, "tier_records"));
	j_u64("bytes", fig(fs, "tier_bytes"));
	j_u64("hit_tokens", fig(fs, "tier_hit_tokens"));
	j_u64("demotions", fig(fs, "tier_demotions"));
	j_u64("promotions", fig(fs, "tier_promotions"));
	j_u64("evictions", fig(fs, "tier_evictions"));
	j_u64("drops", fig(fs, "tier_drops"));
	j_u64("cancelled", fig(fs, "tier_cancelled"));
	j_u64("copy_bytes", fig(fs, "tier_copy_bytes"));
	j_u64("copy_us", us);
	j_u64("copies", fig(fs, "tier_copies"));
	j_num("copy_gbs", us ? (double)fig(fs, "tier_copy_bytes") / (double)us / 1e3 : 0.0);
	j_close('}');
}

/* The host tier in two lines, or "none". */
static void print_tier(const struct figs *fs)
{
	uint64_t cap = fig(fs, "tier_capacity"), us = fig(fs, "tier_copy_us");
	char a[32], b[32], c[32];

	if (!cap) {
		printf("  host tier       none\n");
		return;
	}
	printf("  host tier       %s: %llu records (%s), %llu tokens of hits served\n",
	       human_bytes((double)cap, a, sizeof(a)), (unsigned long long)fig(fs, "tier_records"),
	       human_bytes((double)fig(fs, "tier_bytes"), b, sizeof(b)),
	       (unsigned long long)fig(fs, "tier_hit_tokens"));
	printf("                  demoted %llu, promoted %llu, evicted %llu, dropped %llu, cancelled %llu; "
	       "%llu copies, %s at %.2f GB/s\n", (unsigned long long)fig(fs, "tier_demotions"),
	       (unsigned long long)fig(fs, "tier_promotions"), (unsigned long long)fig(fs, "tier_evictions"),
	       (unsigned long long)fig(fs, "tier_drops"), (unsigned long long)fig(fs, "tier_cancelled"),
	       (unsigned long long)fig(fs, "tier_copies"), human_bytes((double)fig(fs, "tier_copy_bytes"), c, sizeof(c)),
	       us ? (double)fig(fs, "tier_copy_bytes") / (double)us / 1e3 : 0.0);
}

/* The figures of fs whose names start with prefix, in the table's order:
 * each name after the prefix and its value to f (marked shown). */
static void figs_prefixed(const struct figs *fs, const char *prefix,
			  void (*f)(const char *rest, uint64_t v, void *arg), void *arg)
{
	const size_t n = strlen(prefix);

	for (size_t k = 0; k < fs->p->n_figures; k++) {
		const Kvq__Figure *x = fs->p->figures[k];

		if (strncmp(x->name, prefix, n))
			continue;
		if (fs->shown)
			fs->shown[k] = true;
		f(x->name + n, x->value, arg);
	}
}

static void json_member(const char *rest, uint64_t v, void *arg)
{
	(void)arg;
	j_u64(rest, v);
}

/* The remote tier's figures (kvqd.conf remote), as one object: errors by
 * kind and the fetch times' cumulative buckets (le_...) as objects of
 * their own. */
static void json_remote(const struct figs *fs)
{
	/* members named as the figures after "remote_" */
	static const char *const plain[] = { "hit_tokens", "fetched", "absent", "written", "dropped", "bytes_in",
					     "bytes_out", "queue" };
	char name[64];

	j_open("remote", '{');
	j_bool("on", fig(fs, "remote_on") != 0);
	for (size_t k = 0; k < sizeof(plain) / sizeof(plain[0]); k++) {
		snprintf(name, sizeof(name), "remote_%s", plain[k]);
		j_u64(plain[k], fig(fs, name));
	}
	j_open("errors", '{');
	figs_prefixed(fs, "remote_errors_", json_member, NULL);
	j_close('}');
	j_u64("fetches", fig(fs, "remote_fetches"));
	j_u64("fetch_us", fig(fs, "remote_fetch_us"));
	j_open("fetch_le", '{');
	figs_prefixed(fs, "remote_fetch_le_", json_member, NULL);
	j_close('}');
	j_close('}');
}

/* "kind n" for each figure of a prefix that is not 0, after sep. */
struct nonzero {
	const char *sep;
	bool any;
};

static void print_nonzero(const char *rest, uint64_t v, void *arg)
{
	struct nonzero *z = arg;

	if (!v)
		return;
	printf("%s%s %llu", z->any ? ", " : z->sep, rest, (unsigned long long)v);
	z->any = true;
}

/* The remote tier in three lines, or "none". */
static void print_remote(const struct figs *fs)
{
	uint64_t n = fig(fs, "remote_fetches"), us = fig(fs, "remote_fetch_us");
	struct nonzero le = { "; at most ", false }, errs = { "errors: ", false };
	char a[32], b[32];

	if (!fig(fs, "remote_on")) {
		printf("  remote          none\n");
		return;
	}
	printf("  remote          %llu tokens of hits served: fetched %llu blocks (%llu absent), %s in; written "
	       "%llu (%llu dropped, %llu queued), %s out\n", (unsigned long long)fig(fs, "remote_hit_tokens"),
	       (unsigned long long)fig(fs, "remote_fetched"), (unsigned long long)fig(fs, "remote_absent"),
	       human_bytes((double)fig(fs, "remote_bytes_in"), a, sizeof(a)),
	       (unsigned long long)fig(fs, "remote_written"),
	       (unsigned long long)fig(fs, "remote_dropped"), (unsigned long long)fig(fs, "remote_queue"),
	       human_bytes((double)fig(fs, "remote_bytes_out"), b, sizeof(b)));
	printf("                  %llu fetches, mean %.2f ms", (unsigned long long)n,
	       n ? (double)us / (double)n / 1e3 : 0.0);
	figs_prefixed(fs, "remote_fetch_le_", print_nonzero, &le);
	printf("\n                  ");
	figs_prefixed(fs, "remote_errors_", print_nonzero, &errs);
	printf("%s\n", errs.any ? "" : "no errors");
}

/* What this start took back of the pool after a restart, as one object. */
static void json_restart(const Kvq__PoolStats *p, const struct figs *fs)
{
	j_open("restart", '{');
	j_u64("blocks", fig(fs, "restart_blocks"));
	j_u64("records", fig(fs, "restart_records"));
	j_u64("held", fig(fs, "restart_held"));
	j_u64("us", fig(fs, "restart_us"));
	j_u64("cold", fig(fs, "restart_cold"));
	j_str("cold_reason", p->restart_cold ? p->restart_cold : "");
	j_close('}');
}

/* The same in a line, or none when the start took nothing back and
 * nothing failed. */
static void print_restart(const Kvq__PoolStats *p, const struct figs *fs)
{
	uint64_t blocks = fig(fs, "restart_blocks"), records = fig(fs, "restart_records");
	uint64_t held = fig(fs, "restart_held"), us = fig(fs, "restart_us"), cold = fig(fs, "restart_cold");

	if (cold && p->restart_cold)
		printf("  restart         started cold: %s\n", p->restart_cold);
	else if (blocks || records || us)
		printf("  restart         taken back: %llu cached blocks, %llu host-tier records in %.1f ms; "
		       "%llu slots held for processes alive\n", (unsigned long long)blocks, (unsigned long long)records,
		       (double)us / 1000.0, (unsigned long long)held);
}

/* The figures not shown yet, as JSON members or as text lines (none when
 * shown could not be had). */
static void json_other_figures(const struct figs *fs)
{
	for (size_t k = 0; fs->shown && k < fs->p->n_figures; k++)
		if (!fs->shown[k])
			j_u64(fs->p->figures[k]->name, fs->p->figures[k]->value);
}

static void print_other_figures(const struct figs *fs)
{
	for (size_t k = 0; fs->shown && k < fs->p->n_figures; k++)
		if (!fs->shown[k])
			printf("  %-15s %llu\n", fs->p->figures[k]->name, (unsigned long long)fs->p->figures[k]->value);
}


void pool_figures(const struct figs *fs, struct pool_fig *f)
{
	const Kvq__PoolStats *p = fs->p;
	uint64_t sealed_block_bytes = fig(fs, "sealed_block_bytes"), open_block_bytes = fig(fs, "open_block_bytes");
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = p->layers, .kv_heads = p->kv_heads, .head_dim = p->head_dim,
		.block_tokens = p->block_tokens, .window = p->window, .n_sealed = 1, .n_open = 1,
		.act = (int)p->act, .policy = &pol };
	struct kvq_layout *L = NULL;

	f->bpt = p->block_tokens ? (double)sealed_block_bytes / p->block_tokens : NAN;
	f->bpt_f16 = NAN;
	if (kvq_policy_parse("f16", p->layers, &pol, NULL, 0) == 0 && kvq_layout_new(&lp, &L, NULL, 0) == 0) {
		f->bpt_f16 = (double)L->sealed_block_bytes / p->block_tokens;
		kvq_layout_free(L);
	}
	/* a sink slot is an open slice */
	f->used = (fig(fs, "sealed_held") + fig(fs, "cached") + fig(fs, "sealed_reserved")) * sealed_block_bytes +
		  (fig(fs, "open_used") + fig(fs, "sink_held") + fig(fs, "sink_cached")) * open_block_bytes;
}

const char *sha_str(const ProtobufCBinaryData *h, size_t n, char *buf, size_t len)
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

const char *dev_str(int device, char *buf, size_t len)
{
	if (device < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%d", device);
	return buf;
}

void json_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr)
{
	struct figs fs = { p, calloc(p->n_figures + 1, sizeof(bool)) };
	struct pool_fig f;
	char h[2 * KVQ_PROTO_SHA256 + 1];
	uint64_t mem, used;

	pool_figures(&fs, &f);
	mem = fig(&fs, "device_memory");
	used = f.used;
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
	j_u64("capacity_bytes", fig(&fs, "total_bytes"));
	j_u64("device_memory_bytes", mem);
	j_num("capacity_share_of_device", ratio(fig(&fs, "total_bytes"), mem));
	j_u64("used_bytes", used);
	j_num("used_share_of_device", ratio(used, mem));
	j_open("blocks", '{');
	j_u64("sealed_slots", fig(&fs, "n_sealed"));
	j_u64("open_slots", fig(&fs, "n_open"));
	j_u64("free", fig(&fs, "sealed_free"));
	j_u64("reserved", fig(&fs, "sealed_reserved"));
	j_u64("sealed", fig(&fs, "sealed_held"));
	j_u64("cached", fig(&fs, "cached"));
	j_u64("referenced", fig(&fs, "referenced"));
	j_u64("open", fig(&fs, "open_used"));
	/* sink slots (0 without sink blocks): an open slice each */
	j_u64("sink_slots", fig(&fs, "n_sink"));
	j_u64("sink_free", fig(&fs, "sink_free"));
	j_u64("sink", fig(&fs, "sink_held"));
	j_u64("sink_cached", fig(&fs, "sink_cached"));
	j_u64("sink_referenced", fig(&fs, "sink_referenced"));
	j_close('}');
	j_num("bytes_per_token", f.bpt);
	j_num("f16_bytes_per_token", f.bpt_f16);
	j_num("ratio_to_f16", f.bpt / f.bpt_f16);
	j_u64("lookup_tokens", fig(&fs, "lookup_tokens"));
	j_u64("hit_tokens", fig(&fs, "hit_tokens"));
	j_num("hit_rate", ratio(fig(&fs, "hit_tokens"), fig(&fs, "lookup_tokens")));
	j_u64("evictions", fig(&fs, "evictions"));
	j_u64("alloc_failures", fig(&fs, "alloc_failures"));
	j_u64("clients_attached", fig(&fs, "clients"));
	j_open("resident", '{');
	j_u64("sequences", fig(&fs, "sequences"));
	j_u64("sequences_max", p->sink_blocks ? fig(&fs, "sequences") : fig(&fs, "open_used"));
	j_u64("sealed_tokens", fig(&fs, "sealed_tokens"));
	j_u64("sealed_distinct_tokens", fig(&fs, "sealed_distinct_tokens"));
	j_u64("open_tokens_max", fig(&fs, "open_tokens_max"));
	j_u64("sink_tokens_max", fig(&fs, "sink_tokens"));
	j_u64("bytes", fig(&fs, "resident_bytes"));
	j_u64("f16_bytes", fig(&fs, "resident_f16_bytes"));
	j_num("effective_batch_gain", ratio(fig(&fs, "resident_f16_bytes"), fig(&fs, "resident_bytes")));
	j_num("sharing_factor", ratio(fig(&fs, "sealed_tokens"), fig(&fs, "sealed_distinct_tokens")));
	j_close('}');
	j_u64("attention_report_ms", fig(&fs, "attention_report_ms"));
	json_tier(&fs);
	json_remote(&fs);
	json_restart(p, &fs);
	/* figures this layout has no place for, under their own names */
	json_other_figures(&fs);
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
	free(fs.shown);
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
		const struct figs fs = { p, NULL };
		struct pool_fig f;
		size_t j = 0;

		while (j < n && (d[j].device != p->device || strcmp(d[j].backend, p->backend)))
			j++;
		if (j == n) {
			if (n == max)
				continue;
			d[n++] = (struct dev_total){ .backend = p->backend, .device = p->device,
						     .memory = fig(&fs, "device_memory") };
		}
		pool_figures(&fs, &f);
		d[j].pools++;
		d[j].capacity += fig(&fs, "total_bytes");
		d[j].used += f.used;
	}
	return n;
}

void json_stats(const Kvq__StatsReply *sr, bool with_clients)
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

void print_daemon(const Kvq__StatsReply *sr)
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

void print_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr)
{
	struct figs fs = { p, calloc(p->n_figures + 1, sizeof(bool)) };
	struct pool_fig f;
	char a[32], b[32], d[16], h[2 * KVQ_PROTO_SHA256 + 1], sk[32] = "";
	uint64_t total = fig(&fs, "total_bytes"), mem = fig(&fs, "device_memory");
	uint64_t lookup = fig(&fs, "lookup_tokens"), hit = fig(&fs, "hit_tokens");
	uint64_t sealed = fig(&fs, "sealed_tokens"), distinct = fig(&fs, "sealed_distinct_tokens");
	uint64_t res = fig(&fs, "resident_bytes"), res16 = fig(&fs, "resident_f16_bytes");
	uint32_t n_sink = fig32(&fs, "n_sink"), seqs = fig32(&fs, "sequences"), open_used = fig32(&fs, "open_used");
	uint32_t report_ms = fig32(&fs, "attention_report_ms"), clients = fig32(&fs, "clients");
	/* read with or without sink blocks: their place is here either way */
	const uint32_t sink[] = { fig32(&fs, "sink_free"), fig32(&fs, "sink_held"), fig32(&fs, "sink_cached"),
				  fig32(&fs, "sink_referenced") };

	pool_figures(&fs, &f);
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
	if (n_sink)
		snprintf(sk, sizeof(sk), " + %u sink", n_sink);
	printf("  capacity        %s, %u sealed + %u open%s slots, %.2f%% of device memory (%s)\n",
	       human_bytes((double)total, a, sizeof(a)), fig32(&fs, "n_sealed"), fig32(&fs, "n_open"), sk,
	       100.0 * ratio(total, mem), human_bytes((double)mem, b, sizeof(b)));
	printf("  in use          %s, %.2f%% of device memory\n", human_bytes((double)f.used, a, sizeof(a)),
	       100.0 * ratio(f.used, mem));
	printf("  blocks          free %u, open %u, sealed %u, cached %u (referenced %u), reserved %u\n",
	       fig32(&fs, "sealed_free"), open_used, fig32(&fs, "sealed_held"), fig32(&fs, "cached"),
	       fig32(&fs, "referenced"), fig32(&fs, "sealed_reserved"));
	if (p->sink_blocks)
		printf("  sink blocks     %u slots (first blocks kept exact): free %u, held %u, cached %u "
		       "(referenced %u)\n", n_sink, sink[0], sink[1], sink[2], sink[3]);
	printf("  bytes/token     %.1f sealed, f16 %.1f: ratio %.3f (%.2fx the tokens of f16)\n", f.bpt, f.bpt_f16,
	       f.bpt / f.bpt_f16, f.bpt_f16 / f.bpt);
	printf("  prefix          %llu of %llu tokens looked up were cached: hit rate %.1f%%\n",
	       (unsigned long long)hit, (unsigned long long)lookup, lookup ? 100.0 * ratio(hit, lookup) : 0.0);
	printf("  resident        %u sequences (at most %u), %llu sealed tokens (%llu distinct), at most %llu open\n",
	       seqs, p->sink_blocks ? seqs : open_used, (unsigned long long)sealed, (unsigned long long)distinct,
	       (unsigned long long)fig(&fs, "open_tokens_max"));
	fig(&fs, "sink_tokens");   /* the JSON's sink_tokens_max; not a line of its own */
	if (res)
		printf("  batch gain      %.2fx: f16 would take %s for what takes %s here (open window and "
		       "reservations included)\n", ratio(res16, res), human_bytes((double)res16, a, sizeof(a)),
		       human_bytes((double)res, b, sizeof(b)));
	else
		printf("  batch gain      - (nothing resident)\n");
	if (distinct)
		printf("  sharing         %.2fx: sealed tokens as the sequences see them / as stored\n",
		       ratio(sealed, distinct));
	else
		printf("  sharing         - (no sealed token resident)\n");
	if (report_ms)
		printf("  attention       timed, reported every %u ms (kvq_attention_seconds in the metrics)\n",
		       report_ms);
	else
		printf("  attention       not timed (kvqd.conf attention_timing)\n");
	printf("  evictions       %llu\n", (unsigned long long)fig(&fs, "evictions"));
	printf("  alloc failures  %llu\n", (unsigned long long)fig(&fs, "alloc_failures"));
	print_tier(&fs);
	print_remote(&fs);
	print_restart(p, &fs);
	/* figures this layout has no place for, under their own names */
	print_other_figures(&fs);
	printf("  clients         %u\n", clients);
	for (size_t i = 0; sr && i < sr->n_clients; i++) {
		const Kvq__ClientStats *c = sr->clients[i];

		if (strcmp(c->pool, p->name))
			continue;
		printf("    client %-6llu %-16s pid %-7u uid %-6u sealed %-7u open %-5u %s%s\n",
		       (unsigned long long)c->id, c->name, c->pid, c->uid, c->sealed_blocks, c->open_blocks,
		       human_bytes((double)c->bytes, a, sizeof(a)), c->exiting ? " (exiting)" : "");
	}
	free(fs.shown);
}
