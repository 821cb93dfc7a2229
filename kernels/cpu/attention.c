/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Paged attention over KV as stored: sealed blocks are dequantized on the fly
 * by the fused K-score and V-accumulate loops of the vector path (ops.h), the
 * open window is read as FP16/BF16.  Query rows of one KV head (its GQA group
 * times the query tokens) form tiles of up to TM rows, processed four at a
 * time, with an online softmax per block and fp32 accumulation.
 *
 * A rotated layer (policy "+rot") takes q into K's basis as the tile loads
 * it (rounded to the activation dtype, as the CUDA kernels take it), and its
 * output back out of V's as the tile stores it.
 *
 * Codebook formats (pq2, pq1) never decode a centroid per token: a tile
 * builds, once, a table per query row and K subspace of q . centroid for
 * all 256 codes, so a token's score is a sum of M table entries; V adds
 * each token's probability to a histogram per row and V subspace of its
 * codes, rescaled with the accumulator, and the tile's end multiplies the
 * histograms by the codebooks.
 *
 * Order of work: when each KV head's rows fit in one tile (decode, short
 * speculative steps) every block is visited once for all heads in turn, so a
 * block's slice (all heads, contiguous) streams from memory in address order;
 * the per-head tile states then live in a per-thread scratch buffer.  Longer
 * query runs (prefill) go head by head, tile by tile.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu.h"
#include "ops.h"

#define TM 16u  /* rows per tile: a multiple of 4 */
#define MAXD KVQ_MAX_HEAD_DIM
#define MAXB KVQ_MAX_BLOCK_TOKENS
#define MAXP (MAXB * MAXD / 32u)   /* most parameter entries of one head slice */
#define SCRATCH_MAX (4u << 20)     /* bytes of per-thread tile states, at most */
#define PF_AHEAD 2u  /* decode prefetches the head slice this many slices ahead */

/* The running state of one tile: up to TM query rows of one KV head. */
struct tile {
	uint32_t h, r0, mt, nq;   /* KV head, first row, rows, quads of rows */
	uint32_t last;            /* position of the tile's last query */
	float *qf;                /* [nq * 4][D] queries, pre-scaled */
	float *accT;              /* per quad: [D][4] */
	float *sc;                /* [nq * 4][B] scores, then probabilities */
	float *lut;               /* codebook K: [nq * 4][Mk][256] q . centroid */
	float *hist;              /* codebook V: [nq * 4][Mv][256] probability per code */
	float mrow[TM], lsum[TM], alpha[TM];
	uint32_t pos[TM];
};

struct work {
	const struct kvq_cpu_ops *ops;
	const struct kvq_attn *a;
	const struct kvq_layout *L;
	struct kvq_blk blk;
	int act_fmt;
	uint32_t split;   /* S(n) of the sequence being worked on */
	uint32_t mk, mv;  /* subspaces of K and V when codebook formats, else 0 */
	const uint16_t *cbk, *cbv;   /* the layer's K and V codebooks (head 0), or NULL */
	float row[MAXD];
	float ks[MAXP], kz[MAXP], vs[MAXP], vz[MAXP];
};

/* Floats of a tile's arrays for query rows of up to rows4 (a multiple of 4). */
static size_t tile_floats(const struct work *w, uint32_t rows4)
{
	return (size_t)TM * w->L->head_dim * 2 + (size_t)TM * w->L->block_tokens +
	       (size_t)rows4 * KVQ_CB_CENTROIDS * (w->mk + w->mv);
}

static void tile_bind(const struct work *w, struct tile *t, float *mem, uint32_t rows4)
{
	t->qf = mem;
	t->accT = t->qf + TM * w->L->head_dim;
	t->sc = t->accT + TM * w->L->head_dim;
	t->lut = t->sc + TM * w->L->block_tokens;
	t->hist = t->lut + (size_t)rows4 * KVQ_CB_CENTROIDS * w->mk;
}

