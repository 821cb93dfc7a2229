/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench remote: the remote tier of host or cuda pools (--backend;
 * docs/DESIGN.md, "The remote tier") on loopback against a real Redis Cluster of three masters
 * and three replicas (tests/redis_cluster.h), two kvqd nodes with the same
 * [remote] and namespace (tests/daemon.h).  One run prints:
 *
 *  (a) fetch: node A publishes N blocks in chains of 64 (a Lookup fetches
 *      64 at most) and writes them through; node B, whose pool never saw
 *      them, looks each chain up through libkvq (whole hits: 64 GETs in
 *      flight, verified and placed as kvqd does it), timed, with B's
 *      figures remote_fetched and remote_bytes_in; against a plain hiredis
 *      GET loop of the same keys on the same cluster, 64 in flight at a
 *      time, pipelined per master (one blocking connection each, every
 *      connection's requests sent before any reply is read): the ratio;
 *      then W workers of node B (--workers, each its own connection and
 *      thread, as a serving node's workers look up at once) look the
 *      chains up in a second pool of B (same remote, namespace and
 *      identity: the same keys), W lookups in flight, against the hiredis
 *      loop with as many GETs in flight (64 W): that ratio too;
 *  (b) write-through latency: a one-block chain published on A, timed from
 *      before the Publish to A's remote_written counting it (the SET's
 *      reply: the record is readable on its master), median and p99;
 *  (c) a node B worker's prompt of 64 blocks and one token: cold in a pool
 *      without a remote (synthetic K/V, drawn before the clock starts,
 *      written, quantized and sealed: no model's forward pass, so the
 *      saving is a lower bound) against a whole hit fetched from the
 *      remote, and the bytes per token the remote moved beside an FP16
 *      tier's;
 *  (d) the same on a real model: kvq-run (its GPU path with --backend cuda,
 *      else its CPU path), cold on node A
 *      (its blocks written through), on node B from the remote and cold on
 *      a node without a remote: what node B's worker saves against
 *      recomputing the prefix (bench/remote_model.c; skipped, with a line
 *      saying why, when the model, kvq-run or the prompt's text is not
 *      there).
 *
 *   kvq-bench remote [--backend host|cuda] [--blocks N] [--samples M]
 *                    [--prompts P] [--workers W] [--layers L] [--kv-heads H] [--head-dim D]
 *                    [--block-tokens B] [--policy NAME] [--model PATH] [--json]
 */
#include "config.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "kvq.h"
#include "kvq_format.h"
#include "remote_model.h"

/* tests/redis_cluster.h tells its failures here */
__attribute__((format(printf, 1, 2), unused))
static void diag(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvq-bench remote: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
}

#include "../tests/daemon.h"
#include "../tests/redis_cluster.h"

#define CHAIN 64u   /* KVQ_RTIER_FETCH_MAX: the blocks one Lookup fetches */
#define MODEL "bench/remote@1"
#define WAIT_MS 60000

struct opt {
	uint32_t blocks, samples, prompts, workers, layers, kv_heads, head_dim, block_tokens;
	const char *policy;
	const char *model;   /* (d): the model's file, NULL: found as remote_model.h says */
	const char *backend;   /* the nodes' pools: "host" or "cuda" */
	int json;
};

struct node {
	const char *tag;
	pid_t pid;
	char dir[64], sock[108], bin[256];
};

static struct node A = { .tag = "rbenchA" }, B = { .tag = "rbenchB" };

static void chain_tokens(uint32_t chain, uint32_t n, uint32_t *tok)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = 100000u * (chain + 1) + i;
}

static kvq_client *open_pool(const struct node *n, const char *pool, const struct opt *o)
{
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = o->layers,
		.kv_heads = o->kv_heads, .head_dim = o->head_dim, .block_tokens = o->block_tokens,
		.policy = o->policy, .act = KVQ_ACT_F16, .device = -1 };

	return bench_attach(n->sock, "remote-bench", &a);
}

#define figure bench_figure

/* Until c's pool wrote want blocks and its queue is empty: true, or false
 * after ms. */
static bool written(kvq_client *c, uint64_t want, int ms)
{
	double end = now_ms() + ms;

	while (now_ms() < end) {
		if (figure(c, "remote_written") >= want && figure(c, "remote_queue") == 0)
			return true;
		usleep(2000);
	}
	return false;
}

/* f16 bytes of one block: what an FP16 tier would move. */
static uint64_t f16_block_bytes(const struct opt *o)
{
	return 2ull * 2 * o->layers * o->kv_heads * o->head_dim * o->block_tokens;
}

