/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run generate's steps: the run's sequences as one batch, as a serving
 * engine runs them.  Each step takes every decoding sequence's one token,
 * then prompt chunks while they fit the step's rows, so one sequence's
 * prefill and the others' decode share a step where they meet;
 * model_step_greedy runs the step (one matrix of all rows per product, one
 * kvq_batch call per layer) and returns each sequence's greedy token.  A
 * sequence's chunks end where feed() ends them alone (chunk_len), so it
 * computes what it computes alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"
#include "layout.h"

/* The step's plan: its model rows and, for each, the run's sequence. */
struct plan {
	struct model_seq *ms;
	uint32_t *who;
	uint32_t n, rows;
	int kind;
};

static void print_token(uint32_t id)
{
	char buf[256];

	tok_decode(tk, id, buf, sizeof(buf));
	fputs(buf, stdout);
	fflush(stdout);
}

/* Every decoding sequence's token, then the prompt chunks that fit. */
static void plan_step(struct gen_seq *seq, uint32_t n, uint32_t budget, struct plan *p)
{
	uint32_t dec = 0, pre = 0;

	p->n = p->rows = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (seq[i].done || seq[i].fed < seq[i].n)
			continue;
		p->ms[p->n] = (struct model_seq){ seq[i].s, &seq[i].next, 1, 1 };
		p->who[p->n++] = i;
		p->rows++;
		dec++;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct gen_seq *q = &seq[i];
		uint32_t m;

		if (q->done || q->fed == q->n)
			continue;
		m = chunk_len(q->fed, q->n - q->fed);
		if (p->rows + m > budget)
			continue;   /* a chunk is never cut: its end decides what its queries see */
		p->ms[p->n] = (struct model_seq){ q->s, q->ids + q->fed, m, q->fed + m == q->n && o.max_tokens ? 1 : 0 };
		p->who[p->n++] = i;
		p->rows += m;
		pre++;
	}
	p->kind = dec && pre ? GEN_MIXED : dec ? GEN_DECODE : GEN_PREFILL;
}

/* The step's results: prompts advanced, the greedy token of every row
 * that asked for one.  Returns the prompts this step finished. */
static uint32_t take_step(struct gen_seq *seq, const struct plan *p, const uint32_t *ids, int stop, bool print)
{
	uint32_t row = 0, prefilled = 0;

	for (uint32_t e = 0; e < p->n; e++) {
		struct gen_seq *q = &seq[p->who[e]];
		uint32_t t;

		if (q->fed < q->n) {
			q->fed += p->ms[e].n;
			prefilled += q->fed == q->n;
		}
		if (!p->ms[e].n_out) {
			q->done = q->fed == q->n;   /* --max-tokens 0 */
			continue;
		}
		t = ids[row++];
		if (!o.ignore_eos && stops(t, stop)) {
			q->done = true;
			continue;
		}
		q->out[q->g++] = t;
		q->next = t;
		q->done = q->g == o.max_tokens;
		if (print)
			print_token(t);
	}
	return prefilled;
}

/* Marks the blocks of s in the bitmaps (sealed ids, sink ids) and counts
 * the bytes of those not marked before: a block shared by sequences (a
 * cached prefix) is resident once. */
static uint64_t seq_bytes(const struct kvq_layout *L, const kvq_seq *s, uint8_t *sealed_seen, uint8_t *sink_seen)
{
	const int32_t *sealed, *open;
	uint32_t ns, no;
	uint64_t bytes = 0;

	kvq_seq_blocks(s, &sealed, &ns, &open, &no);
	for (uint32_t i = 0; i < ns + no; i++) {
		uint32_t id = (uint32_t)(i < ns ? sealed[i] : open[i - ns]), j = id & ~KVQ_SINK_FLAG;
		bool sink = id & KVQ_SINK_FLAG;
		uint8_t *seen = sink ? sink_seen : sealed_seen;

		if (i >= ns && !sink) {   /* an open slot is its sequence's own */
			bytes += L->open_block_bytes;
			continue;
		}
		if (seen[j / 8] & (1u << (j % 8)))
			continue;
		seen[j / 8] |= (uint8_t)(1u << (j % 8));
		bytes += sink ? L->open_block_bytes : L->sealed_block_bytes;
	}
	return bytes;
}

