/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's batch (kvq_batch, kvq.h) through the real kvqd on host pools,
 * against each sequence's own calls:
 *
 *  - two pools alike, one client each: the same sequences go through
 *    kvq_batch on one and kvq_seq_begin/_write/_attention/_commit (and
 *    kvq_seq_from_prompt) on the other, over prompts of mixed lengths, a
 *    second round of prompts found in the prefix cache (KVQ_BATCH_LOOKUP),
 *    decode steps of one token and steps that mix decode with chunks of
 *    several tokens.  After every write the batch's attention equals the
 *    sequences' own, bit for bit; the hits, the tokens and the shape of
 *    each block table are the same;
 *  - the requests a step sends (kvq_batch_requests): a decode step that
 *    needs new blocks, one Alloc; one that needs none, nothing; a commit
 *    that seals and publishes, one wait;
 *  - all or nothing: a step the pool cannot hold is refused with the slots
 *    it was short of, and changes nothing (the sequences' tables, the
 *    pool's figures); dropping sequences until it fits then works;
 *  - refusals: another client's sequence, a sequence twice, a lookup for a
 *    sequence that is not empty, attention before the write, commit before
 *    every layer is written;
 *  - a tensor-parallel group of two ranks (host pools): each rank's batch
 *    looks its prompts up with each sequence's request id in one Lookup, and
 *    both ranks get the same hits; a batch whose sequences have no request
 *    id is refused on a member pool and holds nothing.
 *
 * Built again as tests/gpu/test_cuda_batch (KVQ_TEST_CUDA): the same on
 * cuda pools, with the KV splits fixed (KVQ_CUDA_SPLITS=1, a plan that
 * does not depend on the batch): bit for bit where every sequence of a
 * step has as many query rows (the kernel is chosen by the most rows of
 * the call), within TOL of max|out| where a step mixes decode with chunks
 * (the batch's call may take the prefill kernel where a sequence's own
 * takes the decode one).  Skipped where no GPU is usable.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "../daemon.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"
#ifdef KVQ_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

#define L_ 2
#define H_ 2
#define QH_ 4
#ifdef KVQ_TEST_CUDA
#define D_ 64                  /* the CUDA kernels' smallest head dim */
#else
#define D_ 32
#endif
#define B_ 16
#define NS 10                  /* sequences */
#define MAXM 80                /* tokens a sequence appends in one step, at most */
#define MAXROWS (NS * MAXM)
#define MAXTOK 512
#define MODEL "test/batch@1"
#define TOL 2e-3               /* tests/gpu/test_cuda_seq.c's bound of GPU attention */

#ifdef KVQ_TEST_CUDA
#define BACKEND "cuda"
#else
#define BACKEND "host"
#endif

static char sock_path[108];
static uint32_t most_waits;    /* the most waits of a step's commit */
static double worst_rel;       /* the largest difference of a mixed step on the GPU, of max|out| */
#ifdef KVQ_TEST_CUDA
static const bool cuda = true;
#else
static const bool cuda = false;
#endif

static kvq_client *open_pool(const char *pool, const char *policy, uint32_t n_sealed, uint32_t n_open)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = policy, .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = n_sealed, .n_open = n_open, .backend = BACKEND, .device = -1 };
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

/* K and V of tokens tok[0..m) at positions pos0.., one layer, into rows
 * of k and v. */
static void make_kv(const uint32_t *tok, uint32_t pos0, uint32_t m, uint32_t layer, uint16_t *k, uint16_t *v)
{
	for (uint32_t t = 0; t < m; t++)
		for (uint32_t h = 0; h < H_; h++)
			for (uint32_t d = 0; d < D_; d++) {
				k[((size_t)t * H_ + h) * D_ + d] = kvq_f16_from_f32((float)synth_kv(tok[t], pos0 + t, layer, h, d, 0));
				v[((size_t)t * H_ + h) * D_ + d] = kvq_f16_from_f32((float)synth_kv(tok[t], pos0 + t, layer, h, d, 1));
			}
}

