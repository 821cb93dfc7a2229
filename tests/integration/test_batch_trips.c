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

#include <stdbool.h>
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
		kvq_client_free(c);
	}
	r = test_proxy_stop(&px);
	ok(r == 0, "the proxy forwarded everything without a failure (%d)", r);
	test_daemon_stop(pid, dir);
	return done_testing();
}
