/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab --prompts: the report.  Markdown (a table of every policy
 * against f16, then the prompts whose continuations differ most, for a
 * person to read) or, with --json, the same figures with every prompt's
 * continuations.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ab.h"

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0.0;
}

static double cont_kl(const struct ab_cont *c)
{
	return ratio(c->kl, c->tf);
}

/* The prompts (indices) whose continuation with row j differs from f16's,
 * the largest mean teacher-forced KL first; *ret_n of them, at most
 * --show.  malloc'ed. */
static size_t *most_different(const struct ab_run *r, unsigned j, size_t *ret_n)
{
	size_t *idx = malloc(sizeof(size_t) * (r->n_prompts + 1)), n = 0;

	if (!idx)
		die("%s", strerror(ENOMEM));
	for (size_t i = 0; i < r->n_prompts; i++)
		if (!r->skipped[i] && !r->c[i * r->rows + j].exact)
			idx[n++] = i;
	/* insertion sort: a few hundred prompts */
	for (size_t a = 1; a < n; a++)
		for (size_t b = a; b > 0 && cont_kl(&r->c[idx[b] * r->rows + j]) > cont_kl(&r->c[idx[b - 1] * r->rows + j]);
		     b--) {
			size_t t = idx[b];

			idx[b] = idx[b - 1];
			idx[b - 1] = t;
		}
	*ret_n = n < o.show ? n : o.show;
	return idx;
}

static const char *row_name(const struct ab_row *w, unsigned j)
{
	static char buf[sizeof(((struct kv *)0)->canon) + 16];

	snprintf(buf, sizeof(buf), "%s%s", w->k.canon, j == 0 ? " (reference)" : w->control ? " (control)" : "");
	return buf;
}

/* A block of text for Markdown, fenced so that it is shown as written. */
static void md_block(const char *label, const char *s, size_t len)
{
	printf("%s:\n\n~~~~text\n", label);
	ab_put_text(stdout, s, len);
	printf("%s~~~~\n\n", len && s[len - 1] == '\n' ? "" : "\n");
}

static void markdown(const struct ab_run *r)
{
	const struct ab_row *f = &r->row[0];

	printf("## kvq-run ab: %s\n\n", r->file);
	printf("%zu prompt(s) run, %zu skipped (the prompt in the template plus --gen %u beyond --ctx %u); %s; "
	       "greedy, up to %u tokens each; %.1f s (%s path).\n\n",
	       r->n_run, r->n_skipped, r->gen, r->ctx, o.raw ? "raw prompts (--raw)" : "chat template", r->gen,
	       r->seconds, o.gpu ? "GPU" : "CPU");
	printf("| KV | window | bits/value | exact match | continuation = f16 | teacher-forced KL | top-1 | "
	       "repeated 4-grams | invalid UTF-8 / U+FFFD | tokens |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (unsigned j = 0; j < r->rows; j++) {
		const struct ab_row *w = &r->row[j];

		printf("| %s | %u | %.2f |", row_name(w, j), w->k.window, w->k.bits);
		if (j == 0)
			printf(" | | | |");
		else
			printf(" %.1f %% | %.1f %% | %.5f | %.2f %% |", 100 * ratio(w->exact, r->n_run),
			       100 * ratio(w->match, f->gen), ratio(w->kl, w->tf), 100 * ratio(w->top1, w->tf));
		printf(" %.1f %% | %.1f %% | %llu |\n", 100 * ratio(w->repeats, w->ngrams), 100 * ratio(w->bad, r->n_run),
		       (unsigned long long)w->gen);
	}
	printf("\nExact match: continuations equal to f16's token for token, its stop included. Continuation = "
	       "f16: the share of f16's tokens matched before the first difference. Teacher-forced KL "
	       "(KL(f16 || KV), mean per position) and top-1: the next-token distributions along f16's "
	       "continuation (%llu positions), which stay meaningful after a first harmless difference. "
	       "Invalid UTF-8 / U+FFFD: continuations whose decoded text has either (f16's own rate in its row). "
	       "The bf16 row is a control: the difference a format taken as harmless makes, the noise floor.\n\n",
	       (unsigned long long)(r->rows > 1 ? r->row[1].tf : 0));
	for (unsigned j = 1; j < r->rows; j++) {
		size_t n, *idx;

		if (r->row[j].control || o.show == 0)
			continue;
		idx = most_different(r, j, &n);
		printf("### %s (window %u): the prompts that differ most\n\n", r->row[j].k.canon, r->row[j].k.window);
		if (n == 0)
			printf("Every continuation equals f16's.\n\n");
		for (size_t a = 0; a < n; a++) {
			size_t i = idx[a];
			const struct ab_cont *c0 = &r->c[i * r->rows], *c = &r->c[i * r->rows + j];

			printf("**%s line %u**: KL %.5f, top-1 %.1f %%, first difference at token %u of %u\n\n", r->file,
			       r->p[i].line, cont_kl(c), 100 * ratio(c->top1, c->tf), c->match, c0->n);
			md_block("prompt", r->p[i].text, strlen(r->p[i].text));
			md_block("f16", c0->text, c0->len);
			md_block(r->row[j].k.canon, c->text, c->len);
		}
		free(idx);
	}
}

