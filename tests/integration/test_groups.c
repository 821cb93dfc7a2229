/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-parallel groups against the real kvqd (host pools): a group of
 * WORLD ranks, each a separate process with its own member pool, a model of
 * 8 KV heads (2 per rank) and synthetic K/V.  Every rank runs the same
 * requests in the same order, at its own pace: a lookup by the request's
 * id (prompts from a few families sharing prefixes, so they hit), then its
 * prompt's rest written and committed (published); the member pools are
 * small, rank 1's smaller than the others, so blocks are evicted all along
 * and each rank on its own would keep different ones.  One rank kills itself (SIGKILL)
 * in the middle of a request, after its write and before its commit.
 *
 * Checked: each rank's hit for each request equals every other rank's
 * (the survivors' to the end, the killed rank's until it died); hits go
 * on after the death (the survivors keep working); a restarted rank and
 * the others then agree on every family's prompt (no block is visible on
 * one rank and not another); and once every client is gone and the
 * group's pending lookups have timed out, every member pool accounts for
 * all its slots with nothing held or referenced.  Also refused with a
 * reason: a lookup without a request id, a world size that does not split
 * the heads, a second pool for a taken rank, a rank that disagrees on the
 * model, a plain attach to a member pool.  And in a group of two: when one
 * rank dies between its write and its commit, what the other published of
 * the same prompt is released.
 */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "kvq.h"

#define WORLD 4
#define HEADS 8              /* the model's KV heads; 2 per rank */
#define L_ 2
#define D_ 64
#define B_ 16
#define NREQ 48
#define VICTIM 3
#define KILL_AT 20           /* the victim dies in this request */
#define FAMILIES 4
#define TIMEOUT_MS 1500      /* kvqd.conf group_lookup_timeout_ms */
#define GROUP "tp"
#define MODEL "test/tp-model@1"

static char sock_path[108];
static const char *group_name = GROUP;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Request k's prompt (the same on every rank): its family's first 48-80
 * tokens, then its own; 40-120 tokens. */
static uint32_t prompt_of(uint32_t k, uint32_t *t)
{
	uint64_t s = 0x7470ull + k;
	uint32_t fam = (uint32_t)(rng_next(&s) % FAMILIES), n = 40 + (uint32_t)(rng_next(&s) % 81);
	uint32_t shared = 48 + (uint32_t)(rng_next(&s) % 33);

	for (uint32_t i = 0; i < n; i++)
		t[i] = i < shared ? 1000 * (fam + 1) + i : 50000 + (uint32_t)(rng_next(&s) % 10000);
	return n;
}

static kvq_client *attach_rank(const char *name, const char *pool, uint32_t rank, uint32_t world, uint32_t heads,
			       const char *model, int *ret)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = model, .layers = L_, .kv_heads = heads,
				       .head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16,
				       .create = 1, .n_sealed = rank == 1 ? 28 : 40, .n_open = 24, .backend = "host",
				       .device = -1 };
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock_path, name, &c);

	if (r == 0 && world)
		r = kvq_client_set_group(c, group_name, rank, world);
	if (r == 0)
		r = kvq_client_attach(c, &p);
	if (r < 0 && c) {
		kvq_client_free(c);
		c = NULL;
	}
	*ret = r;
	return c;
}

/* Synthetic K/V of n tokens from position pos0: rank r's two heads. */
static void fill_kv(uint16_t *k, uint16_t *v, const uint32_t *tok, uint32_t pos0, uint32_t n, uint32_t rank,
		    uint32_t layer)
{
	const uint32_t H = HEADS / WORLD;

	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t d = 0; d < D_; d++) {
				uint64_t s = ((uint64_t)tok[t] << 32) ^ ((pos0 + t) * 977u) ^ (layer << 20) ^
					     ((rank * H + h) << 12) ^ d;
				float x = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 - 0.5) * 4.0f;
				size_t i = ((size_t)t * H + h) * D_ + d;
				/* small integers and halves: exact in FP16 */
				k[i] = (uint16_t)(0x3c00u + ((uint32_t)(x * 8.0f + 16.0f) & 31u));
				v[i] = (uint16_t)(0xbc00u + ((uint32_t)(x * 4.0f + 8.0f) & 15u));
			}
}

