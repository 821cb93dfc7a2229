/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run generate: its sequences from --prompt TEXT, --prompts FILE (one
 * chat prompt a line) or --ctx tokens of FILE from a point of their own
 * (continuations); each one's sealed prefix from kvqd's prefix cache unless
 * --no-prefix-cache; then the sequences run together, --seqs of them as
 * one batch (gen_batch.c), greedy, and the run's figures (gen_report.c).
 * One sequence is a batch of one, its tokens printed as they come.  Also
 * greedy(), ab's continuation of one sequence.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "layout.h"

/* Greedy continuation of g tokens after the logits in last; stops early at
 * stop (>= 0) or the end-of-sequence token.  trace (if not NULL) gets the
 * logits of every choice made, the one of a stop included.  Returns the
 * count written to out.  (kvq-run generate runs its sequences through
 * gen_run, which chooses as this does.) */
uint32_t greedy(struct kv *k, float *last, uint32_t g, int stop, uint32_t *out, float *trace)
{
	uint32_t n = 0, V = model_cfg(md)->vocab;

	while (n < g) {
		uint32_t t;

		if (trace)
			memcpy(trace + (size_t)n * V, last, sizeof(float) * V);
		if (!pick(last, stop, &t))
			break;
		out[n++] = t;
		if (n < g)
			feed(k, &t, 1, NULL, last);
	}
	return n;
}

static void print_stats(struct kv *k)
{
	struct kvq_stats st;
	int r = kvq_client_stats(k->c, NULL, &st);

	if (r < 0) {
		fprintf(stderr, "kvq-run: stats: %s\n", kvq_strerror(r));
		return;
	}
	fprintf(stderr, "kvq-run: pool %s (%s, %.1f MiB): %u client(s); sealed slots %u: %u cached (%u referenced), "
		"%u held, %u reserved, %u free; open slots %u: %u used; lookups asked %llu tokens, hit %llu\n",
		st.name, st.backend, st.total_bytes / 1048576.0, st.clients, st.n_sealed, st.cached, st.referenced,
		st.sealed_held, st.sealed_reserved, st.sealed_free, st.n_open, st.open_used,
		(unsigned long long)st.lookup_tokens, (unsigned long long)st.hit_tokens);
}

/* The prompt's cached prefix, as kvq_seq_from_prompt finds it for the
 * empty *s, but no longer than the first chunk can keep sealed:
 * kvq_seq_begin keeps a found prefix only if that chunk's end splits at or
 * past it, and chunks end at multiples of --batch (chunk_len).  A window
 * wider than the way to the next multiple (KIVI's 4 blocks) would not:
 * then the lookup asks again below that hit, on a new *s.  Returns the
 * tokens found. */
static uint32_t lookup(struct kv *k, kvq_seq **s, const uint32_t *ids, uint32_t n)
{
	const struct kvq_layout *L = kvq_client_layout(k->c);
	uint32_t look = n, hit;

	for (;;) {
		int r = kvq_seq_from_prompt(*s, ids, look, &hit);
		if (r < 0)
			die("prefix lookup: %s (%s)", kvq_strerror(r), kvq_client_error(k->c));
		uint32_t end = hit - hit % o.batch + o.batch;
		if (!hit || kvq_layout_split(L, end < n ? end : n) >= hit)
			return hit;
		kvq_seq_free(*s);
		*s = kv_seq_new(k);
		while (kvq_layout_split(L, look) >= hit)
			look--;
	}
}

/* A prompt of the run, before the prompts are shared out to the sequences. */
struct input {
	uint32_t *ids;
	size_t n;
	unsigned from;   /* struct gen_seq's */
};

/* --prompt TEXT or --prompts FILE (p[0..np)): each prompt in the chat
 * template. */
static struct input *chat_inputs(const struct prompt *p, size_t np)
{
	struct input *in = calloc(np, sizeof(*in));
	char *sys = NULL;
	size_t sys_len = 0;

	if (!in)
		die("%s", strerror(ENOMEM));
	if (o.system_file)
		sys = read_file(o.system_file, &sys_len);
	for (size_t i = 0; i < np; i++) {
		in[i].ids = chat_tokens(p[i].text, p[i].system ? p[i].system : sys ? sys : o.system, &in[i].n);
		in[i].from = p[i].line;
	}
	free(sys);
	return in;
}

/* FILE: --ctx tokens for each of seqs sequences, sequence i's from token
 * i * n / seqs of FILE on (round to its start where it runs out), so each
 * continues the text from a point of its own. */
static struct input *file_inputs(uint32_t seqs)
{
	struct input *in = calloc(seqs, sizeof(*in));
	size_t n;
	uint32_t *ids = file_tokens(&n);

