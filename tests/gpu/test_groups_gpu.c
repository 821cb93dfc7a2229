/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A two-rank tensor-parallel group on two GPUs: one kvqd with cuda pools,
 * a model of 8 KV heads (4 per rank, 16 query heads), synthetic K/V.
 *  - a first pair of worker processes, rank 0 on the first device and
 *    rank 1 on the second, each in its own member pool, writes a prompt
 *    and commits it (both ranks publish it);
 *  - a second pair of processes looks the prompt up under one request id:
 *    both get the same hit, the whole sealed prefix;
 *  - each rank's attention (decode queries after the prompt and its rest)
 *    equals, within 2e-3 of the largest value, a single-GPU run of all 8
 *    heads in one pool, heads 0-3 and 4-7 (query heads 0-7 and 8-15);
 *  - the machine's peer access between the two devices is reported (a
 *    comment: where it is allowed, a rank could map its peer's pool).
 * KVQ_TEST_DEVICES names the two devices (default "0,1"); with fewer than
 * two GPUs it prints "1..0 # SKIP".  KVQ_TEST_BACKEND=host runs the same on
 * host pools (no GPU needed: the group logic and the comparison alone).
 */
#include <config.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../tap.h"
#include "../daemon.h"
#include "kvq.h"
#include "kvq_format.h"

#define HEADS 8
#define QHEADS 16
#define L_ 2
#define D_ 128
#define B_ 32
#define PROMPT 300
#define REST 21
#define NQ 2                 /* decode query tokens checked (the last NQ) */
#define POLICY "int8"
#define MODEL "test/tp2@1"

