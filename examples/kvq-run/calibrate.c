/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run calibrate: K's mean per layer, head and channel over FILE, the
 * file --k-center reads (its format: struct kc_head, run.h); or, with
 * --kv POLICY, k-means codebooks for POLICY's codebook formats (pq2, pq1)
 * over K and V as stored, the file --codebooks reads (kvq-codebook(5)).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codebook.h"
#include "run.h"

/* Lloyd iterations of each k-means (most converge well before). */
#define CB_ITERS 30u

/* K/V as stored of the layers with a codebook format, token by token (a
 * part the policy rotates, "+rot", rotated as libkvq's write does). */
struct samples {
	struct kvq_policy pol;
	uint32_t kvd, head_dim;          /* kv_heads * head_dim, head_dim */
	size_t n, cap;                   /* tokens taken, room */
	uint16_t *rows[KVQ_MAX_LAYERS][2];   /* [cap][kvd] FP16, or NULL */
};

static void take(void *arg, uint32_t layer, uint32_t n, const uint16_t *k, const uint16_t *v)
{
	struct samples *S = arg;
	size_t at = S->n;

	/* layers come in order for each chunk: the last one moves the count */
	for (int is_v = 0; is_v < 2; is_v++) {
		uint16_t *dst = S->rows[layer][is_v] ? S->rows[layer][is_v] + at * S->kvd : NULL;
		if (!dst || at + n > S->cap)
			continue;
		memcpy(dst, is_v ? v : k, (size_t)n * S->kvd * 2);
		if (!(S->pol.rot[layer] & (is_v ? KVQ_ROT_V : KVQ_ROT_K)))
			continue;
		for (size_t r = 0; r < (size_t)n * S->kvd / S->head_dim; r++) {
			float x[KVQ_MAX_HEAD_DIM];
			for (uint32_t d = 0; d < S->head_dim; d++)
				x[d] = kvq_f16_to_f32(dst[r * S->head_dim + d]);
			kvq_rotate(x, S->head_dim, kvq_rot_block(S->head_dim, is_v));
			for (uint32_t d = 0; d < S->head_dim; d++)
				dst[r * S->head_dim + d] = kvq_f16_from_f32(x[d]);
		}
	}
	if (layer + 1 == S->pol.n_layers)
		S->n = at + n <= S->cap ? at + n : S->cap;
}

/* The k-means jobs, one per (layer, K or V, head, subspace), taken by the
 * threads in turn. */
struct jobs {
	const struct samples *S;
	uint32_t H, D;
	uint16_t *data;                  /* the codebook data (codebook.h's order) */
	struct { uint32_t layer, is_v, first; } part[KVQ_MAX_LAYERS * 2];   /* with a codebook */
	uint32_t n_part, total;          /* parts, jobs */
	atomic_uint next;
	atomic_int failed;
};

static void kmeans_job(struct jobs *J, uint32_t i, float *x, float *cent)
{
	const struct samples *S = J->S;
	uint32_t p = J->n_part - 1;

	while (J->part[p].first > i)
		p--;
	uint32_t l = J->part[p].layer, is_v = J->part[p].is_v, rest = i - J->part[p].first;
	unsigned d = kvq_fmt_subdim(is_v ? S->pol.v[l] : S->pol.k[l]);
	uint32_t M = J->D / d, h = rest / M, m = rest % M;
	uint64_t base = kvq_codebook_off(&S->pol, J->H, J->D, l, (int)is_v) / 2;
	const uint16_t *rows = S->rows[l][is_v];

	for (size_t t = 0; t < S->n; t++)
		for (unsigned j = 0; j < d; j++)
			x[t * d + j] = kvq_f16_to_f32(rows[t * S->kvd + h * J->D + m * d + j]);
	if (kvq_kmeans(x, S->n, d, KVQ_CB_CENTROIDS, CB_ITERS, 0x9e3779b97f4a7c15ull ^ ((uint64_t)i << 20), cent,
		       NULL) < 0) {
		atomic_store(&J->failed, 1);
		return;
	}
	for (uint32_t c = 0; c < KVQ_CB_CENTROIDS; c++)
		for (unsigned j = 0; j < d; j++)
			J->data[base + ((size_t)(h * M + m) * KVQ_CB_CENTROIDS + c) * d + j] = kvq_f16_from_f32(
				fminf(fmaxf(cent[c * d + j], -KVQ_F16_MAX), KVQ_F16_MAX));   /* kvqd takes finite ones */
}

static void *kmeans_worker(void *arg)
{
	struct jobs *J = arg;
	/* subvectors of at most 8 values (pq1's) */
	float *x = malloc(J->S->n * 8 * sizeof(float)), *cent = malloc(KVQ_CB_CENTROIDS * 8 * sizeof(float));
	uint32_t i;

	if (!x || !cent)
		atomic_store(&J->failed, 1);
	while (x && cent && (i = atomic_fetch_add(&J->next, 1)) < J->total)
		kmeans_job(J, i, x, cent);
	free(x);
	free(cent);
	return NULL;
}