static bool node_up(struct node *n, const struct opt *o, bool cold)
{
	char extra[4096], pools[1024];
	unsigned long long cap = (o->blocks + 4 * CHAIN) * f16_block_bytes(o) + (32ull << 20);
	unsigned long long cold_cap = (uint64_t)(o->prompts + 2) * CHAIN * f16_block_bytes(o) + (32ull << 20);
	int w;

#define POOLFMT "[pool %s]\nmodel = " MODEL "\nlayers = %u\nkv_heads = %u\nhead_dim = %u\nblock_tokens = %u\n" \
		"policy = %s\ncapacity = %llu\n%s"
	w = snprintf(pools, sizeof pools, POOLFMT, "shared", o->layers, o->kv_heads, o->head_dim, o->block_tokens,
		     o->policy, cap, "remote = shared\nremote_namespace = bench\n");
	/* node B: the workers' pool, of the same identity (the same keys) */
	if (cold)
		w += snprintf(pools + w, sizeof pools - (size_t)w, POOLFMT, "again", o->layers, o->kv_heads,
			      o->head_dim, o->block_tokens, o->policy, cap, "remote = shared\nremote_namespace = bench\n");
	if (cold)
		snprintf(pools + w, sizeof pools - (size_t)w, POOLFMT, "cold", o->layers, o->kv_heads, o->head_dim,
			 o->block_tokens, o->policy, cold_cap, "");
#undef POOLFMT
	snprintf(extra, sizeof extra,
		 "memory_budget = %llu\nhost_tier_wait_ms = 3000\n"
		 "[remote shared]\nnodes = 127.0.0.1:%d,127.0.0.1:%d\nuser = " ACL_USER "\n"
		 "password_file = %s/password\nhmac_key_file = %s/hmac\nrequest_timeout_ms = 5000\n"
		 "connect_timeout_ms = 1000\n%s",
		 2 * cap + cold_cap + (256ull << 20), ports[0], ports[1], secrets, secrets, pools);
	n->pid = test_daemon_start_conf(o->backend, n->tag, extra, n->dir, sizeof n->dir, n->sock, sizeof n->sock,
					n->bin, sizeof n->bin);
	if (n->pid <= 0)
		diag("%s: kvqd did not start", n->tag);
	return n->pid > 0;
}

/* n blocks published on c in chains of CHAIN, released; returns how many. */
static uint32_t publish_chains(kvq_client *c, uint32_t n, uint32_t bt)
{
	uint32_t ids[CHAIN], got[CHAIN], *tok = malloc(sizeof(uint32_t) * CHAIN * bt), done = 0;

	for (uint32_t ch = 0; tok && done + CHAIN <= n; ch++) {
		chain_tokens(ch, CHAIN * bt, tok);
		if (kvq_client_alloc(c, 0, CHAIN, NULL, NULL, ids) < 0 ||
		    kvq_client_publish(c, CHAIN, ids, -1, tok, NULL, 0, got) < 0 ||
		    kvq_client_release(c, CHAIN, got, 0, NULL) < 0) {
			diag("publish chain %u: %s", ch, kvq_client_error(c));
			break;
		}
		done += CHAIN;
	}
	free(tok);
	return done;
}

/* --- (a) the plain hiredis loop --- */

struct rkey {
	char *name;
	int conn;     /* index of its master's connection */
};

/* The cluster's kvq keys, with their masters, shuffled; returns how many. */
static uint32_t list_keys(redisContext **cs, int *nc, struct rkey **out)
{
	int m[3];
	uint32_t n = 0, cap = 0;
	struct rkey *k = NULL;
	uint64_t rng = 7;

	*nc = masters(m, 3);
	for (int i = 0; i < *nc; i++) {
		redisReply *r = admin(m[i], "KEYS kvq:*");

		cs[i] = admin_conn(m[i]);
		for (size_t j = 0; r && r->type == REDIS_REPLY_ARRAY && j < r->elements; j++) {
			if (n == cap) {
				cap = cap ? 2 * cap : 1024;
				k = realloc(k, sizeof *k * cap);
			}
			k[n].name = strdup(r->element[j]->str);
			k[n++].conn = i;
		}
		freeReplyObject(r);
	}
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(rng_next(&rng) % i);
		struct rkey t = k[i - 1];

		k[i - 1] = k[j];
		k[j] = t;
	}
	*out = k;
	return n;
}

/* GETs of k[0, n), inflight at a time, pipelined per master: the
 * seconds, the bytes in *bytes; -1 on a failure. */