static void make_q(uint32_t seed, uint32_t rows, uint32_t layer, float *q)
{
	for (uint32_t i = 0; i < rows * QH_ * D_; i++)
		q[i] = (float)synth_kv(seed + i / (QH_ * D_), i % (QH_ * D_), layer, 1, 0, 0);
}

/* The sequences' tokens: sequence i's token t. */
static uint32_t tok_of(uint32_t i, uint32_t t)
{
	/* sequences 5.. start as 0.. do (a shared prefix), then differ */
	uint32_t src = i >= NS / 2 && t < 24 + 8 * (i - NS / 2) ? i - NS / 2 : i;

	return 1000 + 977 * src + 13 * t;
}

struct side {
	kvq_client *c;
	kvq_seq *s[NS];
};

static uint16_t kbuf[MAXROWS * H_ * D_], vbuf[MAXROWS * H_ * D_];
static float qbuf[MAXROWS * QH_ * D_], obat[MAXROWS * QH_ * D_], oseq[MAXROWS * QH_ * D_];

/*
 * One step on both sides: sequence i (of idx[0..n)) appends m[i] tokens,
 * looked up first where lookup is set.  The batch side writes, attends and
 * commits with kvq_batch; the other with each sequence's own calls.
 * Returns false (with a diagnostic) at the first difference.
 */
