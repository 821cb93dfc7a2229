/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the decode workload of one geometry and format: the
 * production layout for all L layers, only one layer's decode timed.  The
 * pool is mapped MAP_NORESERVE and only the timed layer's region is
 * touched, so a 30 GiB virtual pool costs about 1 GiB.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"
#include "codebook.h"
#include "policy.h"
#include "formats.h"

/* Distinct sealed blocks quantized per format; the rest of the timed layer is
 * filled with copies, since decode speed does not depend on the values and
 * the scalar quantizer would take minutes for a gigabyte of blocks. */
#define TEMPLATE_BLOCKS 32u

int fmt_fits(int fmt, uint32_t D)
{
	unsigned gk = kvq_fmt_group(fmt, 0), gv = kvq_fmt_group(fmt, 1);

	return (!gk || D % gk == 0) && (!gv || D % gv == 0);
}

static int make_layout(const struct geom *g, int fmt, int rot, uint32_t n_sealed, uint32_t n_open,
		       struct kvq_layout **ret)
{
	struct kvq_policy pol;
	struct kvq_layout_params p = {
		.layers = g->layers, .kv_heads = g->kv_heads, .head_dim = g->head_dim,
		.block_tokens = BLOCK_TOKENS, .window = 0, .n_sealed = n_sealed, .n_open = n_open,
		.act = KVQ_DT_F16, .policy = &pol,
	};
	char err[256];
	int rc;

	memset(&pol, 0, sizeof pol);
	pol.n_layers = g->layers;
	memset(pol.k, fmt, g->layers);
	memset(pol.v, fmt, g->layers);
	memset(pol.rot, rot ? KVQ_ROT_K | KVQ_ROT_V : 0, g->layers);
	rc = kvq_layout_new(&p, ret, err, sizeof err);
	if (rc < 0)
		fprintf(stderr, PROG ": layout for %s %s: %s\n", g->name, kvq_fmt_name(fmt), err);
	return rc;
}

/* Bytes of KV one decode step reads from one layer for one sequence of n
 * tokens: its sealed slices whole, and K and V rows of its open tokens. */
static double seq_bytes(const struct kvq_layout *L, uint32_t layer, uint32_t n)
{
	uint32_t S = kvq_layout_split(L, n);

	return (double)(S / L->block_tokens) * (double)L->layer[layer].sealed_slice +
	       (double)(n - S) * L->kv_heads * L->head_dim * kvq_dtype_bytes(L->act) * 2.0;
}

/* Bytes of the timed layer's region one sequence of n tokens occupies: its
 * sealed slices and its open blocks whole (workload_init writes all of them;
 * the layout is layer-major, so they are the only pages touched). */
static double seq_region_bytes(const struct kvq_layout *L, uint32_t layer, uint32_t n)
{
	uint32_t S = kvq_layout_split(L, n), B = L->block_tokens;

	return (double)(S / B) * (double)L->layer[layer].sealed_slice +
	       (double)((n - S + B - 1) / B) * (double)L->layer[layer].open_slice;
}

/* Sequence count such that the format with the fewest bytes per token still
 * reads at least the target per step; more sequences rather than longer ones,
 * so the context length stays realistic. */
int plan_geometry(const struct geom *g, const struct cfg *c, struct plan *pl)
{
	double min_b = 0.0, max_region = 0.0, max_codebooks = 0.0;

	pl->n = c->blocks_per_seq * BLOCK_TOKENS + BLOCK_TOKENS / 2;
	pl->max_step_bytes = 0.0;
	for (int f = 0; f < KVQ_FMT_COUNT; f++) {
		struct kvq_layout *L;
		double b, r;

		if (!fmt_fits(f, g->head_dim))
			continue;
		if (make_layout(g, f, 0, 1, 1, &L) < 0)
			return -1;
		b = seq_bytes(L, 0, pl->n);
		r = seq_region_bytes(L, 0, pl->n);
		if ((double)L->codebook_bytes > max_codebooks)
			max_codebooks = (double)L->codebook_bytes;
		kvq_layout_free(L);
		if (min_b == 0.0 || b < min_b)
			min_b = b;
		if (b > pl->max_step_bytes)
			pl->max_step_bytes = b;
		if (r > max_region)
			max_region = r;
	}
	pl->nseq = (uint32_t)ceil(c->ws_target / min_b);
	pl->nseq = (pl->nseq + c->threads - 1) / c->threads * c->threads;
	pl->max_step_bytes *= pl->nseq;
	pl->max_resident_bytes = max_region * pl->nseq + max_codebooks;
	return 0;
}

