/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Round trips, counted by a proxy between libkvq and the real kvqd (host
 * backend), not by libkvq: tests/proxy.h forwards the client's connection
 * and counts the turns where the client's bytes are followed by the
 * daemon's, and the frames each way.  First the proxy is held to calls
 * whose cost is known (Hello, Attach with the pool's descriptor, Stats, a
 * sequence's begin); then a decode step of 256 sequences through kvq_batch
 * must cost one round trip to begin, whether some sequences need a new
 * block or none does (none: no request at all), and one to commit the
 * blocks it seals and publishes; a step whose prompts are looked up first
 * at most two (Lookup, then Alloc).  kvq_batch_requests must say what the
 * proxy saw.
 *
 * KVQ_TEST_KVQD names the kvqd binary (default $top_builddir/daemon/kvqd).
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../proxy.h"
#include "../synth.h"
#include "conn.h"
#include "frame_io.h"
#include "kvq.h"
#include "kvq_format.h"

#define L_ 2
#define H_ 1
#define QH_ 2
#define D_ 32
#define B_ 16              /* int8's window is one block: a new block every B tokens */
#define NSEQ 256
#define NLOOK 64           /* sequences of the lookup step */
#define LOOK_TAIL 5        /* tokens each appends after its hit */
#define N_OPEN 1024        /* >= 2 * NSEQ + NLOOK: a sequence holds an open slot and, for a step, a second */
#define N_SEALED 1024     /* every open slot reserves one; 8 MiB a pool in the test config */
#define MAX_ROWS (NSEQ * B_)
#define POOL "trips"
#define MODEL "test/trips@1"

static struct proxy px;
static char sock_path[108], proxy_path[108];

/* Token at position pos of sequence i: unique to the sequence. */
static uint32_t tok_of(uint32_t i, uint32_t pos)
{
	return 100000u + i * 4096u + pos;
}

static void make_kv(uint32_t rows, uint32_t layer, uint32_t step, uint16_t *k, uint16_t *v)
{
	for (uint32_t t = 0; t < rows; t++)
		for (uint32_t h = 0; h < H_; h++)
			for (uint32_t d = 0; d < D_; d++) {
				size_t i = ((size_t)t * H_ + h) * D_ + d;

				k[i] = kvq_f16_from_f32((float)synth_kv(t, step, layer, h, d, 0));
				v[i] = kvq_f16_from_f32((float)synth_kv(t, step, layer, h, d, 1));
			}
}

static kvq_client *open_pool(int *ret)
{
	struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .device = -1 };
	struct proxy_count n, t0 = test_proxy_snap(&px);
	kvq_client *c = NULL;

	*ret = kvq_client_connect(proxy_path, "trips", &c);
	if (*ret < 0)
		return NULL;
	n = test_proxy_since(&px, t0);
	ok(n.trips == 1 && n.frames[PROXY_UP] == 1 && n.frames[PROXY_DOWN] == 1,
	   "connect through the proxy: Hello is 1 round trip (%llu), 1 frame each way",
	   (unsigned long long)n.trips);
	t0 = test_proxy_snap(&px);
	*ret = kvq_client_attach(c, &p);
	n = test_proxy_since(&px, t0);
	if (*ret < 0) {
		diag("attach: %s", kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	ok(n.trips == 1 && n.fds[PROXY_DOWN] == 1 && n.fds[PROXY_UP] == 0,
	   "attach: 1 round trip (%llu), the pool's descriptor forwarded with its reply (%llu)",
	   (unsigned long long)n.trips, (unsigned long long)n.fds[PROXY_DOWN]);
	return c;
}

/* The proxy tells requests written together from requests that wait for
 * each other: three Stats in one write, read back after, are one round
 * trip (the protocol directly, proto/conn.h, on a connection of its own). */
static void test_pipelined(const char *dir)
{
	struct proxy p2;
	struct kvq_conn k;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Stats st = KVQ__STATS__INIT;
	struct proxy_count t0, n;
	uint8_t buf[3 * 64];
	char path[108];
	size_t len = 0;
	int r;

	snprintf(path, sizeof path, "%s/proxy2.sock", dir);
	if (test_proxy_start(&p2, path, sock_path) < 0) {
		ok(0, "a second proxy");
		return;
	}
	kvq_conn_init(&k, 5000);
	r = kvq_conn_open(&k, path, "trips-raw");
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &st;
	for (int i = 0; i < 3 && r >= 0; i++) {
		e.id = ++k.next_id;
		r = kvq_frame_encode(&e, buf + len, sizeof buf - len);
		len += r > 0 ? (size_t)r : 0;
	}
	t0 = test_proxy_snap(&p2);
	r = r < 0 ? r : kvq_frame_send_frames(k.fd, buf, len, -1, 5000);
	for (uint64_t id = k.next_id - 2; id <= k.next_id && r == 0; id++)
		r = kvq_conn_reply(&k, id, KVQ__ENVELOPE__BODY_STATS_REPLY, NULL);
	n = test_proxy_since(&p2, t0);
	ok(r == 0 && n.trips == 1 && n.frames[PROXY_UP] == 3 && n.frames[PROXY_DOWN] == 3,
	   "three Stats written together, then their replies: 1 round trip (%llu), 3 frames each way (%llu, %llu)",
	   (unsigned long long)n.trips, (unsigned long long)n.frames[PROXY_UP],
	   (unsigned long long)n.frames[PROXY_DOWN]);
	kvq_conn_close(&k);
	test_proxy_stop(&p2);
}

/* Every request got its reply within the span. */
static bool answered(struct proxy_count n)
{
	return n.frames[PROXY_UP] == n.frames[PROXY_DOWN];
}

/* The proxy against calls whose cost is known, and a sequence's own
 * calls (kvq_seq_*), whose figures are reported. */
static void test_single(kvq_client *c)
{
	static uint16_t k[B_ * H_ * D_], v[B_ * H_ * D_];
	uint32_t tok[B_ + 2];
	struct kvq_stats st;
	struct proxy_count t0, n;
	kvq_seq *s = NULL;
	int r;

	for (uint32_t i = 0; i < B_ + 2; i++)
		tok[i] = tok_of(NSEQ + NLOOK, i);
	t0 = test_proxy_snap(&px);
	r = kvq_client_stats(c, NULL, &st);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips == 1 && n.frames[PROXY_UP] == 1 && n.frames[PROXY_DOWN] == 1,
	   "kvq_client_stats: 1 round trip (%llu), 1 request, 1 reply", (unsigned long long)n.trips);
	t0 = test_proxy_snap(&px);
	for (int i = 0; i < 3 && r == 0; i++)
		r = kvq_client_stats(c, NULL, &st);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips == 3 && n.frames[PROXY_UP] == 3, "three of them: 3 round trips (%llu)",
	   (unsigned long long)n.trips);

	if (kvq_seq_new(c, NULL, 0, &s) < 0) {
		ok(0, "a sequence");
		return;
	}
	make_kv(B_, 0, 0, k, v);
	t0 = test_proxy_snap(&px);
	r = kvq_seq_begin(s, tok, B_);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips == 1 && answered(n), "kvq_seq_begin of %u tokens (a new block): 1 round trip (%llu)",
	   B_, (unsigned long long)n.trips);
	t0 = test_proxy_snap(&px);
	for (uint32_t l = 0; l < L_ && r == 0; l++)
		r = kvq_seq_write(s, l, k, v);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips == 0 && n.bytes[PROXY_UP] == 0, "its writes: nothing on the wire");
	t0 = test_proxy_snap(&px);
	r = r ? r : kvq_seq_commit(s);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips <= 1 && answered(n), "its commit, nothing to seal: %llu round trips (%llu requests)",
	   (unsigned long long)n.trips, (unsigned long long)n.frames[PROXY_UP]);

	/* the next token crosses into block 1: a new open block, then block 0 sealed and published */
	t0 = test_proxy_snap(&px);
	r = r ? r : kvq_seq_begin(s, tok + B_, 1);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips == 1 && answered(n), "kvq_seq_begin across a block boundary: 1 round trip (%llu)",
	   (unsigned long long)n.trips);
	for (uint32_t l = 0; l < L_ && r == 0; l++)
		r = kvq_seq_write(s, l, k, v);
	t0 = test_proxy_snap(&px);
	r = r ? r : kvq_seq_commit(s);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips >= 1 && n.trips <= 2 && n.frames[PROXY_UP] == 2 && answered(n),
	   "kvq_seq_commit sealing and publishing a block: Seal and Publish, %llu round trips",
	   (unsigned long long)n.trips);

	/* within block 1: no slot to allocate */
	t0 = test_proxy_snap(&px);
	r = r ? r : kvq_seq_begin(s, tok + B_ + 1, 1);
	n = test_proxy_since(&px, t0);
	ok(r == 0 && n.trips <= 1 && answered(n), "kvq_seq_begin needing no block: %llu round trips",
	   (unsigned long long)n.trips);
	for (uint32_t l = 0; l < L_ && r == 0; l++)
		r = kvq_seq_write(s, l, k, v);
	r = r ? r : kvq_seq_commit(s);
	if (r < 0)
		diag("sequence: %s", kvq_client_error(c));
	t0 = test_proxy_snap(&px);
	kvq_seq_free(s);
	n = test_proxy_since(&px, t0);
	ok(n.trips == 1 && n.frames[PROXY_UP] == 1 && answered(n), "kvq_seq_free: one Release, 1 round trip (%llu)",
	   (unsigned long long)n.trips);
}