/* Head h's codebooks from a layer's (head 0), 256 centroids of D values per head. */
static const uint16_t *head_cb(const struct work *w, const uint16_t *cb, uint32_t h)
{
	return cb + (size_t)h * KVQ_CB_CENTROIDS * w->L->head_dim;
}

/* The K tables of tile t's rows: lut[i][m][c] = q_i . centroid c of subspace m. */
static void pq_tables(const struct work *w, struct tile *t)
{
	uint32_t D = w->L->head_dim, d = D / w->mk, rows = t->nq * 4;
	const uint16_t *cb = head_cb(w, w->cbk, t->h);
	float cent[KVQ_MAX_HEAD_DIM];

	for (uint32_t m = 0; m < w->mk; m++)
		for (uint32_t c = 0; c < KVQ_CB_CENTROIDS; c++) {
			const uint16_t *e = cb + ((size_t)m * KVQ_CB_CENTROIDS + c) * d;
			for (uint32_t j = 0; j < d; j++)
				cent[j] = kvq_f16_to_f32(e[j]);
			for (uint32_t i = 0; i < rows; i++) {
				const float *q = t->qf + (size_t)i * D + m * d;
				float s = 0.0f;
				for (uint32_t j = 0; j < d; j++)
					s += q[j] * cent[j];
				t->lut[((size_t)i * w->mk + m) * KVQ_CB_CENTROIDS + c] = s;
			}
		}
}

/* Scores of a quad's rows (first row r0) for tokens < tmax of a sealed
 * block with codebook K. */
static void pq_scores(const struct work *w, const struct tile *t, uint32_t r0, const uint8_t *kc, uint32_t tmax,
		      float *sc)
{
	uint32_t M = w->mk, B = w->L->block_tokens;

	for (uint32_t r = 0; r < w->blk.rows; r++) {
		const float *lut = t->lut + (size_t)(r0 + r) * M * KVQ_CB_CENTROIDS;
		for (uint32_t tok = 0; tok < tmax; tok++) {
			const uint8_t *code = kc + (size_t)tok * M;
			float s = 0.0f;
			for (uint32_t m = 0; m < M; m++)
				s += lut[m * KVQ_CB_CENTROIDS + code[m]];
			sc[r * B + tok] = s;
		}
	}
}

/* Adds a quad's probabilities (first row r0) over the block's tokens to
 * its rows' histograms of codebook V codes. */
static void pq_hist(const struct work *w, struct tile *t, uint32_t r0, const uint8_t *vc, const float *p,
		    uint32_t tmax)
{
	uint32_t M = w->mv, B = w->L->block_tokens;

	for (uint32_t r = 0; r < w->blk.rows; r++) {
		float *hist = t->hist + (size_t)(r0 + r) * M * KVQ_CB_CENTROIDS;
		for (uint32_t tok = 0; tok < tmax; tok++) {
			float pr = p[r * B + tok];
			if (pr == 0.0f)
				continue;
			for (uint32_t m = 0; m < M; m++)
				hist[m * KVQ_CB_CENTROIDS + vc[(size_t)m * B + tok]] += pr;
		}
	}
}

/* accT += the histograms times the V codebooks, for tile t's real rows. */
static void pq_finish(const struct work *w, struct tile *t)
{
	uint32_t D = w->L->head_dim, M = w->mv, d = D / M;
	const uint16_t *cb = head_cb(w, w->cbv, t->h);

	for (uint32_t i = 0; i < t->mt; i++) {
		float *accT = t->accT + (i / 4) * D * 4;
		const float *hist = t->hist + (size_t)i * M * KVQ_CB_CENTROIDS;
		for (uint32_t m = 0; m < M; m++) {
			float o[KVQ_MAX_HEAD_DIM] = { 0 };
			for (uint32_t c = 0; c < KVQ_CB_CENTROIDS; c++) {
				float h = hist[m * KVQ_CB_CENTROIDS + c];
				if (h == 0.0f)
					continue;
				const uint16_t *e = cb + ((size_t)m * KVQ_CB_CENTROIDS + c) * d;
				for (uint32_t j = 0; j < d; j++)
					o[j] += h * kvq_f16_to_f32(e[j]);
			}
			for (uint32_t j = 0; j < d; j++)
				accT[(m * d + j) * 4 + i % 4] += o[j];
		}
	}
}