void decode_job(void *arg, unsigned idx, unsigned n)
{
	struct workload *w = arg;
	uint32_t a = (uint32_t)((uint64_t)w->nseq * idx / n), b = (uint32_t)((uint64_t)w->nseq * (idx + 1) / n);
	/* sequence i's query is row i of q and out (its table's row0) */
	int rc = kvq_cpu_attention(&w->attn, w->seqs + a, b - a, w->q, w->out);

	if (rc)
		__atomic_store_n(&w->err, rc, __ATOMIC_RELAXED);
}

/* K and V input of the template sequence, [m][kv_heads][head_dim] f16:
 * normal values; K gets a few outlier channels (as real K caches have) and
 * every 61st token, the first included (an attention sink), is 8x larger,
 * so per-channel KIVI scales see the outliers they would in serving. */
static void fill_input(uint16_t *k, uint16_t *v, uint32_t m, uint32_t H, uint32_t D, uint64_t *s)
{
	for (uint32_t t = 0; t < m; t++) {
		float amp = t % 61 == 0 ? 8.0f : 1.0f;
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t d = 0; d < D; d++) {
				size_t i = ((size_t)t * H + h) * D + d;
				float kb = d % 16 == 3 ? 4.0f : 0.0f;
				k[i] = kvq_f16_from_f32(amp * rng_normal(s) + kb);
				v[i] = kvq_f16_from_f32(amp * rng_normal(s));
			}
	}
}

void workload_free(struct workload *w)
{
	if (w->base)
		munmap(w->base, w->map_len);
	free(w->sealed_ids);
	free(w->open_ids);
	free(w->seqs);
	free(w->q);
	free(w->out);
	kvq_layout_free(w->L);
	memset(w, 0, sizeof *w);
}