static double hiredis_loop(redisContext **cs, int nc, const struct rkey *k, uint32_t n, uint32_t inflight,
			   uint64_t *bytes)
{
	double t0 = now_s();

	*bytes = 0;
	for (uint32_t g = 0; g < n; g += inflight) {
		uint32_t m = n - g < inflight ? n - g : inflight;

		for (uint32_t i = 0; i < m; i++)
			if (redisAppendCommand(cs[k[g + i].conn], "GET %s", k[g + i].name) != REDIS_OK)
				return -1;
		for (int c = 0; c < nc; c++) {
			int done = 0;

			while (!done)
				if (redisBufferWrite(cs[c], &done) != REDIS_OK)
					return -1;
		}
		for (uint32_t i = 0; i < m; i++) {
			redisReply *r = NULL;

			if (redisGetReply(cs[k[g + i].conn], (void **)&r) != REDIS_OK || !r ||
			    r->type != REDIS_REPLY_STRING) {
				freeReplyObject(r);
				return -1;
			}
			*bytes += r->len;
			freeReplyObject(r);
		}
	}
	return now_s() - t0;
}

/* --- where the CPU went --- */

/* Seconds on a CPU of process pid's threads so far (their schedstat), 0
 * when it cannot be read. */
static double cpu_s(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	double ns = 0;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		char f[64 + 256 + 16];
		unsigned long long run = 0;
		FILE *fp;

		if (e->d_name[0] == '.')
			continue;
		snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
		fp = fopen(f, "r");
		if (fp && fscanf(fp, "%llu", &run) == 1)
			ns += (double)run;
		if (fp)
			fclose(fp);
	}
	if (d)
		closedir(d);
	return ns * 1e-9;
}

/* Node B's CPU seconds by thread name (its loop "kvqd", the copy engine
 * "kvqd-copy", the remote tier's verifiers "kvqd-verify", ...). */
#define TNAMES 8

struct tcpu {
	char name[TNAMES][16];
	double s[TNAMES];
	int n;
};

static struct tcpu tcpu_now(pid_t pid)
{
	struct tcpu t = { .n = 0 };
	char path[64];
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		char f[64 + 256 + 16], comm[16] = "";
		unsigned long long run = 0;
		FILE *fp;
		int i;

		if (e->d_name[0] == '.')
			continue;
		snprintf(f, sizeof f, "%s/%s/comm", path, e->d_name);
		fp = fopen(f, "r");
		if (fp && fscanf(fp, "%15s", comm) != 1)
			comm[0] = 0;
		if (fp)
			fclose(fp);
		snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
		fp = fopen(f, "r");
		if (!fp || fscanf(fp, "%llu", &run) != 1)
			run = 0;
		if (fp)
			fclose(fp);
		for (i = 0; i < t.n && strcmp(t.name[i], comm); i++)
			;
		if (i == TNAMES)
			continue;
		if (i == t.n)
			snprintf(t.name[t.n++], sizeof t.name[0], "%s", comm);
		t.s[i] += (double)run * 1e-9;
	}
	if (d)
		closedir(d);
	return t;
}

/* What each thread name of node B took since t0 (a name gone: 0). */
static struct tcpu tcpu_since(pid_t pid, struct tcpu t0)
{
	struct tcpu t = tcpu_now(pid);

	for (int i = 0; i < t.n; i++) {
		double before = 0;

		for (int j = 0; j < t0.n; j++)
			if (!strcmp(t0.name[j], t.name[i]))
				before = t0.s[j];
		t.s[i] = t.s[i] > before ? t.s[i] - before : 0;
	}
	return t;
}

static void tcpu_print(const struct tcpu *t, bool json)
{
	for (int i = 0; i < t->n; i++)
		printf(json ? "%s\"%s\": %.4f" : "%s%s %.3f", i ? ", " : "", t->name[i], t->s[i]);
}

/* The CPU seconds of node B, the cluster's nodes and this process. */
struct cpu {
	double kvqd, cluster, bench;
};

static struct cpu cpu_now(void)
{
	struct cpu c = { cpu_s(B.pid), 0, cpu_s(getpid()) };

	for (int i = 0; i < NODES; i++)
		c.cluster += pids[i] > 0 ? cpu_s(pids[i]) : 0;
	return c;
}

static struct cpu cpu_since(struct cpu c0)
{
	struct cpu c = cpu_now();

	return (struct cpu){ c.kvqd - c0.kvqd, c.cluster - c0.cluster, c.bench - c0.bench };
}

/* Until node B and the cluster's nodes are idle (under 5 ms of CPU in 100
 * ms; at most 10 s): node B's pools' warm-up (daemon/warm.h) and the
 * replicas' catching up are not timed with what comes next. */
static void settle(void)
{
	for (int i = 0; i < 100; i++) {
		struct cpu c0 = cpu_now(), d;

		usleep(100000);
		d = cpu_since(c0);
		if (d.kvqd + d.cluster < 0.005)
			return;
	}
}