/* Per-thread scratch for the tile states of the heads-inside-blocks order,
 * kept between calls (freed when the thread exits). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static __thread float *scratch;
static __thread size_t scratch_len;

static void scratch_free(void *p)
{
	free(p);
}

static void scratch_init(void)
{
	pthread_key_create(&scratch_key, scratch_free);
}

static float *scratch_get(size_t floats)
{
	if (floats <= scratch_len)
		return scratch;
	pthread_once(&scratch_once, scratch_init);
	float *p = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
	if (!p)
		return NULL;
	free(scratch);
	scratch = p;
	scratch_len = floats;
	pthread_setspecific(scratch_key, p);
	return p;
}

/* Output row r of a quad's accumulator times inv, rotated back in blocks of
 * rot elements (0: V not rotated), into out at idx. */
static void store_row(int dt, void *out, size_t idx, const float *accT, uint32_t r, float inv, uint32_t D,
		      unsigned rot)
{
	float yr[MAXD];

	for (uint32_t d = 0; d < D; d++)
		yr[d] = accT[d * 4 + r] * inv;
	if (rot)
		kvq_rotate(yr, D, rot);
	for (uint32_t d = 0; d < D; d++) {
		float y = yr[d];
		switch (dt) {
		case KVQ_DT_F16: ((uint16_t *)out)[idx + d] = kvq_f16_from_f32(y); break;
		case KVQ_DT_BF16: ((uint16_t *)out)[idx + d] = kvq_bf16_from_f32(y); break;
		default: ((float *)out)[idx + d] = y; break;
		}
	}
}

/* Query row i of tile t: index of its first element in q and out. */
static size_t row_index(const struct kvq_attn *a, uint32_t D, uint32_t g, size_t qrow0, const struct tile *t,
			uint32_t i)
{
	uint32_t r = t->r0 + i, qi = r / g, j = r % g;

	return ((qrow0 + qi) * a->q_heads + (size_t)t->h * g + j) * D;
}

static void tile_begin(struct work *w, struct tile *t, const struct kvq_seq_table *s, const void *q, size_t qrow0)
{
	const struct kvq_attn *a = w->a;
	uint32_t D = w->L->head_dim, g = a->q_heads / w->L->kv_heads;
	uint32_t rows = t->nq * 4;

	for (uint32_t i = 0; i < rows; i++) {
		t->mrow[i] = -INFINITY;
		t->lsum[i] = 0.0f;
		t->alpha[i] = 1.0f;
		if (i >= t->mt) {
			/* padding row: zero query, its lanes dropped.  No softmax
			 * runs on it: its probabilities are its scores, 0 from the
			 * zero query or left unwritten (as here) by a three-row loop */
			memset(t->qf + i * D, 0, sizeof(float) * D);
			memset(t->sc + i * w->L->block_tokens, 0, sizeof(float) * w->L->block_tokens);
			t->pos[i] = t->pos[t->mt - 1];
			continue;
		}
		const uint8_t *qrow = (const uint8_t *)q + row_index(a, D, g, qrow0, t, i) * kvq_dtype_bytes(a->q_dtype);
		t->pos[i] = s->n - s->m + (t->r0 + i) / g;
		for (uint32_t d = 0; d < D; d++)
			t->qf[i * D + d] = kvq_act_to_f32(a->q_dtype, qrow, d);
		if (w->L->layer[a->layer].rot & KVQ_ROT_K) {
			/* q in K's basis, rounded to the dtype the CUDA kernels
			 * take it in (its own, or the pool's activation dtype for
			 * a float q), so that host and cuda pools agree */
			const int rd = a->q_dtype == KVQ_DT_F32 ? w->L->act : a->q_dtype;
			kvq_rotate(t->qf + i * D, D, kvq_rot_block(D, 0));
			for (uint32_t d = 0; d < D; d++)
				t->qf[i * D + d] = rd == KVQ_DT_BF16 ? kvq_bf16_to_f32(kvq_bf16_from_f32(t->qf[i * D + d]))
								     : kvq_f16_to_f32(kvq_f16_from_f32(t->qf[i * D + d]));
		}
		for (uint32_t d = 0; d < D; d++)
			t->qf[i * D + d] *= a->scale;
	}
	memset(t->accT, 0, sizeof(float) * rows * D);
	t->last = t->pos[t->mt - 1];
	if (w->mk)
		pq_tables(w, t);
	if (w->mv)
		memset(t->hist, 0, sizeof(float) * rows * w->mv * KVQ_CB_CENTROIDS);
}