static char sock_path[108], tmpdir[64], daemon_bin[512];
static const char *backend = "cuda";
static int devs[2] = { 0, 1 };

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float val(uint64_t s)
{
	return (float)((double)(mix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint32_t token(uint32_t i)
{
	return 100 + (uint32_t)(mix(i) % 30000);
}

/* K/V of tokens t0 .. t0 + n - 1, heads h0 .. h0 + nh - 1 of the model's
 * 8, as [token][head][D] FP16 */
static void fill_kv(uint16_t *k, uint16_t *v, uint32_t t0, uint32_t n, uint32_t h0, uint32_t nh, uint32_t layer)
{
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t h = 0; h < nh; h++)
			for (uint32_t d = 0; d < D_; d++) {
				uint64_t s = ((uint64_t)(t0 + t) << 24) ^ ((uint64_t)layer << 20) ^ ((h0 + h) << 12) ^ d;
				size_t i = ((size_t)t * nh + h) * D_ + d;
				k[i] = kvq_f16_from_f32(2.0f * val(s));
				v[i] = kvq_f16_from_f32(val(s ^ 0x5555ull));
			}
}

/* q of the last NQ tokens, query heads q0 .. q0 + nq - 1 of 16, [token][head][D] */
static void fill_q(float *q, uint32_t q0, uint32_t nq)
{
	for (uint32_t t = 0; t < NQ; t++)
		for (uint32_t h = 0; h < nq; h++)
			for (uint32_t d = 0; d < D_; d++)
				q[((size_t)t * nq + h) * D_ + d] = val(((uint64_t)t << 40) ^ ((q0 + h) << 12) ^ d ^ 0xabcull);
}

/* One worker: attach (as rank `rank` of 2, or alone with all heads when
 * rank < 0), the prompt looked up under rid, its rest written and
 * committed, attention of the last NQ tokens' queries; the hit and the
 * output (every layer) into path.  Exit status 0 or 1. */
static int worker(int rank, const char *rid, const char *path)
{
	const uint32_t nh = rank < 0 ? HEADS : HEADS / 2, nq = rank < 0 ? QHEADS : QHEADS / 2;
	const uint32_t h0 = rank > 0 ? HEADS / 2 : 0, q0 = rank > 0 ? QHEADS / 2 : 0, n = PROMPT + REST;
	char pool[32];
	struct kvq_attach_params p = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = HEADS, .head_dim = D_,
				       .block_tokens = B_, .policy = POLICY, .act = KVQ_ACT_F16, .create = 1,
				       .n_sealed = 24, .n_open = 8, .backend = backend,
				       .device = rank > 0 ? devs[1] : devs[0] };
	static uint16_t k[(PROMPT + REST) * HEADS * D_], v[(PROMPT + REST) * HEADS * D_];
	static float q[NQ * QHEADS * D_], out[L_ * NQ * QHEADS * D_];   /* [layer][token][q head][D], packed */
	uint32_t tok[PROMPT + REST], hit = 0;
	kvq_client *c = NULL;
	kvq_seq *s = NULL;
	FILE *f;
	int r;

	snprintf(pool, sizeof(pool), rank < 0 ? "tp2.single" : "tp2.r%d", rank);
	for (uint32_t i = 0; i < n; i++)
		tok[i] = token(i);
	r = kvq_client_connect(sock_path, "tp2-worker", &c);
	if (r == 0 && rank >= 0)
		r = kvq_client_set_group(c, "tp2", (uint32_t)rank, 2);
	if (r == 0)
		r = kvq_client_attach(c, &p);
	if (r == 0)
		r = kvq_seq_new(c, NULL, 0, &s);
	if (r == 0)
		r = kvq_seq_set_request(s, rid, strlen(rid));
	/* the first pair: the prompt alone, committed; later: prompt and rest */
	const uint32_t upto = strcmp(rid, "publish") ? n : PROMPT;
	if (r == 0)
		r = kvq_seq_from_prompt(s, tok, upto, &hit);
	if (r == 0)
		r = kvq_seq_begin(s, tok + hit, upto - hit);
	for (uint32_t l = 0; r == 0 && l < L_; l++) {
		fill_kv(k, v, hit, upto - hit, h0, nh, l);
		r = kvq_seq_write(s, l, k, v);
	}
	if (r == 0)
		r = kvq_seq_commit(s);
	fill_q(q, q0, nq);
	for (uint32_t l = 0; r == 0 && upto == n && l < L_; l++)
		r = kvq_seq_attention(s, l, nq, NQ, 0.0f, q, out + (size_t)l * NQ * nq * D_);
	if (r < 0)
		fprintf(stderr, "worker %d (%s): %d %s\n", rank, rid, r, c ? kvq_client_error(c) : "");
	kvq_seq_free(s);
	kvq_client_free(c);
	if (r < 0 || !(f = fopen(path, "wb")))
		return 1;
	r = fwrite(&hit, sizeof(hit), 1, f) == 1 && fwrite(out, sizeof(float), (size_t)L_ * NQ * nq * D_, f) ==
						    (size_t)L_ * NQ * nq * D_;
	return fclose(f) == 0 && r ? 0 : 1;
}

/* Runs workers for ranks[0 .. n) at once; 0 when every one exited 0. */
static int run(const int *ranks, int n, const char *rid)
{
	pid_t pid[2];
	int bad = 0;

	for (int i = 0; i < n; i++) {
		char path[160];

		snprintf(path, sizeof(path), "%s/%s.%d", tmpdir, rid, ranks[i]);
		pid[i] = fork();
		if (pid[i] == 0)
			_exit(worker(ranks[i], rid, path));
	}
	for (int i = 0; i < n; i++) {
		int st;
		bad |= pid[i] < 0 || waitpid(pid[i], &st, 0) != pid[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	}
	return bad ? -1 : 0;
}

/* A worker's file: its hit and n floats. */
static int load(const char *rid, int rank, uint32_t *hit, float *out, size_t n)
{
	char path[160];
	FILE *f;
	int r;

	snprintf(path, sizeof(path), "%s/%s.%d", tmpdir, rid, rank);
	if (!(f = fopen(path, "rb")))
		return -1;
	r = fread(hit, sizeof(*hit), 1, f) == 1 && fread(out, sizeof(float), n, f) == n ? 0 : -1;
	fclose(f);
	unlink(path);
	return r;
}

int main(void)
{
	static float single[L_ * NQ * QHEADS * D_], part[2][L_ * NQ * (QHEADS / 2) * D_];
	const char *env_devs = getenv("KVQ_TEST_DEVICES");
	uint32_t hit_pub[2], hit[2], hit_single;
	int ndev = 0, peer01 = 0, peer10 = 0;
	const int pair[2] = { 0, 1 }, alone[1] = { -1 };

	if (getenv("KVQ_TEST_BACKEND"))
		backend = getenv("KVQ_TEST_BACKEND");
	if (env_devs && sscanf(env_devs, "%d,%d", &devs[0], &devs[1]) != 2) {
		printf("Bail out! KVQ_TEST_DEVICES: two device ordinals, as 0,1\n");
		return 1;
	}
	if (!strcmp(backend, "cuda")) {
		if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2 || devs[0] == devs[1] ||
		    devs[0] >= ndev || devs[1] >= ndev) {
			printf("1..0 # SKIP two usable GPUs needed (%d found)\n", ndev);
			return 0;
		}
		cudaDeviceCanAccessPeer(&peer01, devs[0], devs[1]);
		cudaDeviceCanAccessPeer(&peer10, devs[1], devs[0]);
		diag("devices %d and %d; peer access %d -> %d: %s, %d -> %d: %s", devs[0], devs[1], devs[0], devs[1],
		     peer01 ? "allowed" : "not allowed", devs[1], devs[0], peer10 ? "allowed" : "not allowed");
	}
	pid_t d = test_daemon_start_conf(backend, "tp2", NULL, tmpdir, sizeof(tmpdir), sock_path,
					 sizeof(sock_path), daemon_bin, sizeof(daemon_bin));
	if (!ok(d > 0, "kvqd started (%s, backend %s)", daemon_bin, backend))
		return done_testing();
	ok(run(pair, 2, "publish") == 0 && load("publish", 0, &hit_pub[0], part[0], 0) == 0 &&
	   load("publish", 1, &hit_pub[1], part[1], 0) == 0 && hit_pub[0] == 0 && hit_pub[1] == 0,
	   "the first pair (rank 0 on device %d, rank 1 on device %d) writes and publishes a %u-token prompt", devs[0],
	   devs[1], PROMPT);
	const size_t np = (size_t)L_ * NQ * (QHEADS / 2) * D_;
	ok(run(pair, 2, "second") == 0 && load("second", 0, &hit[0], part[0], np) == 0 &&
	   load("second", 1, &hit[1], part[1], np) == 0, "a second pair of processes looks the prompt up and decodes");
	ok(hit[0] == hit[1] && hit[0] == PROMPT / B_ * B_, "both ranks hit the same %u tokens (%u, %u): the prompt's "
	   "whole blocks, published by both", PROMPT / B_ * B_, hit[0], hit[1]);
	ok(run(alone, 1, "single") == 0 && load("single", -1, &hit_single, single, (size_t)L_ * NQ * QHEADS * D_) == 0,
	   "a single-device run of all 8 heads");
	double worst = 0.0, mx = 0.0;
	for (uint32_t l = 0; l < L_; l++)
		for (uint32_t t = 0; t < NQ; t++)
			for (uint32_t qh = 0; qh < QHEADS; qh++)
				for (uint32_t dd = 0; dd < D_; dd++) {
					const int rk = qh >= QHEADS / 2;
					const float a = part[rk][(((size_t)l * NQ + t) * (QHEADS / 2) + qh % (QHEADS / 2)) * D_ + dd];
					const float b = single[(((size_t)l * NQ + t) * QHEADS + qh) * D_ + dd];
					worst = fabs(a - b) > worst ? fabs(a - b) : worst;
					mx = fabs(b) > mx ? fabs(b) : mx;
				}
	ok(mx > 0 && worst <= 2e-3 * mx, "each rank's attention equals the single-device run's heads: %.2e of max %.3f",
	   mx > 0 ? worst / mx : 0.0, mx);
	test_daemon_stop(d, tmpdir);
	return done_testing();
}
