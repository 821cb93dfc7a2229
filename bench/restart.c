/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench restart: how long a restart takes to serve its warm cache again
 * (docs/DESIGN.md, "Restart").  A real kvqd runs under the tests' service
 * manager (tests/sdmgr.h: systemd's fd store and socket activation) with one
 * pool of kvqd.conf of the size asked, and a host tier; N blocks are
 * published in chains of 64 (allocated and published, their bytes left as
 * they are: what a restart does with a block does not depend on them), a
 * share of them sent to the host tier (kvqctl demote).  Then kvqd is
 * stopped (SIGTERM) and started, and killed (kill -9) and started: each
 * start is timed from the fork to READY=1 and to the first lookup that hits
 * a whole chain, with kvqd's own figures (restart_us, tier_open_us: the
 * tier's memory taken back and, for a cuda pool, pinned again).
 *
 *   kvq-bench restart [--backend host|cuda] [--pool-gib G] [--blocks N]
 *                     [--tier-gib T] [--demote N] [--layers L] [--kv-heads H]
 *                     [--head-dim D] [--json]
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/daemon.h"
#include "../tests/sdmgr.h"
#include "bench.h"
#include "kvq.h"

#define CHAIN 64u
#define B_ 16u
#define WAIT_MS 120000

struct opt {
	const char *backend;
	double pool_gib, tier_gib;
	uint32_t blocks, demote, layers, kv_heads, head_dim;
	int json;
};

struct start_fig {
	double ready_ms, hit_ms;
	uint64_t restart_us, tier_open_us, blocks, records;
	uint32_t hit_blocks;
};

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void chain_tokens(uint32_t chain, uint32_t *tok)
{
	for (uint32_t i = 0; i < CHAIN * B_; i++)
		tok[i] = 100000u * chain + i;
}

static kvq_client *attach(const struct sdmgr *m, const struct opt *o)
{
	struct kvq_attach_params a = { .pool = "big", .model_id = "bench/restart@1", .layers = o->layers,
		.kv_heads = o->kv_heads, .head_dim = o->head_dim, .block_tokens = B_, .policy = "int8",
		.act = KVQ_ACT_F16, .device = -1 };

	return bench_attach(m->sock_path, "restart-bench", &a);
}

#define figure bench_figure

/* n blocks published in chains, unreferenced; returns how many. */
static uint32_t publish(kvq_client *c, uint32_t n)
{
	static uint32_t ids[CHAIN], got[CHAIN], tok[CHAIN * B_];
	uint32_t done = 0;

	for (uint32_t ch = 0; done + CHAIN <= n; ch++) {
		chain_tokens(ch, tok);
		if (kvq_client_alloc(c, 0, CHAIN, NULL, NULL, ids) < 0 ||
		    kvq_client_publish(c, CHAIN, ids, -1, tok, NULL, 0, got) < 0 ||
		    kvq_client_release(c, CHAIN, got, 0, NULL) < 0) {
			fprintf(stderr, "kvq-bench restart: chain %u: %s\n", ch, kvq_client_error(c));
			break;
		}
		done += CHAIN;
	}
	return done;
}

/* Starts kvqd and times it: READY=1, then the first whole hit of chain 0. */
static int timed_start(struct sdmgr *m, char **argv, const char *logp, const struct opt *o, struct start_fig *f)
{
	static uint32_t tok[CHAIN * B_], ids[CHAIN];
	double t0 = now_ms();
	kvq_client *c;
	uint32_t n = 0;

	if (sdmgr_start(m, argv[0], argv, logp) < 0 || sdmgr_wait_ready(m, WAIT_MS) < 0)
		return -1;
	f->ready_ms = now_ms() - t0;
	c = attach(m, o);
	chain_tokens(0, tok);
	if (!c || kvq_client_lookup(c, tok, CHAIN * B_, CHAIN * B_, NULL, 0, ids, &n) < 0) {
		kvq_client_free(c);
		return -1;
	}
	f->hit_ms = now_ms() - t0;
	f->hit_blocks = n;
	kvq_client_release(c, n, ids, 0, NULL);
	f->restart_us = figure(c, "restart_us");
	f->tier_open_us = figure(c, "tier_open_us");
	f->blocks = figure(c, "restart_blocks");
	f->records = figure(c, "restart_records");
	kvq_client_free(c);
	return 0;
}

static int parse(int argc, char **argv, struct opt *o)
{
	static const struct option lo[] = {
		{ "backend", required_argument, NULL, 'b' }, { "pool-gib", required_argument, NULL, 'p' },
		{ "blocks", required_argument, NULL, 'n' },  { "tier-gib", required_argument, NULL, 't' },
		{ "demote", required_argument, NULL, 'd' },  { "layers", required_argument, NULL, 'l' },
		{ "kv-heads", required_argument, NULL, 'k' }, { "head-dim", required_argument, NULL, 'h' },
		{ "json", no_argument, NULL, 'j' },          { NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'b': o->backend = optarg; break;
		case 'p': o->pool_gib = atof(optarg); break;
		case 'n': o->blocks = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 't': o->tier_gib = atof(optarg); break;
		case 'd': o->demote = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'l': o->layers = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'k': o->kv_heads = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'h': o->head_dim = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'j': o->json = 1; break;
		default: return -1;
		}
	}
	return o->pool_gib > 0 && o->blocks >= CHAIN && o->layers && o->kv_heads && o->head_dim ? 0 : -1;
}

static void print_start(const char *what, const struct start_fig *f, int json, int last)
{
	if (json)
		printf("    {\"start\": \"%s\", \"ready_ms\": %.1f, \"first_hit_ms\": %.1f, \"hit_blocks\": %u, "
		       "\"restart_us\": %llu, \"tier_open_us\": %llu, \"blocks\": %llu, \"records\": %llu}%s\n", what,
		       f->ready_ms, f->hit_ms, f->hit_blocks, (unsigned long long)f->restart_us,
		       (unsigned long long)f->tier_open_us, (unsigned long long)f->blocks,
		       (unsigned long long)f->records, last ? "" : ",");
	else
		printf("%-22s %10.1f %12.1f %9u %12.1f %13.1f %9llu %9llu\n", what, f->ready_ms, f->hit_ms,
		       f->hit_blocks, (double)f->restart_us / 1e3, (double)f->tier_open_us / 1e3,
		       (unsigned long long)f->blocks, (unsigned long long)f->records);
}

int cmd_restart(int argc, char **argv)
{
	struct opt o = { .backend = "host", .pool_gib = 1, .tier_gib = 0.25, .blocks = 4096, .demote = 512,
		.layers = 4, .kv_heads = 8, .head_dim = 128 };
	char bin[256], conf[128], logp[128], unused[128], cmd[512];
	char *dargv[] = { bin, "--config", conf, "--socket", unused, "--backend", NULL, "--foreground", NULL };
	struct start_fig f[2] = { 0 };
	struct sdmgr m;
	FILE *f_conf;
	kvq_client *c;
	uint32_t published;
	double t0, stop_ms;
	int r = 1;

	if (parse(argc, argv, &o) < 0) {
		fprintf(stderr, "usage: kvq-bench restart [--backend host|cuda] [--pool-gib G] [--blocks N] "
				"[--tier-gib T] [--demote N] [--layers L] [--kv-heads H] [--head-dim D] [--json]\n");
		return 2;
	}
	dargv[6] = (char *)o.backend;
	if (sdmgr_init(&m, "rbench") < 0)
		return 1;
	test_daemon_bin(bin, sizeof bin);
	snprintf(conf, sizeof conf, "%s/kvqd.conf", m.dir);
	snprintf(logp, sizeof logp, "%s/kvqd.log", m.dir);
	snprintf(unused, sizeof unused, "%s/unused.sock", m.dir);
	f_conf = fopen(conf, "w");
	if (!f_conf)
		goto out;
	fprintf(f_conf, "[kvqd]\nbackend = %s\nmemory_budget = 90%%\nlog_level = notice\n"
		"[pool big]\nmodel = bench/restart@1\nlayers = %u\nkv_heads = %u\nhead_dim = %u\nblock_tokens = %u\n"
		"policy = int8\ncapacity = %.0f\nhost_capacity = %.0f\n", o.backend, o.layers, o.kv_heads, o.head_dim,
		B_, o.pool_gib * 1073741824.0, o.tier_gib * 1073741824.0);
	if (fclose(f_conf))
		goto out;
	t0 = now_ms();
	if (sdmgr_start(&m, bin, dargv, logp) < 0 || sdmgr_wait_ready(&m, WAIT_MS) < 0) {
		fprintf(stderr, "kvq-bench restart: kvqd did not start (log: %s)\n", logp);
		goto out;
	}
	c = attach(&m, &o);
	if (!c)
		goto out;
	published = publish(c, o.blocks);
	fprintf(stderr, "kvq-bench restart: kvqd up in %.0f ms, %u blocks published (%llu sealed slots)\n",
		now_ms() - t0, published, (unsigned long long)figure(c, "n_sealed"));
	kvq_client_free(c);
	if (o.demote) {
		const char *top = getenv("top_builddir"), *env = getenv("KVQ_TEST_KVQCTL");

		snprintf(cmd, sizeof cmd, "%s%s --socket %s demote big %u >/dev/null", env ? env : top ? top : ".",
			 env ? "" : "/kvqctl/kvqctl", m.sock_path, o.demote);
		if (system(cmd) != 0)
			fprintf(stderr, "kvq-bench restart: %s failed\n", cmd);
		usleep(500000);   /* the copies run on kvqd's copy thread */
	}
	t0 = now_ms();
	if (sdmgr_stop(&m, WAIT_MS) < 0)
		goto out;
	stop_ms = now_ms() - t0;
	if (timed_start(&m, dargv, logp, &o, &f[0]) < 0 || sdmgr_kill9(&m, WAIT_MS) < 0 ||
	    timed_start(&m, dargv, logp, &o, &f[1]) < 0) {
		fprintf(stderr, "kvq-bench restart: a start failed (log: %s)\n", logp);
		goto out;
	}
	if (o.json) {
		printf("{\"backend\": \"%s\", \"pool_gib\": %.2f, \"tier_gib\": %.2f, \"blocks\": %u, \"stop_ms\": %.1f, "
		       "\"starts\": [\n", o.backend, o.pool_gib, o.tier_gib, published, stop_ms);
		print_start("sigterm", &f[0], 1, 0);
		print_start("kill9", &f[1], 1, 1);
		printf("]}\n");
	} else {
		printf("restart: %s pool of %.2f GiB, %u blocks published, tier %.2f GiB; stop (SIGTERM) %.1f ms\n",
		       o.backend, o.pool_gib, published, o.tier_gib, stop_ms);
		printf("%-22s %10s %12s %9s %12s %13s %9s %9s\n", "start after", "ready ms", "first hit ms", "hit blks",
		       "restore ms", "tier open ms", "blocks", "records");
		print_start("SIGTERM", &f[0], 0, 0);
		print_start("kill -9", &f[1], 0, 1);
	}
	r = f[0].hit_blocks == CHAIN && f[1].hit_blocks == CHAIN ? 0 : 1;
	sdmgr_stop(&m, WAIT_MS);
out:
	if (r) {
		snprintf(cmd, sizeof cmd, "tail -n 20 %s >&2", logp);
		if (system(cmd) != 0)
			fprintf(stderr, "kvq-bench restart: no log\n");
	}
	sdmgr_flush(&m);
	sdmgr_fini(&m);
	return r;
}
