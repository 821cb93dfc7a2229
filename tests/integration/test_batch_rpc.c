/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Protocol 8's batched requests through the real kvqd (host backend) and
 * libkvq's internals (client_lookup_many, client_alloc_many,
 * client_commit; linked from its sources, as they are not exported):
 *
 *  - a Lookup of several prompts finds what separate Lookups find, hits
 *    and misses mixed, in one request and one wait;
 *  - refused all or nothing: a bad prompt, both forms at once, over the
 *    prompts' limit or the ids'; nothing held after (Stats);
 *  - a refused Alloc carries its shortfall, as Stats lets the test count
 *    it, and client_alloc_many reports it with nothing held;
 *  - over KVQ_PROTO_MAX_IDS: an allocation split over two requests in one
 *    write, a refused one giving back what the other got, and a chain over
 *    KVQ_PROTO_MAX_TOKENS tokens published in two rounds.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "../daemon.h"
#include "frame_io.h"
#include "libkvq_internal.h"

#define B_ 16
#define MODEL "test/batch@1"

static char sock_path[108];

static kvq_client *open_pool(const char *pool, uint32_t n_sealed, uint32_t n_open)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = MODEL, .layers = 1, .kv_heads = 1,
		.head_dim = 32, .block_tokens = B_, .policy = "int4g32", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = n_sealed, .n_open = n_open, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(sock_path, "batch", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &p) < 0) {
		diag("attach %s: %s", pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Publishes n blocks of tokens tok as one chain from fresh sealed slots. */
static int publish(kvq_client *c, const uint32_t *tok, uint32_t n, uint32_t *ret_ids)
{
	uint32_t *ids = calloc(n, sizeof(*ids));
	struct client_chain ch = { .ids = ids, .n = n, .parent = -1, .tokens = tok, .ret_ids = ret_ids };
	int r = ids ? client_alloc_many(c, 0, n, 0, NULL, NULL, ids, NULL, NULL, NULL) : -ENOMEM;

	r = r < 0 ? r : client_commit(c, 0, NULL, NULL, &ch, 1, NULL, NULL);
	free(ids);
	return r;
}

/* A raw Lookup (or Alloc) and its status; the reply in *ret when wanted. */
static int call(kvq_client *c, Kvq__Envelope *e, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	Kvq__Envelope *rep = NULL;
	int r;

	e->id = ++c->conn.next_id;
	r = kvq_frame_send_envelope(c->conn.fd, e, -1, c->conn.timeout_ms);
	if (r == 0)
		r = kvq_conn_reply_refusal(&c->conn, e->id, want, &rep);
	if (ret)
		*ret = rep;
	else
		kvq_frame_envelope_free(rep);
	return r;
}

static struct kvq_stats stats(kvq_client *c)
{
	struct kvq_stats st = { 0 };

	kvq_client_stats(c, NULL, &st);
	return st;
}

static void test_lookup(kvq_client *c)
{
	enum { NA = 3, NB = 2, NP = 3 };
	uint32_t ta[NA * B_ + 5], tb[NB * B_ + 1], tm[4 * B_ + 1], ga[NA], gb[NB];
	uint32_t sep[NP][8], many[NP][8], sep_n[NP];
	struct client_prompt p[NP] = {
		{ .tokens = ta, .n_tokens = NA * B_ + 5, .max_tokens = NA * B_, .ret_ids = many[0] },
		{ .tokens = tm, .n_tokens = 4 * B_ + 1, .max_tokens = 4 * B_, .ret_ids = many[1] },
		{ .tokens = tb, .n_tokens = NB * B_ + 1, .max_tokens = NB * B_, .ret_ids = many[2] },
	};
	struct client_count cnt = { 0 };
	struct kvq_stats before, after;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Lookup l = KVQ__LOOKUP__INIT;
	Kvq__LookupPrompt lp[2], *lpp[2] = { &lp[0], &lp[1] }, *none = NULL;
	uint8_t salt[KVQ_PROTO_MAX_SALT + 1] = { 0 };
	bool same = true;
	int r;

	for (uint32_t i = 0; i < sizeof(ta) / 4; i++)
		ta[i] = 100 + i;
	for (uint32_t i = 0; i < sizeof(tb) / 4; i++)
		tb[i] = 9000 + 3 * i;
	for (uint32_t i = 0; i < sizeof(tm) / 4; i++)
		tm[i] = 50000 + i;
	ok(publish(c, ta, NA, ga) == 0 && publish(c, tb, NB, gb) == 0, "two chains published (%s)",
	   kvq_client_error(c));
	kvq_client_release(c, NA, ga, 0, NULL);
	kvq_client_release(c, NB, gb, 0, NULL);
	for (int i = 0; i < NP; i++)
		r = client_lookup(c, p[i].tokens, p[i].n_tokens, p[i].max_tokens, NULL, 0, NULL, 0, sep[i], &sep_n[i]);
	before = stats(c);
	r = client_lookup_many(c, p, NP, &cnt);
	for (int i = 0; i < NP; i++)
		same = same && p[i].ret_n == sep_n[i] && !memcmp(p[i].ret_ids, sep[i], sep_n[i] * 4);
	ok(r == 0 && same && sep_n[0] == NA && sep_n[1] == 0 && sep_n[2] == NB,
	   "three prompts, hit, miss, hit: as three Lookups (%u %u %u blocks)", p[0].ret_n, p[1].ret_n, p[2].ret_n);
	ok(cnt.requests == 1 && cnt.waits == 1, "in one request and one wait (%u, %u)", cnt.requests, cnt.waits);
	after = stats(c);
	ok(after.lookup_tokens - before.lookup_tokens == (NA + 4 + NB) * B_ &&
	   after.hit_tokens - before.hit_tokens == (NA + NB) * B_, "lookup and hit tokens counted per prompt");
	for (int i = 0; i < NP; i++) {
		kvq_client_release(c, sep_n[i], sep[i], 0, NULL);
		kvq_client_release(c, p[i].ret_n, p[i].ret_ids, 0, NULL);
	}
	before = stats(c);
	ok(before.referenced == 0, "released: nothing referenced");

	/* refusals, each holding nothing */
	for (int i = 0; i < 2; i++) {
		kvq__lookup_prompt__init(&lp[i]);
		lp[i].tokens = ta;
		lp[i].n_tokens = NA * B_ + 5;
		lp[i].max_tokens = NA * B_;
	}
	lp[1].salt.data = salt;
	lp[1].salt.len = sizeof(salt);
	l.n_prompts = 2;
	l.prompts = lpp;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
	after = stats(c);
	ok(r == -E2BIG && after.referenced == 0 && after.hit_tokens == before.hit_tokens,
	   "a hit and a prompt with a bad salt: -E2BIG, nothing held (%d)", r);
	lp[1].salt.len = 0;
	lp[1].max_tokens = NA * B_ + 6;
	r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
	ok(r == -EINVAL && stats(c).referenced == 0, "max_tokens over a prompt's tokens: -EINVAL, nothing held (%d)", r);
	lp[1].max_tokens = NA * B_;
	l.tokens = ta;
	l.n_tokens = 1;
	r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
	ok(r == -EINVAL && stats(c).referenced == 0, "prompts and fields of its own: -EINVAL (%d)", r);
	l.tokens = NULL;
	l.n_tokens = 0;
	{
		Kvq__LookupPrompt **lots = calloc(KVQ_PROTO_MAX_PROMPTS + 1, sizeof(*lots)), empty;

		kvq__lookup_prompt__init(&empty);
		for (uint32_t i = 0; lots && i <= KVQ_PROTO_MAX_PROMPTS; i++)
			lots[i] = &empty;
		l.prompts = lots ? lots : &none;
		l.n_prompts = lots ? KVQ_PROTO_MAX_PROMPTS + 1 : 0;
		r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
		ok(r == -E2BIG, "KVQ_PROTO_MAX_PROMPTS + 1 prompts: -E2BIG (%d)", r);
		l.n_prompts = KVQ_PROTO_MAX_PROMPTS;
		r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
		ok(r == 0, "KVQ_PROTO_MAX_PROMPTS empty prompts: fine (%d)", r);
		free(lots);
	}
	{
		/* each prompt's ids within KVQ_PROTO_MAX_IDS, their sum over it */
		const uint32_t n = KVQ_PROTO_MAX_TOKENS / 2;
		uint32_t *tok = calloc(n, sizeof(*tok));

		for (int i = 0; i < 2; i++) {
			lp[i].tokens = tok;
			lp[i].n_tokens = tok ? n : 0;
			lp[i].max_tokens = tok ? n : 0;
		}
		l.prompts = lpp;
		l.n_prompts = 2;
		r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
		ok(r == (B_ * 2 * KVQ_PROTO_MAX_IDS > KVQ_PROTO_MAX_TOKENS ? 0 : -E2BIG) && stats(c).referenced == 0,
		   "KVQ_PROTO_MAX_TOKENS in two prompts: within the ids' limit for B = %u (%d)", B_, r);
		lp[1].n_tokens++;
		r = call(c, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, NULL);
		ok(r == -E2BIG, "one token more: -E2BIG (%d)", r);
		free(tok);
	}
}

static void test_alloc_short(kvq_client *c)
{
	struct kvq_stats st = stats(c);
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	uint32_t want, got = 99, *o = NULL, *rv = NULL, *s = NULL;
	struct client_count cnt = { 0 };
	int r;

	/* nothing referenced: every cached block is evictable */
	a.n_open = (uint32_t)(st.n_open - st.open_used) + 2;
	a.n_sealed = (uint32_t)(st.sealed_free + st.cached) + 5;
	want = 2 + (a.n_open + a.n_sealed - (uint32_t)(st.sealed_free + st.cached));
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	r = call(c, &e, KVQ__ENVELOPE__BODY_ALLOC_REPLY, &rep);
	ok(r == -ENOSPC && rep && rep->alloc_reply->short_open == 2 &&
	   rep->alloc_reply->short_sealed == want - 2 && rep->alloc_reply->short_sink == 0 &&
	   rep->alloc_reply->n_sealed_ids == 0, "a refused Alloc says what was short: %u open, %u sealed",
	   rep ? rep->alloc_reply->short_open : 0, rep ? rep->alloc_reply->short_sealed : 0);
	kvq_frame_envelope_free(rep);
	o = calloc(a.n_open, 4);
	rv = calloc(a.n_open, 4);
	s = calloc(a.n_sealed, 4);
	r = client_alloc_many(c, a.n_open, a.n_sealed, 0, o, rv, s, NULL, &got, &cnt);
	ok(r == -ENOSPC && got == want && cnt.requests == 1 && cnt.waits == 1,
	   "client_alloc_many: -ENOSPC short of %u (%u), one request", got, want);
	st = stats(c);
	ok(st.sealed_held == 0 && st.open_used == 0, "nothing held");
	free(o);
	free(rv);
	free(s);
}

/* Over KVQ_PROTO_MAX_IDS: a pool of that many sealed slots and a few more. */
static void test_split(void)
{
	const uint32_t extra = 100, chain = KVQ_PROTO_MAX_TOKENS / B_ + 7;   /* over a request's tokens */
	kvq_client *c = open_pool("big", 1, 1);
	const uint32_t n = c ? (uint32_t)stats(c).n_sealed : 0;
	uint32_t *ids = calloc((size_t)n + extra, 4), *got = calloc(chain, 4), *tok = calloc((size_t)chain * B_, 4);
	struct client_count cnt = { 0 };
	struct client_chain ch = { .ids = ids, .n = chain, .parent = -1, .tokens = tok, .ret_ids = got };
	uint32_t sh = 0;
	int r;

	if (!c || !ids || !got || !tok || n < KVQ_PROTO_MAX_IDS + 10) {
		ok(0, "a pool of more than KVQ_PROTO_MAX_IDS sealed slots (%u)", n);
		goto out;
	}
	r = client_alloc_many(c, 0, KVQ_PROTO_MAX_IDS + 10, 0, NULL, NULL, ids, NULL, &sh, &cnt);
	ok(r == 0 && cnt.requests == 2 && cnt.waits == 1 && stats(c).sealed_held == KVQ_PROTO_MAX_IDS + 10,
	   "KVQ_PROTO_MAX_IDS + 10 sealed slots: two requests, one wait (%d: %u, %u)", r, cnt.requests, cnt.waits);
	kvq_client_release(c, KVQ_PROTO_MAX_IDS, ids, 0, NULL);
	kvq_client_release(c, 10, ids + KVQ_PROTO_MAX_IDS, 0, NULL);
	r = client_alloc_many(c, 0, n + extra, 0, NULL, NULL, ids, NULL, &sh, NULL);
	ok(r == -ENOSPC && sh == extra && stats(c).sealed_held == 0,
	   "%u more than the pool holds: -ENOSPC short of %u, the granted request given back", extra, sh);
	for (size_t i = 0; i < (size_t)chain * B_; i++)
		tok[i] = (uint32_t)i;
	memset(&cnt, 0, sizeof(cnt));
	r = client_alloc_many(c, 0, chain, 0, NULL, NULL, ids, NULL, NULL, NULL);
	r = r < 0 ? r : client_commit(c, 0, NULL, NULL, &ch, 1, NULL, &cnt);
	ok(r == 0 && ch.published && cnt.requests == 2 && cnt.waits == 2 && stats(c).cached == chain &&
	   !memcmp(got, ids, (size_t)chain * 4),
	   "a chain of %u blocks: two Publish rounds, every block cached (%d: %u, %u; %s)", chain, r, cnt.requests,
	   cnt.waits, kvq_client_error(c));
out:
	free(ids);
	free(got);
	free(tok);
	kvq_client_free(c);
}

int main(void)
{
	char dir[64], bin[512];
	kvq_client *c;
	pid_t pid;

	/* a pool of more than KVQ_PROTO_MAX_IDS small blocks (~64 MB) */
	pid = test_daemon_start_conf("host", "batch", "[pool big]\nmodel = " MODEL "\nlayers = 1\nkv_heads = 1\n"
				     "head_dim = 32\nblock_tokens = 16\npolicy = int4g32\ncapacity = 64M\n", dir,
				     sizeof dir, sock_path, sizeof sock_path, bin, sizeof bin);
	if (pid < 0) {
		ok(0, "kvqd starts (%s)", bin);
		return done_testing();
	}
	c = open_pool("batch", 64, 8);
	ok(c != NULL, "attach creates a pool");
	if (c) {
		test_lookup(c);
		test_alloc_short(c);
		kvq_client_free(c);
	}
	test_split();
	test_daemon_stop(pid, dir);
	return done_testing();
}