static bool step(struct side *bs, struct side *ss, kvq_batch *b, const uint32_t *idx, uint32_t n,
		 const uint32_t *m, bool lookup, uint32_t *diff_rows)
{
	uint32_t tok[MAXM], hit[NS], nseq = 0, reqs, waits;
	const uint32_t *ip;
	bool uniform = true;
	int r;

	if (kvq_batch_clear(b) < 0)
		return false;
	for (uint32_t j = 0; j < n; j++) {
		kvq_seq *s = bs->s[idx[j]];
		uint32_t n0 = kvq_seq_tokens(s);

		for (uint32_t t = 0; t < m[j]; t++)
			tok[t] = tok_of(idx[j], n0 + t);
		if ((r = kvq_batch_add(b, s, tok, m[j], lookup ? KVQ_BATCH_LOOKUP : 0)) != (int)j) {
			diag("add %u: %d %s", j, r, kvq_client_error(bs->c));
			return false;
		}
		/* the other side: its own lookup, then its own begin */
		hit[j] = 0;
		if (lookup && kvq_seq_from_prompt(ss->s[idx[j]], tok, m[j], &hit[j]) < 0)
			return false;
		if (kvq_seq_begin(ss->s[idx[j]], tok + hit[j], m[j] - hit[j]) < 0) {
			diag("seq begin %u: %s", j, kvq_client_error(ss->c));
			return false;
		}
	}
	if ((r = kvq_batch_begin(b, NULL)) < 0) {
		diag("batch begin: %d %s", r, kvq_client_error(bs->c));
		return false;
	}
	ip = kvq_batch_indptr(b, &nseq);
	if (!ip || nseq != n)
		return false;
	for (uint32_t j = 0; j < n; j++)
		uniform = uniform && ip[j + 1] - ip[j] == ip[1] - ip[0];
	for (uint32_t j = 0; j < n; j++)
		if (kvq_batch_hit(b, j) != hit[j] || ip[j + 1] - ip[j] != m[j] - hit[j]) {
			diag("sequence %u: hit %u against %u, rows %u", j, kvq_batch_hit(b, j), hit[j], ip[j + 1] - ip[j]);
			return false;
		}
	for (uint32_t l = 0; l < L_; l++) {
		for (uint32_t j = 0; j < n; j++) {
			kvq_seq *s = ss->s[idx[j]];
			/* the new rows start where the other side's sequence stood before its begin */
			uint32_t pos0 = kvq_seq_tokens(s), rows = ip[j + 1] - ip[j];

			for (uint32_t t = 0; t < rows; t++)
				tok[t] = tok_of(idx[j], pos0 + t);
			make_kv(tok, pos0, rows, l, kbuf + (size_t)ip[j] * H_ * D_, vbuf + (size_t)ip[j] * H_ * D_);
			if (kvq_seq_write(s, l, kbuf + (size_t)ip[j] * H_ * D_, vbuf + (size_t)ip[j] * H_ * D_) < 0)
				return false;
		}
		if (kvq_batch_write(b, l, kbuf, vbuf) < 0)
			return false;
		make_q(77 * l + n, ip[n], l, qbuf);
		memset(obat, 0xff, (size_t)ip[n] * QH_ * D_ * sizeof(float));
		memset(oseq, 0, (size_t)ip[n] * QH_ * D_ * sizeof(float));
		if (kvq_batch_attention(b, l, QH_, 0.0f, qbuf, obat) < 0) {
			diag("batch attention: %s", kvq_client_error(bs->c));
			return false;
		}
		for (uint32_t j = 0; j < n; j++)
			if (kvq_seq_attention(ss->s[idx[j]], l, QH_, ip[j + 1] - ip[j], 0.0f,
					      qbuf + (size_t)ip[j] * QH_ * D_, oseq + (size_t)ip[j] * QH_ * D_) < 0) {
				diag("seq attention: %s", kvq_client_error(ss->c));
				return false;
			}
		if (memcmp(obat, oseq, (size_t)ip[n] * QH_ * D_ * sizeof(float))) {
			double big = 0, worst = 0;

			for (uint32_t i = 0; i < ip[n] * QH_ * D_; i++) {
				*diff_rows += obat[i] != oseq[i];
				big = fabs(oseq[i]) > big ? fabs(oseq[i]) : big;
				worst = fabs(obat[i] - oseq[i]) > worst ? fabs(obat[i] - oseq[i]) : worst;
			}
			worst_rel = worst / big > worst_rel ? worst / big : worst_rel;
			/* on the GPU a step of mixed rows may take another kernel: bounded */
			if (!cuda || uniform || !(worst <= TOL * big)) {
				diag("layer %u: attention differs (%g of max)", l, worst / big);
				return false;
			}
		}
	}
	if (kvq_batch_commit(b) < 0) {
		diag("batch commit: %s", kvq_client_error(bs->c));
		return false;
	}
	kvq_batch_requests(b, KVQ_BATCH_COMMIT, &reqs, &waits);
	most_waits = waits > most_waits ? waits : most_waits;
	for (uint32_t j = 0; j < n; j++) {
		const int32_t *s1, *o1, *s2, *o2;
		uint32_t ns1, no1, ns2, no2;

		if (kvq_seq_commit(ss->s[idx[j]]) < 0)
			return false;
		kvq_seq_blocks(bs->s[idx[j]], &s1, &ns1, &o1, &no1);
		kvq_seq_blocks(ss->s[idx[j]], &s2, &ns2, &o2, &no2);
		if (ns1 != ns2 || no1 != no2 || kvq_seq_tokens(bs->s[idx[j]]) != kvq_seq_tokens(ss->s[idx[j]])) {
			diag("sequence %u: tables differ", idx[j]);
			return false;
		}
	}
	return true;
}

