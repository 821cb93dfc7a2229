/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Prompts of synthetic KV through libkvq, for the integration tests that
 * fill a real kvqd's pools and compare attention over what it caches
 * (test_tier, test_restart): the including file defines the geometry
 * (L_ layers, H_ KV heads, QH_ query heads, D_, NTOK tokens a prompt at
 * most, NQ queries) before including this.
 */
#ifndef KVQ_TEST_PROMPTS_H
#define KVQ_TEST_PROMPTS_H

#include <stdint.h>

#include "synth.h"
#include "kvq.h"
#include "layout.h"

/* K and V of tok[0..m) at positions pos0.. of layer, f16, [token][head][d]. */
static void make_kv(const uint32_t *tok, uint32_t pos0, uint32_t m, uint32_t layer, uint16_t *k, uint16_t *v)
{
	for (uint32_t t = 0; t < m; t++)
		for (uint32_t h = 0; h < H_; h++)
			for (uint32_t d = 0; d < D_; d++) {
				size_t i = ((size_t)t * H_ + h) * D_ + d;

				k[i] = kvq_f16_from_f32((float)synth_kv(tok[t], pos0 + t, layer, h, d, 0));
				v[i] = kvq_f16_from_f32((float)synth_kv(tok[t], pos0 + t, layer, h, d, 1));
			}
}

/* Appends tok[from..to) in one write of every layer and commits. */
static int append(kvq_seq *s, const uint32_t *tok, uint32_t from, uint32_t to)
{
	static uint16_t k[NTOK * H_ * D_], v[NTOK * H_ * D_];
	int r = kvq_seq_begin(s, tok + from, to - from);

	for (uint32_t l = 0; r == 0 && l < L_; l++) {
		make_kv(tok + from, from, to - from, l, k, v);
		r = kvq_seq_write(s, l, k, v);
	}
	return r < 0 ? r : kvq_seq_commit(s);
}

/* Attention of the last NQ tokens of every layer, fixed queries. */
static int attend(kvq_seq *s, float (*out)[NQ * QH_ * D_])
{
	float q[NQ * QH_ * D_];

	for (uint32_t l = 0; l < L_; l++) {
		for (uint32_t i = 0; i < NQ * QH_ * D_; i++)
			q[i] = (float)synth_kv(7, i, l, 0, 0, 0);
		if (kvq_seq_attention(s, l, QH_, NQ, 0.0f, q, out[l]) < 0)
			return -1;
	}
	return 0;
}

/* A prompt of tok[NTOK] from its lookup on: its hit in *ret_hit, its
 * attention in out; the sequence freed (its blocks left published) unless
 * ret_seq takes it (on success).  A failure is told in a diag() line. */
__attribute__((unused))
static int prompt_run(kvq_client *c, const uint32_t *tok, uint32_t *ret_hit, float (*out)[NQ * QH_ * D_],
		      kvq_seq **ret_seq)
{
	uint32_t hit = 0;
	kvq_seq *s = NULL;
	int r = kvq_seq_new(c, NULL, 0, &s);

	r = r < 0 ? r : kvq_seq_from_prompt(s, tok, NTOK, &hit);
	r = r < 0 ? r : append(s, tok, hit, NTOK);
	r = r < 0 ? r : attend(s, out);
	if (r < 0)
		diag("prompt %u..: %d %s", tok[0], r, kvq_client_error(c));
	*ret_hit = hit;
	if (ret_seq && r == 0)
		*ret_seq = s;
	else
		kvq_seq_free(s);
	return r;
}

/* Figure name of c's pool (UINT64_MAX: not read). */
__attribute__((unused))
static uint64_t prompt_figure(kvq_client *c, const char *name)
{
	uint64_t v = 0;

	return kvq_client_pool_stat(c, NULL, name, &v) < 0 ? UINT64_MAX : v;
}

#endif
