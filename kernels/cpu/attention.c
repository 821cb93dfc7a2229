/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Paged attention over KV as stored: sealed blocks are dequantized a row at a
 * time into L1 (K by token, V by dimension since sealed V is transposed), the
 * open window is read as FP16/BF16.  Query rows of one KV head (its GQA group
 * times the query tokens) are processed in tiles of TM with an online softmax
 * per block and fp32 accumulation.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "config.h"
#include "cpu.h"
#include "ops.h"

#define TM 16u
#define MAXD KVQ_MAX_HEAD_DIM
#define MAXB KVQ_MAX_BLOCK_TOKENS
#define MAXP (MAXB * MAXD / 32u)   /* most parameter entries of one head slice */

struct work {
	const struct kvq_cpu_ops *ops;
	const struct kvq_layout *L;
	const struct kvq_layer_layout *ll;
	int kkind, vkind;
	unsigned kgroup, vgroup;
	int act_fmt;
	float qf[TM * MAXD];
	float acc[TM * MAXD];
	float sc[TM * MAXB];
	float row[MAXD > MAXB ? MAXD : MAXB];
	float tmp[TM];
	float ks[MAXP], kz[MAXP], vs[MAXP], vz[MAXP];
	float mrow[TM], lsum[TM];
	uint32_t pos[TM];
};

/* K row t of a sealed head slice, dequantized into w->row. */
static void sealed_k_row(struct work *w, const uint8_t *kc, uint32_t t)
{
	uint32_t B = w->L->block_tokens, D = w->L->head_dim;

	w->ops->decode(w->ll->kfmt, kc, kvq_k_elem(t, 0, B, D), D, w->row);
	switch (w->kkind) {
	case KVQ_PARAM_TOKEN:
		w->ops->affine1(w->row, w->ks[t], 0.0f, D);
		break;
	case KVQ_PARAM_GROUP:
		for (uint32_t g0 = 0; g0 < D; g0 += w->kgroup) {
			uint32_t i = kvq_param_index(KVQ_PARAM_GROUP, w->kgroup, 0, t, g0, B, D);
			w->ops->affine1(w->row + g0, w->ks[i], w->kz[i], w->kgroup);
		}
		break;
	case KVQ_PARAM_CHANNEL:
		w->ops->affine(w->row, w->ks, w->kz, D);
		break;
	default:
		break;
	}
}

/* V values of dimension d for the block's B tokens (sealed V is transposed). */
static void sealed_v_col(struct work *w, const uint8_t *vc, uint32_t d)
{
	uint32_t B = w->L->block_tokens, D = w->L->head_dim;

	w->ops->decode(w->ll->vfmt, vc, kvq_v_elem(0, d, B, D), B, w->row);
	switch (w->vkind) {
	case KVQ_PARAM_TOKEN:
		w->ops->affine(w->row, w->vs, NULL, B);
		break;
	case KVQ_PARAM_GROUP: {
		uint32_t i = kvq_param_index(KVQ_PARAM_GROUP, w->vgroup, 1, 0, d, B, D);
		w->ops->affine(w->row, w->vs + i, w->vz + i, B);
		break;
	}
	default:
		break;
	}
}

static void store_row(int dt, void *out, size_t idx, const float *x, float inv, uint32_t D)
{
	for (uint32_t d = 0; d < D; d++) {
		float y = x[d] * inv;
		switch (dt) {
		case KVQ_DT_F16: ((uint16_t *)out)[idx + d] = kvq_f16_from_f32(y); break;
		case KVQ_DT_BF16: ((uint16_t *)out)[idx + d] = kvq_bf16_from_f32(y); break;
		default: ((float *)out)[idx + d] = y; break;
		}
	}
}

