/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Paged attention over KV as stored: sealed blocks are dequantized on the fly
 * by the fused K-score and V-accumulate loops of the vector path (ops.h), the
 * open window is read as FP16/BF16.  Query rows of one KV head (its GQA group
 * times the query tokens) are processed in tiles of up to TM rows, four at a
 * time, with an online softmax per block and fp32 accumulation.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "config.h"
#include "cpu.h"
#include "ops.h"

#define TM 8u    /* rows per tile: a multiple of 4 */
#define MAXD KVQ_MAX_HEAD_DIM
#define MAXB KVQ_MAX_BLOCK_TOKENS
#define MAXP (MAXB * MAXD / 32u)   /* most parameter entries of one head slice */

struct work {
	const struct kvq_cpu_ops *ops;
	const struct kvq_layout *L;
	struct kvq_blk blk;
	int act_fmt;
	float qf[TM * MAXD];
	float accT[TM * MAXD];   /* per quad of rows: [d][4] */
	float acc8[TM * MAXD * 8];   /* per quad: [d][4][8] lane-wise partial sums of sealed V */
	float sc[TM * MAXB];     /* scores, then probabilities: [row][token] */
	float row[MAXD];
	float ks[MAXP], kz[MAXP], vs[MAXP], vz[MAXP];
	float mrow[TM], lsum[TM], alpha[TM];
	uint32_t pos[TM];
};

static void store_row(int dt, void *out, size_t idx, const float *accT, uint32_t r, float inv, uint32_t D)
{
	for (uint32_t d = 0; d < D; d++) {
		float y = accT[d * 4 + r] * inv;
		switch (dt) {
		case KVQ_DT_F16: ((uint16_t *)out)[idx + d] = kvq_f16_from_f32(y); break;
		case KVQ_DT_BF16: ((uint16_t *)out)[idx + d] = kvq_bf16_from_f32(y); break;
		default: ((float *)out)[idx + d] = y; break;
		}
	}
}

/* Points w->blk at sealed slot id of (layer, head), parameters in float. */
static void load_sealed(struct work *w, const uint8_t *base, uint32_t layer, uint32_t h, uint32_t id)
{
	const struct kvq_layout *L = w->L;
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
static void softmax_row(struct work *w, uint32_t i, uint32_t blk_start, uint32_t tmax)
{
	uint32_t B = w->L->block_tokens;
	float *sc = w->sc + i * B, bm = -INFINITY, nm;
	uint32_t valid = w->pos[i] < blk_start ? 0 : w->pos[i] - blk_start + 1;

	if (valid > tmax)
		valid = tmax;
	for (uint32_t t = 0; t < valid; t++)
		bm = sc[t] > bm ? sc[t] : bm;
	for (uint32_t t = valid; t < B; t++)
		sc[t] = 0.0f;
	w->alpha[i] = 1.0f;
	if (valid == 0)
		return;
	nm = w->mrow[i] > bm ? w->mrow[i] : bm;
	w->alpha[i] = w->mrow[i] == -INFINITY ? 0.0f : expf(w->mrow[i] - nm);
	w->lsum[i] = w->lsum[i] * w->alpha[i] + w->ops->expsum(sc, nm, valid);
	w->mrow[i] = nm;
}

/* One tile of query rows of one (sequence, KV head). */
static void tile(struct work *w, const struct kvq_attn *a, const struct kvq_attn_seq *s, uint32_t h,
		 uint32_t r0, uint32_t mt, const void *q, void *out, size_t qrow0)
{
	const struct kvq_layout *L = w->L;
	uint32_t B = L->block_tokens, D = L->head_dim, H = L->kv_heads;
	uint32_t g = a->q_heads / H;
	uint32_t S = kvq_layout_split(L, s->n);
	uint32_t nq = (mt + 3) / 4, rows = nq * 4;   /* rows padded to whole quads */
	const uint8_t *base = a->base;
	uint32_t last, nblk;

	for (uint32_t i = 0; i < rows; i++) {
		w->mrow[i] = -INFINITY;
		w->lsum[i] = 0.0f;
		if (i >= mt) {   /* padding row: zero query, results dropped */
			memset(w->qf + i * D, 0, sizeof(float) * D);
			w->pos[i] = w->pos[mt - 1];
			continue;
		}
		uint32_t r = r0 + i, qi = r / g, j = r % g;
		size_t qidx = ((qrow0 + qi) * a->q_heads + (size_t)h * g + j) * D;
		const uint8_t *qrow = (const uint8_t *)q + qidx * kvq_dtype_bytes(a->q_dtype);
		w->pos[i] = s->n - s->n_q + qi;
		for (uint32_t d = 0; d < D; d++)
			w->qf[i * D + d] = kvq_act_to_f32(a->q_dtype, qrow, d) * a->scale;
	}
	memset(w->accT, 0, sizeof(float) * rows * D);
	memset(w->acc8, 0, sizeof(float) * rows * D * 8);
	last = w->pos[mt - 1];
	nblk = last / B + 1;

	for (uint32_t blk = 0; blk < nblk; blk++) {
		int sealed = blk * B < S;
		uint32_t ntok = sealed ? B : (s->n - blk * B < B ? s->n - blk * B : B);
		uint32_t tmax = last - blk * B + 1 < ntok ? last - blk * B + 1 : ntok;
		const uint8_t *kc = NULL, *vc = NULL, *next = NULL;

		if (sealed) {
			load_sealed(w, base, a->layer, h, (uint32_t)s->sealed[blk]);
			/* a head slice is a few KB at a paged, unpredictable address:
			 * the kernels fetch the next one while this one is computed */
			next = (blk + 1) * B < S ?
				base + kvq_layout_off(L, KVQ_SEALED, (uint32_t)s->sealed[blk + 1], a->layer, h,
						      KVQ_K_CODES) : NULL;
		} else {
			uint32_t id = (uint32_t)s->open[blk - S / B];
			kc = base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, h, KVQ_K_CODES);
			vc = base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, h, KVQ_V_CODES);
		}

		/* scores */
		for (uint32_t qd = 0; qd < nq; qd++) {
			float *sc = w->sc + qd * 4 * B;
			const float *qf = w->qf + qd * 4 * D;
			if (sealed) {
				w->blk.next = qd == 0 ? next : NULL;   /* one prefetch per block */
				w->ops->k_scores4(&w->blk, qf, tmax, sc, B);
			} else {
				for (uint32_t t = 0; t < tmax; t++) {
					w->ops->decode(w->act_fmt, kc, t * D, D, w->row);
					w->ops->dots(w->row, qf, D, 4, D, sc + t, B);
				}
			}
		}

		/* mask, online softmax, rescale what was accumulated */
		for (uint32_t i = 0; i < rows; i++)
			softmax_row(w, i, blk * B, tmax);
		for (uint32_t qd = 0; qd < nq; qd++) {
			const float *al = w->alpha + qd * 4;
			if (al[0] == 1.0f && al[1] == 1.0f && al[2] == 1.0f && al[3] == 1.0f)
				continue;
			w->ops->scale4(w->accT + qd * D * 4, w->acc8 + qd * D * 32, al, D);
		}

		/* values */
		for (uint32_t qd = 0; qd < nq; qd++) {
			const float *p = w->sc + qd * 4 * B;
			float *accT = w->accT + qd * D * 4;
			if (sealed) {
				w->ops->v_accum4(&w->blk, p, B, w->acc8 + qd * D * 32, accT);
				continue;
			}
			for (uint32_t t = 0; t < tmax; t++) {
				w->ops->decode(w->act_fmt, vc, t * D, D, w->row);
				w->ops->v_row4(w->row, p + t, B, D, accT);
			}
		}
	}

	for (uint32_t qd = 0; qd < nq; qd++)
		w->ops->reduce8(w->acc8 + qd * D * 32, w->accT + qd * D * 4, D);
	for (uint32_t i = 0; i < mt; i++) {
		uint32_t r = r0 + i, qi = r / g, j = r % g;
		size_t oidx = ((qrow0 + qi) * a->q_heads + (size_t)h * g + j) * D;
		store_row(a->out_dtype, out, oidx, w->accT + (i / 4) * D * 4, i % 4, 1.0f / w->lsum[i], D);
	}
}