/* --- (a) node B's workers --- */

struct worker {
	pthread_t th;
	kvq_client *c;
	uint32_t first, step, chains, bt;
	pthread_barrier_t *go;
	int whole, err;
};

/* Worker w's chains (first, first + step, ...) looked up and released. */
static void *worker_run(void *arg)
{
	struct worker *w = arg;
	const uint32_t ptok = CHAIN * w->bt;
	uint32_t *tok = malloc(sizeof(uint32_t) * ptok);

	w->whole = 1;
	pthread_barrier_wait(w->go);
	for (uint32_t ch = w->first; tok && ch < w->chains; ch += w->step) {
		uint32_t ids[CHAIN], n = 0;

		chain_tokens(ch, ptok, tok);
		if (kvq_client_lookup(w->c, tok, ptok, ptok, NULL, 0, ids, &n) < 0) {
			w->err = 1;
			break;
		}
		w->whole &= n == CHAIN;
		kvq_client_release(w->c, n, ids, 0, NULL);
	}
	w->err |= !tok;
	free(tok);
	return NULL;
}

/* chains looked up by nw workers at once on their own connections to
 * node B's pool; the seconds, or -1; *whole: every lookup a whole hit. */
static double workers_fetch(struct worker *ws, uint32_t nw, uint32_t chains, uint32_t bt, int *whole)
{
	pthread_barrier_t go;
	uint32_t started = 0;
	double t0;
	int err = 0;

	pthread_barrier_init(&go, NULL, nw + 1);
	for (uint32_t i = 0; i < nw; i++) {
		ws[i].first = i;
		ws[i].step = nw;
		ws[i].chains = chains;
		ws[i].bt = bt;
		ws[i].go = &go;
		if (pthread_create(&ws[i].th, NULL, worker_run, &ws[i]) != 0)
			break;
		started++;
	}
	if (started < nw) {
		/* the barrier never opens: nothing can be timed */
		diag("%u of %u worker threads started", started, nw);
		exit(1);
	}
	pthread_barrier_wait(&go);
	t0 = now_s();
	for (uint32_t i = 0; i < nw; i++) {
		pthread_join(ws[i].th, NULL);
		err |= ws[i].err;
		*whole &= ws[i].whole;
	}
	t0 = now_s() - t0;
	pthread_barrier_destroy(&go);
	return err ? -1 : t0;
}

/* --- (c) a worker's prompt --- */

/* A prompt of n tokens on c from its lookup on: the hit in *hit, the
 * milliseconds; K and V of the tokens not hit (f16, drawn on the CPU
 * before the clock starts: a model's forward pass is not timed) written
 * and committed.  -1 on a failure. */
static double prompt_ms(kvq_client *c, const uint32_t *tok, uint32_t n, const struct opt *o, uint32_t *hit)
{
	size_t per = (size_t)o->kv_heads * o->head_dim * n;
	uint16_t *k = malloc(sizeof(uint16_t) * per * o->layers), *v = malloc(sizeof(uint16_t) * per * o->layers);
	uint64_t rng = tok[0];
	kvq_seq *s = NULL;
	double t0;
	int r;

	for (size_t i = 0; k && v && i < per * o->layers; i++) {
		k[i] = kvq_f16_from_f32(rng_normal(&rng));
		v[i] = kvq_f16_from_f32(rng_normal(&rng));
	}
	t0 = now_s();
	r = k && v ? kvq_seq_new(c, NULL, 0, &s) : -1;
	r = r < 0 ? r : kvq_seq_from_prompt(s, tok, n, hit);
	r = r < 0 ? r : kvq_seq_begin(s, tok + *hit, n - *hit);
	for (uint32_t l = 0; r == 0 && l < o->layers; l++)
		r = kvq_seq_write(s, l, k + per * l, v + per * l);
	r = r < 0 ? r : kvq_seq_commit(s);
	t0 = now_s() - t0;
	if (r < 0)
		diag("prompt %u..: %d %s", tok[0], r, kvq_client_error(c));
	kvq_seq_free(s);
	free(k);
	free(v);
	return r < 0 ? -1 : t0 * 1e3;
}

/* --- (d) --- */

/* The [remote shared] section of (d)'s nodes: this cluster's, as node_up's. */
static void remote_conf(char *buf, size_t len)
{
	snprintf(buf, len,
		 "[remote shared]\nnodes = 127.0.0.1:%d,127.0.0.1:%d\nuser = " ACL_USER "\n"
		 "password_file = %s/password\nhmac_key_file = %s/hmac\nrequest_timeout_ms = 5000\n"
		 "connect_timeout_ms = 1000\n", ports[0], ports[1], secrets, secrets);
}