/* One tile of query rows of one (sequence, KV head). */
static void tile(struct work *w, const struct kvq_attn *a, const struct kvq_attn_seq *s, uint32_t h,
		 uint32_t r0, uint32_t mt, const void *q, void *out, size_t qrow0)
{
	const struct kvq_layout *L = w->L;
	uint32_t B = L->block_tokens, D = L->head_dim, H = L->kv_heads;
	uint32_t g = a->q_heads / H;
	uint32_t S = kvq_layout_split(L, s->n);
	const uint8_t *base = a->base;
	uint32_t last, nblk;

	for (uint32_t i = 0; i < mt; i++) {
		uint32_t r = r0 + i, qi = r / g, j = r % g;
		size_t qidx = ((qrow0 + qi) * a->q_heads + (size_t)h * g + j) * D;
		const uint8_t *qrow = (const uint8_t *)q + qidx * kvq_dtype_bytes(a->q_dtype);
		w->pos[i] = s->n - s->n_q + qi;
		for (uint32_t d = 0; d < D; d++)
			w->qf[i * D + d] = kvq_act_to_f32(a->q_dtype, qrow, d) * a->scale;
		w->mrow[i] = -INFINITY;
		w->lsum[i] = 0.0f;
	}
	memset(w->acc, 0, sizeof(float) * mt * D);
	last = w->pos[mt - 1];
	nblk = last / B + 1;

	for (uint32_t blk = 0; blk < nblk; blk++) {
		int sealed = blk * B < S;
		uint32_t ntok = sealed ? B : (s->n - blk * B < B ? s->n - blk * B : B);
		uint32_t tmax = last - blk * B + 1 < ntok ? last - blk * B + 1 : ntok;
		const uint8_t *kc, *vc;

		if (sealed) {
			uint32_t id = (uint32_t)s->sealed[blk];
			kc = base + kvq_layout_off(L, KVQ_SEALED, id, a->layer, h, KVQ_K_CODES);
			vc = base + kvq_layout_off(L, KVQ_SEALED, id, a->layer, h, KVQ_V_CODES);
			w->ops->params(base + kvq_layout_off(L, KVQ_SEALED, id, a->layer, h, KVQ_K_PARAMS), w->kkind,
				    kvq_param_count(w->kkind, w->kgroup, B, D), w->ks, w->kz);
			w->ops->params(base + kvq_layout_off(L, KVQ_SEALED, id, a->layer, h, KVQ_V_PARAMS), w->vkind,
				    kvq_param_count(w->vkind, w->vgroup, B, D), w->vs, w->vz);
		} else {
			uint32_t id = (uint32_t)s->open[blk - S / B];
			kc = base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, h, KVQ_K_CODES);
			vc = base + kvq_layout_off(L, KVQ_OPEN, id, a->layer, h, KVQ_V_CODES);
		}

		/* scores */
		for (uint32_t t = 0; t < tmax; t++) {
			if (sealed)
				sealed_k_row(w, kc, t);
			else
				w->ops->decode(w->act_fmt, kc, t * D, D, w->row);
			w->ops->dots(w->row, w->qf, D, mt, D, w->sc + t, B);
		}

		/* causal mask and online softmax; p replaces the scores */
		for (uint32_t i = 0; i < mt; i++) {
			float *sc = w->sc + i * B, bm = -INFINITY, nm, alpha;
			uint32_t valid = w->pos[i] < blk * B ? 0 : w->pos[i] - blk * B + 1;

			if (valid > tmax)
				valid = tmax;
			for (uint32_t t = 0; t < valid; t++)
				bm = fmaxf(bm, sc[t]);
			for (uint32_t t = valid; t < B; t++)
				sc[t] = 0.0f;
			if (valid == 0)
				continue;
			nm = fmaxf(w->mrow[i], bm);
			alpha = w->mrow[i] == -INFINITY ? 0.0f : expf(w->mrow[i] - nm);
			if (alpha != 1.0f) {
				for (uint32_t d = 0; d < D; d++)
					w->acc[i * D + d] *= alpha;
				w->lsum[i] *= alpha;
			}
			w->lsum[i] += w->ops->expsum(sc, nm, valid);
			w->mrow[i] = nm;
		}

		/* values */
		if (sealed) {
			for (uint32_t d = 0; d < D; d++) {
				sealed_v_col(w, vc, d);
				w->ops->dots(w->row, w->sc, B, mt, B, w->tmp, 1);
				for (uint32_t i = 0; i < mt; i++)
					w->acc[i * D + d] += w->tmp[i];
			}
		} else {
			for (uint32_t t = 0; t < tmax; t++) {
				w->ops->decode(w->act_fmt, vc, t * D, D, w->row);
				w->ops->axpys(w->row, w->sc + t, B, mt, D, w->acc, D);
			}
		}
	}

	for (uint32_t i = 0; i < mt; i++) {
		uint32_t r = r0 + i, qi = r / g, j = r % g;
		size_t oidx = ((qrow0 + qi) * a->q_heads + (size_t)h * g + j) * D;
		store_row(a->out_dtype, out, oidx, w->acc + i * D, 1.0f / w->lsum[i], D);
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
	w.ll = &L->layer[a->layer];
	w.kkind = kvq_fmt_param_kind(w.ll->kfmt, 0);
	w.vkind = kvq_fmt_param_kind(w.ll->vfmt, 1);
	w.kgroup = kvq_fmt_group(w.ll->kfmt, 0);
	w.vgroup = kvq_fmt_group(w.ll->vfmt, 1);
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
