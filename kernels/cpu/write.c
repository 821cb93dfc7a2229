/* SPDX-License-Identifier: Apache-2.0 */
/* Append into the open window and seal full blocks: one quantizer core reads
 * a block as B row pointers, so sealing an open block, sealing straight from
 * a prefill's input, or a block that mixes both give identical bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu.h"

static void put_param(uint8_t *params, uint32_t idx, int kind, uint16_t s, uint16_t z)
{
	uint16_t w[2] = { s, z };

	memcpy(params + (size_t)idx * kvq_param_entry_bytes(kind), w, kvq_param_entry_bytes(kind));
}

static uint32_t elem(int is_v, uint32_t t, uint32_t d, uint32_t B, uint32_t D)
{
	return is_v ? kvq_v_elem(t, d, B, D) : kvq_k_elem(t, d, B, D);
}

/* Quantizes B rows of D activations (K or V of one head) into codes/params;
 * cb: the head's codebooks for a codebook format (codebook.h), else NULL. */
static void seal_part(int f, int is_v, uint32_t B, uint32_t D, int act, const void *const *rows,
		      const uint16_t *cb, uint8_t *codes, uint8_t *params)
{
	int kind = kvq_fmt_param_kind(f, is_v);
	unsigned bits = kvq_fmt_bits(f), G = kvq_fmt_group(f, is_v);
	float qmax = kvq_fmt_qmax(f);

	switch (kind) {
	case KVQ_PARAM_CODEBOOK: {
		unsigned d = kvq_fmt_subdim(f);
		uint32_t M = D / d;
		float x[KVQ_MAX_HEAD_DIM];
		for (uint32_t t = 0; t < B; t++) {
			for (uint32_t i = 0; i < D; i++)
				x[i] = kvq_act_to_f32(act, rows[t], i);
			for (uint32_t m = 0; m < M; m++)
				codes[elem(is_v, t, m, B, M)] =
					(uint8_t)kvq_pq_encode(x + m * d, cb + (size_t)m * KVQ_CB_CENTROIDS * d, d);
		}
		break;
	}
	case KVQ_PARAM_NONE:
		for (uint32_t t = 0; t < B; t++)
			for (uint32_t d = 0; d < D; d++) {
				float x = kvq_act_to_f32(act, rows[t], d);
				uint16_t c = kvq_fmt_code(f) == KVQ_CODE_BF16 ? kvq_bf16_from_f32(x)
										 : kvq_f16_from_f32(x);
				kvq_code_put(codes, elem(is_v, t, d, B, D), 16, c);
			}
		break;
	case KVQ_PARAM_TOKEN:
		for (uint32_t t = 0; t < B; t++) {
			float amax = 0.0f, s;
			uint16_t sh;
			for (uint32_t d = 0; d < D; d++)
				amax = fmaxf(amax, fabsf(kvq_act_to_f32(act, rows[t], d)));
			sh = kvq_sym_scale(amax, qmax);
			put_param(params, kvq_param_index(kind, G, is_v, t, 0, B, D), kind, sh, 0);
			s = kvq_f16_to_f32(sh);
			for (uint32_t d = 0; d < D; d++)
				kvq_code_put(codes, elem(is_v, t, d, B, D), bits,
					     kvq_code_sym(f, kvq_act_to_f32(act, rows[t], d), s));
		}
		break;
	case KVQ_PARAM_GROUP:
		for (uint32_t t = 0; t < B; t++)
			for (uint32_t g0 = 0; g0 < D; g0 += G) {
				float mn = INFINITY, mx = -INFINITY, s, z;
				uint16_t sh, zh;
				for (uint32_t d = g0; d < g0 + G; d++) {
					float x = kvq_act_to_f32(act, rows[t], d);
					mn = fminf(mn, x);
					mx = fmaxf(mx, x);
				}
				kvq_asym_params(mn, mx, qmax, &sh, &zh);
				put_param(params, kvq_param_index(kind, G, is_v, t, g0, B, D), kind, sh, zh);
				s = kvq_f16_to_f32(sh);
				z = kvq_f16_to_f32(zh);
				for (uint32_t d = g0; d < g0 + G; d++)
					kvq_code_put(codes, elem(is_v, t, d, B, D), bits,
						     kvq_code_asym(kvq_act_to_f32(act, rows[t], d), s, z, qmax));
			}
		break;
	case KVQ_PARAM_CHANNEL:
		for (uint32_t d = 0; d < D; d++) {
			float mn = INFINITY, mx = -INFINITY, s, z;
			uint16_t sh, zh;
			for (uint32_t t = 0; t < B; t++) {
				float x = kvq_act_to_f32(act, rows[t], d);
				mn = fminf(mn, x);
				mx = fmaxf(mx, x);
			}
			kvq_asym_params(mn, mx, qmax, &sh, &zh);
			put_param(params, kvq_param_index(kind, G, is_v, 0, d, B, D), kind, sh, zh);
			s = kvq_f16_to_f32(sh);
			z = kvq_f16_to_f32(zh);
			for (uint32_t t = 0; t < B; t++)
				kvq_code_put(codes, elem(is_v, t, d, B, D), bits,
					     kvq_code_asym(kvq_act_to_f32(act, rows[t], d), s, z, qmax));
		}
		break;
	}
}