/* One request on rank c: lookup by id, write the rest, commit.  Writes its
 * hit to *ret_hit.  die: after the write, before the commit, SIGKILL. */
static int run_request(kvq_client *c, uint32_t rank, const char *rid, const uint32_t *tok, uint32_t n, bool write,
		       bool die, uint32_t *ret_hit)
{
	static uint16_t k[256 * HEADS * D_], v[256 * HEADS * D_];
	kvq_seq *s = NULL;
	uint32_t hit = 0;
	int r = kvq_seq_new(c, NULL, 0, &s);

	if (r == 0)
		r = kvq_seq_set_request(s, rid, strlen(rid));
	if (r == 0)
		r = kvq_seq_from_prompt(s, tok, n, &hit);
	if (r == 0 && write) {
		r = kvq_seq_begin(s, tok + hit, n - hit);
		for (uint32_t l = 0; r == 0 && l < L_; l++) {
			fill_kv(k, v, tok + hit, hit, n - hit, rank, l);
			r = kvq_seq_write(s, l, k, v);
		}
		if (r == 0 && die)
			raise(SIGKILL);
		if (r == 0)
			r = kvq_seq_commit(s);
	}
	kvq_seq_free(s);
	*ret_hit = hit;
	return r;
}

/* A rank's process: every request, its hits to out (one line each:
 * "k hit"), then exits 0, or 1 with a message on an error. */
static int rank_main(uint32_t rank, const char *out)
{
	char pool[32], name[32], rid[32];
	uint32_t tok[256];
	FILE *f = fopen(out, "w");
	int r;

	snprintf(pool, sizeof(pool), "tp.r%u", rank);
	snprintf(name, sizeof(name), "rank%u", rank);
	kvq_client *c = attach_rank(name, pool, rank, WORLD, HEADS, MODEL, &r);
	if (!c || !f) {
		fprintf(stderr, "rank %u: attach: %s\n", rank, strerror(-r));
		return 1;
	}
	setvbuf(f, NULL, _IOLBF, 0);
	for (uint32_t k = 0; k < NREQ; k++) {
		uint32_t n = prompt_of(k, tok), hit;

		snprintf(rid, sizeof(rid), "req-%u", k);
		r = run_request(c, rank, rid, tok, n, true, rank == VICTIM && k == KILL_AT, &hit);
		if (r < 0) {
			fprintf(stderr, "rank %u, request %u: %s (%s)\n", rank, k, strerror(-r), kvq_client_error(c));
			kvq_client_free(c);
			return 1;
		}
		fprintf(f, "%u %u\n", k, hit);
		/* ranks drift apart by a few ms, as real ones do */
		if ((k + rank) % 7 == 0)
			usleep(2000 * (rank + 1));
	}
	fclose(f);
	kvq_client_free(c);
	return 0;
}

static int read_hits(const char *path, int64_t *hits)
{
	FILE *f = fopen(path, "r");
	unsigned k, h;
	int n = 0;

	for (int i = 0; i < NREQ; i++)
		hits[i] = -1;
	if (!f)
		return 0;
	while (fscanf(f, "%u %u", &k, &h) == 2)
		if (k < NREQ) {
			hits[k] = h;
			n++;
		}
	fclose(f);
	return n;
}

/* The final check of every family's prompt: each rank in its own
 * process, one after the other, the same request id; their hits into
 * hits[rank][family]. */