static void tile_end(struct work *w, struct tile *t, void *out, size_t qrow0)
{
	const struct kvq_attn *a = w->a;
	uint32_t D = w->L->head_dim, g = a->q_heads / w->L->kv_heads;

	if (w->mv)
		pq_finish(w, t);
	const unsigned rot = w->L->layer[a->layer].rot & KVQ_ROT_V ? kvq_rot_block(D, 1) : 0;

	for (uint32_t i = 0; i < t->mt; i++)
		store_row(a->out_dtype, out, row_index(a, D, g, qrow0, t, i), t->accT + (i / 4) * D * 4, i % 4,
			  1.0f / t->lsum[i], D, rot);
}

/* Points w->blk at sealed slot id of (layer, head), parameters in float. */
static void load_sealed(struct work *w, uint32_t h, uint32_t id)
{
	const struct kvq_layout *L = w->L;
	const uint8_t *base = w->a->base;
	uint32_t layer = w->a->layer;
	struct kvq_blk *b = &w->blk;

	b->kc = base + kvq_layout_off(L, KVQ_SEALED, id, layer, h, KVQ_K_CODES);
	b->vc = base + kvq_layout_off(L, KVQ_SEALED, id, layer, h, KVQ_V_CODES);
	w->ops->params(base + kvq_layout_off(L, KVQ_SEALED, id, layer, h, KVQ_K_PARAMS), b->kkind,
		       kvq_param_count(b->kkind, b->kgroup, b->B, b->D), w->ks, w->kz);
	w->ops->params(base + kvq_layout_off(L, KVQ_SEALED, id, layer, h, KVQ_V_PARAMS), b->vkind,
		       kvq_param_count(b->vkind, b->vgroup, b->B, b->D), w->vs, w->vz);
}

/* Causal mask and online softmax of row i over the block's tokens; the row's
 * scores become probabilities (0 where masked, up to B). */
static void softmax_row(struct work *w, struct tile *tl, uint32_t i, uint32_t blk_start, uint32_t tmax)
{
	uint32_t B = w->L->block_tokens;
	float *sc = tl->sc + i * B, bm, nm;
	uint32_t valid = tl->pos[i] < blk_start ? 0 : tl->pos[i] - blk_start + 1;

	if (valid > tmax)
		valid = tmax;
	bm = w->ops->max(sc, valid);
	for (uint32_t t = valid; t < B; t++)
		sc[t] = 0.0f;
	tl->alpha[i] = 1.0f;
	if (valid == 0)
		return;
	nm = tl->mrow[i] > bm ? tl->mrow[i] : bm;
	if (tl->mrow[i] == -INFINITY)
		tl->alpha[i] = 0.0f;
	else   /* past the first blocks the maximum seldom moves: exp(0) = 1 */
		tl->alpha[i] = nm == tl->mrow[i] ? 1.0f : expf(tl->mrow[i] - nm);
	tl->lsum[i] = tl->lsum[i] * tl->alpha[i] + w->ops->expsum(sc, nm, valid);
	tl->mrow[i] = nm;
}

