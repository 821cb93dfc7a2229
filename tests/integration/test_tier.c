/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host tier against a real kvqd with host pools (kvqd.conf
 * host_capacity, daemon/tiering.h):
 *  - a small pool with a tier: prompts written until the pool held three
 *    times its sealed slots; the first prompt's blocks went to the tier
 *    (demotions counted, none cancelled), and a lookup of it promotes them:
 *    the whole chain is a hit again, and attention over it equals the
 *    attention computed over the same prompt before it left, bit for bit;
 *  - the same with a tier too small for everything: the tier evicts its
 *    oldest records, lookups of the newest prompts still hit whole and
 *    attend equal, and every record left is whole (a lookup of the oldest
 *    prompt is a shorter hit or none, never a wrong block);
 *  - the same in a pool with sink blocks, whose chains' first blocks (sink
 *    records) move too;
 *  - an attach that creates a pool with a tier, and one whose tier is
 *    beyond the host's budget (-ENOSPC);
 *  - kvqctl demote: a prompt sent to the tier on an admin's word, then
 *    promoted whole, attention equal; refused for a pool with no tier;
 *  - a tensor-parallel group of two ranks: demoted together, promoted on
 *    both by the group's lookup, found whole by the next;
 *  - a host_capacity beyond the host's budget stops kvqd at start.
 * Built again as tests/gpu/test_cuda_tier (KVQ_TEST_CUDA): the same with
 * cuda pools, whose blocks kvqd copies through the device (D = 64, the
 * CUDA kernels' smallest head dim; one KV split, so that attention over
 * the same bytes is the same bits).
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
#include "../synth.h"
#include "kvq.h"
#include "layout.h"
#ifdef KVQ_TEST_CUDA
#include <cuda_runtime_api.h>
#define D_ 64
#define DS "64"
#define CAP "512K"
#define BACKEND "cuda"
#else
#define D_ 32
#define DS "32"
#define CAP "256K"
#define BACKEND "host"
#endif

#define L_ 2
#define H_ 2
#define QH_ 4
#define B_ 16
#define NTOK 83                /* 5 sealed blocks (a lookup hits 80 tokens) and 3 more */
#define NQ 2
#define MAXP 256
#define MODEL "test/tier@1"

#include "../prompts.h"

static char sock_path[108];
static int metrics_port;

static void prompt_tokens(uint32_t p, uint32_t *tok)
{
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 1000 + 7919 * p + 13 * i;
}