	if (!in)
		die("%s", strerror(ENOMEM));
	for (uint32_t i = 0; i < seqs; i++) {
		in[i].from = (unsigned)((uint64_t)i * n / seqs);
		in[i].n = o.ctx;
		if (!(in[i].ids = malloc(o.ctx * sizeof(uint32_t))))
			die("%s", strerror(ENOMEM));
		for (uint32_t t = 0; t < o.ctx; t++)
			in[i].ids[t] = ids[(in[i].from + t) % n];
	}
	free(ids);
	return in;
}

/* Rows a step may hold: --step-tokens, else every sequence's chunk (at
 * most 8192 rows); never fewer than a chunk beside every other sequence's
 * decode token, so each step advances a prompt. */
static uint32_t step_budget(uint32_t seqs)
{
	uint32_t least = seqs + o.batch - 1, all = seqs * o.batch < 8192 ? seqs * o.batch : 8192;

	if (!o.step_tokens)
		return least > all ? least : all;
	if (o.step_tokens < least)
		die("--step-tokens %u: at least --seqs + --batch - 1 (%u), so a prompt chunk fits beside every decode",
		    o.step_tokens, least);
	return o.step_tokens;
}

/* The run's sequences: sequence i takes input i % np.  *ret_longest gets
 * the most tokens one will hold. */
static struct gen_seq *make_seqs(const struct input *in, size_t np, uint32_t seqs, uint32_t *ret_longest)
{
	struct gen_seq *seq = calloc(seqs, sizeof(*seq));
	uint32_t ctx = model_cfg(md)->ctx, longest = 0;

	if (!seq)
		die("%s", strerror(ENOMEM));
	for (uint32_t i = 0; i < seqs; i++) {
		struct gen_seq *q = &seq[i];
		const struct input *e = &in[i % np];

		if (e->n == 0 || e->n + o.max_tokens > ctx)
			die("prompt %u (%zu tokens) empty or beyond the context with --max-tokens", i, e->n);
		*q = (struct gen_seq){ .ids = e->ids, .n = (uint32_t)e->n, .from = e->from };
		if (!(q->out = malloc(sizeof(uint32_t) * (o.max_tokens + 1))))
			die("%s", strerror(ENOMEM));
		longest = q->n + o.max_tokens > longest ? q->n + o.max_tokens : longest;
	}
	*ret_longest = longest;
	return seq;
}

/* Each sequence made on k, its prompt's cached prefix taken. */
static void start_seqs(struct kv *k, struct gen_seq *seq, uint32_t seqs)
{
	for (uint32_t i = 0; i < seqs; i++) {
		seq[i].s = kv_seq_new(k);
		if (!o.no_cache)
			seq[i].hit = lookup(k, &seq[i].s, seq[i].ids, seq[i].n);
		seq[i].fed = seq[i].hit;
	}
}

int cmd_generate(void)
{
	struct kv k = { 0 };
	struct input *in;
	struct prompt one = { (char *)o.prompt, NULL, 0 }, *p = &one;
	struct gen_seq *seq;
	struct gen_figs f;
	char nocache[64];
	size_t np = 1;
	uint32_t seqs, budget, longest;
	double t_lookup;

	if (!!o.prompt + !!o.prompts + !!o.file != 1)
		die("generate needs one of --prompt TEXT, --prompts FILE or FILE (with --ctx N)");
	if (o.file && !o.ctx)
		die("generate FILE needs --ctx N (prompt tokens of each sequence)");
	if (o.prompts)
		p = prompts_read(o.prompts, &np);
	seqs = o.seqs ? o.seqs : o.file ? 1 : (uint32_t)np;
	/* the model's buffers hold a step's rows */
	budget = o.step_tokens = step_budget(seqs);
	load();
	in = o.file ? file_inputs(seqs) : chat_inputs(p, np);
	if (p != &one)
		prompts_free(p, np);
	if (o.file)
		np = seqs;   /* an input of its own for each sequence */
	seq = make_seqs(in, np, seqs, &longest);
	/* pools sized by class, so workers with different prompts share one */
	kv_open(&k, o.kv[0] ? o.kv[0] : "f16", longest <= 2048 ? 2048 : model_cfg(md)->ctx, seqs);
	if (o.no_cache) {
		/* a salt of our own: nothing found, nothing shared */
		snprintf(nocache, sizeof(nocache), "no-prefix-cache-%ld-%.0f", (long)getpid(), now_s() * 1e6);
		o.salt = nocache;
	}
	t_lookup = now_s();
	start_seqs(&k, seq, seqs);
	t_lookup = now_s() - t_lookup;
	gen_run(&k, seq, seqs, budget, o.file ? -1 : chat_stop(), seqs == 1 && !o.json, &f);
	f.t_lookup = t_lookup;
	gen_report(&k, seq, seqs, budget, &f);
	if (o.stats)
		print_stats(&k);
	for (uint32_t i = 0; i < seqs; i++)
		free(seq[i].out);
	free(seq);
	free(f.decode_ms);
	for (size_t i = 0; i < np; i++)
		free(in[i].ids);
	free(in);
	kv_close(&k);
	return 0;
}