static int ids_ok(const int32_t *ids, uint32_t count, uint32_t limit)
{
	for (uint32_t i = 0; i < count; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= limit)
			return 0;
	return 1;
}

int kvq_cpu_attention(const struct kvq_attn *a, const struct kvq_attn_seq *seqs, uint32_t nseq,
		      const void *q, void *out)
{
	struct work w;
	const struct kvq_layout *L = a->L;
	size_t qrow0 = 0;

	if (!L || a->layer >= L->layers || a->q_heads == 0 || a->q_heads % L->kv_heads ||
	    a->q_heads / L->kv_heads > 64 || a->q_dtype < KVQ_DT_F16 || a->q_dtype > KVQ_DT_F32 ||
	    a->out_dtype < KVQ_DT_F16 || a->out_dtype > KVQ_DT_F32)
		return -EINVAL;
	for (uint32_t i = 0; i < nseq; i++) {
		const struct kvq_attn_seq *s = &seqs[i];
		uint32_t S, B = L->block_tokens;
		if (s->n == 0 || s->n_q == 0 || s->n_q > s->n || s->n > UINT32_MAX - B)
			return -EINVAL;
		S = kvq_layout_split(L, s->n);
		if (!ids_ok(s->sealed, S / B, L->n_sealed) ||
		    !ids_ok(s->open, (s->n - S + B - 1) / B, L->n_open))
			return -EINVAL;
	}

	w.ops = kvq_cpu_ops();
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
	w.blk.next_bytes = L->layer[a->layer].sealed_head;
	w.act_fmt = L->act == KVQ_DT_BF16 ? KVQ_FMT_BF16 : KVQ_FMT_F16;

	for (uint32_t i = 0; i < nseq; i++) {
		const struct kvq_attn_seq *s = &seqs[i];
		uint32_t rows = s->n_q * (a->q_heads / L->kv_heads);
		for (uint32_t h = 0; h < L->kv_heads; h++)
			for (uint32_t r0 = 0; r0 < rows; r0 += TM)
				tile(&w, a, s, h, r0, rows - r0 < TM ? rows - r0 : TM, q, out, qrow0);
		qrow0 += s->n_q;
	}
	return 0;
}
