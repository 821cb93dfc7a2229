/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "layout.h"
#include "seterr.h"

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

uint32_t kvq_layout_default_window(const struct kvq_policy *p, uint32_t block_tokens)
{
	return kvq_policy_uses_kivi(p) ? 4 * block_tokens : block_tokens;
}

uint64_t kvq_codebook_off(const struct kvq_policy *p, uint32_t H, uint32_t D, uint32_t layer, int is_v)
{
	uint64_t off = 0;

	if (!kvq_policy_subdim(p, layer, is_v))
		return UINT64_MAX;
	for (uint32_t l = 0; l <= layer; l++)
		for (int v = 0; v < 2 && (l < layer || v < is_v); v++)
			off += kvq_policy_subdim(p, l, v) ? kvq_codebook_part(H, D) : 0;
	return off;
}

uint64_t kvq_codebook_bytes(const struct kvq_policy *p, uint32_t H, uint32_t D)
{
	uint64_t n = 0;

	for (uint32_t l = 0; l < p->n_layers && l < KVQ_MAX_LAYERS; l++)
		for (int v = 0; v < 2; v++)
			n += kvq_policy_subdim(p, l, v) ? kvq_codebook_part(H, D) : 0;
	return n;
}

static int check_fmt(int f, int is_v, uint32_t D, uint32_t layer, char *err, size_t errlen)
{
	unsigned g = kvq_fmt_group(f, is_v);

	if (f < 0 || f >= KVQ_FMT_COUNT) {
		kvq_seterr(err, errlen, "layer %u: invalid format %d", layer, f);
		return -EINVAL;
	}
	if (D % kvq_fmt_subdim(f)) {
		kvq_seterr(err, errlen, "layer %u: %s needs a head dim that is a multiple of %u, not %u",
		       layer, kvq_fmt_name(f), kvq_fmt_subdim(f), D);
		return -EINVAL;
	}
	if (g && D % g) {
		kvq_seterr(err, errlen, "layer %u: %s needs a head dim that is a multiple of %u, not %u",
		       layer, kvq_fmt_name(f), g, D);
		return -EINVAL;
	}
	return 0;
}

