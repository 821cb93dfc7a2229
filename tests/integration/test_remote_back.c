/* SPDX-License-Identifier: Apache-2.0 */
/*
 * remote_write = back (daemon/rtier.h) end to end, on a real Redis Cluster
 * of three masters and three replicas on loopback (tests/redis_cluster.h)
 * and two kvqd nodes:
 *  - node A's small pool, remote_write = back, writes nothing when it
 *    publishes (no SET, no key in the cluster);
 *  - once later prompts evict its blocks, each evicted block is written
 *    (one key per block, as many as were written), and a prompt whose
 *    chain was evicted whole from A is a whole hit on node B, whose pool
 *    never saw it, with attention bit-equal to A's and to a cold recompute
 *    on B (a pool without a remote);
 *  - with a host tier, a block the pool demotes is not written either; it
 *    is written when the tier evicts its record (copied from the tier's
 *    record), and node B hits such prompts whole, attention bit-equal to
 *    A's; a prompt still in A's pool is no hit on B;
 *  - every slot of every pool is accounted for at the end.
 * A Redis that cannot be started fails the test.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../redis_cluster.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

/* test_remote's geometry: two layers of two KV heads (four query heads),
 * head dim 32, 16-token blocks; a prompt of 83 tokens is 5 sealed blocks
 * (a lookup hits 80 tokens) and 3 more; 2 queries */
#define L_ 2
#define H_ 2
#define QH_ 4
#define D_ 32
#define B_ 16
#define NTOK 83
#define NQ 2
#define NBLK (NTOK / B_)
#define HIT (NBLK * B_)
#define NPROMPT 8
#define MODEL "test/remote-back@1"

#include "../prompts.h"
#include "../remote_nodes.h"

typedef float attn_t[L_][NQ * QH_ * D_];

#define POOL(name, rest) \
	"[pool " name "]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\nblock_tokens = 16\n" \
	"policy = int8\n" rest

static void prompt_tokens(uint32_t p, uint32_t *tok)
{
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 5000 + 7919 * p + 13 * i;
}