static void test_same(const char *tag, const char *policy)
{
	struct side bs = { 0 }, ss = { 0 };
	char p1[32], p2[32];
	kvq_batch *b = NULL;
	uint32_t idx[NS], m[NS], diff = 0;
	bool same = true;
	int ok_steps = 0;

	most_waits = 0;
	worst_rel = 0;
	snprintf(p1, sizeof p1, "b-%s", tag);
	snprintf(p2, sizeof p2, "s-%s", tag);
	bs.c = open_pool(p1, policy, 512, 96);
	ss.c = open_pool(p2, policy, 512, 96);
	if (!bs.c || !ss.c || kvq_batch_new(bs.c, &b) < 0) {
		ok(0, "%s: two pools and a batch", policy);
		goto out;
	}
	for (uint32_t i = 0; i < NS; i++)
		if (kvq_seq_new(bs.c, NULL, 0, &bs.s[i]) < 0 || kvq_seq_new(ss.c, NULL, 0, &ss.s[i]) < 0)
			same = false;
	/* prompts of mixed lengths, the first half; then the second half, found in the cache */
	for (uint32_t j = 0; j < NS / 2; j++) {
		idx[j] = j;
		m[j] = 1 + (j * 37) % MAXM;
	}
	m[0] = MAXM;
	same = same && step(&bs, &ss, b, idx, NS / 2, m, false, &diff);
	ok_steps += same;
	for (uint32_t j = 0; j < NS / 2; j++) {
		idx[j] = NS / 2 + j;
		m[j] = 40 + 9 * j;
	}
	same = same && step(&bs, &ss, b, idx, NS / 2, m, true, &diff);
	ok_steps += same;
	{
		uint32_t hits = 0;

		for (uint32_t j = 0; j < NS / 2; j++)
			hits += kvq_batch_hit(b, j);
		ok(same && hits > 0, "%s: prompts, then prompts found in the cache (%u tokens hit) in one Lookup: "
		   "the batch's attention equals the sequences' own, %s", policy, hits,
		   cuda ? "within TOL (mixed rows)" : "bit for bit");
	}
	/* decode steps, and steps that mix decode with chunks */
	for (uint32_t i = 0; i < NS; i++)
		idx[i] = i;
	for (int st = 0; same && st < 40; st++) {
		for (uint32_t i = 0; i < NS; i++)
			m[i] = st % 7 == 3 && i % 3 == 0 ? 1 + (uint32_t)(st + i) % 20 : 1;
		same = step(&bs, &ss, b, idx, NS, m, false, &diff);
		ok_steps += same;
	}
	ok(same, "%s: 40 steps of decode and mixed chunks over %u sequences: attention bit for bit%s, the same "
	   "tables (%d steps agreed, %u values differed, at most %.2g of max)", policy, NS,
	   cuda ? " in decode steps, within TOL in mixed ones" : "", ok_steps, diff, worst_rel);
	ok(most_waits == 1, "%s: every step's commit waited for kvqd once (at most %u)", policy, most_waits);
out:
	kvq_batch_free(b);
	for (uint32_t i = 0; i < NS; i++) {
		kvq_seq_free(bs.s[i]);
		kvq_seq_free(ss.s[i]);
	}
	kvq_client_free(bs.c);
	kvq_client_free(ss.c);
}

/* A decode step's requests: with new blocks one Alloc, without none; a
 * commit that seals and publishes one wait. */