/* ---------------------------------------------------------------- the batch */

/* The proxy's counts of one step: its begin, its commit, and all of it. */
struct step_count {
	struct proxy_count begin, commit, all;
};

/*
 * One step of b over seqs[0..n): sequence i appends m[i] tokens, all of
 * them one after another in tok; flags for each.  Writes every layer (and
 * attends each when attend).  hit (may be NULL) gets each sequence's
 * lookup hit and rows its new rows, as the begun step says.  Returns 0 or
 * the first failure.
 */
static int run_step(kvq_batch *b, kvq_seq **seqs, uint32_t n, const uint32_t *m, const uint32_t *tok, unsigned flags,
		    bool attend, uint32_t step, struct step_count *ret, uint32_t *hit, uint32_t *rows)
{
	static uint16_t k[MAX_ROWS * H_ * D_], v[MAX_ROWS * H_ * D_];
	static float q[MAX_ROWS * QH_ * D_], out[MAX_ROWS * QH_ * D_];
	struct proxy_count t0, t_all;
	const uint32_t *indptr;
	uint32_t nseq = 0;
	size_t off = 0;
	int r = kvq_batch_clear(b);

	*ret = (struct step_count){ 0 };
	for (uint32_t i = 0; i < n && r >= 0; i++) {
		r = kvq_batch_add(b, seqs[i], tok + off, m[i], flags);
		off += m[i];
	}
	if (r < 0)
		return r;
	t_all = t0 = test_proxy_snap(&px);
	r = kvq_batch_begin(b, NULL);
	ret->begin = test_proxy_since(&px, t0);
	if (r < 0)
		return r;
	indptr = kvq_batch_indptr(b, &nseq);
	if (!indptr || nseq != n || indptr[n] > MAX_ROWS) {
		kvq_batch_abort(b);
		return -EPROTO;
	}
	for (uint32_t i = 0; hit && i < n; i++) {
		hit[i] = kvq_batch_hit(b, i);
		rows[i] = indptr[i + 1] - indptr[i];
	}
	for (uint32_t i = 0; i < indptr[n] * QH_ * D_; i++)
		q[i] = (float)synth_kv(i, step, 0, 0, 0, 0);
	for (uint32_t l = 0; l < L_ && r == 0; l++) {
		make_kv(indptr[n], l, step, k, v);
		r = kvq_batch_write(b, l, k, v);
		if (r == 0 && attend)
			r = kvq_batch_attention(b, l, QH_, 0.0f, q, out);
	}
	if (r < 0) {
		kvq_batch_abort(b);
		return r;
	}
	t0 = test_proxy_snap(&px);
	r = kvq_batch_commit(b);
	ret->commit = test_proxy_since(&px, t0);
	ret->all = test_proxy_since(&px, t_all);
	return r;
}

