/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier (daemon/rtier.h) end to end: a real Redis Cluster of
 * three masters and three replicas on loopback (tests/redis_cluster.h: a
 * password and a Redis ACL user, which kvqd uses), and two kvqd "nodes"
 * with host pools, their own sockets and folders, the same [remote] and
 * namespace:
 *  - prompts published on node A are written through; on node B, whose
 *    pool never saw them, lookups hit them whole, and attention over the
 *    fetched blocks equals node A's and a cold recompute's on B, bit for bit;
 *  - values the test damages in Redis (a byte flipped, cut short, another
 *    block's value copied under a key) are refused: the hit stops before
 *    them, each refusal counted by kind, no client sees an error;
 *  - a node whose cluster does not answer starts and serves its pool;
 *  - a pool with remote_write = off reads the remote and never writes;
 *  - each fetch is timed: node B's fetches counted once per lookup that
 *    asked the remote, their time within the lookups' own, the same in
 *    the metrics' kvq_remote_fetch_seconds and kvqctl's "remote" object;
 *  - a node whose lookups wait 1 ms at most (host_tier_wait_ms), then with
 *    a master hung: what its fetches placed by then is a hit, attention
 *    over each prompt still equals node A's, and what came or was copied
 *    after the bound is neither published nor left held;
 *  - a pool with a host tier and a remote: a prompt whose first blocks
 *    are in the host tier and the rest only on the remote is a whole hit
 *    in one lookup (promoted, then fetched), attention equal to node A's
 *    and to a cold recompute, bit for bit;
 *  - a master stopped (SIGSTOP): B's lookups end within the remote's
 *    request_timeout_ms (timeouts counted), no client error;
 *  - a master killed mid-run: lookups and publishes on both nodes go on
 *    without a client error (misses, counted), and once the cluster failed
 *    over, a new prompt of A is a whole hit on B again;
 *  - at the end every slot of every pool on both nodes is accounted for.
 * A Redis that cannot be started fails the test.
 *
 * Built again as tests/gpu/test_cuda_remote (KVQ_TEST_CUDA): the same with
 * cuda pools on every node, whose records kvqd DMAs through a pinned
 * staging (D = 64, the CUDA kernels' smallest head dim, and twice the
 * capacity for the same slots; one KV split, so that attention over the
 * same bytes is the same bits).
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../metrics.h"
#include "../redis_cluster.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

#ifdef KVQ_TEST_CUDA
#include <cuda_runtime_api.h>
#define D_ 64
#define DS "64"
#define CAP "2M"
#define BACKEND "cuda"
#else
#define D_ 32
#define DS "32"
#define CAP "1M"
#define BACKEND "host"
#endif

/* test_tier's geometry: two layers of two KV heads (four query heads) */
#define L_ 2
#define H_ 2
#define QH_ 4
/* head dim D_, 16-token blocks; a prompt of 83 tokens is 5 sealed blocks
 * (a lookup hits 80 tokens) and 3 more; 2 queries */
#define B_ 16
#define NTOK 83
#define NQ 2
#define NBLK (NTOK / B_)
#define HIT (NBLK * B_)
#define NPROMPT 6
#define MODEL "test/remote@1"

#include "../prompts.h"

typedef float attn_t[L_][NQ * QH_ * D_];

struct node {
	const char *tag;
	pid_t pid;
	char dir[64], sock[108], bin[256];
};

static struct node A = { .tag = "remoteA" }, B = { .tag = "remoteB" };
static int metrics_port;   /* node B's */
static unsigned wait_ms = 3000;   /* host_tier_wait_ms of the next node */

static void prompt_tokens(uint32_t p, uint32_t *tok)
{
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 3000 + 7919 * p + 13 * i;
}

static kvq_client *open_pool(const struct node *n, const char *pool)
{
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(n->sock, "remote", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &a) < 0) {
		diag("%s: attach %s: %s", n->tag, pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Prompt p from its lookup on: its hit, its attention.  The blocks stay
 * published. */
static int run_prompt(kvq_client *c, uint32_t p, uint32_t *ret_hit, attn_t out)
{
	uint32_t tok[NTOK];

	prompt_tokens(p, tok);
	return prompt_run(c, tok, ret_hit, out, NULL);
}

#define figure prompt_figure

/* Waits (up to ms) until c's pool wrote at least want blocks and its queue
 * is empty. */
static bool written(kvq_client *c, uint64_t want, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (figure(c, "remote_written") >= want && figure(c, "remote_queue") == 0)
			return true;
		usleep(10000);
	}
	return false;
}

/* --- the cluster's keys --- */

#define MAXKEYS 4096
struct rkey {
	char name[256];
	uint8_t chain[32], parent[32];
	bool has_parent;
};

static int list_keys(struct rkey *out, int max)
{
	int m[3], nm = masters(m, 3), n = 0;

	for (int i = 0; i < nm; i++) {
		redisReply *r = admin(m[i], "KEYS kvq:*");

		for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements && n < max; k++)
			snprintf(out[n++].name, sizeof out[0].name, "%s", r->element[k]->str);
		freeReplyObject(r);
	}
	return n;
}

/* The value under key from its master, or NULL (free it). */
static redisReply *get_value(const char *key)
{
	for (int tries = 0; tries < 3; tries++) {
		int m[3], nm = masters(m, 3);

		for (int i = 0; i < nm; i++) {
			redisReply *r = admin(m[i], "GET %s", key);

			if (r && r->type == REDIS_REPLY_STRING)
				return r;
			freeReplyObject(r);
		}
	}
	return NULL;
}

static bool set_value(const char *key, const void *val, size_t len)
{
	int m[3], nm = masters(m, 3);

	for (int i = 0; i < nm; i++) {
		const char *argv[] = { "SET", key, val };
		const size_t argvlen[] = { 3, strlen(key), len };
		redisContext *c = admin_conn(m[i]);
		redisReply *r = c ? redisCommandArgv(c, 3, argv, argvlen) : NULL;
		bool ok = r && r->type == REDIS_REPLY_STATUS;

		freeReplyObject(r);
		redisFree(c);
		if (ok)
			return true;
	}
	return false;
}

/* The keys of the blocks of one prompt written since before[nbefore], in
 * chain order, into chain[NBLK]: true when all were found. */
static bool prompt_keys(const struct rkey *before, int nbefore, struct rkey *chain)
{
	static struct rkey now[MAXKEYS];
	struct rkey fresh[NBLK];
	int n = list_keys(now, MAXKEYS), nf = 0;

	for (int i = 0; i < n; i++) {
		bool old = false;

		for (int j = 0; j < nbefore && !old; j++)
			old = !strcmp(before[j].name, now[i].name);
		if (old)
			continue;
		if (nf == NBLK)
			return false;
		redisReply *v = get_value(now[i].name);

		if (!v || v->len < 128) {
			freeReplyObject(v);
			return false;
		}
		fresh[nf] = now[i];
		memcpy(fresh[nf].chain, v->str + 64, 32);
		memcpy(fresh[nf].parent, v->str + 96, 32);
		fresh[nf].has_parent = (uint8_t)v->str[12] & 1;
		nf++;
		freeReplyObject(v);
	}
	if (nf != NBLK)
		return false;
	/* in chain order: the root, then each one's child */
	for (int k = 0; k < NBLK; k++) {
		bool found = false;

		for (int i = 0; i < nf && !found; i++)
			if (k == 0 ? !fresh[i].has_parent
				   : fresh[i].has_parent && !memcmp(fresh[i].parent, chain[k - 1].chain, 32)) {
				chain[k] = fresh[i];
				found = true;
			}
		if (!found)
			return false;
	}
	return true;
}

/* --- the nodes --- */

/* Node n with pools, its remote's seeds the cluster's first two nodes, or
 * port (not 0). */
static bool node_start_kvqd(struct node *n, const char *pools, int port)
{
	char extra[4096];

	snprintf(extra, sizeof extra,
		 "host_tier_wait_ms = %u\nmetrics_listen = 127.0.0.1:%d\n"
		 "[remote shared]\nnodes = 127.0.0.1:%d,127.0.0.1:%d\nuser = " ACL_USER "\n"
		 "password_file = %s/password\nhmac_key_file = %s/hmac\nrequest_timeout_ms = 500\n"
		 "connect_timeout_ms = 300\n%s",
		 wait_ms, n == &B ? metrics_port : free_port(), port ? port : ports[0], port ? port : ports[1], secrets, secrets,
		 pools);
	n->pid = test_daemon_start_conf(BACKEND, n->tag, extra, n->dir, sizeof n->dir, n->sock, sizeof n->sock, n->bin,
					sizeof n->bin);
	return n->pid > 0;
}

#define POOL(name, rest) \
	"[pool " name "]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = " DS "\nblock_tokens = 16\n" \
	"policy = int8\ncapacity = " CAP "\n" rest

/* Every slot of c's pool accounted for, nothing held: free + cached ==
 * slots. */
static void accounted(kvq_client *c, const char *what)
{
	uint64_t n = figure(c, "n_sealed"), fr = figure(c, "sealed_free"), ca = figure(c, "cached"),
		 he = figure(c, "sealed_held"), re = figure(c, "sealed_reserved"), rf = figure(c, "referenced");

	ok(n != UINT64_MAX && fr + ca + he + re == n && he == 0 && re == 0 && rf == 0,
	   "%s: every slot accounted for: %llu sealed = %llu free + %llu cached, none held, reserved or referenced",
	   what, (unsigned long long)n, (unsigned long long)fr, (unsigned long long)ca);
}

/* Prompts 1 .. NPROMPT-1 again on c: the tokens they hit; *all false on
 * a failure, *bad counts those whose attention is not first[p]'s. */
static uint64_t prompts_again(kvq_client *c, attn_t *first, bool *all, int *bad)
{
	static attn_t again;
	uint64_t hits = 0;
	uint32_t hit;

	for (uint32_t p = 1; p < NPROMPT; p++) {
		int r = run_prompt(c, p, &hit, again);

		*all &= r == 0;
		hits += r == 0 ? hit : 0;
		*bad += r == 0 && memcmp(again, first[p], sizeof again) != 0;
	}
	return hits;
}

/* Node B's fetch times in pool (c's): n fetches, one per lookup that asked
 * the remote, within the spent_ms those lookups took in all; the buckets
 * cumulative; the metrics' histogram and kvqctl's "remote" object agree
 * with the figures. */
static void fetch_times(kvq_client *c, const char *pool, uint64_t n, double spent_ms)
{
	static const char *const le[] = { "250us", "500us", "1ms", "2_5ms", "10ms", "50ms", "250ms", "1s" };
	static char body[1 << 20], doc[1 << 16];
	const char *ctl = getenv("KVQ_TEST_KVQCTL"), *top = getenv("top_builddir");
	uint64_t fetches = figure(c, "remote_fetches"), us = figure(c, "remote_fetch_us"), prev = 0;
	char prefix[128], name[64], path[512];
	bool mono = true;
	double count, sum;

	for (size_t k = 0; k < sizeof le / sizeof le[0]; k++) {
		uint64_t v;

		snprintf(name, sizeof name, "remote_fetch_le_%s", le[k]);
		v = figure(c, name);
		mono &= v >= prev && v <= fetches;
		prev = v;
	}
	ok(fetches == n && us > 0 && us <= spent_ms * 1e3 && mono && figure(c, "remote_fetch_le_1s") == n,
	   "node B: %llu fetches timed (one per lookup that asked the remote), %.2f ms in all within the lookups' "
	   "%.2f ms, cumulative buckets rising to %llu at 1 s", (unsigned long long)fetches, (double)us / 1e3,
	   spent_ms, (unsigned long long)figure(c, "remote_fetch_le_1s"));
	snprintf(prefix, sizeof prefix, "kvq_remote_fetch_seconds_count{pool=\"%s\"} ", pool);
	count = http_get(metrics_port, "/metrics", body, sizeof body) > 0 ? metric(body, prefix) : -1;
	snprintf(prefix, sizeof prefix, "kvq_remote_fetch_seconds_sum{pool=\"%s\"} ", pool);
	sum = metric(body, prefix);
	snprintf(prefix, sizeof prefix, "kvq_remote_fetch_seconds_bucket{pool=\"%s\",le=\"+Inf\"} ", pool);
	ok(count == (double)fetches && metric(body, prefix) == count && sum * 1e6 > (double)us - 1 &&
	   sum * 1e6 < (double)us + 1,
	   "the metrics' kvq_remote_fetch_seconds agrees: count %g, +Inf %g, sum %.6f s", count, metric(body, prefix), sum);
	snprintf(path, sizeof path, "%s%s", ctl ? ctl : top ? top : ".", ctl ? "" : "/kvqctl/kvqctl");
	if (ctl_stats_json(path, B.sock, pool, doc, sizeof doc) != 0)
		doc[0] = 0;
	count = jnum(doc, "\"remote\"", "fetches");
	sum = jnum(doc, "\"fetch_le\"", "1s");
	ok(count == (double)n && sum == (double)n &&
	   jnum(doc, "\"remote\"", "fetched") == (double)figure(c, "remote_fetched"),
	   "kvqctl --json stats: the remote object has the fetches (%g), their buckets (%g at 1 s) and the blocks "
	   "fetched", count, sum);
}

int main(void)
{
	static attn_t first[NPROMPT], again, cold;
	static struct rkey before[MAXKEYS];
	struct rkey chain[NBLK];
	kvq_client *a, *b, *bro, *bcold, *btier;
	uint32_t hit;
	int nbefore, r, bad;
	double spent_ms = 0;
	bool all;

#ifdef KVQ_TEST_CUDA
	if (test_cuda_skip())
		return 0;
#endif
	if (!cluster_up())
		return done_testing();
	/* after the cluster holds its ports: a port picked before could be a
	 * cluster bus port (port + 10000) that was free when picked */
	metrics_port = free_port();
	if (!ok(secrets_write("0123456789abcdef0123456789abcdef-the-cluster-key"), "secrets (mode 0600)"))
		return done_testing();
	/* a cluster that does not answer does not stop kvqd */
	{
		struct node C = { .tag = "remoteC" };
		kvq_client *c = NULL;
		int none = ports[NODES - 1] + 1;

		r = node_start_kvqd(&C, POOL("shared", "remote = shared\nremote_namespace = ns1\n"), none) ? 0 : -1;
		c = r == 0 ? open_pool(&C, "shared") : NULL;
		r = c ? run_prompt(c, 0, &hit, again) : -1;
		ok(r == 0 && hit == 0 && figure(c, "remote_written") == 0,
		   "a node whose cluster does not answer (port %d) starts and serves its pool (no error)", none);
		kvq_client_free(c);
		if (C.pid > 0)
			test_daemon_stop(C.pid, C.dir);
	}
	if (!ok(node_start_kvqd(&A, POOL("shared", "remote = shared\nremote_namespace = ns1\n"), 0) &&
		node_start_kvqd(&B, POOL("shared", "remote = shared\nremote_namespace = ns1\n")
				    POOL("reader", "remote = shared\nremote_namespace = ns1\nremote_write = off\n")
				    POOL("tiered", "remote = shared\nremote_namespace = ns1\nhost_capacity = " CAP "\n")
				    POOL("cold", ""), 0),
		"two kvqd nodes with " BACKEND " pools sharing remote 'shared', namespace ns1"))
		goto out;
	a = open_pool(&A, "shared");
	b = open_pool(&B, "shared");
	bro = open_pool(&B, "reader");
	bcold = open_pool(&B, "cold");
	btier = open_pool(&B, "tiered");
	if (!ok(a && b && bro && bcold && btier, "attached to the pools"))
		goto out;

	/* write through on A, fetch on B */
	all = true;
	for (uint32_t p = 0; p < NPROMPT; p++)
		all &= run_prompt(a, p, &hit, first[p]) == 0 && hit == 0;
	all &= written(a, NPROMPT * NBLK, 5000);
	ok(all,
	   "node A: %d prompts cold, %llu blocks written through (%llu bytes out)", NPROMPT,
	   (unsigned long long)figure(a, "remote_written"), (unsigned long long)figure(a, "remote_bytes_out"));
	all = true;
	bad = 0;
	for (uint32_t p = 0; p < NPROMPT; p++) {
		double t0 = now_ms();

		r = run_prompt(b, p, &hit, again);
		spent_ms += now_ms() - t0;
		all &= r == 0 && hit == HIT;
		bad += r == 0 && memcmp(again, first[p], sizeof again) != 0;
	}
	ok(all && figure(b, "remote_hit_tokens") == (uint64_t)NPROMPT * HIT && figure(b, "remote_fetched") ==
	   (uint64_t)NPROMPT * NBLK, "node B: each prompt, never seen there, a whole hit (%u tokens) from the remote "
	   "(%llu blocks fetched, %llu bytes in)", HIT, (unsigned long long)figure(b, "remote_fetched"),
	   (unsigned long long)figure(b, "remote_bytes_in"));
	ok(bad == 0, "node B: attention over the fetched blocks equals node A's, bit for bit");
	fetch_times(b, "shared", NPROMPT, spent_ms);
	r = run_prompt(bcold, 0, &hit, cold);
	ok(r == 0 && hit == 0 && memcmp(cold, first[0], sizeof cold) == 0,
	   "and equals a cold recompute on node B (a pool without a remote), bit for bit");
	r = run_prompt(bro, 1, &hit, again);
	ok(r == 0 && hit == HIT && memcmp(again, first[1], sizeof again) == 0,
	   "remote_write = off: the pool reads the remote (a whole hit, attention equal)");

	/* remote_write = off never writes */
	r = run_prompt(bro, 50, &hit, again);
	usleep(200 * 1000);
	ok(r == 0 && figure(bro, "remote_written") == 0 && figure(bro, "remote_queue") == 0 &&
	   figure(bro, "remote_bytes_out") == 0, "remote_write = off: a new prompt published there is not written");
	r = run_prompt(a, 50, &hit, again);
	ok(r == 0 && hit == 0, "node A: that prompt is no hit (it is not on the remote)");

	/* the host tier, then the remote, in one lookup */
	{
		const uint32_t p = 70, head = 2;
		uint32_t tok[NTOK], ids[NBLK], n = 0;
		uint64_t prom, fetched, w = figure(a, "remote_written");
		char out[4096];

		r = run_prompt(a, p, &hit, first[0]);
		ok(r == 0 && hit == 0 && written(a, w + NBLK, 3000),
		   "prompt %u cold on A, written through", p);
		/* its first blocks fetched into B's pool, then sent to its host tier */
		prompt_tokens(p, tok);
		r = kvq_client_lookup(btier, tok, head * B_, head * B_, NULL, 0, ids, &n);
		r = r < 0 ? r : kvq_client_release(btier, n, ids, 0, NULL);
		r |= test_daemon_ctl(B.sock, out, sizeof out, "demote tiered");
		for (int i = 0; i < 200 && figure(btier, "demoting") != 0; i++)
			usleep(5000);
		ok(r == 0 && n == head && figure(btier, "cached") == 0 && figure(btier, "tier_records") == head,
		   "node B, tiered: the prompt's first %u blocks in its host tier (%llu records), none cached: %s",
		   head, (unsigned long long)figure(btier, "tier_records"), out);
		prom = figure(btier, "tier_promotions");
		fetched = figure(btier, "remote_fetched");
		r = run_prompt(btier, p, &hit, again);
		ok(r == 0 && hit == HIT && figure(btier, "tier_promotions") == prom + head &&
		   figure(btier, "remote_fetched") == fetched + NBLK - head,
		   "one lookup hits the whole prompt (%u tokens): %llu blocks promoted from the host tier, then %llu "
		   "fetched from the remote", hit, (unsigned long long)(figure(btier, "tier_promotions") - prom),
		   (unsigned long long)(figure(btier, "remote_fetched") - fetched));
		ok(r == 0 && memcmp(again, first[0], sizeof again) == 0,
		   "attention over it equals node A's, bit for bit");
		r = run_prompt(bcold, p, &hit, cold);
		ok(r == 0 && hit == 0 && memcmp(again, cold, sizeof cold) == 0,
		   "and a cold recompute's on node B, bit for bit");
	}

	/* a bound that passes while values are still coming or being copied */
	{
		struct node D = { .tag = "remoteD" };
		kvq_client *d = NULL, *late = NULL;
		uint64_t hits = 0, late_hits = 0;
		int m[3], nm = masters(m, 3), victim = nm > 0 ? node_index(m[0]) : -1;

		wait_ms = 1;
		all = node_start_kvqd(&D, POOL("shared", "remote = shared\nremote_namespace = ns1\n")
					  POOL("late", "remote = shared\nremote_namespace = ns1\n"), 0);
		wait_ms = 3000;
		d = all ? open_pool(&D, "shared") : NULL;
		late = all ? open_pool(&D, "late") : NULL;
		bad = 0;
		hits = d ? prompts_again(d, first, &all, &bad) : 0;
		/* a master hung: its GETs outlive the lookups, the others' values
		 * come and are copied around the bound */
		if (victim >= 0)
			kill(pids[victim], SIGSTOP);
		late_hits = late ? prompts_again(late, first, &all, &bad) : 0;
		if (victim >= 0)
			kill(pids[victim], SIGCONT);
		usleep(800 * 1000);   /* the late replies (request_timeout_ms 500) and copies come back */
		ok(d && late && all && victim >= 0 && bad == 0 && late_hits < (uint64_t)(NPROMPT - 1) * HIT,
		   "host_tier_wait_ms = 1: %d prompts hit %llu of %d tokens, with a master hung %llu; attention over "
		   "each equals node A's", NPROMPT - 1, (unsigned long long)hits, (NPROMPT - 1) * HIT,
		   (unsigned long long)late_hits);
		if (d)
			accounted(d, "node D (1 ms bound), shared");
		if (late)
			accounted(late, "node D (1 ms bound, a master hung), late");
		kvq_client_free(d);
		kvq_client_free(late);
		if (D.pid > 0)
			test_daemon_stop(D.pid, D.dir);
		ok(wait_cluster_ok(20000), "the hung master serves again");
	}

	/* damaged values: refused, counted, a shorter hit, no error */
	{
		static const struct {
			const char *kind, *fig;
			uint32_t at;
		} cases[] = { { "a byte flipped", "remote_errors_hmac", 2 },
			      { "cut short", "remote_errors_truncated", 1 },
			      { "another block's value under its key", "remote_errors_key", 3 } };
		struct rkey other[NBLK];
		bool have_other = false;

		for (uint32_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
			uint32_t p = 20 + i;
			redisReply *v;
			uint64_t errs = figure(b, cases[i].fig);
			bool done = false;

			nbefore = list_keys(before, MAXKEYS);
			r = run_prompt(a, p, &hit, first[0]);
			if (!ok(r == 0 && written(a, figure(a, "remote_written"), 3000) &&
				prompt_keys(before, nbefore, chain), "prompt %u on A: its %d keys found", p, NBLK))
				continue;
			v = get_value(chain[cases[i].at].name);
			if (v && i == 0) {
				v->str[v->len / 2] ^= 0x40;
				done = set_value(chain[cases[i].at].name, v->str, v->len);
			} else if (v && i == 1) {
				done = set_value(chain[cases[i].at].name, v->str, v->len - 100);
			} else if (v && have_other) {
				redisReply *o = get_value(other[cases[i].at].name);

				done = o && set_value(chain[cases[i].at].name, o->str, o->len);
				freeReplyObject(o);
			}
			freeReplyObject(v);
			if (!have_other) {
				memcpy(other, chain, sizeof other);
				have_other = true;
			}
			r = run_prompt(b, p, &hit, again);
			ok(done && r == 0 && hit == cases[i].at * B_ && figure(b, cases[i].fig) == errs + 1,
			   "a value %s is refused: the hit stops before it (%u tokens), %s counted, no error",
			   cases[i].kind, hit, cases[i].fig);
			ok(r == 0 && memcmp(again, first[0], sizeof again) == 0,
			   "and attention over that prompt still equals node A's");
		}
	}

	/* a master stopped (hung): lookups end within the remote's bound */
	{
		int m[3], nm = masters(m, 3), victim = nm > 0 ? node_index(m[0]) : -1, errs = 0;
		uint64_t to = figure(b, "remote_errors_timeout");
		double t0, worst = 0;

		for (uint32_t p = 60; p < 62; p++)
			errs += run_prompt(a, p, &hit, first[0]) < 0;
		written(a, figure(a, "remote_written"), 3000);
		if (victim >= 0)
			kill(pids[victim], SIGSTOP);
		for (uint32_t p = 60; p < 62; p++) {
			t0 = now_ms();
			errs += run_prompt(b, p, &hit, again) < 0;
			worst = now_ms() - t0 > worst ? now_ms() - t0 : worst;
		}
		if (victim >= 0)
			kill(pids[victim], SIGCONT);
		ok(victim >= 0 && errs == 0 && worst < 1500 && figure(b, "remote_errors_timeout") > to,
		   "a master stopped: B's prompts run without an error, the slowest in %.0f ms (request_timeout_ms "
		   "500), %llu timeouts counted", worst, (unsigned long long)(figure(b, "remote_errors_timeout") - to));
		ok(wait_cluster_ok(20000), "the stopped master serves again");
	}

	/* a master killed mid-run */
	{
		int m[3], victim, errs = 0, nm = masters(m, 3);
		uint64_t before_hits;

		for (uint32_t p = 30; p < 36; p++)
			errs += run_prompt(a, p, &hit, first[0]) < 0;
		written(a, figure(a, "remote_written"), 3000);
		victim = nm > 0 ? node_index(m[0]) : -1;
		if (victim >= 0) {
			kill(-pids[victim], SIGKILL);
			kill(pids[victim], SIGKILL);
			waitpid(pids[victim], NULL, 0);
			pids[victim] = 0;
		}
		before_hits = figure(b, "remote_hit_tokens");
		for (uint32_t p = 30; p < 36; p++)
			errs += run_prompt(b, p, &hit, again) < 0;
		for (uint32_t p = 40; p < 44; p++)
			errs += run_prompt(a, p, &hit, again) < 0;
		ok(victim >= 0 && errs == 0,
		   "a master killed: lookups on B and publishes on A go on without a client error (B hit %llu tokens)",
		   (unsigned long long)(figure(b, "remote_hit_tokens") - before_hits));
		ok(wait_cluster_ok(20000), "the cluster failed over");
		errs = 0;
		bool whole = false;

		for (int t = 0; t < 15 && !whole; t++) {
			uint32_t p = 100 + (uint32_t)t;

			errs += run_prompt(a, p, &hit, first[0]) < 0;
			written(a, figure(a, "remote_written") + NBLK, 1500);
			errs += run_prompt(b, p, &hit, again) < 0;
			whole = hit == HIT && !memcmp(again, first[0], sizeof again);
			if (!whole)
				usleep(200 * 1000);
		}
		diag("errors on A: %llu conn, %llu timeout, %llu down; on B: %llu conn, %llu timeout, %llu down",
		     (unsigned long long)figure(a, "remote_errors_conn"), (unsigned long long)figure(a, "remote_errors_timeout"),
		     (unsigned long long)figure(a, "remote_errors_down"), (unsigned long long)figure(b, "remote_errors_conn"),
		     (unsigned long long)figure(b, "remote_errors_timeout"), (unsigned long long)figure(b, "remote_errors_down"));
		ok(whole && errs == 0, "after the failover a new prompt of A is a whole hit on B again, attention equal");
	}

	accounted(a, "node A, shared");
	accounted(b, "node B, shared");
	accounted(bro, "node B, reader");
	accounted(bcold, "node B, cold");
	accounted(btier, "node B, tiered");
	kvq_client_free(a);
	kvq_client_free(b);
	kvq_client_free(bro);
	kvq_client_free(bcold);
	kvq_client_free(btier);
out:
	if (A.pid > 0)
		test_daemon_stop(A.pid, A.dir);
	if (B.pid > 0)
		test_daemon_stop(B.pid, B.dir);
	secrets_remove();
	return done_testing();
}