static kvq_client *open_pool(const struct node *n, const char *pool)
{
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(n->sock, "remote-back", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &a) < 0) {
		diag("%s: attach %s: %s", n->tag, pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

static int run_prompt(kvq_client *c, uint32_t p, uint32_t *ret_hit, attn_t out)
{
	uint32_t tok[NTOK];

	prompt_tokens(p, tok);
	return prompt_run(c, tok, ret_hit, out, NULL);
}

#define figure prompt_figure

int main(void)
{
	static attn_t first[NPROMPT], again, cold;
	static char keys[1024][256];
	struct node A = { .tag = "rbackA" }, B = { .tag = "rbackB" };
	kvq_client *a = NULL, *b = NULL, *bcold = NULL;
	uint64_t n_sealed, written, evicted;
	uint32_t hit, whole = 0;
	int r, nkeys;
	bool all;

	if (!cluster_up())
		return done_testing();
	if (!ok(secrets_write("fedcba9876543210fedcba9876543210-the-cluster-key"), "secrets (mode 0600)"))
		return done_testing();
	/* A's pools: a little more than two prompts' blocks; one with a host
	 * tier of a few records, demoting as early as it may */
	if (!ok(node_up(&A, "host_tier_reserve = 50\n",
			POOL("back", "capacity = 80K\nremote = shared\nremote_namespace = ns1\nremote_write = back\n")
			POOL("tiered", "capacity = 80K\nhost_capacity = 24K\nremote = shared\nremote_namespace = ns1\n"
				       "remote_write = back\n")) &&
		node_up(&B, "", POOL("shared", "capacity = 1M\nremote = shared\nremote_namespace = ns1\n"
					       "remote_write = off\n") POOL("cold", "capacity = 1M\n")),
		"node A (small pools, remote_write = back, one with a host tier) and node B (remote_write = off, and a "
		"pool without a remote)"))
		goto out;
	a = open_pool(&A, "back");
	b = open_pool(&B, "shared");
	bcold = open_pool(&B, "cold");
	if (!ok(a && b && bcold, "attached to the pools"))
		goto out;
	n_sealed = figure(a, "n_sealed");
	ok(n_sealed >= NBLK + 2 && n_sealed < 3 * NBLK, "node A's pool holds %llu sealed blocks: two or three prompts'",
	   (unsigned long long)n_sealed);

	/* published, not written */
	r = run_prompt(a, 0, &hit, first[0]);
	usleep(300 * 1000);
	ok(r == 0 && hit == 0 && figure(a, "cached") == NBLK && figure(a, "remote_written") == 0 &&
	   figure(a, "remote_queue") == 0 && figure(a, "remote_bytes_out") == 0 && cluster_keys(keys, 1024) == 0,
	   "node A: a prompt published (%d blocks cached) is not written: no SET, no key in the cluster", NBLK);

	/* evicted, written back */
	all = r == 0;
	for (uint32_t p = 1; p < NPROMPT; p++)
		all &= run_prompt(a, p, &hit, first[p]) == 0 && hit == 0;
	evicted = figure(a, "evictions");
	all &= node_written(a, evicted, 5000);
	written = figure(a, "remote_written");
	nkeys = cluster_keys(keys, 1024);
	ok(all && evicted >= (NPROMPT - 3) * NBLK && written == evicted && figure(a, "remote_dropped") == 0 &&
	   nkeys == (int)written,
	   "node A: %d prompts in a pool of %llu blocks: each of the %llu blocks evicted written back, %d keys in the "
	   "cluster", NPROMPT, (unsigned long long)n_sealed, (unsigned long long)evicted, nkeys);

	/* the evicted prompts are whole hits on B */
	all = true;
	for (uint32_t p = 0; p < NPROMPT; p++) {
		r = run_prompt(b, p, &hit, again);
		all &= r == 0;
		if (r == 0 && hit == HIT) {
			whole++;
			all &= memcmp(again, first[p], sizeof again) == 0;
		}
	}
	ok(all && whole >= NPROMPT - 3 && figure(b, "remote_fetched") == (uint64_t)whole * NBLK,
	   "node B: %u of %d prompts evicted from A whole hits from the remote (%llu blocks fetched), attention equal "
	   "to A's bit for bit", whole, NPROMPT, (unsigned long long)figure(b, "remote_fetched"));
	r = run_prompt(bcold, 0, &hit, cold);
	ok(r == 0 && hit == 0 && memcmp(cold, first[0], sizeof cold) == 0,
	   "and A's attention equals a cold recompute on node B (a pool without a remote), bit for bit");
	r = run_prompt(b, 0, &hit, again);
	ok(r == 0 && hit == HIT && memcmp(again, cold, sizeof again) == 0,
	   "node B's second lookup of prompt 0 hits its pool, attention equal to the recompute");

	/* with a host tier: written when the tier lets the record go */
	{
		static attn_t tfirst[NPROMPT];
		kvq_client *t = open_pool(&A, "tiered");
		uint64_t gone, local;

		r = t ? run_prompt(t, 100, &hit, tfirst[0]) : -1;
		usleep(300 * 1000);
		ok(r == 0 && hit == 0 && figure(t, "remote_written") == 0 && figure(t, "remote_queue") == 0,
		   "node A, a pool with a host tier: a prompt published is not written");
		all = r == 0;
		for (uint32_t p = 1; all && p < NPROMPT; p++) {
			all &= run_prompt(t, 100 + p, &hit, tfirst[p]) == 0 && hit == 0;
			usleep(50 * 1000);   /* the demotions' copies come back */
		}
		usleep(300 * 1000);
		gone = figure(t, "evictions") + figure(t, "tier_evictions");
		all &= node_written(t, gone, 5000);
		written = figure(t, "remote_written");
		local = figure(t, "tier_records") + figure(t, "cached");
		ok(all && figure(t, "tier_demotions") > 0 && figure(t, "tier_evictions") > 0 && written >= gone &&
		   written + local <= NPROMPT * NBLK,
		   "node A, host tier: %llu blocks demoted; %llu written, at least every one that left the tier or the "
		   "pool (%llu tier evictions, %llu pool evictions), none of the %llu still local",
		   (unsigned long long)figure(t, "tier_demotions"), (unsigned long long)written,
		   (unsigned long long)figure(t, "tier_evictions"), (unsigned long long)figure(t, "evictions"),
		   (unsigned long long)local);
		whole = 0;
		all = true;
		for (uint32_t p = 0; p < NPROMPT; p++) {
			r = run_prompt(b, 100 + p, &hit, again);
			all &= r == 0 && (hit != HIT || memcmp(again, tfirst[p], sizeof again) == 0);
			whole += r == 0 && hit == HIT;
			if (p == NPROMPT - 1)
				all &= hit == 0;
		}
		ok(all && whole >= 1, "node B: %u of those prompts whole hits from the remote, attention equal to A's bit "
		   "for bit; the last one, still in A's pool, no hit", whole);
		node_accounted(t, "node A, tiered");
		kvq_client_free(t);
	}

	node_accounted(a, "node A, back");
	node_accounted(b, "node B, shared");
	node_accounted(bcold, "node B, cold");
out:
	kvq_client_free(a);
	kvq_client_free(b);
	kvq_client_free(bcold);
	node_down(&A);
	node_down(&B);
	secrets_remove();
	return done_testing();
}