int workload_init(struct workload *w, const struct geom *g, int fmt, int rot, const struct plan *pl)
{
	uint32_t B = BLOCK_TOKENS, H = g->kv_heads, D = g->head_dim;
	uint32_t n_sealed, n_open, nt, m, S;
	uint64_t seed = 0x6b7671ull + (uint64_t)fmt;
	struct kvq_layout *L1;
	const struct kvq_layer_layout *ll;
	struct kvq_seq_table wr;
	int32_t *topen = NULL;
	uint16_t *kin = NULL, *vin = NULL;
	size_t qlen;
	int rc;

	memset(w, 0, sizeof *w);
	w->g = g;
	w->n = pl->n;
	w->nseq = pl->nseq;
	/* the split depends on the window, which depends on the format (KIVI
	 * keeps 4 blocks open), so ask a throw-away layout */
	if (make_layout(g, fmt, rot, 1, 1, &L1) < 0)
		return -1;
	S = kvq_layout_split(L1, w->n);
	kvq_layout_free(L1);
	w->nsb = S / B;
	w->nob = (w->n - S + B - 1) / B;
	n_sealed = w->nseq * w->nsb;
	n_open = w->nseq * w->nob;
	if (make_layout(g, fmt, rot, n_sealed, n_open, &w->L) < 0)
		return -1;
	w->layer = g->layers / 2;   /* a middle layer: its region starts far into the pool */
	ll = &w->L->layer[w->layer];
	w->map_len = (size_t)w->L->total_bytes;
	w->base = map_anon(w->map_len);
	if (!w->base) {
		fprintf(stderr, PROG ": cannot map a pool of %.1f GiB: %s\n", (double)w->map_len / (1 << 30),
			strerror(errno));
		w->map_len = 0;
		goto fail;
	}

	/* a codebook format's centroids for the timed layer: normal, as the values */
	for (int is_v = 0; is_v < 2; is_v++)
		if (ll->codebook[is_v] != UINT64_MAX)
			for (size_t i = 0; i < (size_t)KVQ_CB_CENTROIDS * H * D; i++) {
				uint16_t c = kvq_f16_from_f32(rng_normal(&seed));
				memcpy(w->base + ll->codebook[is_v] + 2 * i, &c, 2);
			}

	/* paging: every sequence gets shuffled, scattered block ids */
	w->sealed_ids = malloc((size_t)n_sealed * sizeof *w->sealed_ids);
	w->open_ids = malloc((size_t)n_open * sizeof *w->open_ids);
	w->seqs = calloc(w->nseq, sizeof *w->seqs);
	qlen = (size_t)w->nseq * g->q_heads * D;
	w->q = malloc(qlen * sizeof *w->q);
	w->out = malloc(qlen * sizeof *w->out);
	if (!w->sealed_ids || !w->open_ids || !w->seqs || !w->q || !w->out)
		goto nomem;
	shuffle_ids(w->sealed_ids, n_sealed, &seed);
	shuffle_ids(w->open_ids, n_open, &seed);
	for (uint32_t i = 0; i < w->nseq; i++) {
		w->seqs[i].n = w->n;
		w->seqs[i].m = 1;
		w->seqs[i].row0 = i;
		w->seqs[i].sealed = w->sealed_ids + (size_t)i * w->nsb;
		w->seqs[i].open = w->open_ids + (size_t)i * w->nob;
	}
	for (size_t i = 0; i < qlen; i++)
		w->q[i] = rng_normal(&seed);

	/* template: the first nt sealed blocks of sequence 0 and its open
	 * window, written by the kernel from random input */
	nt = w->nsb < TEMPLATE_BLOCKS ? w->nsb : TEMPLATE_BLOCKS;
	m = nt * B + (w->n - S);
	kin = malloc((size_t)m * H * D * sizeof *kin);
	vin = malloc((size_t)m * H * D * sizeof *vin);
	topen = malloc((size_t)(nt + w->nob) * sizeof *topen);
	if (!kin || !vin || !topen)
		goto nomem;
	fill_input(kin, vin, m, H, D, &seed);
	for (uint32_t b = 0; b < nt; b++)
		topen[b] = -1;   /* straight from the input into its sealed slot */
	memcpy(topen + nt, w->open_ids, w->nob * sizeof *topen);
	wr = (struct kvq_seq_table){ .n = 0, .m = m, .sealed = w->sealed_ids, .open = topen };
	rc = kvq_cpu_write(w->L, w->base, w->layer, &wr, kin, vin);
	if (rc < 0) {
		fprintf(stderr, PROG ": kvq_cpu_write: %s\n", strerror(-rc));
		goto fail;
	}

	/* the rest of the timed layer: copies of the template slices (K codes
	 * are first in a slice, so the K_CODES offset of head 0 is its start) */
	for (uint32_t j = nt; j < n_sealed; j++)
		memcpy(w->base + kvq_layout_off(w->L, KVQ_SEALED, (uint32_t)w->sealed_ids[j], w->layer, 0,
						KVQ_K_CODES) - ll->off[KVQ_K_CODES],
		       w->base + kvq_layout_off(w->L, KVQ_SEALED, (uint32_t)w->sealed_ids[j % nt], w->layer, 0,
						KVQ_K_CODES) - ll->off[KVQ_K_CODES],
		       ll->sealed_slice);
	for (uint32_t j = w->nob; j < n_open; j++)
		memcpy(w->base + kvq_layout_off(w->L, KVQ_OPEN, (uint32_t)w->open_ids[j], w->layer, 0, KVQ_K_CODES),
		       w->base + kvq_layout_off(w->L, KVQ_OPEN, (uint32_t)w->open_ids[j % w->nob], w->layer, 0,
						KVQ_K_CODES),
		       ll->open_slice);

	w->attn = (struct kvq_attn){
		.L = w->L, .base = w->base, .layer = w->layer, .q_heads = g->q_heads,
		.scale = 1.0f / sqrtf((float)D), .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32,
	};
	w->step_bytes = seq_bytes(w->L, w->layer, w->n) * w->nseq;
	free(kin);
	free(vin);
	free(topen);
	return 0;

nomem:
	fprintf(stderr, PROG ": out of memory\n");
fail:
	free(kin);
	free(vin);
	free(topen);
	workload_free(w);
	return -1;
}

/* One untimed step that must succeed and give finite outputs: a benchmark
 * of a kernel that rejects its input would time nothing. */
int workload_check(struct workload *w)
{
	size_t qlen = (size_t)w->nseq * w->g->q_heads * w->g->head_dim;

	decode_job(w, 0, 1);
	if (w->err) {
		fprintf(stderr, PROG ": kvq_cpu_attention: %s\n", strerror(-w->err));
		return -1;
	}
	for (size_t i = 0; i < qlen; i++)
		if (!isfinite(w->out[i])) {
			fprintf(stderr, PROG ": kvq_cpu_attention gave a non-finite output\n");
			return -1;
		}
	return 0;
}