/* calibrate --kv POLICY: the codebooks of POLICY's codebook formats. */
static int calibrate_codebooks(void)
{
	const struct model_cfg *c;
	static struct samples S;
	struct kv k = { 0 };
	struct jobs J = { 0 };
	uint32_t ctx, *ids;
	uint64_t bytes;
	size_t n;
	pthread_t th[64];
	unsigned nth;
	int fd, r;

	if (o.n_kv != 1)
		die("calibrate --kv takes one policy (the pool's, naming pq2/pq1 where codebooks are wanted)");
	if (o.gpu)
		die("calibrate runs on the CPU path");
	kv_tap = take;
	kv_tap_arg = &S;
	load();
	c = model_cfg(md);
	kv_policy(o.kv[0], &S.pol);
	bytes = kvq_codebook_bytes(&S.pol, c->kv_heads, c->head_dim);
	if (!bytes)
		die("--kv %s has no codebook format (pq2, pq1): nothing to calibrate", o.kv[0]);
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > c->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	if (n < KVQ_CB_CENTROIDS)
		die("%s: %zu tokens; k-means of %u centroids needs more", o.file, n, KVQ_CB_CENTROIDS);
	S.kvd = c->kv_heads * c->head_dim;
	S.head_dim = c->head_dim;
	S.cap = n;
	for (uint32_t l = 0; l < c->layers; l++)
		for (int is_v = 0; is_v < 2; is_v++)
			if (kvq_codebook_off(&S.pol, c->kv_heads, c->head_dim, l, is_v) != UINT64_MAX &&
			    !(S.rows[l][is_v] = malloc(n * S.kvd * 2)))
				die("%s", strerror(ENOMEM));
	/* the samples come from an f16 pool: K and V as the model stores them */
	kv_open(&k, "f16", ctx, 1);
	for (size_t a = 0; a < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		kv_reset(&k);
		feed(&k, ids + a, w, NULL, NULL);
	}
	kv_close(&k);

	J.S = &S;
	J.H = c->kv_heads;
	J.D = c->head_dim;
	if (!(J.data = calloc(bytes / 2, 2)))
		die("%s", strerror(ENOMEM));
	for (uint32_t l = 0; l < c->layers; l++)
		for (uint32_t is_v = 0; is_v < 2; is_v++)
			if (S.rows[l][is_v]) {
				J.part[J.n_part].layer = l;
				J.part[J.n_part].is_v = is_v;
				J.part[J.n_part++].first = J.total;
				J.total += J.H * (J.D / kvq_fmt_subdim(is_v ? S.pol.v[l] : S.pol.k[l]));
			}
	nth = o.threads < 1 ? 1 : o.threads > 64 ? 64 : o.threads;
	for (unsigned t = 0; t < nth; t++)
		if (pthread_create(&th[t], NULL, kmeans_worker, &J) != 0)
			die("threads: %s", strerror(EAGAIN));
	for (unsigned t = 0; t < nth; t++)
		pthread_join(th[t], NULL);
	if (atomic_load(&J.failed))
		die("k-means: %s", strerror(ENOMEM));
	fd = open(o.out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		die("%s: %s", o.out, strerror(errno));
	r = kvq_codebook_write(fd, &S.pol, c->kv_heads, c->head_dim,
			       k_center ? KVQ_CB_K_CENTER : 0u, J.data, bytes);
	if (r < 0 || close(fd) != 0)
		die("%s: %s", o.out, strerror(r < 0 ? -r : errno));
	printf("%s: codebooks of %s (%llu bytes) from %zu tokens of %s%s%s\n", o.out, o.kv[0],
	       (unsigned long long)bytes, S.n, o.file, o.rotate ? ", rotated" : "", k_center ? ", K centered" : "");
	for (uint32_t l = 0; l < c->layers; l++)
		for (int is_v = 0; is_v < 2; is_v++)
			free(S.rows[l][is_v]);
	free(J.data);
	free(ids);
	return 0;
}

/* K's mean per layer, head and channel over FILE (FP16 KV, windows of
 * --ctx tokens), written to --out for --k-center. */
int cmd_calibrate(void)
{
	const struct model_cfg *c;
	struct kc_head h = { .magic = KC_MAGIC };
	struct kv k = { 0 };
	uint32_t ctx, *ids;
	size_t n, nk;
	FILE *f;

	if (!o.out)
		die("calibrate needs --out PATH");
	if (o.n_kv)
		return calibrate_codebooks();
	if (o.gpu || o.k_center)
		die("calibrate runs on the CPU path, without --k-center");
	if (o.rotate)
		die("calibrate: K means are taken of K unrotated (libkvq rotates K after centering, +rot): drop --rotate");
	want_k_sum = true;
	load();
	c = model_cfg(md);
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > c->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	kv_open(&k, "f16", ctx, 1);
	for (size_t a = 0; a < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		kv_reset(&k);
		feed(&k, ids + a, w, NULL, NULL);
	}
	nk = (size_t)c->layers * c->kv_heads * c->head_dim;
	h.layers = c->layers;
	h.kv_heads = c->kv_heads;
	h.head_dim = c->head_dim;
	h.rotate = 0;   /* K is centered before libkvq rotates it (+rot) */
	h.tokens = n;
	h.model_fp = model_fp;
	float *mean = malloc(nk * sizeof(float));
	if (!mean)
		die("%s", strerror(ENOMEM));
	for (size_t i = 0; i < nk; i++)
		mean[i] = (float)(k_sum[i] / (double)n);
	if (!(f = fopen(o.out, "wb")) || fwrite(&h, sizeof(h), 1, f) != 1 || fwrite(mean, sizeof(float), nk, f) != nk ||
	    fclose(f) != 0)
		die("%s: %s", o.out, strerror(errno));
	printf("%s: K means of %u layers x %u heads x %u channels over %zu tokens of %s%s\n", o.out, c->layers,
	       c->kv_heads, c->head_dim, n, o.file, "");
	free(mean);
	free(ids);
	kv_close(&k);
	return 0;
}