/* What kvq_batch_requests says of a phase agrees with the proxy: the
 * requests are the frames it forwarded, the waits its round trips. */
static bool agrees(const kvq_batch *b, int phase, struct proxy_count n, uint32_t *ret_waits)
{
	uint32_t req = UINT32_MAX, waits = UINT32_MAX;

	if (kvq_batch_requests(b, phase, &req, &waits) < 0)
		return false;
	*ret_waits = waits;
	return req == n.frames[PROXY_UP] && waits == n.trips && answered(n);
}

/* Both phases of a step agree with the proxy, and the writes and
 * attention between them sent nothing. */
static void check_step(const kvq_batch *b, const struct step_count *n, const char *what)
{
	uint32_t wb = 0, wc = 0;
	bool ab = agrees(b, KVQ_BATCH_BEGIN, n->begin, &wb), ac = agrees(b, KVQ_BATCH_COMMIT, n->commit, &wc);

	ok(ab && ac && n->all.trips == n->begin.trips + n->commit.trips &&
	   n->all.frames[PROXY_UP] == n->begin.frames[PROXY_UP] + n->commit.frames[PROXY_UP],
	   "%s: kvq_batch_requests agrees with the proxy (begin %u waits / %llu round trips, commit %u / %llu), "
	   "nothing sent between", what, wb, (unsigned long long)n->begin.trips, wc,
	   (unsigned long long)n->commit.trips);
}