/* Head h's codebooks of (layer, K or V) in the pool at base, or NULL where
 * that format has none. */
static const uint16_t *codebooks(const struct kvq_layout *L, const uint8_t *base, uint32_t layer, int is_v,
				 uint32_t h)
{
	uint64_t off = L->layer[layer].codebook[is_v];

	if (off == UINT64_MAX)
		return NULL;
	return (const uint16_t *)(base + off + (uint64_t)h * KVQ_CB_CENTROIDS * L->head_dim * 2u);
}

/* Seals head h of one layer's block from row pointers into the pool at base. */
static void seal_head(const struct kvq_layout *L, uint8_t *base, uint32_t layer, uint32_t h, uint32_t sealed_id,
		      const void *const *krows, const void *const *vrows)
{
	const struct kvq_layer_layout *ll = &L->layer[layer];
	uint8_t *dst = base + kvq_layout_off(L, KVQ_SEALED, sealed_id, layer, h, KVQ_K_CODES);

	memset(dst, 0, ll->sealed_head);
	seal_part(ll->kfmt, 0, L->block_tokens, L->head_dim, L->act, krows, codebooks(L, base, layer, 0, h),
		  dst + ll->off[KVQ_K_CODES], dst + ll->off[KVQ_K_PARAMS]);
	seal_part(ll->vfmt, 1, L->block_tokens, L->head_dim, L->act, vrows, codebooks(L, base, layer, 1, h),
		  dst + ll->off[KVQ_V_CODES], dst + ll->off[KVQ_V_PARAMS]);
}

static int open_ok(const struct kvq_layout *L, int32_t id)
{
	return id >= 0 && (uint32_t)id < L->n_open;
}

int kvq_cpu_seal(const struct kvq_layout *L, void *base, uint32_t layer, uint32_t open_id, uint32_t sealed_id)
{
	const void *krows[KVQ_MAX_BLOCK_TOKENS], *vrows[KVQ_MAX_BLOCK_TOKENS];
	uint32_t B = L->block_tokens;
	size_t row = (size_t)L->head_dim * kvq_dtype_bytes(L->act);
	uint8_t *b = base;

	if (layer >= L->layers || open_id >= L->n_open || sealed_id >= L->n_sealed)
		return -EINVAL;
	for (uint32_t h = 0; h < L->kv_heads; h++) {
		const uint8_t *k = b + kvq_layout_off(L, KVQ_OPEN, open_id, layer, h, KVQ_K_CODES);
		const uint8_t *v = b + kvq_layout_off(L, KVQ_OPEN, open_id, layer, h, KVQ_V_CODES);
		for (uint32_t t = 0; t < B; t++) {
			krows[t] = k + t * row;
			vrows[t] = v + t * row;
		}
		seal_head(L, b, layer, h, sealed_id, krows, vrows);
	}
	return 0;
}

/* The m rows of H heads at in, each head's row rotated (kvq_rotate, blocks
 * of n), in a new buffer of the activation dtype; NULL when out of memory. */
static uint8_t *rotated_rows(const struct kvq_layout *L, const uint8_t *in, uint32_t m, unsigned n)
{
	const uint32_t D = L->head_dim, H = L->kv_heads;
	const size_t row = (size_t)D * kvq_dtype_bytes(L->act);
	uint8_t *out = malloc((size_t)m * H * row);
	float x[KVQ_MAX_HEAD_DIM];

	if (!out)
		return NULL;
	for (size_t r = 0; r < (size_t)m * H; r++) {
		for (uint32_t d = 0; d < D; d++)
			x[d] = kvq_act_to_f32(L->act, in + r * row, d);
		kvq_rotate(x, D, n);
		for (uint32_t d = 0; d < D; d++) {
			uint16_t c = L->act == KVQ_DT_BF16 ? kvq_bf16_from_f32(x[d]) : kvq_f16_from_f32(x[d]);
			memcpy(out + r * row + 2 * d, &c, 2);
		}
	}
	return out;
}

/* Open-class id of the slice that holds block blk of w in open format (a
 * sink slice is an open one, kvq_table_sink_open_id), s0 = S(w->n). */
static uint32_t open_of(const struct kvq_layout *L, const struct kvq_seq_table *w, uint32_t blk, uint32_t s0)
{
	if (blk == 0 && w->sink)
		return kvq_table_sink_open_id(L->n_open, w->sink);
	return (uint32_t)w->open[blk - s0 / L->block_tokens];
}

/* Copies input rows of positions from .. to - 1 (all in block blk, past the
 * n stored before the write) into open-class slice o. */
