/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's sequence helper on a cuda pool, against the same sequence on a
 * host pool: one real kvqd, pool "hp" (host backend) and pool "gp" (cuda),
 * the same geometry and a per-layer policy whose first layer is rotated
 * ("+rot") and whose second keeps V product-quantized, with the same codebooks (a file both attaches send,
 * which kvqd copies into each pool: on the cuda pool through the device's
 * memory).  The same prompt and decode
 * steps go through kvq_seq_begin/write/commit on both (K/V from device
 * memory for one layer, host memory for the other); then
 *  - attention (prefill queries during the write, decode queries after)
 *    on the GPU matches the CPU's within 2e-3 of max|cpu| (TOL), the
 *    rotated layer too;
 *  - every sealed block of the cuda pool holds the same bytes as the host
 *    pool's (the CUDA seal through libkvq equals the CPU seal);
 *  - a fork's attention equals its parent's, bit for bit;
 *  - a second client on the cuda pool finds the published prefix and its
 *    attention over it equals the first client's, bit for bit;
 *  - after kvq_seq_free every open slot is back (Stats).
 * All of it twice: in plain pools, then in pools with sink blocks (each
 * sequence's first block exact in a sink slot; its bytes compared too).
 * Prints "1..0 # SKIP" where no GPU is usable.
 */
#include <config.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "codebook.h"
#include "kvq.h"
#include "layout.h"

#define LAYERS 2
#define KVH 2
#define QH 8
#define D 64
#define B 16
#define PROMPT 100
#define STEPS 3
#define NTOK (PROMPT + STEPS)
#define POLICY "0:int8+rot;1:k=int8,v=pq2"

static char sock_path[108], tmpdir[64], daemon_bin[512], cb_path[128];
static uint32_t sinks;   /* the pools of this pass keep sink blocks */
static uint16_t kv[LAYERS][2][NTOK * KVH * D];   /* K and V of every token, f16 */

static struct kvq_attach_params params(const char *pool, const char *backend)
{
	return (struct kvq_attach_params){ .pool = pool, .model_id = "test/seq@1", .layers = LAYERS,
		.kv_heads = KVH, .head_dim = D, .block_tokens = B, .policy = POLICY,
		.act = KVQ_ACT_F16, .create = 1, .n_sealed = 64, .n_open = 16, .backend = backend,
		.codebooks = cb_path };
}

/* The policy's codebooks in tmpdir: random centroids, N(0, 1) as the K/V. */
static int write_codebooks(void)
{
	struct kvq_policy pol;
	uint64_t n;
	uint16_t *v;
	int fd, r = -1;

	if (kvq_policy_parse(POLICY, LAYERS, &pol, NULL, 0) < 0)
		return -1;
	n = kvq_codebook_bytes(&pol, KVH, D);
	if (!(v = malloc(n)))
		return -1;
	for (uint64_t i = 0; i < n / 2; i++)
		v[i] = kvq_f16_from_f32((float)tap_normal());
	snprintf(cb_path, sizeof cb_path, "%s/cb.kvqcb", tmpdir);
	fd = open(cb_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0) {
		r = kvq_codebook_write(fd, &pol, KVH, D, 0, v, n);
		close(fd);
	}
	free(v);
	return r;
}

static kvq_client *attach(const char *name, const char *pool, const char *backend)
{
	struct kvq_attach_params p = params(pool, backend);
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock_path, name, &c);

	if (r == 0)
		r = kvq_client_set_sinks(c, sinks, 0);
	if (r == 0)
		r = kvq_client_attach(c, &p);
	if (!ok(r == 0, "%s attaches to %s (%s): %d %s", name, pool, backend, r, c ? kvq_client_error(c) : "")) {
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* A query element exactly representable in FP16: the cuda path hands q to
 * the kernel in the pool's activation dtype, the host path in float. */
static float qval(void)
{
	return kvq_f16_to_f32(kvq_f16_from_f32((float)tap_normal()));
}

/* The bound of cuda against host attention, of max|cpu|.  At the layer that
 * rotates K both sides round the rotated q to the activation dtype (the
 * same FP32 rotation, the same bits), so it holds there too. */
#define TOL 2e-3

static double rel_diff(const float *a, const float *ref, size_t n)
{
	double e = 0, m = 0;

	for (size_t i = 0; i < n; i++) {
		if (isnan(a[i]))
			return INFINITY;
		e = fmax(e, fabs((double)a[i] - ref[i]));
		m = fmax(m, fabs(ref[i]));
	}
	return m > 0 ? e / m : e;
}

/* Writes tokens [n0, n0 + m) of every layer; layer 0's K/V come from device
 * memory on the cuda pool. */
static int write_tokens(kvq_seq *s, int cuda, const uint32_t *tok, uint32_t n0, uint32_t m, void *dbuf)
{
	const size_t row = (size_t)KVH * D;
	int r = kvq_seq_begin(s, tok + n0, m);

	for (uint32_t l = 0; l < LAYERS && r == 0; l++) {
		const uint16_t *k = kv[l][0] + n0 * row, *v = kv[l][1] + n0 * row;
		if (cuda && l == 0) {
			if (cudaMemcpy(dbuf, k, m * row * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
			    cudaMemcpy((uint8_t *)dbuf + m * row * 2, v, m * row * 2, cudaMemcpyHostToDevice) != cudaSuccess)
				return -EIO;
			r = kvq_seq_write(s, l, dbuf, (uint8_t *)dbuf + m * row * 2);
		} else {
			r = kvq_seq_write(s, l, k, v);
		}
	}
	return r;
}

/* One pass: the prompt, decode steps and the checks on pools hp and gp
 * (with sink blocks: hps and gps). */
static void run_pools(const uint32_t *tok, void *dbuf)
{
	static float q[8 * QH * D], oh[8 * QH * D], og[8 * QH * D], o2[8 * QH * D];
	const char *hpool = sinks ? "hps" : "hp", *gpool = sinks ? "gps" : "gp";

	diag("pools %s", sinks ? "with sink blocks" : "without sink blocks");
	kvq_client *ch = attach("host-worker", hpool, "host"), *cg = attach("gpu-worker", gpool, "cuda");
	kvq_seq *sh = NULL, *sg = NULL;
	if (!ch || !cg || kvq_seq_new(ch, NULL, 0, &sh) || kvq_seq_new(cg, NULL, 0, &sg))
		goto out;
	/* the prompt, with prefill queries (the last 7 tokens) during the write */
	int rh = write_tokens(sh, 0, tok, 0, PROMPT, dbuf), rg = write_tokens(sg, 1, tok, 0, PROMPT, dbuf);
	ok(rh == 0 && rg == 0, "prompt of %u tokens written on both pools (%d, %d: %s)", PROMPT, rh, rg,
	   kvq_client_error(cg));
	for (uint32_t l = 0; l < LAYERS; l++) {
		for (size_t i = 0; i < 7 * QH * D; i++)
			q[i] = qval();
		rh = kvq_seq_attention(sh, l, QH, 7, 0, q, oh);
		rg = kvq_seq_attention(sg, l, QH, 7, 0, q, og);
		double e = rel_diff(og, oh, 7 * QH * D);
		ok(rh == 0 && rg == 0 && e <= TOL, "layer %u prefill attention, cuda vs host: %.2e (<= %.0e; %d, %d: %s)",
		   l, e, TOL, rh, rg, kvq_client_error(cg));
	}
	rh = kvq_seq_commit(sh);
	rg = kvq_seq_commit(sg);
	ok(rh == 0 && rg == 0, "prompt committed and published on both (%d, %d: %s)", rh, rg, kvq_client_error(cg));

	/* decode queries of the committed prompt, kept for the prefix check */
	static float qd[LAYERS][QH * D], od[LAYERS][QH * D];
	for (uint32_t l = 0; l < LAYERS; l++) {
		for (size_t i = 0; i < QH * D; i++)
			qd[l][i] = qval();
		rh = kvq_seq_attention(sh, l, QH, 1, 0, qd[l], oh);
		rg = kvq_seq_attention(sg, l, QH, 1, 0, qd[l], od[l]);
		double e = rel_diff(od[l], oh, QH * D);
		ok(rh == 0 && rg == 0 && e <= TOL, "layer %u decode attention after commit, cuda vs host: %.2e (<= %.0e)",
		   l, e, TOL);
	}

	/* decode steps: one token each, attention on every layer */
	for (uint32_t st = 0; st < STEPS; st++) {
		rh = write_tokens(sh, 0, tok, PROMPT + st, 1, dbuf);
		rg = write_tokens(sg, 1, tok, PROMPT + st, 1, dbuf);
		double worst = 0;   /* the largest difference, at layer wl */
		uint32_t wl = 0;
		for (uint32_t l = 0; l < LAYERS && !rh && !rg; l++) {
			for (size_t i = 0; i < QH * D; i++)
				q[i] = qval();
			rh = kvq_seq_attention(sh, l, QH, 1, 0, q, oh);
			rg = kvq_seq_attention(sg, l, QH, 1, 0, q, og);
			double e = rel_diff(og, oh, QH * D);
			wl = e > worst ? l : wl;
			worst = fmax(worst, e);
		}
		if (!rh && !rg) {
			rh = kvq_seq_commit(sh);
			rg = kvq_seq_commit(sg);
		}
		ok(rh == 0 && rg == 0 && worst <= TOL, "decode step %u: cuda vs host %.2e at worst, at layer %u (<= %.0e; "
		   "%d, %d: %s)", st, worst, wl, TOL, rh, rg, kvq_client_error(cg));
	}

	/* sealed bytes: the cuda pool's blocks equal the host pool's */
	{
		const int32_t *idh, *idg;
		uint32_t nh = 0, ng = 0;
		const struct kvq_layout *Lh = kvq_client_layout(ch), *Lg = kvq_client_layout(cg);
		kvq_seq_blocks(sh, &idh, &nh, NULL, NULL);
		kvq_seq_blocks(sg, &idg, &ng, NULL, NULL);
		uint32_t diff = 0, checked = 0;
		for (uint32_t b = 0; b < nh && b < ng; b++)
			for (uint32_t l = 0; l < LAYERS; l++) {
				/* a sink block (KVQ_SINK_ID): its sink slice, an open slice */
				const int cls = (uint32_t)idh[b] & KVQ_SINK_FLAG ? KVQ_SINK : KVQ_SEALED;
				size_t len = cls == KVQ_SINK ? Lh->layer[l].open_slice : Lh->layer[l].sealed_slice;
				uint8_t *buf = malloc(len);
				const uint8_t *hp = (const uint8_t *)kvq_client_base(ch) +
						    kvq_layout_off(Lh, cls, (uint32_t)idh[b] & ~KVQ_SINK_FLAG, l, 0,
								   KVQ_K_CODES);
				const uint8_t *gp = (const uint8_t *)kvq_client_base(cg) +
						    kvq_layout_off(Lg, cls, (uint32_t)idg[b] & ~KVQ_SINK_FLAG, l, 0,
								   KVQ_K_CODES);
				if (!buf || cudaMemcpy(buf, gp, len, cudaMemcpyDeviceToHost) != cudaSuccess || memcmp(buf, hp, len))
					diff++;
				checked++;
				free(buf);
			}
		ok(nh == ng && nh > 0 && !diff && !sinks == !((uint32_t)idg[0] & KVQ_SINK_FLAG),
		   "%u sealed slices%s: cuda pool bytes equal the host pool's (%u differ)", checked,
		   sinks ? " (the first a sink slice)" : "", diff);
	}

	/* a fork reads the same KV */
	{
		kvq_seq *f = NULL;
		int rf = kvq_seq_fork(sg, &f);
		for (size_t i = 0; i < QH * D; i++)
			q[i] = qval();
		rg = rf ? rf : kvq_seq_attention(sg, 1, QH, 1, 0, q, og);
		int r2 = rf ? rf : kvq_seq_attention(f, 1, QH, 1, 0, q, o2);
		ok(rf == 0 && rg == 0 && r2 == 0 && !memcmp(og, o2, QH * D * sizeof(float)),
		   "fork on the cuda pool: attention equals the parent's (%d %d %d)", rf, rg, r2);
		kvq_seq_free(f);
	}

	/* another worker finds the published prompt and reads the same blocks */
	{
		kvq_client *c2 = attach("gpu-worker-2", gpool, "cuda");
		kvq_seq *s2 = NULL;
		uint32_t hit = 0;
		int r = c2 ? kvq_seq_new(c2, NULL, 0, &s2) : -1;
		if (r == 0)
			r = kvq_seq_from_prompt(s2, tok, PROMPT, &hit);
		ok(r == 0 && hit == kvq_layout_split(kvq_client_layout(cg), PROMPT),
		   "second worker: prefix hit of %u tokens (%d)", hit, r);
		if (r == 0)
			r = write_tokens(s2, 1, tok, hit, PROMPT - hit, dbuf);
		if (r == 0)
			r = kvq_seq_commit(s2);
		int same = r == 0;
		for (uint32_t l = 0; l < LAYERS && r == 0; l++) {
			r = kvq_seq_attention(s2, l, QH, 1, 0, qd[l], o2);
			same &= r == 0 && !memcmp(o2, od[l], QH * D * sizeof(float));
		}
		ok(same, "second worker's attention over the shared blocks equals the first's, bit for bit (%d)", r);
		kvq_seq_free(s2);
		kvq_client_free(c2);
	}

	kvq_seq_free(sg);
	sg = NULL;
	{
		struct kvq_stats st;
		int r = kvq_client_stats(ch, gpool, &st);
		ok(r == 0 && st.open_used == 0, "after kvq_seq_free the cuda pool's open slots are back (%u used)",
		   st.open_used);
	}
out:
	kvq_seq_free(sh);
	kvq_seq_free(sg);
	kvq_client_free(ch);
	kvq_client_free(cg);
}

int main(void)
{
	int ndev = 0;
	uint32_t tok[NTOK];
	void *dbuf = NULL;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		printf("1..0 # SKIP no usable GPU\n");
		return 0;
	}
	tap_seed();
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 1000 + i * 7;
	for (int l = 0; l < LAYERS; l++)
		for (int p = 0; p < 2; p++)
			for (uint32_t t = 0; t < NTOK; t++) {
				float f = t % 37 == 5 ? 60.0f : 1.0f;   /* outlier tokens */
				for (size_t i = 0; i < (size_t)KVH * D; i++)
					kv[l][p][t * KVH * D + i] = kvq_f16_from_f32((float)tap_normal() * f);
			}
	pid_t d = test_daemon_start("cuda", "gseq", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				    sizeof(daemon_bin));
	if (!ok(d > 0, "kvqd started (%s)", daemon_bin))
		return done_testing();
	if (!ok(!write_codebooks(), "codebooks of %s written", POLICY)) {
		kill(d, SIGTERM);
		waitpid(d, NULL, 0);
		return done_testing();
	}
	if (cudaMalloc(&dbuf, (size_t)2 * PROMPT * KVH * D * 2) != cudaSuccess)
		return 1;
	for (sinks = 0; sinks < 2; sinks++)
		run_pools(tok, dbuf);
	cudaFree(dbuf);
	kill(d, SIGTERM);
	int st = 0;
	waitpid(d, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvqd exits 0 on SIGTERM");
	return done_testing();
}