static kvq_client *open_pool(const char *pool, uint32_t sinks)
{
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(sock_path, "tier", &c) < 0)
		return NULL;
	if ((sinks && kvq_client_set_sinks(c, 1, 0) < 0) || kvq_client_attach(c, &a) < 0) {
		diag("attach %s: %s", pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Prompt p from its lookup on: its hit in *ret_hit, its attention in out.
 * The sequence is freed, its blocks left published. */
static int run_prompt(kvq_client *c, uint32_t p, uint32_t *ret_hit, float (*out)[NQ * QH_ * D_])
{
	uint32_t tok[NTOK];

	prompt_tokens(p, tok);
	return prompt_run(c, tok, ret_hit, out, NULL);
}

#define figure prompt_figure

/* Writes prompts 0 .. n-1 cold, the attention of those in keep[] kept;
 * each waits for the copies it started, as a real worker's compute
 * between steps would let them run. */
static int fill(kvq_client *c, uint32_t n, float (*first)[L_][NQ * QH_ * D_], uint32_t n_first)
{
	float out[L_][NQ * QH_ * D_];
	uint32_t hit;

	for (uint32_t p = 0; p < n; p++) {
		if (run_prompt(c, p, &hit, p < n_first ? first[p] : out) < 0 || hit != 0)
			return -1;
		/* the copies it started end before the next prompt allocates
		 * (a loaded machine, a sanitizer, can take longer than a few ms) */
		for (int i = 0; i < 200 && figure(c, "demoting") > 0; i++)
			usleep(1000);
	}
	return 0;
}

/* The metrics' copy-time histogram of pool against its copies figure. */
static void test_copy_histogram(kvq_client *c, const char *pool)
{
	static char body[1 << 20];
	char prefix[128];
	uint64_t before = figure(c, "tier_copies"), after;
	double n;

	/* copies may still run: the count lies between the figure before and after */
	snprintf(prefix, sizeof prefix, "kvq_tier_copy_seconds_count{pool=\"%s\"} ", pool);
	n = http_get(metrics_port, "/metrics", body, sizeof body) > 0 ? metric(body, prefix) : -1;
	after = figure(c, "tier_copies");
	ok(n > 0 && (uint64_t)n >= before && (uint64_t)n <= after,
	   "%s: the metrics' kvq_tier_copy_seconds counts the copy jobs (%g; tier_copies %llu, then %llu)", pool, n,
	   (unsigned long long)before, (unsigned long long)after);
}

static void test_tier(const char *pool, bool small, uint32_t sinks)
{
	static float first[2][L_][NQ * QH_ * D_], again[L_][NQ * QH_ * D_];
	kvq_client *c = open_pool(pool, sinks);
	uint64_t sealed, dem, prom, evict;
	uint32_t n, hit = 0;
	int r;

	if (!ok(c != NULL, "%s: attach to a configured pool with a host tier", pool))
		return;
	sealed = figure(c, "n_sealed");
	n = (uint32_t)(3 * sealed / 5 + 3);
	n = n > MAXP ? MAXP : n;
	r = fill(c, n, first, 2);
	dem = figure(c, "tier_demotions");
	ok(r == 0 && figure(c, "tier_capacity") > 0 && dem >= sealed,
	   "%s: %u prompts (%u blocks) through %llu sealed slots: %llu blocks demoted, %llu cancelled", pool, n,
	   n * (NTOK / B_), (unsigned long long)sealed, (unsigned long long)dem,
	   (unsigned long long)figure(c, "tier_cancelled"));
	if (!small) {
		prom = figure(c, "tier_promotions");
		r = run_prompt(c, 0, &hit, again);
		ok(r == 0 && hit == (NTOK / B_) * B_ && figure(c, "tier_promotions") > prom &&
		   figure(c, "tier_hit_tokens") >= hit,
		   "%s: the first prompt, long gone from the pool, is a whole hit again (%u tokens), promoted "
		   "(%llu -> %llu)", pool, hit, (unsigned long long)prom,
		   (unsigned long long)figure(c, "tier_promotions"));
		ok(r == 0 && memcmp(again, first[0], sizeof again) == 0,
		   "%s: attention over the promoted chain equals the prompt's before it left, bit for bit", pool);
		r = run_prompt(c, 1, &hit, again);
		ok(r == 0 && hit == (NTOK / B_) * B_ && memcmp(again, first[1], sizeof again) == 0,
		   "%s: so does the second prompt's (hit %u)", pool, hit);
		test_copy_histogram(c, pool);
	} else {
		evict = figure(c, "tier_evictions");
		ok(evict > 0 && figure(c, "tier_records") <= figure(c, "tier_capacity") / 1,
		   "%s: the tier evicted %llu records for room, %llu left", pool, (unsigned long long)evict,
		   (unsigned long long)figure(c, "tier_records"));
		r = run_prompt(c, 0, &hit, again);
		ok(r == 0 && hit % B_ == 0 && (hit == 0 || memcmp(again, first[0], sizeof again) == 0),
		   "%s: the oldest prompt hits %u tokens (its head, if any), attention equal", pool, hit);
		r = run_prompt(c, n - 1, &hit, again);
		ok(r == 0 && hit == (NTOK / B_) * B_, "%s: the newest prompt is a whole hit (%u)", pool, hit);
	}
	kvq_client_free(c);
}

/* kvqctl ARGS... against the test's kvqd: its exit status, its output in
 * out[len]. */
static int ctl(char *out, size_t len, const char *args)
{
	return test_daemon_ctl(sock_path, out, len, args);
}

/* kvqctl demote: a prompt's blocks sent to the tier on an admin's word (no
 * reserve needed), then found whole and equal; refused for a pool with no
 * tier. */
static void test_demote(void)
{
	static float first[L_][NQ * QH_ * D_], again[L_][NQ * QH_ * D_];
	struct kvq_attach_params plain = { .pool = "plain", .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1, .n_sealed = 48,
		.n_open = 8, .backend = BACKEND, .device = -1 };
	kvq_client *c = open_pool("tiered", 0), *p = NULL;
	char out[4096];
	uint64_t dem, prom;
	uint32_t hit = 1;
	int r;

	if (!ok(c != NULL, "demote: attach"))
		return;
	r = run_prompt(c, 900, &hit, first);
	dem = figure(c, "tier_demotions");
	prom = figure(c, "tier_promotions");
	r |= ctl(out, sizeof out, "demote tiered");
	for (int i = 0; i < 200 && figure(c, "demoting") != 0; i++)
		usleep(5000);
	ok(r == 0 && hit == 0 && strstr(out, "sent to the host tier") && figure(c, "tier_demotions") > dem &&
	   figure(c, "cached") == 0,
	   "kvqctl demote sends every cached block to the tier (%llu -> %llu demotions), none left cached: %s",
	   (unsigned long long)dem, (unsigned long long)figure(c, "tier_demotions"), out);
	r = run_prompt(c, 900, &hit, again);
	ok(r == 0 && hit == (NTOK / B_) * B_ && figure(c, "tier_promotions") >= prom + NTOK / B_ &&
	   memcmp(again, first, sizeof again) == 0,
	   "then a lookup promotes the prompt whole (hit %u), attention equal bit for bit", hit);
	/* a chain split between the tiers: its last two blocks (the leaves
	 * go first) in the tier, the rest in the pool */
	prom = figure(c, "tier_promotions");
	r = ctl(out, sizeof out, "demote tiered 2");
	for (int i = 0; i < 200 && figure(c, "demoting") != 0; i++)
		usleep(5000);
	r |= run_prompt(c, 900, &hit, again);
	ok(r == 0 && hit == (NTOK / B_) * B_ && figure(c, "tier_promotions") == prom + 2 &&
	   memcmp(again, first, sizeof again) == 0,
	   "a chain split between pool and tier (2 blocks demoted) is a whole hit, 2 promoted (%llu), attention "
	   "equal", (unsigned long long)(figure(c, "tier_promotions") - prom));
	kvq_client_free(c);
	r = kvq_client_connect(sock_path, "tier", &p);
	r = r < 0 ? r : kvq_client_attach(p, &plain);
	ok(r == 0 && ctl(out, sizeof out, "demote plain") != 0 && strstr(out, "no host tier"),
	   "kvqctl demote of a pool without a tier is refused with a reason: %s", out);
	kvq_client_free(p);
}

/* Rank rank of group "tg" (2 ranks, H_ heads each), its member pool
 * created with a host tier. */
static kvq_client *open_rank(uint32_t rank)
{
	char pool[8];
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = 2 * H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1, .n_sealed = 48,
		.n_open = 8, .backend = BACKEND, .device = -1, .host_capacity = 1 << 20 };
	kvq_client *c = NULL;

	snprintf(pool, sizeof pool, "tg%u", rank);
	if (kvq_client_connect(sock_path, "tier-rank", &c) < 0 || kvq_client_set_group(c, "tg", rank, 2) < 0 ||
	    kvq_client_attach(c, &a) < 0) {
		diag("rank %u: %s", rank, c ? kvq_client_error(c) : "no connection");
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Request rid of prompt 700 on rank c: the lookup, then (write) the rest
 * written and attended; its hit in *ret_hit. */
static int rank_request(kvq_client *c, const char *rid, bool write, uint32_t *ret_hit, float (*out)[NQ * QH_ * D_])
{
	uint32_t tok[NTOK];
	kvq_seq *s = NULL;
	int r;

	prompt_tokens(700, tok);
	*ret_hit = UINT32_MAX;
	r = kvq_seq_new(c, NULL, 0, &s);
	r = r < 0 ? r : kvq_seq_set_request(s, rid, strlen(rid));
	r = r < 0 ? r : kvq_seq_from_prompt(s, tok, NTOK, ret_hit);
	if (write) {
		r = r < 0 ? r : append(s, tok, *ret_hit, NTOK);
		r = r < 0 ? r : attend(s, out);
	}
	kvq_seq_free(s);
	return r;
}

/* A tensor-parallel group of two ranks whose member pools have tiers: a
 * block demoted on one member is demoted on the other (kvqctl demote of
 * one member), the group's lookup counts only what every member caches and
 * starts the promotions on both, and the group's next lookup finds the
 * chain whole on both ranks, attention equal to before on each. */
static void test_group(void)
{
	static float first[2][L_][NQ * QH_ * D_], again[2][L_][NQ * QH_ * D_];
	kvq_client *c[2] = { open_rank(0), open_rank(1) };
	uint32_t hit[2] = { 1, 1 };
	char out[4096];
	int r = 0;

	if (!ok(c[0] && c[1], "group: two ranks attach, each member pool with a tier"))
		goto out;
	for (int k = 0; k < 2; k++)
		r |= rank_request(c[k], "g1", true, &hit[k], first[k]);
	r |= ctl(out, sizeof out, "demote tg0");
	for (int i = 0; i < 200 && (figure(c[0], "demoting") || figure(c[1], "demoting")); i++)
		usleep(5000);
	ok(r == 0 && hit[0] == 0 && hit[1] == 0 && figure(c[0], "cached") == 0 && figure(c[1], "cached") == 0 &&
	   figure(c[0], "tier_demotions") == NTOK / B_ && figure(c[1], "tier_demotions") == NTOK / B_,
	   "kvqctl demote of rank 0's pool demotes rank 1's copies too (%llu, %llu demoted; %llu, %llu cached)",
	   (unsigned long long)figure(c[0], "tier_demotions"), (unsigned long long)figure(c[1], "tier_demotions"),
	   (unsigned long long)figure(c[0], "cached"), (unsigned long long)figure(c[1], "cached"));
	for (int k = 0; k < 2; k++)
		r |= rank_request(c[k], "g2", false, &hit[k], NULL);
	for (int i = 0; i < 200 && (figure(c[0], "tier_records") || figure(c[1], "tier_records")); i++)
		usleep(5000);
	ok(r == 0 && hit[0] == 0 && hit[1] == 0 && figure(c[0], "tier_promotions") == NTOK / B_ &&
	   figure(c[1], "tier_promotions") == NTOK / B_,
	   "the group's lookup counts none of it (hits %u, %u) and promotes it on both members (%llu, %llu)",
	   hit[0], hit[1], (unsigned long long)figure(c[0], "tier_promotions"),
	   (unsigned long long)figure(c[1], "tier_promotions"));
	for (int k = 0; k < 2; k++)
		r |= rank_request(c[k], "g3", true, &hit[k], again[k]);
	ok(r == 0 && hit[0] == (NTOK / B_) * B_ && hit[1] == hit[0] && memcmp(again, first, sizeof again) == 0,
	   "the group's next lookup finds the chain whole on both ranks (%u, %u), attention equal on each", hit[0],
	   hit[1]);
out:
	kvq_client_free(c[0]);
	kvq_client_free(c[1]);
}

/* A pool an attach creates, with a host tier asked for in the attach. */
static void test_attach_create(void)
{
	struct kvq_attach_params a = { .pool = "made", .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1, .n_sealed = 48,
		.n_open = 8, .backend = BACKEND, .device = -1, .host_capacity = 1 << 20 };
	kvq_client *c = NULL;
	uint64_t cap;
	int r = kvq_client_connect(sock_path, "tier", &c);

	r = r < 0 ? r : kvq_client_attach(c, &a);
	cap = r < 0 ? 0 : figure(c, "tier_capacity");
	ok(r == 0 && cap > (1 << 20) - 8192 && cap <= 1 << 20,
	   "an attach that creates a pool gives it the host tier it asks for (%llu bytes)", (unsigned long long)cap);
	kvq_client_free(c);
	a.pool = "greedy";
	a.host_capacity = UINT64_C(1) << 40;
	c = NULL;
	r = kvq_client_connect(sock_path, "tier", &c);
	r = r < 0 ? r : kvq_client_attach(c, &a);
	ok(r == -ENOSPC && c && strstr(kvq_client_error(c), "host_capacity"),
	   "one that asks for more than the host's budget is refused: %d %s", r, c ? kvq_client_error(c) : "");
	kvq_client_free(c);
}

static void test_budget(void)
{
	char dir[64], sock[108], bin[512];
	pid_t pid = test_daemon_start_conf(BACKEND, "tierbad",
					   "[pool over]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\n"
					   "block_tokens = 16\npolicy = int8\ncapacity = 1M\nhost_capacity = 512M\n",
					   dir, sizeof dir, sock, sizeof sock, bin, sizeof bin);

	ok(pid < 0, "a host tier beyond the host budget (512M of 256M) stops kvqd at start");
	if (pid > 0)
		test_daemon_stop(pid, dir);
	else {
		char cmd[128];

		snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
		if (system(cmd) != 0)
			diag("cannot remove %s", dir);
	}
}

int main(void)
{
	char dir[64], bin[512];
	/* the reserve (20 % of 48 sealed slots) covers one prompt's
	 * allocation (6): below it an allocation evicts, and a block it drops
	 * takes the records below it along */
	char pools[2048];
	const char *sections =
		"host_tier_reserve = 20\n"
		"[pool tiered]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = " DS "\nblock_tokens = 16\n"
		"policy = int8\ncapacity = " CAP "\nhost_capacity = 4M\n"
		"[pool small]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = " DS "\nblock_tokens = 16\n"
		"policy = int8\ncapacity = " CAP "\nhost_capacity = 96K\n"
		"[pool sinky]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = " DS "\nblock_tokens = 16\n"
		"policy = int8\nsink_blocks = 1\ncapacity = " CAP "\nhost_capacity = 4M\n";
	pid_t pid;

#ifdef KVQ_TEST_CUDA
	if (test_cuda_skip())
		return 0;
#endif
	metrics_port = free_port();
	snprintf(pools, sizeof pools, "metrics_listen = 127.0.0.1:%d\n%s", metrics_port, sections);
	pid = test_daemon_start_conf(BACKEND, "tier", pools, dir, sizeof dir, sock_path, sizeof sock_path, bin,
				     sizeof bin);

	if (!ok(pid > 0, "kvqd starts with two pools with host tiers (%s)", bin))
		return done_testing();
	test_tier("tiered", false, 0);
	test_tier("small", true, 0);
	test_tier("sinky", false, 1);
	test_attach_create();
	test_demote();
	test_group();
	test_daemon_stop(pid, dir);
	test_budget();
	return done_testing();
}