/* Real rows of quad qd of tile t (the rest are zero padding). */
static uint32_t quad_rows(const struct tile *t, uint32_t qd)
{
	return t->mt - qd * 4 < 4 ? t->mt - qd * 4 : 4;
}

/*
 * Block blk of sequence s for tile t.  next: a head slice the caller reads
 * soon (prefetched during the K and V loops), or NULL.
 */
static void tile_block(struct work *w, struct tile *t, const struct kvq_seq_table *s, uint32_t blk,
		       const uint8_t *next)
{
	const struct kvq_layout *L = w->L;
	const struct kvq_attn *a = w->a;
	uint32_t B = L->block_tokens, D = L->head_dim;
	uint32_t S = w->split;
	int sink = blk == 0 && s->sink;   /* a sink block: read as an open one */
	int sealed = !sink && blk * B < S;
	uint32_t ntok = sealed ? B : (s->n - blk * B < B ? s->n - blk * B : B);
	uint32_t tmax = t->last - blk * B + 1 < ntok ? t->last - blk * B + 1 : ntok;
	const uint8_t *kc = NULL, *vc = NULL;

	if (next) {
		/* the parameters are read first, before any code: their lines go
		 * ahead of the codes', which the K and V loops prefetch */
		const struct kvq_layer_layout *ll = &L->layer[a->layer];
		for (uint32_t o = 0; o < ll->size[KVQ_K_PARAMS]; o += 64)
			__builtin_prefetch(next + ll->off[KVQ_K_PARAMS] - ll->off[KVQ_K_CODES] + o);
		for (uint32_t o = 0; o < ll->size[KVQ_V_PARAMS]; o += 64)
			__builtin_prefetch(next + ll->off[KVQ_V_PARAMS] - ll->off[KVQ_K_CODES] + o);
	}
	if (sealed) {
		load_sealed(w, t->h, (uint32_t)s->sealed[blk]);
	} else {
		uint32_t id = sink ? kvq_table_sink_open_id(L->n_open, s->sink) : (uint32_t)s->open[blk - S / B];
		kc = (const uint8_t *)a->base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, t->h, KVQ_K_CODES);
		vc = (const uint8_t *)a->base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, t->h, KVQ_V_CODES);
	}

	/* scores */
	for (uint32_t qd = 0; qd < t->nq; qd++) {
		float *sc = t->sc + qd * 4 * B;
		const float *qf = t->qf + qd * 4 * D;
		w->blk.rows = quad_rows(t, qd);
		w->blk.next = qd == 0 ? next : NULL;   /* one prefetch per block */
		if (sealed && w->mk) {
			pq_scores(w, t, qd * 4, w->blk.kc, tmax, sc);
		} else if (sealed) {
			w->ops->k_scores4(&w->blk, qf, tmax, sc, B);
		} else {
			for (uint32_t tok = 0; tok < tmax; tok++) {
				w->ops->decode(w->act_fmt, kc, tok * D, D, w->row);
				w->ops->dots(w->row, qf, D, 4, D, sc + tok, B);
			}
		}
	}

	/* mask, online softmax (real rows only), rescale what was accumulated */
	for (uint32_t i = 0; i < t->mt; i++)
		softmax_row(w, t, i, blk * B, tmax);
	for (uint32_t qd = 0; qd < t->nq; qd++) {
		const float *al = t->alpha + qd * 4;
		if (al[0] != 1.0f || al[1] != 1.0f || al[2] != 1.0f || al[3] != 1.0f) {
			w->ops->scale4(t->accT + qd * D * 4, al, D);
			for (uint32_t r = 0; w->mv && r < 4; r++) {
				float *hist = t->hist + (size_t)(qd * 4 + r) * w->mv * KVQ_CB_CENTROIDS;
				for (uint32_t c = 0; al[r] != 1.0f && c < w->mv * KVQ_CB_CENTROIDS; c++)
					hist[c] *= al[r];
			}
		}
	}

	/* values */
	for (uint32_t qd = 0; qd < t->nq; qd++) {
		const float *p = t->sc + qd * 4 * B;
		float *accT = t->accT + qd * D * 4;
		w->blk.rows = quad_rows(t, qd);
		w->blk.next = qd == 0 ? next : NULL;
		if (sealed && w->mv) {
			pq_hist(w, t, qd * 4, w->blk.vc, p, tmax);
			continue;
		}
		if (sealed) {
			w->ops->v_accum4(&w->blk, p, B, accT);
			continue;
		}
		for (uint32_t tok = 0; tok < tmax; tok++) {
			w->ops->decode(w->act_fmt, vc, tok * D, D, w->row);
			w->ops->v_row4(w->row, p + tok, B, D, accT);
		}
	}
}