static void test_requests(void)
{
	kvq_client *c = open_pool("req", "int8", 512, 64);
	kvq_seq *s[16] = { 0 };
	kvq_batch *b = NULL;
	uint32_t tok[B_], rq[4] = { 0 }, wt[4] = { 0 };
	int r = c ? kvq_batch_new(c, &b) : -1;

	for (uint32_t i = 0; i < 16 && r == 0; i++)
		r = kvq_seq_new(c, NULL, 0, &s[i]);
	/* B - 1 tokens each: the next token fills block 0, the one after needs block 1 */
	for (uint32_t i = 0; i < B_; i++)
		tok[i] = 5 + i;
	for (uint32_t i = 0; i < 16 && r == 0; i++)
		r = kvq_batch_add(b, s[i], tok, B_ - 1, 0) < 0 ? -1 : 0;
	for (int st = 0; st < 3 && r == 0; st++) {
		r = kvq_batch_begin(b, NULL);
		for (uint32_t l = 0; r == 0 && l < L_; l++) {
			const uint32_t *ip = kvq_batch_indptr(b, NULL);

			make_kv(tok, 0, ip[16] > B_ ? B_ : ip[16], l, kbuf, vbuf);
			r = kvq_batch_write(b, l, kbuf, vbuf);
		}
		r = r ? r : kvq_batch_commit(b);
		if (r == 0) {
			kvq_batch_requests(b, KVQ_BATCH_BEGIN, &rq[st], &wt[st]);
			kvq_batch_requests(b, KVQ_BATCH_COMMIT, &rq[3], &wt[3]);
		}
		kvq_batch_clear(b);
		for (uint32_t i = 0; i < 16 && r == 0; i++)
			r = kvq_batch_add(b, s[i], tok + st, 1, 0) < 0 ? -1 : 0;
	}
	ok(r == 0 && rq[0] == 1 && wt[0] == 1, "prefill step of 16 sequences: begin sends %u request(s), waits %u",
	   rq[0], wt[0]);
	ok(r == 0 && rq[1] == 0 && wt[1] == 0, "decode step needing no new block: begin sends %u request(s)", rq[1]);
	ok(r == 0 && rq[2] == 1 && wt[2] == 1, "decode step where all 16 need a block: begin sends %u, waits %u",
	   rq[2], wt[2]);
	ok(r == 0 && wt[3] <= 1, "a commit that seals and publishes waits %u time(s) (%u requests)", wt[3], rq[3]);
	kvq_batch_free(b);
	for (uint32_t i = 0; i < 16; i++)
		kvq_seq_free(s[i]);
	kvq_client_free(c);
}

