/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run generate's report: tokens per second, the latency of a decode
 * step (every sequence's next token), the share of the steps spent in
 * libkvq's attention (and K/V write), the KV bytes the sequences held;
 * on stderr for a person (each sequence's continuation on stdout), or all
 * of it as one JSON object on stdout (--json).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab.h"
#include "gen.h"
#include "mm.h"

/* The run's figures, derived once for both forms. */
struct sums {
	uint64_t prompt, hit, steps;
	double secs, attention, write, ms_mean, ms_p50, ms_p99;
	double tok_s, decode_tok_s, gen_secs;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double share(double part, double whole)
{
	return whole > 0 ? 100.0 * part / whole : 0.0;
}

static void sum_up(const struct gen_seq *seq, uint32_t n, const struct gen_figs *f, struct sums *s)
{
	double *ms = malloc((f->n_decode_ms + 1) * sizeof(double));

	memset(s, 0, sizeof(*s));
	for (uint32_t i = 0; i < n; i++) {
		s->prompt += seq[i].n;
		s->hit += seq[i].hit;
	}
	for (int k = 0; k < GEN_KINDS; k++) {
		s->steps += f->steps[k];
		s->secs += f->t[k].step;
		s->attention += f->t[k].attention;
		s->write += f->t[k].write;
	}
	if (ms && f->n_decode_ms) {
		memcpy(ms, f->decode_ms, f->n_decode_ms * sizeof(double));
		qsort(ms, f->n_decode_ms, sizeof(double), cmp_double);
		s->ms_mean = 1e3 * f->t[GEN_DECODE].step / f->n_decode_ms;
		s->ms_p50 = ms[f->n_decode_ms / 2];
		s->ms_p99 = ms[f->n_decode_ms * 99 / 100];
	}
	free(ms);
	/* as kvq-run generate of one sequence always said: the tokens after
	 * each sequence's first (which its prompt's last chunk gives), over
	 * the time after the last prompt was in */
	s->gen_secs = f->t_total - f->t_prefilled;
	s->tok_s = f->generated > n && s->gen_secs > 0 ? (f->generated - n) / s->gen_secs : 0.0;
	s->decode_tok_s = f->t[GEN_DECODE].step > 0 ? f->rows[GEN_DECODE] / f->t[GEN_DECODE].step : 0.0;
}

/* A decode step's parts (struct model_times), means in ms, and their
 * names in the report and the JSON (layers_gpu: the span). */
enum { PART_ROWS, PART_BEGIN, PART_LAYERS, PART_COMMIT, PART_OUT, PART_WRITE, PART_ATTENTION, PART_SPAN, PARTS };
static const char *const part_name[PARTS] = { "rows", "begin", "layers", "commit", "out", "write", "attention",
					      "layers_gpu" };

static void decode_parts(const struct gen_figs *f, double ms[PARTS])
{
	const struct model_times *t = &f->t[GEN_DECODE];
	const double k = f->steps[GEN_DECODE] ? 1e3 / f->steps[GEN_DECODE] : 0.0;

	ms[PART_ROWS] = k * t->rows;
	ms[PART_BEGIN] = k * t->begin;
	ms[PART_LAYERS] = k * t->layers;
	ms[PART_COMMIT] = k * t->commit;
	ms[PART_OUT] = k * t->out;
	ms[PART_WRITE] = k * t->write;
	ms[PART_ATTENTION] = k * t->attention;
	ms[PART_SPAN] = k * t->span;
}

static void text(const struct kv *k, const struct gen_seq *seq, uint32_t n, uint32_t budget, const struct gen_figs *f,
		 const struct sums *s)
{
	for (uint32_t i = 0; n > 1 && i < n; i++) {
		size_t len;
		char *t = ab_decode(seq[i].out, seq[i].g, &len);

		printf("--- sequence %u (%s %u, %u prompt tokens, %u generated)\n", i, o.file ? "from token" : "prompt line",
		       seq[i].from, seq[i].n, seq[i].g);
		ab_put_text(stdout, t, len);
		printf("\n");
		free(t);
	}
	if (n == 1)
		printf("\n");
	fflush(stdout);
	fprintf(stderr, "kvq-run: kv %s (window %u, %.2f bits/value sealed); %u sequence%s, prompt%s %llu tokens: %llu "
		"from the prefix cache%s, %llu computed; prefix lookup %.3f s, prefill %.2f s; %llu tokens generated in %.2f s (%.1f tok/s); "
		"matmul path %s, %u thread(s)\n",
		k->canon, k->window, k->bits, n, n > 1 ? "s" : "", n > 1 ? "s" : "", (unsigned long long)s->prompt,
		(unsigned long long)s->hit, o.no_cache ? " (disabled)" : "", (unsigned long long)(s->prompt - s->hit),
		f->t_lookup, f->t_prefilled, (unsigned long long)f->generated, s->gen_secs, s->tok_s,
		o.gpu ? "cuBLAS (GPU)" : mm_path(), o.threads);
	fprintf(stderr, "kvq-run: %llu steps of at most %u rows (%u prefill, %u decode, %u mixed); decode step %.2f ms "
		"(p50 %.2f, p99 %.2f): %.1f tok/s; attention %.1f %% of the steps (%.1f %% of decode steps), K/V "
		"write %.1f %%; KV resident at most %.2f MiB (%llu tokens, %.0f bytes/token)\n",
		(unsigned long long)s->steps, budget, f->steps[GEN_PREFILL], f->steps[GEN_DECODE], f->steps[GEN_MIXED],
		s->ms_mean, s->ms_p50, s->ms_p99, s->decode_tok_s, share(s->attention, s->secs),
		share(f->t[GEN_DECODE].attention, f->t[GEN_DECODE].step), share(s->write, s->secs), f->kv_peak / 1048576.0,
		(unsigned long long)f->kv_peak_tokens, f->kv_peak_tokens ? (double)f->kv_peak / f->kv_peak_tokens : 0.0);
	if (f->steps[GEN_DECODE]) {
		double ms[PARTS];

		decode_parts(f, ms);
		fprintf(stderr, "kvq-run: a decode step's parts, ms:");
		for (int i = 0; i < PARTS; i++)
			fprintf(stderr, " %s %.3f", part_name[i], ms[i]);
		fprintf(stderr, "\n");
	}
}

static void json_seq(const struct gen_seq *q, uint32_t i)
{
	size_t len;
	char *t = ab_decode(q->out, q->g, &len);

	printf("%s{\"seq\":%u,\"%s\":%u,\"prompt_tokens\":%u,\"hit\":%u,\"generated\":%u,\"ids\":[", i ? "," : "", i,
	       o.file ? "from_token" : "line", q->from, q->n, q->hit, q->g);
	for (uint32_t j = 0; j < q->g; j++)
		printf("%s%u", j ? "," : "", q->out[j]);
	printf("],\"text\":");
	ab_put_json(stdout, t, len);
	printf("}");
	free(t);
}

static void json(const struct kv *k, const struct gen_seq *seq, uint32_t n, uint32_t budget, const struct gen_figs *f,
		 const struct sums *s)
{
	printf("{\"kv\":");
	ab_put_json(stdout, k->canon, strlen(k->canon));
	printf(",\"window\":%u,\"bits_per_value\":%.4f,\"path\":\"%s\",\"threads\":%u,\"seqs\":%u,\"prefill_chunk\":%u,"
	       "\"step_rows\":%u,\"max_tokens\":%u,\"ignore_eos\":%s,\"prompt_tokens\":%llu,\"hit_tokens\":%llu,"
	       "\"generated\":%llu,"
	       "\"seconds\":%.4f,\"lookup_seconds\":%.4f,\"prefill_seconds\":%.4f,\"tokens_per_s\":%.3f,\"decode_tokens_per_s\":%.3f,"
	       "\"steps\":{\"prefill\":%u,\"decode\":%u,\"mixed\":%u},\"decode_step_ms\":{\"mean\":%.4f,\"p50\":%.4f,"
	       "\"p99\":%.4f},\"attention_share\":%.4f,\"attention_share_decode\":%.4f,\"write_share\":%.4f,"
	       "\"kv_bytes_peak\":%llu,\"kv_tokens_peak\":%llu,",
	       k->window, k->bits, o.gpu ? "gpu" : "cpu", o.threads, n, o.batch, budget, o.max_tokens,
	       o.ignore_eos ? "true" : "false",
	       (unsigned long long)s->prompt, (unsigned long long)s->hit, (unsigned long long)f->generated, f->t_total,
	       f->t_lookup, f->t_prefilled, s->tok_s, s->decode_tok_s, f->steps[GEN_PREFILL], f->steps[GEN_DECODE],
	       f->steps[GEN_MIXED], s->ms_mean, s->ms_p50, s->ms_p99, share(s->attention, s->secs) / 100,
	       share(f->t[GEN_DECODE].attention, f->t[GEN_DECODE].step) / 100, share(s->write, s->secs) / 100,
	       (unsigned long long)f->kv_peak, (unsigned long long)f->kv_peak_tokens);
	{
		double ms[PARTS];

		decode_parts(f, ms);
		printf("\"decode_step_parts_ms\":{");
		for (int i = 0; i < PARTS; i++)
			printf("%s\"%s\":%.4f", i ? "," : "", part_name[i], ms[i]);
		printf("},\"sequences\":[");
	}
	for (uint32_t i = 0; i < n; i++)
		json_seq(&seq[i], i);
	printf("]}\n");
}

void gen_report(const struct kv *k, const struct gen_seq *seq, uint32_t n, uint32_t budget,
		const struct gen_figs *f)
{
	struct sums s;

	sum_up(seq, n, f, &s);
	if (o.json)
		json(k, seq, n, budget, f, &s);
	else
		text(k, seq, n, budget, f, &s);
}