/* Address of the sealed head slice (blk, h) of s, or NULL past the sealed part. */
static const uint8_t *sealed_slice(struct work *w, const struct kvq_seq_table *s, uint32_t blk, uint32_t h)
{
	const struct kvq_layout *L = w->L;

	if (blk * L->block_tokens >= w->split || (blk == 0 && s->sink))
		return NULL;
	return (const uint8_t *)w->a->base +
	       kvq_layout_off(L, KVQ_SEALED, (uint32_t)s->sealed[blk], w->a->layer, h, KVQ_K_CODES);
}

/* One sequence whose rows per KV head fit in one tile: blocks outside,
 * heads inside.  Returns -ENOMEM when the scratch cannot be had. */
static int seq_heads_inside(struct work *w, const struct kvq_seq_table *s, uint32_t rows, const void *q,
			    void *out, size_t qrow0)
{
	const struct kvq_layout *L = w->L;
	uint32_t H = L->kv_heads, B = L->block_tokens, rows4 = (rows + 3) / 4 * 4;
	size_t tf = tile_floats(w, rows4);
	struct tile tiles[KVQ_MAX_HEADS];
	float *mem = scratch_get(tf * H);
	uint32_t nblk;

	if (!mem)
		return -ENOMEM;
	for (uint32_t h = 0; h < H; h++) {
		tiles[h].h = h;
		tiles[h].r0 = 0;
		tiles[h].mt = rows;
		tiles[h].nq = (rows + 3) / 4;
		tile_bind(w, &tiles[h], mem + tf * h, rows4);
		tile_begin(w, &tiles[h], s, q, qrow0);
	}
	nblk = tiles[0].last / B + 1;
	for (uint32_t blk = 0; blk < nblk; blk++)
		for (uint32_t h = 0; h < H; h++)
			tile_block(w, &tiles[h], s, blk,
				   sealed_slice(w, s, blk + (h + PF_AHEAD) / H, (h + PF_AHEAD) % H));
	for (uint32_t h = 0; h < H; h++)
		tile_end(w, &tiles[h], out, qrow0);
	return 0;
}

/* Any sequence: head by head, tile by tile, with one tile state on the stack
 * (in the scratch with a codebook format's tables: -ENOMEM when it cannot
 * be had). */
static int seq_tiles(struct work *w, const struct kvq_seq_table *s, uint32_t rows, const void *q, void *out,
		     size_t qrow0)
{
	const struct kvq_layout *L = w->L;
	uint32_t B = L->block_tokens;
	float stack[TM * MAXD * 2 + TM * MAXB] __attribute__((aligned(32)));
	float *mem = w->mk || w->mv ? scratch_get(tile_floats(w, TM)) : stack;
	struct tile t;

	if (!mem)
		return -ENOMEM;
	tile_bind(w, &t, mem, TM);
	for (uint32_t h = 0; h < L->kv_heads; h++)
		for (uint32_t r0 = 0; r0 < rows; r0 += TM) {
			t.h = h;
			t.r0 = r0;
			t.mt = rows - r0 < TM ? rows - r0 : TM;
			t.nq = (t.mt + 3) / 4;
			tile_begin(w, &t, s, q, qrow0);
			for (uint32_t blk = 0; blk <= t.last / B; blk++)
				tile_block(w, &t, s, blk, sealed_slice(w, s, blk + 1, h));
			tile_end(w, &t, out, qrow0);
		}
	return 0;
}