/* --name VALUE for each count, --policy NAME, --backend host|cuda,
 * --model PATH, --json; 0, or -1 (usage). */
static int parse(int argc, char **argv, struct opt *o)
{
	static const char *const names[] = { "--blocks", "--samples", "--prompts", "--workers", "--layers",
					     "--kv-heads", "--head-dim", "--block-tokens" };
	uint32_t *counts[] = { &o->blocks, &o->samples, &o->prompts, &o->workers, &o->layers, &o->kv_heads,
			       &o->head_dim, &o->block_tokens };

	for (int i = 1; i < argc; i++) {
		size_t j = 0;

		if (!strcmp(argv[i], "--json")) {
			o->json = 1;
			continue;
		}
		if (i + 1 == argc)
			return -1;
		if (!strcmp(argv[i], "--policy")) {
			o->policy = argv[++i];
			continue;
		}
		if (!strcmp(argv[i], "--model")) {
			o->model = argv[++i];
			continue;
		}
		if (!strcmp(argv[i], "--backend")) {
			o->backend = argv[++i];
			if (strcmp(o->backend, "host") && strcmp(o->backend, "cuda"))
				return -1;
			continue;
		}
		while (j < sizeof names / sizeof names[0] && strcmp(argv[i], names[j]))
			j++;
		if (j == sizeof names / sizeof names[0])
			return -1;
		*counts[j] = (uint32_t)strtoul(argv[++i], NULL, 10);
	}
	return o->blocks >= CHAIN && o->samples && o->prompts && o->workers && o->workers <= 64 && o->layers && o->kv_heads && o->head_dim &&
			       o->block_tokens ? 0 : -1;
}

static double pct(double *v, uint32_t n, double p)
{
	qsort(v, n, sizeof *v, cmp_double);
	return v[(uint32_t)(p * (n - 1) + 0.5)];
}

