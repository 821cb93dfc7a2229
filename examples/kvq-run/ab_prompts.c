/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab --prompts FILE: every prompt in the chat template (as generate
 * builds it) with f16 KV, a bf16 control and each --kv policy.  f16's
 * greedy continuation is the reference; each policy follows it teacher-
 * forced (f16's tokens fed, one at a time as in decode) for KL and top-1
 * at every step, and where its own choice first differs its sequence is
 * forked and continued greedily, so its continuation is exactly the one
 * kvq-run generate --kv POLICY --no-prefix-cache prints, at no second
 * prefill.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ab.h"

#define AB_CONTROL "bf16"

/* Per-prompt buffers: f16's logits at each of its steps and their log
 * softmax, one policy's logits, the log softmax of one row. */
struct ab_buf {
	float *ref, *last, *fork_last;
	double *lr, *lq;
};

/* The progress line on stderr: after the first seconds, over itself on a
 * terminal, else a line every half minute. */
static void progress(size_t done, size_t total, double t0, bool end)
{
	static double shown;
	static int tty = -1;
	double t = now_s() - t0;

	if (tty < 0)
		tty = isatty(STDERR_FILENO);
	if (end) {
		if (tty && shown > 0)
			fputc('\n', stderr);
		return;
	}
	if (t < 5 || t - shown < (tty ? 1 : 30))
		return;
	shown = t;
	fprintf(stderr, "%skvq-run: ab: %zu/%zu prompts, %.0f s, about %.0f s left%s", tty ? "\r" : "", done, total,
		t, done ? t * (double)(total - done) / (double)done : 0.0, tty ? "  " : "\n");
}

/* KL(ref || q) and whether their top tokens agree, ref as log softmax. */
static double kl_top1(const double *lr, uint32_t top_ref, const float *q, double *lq, uint32_t V, uint32_t *top1)
{
	double kl = 0;

	log_softmax(q, V, lq);
	for (uint32_t v = 0; v < V; v++)
		kl += exp(lr[v]) * (lr[v] - lq[v]);
	*top1 += argmax(q, V) == top_ref;
	return kl;
}

/* One policy on a prompt whose f16 run is ref (steps rows of logits in
 * b->ref, the last one the stop's when f16 stopped).  Fills c. */
static void run_policy(struct kv *k, const uint32_t *ids, uint32_t n, const struct ab_cont *ref, uint32_t steps,
		       struct ab_buf *b, struct ab_cont *c, uint32_t gen, int stop)
{
	uint32_t V = model_cfg(md)->vocab;
	bool own = true;   /* its own choices equal f16's so far */

	kv_reset(k);
	feed(k, ids, n, NULL, b->last);
	c->n = 0;
	for (uint32_t i = 0; i < steps; i++) {
		const float *r = b->ref + (size_t)i * V;

		log_softmax(r, V, b->lr);
		c->kl += kl_top1(b->lr, argmax(r, V), b->last, b->lq, V, &c->top1);
		c->tf++;
		if (own) {
			uint32_t t = argmax(b->last, V);
			bool ends = (int)t == stop || t == tok_eos(tk);

			if (i < ref->n && t == ref->ids[i]) {
				c->ids[c->n++] = t;
			} else if (i == ref->n && ends) {
				c->exact = true;   /* the same tokens, and f16's stop */
				own = false;
			} else {
				own = false;
				if (!ends) {
					/* prompt + ref->ids[0..i) as it stands: the state generate
					 * has at this step */
					struct kv f = *k;
					int e = kvq_seq_fork(k->s, &f.s);

					if (e < 0)
						die("fork (kv %s): %s (%s)", k->policy, kvq_strerror(e), kvq_client_error(k->c));
					memcpy(b->fork_last, b->last, sizeof(float) * V);
					c->n = i + greedy(&f, b->fork_last, gen - i, stop, c->ids + i, NULL);
					kvq_seq_free(f.s);
				}
			}
			if (own && c->n == gen) {   /* f16's length, cut by --gen as f16 was */
				c->exact = true;
				own = false;
			}
		}
		if (i + 1 < steps)
			feed(k, &ref->ids[i], 1, NULL, b->last);
	}
	for (c->match = 0; c->match < c->n && c->match < ref->n && c->ids[c->match] == ref->ids[c->match];)
		c->match++;
}

/* The rows: f16, the bf16 control (unless a --kv is bf16), each --kv. */
static unsigned open_rows(struct ab_row *row, uint32_t ctx)
{
	unsigned rows = 0;
	bool control = false;

	for (unsigned j = 0; j < o.n_kv; j++)
		control |= !strcmp(o.kv[j], AB_CONTROL);
	kv_open(&row[rows++].k, "f16", ctx, 2);
	if (!control) {
		row[rows].control = true;
		kv_open(&row[rows++].k, AB_CONTROL, ctx, 2);
	}
	for (unsigned j = 0; j < o.n_kv; j++) {
		row[rows].control = !strcmp(o.kv[j], AB_CONTROL);
		kv_open(&row[rows++].k, o.kv[j], ctx, 2);
	}
	return rows;
}

static void add_totals(struct ab_row *row, const struct ab_cont *c)
{
	row->exact += c->exact;
	row->match += c->match;
	row->tf += c->tf;
	row->top1 += c->top1;
	row->kl += c->kl;
	row->gen += c->n;
	row->bad += c->bad;
	ab_rep4(c->ids, c->n, &row->ngrams, &row->repeats);
}

int cmd_ab_prompts(void)
{
	struct ab_run r = { .file = o.prompts };
	static struct ab_row row[RUN_MAX_KV + 2];
	struct ab_buf b;
	char *sys_file = NULL, salt[64];
	size_t sys_len, n_read;
	uint32_t V;
	int stop;
	double t0;

	if (o.gen == 0)
		die("ab --prompts needs --gen of 1 or more");
	r.p = prompts_read(o.prompts, &n_read);
	r.n_prompts = n_read;
	if (o.limit && r.n_prompts > o.limit)
		r.n_prompts = o.limit;
	load();
	V = model_cfg(md)->vocab;
	r.gen = o.gen;
	r.ctx = o.ctx ? o.ctx : 2048;
	if (r.ctx <= r.gen || r.ctx > model_cfg(md)->ctx)
		die("--ctx between --gen + 1 and the model's context (%u)", model_cfg(md)->ctx);
	if (o.system_file)
		sys_file = read_file(o.system_file, &sys_len);
	for (size_t i = 0; i < r.n_prompts; i++)
		if (o.raw && r.p[i].system)
			die("%s:%u: \"system\" with --raw (a raw prompt has no template to hold it)", o.prompts,
			    r.p[i].line);
	stop = chat_stop();
	r.row = row;
	r.rows = open_rows(row, r.ctx);
	r.tokens = calloc(r.n_prompts, sizeof(*r.tokens));
	r.skipped = calloc(r.n_prompts, sizeof(*r.skipped));
	r.c = calloc(r.n_prompts * r.rows, sizeof(*r.c));
	b.ref = malloc(sizeof(float) * V * (r.gen + 1));
	b.last = malloc(sizeof(float) * V);
	b.fork_last = malloc(sizeof(float) * V);
	b.lr = malloc(sizeof(double) * V);
	b.lq = malloc(sizeof(double) * V);
	if (!r.tokens || !r.skipped || !r.c || !b.ref || !b.last || !b.fork_last || !b.lr || !b.lq)
		die("%s", strerror(ENOMEM));
	t0 = now_s();
	for (size_t i = 0; i < r.n_prompts; i++) {
		const struct prompt *p = &r.p[i];
		struct ab_cont *c = r.c + i * r.rows;
		size_t n;
		uint32_t *ids = chat_tokens(p->text, p->system ? p->system : sys_file ? sys_file : o.system, &n), steps;

		r.tokens[i] = (uint32_t)(n < UINT32_MAX ? n : UINT32_MAX);
		for (unsigned j = 0; j < r.rows; j++)
			if (!(c[j].ids = malloc(sizeof(uint32_t) * (r.gen + 1))))
				die("%s", strerror(ENOMEM));
		if (n == 0 || n + r.gen > r.ctx) {
			r.skipped[i] = true;
			r.n_skipped++;
			free(ids);
			continue;
		}
		/* a salt of the run's own, as generate --no-prefix-cache: its
		 * blocks are found by no one and find nothing */
		snprintf(salt, sizeof(salt), "ab-prompts-%ld-%.0f-%zu", (long)getpid(), t0 * 1e6, i);
		o.salt = salt;
		kv_reset(&row[0].k);
		feed(&row[0].k, ids, (uint32_t)n, NULL, b.last);
		c[0].n = greedy(&row[0].k, b.last, r.gen, stop, c[0].ids, b.ref);
		c[0].exact = true;
		c[0].match = c[0].n;
		steps = c[0].n + (c[0].n < r.gen);
		for (unsigned j = 1; j < r.rows; j++)
			run_policy(&row[j].k, ids, (uint32_t)n, &c[0], steps, &b, &c[j], r.gen, stop);
		for (unsigned j = 0; j < r.rows; j++) {
			c[j].text = ab_decode(c[j].ids, c[j].n, &c[j].len);
			c[j].bad = ab_utf8_bad(c[j].text, c[j].len, c[j].n == r.gen);
			add_totals(&row[j], &c[j]);
		}
		r.n_run++;
		free(ids);
		progress(i + 1, r.n_prompts, t0, false);
	}
	progress(0, 0, t0, true);
	r.seconds = now_s() - t0;
	if (r.n_run == 0)
		die("%s: every prompt skipped (%zu longer than --ctx %u less --gen %u)", o.prompts, r.n_skipped, r.ctx,
		    r.gen);
	ab_report(&r);
	for (size_t i = 0; i < r.n_prompts * r.rows; i++) {
		free(r.c[i].ids);
		free(r.c[i].text);
	}
	for (unsigned j = 0; j < r.rows; j++)
		kv_close(&row[j].k);
	free(r.c);
	free(r.tokens);
	free(r.skipped);
	free(b.ref);
	free(b.last);
	free(b.fork_last);
	free(b.lr);
	free(b.lq);
	free(sys_file);
	prompts_free(r.p, n_read);
	return 0;
}