static int ids_ok(const int32_t *ids, uint32_t count, uint32_t limit)
{
	for (uint32_t i = 0; i < count; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= limit)
			return 0;
	return 1;
}

int kvq_cpu_attention(const struct kvq_attn *a, const struct kvq_seq_table *seqs, uint32_t nseq,
		      const void *q, void *out)
{
	struct work w;
	const struct kvq_layout *L = a->L;

	if (!L || a->layer >= L->layers || a->q_heads == 0 || a->q_heads % L->kv_heads ||
	    a->q_heads / L->kv_heads > 64 || a->q_dtype < KVQ_DT_F16 || a->q_dtype > KVQ_DT_F32 ||
	    a->out_dtype < KVQ_DT_F16 || a->out_dtype > KVQ_DT_F32)
		return -EINVAL;
	for (uint32_t i = 0; i < nseq; i++) {
		const struct kvq_seq_table *s = &seqs[i];
		uint32_t S, B = L->block_tokens;
		if (s->n == 0 || s->m == 0 || s->m > s->n || s->n > UINT32_MAX - B)
			return -EINVAL;
		S = kvq_layout_split(L, s->n);
		/* a sink block has neither a sealed nor an open entry */
		uint32_t sk = s->sink && S ? 1 : 0, ok = s->sink && !S ? 1 : 0;
		if (s->sink > L->n_sink || !ids_ok(s->sealed + sk, S / B - sk, L->n_sealed) ||
		    !ids_ok(s->open + ok, (s->n - S + B - 1) / B - ok, L->n_open))
			return -EINVAL;
	}

	w.ops = kvq_cpu_ops();
	w.a = a;
	w.L = L;
	w.blk.kfmt = L->layer[a->layer].kfmt;
	w.blk.vfmt = L->layer[a->layer].vfmt;
	w.blk.kkind = kvq_fmt_param_kind(w.blk.kfmt, 0);
	w.blk.vkind = kvq_fmt_param_kind(w.blk.vfmt, 1);
	w.blk.kgroup = kvq_fmt_group(w.blk.kfmt, 0);
	w.blk.vgroup = kvq_fmt_group(w.blk.vfmt, 1);
	w.blk.B = L->block_tokens;
	w.blk.D = L->head_dim;
	w.blk.ks = w.ks;
	w.blk.kz = w.kz;
	w.blk.vs = w.vs;
	w.blk.vz = w.vz;
	w.blk.next = NULL;
	w.blk.rows = 4;
	w.blk.next_bytes = L->layer[a->layer].sealed_head;
	w.act_fmt = kvq_act_fmt(L->act);
	w.mk = w.blk.kkind == KVQ_PARAM_CODEBOOK ? L->head_dim / kvq_fmt_subdim(w.blk.kfmt) : 0;
	w.mv = w.blk.vkind == KVQ_PARAM_CODEBOOK ? L->head_dim / kvq_fmt_subdim(w.blk.vfmt) : 0;
	w.cbk = w.mk ? (const uint16_t *)((const uint8_t *)a->base + L->layer[a->layer].codebook[0]) : NULL;
	w.cbv = w.mv ? (const uint16_t *)((const uint8_t *)a->base + L->layer[a->layer].codebook[1]) : NULL;

	for (uint32_t i = 0; i < nseq; i++) {
		const struct kvq_seq_table *s = &seqs[i];
		uint32_t rows = s->m * (a->q_heads / L->kv_heads);
		size_t need = tile_floats(&w, (rows + 3) / 4 * 4) * L->kv_heads * sizeof(float);
		w.split = kvq_layout_split(L, s->n);
		if ((rows > TM || need > SCRATCH_MAX || seq_heads_inside(&w, s, rows, q, out, s->row0) < 0) &&
		    seq_tiles(&w, s, rows, q, out, s->row0) < 0)
			return -ENOMEM;
	}
	return 0;
}