static int final_check(uint32_t hits[WORLD][FAMILIES], const char *dir)
{
	for (uint32_t rank = 0; rank < WORLD; rank++) {
		char path[300];
		pid_t pid;
		int st;

		snprintf(path, sizeof(path), "%s/final.%u", dir, rank);
		pid = fork();
		if (pid == 0) {
			char pool[32], rid[32];
			uint32_t tok[256];
			FILE *f = fopen(path, "w");
			int r;

			snprintf(pool, sizeof(pool), "tp.r%u", rank);
			kvq_client *c = attach_rank("final", pool, rank, WORLD, HEADS, MODEL, &r);
			if (!c || !f)
				_exit(1);
			for (uint32_t fam = 0; fam < FAMILIES; fam++) {
				uint32_t n = 0, hit = 0;
				/* the family's shared tokens: the first prompt of that family */
				for (uint32_t k = 0; k < NREQ; k++) {
					uint64_t s = 0x7470ull + k;
					if (rng_next(&s) % FAMILIES == fam) {
						n = prompt_of(k, tok);
						break;
					}
				}
				snprintf(rid, sizeof(rid), "final-%u", fam);
				if (n == 0 || run_request(c, rank, rid, tok, n, false, false, &hit) < 0)
					_exit(1);
				fprintf(f, "%u\n", hit);
			}
			fclose(f);
			kvq_client_free(c);
			_exit(0);
		}
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			return -1;
		FILE *f = fopen(path, "r");
		for (uint32_t fam = 0; f && fam < FAMILIES; fam++)
			if (fscanf(f, "%u", &hits[rank][fam]) != 1)
				hits[rank][fam] = UINT32_MAX;
		if (f)
			fclose(f);
		unlink(path);
	}
	return 0;
}