/* A step the pool cannot hold changes nothing; fewer sequences fit. */
static void test_all_or_nothing(void)
{
	kvq_client *c = open_pool("small", "int8", 64, 6), *c2 = open_pool("small", "int8", 64, 6);
	kvq_seq *s[8] = { 0 }, *other = NULL;
	kvq_batch *b = NULL;
	struct kvq_stats before, after;
	uint32_t tok[4 * B_], short_by = 0, n_before[8];
	int r = c && c2 ? kvq_batch_new(c, &b) : -1;

	for (uint32_t i = 0; i < 4 * B_; i++)
		tok[i] = 90 + i;
	for (uint32_t i = 0; i < 8 && r == 0; i++)
		r = kvq_seq_new(c, NULL, 0, &s[i]);
	if (r == 0)
		r = kvq_seq_new(c2, NULL, 0, &other);
	/* each of 8 sequences needs one open slot for B - 1 tokens: 6 exist */
	for (uint32_t i = 0; i < 8 && r == 0; i++) {
		r = kvq_batch_add(b, s[i], tok, B_ - 1, 0) < 0 ? -1 : 0;
		n_before[i] = kvq_seq_tokens(s[i]);
	}
	if (r == 0)
		kvq_client_stats(c, NULL, &before);
	r = r ? r : kvq_batch_begin(b, &short_by);
	kvq_client_stats(c, NULL, &after);
	{
		bool unchanged = after.open_used == before.open_used && after.sealed_held == before.sealed_held &&
				 after.referenced == before.referenced && kvq_batch_indptr(b, NULL) == NULL;

		for (uint32_t i = 0; i < 8; i++)
			unchanged = unchanged && kvq_seq_tokens(s[i]) == n_before[i];
		ok(r == -ENOSPC && short_by == 2 && unchanged,
		   "a step of 8 sequences in a pool of 6 open slots: %s, %u slots short, nothing changed", kvq_strerror(r),
		   short_by);
	}
	kvq_batch_clear(b);
	r = 0;
	for (uint32_t i = 0; i < 6 && r == 0; i++)
		r = kvq_batch_add(b, s[i], tok, B_ - 1, 0) < 0 ? -1 : 0;
	r = r ? r : kvq_batch_begin(b, &short_by);
	ok(r == 0 && short_by == 0, "the same step with 6 of them begins (%d)", r);
	kvq_batch_abort(b);
	kvq_client_stats(c, NULL, &after);
	ok(after.open_used == before.open_used && kvq_seq_tokens(s[0]) == 0,
	   "kvq_batch_abort gives the step's slots back (%u open used)", after.open_used);

	/* refusals */
	kvq_batch_clear(b);
	ok(kvq_batch_add(b, other, tok, 1, 0) == -EINVAL, "another client's sequence is refused");
	ok(kvq_batch_add(b, s[0], tok, 1, 0) == 0 && kvq_batch_add(b, s[0], tok, 1, 0) == -EEXIST,
	   "a sequence twice in a step is refused");
	ok(kvq_batch_add(b, s[1], tok, 0, 0) == -EINVAL && kvq_batch_add(b, s[1], tok, 1, 8) == -EINVAL,
	   "no tokens, or unknown flags, are refused");
	r = kvq_batch_begin(b, NULL);
	ok(r == 0 && kvq_batch_attention(b, 0, QH_, 0.0f, qbuf, obat) == -EINVAL,
	   "attention before the layer's write is refused");
	make_kv(tok, 0, 1, 0, kbuf, vbuf);
	ok(kvq_batch_write(b, 0, kbuf, vbuf) == 0 && kvq_batch_commit(b) == -EINVAL && kvq_batch_begin(b, NULL) == -EBUSY,
	   "commit before every layer is written is refused, and the step stays begun");
	make_kv(tok, 0, 1, 1, kbuf, vbuf);
	ok(kvq_batch_write(b, 1, kbuf, vbuf) == 0 && kvq_batch_commit(b) == 0 && kvq_seq_tokens(s[0]) == 1,
	   "once written, it commits");
	kvq_batch_clear(b);
	ok(kvq_batch_add(b, s[0], tok, 1, KVQ_BATCH_LOOKUP) == -EINVAL, "a lookup for a sequence that is not empty is refused");
	{
		uint32_t rq = 9, wt = 9;

		kvq_batch_clear(b);
		r = kvq_batch_add(b, s[7], tok, 3, KVQ_BATCH_LOOKUP) < 0 ? -1 : kvq_batch_begin(b, NULL);
		kvq_batch_requests(b, KVQ_BATCH_BEGIN, &rq, &wt);
		ok(r == 0 && rq == 1 && wt == 1 && kvq_batch_hit(b, 0) == 0,
		   "a prompt too short for a whole block sends no Lookup: the begin is its Alloc alone (%u request)", rq);
		kvq_batch_abort(b);
	}
	kvq_batch_free(b);
	for (uint32_t i = 0; i < 8; i++)
		kvq_seq_free(s[i]);
	kvq_seq_free(other);
	kvq_client_free(c);
	kvq_client_free(c2);
}

/* A group of two ranks, one client each: prompts published by both, then
 * found by a batch on each rank with the sequences' request ids. */