static void json_row(const struct ab_run *r, unsigned j)
{
	const struct ab_row *w = &r->row[j];

	printf("{\"kv\":");
	ab_put_json(stdout, w->k.canon, strlen(w->k.canon));
	printf(",\"window\":%u,\"bits_per_value\":%.4f,", w->k.window, w->k.bits);
	if (j > 0)
		printf("\"control\":%s,\"exact_match\":%.6f,\"cont_match\":%.6f,\"kl\":%.6f,\"top1\":%.6f,"
		       "\"tf_positions\":%llu,",
		       w->control ? "true" : "false", ratio(w->exact, r->n_run), ratio(w->match, r->row[0].gen),
		       ratio(w->kl, w->tf), ratio(w->top1, w->tf), (unsigned long long)w->tf);
	printf("\"rep4\":%.6f,\"bad_utf8\":%.6f,\"gen_tokens\":%llu}", ratio(w->repeats, w->ngrams),
	       ratio(w->bad, r->n_run), (unsigned long long)w->gen);
}

static void json_cont(const struct ab_run *r, unsigned j, const struct ab_cont *c)
{
	printf("{\"kv\":");
	ab_put_json(stdout, r->row[j].k.canon, strlen(r->row[j].k.canon));
	printf(",\"window\":%u,\"tokens\":%u,\"bad_utf8\":%s,\"text\":", r->row[j].k.window, c->n,
	       c->bad ? "true" : "false");
	ab_put_json(stdout, c->text, c->len);
	if (j > 0)
		printf(",\"exact\":%s,\"match\":%u,\"tf_positions\":%u,\"kl\":%.6f,\"top1\":%.6f", c->exact ? "true" : "false",
		       c->match, c->tf, cont_kl(c), ratio(c->top1, c->tf));
	printf("}");
}

static void json(const struct ab_run *r)
{
	bool first = true;

	printf("{\"prompts_file\":");
	ab_put_json(stdout, r->file, strlen(r->file));
	printf(",\"template\":\"%s\",\"ctx\":%u,\"gen\":%u,\"prompts\":%zu,\"run\":%zu,\"skipped\":%zu,"
	       "\"seconds\":%.1f,\"rotate\":%s,\"k_center\":%s,\"path\":\"%s\",\"skipped_lines\":[",
	       o.raw ? "raw" : "chat", r->ctx, r->gen, r->n_prompts, r->n_run, r->n_skipped, r->seconds,
	       o.rotate ? "true" : "false", k_center ? "true" : "false", o.gpu ? "gpu" : "cpu");
	for (size_t i = 0; i < r->n_prompts; i++)
		if (r->skipped[i]) {
			printf("%s%u", first ? "" : ",", r->p[i].line);
			first = false;
		}
	printf("],\"ref\":");
	json_row(r, 0);
	printf(",\"results\":[");
	for (unsigned j = 1; j < r->rows; j++) {
		printf("%s", j > 1 ? "," : "");
		json_row(r, j);
	}
	printf("],\"most_different\":[");
	first = true;
	for (unsigned j = 1; j < r->rows; j++) {
		size_t n, *idx;

		if (r->row[j].control)
			continue;
		idx = most_different(r, j, &n);
		for (size_t a = 0; a < n; a++) {
			size_t i = idx[a];

			printf("%s{\"line\":%u,\"f16\":", first ? "" : ",", r->p[i].line);
			ab_put_json(stdout, r->c[i * r->rows].text, r->c[i * r->rows].len);
			printf(",\"cont\":");
			json_cont(r, j, &r->c[i * r->rows + j]);
			printf("}");
			first = false;
		}
		free(idx);
	}
	printf("],\"per_prompt\":[");
	for (size_t i = 0; i < r->n_prompts; i++) {
		printf("%s{\"line\":%u,\"tokens\":%u,\"skipped\":%s,\"prompt\":", i ? "," : "", r->p[i].line,
		       r->tokens[i], r->skipped[i] ? "true" : "false");
		ab_put_json(stdout, r->p[i].text, strlen(r->p[i].text));
		if (r->p[i].system) {
			printf(",\"system\":");
			ab_put_json(stdout, r->p[i].system, strlen(r->p[i].system));
		}
		if (!r->skipped[i]) {
			printf(",\"f16\":");
			json_cont(r, 0, &r->c[i * r->rows]);
			printf(",\"kv\":[");
			for (unsigned j = 1; j < r->rows; j++) {
				printf("%s", j > 1 ? "," : "");
				json_cont(r, j, &r->c[i * r->rows + j]);
			}
			printf("]");
		}
		printf("}");
	}
	printf("]}\n");
}

void ab_report(const struct ab_run *r)
{
	if (o.json)
		json(r);
	else
		markdown(r);
	fflush(stdout);
}