int main(void)
{
	char dir[64], bin[512], out[WORLD][100];
	int64_t hits[WORLD][NREQ];
	pid_t kids[WORLD];
	int r;

	pid_t d = test_daemon_start_conf("host", "groups", "group_lookup_timeout_ms = 1500\n", dir, sizeof(dir),
					 sock_path, sizeof(sock_path), bin, sizeof(bin));
	if (!ok(d > 0, "kvqd started (%s)", bin))
		return done_testing();

	/* refusals, before the group exists and after */
	kvq_client *c = attach_rank("bad", "tp.bad", 0, 3, HEADS, MODEL, &r);
	ok(!c && r == -EINVAL, "3 ranks do not split 8 KV heads: refused (%d)", r);
	for (uint32_t rank = 0; rank < WORLD; rank++) {
		snprintf(out[rank], sizeof(out[rank]), "%s/hits.%u", dir, rank);
		kids[rank] = fork();
		if (kids[rank] == 0)
			_exit(rank_main(rank, out[rank]));
	}
	int status[WORLD];
	for (uint32_t rank = 0; rank < WORLD; rank++)
		waitpid(kids[rank], &status[rank], 0);
	bool live_ok = true;
	for (uint32_t rank = 0; rank < WORLD; rank++)
		if (rank != VICTIM && !(WIFEXITED(status[rank]) && WEXITSTATUS(status[rank]) == 0))
			live_ok = false;
	ok(live_ok, "the surviving ranks ran all %u requests", NREQ);
	ok(WIFSIGNALED(status[VICTIM]) && WTERMSIG(status[VICTIM]) == SIGKILL,
	   "rank %u died by SIGKILL in request %u, between its write and its commit", VICTIM, KILL_AT);

	int got[WORLD];
	for (uint32_t rank = 0; rank < WORLD; rank++)
		got[rank] = read_hits(out[rank], hits[rank]);
	ok(got[VICTIM] == KILL_AT && got[0] == NREQ, "hits recorded: %d by each survivor, %d by the victim", got[0],
	   got[VICTIM]);
	int disagree = 0, compared = 0;
	uint64_t hit_blocks = 0, hit_after = 0;
	for (uint32_t k = 0; k < NREQ; k++)
		for (uint32_t rank = 1; rank < WORLD; rank++)
			if (hits[rank][k] >= 0 && hits[0][k] >= 0) {
				compared++;
				disagree += hits[rank][k] != hits[0][k];
			}
	for (uint32_t k = 0; k < NREQ; k++) {
		hit_blocks += hits[0][k] > 0 ? (uint64_t)hits[0][k] / B_ : 0;
		if (k > KILL_AT)
			hit_after += hits[0][k] > 0 ? (uint64_t)hits[0][k] / B_ : 0;
	}
	ok(compared > 0 && disagree == 0, "every rank got the same hit for every request (%d pairs compared)", compared);
	ok(hit_blocks > 0 && hit_after > 0,
	   "requests hit cached blocks (%llu blocks in all, %llu after the death: the survivors keep working)",
	   (unsigned long long)hit_blocks, (unsigned long long)hit_after);

	/* the group's rules at attach, with the ranks gone */
	c = attach_rank("second", "tp.other", 1, WORLD, HEADS, MODEL, &r);
	ok(!c && r == -EEXIST, "a second pool for rank 1 is refused (%d)", r);
	c = attach_rank("othermodel", "tp.r1", 1, WORLD, HEADS, "test/other@1", &r);
	ok(!c && r == KVQ_ELAYOUT, "a rank with another model is refused (%d)", r);
	c = attach_rank("plain", "tp.r0", 0, 0, HEADS / WORLD, MODEL, &r);
	ok(!c && r == KVQ_ELAYOUT, "a plain attach to a member pool is refused (%d)", r);
	{
		/* a rank whose pool would keep sink blocks where the group's do not */
		struct kvq_attach_params p = { .pool = "tp.sink", .model_id = MODEL, .layers = L_, .kv_heads = HEADS,
					       .head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16,
					       .create = 1, .n_sealed = 28, .n_open = 24, .backend = "host", .device = -1 };
		c = NULL;
		r = kvq_client_connect(sock_path, "sinkrank", &c);
		if (r == 0)
			r = kvq_client_set_group(c, group_name, 1, WORLD);
		if (r == 0)
			r = kvq_client_set_sinks(c, 1, 0);
		if (r == 0)
			r = kvq_client_attach(c, &p);
		ok(r == KVQ_ELAYOUT, "a rank with sink blocks in a group without is refused (%d: %s)", r,
		   c ? kvq_client_error(c) : "");
		kvq_client_free(c);
		c = NULL;
	}
	{
		/* a rank whose pool would keep another window than the group's
		 * (before the check, this new pool got as far as -EEXIST) */
		struct kvq_attach_params p = { .pool = "tp.window", .model_id = MODEL, .layers = L_, .kv_heads = HEADS,
					       .head_dim = D_, .block_tokens = B_, .window = 2 * B_, .policy = "int8",
					       .act = KVQ_ACT_F16, .create = 1, .n_sealed = 28, .n_open = 24,
					       .backend = "host", .device = -1 };
		c = NULL;
		r = kvq_client_connect(sock_path, "windowrank", &c);
		if (r == 0)
			r = kvq_client_set_group(c, group_name, 1, WORLD);
		if (r == 0)
			r = kvq_client_attach(c, &p);
		ok(r == KVQ_ELAYOUT && c && strstr(kvq_client_error(c), "window 16"),
		   "a rank with another window than the group's is refused (%d: %s)", r, c ? kvq_client_error(c) : "");
		kvq_client_free(c);
		c = NULL;
	}
	/* a lookup without a request id */
	c = attach_rank("norid", "tp.r2", 2, WORLD, HEADS, MODEL, &r);
	uint32_t tok[256], n = prompt_of(0, tok), ids[16], got_n = 99;
	r = c ? kvq_client_lookup(c, tok, n, n / B_ * B_, NULL, 0, ids, &got_n) : -1;
	ok(r == -EINVAL, "a member pool's lookup without a request id is refused (%d: %s)", r,
	   c ? kvq_client_error(c) : "");
	kvq_client_free(c);

	/* a restarted victim and the others agree on every family */
	uint32_t fh[WORLD][FAMILIES];
	r = final_check(fh, dir);
	int fdis = 0;
	uint32_t fsum = 0;
	for (uint32_t fam = 0; fam < FAMILIES; fam++) {
		fsum += fh[0][fam];
		for (uint32_t rank = 1; rank < WORLD; rank++)
			fdis += fh[rank][fam] != fh[0][fam];
	}
	ok(r == 0 && fdis == 0, "after the run, every rank (the victim restarted) finds the same prefix of each "
	   "family (%u %u %u %u tokens)", fh[0][0], fh[0][1], fh[0][2], fh[0][3]);

	/* a rank that dies in its write: the blocks the other rank published for
	 * the same tokens are released (group tq of 2 ranks, 4 heads each) */
	group_name = "tq";
	for (uint32_t rank = 0; rank < 2; rank++) {
		pid_t pid = fork();
		if (pid == 0) {
			char pool[16];
			uint32_t pt[256], hit;
			int e;

			snprintf(pool, sizeof(pool), "tq.r%u", rank);
			kvq_client *rc = attach_rank("tq", pool, rank, 2, HEADS, MODEL, &e);
			uint32_t pn = prompt_of(1, pt);
			/* rank 0 commits; rank 1 is killed between its write and its commit */
			_exit(rc && run_request(rc, rank, "tq-0", pt, pn, true, rank == 1, &hit) == 0 ? 0 : 1);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		if (rank == 0)
			ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "group tq: rank 0 publishes a prompt");
		else
			ok(WIFSIGNALED(st), "group tq: rank 1 dies between its write and its commit");
	}
	group_name = GROUP;
	{
		kvq_client *w = attach_rank("tq-watch", "tp.r0", 0, WORLD, HEADS, MODEL, &r);
		struct kvq_stats st = { 0 };
		bool gone = false;

		/* kvqd drops the dead rank's lease once its process is gone */
		for (int i = 0; w && i < 300 && !gone; i++) {
			gone = kvq_client_stats(w, "tq.r0", &st) == 0 && st.cached == 0 && st.sealed_held == 0;
			if (!gone)
				usleep(10000);
		}
		ok(gone, "rank 0's published blocks of that prompt are released (cached %u)", st.cached);
		kvq_client_free(w);
	}

	/* accounting, once the pending lookups have timed out (a lookup of the
	 * group expires them) */
	usleep((TIMEOUT_MS + 300) * 1000);
	c = attach_rank("sweep", "tp.r0", 0, WORLD, HEADS, MODEL, &r);
	if (c) {
		/* a prompt nothing matches: its own pending lookup holds nothing */
		kvq_seq *s = NULL;
		uint32_t hit;
		for (uint32_t i = 0; i < 40; i++)
			tok[i] = 7;
		if (kvq_seq_new(c, NULL, 0, &s) == 0 && kvq_seq_set_request(s, "sweep", 5) == 0)
			kvq_seq_from_prompt(s, tok, 40, &hit);
		kvq_seq_free(s);
	}
	bool balanced = c != NULL;
	uint64_t evictions = 0;
	for (uint32_t rank = 0; c && rank < WORLD; rank++) {
		struct kvq_stats st;
		char pool[32];

		snprintf(pool, sizeof(pool), "tp.r%u", rank);
		if (kvq_client_stats(c, pool, &st) < 0) {
			balanced = false;
			continue;
		}
		diag("%s: %u heads, free %u, cached %u, held %u, referenced %u, reserved %u, open %u, evictions %llu", pool,
		     st.kv_heads, st.sealed_free, st.cached, st.sealed_held, st.referenced, st.sealed_reserved,
		     st.open_used, (unsigned long long)st.evictions);
		evictions += st.evictions;
		/* the sweeper's own sequence is freed: it holds nothing */
		if (st.kv_heads != HEADS / WORLD || st.sealed_held || st.referenced || st.open_used ||
		    st.sealed_reserved || st.sealed_free + st.cached != st.n_sealed)
			balanced = false;
	}
	ok(balanced, "every member pool holds 2 heads and accounts for all its slots: nothing held, referenced or "
	   "reserved");
	ok(evictions > 0, "the members evicted blocks along the way (%llu)", (unsigned long long)evictions);
	kvq_client_free(c);
	test_daemon_stop(d, dir);
	return done_testing();
}