static kvq_client *attach_rank(uint32_t rank)
{
	struct kvq_attach_params p = { .pool = rank ? "g1" : "g0", .model_id = MODEL, .layers = L_,
		.kv_heads = 2 * H_, .head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16,
		.create = 1, .n_sealed = 128, .n_open = 32, .backend = BACKEND, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(sock_path, "batch-group", &c) < 0)
		return NULL;
	if (kvq_client_set_group(c, "bg", rank, 2) < 0 || kvq_client_attach(c, &p) < 0) {
		diag("rank %u: %s", rank, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

#define GP 3                   /* prompts */
#define GN 40                  /* their tokens */

/* Rank r's batch of GP new sequences with request ids "<tag>-i", each
 * looking up prompt i and appending extra tokens; writes, commits and
 * frees them.  Hits into hit[]; returns the begin's result. */
static int group_step(kvq_client *c, const char *tag, uint32_t extra, bool rid, uint32_t *hit)
{
	kvq_batch *b = NULL;
	kvq_seq *s[GP] = { 0 };
	uint32_t tok[GN + 8];
	int r = kvq_batch_new(c, &b);

	for (uint32_t i = 0; r == 0 && i < GP; i++) {
		char id[16];

		snprintf(id, sizeof id, "%s-%u", tag, i);
		for (uint32_t t = 0; t < GN + extra; t++)
			tok[t] = 7000 + 100 * i + t;
		r = kvq_seq_new(c, NULL, 0, &s[i]);
		if (r == 0 && rid)
			r = kvq_seq_set_request(s[i], id, strlen(id));
		if (r == 0)
			r = kvq_batch_add(b, s[i], tok, GN + extra, KVQ_BATCH_LOOKUP) < 0 ? -1 : 0;
	}
	if (r == 0)
		r = kvq_batch_begin(b, NULL);
	for (uint32_t i = 0; r == 0 && i < GP; i++)
		hit[i] = kvq_batch_hit(b, i);
	for (uint32_t l = 0; r == 0 && l < L_; l++) {
		const uint32_t *ip = kvq_batch_indptr(b, NULL);

		/* any values will do: the ranks' hits are compared */
		for (uint32_t i = 0; i < GP; i++)
			make_kv(tok, 0, ip[i + 1] - ip[i], l, kbuf + (size_t)ip[i] * H_ * D_,
				vbuf + (size_t)ip[i] * H_ * D_);
		r = kvq_batch_write(b, l, kbuf, vbuf);
	}
	if (r == 0)
		r = kvq_batch_commit(b);
	kvq_batch_free(b);
	for (uint32_t i = 0; i < GP; i++)
		kvq_seq_free(s[i]);
	return r;
}

static void test_group(void)
{
	kvq_client *c0 = attach_rank(0), *c1 = attach_rank(1);
	uint32_t h0[GP] = { 0 }, h1[GP] = { 0 }, x[GP];
	struct kvq_stats before, after;
	int r0, r1;

	if (!c0 || !c1) {
		ok(0, "a group of two ranks attaches");
		goto out;
	}
	/* both ranks publish the prompts, then look them up again */
	r0 = group_step(c0, "pub", 0, true, x);
	r1 = group_step(c1, "pub", 0, true, x);
	ok(r0 == 0 && r1 == 0, "both ranks of a group publish %u prompts through a batch (%d, %d)", GP, r0, r1);
	r0 = group_step(c0, "hit", 5, true, h0);
	r1 = group_step(c1, "hit", 5, true, h1);
	ok(r0 == 0 && r1 == 0 && !memcmp(h0, h1, sizeof h0) && h0[0] > 0 && h0[1] > 0 && h0[2] > 0,
	   "each rank's batch finds them with the sequences' request ids, the same hits on both (%u %u %u)", h0[0],
	   h0[1], h0[2]);
	kvq_client_stats(c0, NULL, &before);
	r0 = group_step(c0, "none", 5, false, x);
	kvq_client_stats(c0, NULL, &after);
	ok(r0 == -EINVAL && after.referenced == before.referenced && after.sealed_held == before.sealed_held,
	   "a member pool's batch without request ids is refused (%s), nothing held", kvq_strerror(r0));
out:
	kvq_client_free(c0);
	kvq_client_free(c1);
}

int main(void)
{
	char dir[64], bin[512];
	pid_t pid;

#ifdef KVQ_TEST_CUDA
	if (test_cuda_skip())
		return 0;
#endif
	pid = test_daemon_start(BACKEND, "batch", dir, sizeof dir, sock_path, sizeof sock_path, bin, sizeof bin);
	if (pid < 0) {
		ok(0, "kvqd starts (%s)", bin);
		return done_testing();
	}
	test_same("int8", "int8");
	test_same("kivi", "0:int4g32; 1-:kivi2");
	test_requests();
	test_all_or_nothing();
	test_group();
	test_daemon_stop(pid, dir);
	return done_testing();
}