static void store_rows(const struct kvq_layout *L, uint8_t *b, uint32_t layer, uint32_t o, uint64_t from,
		       uint64_t to, uint64_t n, const uint8_t *kin, const uint8_t *vin)
{
	const uint32_t B = L->block_tokens, H = L->kv_heads;
	const size_t row = (size_t)L->head_dim * kvq_dtype_bytes(L->act);

	for (uint64_t pos = from; pos < to; pos++)
		for (uint32_t h = 0; h < H; h++) {
			size_t i = ((size_t)(pos - n) * H + h) * row;
			size_t r = (size_t)(pos % B) * row;
			memcpy(b + kvq_layout_off(L, KVQ_OPEN, o, layer, h, KVQ_K_CODES) + r, kin + i, row);
			memcpy(b + kvq_layout_off(L, KVQ_OPEN, o, layer, h, KVQ_V_CODES) + r, vin + i, row);
		}
}

int kvq_cpu_write(const struct kvq_layout *L, void *base, uint32_t layer,
		  const struct kvq_seq_table *w, const void *k, const void *v)
{
	const void *krows[KVQ_MAX_BLOCK_TOKENS], *vrows[KVQ_MAX_BLOCK_TOKENS];
	uint32_t B = L->block_tokens, H = L->kv_heads;
	size_t row = (size_t)L->head_dim * kvq_dtype_bytes(L->act);
	uint64_t n = w->n, n2 = (uint64_t)w->n + w->m;
	uint32_t s0, s1;
	uint8_t *b = base;
	const uint8_t *kin, *vin;

	if (layer >= L->layers || n2 > UINT32_MAX - B || (w->m && (!k || !v)) || (w->sink && w->sink > L->n_sink))
		return -EINVAL;
	kin = w->m ? (const uint8_t *)k + (size_t)w->row0 * H * row : NULL;
	vin = w->m ? (const uint8_t *)v + (size_t)w->row0 * H * row : NULL;
	s0 = kvq_layout_split(L, (uint32_t)n);
	s1 = kvq_layout_split(L, (uint32_t)n2);

	/* validate every id first: nothing is written on bad input (a sink
	 * block has no sealed id and no open entry) */
	for (uint32_t blk = s0 / B; blk < s1 / B; blk++)
		if (!(blk == 0 && w->sink) &&
		    (w->sealed[blk] < 0 || (uint32_t)w->sealed[blk] >= L->n_sealed ||
		     ((uint64_t)blk * B < n && !open_ok(L, w->open[blk - s0 / B]))))
			return -EINVAL;
	for (uint32_t blk = s1 / B; (uint64_t)blk * B < n2; blk++)
		if (!(blk == 0 && w->sink) && !open_ok(L, w->open[blk - s0 / B]))
			return -EINVAL;

	/* a rotated part: its rows rotated before anything is stored, so the
	 * open window and the sealed blocks hold the same basis */
	uint8_t *krot = NULL, *vrot = NULL;
	const uint32_t rot = L->layer[layer].rot;
	if (w->m && rot & KVQ_ROT_K && !(kin = krot = rotated_rows(L, kin, w->m, kvq_rot_block(L->head_dim, 0))))
		return -ENOMEM;
	if (w->m && rot & KVQ_ROT_V && !(vin = vrot = rotated_rows(L, vin, w->m, kvq_rot_block(L->head_dim, 1)))) {
		free(krot);
		return -ENOMEM;
	}

	for (uint32_t blk = s0 / B; blk < s1 / B; blk++) {
		if (blk == 0 && w->sink) {
			/* a sink block is never sealed: its new rows go to its slice */
			store_rows(L, b, layer, open_of(L, w, 0, s0), n, B, n, kin, vin);
			continue;
		}
		for (uint32_t h = 0; h < H; h++) {
			for (uint32_t r = 0; r < B; r++) {
				uint64_t pos = (uint64_t)blk * B + r;
				if (pos < n) {
					uint32_t o = open_of(L, w, blk, s0);
					krows[r] = b + kvq_layout_off(L, KVQ_OPEN, o, layer, h, KVQ_K_CODES) + r * row;
					vrows[r] = b + kvq_layout_off(L, KVQ_OPEN, o, layer, h, KVQ_V_CODES) + r * row;
				} else {
					size_t i = ((size_t)(pos - n) * H + h) * row;
					krows[r] = kin + i;
					vrows[r] = vin + i;
				}
			}
			seal_head(L, b, layer, h, (uint32_t)w->sealed[blk], krows, vrows);
		}
	}
	for (uint64_t pos = n > s1 ? n : s1; pos < n2;) {
		uint32_t blk = (uint32_t)(pos / B);
		uint64_t end = (uint64_t)(blk + 1) * B < n2 ? (uint64_t)(blk + 1) * B : n2;

		store_rows(L, b, layer, open_of(L, w, blk, s0), pos, end, n, kin, vin);
		pos = end;
	}
	free(krot);
	free(vrot);
	return 0;
}
