/* SPDX-License-Identifier: Apache-2.0 */
/* Attention timings of a client (libkvq_internal.h, struct client_timing): binned
 * per phase and format pair, reported with a Seal at most every report_ms. */
#include <string.h>
#include <time.h>

#include "format.h"
#include "libkvq_internal.h"
#include "timing_buckets.h"

int timing_phase(uint32_t n_q)
{
	return n_q == 1 ? 0 : 1;    /* kvq.proto AttentionBin.phase: decode, prefill */
}

uint64_t timing_kv_bytes(const kvq_client *c, uint32_t layer, const struct client_tables *t)
{
	const struct kvq_layer_layout *ll = &c->L->layer[layer];
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < t->nseq; i++) {
		/* a sink block among the sealed entries is an open slice read */
		const uint32_t sk = t->t[i].sink && t->ns[i] ? 1 : 0;

		bytes += (uint64_t)(t->ns[i] - sk) * ll->sealed_slice + (uint64_t)(t->no[i] + sk) * ll->open_slice;
	}
	return bytes;
}

double timing_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void timing_add(kvq_client *c, uint32_t layer, int phase, uint64_t kv_bytes, double seconds)
{
	struct client_timing *t = &c->timing;
	const struct kvq_layer_layout *ll = &c->L->layer[layer];
	struct client_timing_bin *b = NULL;

	if (!(seconds >= 0))
		return;
	for (uint32_t i = 0; i < t->n && !b; i++)
		if (t->bin[i].phase == phase && t->bin[i].kfmt == ll->kfmt && t->bin[i].vfmt == ll->vfmt)
			b = &t->bin[i];
	if (!b) {
		/* more pairs than a report holds: the calls of the rest go untimed */
		if (t->n == KVQ_PROTO_MAX_TIMING_BINS)
			return;
		b = &t->bin[t->n++];
		memset(b, 0, sizeof(*b));
		b->phase = phase;
		b->kfmt = ll->kfmt;
		b->vfmt = ll->vfmt;
	}
	b->bucket[kvq_timing_bucket(seconds)]++;
	b->seconds += seconds;
	b->kv_bytes += kv_bytes;
	t->any = true;
}

bool timing_due(kvq_client *c)
{
	struct client_timing *t = &c->timing;

	if (!t->report_ms)
		return false;
	if (c->be && c->be->timing_poll)
		c->be->timing_poll(c);
	return t->any && now_ms() - t->last_ms >= (int64_t)t->report_ms;
}

void timing_report(kvq_client *c, Kvq__AttentionReport *rep, Kvq__AttentionBin *bins, Kvq__AttentionBin **ptrs)
{
	struct client_timing *t = &c->timing;

	kvq__attention_report__init(rep);
	for (uint32_t i = 0; i < t->n; i++) {
		struct client_timing_bin *b = &t->bin[i];

		kvq__attention_bin__init(&bins[i]);
		bins[i].phase = (uint32_t)b->phase;
		bins[i].k_format = (char *)kvq_fmt_name(b->kfmt);
		bins[i].v_format = (char *)kvq_fmt_name(b->vfmt);
		bins[i].n_buckets = KVQ_TIMING_BUCKETS + 1;
		bins[i].buckets = b->bucket;
		bins[i].seconds = b->seconds;
		bins[i].kv_bytes = b->kv_bytes;
		ptrs[i] = &bins[i];
	}
	rep->n_bins = t->n;
	rep->bins = ptrs;
}

void timing_sent(kvq_client *c)
{
	c->timing.n = 0;
	c->timing.any = false;
	c->timing.last_ms = now_ms();
}
