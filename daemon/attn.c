/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's attention timing books (attn.h) and how a report enters them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "format.h"
#include "timing_buckets.h"

/* Rounding slack of a client's sum of seconds against the bucket bounds. */
#define SLACK 1e-9

static struct kvq_attn_hist *find(struct kvq_attn *a, int phase, int kfmt, int vfmt)
{
	for (uint32_t i = 0; i < a->n; i++)
		if (a->h[i].phase == phase && a->h[i].kfmt == kfmt && a->h[i].vfmt == vfmt)
			return &a->h[i];
	return NULL;
}

int kvq_attn_new(const struct kvq_layout *L, struct kvq_attn **ret)
{
	struct kvq_attn *a = calloc(1, sizeof(*a) + (size_t)KVQ_ATTN_PHASES * L->layers * sizeof(a->h[0]));

	if (!a)
		return -ENOMEM;
	for (uint32_t l = 0; l < L->layers; l++) {
		const struct kvq_layer_layout *ll = &L->layer[l];
		uint64_t region = (uint64_t)ll->n_sealed * ll->sealed_slice +
				  ((uint64_t)ll->n_open + ll->n_sink) * ll->open_slice;

		for (int ph = 0; ph < KVQ_ATTN_PHASES; ph++) {
			struct kvq_attn_hist *h = find(a, ph, ll->kfmt, ll->vfmt);

			if (!h) {
				h = &a->h[a->n++];
				h->phase = ph;
				h->kfmt = ll->kfmt;
				h->vfmt = ll->vfmt;
			}
			if (region > h->max_call_bytes)
				h->max_call_bytes = region;
		}
	}
	*ret = a;
	return 0;
}

void kvq_attn_free(struct kvq_attn *a)
{
	free(a);
}

const char *kvq_attn_phase_name(int phase)
{
	return phase == KVQ_ATTN_DECODE ? "decode" : "prefill";
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* One bin into its histogram, within *budget calls.  Returns -1 when
 * dropped, 1 when clamped, 0 when taken as sent. */
static int add_bin(struct kvq_attn *a, const Kvq__AttentionBin *b, uint64_t *budget)
{
	uint64_t take[KVQ_TIMING_BUCKETS + 1], calls = 0, bytes, max_bytes;
	struct kvq_attn_hist *h;
	double lo = 0, hi = 0, s = b->seconds;
	int kfmt, vfmt, clamped = 0;

	if (b->phase >= KVQ_ATTN_PHASES || b->n_buckets != KVQ_TIMING_BUCKETS + 1 || !b->k_format || !b->v_format)
		return -1;
	kfmt = kvq_fmt_from_name(b->k_format, strlen(b->k_format));
	vfmt = kvq_fmt_from_name(b->v_format, strlen(b->v_format));
	h = kfmt < 0 || vfmt < 0 ? NULL : find(a, (int)b->phase, kfmt, vfmt);
	if (!h)
		return -1;
	for (unsigned i = 0; i <= KVQ_TIMING_BUCKETS; i++) {
		take[i] = b->buckets[i] < *budget ? b->buckets[i] : *budget;
		clamped |= take[i] != b->buckets[i];
		*budget -= take[i];
		calls += take[i];
		/* each call lies between its bucket's bounds */
		lo += (double)take[i] * (i ? kvq_timing_le[i - 1] : 0.0);
		hi += (double)take[i] * (i < KVQ_TIMING_BUCKETS ? kvq_timing_le[i] : KVQ_TIMING_MAX_CALL_S);
	}
	if (!(s >= lo * (1 - SLACK))) {     /* NaN too */
		s = lo;
		clamped = 1;
	} else if (s > hi * (1 + SLACK)) {
		s = hi;
		clamped = 1;
	}
	max_bytes = h->max_call_bytes && calls > UINT64_MAX / h->max_call_bytes ? UINT64_MAX
										  : calls * h->max_call_bytes;
	bytes = b->kv_bytes;
	if (bytes > max_bytes) {
		bytes = max_bytes;
		clamped = 1;
	}
	for (unsigned i = 0; i <= KVQ_TIMING_BUCKETS; i++)
		h->bucket[i] = sat_add(h->bucket[i], take[i]);
	h->count = sat_add(h->count, calls);
	h->kv_bytes = sat_add(h->kv_bytes, bytes);
	h->seconds += s;
	return clamped;
}

void kvq_attn_add(struct kvq_attn *a, const Kvq__AttentionReport *r, uint64_t max_calls)
{
	uint64_t budget = max_calls;

	if (r->n_bins > KVQ_PROTO_MAX_TIMING_BINS) {
		kvq_attn_drop(a, r);
		return;
	}
	a->reports++;
	for (size_t i = 0; i < r->n_bins; i++) {
		int x = add_bin(a, r->bins[i], &budget);

		if (x < 0)
			a->bins_dropped++;
		else if (x > 0)
			a->bins_clamped++;
		else
			a->bins_taken++;
	}
}

void kvq_attn_drop(struct kvq_attn *a, const Kvq__AttentionReport *r)
{
	a->bins_dropped = sat_add(a->bins_dropped, r->n_bins);
}