int kvq_layout_new(const struct kvq_layout_params *p, struct kvq_layout **ret, char *err, size_t errlen)
{
	uint32_t B = p->block_tokens, D = p->head_dim, H = p->kv_heads;
	struct kvq_layout *L;
	uint64_t pos = 0;

	if (!p->policy) {
		kvq_seterr(err, errlen, "no policy");
		return -EINVAL;
	}
	if (p->layers == 0 || p->layers > KVQ_MAX_LAYERS || p->policy->n_layers != p->layers) {
		kvq_seterr(err, errlen, "layers %u out of range 1-%u or different from the policy's %u",
		       p->layers, KVQ_MAX_LAYERS, p->policy->n_layers);
		return -EINVAL;
	}
	if (H == 0 || H > KVQ_MAX_HEADS) {
		kvq_seterr(err, errlen, "KV heads %u out of range 1-%u", H, KVQ_MAX_HEADS);
		return -EINVAL;
	}
	if (D < 32 || D > KVQ_MAX_HEAD_DIM || D % 32) {
		kvq_seterr(err, errlen, "head dim %u is not a multiple of 32 in 32-%u", D, KVQ_MAX_HEAD_DIM);
		return -EINVAL;
	}
	if (B < 16 || B > KVQ_MAX_BLOCK_TOKENS || B % 16) {
		kvq_seterr(err, errlen, "tokens per block %u is not a multiple of 16 in 16-%u", B,
		       KVQ_MAX_BLOCK_TOKENS);
		return -EINVAL;
	}
	if (p->act != KVQ_DT_F16 && p->act != KVQ_DT_BF16) {
		kvq_seterr(err, errlen, "open window dtype must be f16 or bf16");
		return -EINVAL;
	}
	if (p->n_sealed > KVQ_MAX_SLOTS || p->n_open > KVQ_MAX_SLOTS || p->n_sink > KVQ_MAX_SLOTS) {
		kvq_seterr(err, errlen, "slot counts %u/%u/%u exceed %u", p->n_sealed, p->n_open, p->n_sink,
			   KVQ_MAX_SLOTS);
		return -EINVAL;
	}
	if (p->sink_blocks > 1 || !p->sink_blocks != !p->n_sink) {
		kvq_seterr(err, errlen, p->sink_blocks > 1 ? "sink_blocks %u is not 0 or 1 (%u sink slots)"
			   : "sink_blocks %u with %u sink slots: sink blocks need sink slots, and only they",
			   p->sink_blocks, p->n_sink);
		return -EINVAL;
	}
	for (uint32_t l = 0; l < p->layers; l++)
		if (check_fmt(p->policy->k[l], 0, D, l, err, errlen) < 0 ||
		    check_fmt(p->policy->v[l], 1, D, l, err, errlen) < 0)
			return -EINVAL;

	L = calloc(1, sizeof *L + p->layers * sizeof L->layer[0]);
	if (!L) {
		kvq_seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	L->version = KVQ_LAYOUT_VERSION;
	L->layers = p->layers;
	L->kv_heads = H;
	L->head_dim = D;
	L->block_tokens = B;
	L->window = p->window ? p->window : kvq_layout_default_window(p->policy, B);
	L->n_sealed = p->n_sealed;
	L->n_open = p->n_open;
	L->sink_blocks = p->sink_blocks;
	L->n_sink = p->n_sink;
	L->act = p->act;
	if (L->window % B || L->window > 64 * B) {
		kvq_seterr(err, errlen, "open window %u is not a multiple of the block (%u tokens) up to 64 blocks",
		       L->window, B);
		free(L);
		return -EINVAL;
	}

	for (uint32_t l = 0; l < p->layers; l++) {
		struct kvq_layer_layout *ll = &L->layer[l];
		uint64_t sealed_bytes, open_bytes;
		uint32_t o = 0;

		ll->kfmt = p->policy->k[l];
		ll->vfmt = p->policy->v[l];
		ll->rot = p->policy->rot[l];
		for (int fld = 0; fld < KVQ_NFIELDS; fld++) {
			int is_v = fld >= KVQ_V_CODES;
			int f = is_v ? ll->vfmt : ll->kfmt;
			int kind = kvq_fmt_param_kind(f, is_v);
			uint32_t sz;

			if (fld == KVQ_K_CODES || fld == KVQ_V_CODES)
				sz = B * (D / kvq_fmt_subdim(f)) * kvq_fmt_bits(f) / 8u;
			else
				sz = kvq_param_count(kind, kvq_fmt_group(f, is_v), B, D) * kvq_param_entry_bytes(kind);
			ll->off[fld] = o;
			ll->size[fld] = sz;
			o += (uint32_t)align_up(sz, 16);
		}
		ll->sealed_head = o;
		ll->open_head = 2u * B * D * kvq_dtype_bytes(p->act);
		ll->sealed_slice = (uint64_t)H * ll->sealed_head;
		ll->open_slice = (uint64_t)H * ll->open_head;
		ll->region = pos;
		ll->B = B;
		ll->D = D;
		ll->H = H;
		ll->window = L->window;
		ll->n_sealed = p->n_sealed;
		ll->n_open = p->n_open;
		ll->n_sink = p->n_sink;
		ll->act = p->act;
		if (__builtin_mul_overflow((uint64_t)p->n_sealed, ll->sealed_slice, &sealed_bytes) ||
		    __builtin_mul_overflow((uint64_t)p->n_open + p->n_sink, ll->open_slice, &open_bytes) ||
		    __builtin_add_overflow(pos, sealed_bytes, &ll->open_base) ||
		    __builtin_add_overflow(ll->open_base, open_bytes, &pos) || pos > UINT64_MAX - 255) {
			kvq_seterr(err, errlen, "pool of %u layers x (%u sealed + %u open + %u sink slots) exceeds 2^64 bytes",
			       p->layers, p->n_sealed, p->n_open, p->n_sink);
			free(L);
			return -EINVAL;
		}
		pos = align_up(pos, 256);
		L->sealed_block_bytes += ll->sealed_slice;
		L->open_block_bytes += ll->open_slice;
	}
	L->codebook_off = pos;
	L->codebook_bytes = kvq_codebook_bytes(p->policy, H, D);
	for (uint32_t l = 0; l < p->layers; l++)
		for (int is_v = 0; is_v < 2; is_v++) {
			uint64_t o = kvq_codebook_off(p->policy, H, D, l, is_v);
			L->layer[l].codebook[is_v] = o == UINT64_MAX ? UINT64_MAX : pos + o;
		}
	if (pos > UINT64_MAX - 255 - L->codebook_bytes) {
		kvq_seterr(err, errlen, "pool of %u layers with %llu bytes of codebooks exceeds 2^64 bytes",
			   p->layers, (unsigned long long)L->codebook_bytes);
		free(L);
		return -EINVAL;
	}
	pos = align_up(pos + L->codebook_bytes, 256);
	L->total_bytes = pos;
	*ret = L;
	return 0;
}

void kvq_layout_free(struct kvq_layout *L)
{
	free(L);
}