/* The bytes and tokens the live sequences hold, the peak kept in f. */
static void kv_resident(const struct kv *k, const struct gen_seq *seq, uint32_t n, struct gen_figs *f)
{
	const struct kvq_layout *L = kvq_client_layout(k->c);
	uint8_t *sealed_seen = calloc(L->n_sealed / 8 + 1, 1), *sink_seen = calloc(L->n_sink / 8 + 1, 1);
	uint64_t bytes = 0, tokens = 0;

	if (!sealed_seen || !sink_seen)
		die("%s", strerror(ENOMEM));
	for (uint32_t i = 0; i < n; i++) {
		if (!seq[i].s)
			continue;
		bytes += seq_bytes(L, seq[i].s, sealed_seen, sink_seen);
		tokens += kvq_seq_tokens(seq[i].s);
	}
	if (bytes > f->kv_peak) {
		f->kv_peak = bytes;
		f->kv_peak_tokens = tokens;
	}
	free(sealed_seen);
	free(sink_seen);
}

static void count_step(const struct plan *p, struct gen_figs *f)
{
	const struct model_times *t = model_times(md);
	struct model_times *s = &f->t[p->kind];

	f->steps[p->kind]++;
	f->rows[p->kind] += p->rows;
	s->step += t->step;
	s->write += t->write;
	s->attention += t->attention;
	s->rows += t->rows;
	s->begin += t->begin;
	s->layers += t->layers;
	s->commit += t->commit;
	s->out += t->out;
	s->span += t->span;
	if (p->kind == GEN_DECODE)
		f->decode_ms[f->n_decode_ms++] = t->step * 1e3;
}

void gen_run(struct kv *k, struct gen_seq *seq, uint32_t n, uint32_t budget, int stop, bool print,
	     struct gen_figs *f)
{
	uint32_t left = n, prompts = 0;
	size_t cap_ms = 64;
	struct plan p = { malloc(n * sizeof(*p.ms)), malloc(n * sizeof(*p.who)), 0, 0, 0 };
	uint32_t *ids = malloc(n * sizeof(uint32_t));
	double t0 = now_s();

	memset(f, 0, sizeof(*f));
	f->decode_ms = malloc(cap_ms * sizeof(double));
	if (!p.ms || !p.who || !ids || !f->decode_ms)
		die("%s", strerror(ENOMEM));
	while (left) {
		int r;

		plan_step(seq, n, budget, &p);
		if (!p.n)
			die("generate: no sequence fits a step of %u rows", budget);
		r = model_step_greedy(md, k->b, p.ms, p.n, ids);
		if (r < 0)
			die("step of %u sequences, %u rows (kv %s): %s", p.n, p.rows, k->policy,
			    model_error(md) ? model_error(md) : kvq_client_error(k->c));
		if (f->n_decode_ms == cap_ms && !(f->decode_ms = realloc(f->decode_ms, (cap_ms *= 2) * sizeof(double))))
			die("%s", strerror(ENOMEM));
		count_step(&p, f);
		prompts += take_step(seq, &p, ids, stop, print);
		if (prompts == n && !f->t_prefilled)
			f->t_prefilled = now_s() - t0;
		kv_resident(k, seq, n, f);
		for (uint32_t i = 0; i < n; i++)
			if (seq[i].done && seq[i].s) {
				kvq_seq_free(seq[i].s);
				seq[i].s = NULL;
				f->generated += seq[i].g;
				left--;
			}
	}
	f->t_total = now_s() - t0;
	free(p.ms);
	free(p.who);
	free(ids);
}