static void test_batch(kvq_client *c)
{
	static kvq_seq *seqs[NSEQ + NLOOK];
	static uint32_t tok[NSEQ * B_], m[NSEQ];
	struct step_count n = { 0 };
	kvq_batch *b = NULL;
	struct kvq_stats st;
	uint32_t pos[NSEQ], hit[NLOOK], rows[NLOOK], sealed_even = 0, hits = 0, rows_ok = 0;
	size_t off = 0;
	int r = kvq_batch_new(c, &b);

	for (uint32_t i = 0; i < NSEQ + NLOOK && r == 0; i++)
		r = kvq_seq_new(c, NULL, 0, &seqs[i]);
	if (!ok(r == 0, "a batch and %u sequences (%d)", NSEQ + NLOOK, r))
		goto out;

	/* prefill: even sequences fill their first block (16 tokens), odd ones 10 */
	for (uint32_t i = 0; i < NSEQ; i++) {
		m[i] = i % 2 ? 10 : B_;
		for (uint32_t t = 0; t < m[i]; t++)
			tok[off++] = tok_of(i, t);
		pos[i] = m[i];
	}
	r = run_step(b, seqs, NSEQ, m, tok, 0, false, 0, &n, NULL, NULL);
	ok(r == 0 && n.begin.trips == 1, "prefill of %u sequences, every one a new block: begin is 1 round trip (%llu)",
	   NSEQ, (unsigned long long)n.begin.trips);
	ok(r == 0 && n.commit.trips <= 1, "its commit, nothing sealed: %llu round trips (%llu requests)",
	   (unsigned long long)n.commit.trips, (unsigned long long)n.commit.frames[PROXY_UP]);
	check_step(b, &n, "prefill");
	if (r < 0)
		goto fail;

	/* decode A: the even sequences cross into block 1 (a new open block each,
	 * then block 0 sealed and published), the odd ones stay in block 0 */
	for (uint32_t i = 0; i < NSEQ; i++) {
		m[i] = 1;
		tok[i] = tok_of(i, pos[i]++);
	}
	r = run_step(b, seqs, NSEQ, m, tok, 0, true, 1, &n, NULL, NULL);
	ok(r == 0 && n.begin.trips == 1,
	   "decode step of %u sequences, %u needing a new block: begin is 1 round trip (%llu; %llu requests)", NSEQ,
	   NSEQ / 2, (unsigned long long)n.begin.trips, (unsigned long long)n.begin.frames[PROXY_UP]);
	ok(r == 0 && n.commit.trips == 1,
	   "its commit, sealing and publishing %u blocks: 1 round trip (%llu; %llu requests)", NSEQ / 2,
	   (unsigned long long)n.commit.trips, (unsigned long long)n.commit.frames[PROXY_UP]);
	check_step(b, &n, "decode with new blocks");
	for (uint32_t i = 0; i < NSEQ; i += 2) {
		uint32_t ns = 0;

		kvq_seq_blocks(seqs[i], NULL, &ns, NULL, NULL);
		sealed_even += ns == 1 && kvq_seq_tokens(seqs[i]) == B_ + 1;
	}
	if (kvq_client_stats(c, NULL, &st) < 0)
		st.cached = 0;
	ok(sealed_even == NSEQ / 2 && st.cached >= NSEQ / 2,
	   "the even sequences' first blocks are sealed (%u) and cached (%u)", sealed_even, st.cached);
	if (r < 0)
		goto fail;

	/* decode B: nobody crosses a block boundary */
	for (uint32_t i = 0; i < NSEQ; i++)
		tok[i] = tok_of(i, pos[i]++);
	r = run_step(b, seqs, NSEQ, m, tok, 0, true, 2, &n, NULL, NULL);
	ok(r == 0 && n.begin.trips <= 1,
	   "decode step of %u sequences, none needing a block: begin is %llu round trips (%llu requests)", NSEQ,
	   (unsigned long long)n.begin.trips, (unsigned long long)n.begin.frames[PROXY_UP]);
	ok(r == 0 && n.commit.trips <= 1, "its commit, nothing to seal: %llu round trips (%llu requests)",
	   (unsigned long long)n.commit.trips, (unsigned long long)n.commit.frames[PROXY_UP]);
	check_step(b, &n, "decode without new blocks");
	if (r < 0)
		goto fail;

	/* prompts looked up first: each is an even sequence's first block (cached
	 * now) and LOOK_TAIL tokens of its own */
	off = 0;
	for (uint32_t j = 0; j < NLOOK; j++) {
		m[j] = B_ + LOOK_TAIL;
		for (uint32_t t = 0; t < m[j]; t++)
			tok[off++] = t < B_ ? tok_of(2 * j, t) : tok_of(NSEQ + j, t);
	}
	r = run_step(b, seqs + NSEQ, NLOOK, m, tok, KVQ_BATCH_LOOKUP, false, 3, &n, hit, rows);
	for (uint32_t j = 0; j < NLOOK && r == 0; j++) {
		hits += hit[j] == B_;
		rows_ok += rows[j] == LOOK_TAIL;
	}
	ok(r == 0 && n.begin.trips <= 2,
	   "%u prompts looked up and appended: begin is %llu round trips (at most 2: Lookup, Alloc; %llu requests)",
	   NLOOK, (unsigned long long)n.begin.trips, (unsigned long long)n.begin.frames[PROXY_UP]);
	ok(hits == NLOOK && rows_ok == NLOOK, "each found its %u cached tokens (%u) and wrote the rest (%u)", B_, hits,
	   rows_ok);
	check_step(b, &n, "lookup");
fail:
	if (r < 0)
		diag("batch: %s (%s)", kvq_strerror(r), kvq_client_error(c));
out:
	kvq_batch_free(b);
	for (uint32_t i = 0; i < NSEQ + NLOOK; i++)
		kvq_seq_free(seqs[i]);
}

int main(void)
{
	char dir[64], bin[512];
	kvq_client *c;
	pid_t pid;
	int r;

	pid = test_daemon_start("host", "trips", dir, sizeof dir, sock_path, sizeof sock_path, bin, sizeof bin);
	if (pid < 0) {
		ok(0, "kvqd starts (%s)", bin);
		return done_testing();
	}
	snprintf(proxy_path, sizeof proxy_path, "%s/proxy.sock", dir);
	r = test_proxy_start(&px, proxy_path, sock_path);
	if (!ok(r == 0, "the counting proxy listens (%d)", r)) {
		test_daemon_stop(pid, dir);
		return done_testing();
	}
	test_pipelined(dir);
	c = open_pool(&r);
	ok(c != NULL, "a client attaches through the proxy (%d)", r);
	if (c) {
		test_single(c);
		test_batch(c);
		kvq_client_free(c);
	}
	r = test_proxy_stop(&px);
	ok(r == 0, "the proxy forwarded everything without a failure (%d)", r);
	test_daemon_stop(pid, dir);
	return done_testing();
}
