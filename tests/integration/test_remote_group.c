/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-parallel groups in the remote tier (daemon/group_fetch.h) end to
 * end, on a real Redis Cluster of three masters and three replicas on
 * loopback (tests/redis_cluster.h) and two kvqd nodes, each with a group
 * of two ranks (configured pools tp.r0 and tp.r1, created at their first
 * attach, which names the group), each rank with K/V of its own:
 *  - node A's group publishes: each rank's pool writes its record of each
 *    block under its rank's key (rank/world in the key, the chain key the
 *    hash tag: both ranks' records of a block on one slot);
 *  - node B's group, whose pools never saw the prompt, hits it whole on
 *    both ranks, the ranks one after the other and at once (the second
 *    waits for the first's fetch), each rank's attention bit-equal to its
 *    own on node A (and the two ranks' differ);
 *  - the test deletes one rank's record of one block: node B's lookup of
 *    that prompt (cold there) stops before that block on both ranks, and
 *    each rank's attention is still its own on node A;
 *  - every slot of every member pool is accounted for at the end.
 * A Redis that cannot be started fails the test.
 */
#include <config.h>

#include <errno.h>
#include <pthread.h>
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

/* each rank's shard: two layers of two KV heads (four query heads), head
 * dim 32, 16-token blocks, of a model of 4 KV heads over 2 ranks; a prompt
 * of 83 tokens is 5 sealed blocks (a lookup hits 80 tokens) and 3 more */
#define L_ 2
#define H_ 2
#define QH_ 4
#define D_ 32
#define B_ 16
#define NTOK 83
#define NQ 2
#define NBLK (NTOK / B_)
#define HIT (NBLK * B_)
#define WORLD 2
#define MODEL "test/remote-group@1"
#define GROUP "tp"
#define CUT 2                /* the block whose rank-1 record the test deletes */

#include "../prompts.h"
#include "../remote_nodes.h"

typedef float attn_t[L_][NQ * QH_ * D_];

#define MEMBER(name) \
	"[pool " name "]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\nblock_tokens = 16\n" \
	"policy = int8\ncapacity = 1M\ncreate_on_attach = yes\nremote = shared\nremote_namespace = ns1\n"

static void prompt_tokens(uint32_t p, uint32_t *tok)
{
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 7000 + 7919 * p + 13 * i;
}

static kvq_client *open_rank(const struct node *n, uint32_t rank)
{
	struct kvq_attach_params a = { .model_id = MODEL, .layers = L_, .kv_heads = H_ * WORLD, .head_dim = D_,
		.block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	char pool[16];
	kvq_client *c = NULL;

	snprintf(pool, sizeof pool, "tp.r%u", rank);
	a.pool = pool;
	if (kvq_client_connect(n->sock, "remote-group", &c) < 0)
		return NULL;
	if (kvq_client_set_group(c, GROUP, rank, WORLD) < 0 || kvq_client_attach(c, &a) < 0) {
		diag("%s: rank %u: attach %s: %s", n->tag, rank, pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Rank rank's run of prompt p as request rid: its hit, its attention.  Each
 * rank's K/V are its own (made from tokens shifted by the rank). */
static int rank_run(kvq_client *c, uint32_t rank, uint32_t p, const char *rid, uint32_t *ret_hit, attn_t out)
{
	static __thread uint16_t k[NTOK * H_ * D_], v[NTOK * H_ * D_];
	uint32_t tok[NTOK], kvtok[NTOK], hit = 0;
	kvq_seq *s = NULL;
	int r = kvq_seq_new(c, NULL, 0, &s);

	prompt_tokens(p, tok);
	for (uint32_t i = 0; i < NTOK; i++)
		kvtok[i] = tok[i] + 100003u * rank;
	r = r < 0 ? r : kvq_seq_set_request(s, rid, strlen(rid));
	r = r < 0 ? r : kvq_seq_from_prompt(s, tok, NTOK, &hit);
	r = r < 0 ? r : kvq_seq_begin(s, tok + hit, NTOK - hit);
	for (uint32_t l = 0; r == 0 && l < L_; l++) {
		make_kv(kvtok + hit, hit, NTOK - hit, l, k, v);
		r = kvq_seq_write(s, l, k, v);
	}
	r = r < 0 ? r : kvq_seq_commit(s);
	r = r < 0 ? r : attend(s, out);
	if (r < 0)
		diag("rank %u, prompt %u: %d %s", rank, p, r, kvq_client_error(c));
	kvq_seq_free(s);
	*ret_hit = hit;
	return r;
}

struct rank_job {
	kvq_client *c;
	uint32_t rank, p, hit;
	const char *rid;
	int r;
	attn_t out;
};

static void *rank_thread(void *arg)
{
	struct rank_job *j = arg;

	j->r = rank_run(j->c, j->rank, j->p, j->rid, &j->hit, j->out);
	return NULL;
}

/* Both ranks of node n's group run prompt p as request rid, one after the
 * other or at once: true when both ran, hits and attention in j[]. */
static bool group_run(kvq_client *const *c, uint32_t p, const char *rid, bool together, struct rank_job *j)
{
	pthread_t t[WORLD];

	for (uint32_t r = 0; r < WORLD; r++)
		j[r] = (struct rank_job){ .c = c[r], .rank = r, .p = p, .rid = rid, .r = -1 };
	if (!together) {
		for (uint32_t r = 0; r < WORLD; r++)
			rank_thread(&j[r]);
	} else {
		for (uint32_t r = 0; r < WORLD; r++)
			if (pthread_create(&t[r], NULL, rank_thread, &j[r]) != 0)
				return false;
		for (uint32_t r = 0; r < WORLD; r++)
			pthread_join(t[r], NULL);
	}
	return j[0].r == 0 && j[1].r == 0;
}

/* The cluster's keys of prompt p's blocks, written since before[nbefore]:
 * per block (chain order) and rank, into name[NBLK][WORLD]; true when
 * every one was found, both ranks' of a block under one hash tag. */
static bool prompt_keys(char (*before)[256], int nbefore, char (*name)[WORLD][256])
{
	static char now[1024][256];
	uint8_t chain[NBLK][32];
	int n = cluster_keys(now, 1024), found = 0;

	for (int k = 0; k < NBLK; k++)
		for (int r = 0; r < WORLD; r++)
			name[k][r][0] = '\0';
	/* the rank-0 records, in chain order by their headers */
	for (int k = 0; k < NBLK; k++) {
		bool got = false;

		for (int i = 0; i < n && !got; i++) {
			bool old = false;
			redisReply *v;
			size_t len = strlen(now[i]);

			for (int b = 0; b < nbefore && !old; b++)
				old = !strcmp(before[b], now[i]);
			if (old || len < 4 || strcmp(now[i] + len - 4, ":0/2"))
				continue;
			/* from the master that holds it (the others answer MOVED) */
			for (int m = 0, ms[3], nm = masters(ms, 3); m < nm && !got; m++) {
				v = admin(ms[m], "GET %s", now[i]);
				if (v && v->type == REDIS_REPLY_STRING && v->len >= 128 &&
				    (k == 0 ? !((uint8_t)v->str[12] & 1)
					    : ((uint8_t)v->str[12] & 1) && !memcmp(v->str + 96, chain[k - 1], 32))) {
					memcpy(chain[k], v->str + 64, 32);
					snprintf(name[k][0], 256, "%s", now[i]);
					got = true;
				}
				freeReplyObject(v);
			}
		}
		if (!got)
			return false;
	}
	/* each block's rank-1 record: the same key but for its rank */
	for (int k = 0; k < NBLK; k++) {
		char want[256];
		size_t len = strnlen(name[k][0], sizeof want - 1);

		memcpy(want, name[k][0], len);
		want[len] = 0;
		if (len < 3)
			return false;
		want[len - 3] = '1';
		for (int i = 0; i < n; i++)
			if (!strcmp(now[i], want)) {
				snprintf(name[k][1], 256, "%s", want);
				found++;
			}
	}
	return found == NBLK;
}

/* DEL key on the master that holds it: true when it was there. */
static bool del_key(const char *key)
{
	int m[3], nm = masters(m, 3);

	for (int i = 0; i < nm; i++) {
		redisReply *r = admin(m[i], "DEL %s", key);
		bool gone = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;

		freeReplyObject(r);
		if (gone)
			return true;
	}
	return false;
}

#define figure prompt_figure

int main(void)
{
	static struct rank_job ja[WORLD], jb[WORLD];
	static char before[1024][256], name[NBLK][WORLD][256];
	struct node A = { .tag = "rgroupA" }, B = { .tag = "rgroupB" };
	kvq_client *a[WORLD] = { NULL }, *b[WORLD] = { NULL };
	attn_t first[3][WORLD];
	int nbefore = 0;
	bool all;

	if (!cluster_up())
		return done_testing();
	if (!ok(secrets_write("0011223344556677889900112233445566-the-cluster-key"), "secrets (mode 0600)"))
		return done_testing();
	if (!ok(node_up(&A, "", MEMBER("tp.r0") MEMBER("tp.r1")) && node_up(&B, "", MEMBER("tp.r0") MEMBER("tp.r1")),
		"two kvqd nodes, each with pools tp.r0 and tp.r1 sharing remote 'shared', namespace ns1"))
		goto out;
	for (uint32_t r = 0; r < WORLD; r++) {
		a[r] = open_rank(&A, r);
		b[r] = open_rank(&B, r);
	}
	if (!ok(a[0] && a[1] && b[0] && b[1], "on each node, rank 0 and rank 1 of group %s attached", GROUP))
		goto out;

	/* node A's group publishes three prompts: each rank its own records */
	all = true;
	for (uint32_t p = 0; p < 3; p++) {
		char rid[16];

		snprintf(rid, sizeof rid, "a-%u", p);
		if (p == 2)
			nbefore = cluster_keys(before, 1024);
		all &= group_run(a, p, rid, false, ja) && ja[0].hit == 0 && ja[1].hit == 0;
		memcpy(first[p][0], ja[0].out, sizeof(attn_t));
		memcpy(first[p][1], ja[1].out, sizeof(attn_t));
	}
	all &= node_written(a[0], 3 * NBLK, 5000) && node_written(a[1], 3 * NBLK, 5000);
	ok(all && figure(a[0], "remote_written") == 3 * NBLK && figure(a[1], "remote_written") == 3 * NBLK,
	   "node A: 3 prompts cold on both ranks, each rank wrote its %d blocks of each", NBLK);
	ok(memcmp(first[0][0], first[0][1], sizeof(attn_t)) != 0, "the two ranks' attention differs (their K/V do)");
	ok(prompt_keys(before, nbefore, name) && strstr(name[0][0], ":0/2") && strstr(name[0][1], ":1/2"),
	   "prompt 2: both ranks' records of each of its %d blocks, keys ...:{chain}:0/2 and ...:{chain}:1/2", NBLK);

	/* node B's group, cold: whole hits from the remote on both ranks */
	all = group_run(b, 0, "b-0", false, jb);
	ok(all && jb[0].hit == HIT && jb[1].hit == HIT && !memcmp(jb[0].out, first[0][0], sizeof(attn_t)) &&
	   !memcmp(jb[1].out, first[0][1], sizeof(attn_t)),
	   "node B, ranks one after the other: both hit %u and %u tokens (%u whole), each rank's attention its own "
	   "on node A, bit for bit", jb[0].hit, jb[1].hit, HIT);
	all = group_run(b, 1, "b-1", true, jb);
	ok(all && jb[0].hit == HIT && jb[1].hit == HIT && !memcmp(jb[0].out, first[1][0], sizeof(attn_t)) &&
	   !memcmp(jb[1].out, first[1][1], sizeof(attn_t)),
	   "node B, ranks at once: both hit %u and %u tokens, attention equal to node A's rank by rank", jb[0].hit,
	   jb[1].hit);
	ok(figure(b[0], "remote_fetched") == 2 * NBLK && figure(b[1], "remote_fetched") == 2 * NBLK,
	   "each rank of node B fetched its own %d records (%llu, %llu)", 2 * NBLK,
	   (unsigned long long)figure(b[0], "remote_fetched"), (unsigned long long)figure(b[1], "remote_fetched"));

	/* one rank's record of a block gone: both ranks stop before it */
	if (ok(name[CUT][1][0] && del_key(name[CUT][1]), "rank 1's record of block %d of prompt 2 deleted in the "
	       "cluster (rank 0's kept)", CUT)) {
		all = group_run(b, 2, "b-2", true, jb);
		ok(all && jb[0].hit == CUT * B_ && jb[1].hit == CUT * B_,
		   "node B, prompt 2 (cold there): both ranks' hits stop before that block (%u and %u tokens, %u "
		   "wanted), no error", jb[0].hit, jb[1].hit, CUT * B_);
		ok(all && !memcmp(jb[0].out, first[2][0], sizeof(attn_t)) && !memcmp(jb[1].out, first[2][1], sizeof(attn_t)),
		   "and each rank's attention is still its own on node A, bit for bit");
	}

	for (uint32_t r = 0; r < WORLD; r++) {
		char what[32];

		snprintf(what, sizeof what, "node A, rank %u", r);
		node_accounted(a[r], what);
		snprintf(what, sizeof what, "node B, rank %u", r);
		node_accounted(b[r], what);
	}
out:
	for (uint32_t r = 0; r < WORLD; r++) {
		kvq_client_free(a[r]);
		kvq_client_free(b[r]);
	}
	node_down(&A);
	node_down(&B);
	secrets_remove();
	return done_testing();
}