int cmd_remote(int argc, char **argv)
{
	struct opt o = { .blocks = 1024, .samples = 200, .prompts = 4, .workers = 4, .layers = 4, .kv_heads = 8, .head_dim = 128,
		.block_tokens = 16, .policy = "int8", .backend = "host" };
	redisContext *cs[3] = { 0 };
	struct rkey *keys = NULL;
	kvq_client *a = NULL, *b = NULL, *bcold = NULL;
	struct worker ws[64] = { 0 };
	struct cpu c0, cpu_h = { 0 }, cpu_k = { 0 }, cpu_hw = { 0 }, cpu_kw = { 0 };
	struct tcpu t0b, th_k = { .n = 0 }, th_kw = { .n = 0 };
	uint32_t published, nkeys = 0, ptok = 0, *tok = NULL, hit;
	uint64_t fetched0, bytes0, fetched = 0, bytes_in = 0, hbytes[2], wfetched = 0, wbytes = 0;
	double fetch_s = 0, hs[2] = { -1, -1 }, hbest, wfetch_s = 0, hw[2] = { -1, -1 }, hwbest, *lat = NULL, *cold = NULL, *warm = NULL, t0;
	int nc = 0, r = 1, hits_whole = 1;
	struct rmodel rm;
	char rconf[1024];

	if (parse(argc, argv, &o) < 0) {
		fprintf(stderr, "usage: kvq-bench remote [--backend host|cuda] [--blocks N] [--samples M] [--prompts P] "
				"[--workers W (1-64)] [--layers L] [--kv-heads H] [--head-dim D] [--block-tokens B] "
				"[--policy NAME] [--model PATH] [--json]\n");
		return 2;
	}
	o.blocks -= o.blocks % CHAIN;
	cluster_handlers();
	if (!cluster_folder() || !pick_ports() || !cluster_start()) {
		diag("no cluster (redis-server and redis-cli 7 installed?)");
		return 1;
	}
	if (!secrets_write("0123456789abcdef0123456789abcdef-the-bench-key") || !node_up(&A, &o, false) ||
	    !node_up(&B, &o, true))
		goto out;
	a = open_pool(&A, "shared", &o);
	b = open_pool(&B, "shared", &o);
	bcold = open_pool(&B, "cold", &o);
	if (!a || !b || !bcold)
		goto out;
	for (uint32_t i = 0; i < o.workers; i++)
		if (!(ws[i].c = open_pool(&B, "again", &o)))
			goto out;

	/* (a) */
	t0 = now_s();
	published = publish_chains(a, o.blocks, o.block_tokens);
	if (published != o.blocks || !written(a, published, WAIT_MS)) {
		diag("node A: %u blocks published, %llu written, %llu dropped", published,
		     (unsigned long long)figure(a, "remote_written"), (unsigned long long)figure(a, "remote_dropped"));
		goto out;
	}
	fprintf(stderr, "kvq-bench remote: node A published and wrote through %u blocks in %.2f s\n", published,
		now_s() - t0);
	nkeys = list_keys(cs, &nc, &keys);
	if (nkeys != published || nc != 3) {
		diag("%u keys on %d masters, %u blocks written", nkeys, nc, published);
		goto out;
	}
	settle();
	c0 = cpu_now();
	hs[0] = hiredis_loop(cs, nc, keys, nkeys, CHAIN, &hbytes[0]);
	cpu_h = cpu_since(c0);
	ptok = CHAIN * o.block_tokens;
	tok = malloc(sizeof(uint32_t) * (ptok + 1));
	fetched0 = figure(b, "remote_fetched");
	bytes0 = figure(b, "remote_bytes_in");
	settle();
	t0b = tcpu_now(B.pid);
	c0 = cpu_now();
	t0 = now_s();
	for (uint32_t ch = 0; tok && ch < published / CHAIN; ch++) {
		uint32_t ids[CHAIN], n = 0;

		chain_tokens(ch, ptok, tok);
		if (kvq_client_lookup(b, tok, ptok, ptok, NULL, 0, ids, &n) < 0) {
			diag("node B: lookup of chain %u: %s", ch, kvq_client_error(b));
			goto out;
		}
		hits_whole &= n == CHAIN;
		kvq_client_release(b, n, ids, 0, NULL);
	}
	fetch_s = now_s() - t0;
	cpu_k = cpu_since(c0);
	th_k = tcpu_since(B.pid, t0b);
	fetched = figure(b, "remote_fetched") - fetched0;
	bytes_in = figure(b, "remote_bytes_in") - bytes0;
	hs[1] = hiredis_loop(cs, nc, keys, nkeys, CHAIN, &hbytes[1]);
	/* the same chains again, by W workers at once in pool "again" */
	settle();
	c0 = cpu_now();
	hw[0] = hiredis_loop(cs, nc, keys, nkeys, CHAIN * o.workers, &hbytes[1]);
	cpu_hw = cpu_since(c0);
	fetched0 = figure(ws[0].c, "remote_fetched");
	bytes0 = figure(ws[0].c, "remote_bytes_in");
	settle();
	t0b = tcpu_now(B.pid);
	c0 = cpu_now();
	wfetch_s = workers_fetch(ws, o.workers, published / CHAIN, o.block_tokens, &hits_whole);
	cpu_kw = cpu_since(c0);
	th_kw = tcpu_since(B.pid, t0b);
	wfetched = figure(ws[0].c, "remote_fetched") - fetched0;
	wbytes = figure(ws[0].c, "remote_bytes_in") - bytes0;
	hw[1] = hiredis_loop(cs, nc, keys, nkeys, CHAIN * o.workers, &hbytes[1]);
	if (hs[0] <= 0 || hs[1] <= 0 || hw[0] <= 0 || hw[1] <= 0) {
		diag("the hiredis loop failed");
		goto out;
	}
	if (wfetch_s <= 0) {
		diag("node B's workers: a lookup failed");
		goto out;
	}
	hbest = hs[0] < hs[1] ? hs[0] : hs[1];
	hwbest = hw[0] < hw[1] ? hw[0] : hw[1];

	/* (b) */
	lat = calloc(o.samples, sizeof *lat);
	for (uint32_t i = 0; lat && i < o.samples; i++) {
		uint32_t id, got;
		uint64_t w = figure(a, "remote_written");

		chain_tokens(10000 + i, o.block_tokens, tok);
		t0 = now_ms();
		if (kvq_client_alloc(a, 0, 1, NULL, NULL, &id) < 0 || kvq_client_publish(a, 1, &id, -1, tok, NULL, 0, &got) < 0) {
			diag("node A: publish: %s", kvq_client_error(a));
			goto out;
		}
		while (figure(a, "remote_written") <= w && now_ms() - t0 < WAIT_MS)
			;
		lat[i] = now_ms() - t0;
		kvq_client_release(a, 1, &got, 0, NULL);
	}

	/* (c) */
	cold = calloc(o.prompts, sizeof *cold);
	warm = calloc(o.prompts, sizeof *warm);
	fetched0 = figure(b, "remote_fetched");
	bytes0 = figure(b, "remote_bytes_in");
	for (uint32_t p = 0; cold && warm && p < o.prompts; p++) {
		double ms;

		chain_tokens(20000 + p, ptok + 1, tok);
		if (prompt_ms(a, tok, ptok + 1, &o, &hit) < 0)
			goto out;
		written(a, figure(a, "remote_written"), WAIT_MS);
		if ((cold[p] = prompt_ms(bcold, tok, ptok + 1, &o, &hit)) < 0)
			goto out;
		hits_whole &= hit == 0;
		if ((ms = prompt_ms(b, tok, ptok + 1, &o, &hit)) < 0)
			goto out;
		warm[p] = ms;
		hits_whole &= hit == ptok;
	}
	/* (d) */
	remote_conf(rconf, sizeof rconf);
	rmodel_run(o.model, rconf, o.policy, !strcmp(o.backend, "cuda"), &rm);
	{
		uint64_t cf = figure(b, "remote_fetched") - fetched0, cb = figure(b, "remote_bytes_in") - bytes0;
		double value = fetched ? (double)bytes_in / (double)fetched : 0, f16 = (double)f16_block_bytes(&o);
		double kv_bps = (double)fetched / fetch_s, h_bps = (double)nkeys / hbest;
		double w_bps = (double)wfetched / wfetch_s, hw_bps = (double)nkeys / hwbest;
		double lmed = pct(lat, o.samples, 0.5), l99 = pct(lat, o.samples, 0.99), lmax = pct(lat, o.samples, 1);
		double cmed = median(cold, o.prompts), wmed = median(warm, o.prompts);

		if (o.json) {
			printf("{\"backend\": \"%s\", \"geometry\": {\"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, "
			       "\"block_tokens\": %u, \"policy\": \"%s\"}, \"fetch\": {\"blocks\": %llu, \"s\": %.4f, \"blocks_per_s\": %.1f, "
			       "\"mb_per_s\": %.1f, \"value_bytes\": %.0f, \"whole_hits\": %s}, \"hiredis\": {\"gets\": %u, "
			       "\"s\": [%.4f, %.4f], \"blocks_per_s\": %.1f, \"mb_per_s\": %.1f}, \"ratio\": %.3f, "
			       "\"workers\": {\"n\": %u, \"blocks\": %llu, \"s\": %.4f, \"blocks_per_s\": %.1f, "
			       "\"mb_per_s\": %.1f, \"hiredis\": {\"in_flight\": %u, \"s\": [%.4f, %.4f], "
			       "\"blocks_per_s\": %.1f}, \"ratio\": %.3f}, \"cpu_s\": {\"fetch\": {\"kvqd\": %.4f, "
			       "\"cluster\": %.4f, \"bench\": %.4f}, \"hiredis\": {\"cluster\": %.4f, \"bench\": %.4f}, "
			       "\"workers_fetch\": {\"kvqd\": %.4f, \"cluster\": %.4f, \"bench\": %.4f}, "
			       "\"workers_hiredis\": {\"cluster\": %.4f, \"bench\": %.4f}}, "
			       "\"write_through_ms\": {\"samples\": %u, \"median\": %.3f, \"p99\": %.3f, \"max\": %.3f}, "
			       "\"prompt\": {\"tokens\": %u, \"cold_ms\": %.2f, \"remote_hit_ms\": %.2f, \"saved_ms\": %.2f, "
			       "\"fetched\": %llu, \"bytes_in\": %llu}, \"bytes_per_token\": {\"remote\": %.1f, "
			       "\"f16\": %.1f}",
			       o.backend, o.layers, o.kv_heads, o.head_dim, o.block_tokens, o.policy,
			       (unsigned long long)fetched, fetch_s, kv_bps, (double)bytes_in / fetch_s / 1e6, value,
			       hits_whole ? "true" : "false",
			       nkeys, hs[0], hs[1], h_bps, (double)hbytes[0] / hbest / 1e6, kv_bps / h_bps, o.workers,
			       (unsigned long long)wfetched, wfetch_s, w_bps, (double)wbytes / wfetch_s / 1e6,
			       CHAIN * o.workers, hw[0], hw[1], hw_bps, w_bps / hw_bps, cpu_k.kvqd, cpu_k.cluster,
			       cpu_k.bench, cpu_h.cluster, cpu_h.bench, cpu_kw.kvqd, cpu_kw.cluster, cpu_kw.bench,
			       cpu_hw.cluster, cpu_hw.bench, o.samples,
			       lmed, l99, lmax, ptok + 1, cmed, wmed, cmed - wmed, (unsigned long long)cf,
			       (unsigned long long)cb, value / o.block_tokens, f16 / o.block_tokens);
		} else {
			printf("remote: %s pools, %u layers x %u KV heads x D %u, B %u, %s; a cluster of 3 masters + 3 "
			       "replicas on loopback\n", o.backend, o.layers, o.kv_heads, o.head_dim, o.block_tokens, o.policy);
			printf("(a) fetch, node B's lookups (%u chains of %u): %llu blocks in %.3f s: %.0f blocks/s, "
			       "%.1f MB/s (values of %.0f B)%s\n", published / CHAIN, CHAIN, (unsigned long long)fetched,
			       fetch_s, kv_bps, (double)bytes_in / fetch_s / 1e6, value,
			       hits_whole ? "" : " (NOT all whole hits)");
			printf("    hiredis GET loop, %u in flight, pipelined per master: %u GETs in %.3f s (best of "
			       "%.3f, %.3f): %.0f blocks/s, %.1f MB/s\n", CHAIN, nkeys, hbest, hs[0], hs[1], h_bps,
			       (double)hbytes[0] / hbest / 1e6);
			printf("    kvqd's fetch at %.1f %% of the hiredis loop\n", 100 * kv_bps / h_bps);
			printf("    CPU seconds: the fetch's: kvqd (node B, all threads) %.3f, the cluster's nodes %.3f, "
			       "this process %.3f; the first hiredis loop's: the cluster's nodes %.3f, the loop %.3f\n",
			       cpu_k.kvqd, cpu_k.cluster, cpu_k.bench, cpu_h.cluster, cpu_h.bench);
			printf("    node B's threads in the fetch, CPU seconds by name: ");
			tcpu_print(&th_k, false);
			printf("\n");
			printf("(a) fetch, %u workers of node B at once (their own connections and threads, a second pool "
			       "of the same keys): %llu blocks in %.3f s: %.0f blocks/s, %.1f MB/s\n", o.workers,
			       (unsigned long long)wfetched, wfetch_s, w_bps, (double)wbytes / wfetch_s / 1e6);
			printf("    hiredis GET loop, %u in flight, pipelined per master: %u GETs in %.3f s (best of "
			       "%.3f, %.3f): %.0f blocks/s\n", CHAIN * o.workers, nkeys, hwbest, hw[0], hw[1], hw_bps);
			printf("    kvqd's fetch with %u workers at %.1f %% of the hiredis loop with as many GETs in flight\n",
			       o.workers, 100 * w_bps / hw_bps);
			printf("    CPU seconds: the fetch's: kvqd %.3f, the cluster's nodes %.3f, this process %.3f; "
			       "the first hiredis loop's: the cluster's nodes %.3f, the loop %.3f\n", cpu_kw.kvqd,
			       cpu_kw.cluster, cpu_kw.bench, cpu_hw.cluster, cpu_hw.bench);
			printf("    node B's threads in the fetch, CPU seconds by name: ");
			tcpu_print(&th_kw, false);
			printf("\n");
			printf("(b) write-through, node A's publish to remote_written (%u one-block chains): median "
			       "%.3f ms, p99 %.3f ms, max %.3f ms\n", o.samples, lmed, l99, lmax);
			printf("(c) a prompt of %u tokens on node B: cold (no remote: its K/V written, quantized, sealed; no model run) %.2f ms, "
			       "the remote's whole hit %.2f ms: %.2f ms saved (medians of %u; %llu blocks, %llu bytes "
			       "fetched)\n", ptok + 1, cmed, wmed, cmed - wmed, o.prompts, (unsigned long long)cf,
			       (unsigned long long)cb);
			printf("    bytes per token moved: %.1f (the remote's values) against %.1f (f16): %.2fx\n",
			       value / o.block_tokens, f16 / o.block_tokens, f16 / (value ? value : 1));
		}
		if (o.json) {
			printf(", \"threads_s\": {\"fetch\": {");
			tcpu_print(&th_k, true);
			printf("}, \"workers_fetch\": {");
			tcpu_print(&th_kw, true);
			printf("}}");
		}
		rmodel_print(&rm, o.policy, o.json);
		if (o.json)
			printf("}\n");
	}
	r = hits_whole && rm.state != RMODEL_FAILED ? 0 : 1;
out:
	for (int i = 0; i < nc; i++)
		redisFree(cs[i]);
	for (uint32_t i = 0; i < nkeys; i++)
		free(keys[i].name);
	free(keys);
	free(tok);
	free(lat);
	free(cold);
	free(warm);
	kvq_client_free(a);
	kvq_client_free(b);
	kvq_client_free(bcold);
	for (uint32_t i = 0; i < o.workers && i < 64; i++)
		kvq_client_free(ws[i].c);
	if (A.pid > 0)
		test_daemon_stop(A.pid, A.dir);
	if (B.pid > 0)
		test_daemon_stop(B.pid, B.dir);
	secrets_remove();
	cleanup();
	return r;
}
