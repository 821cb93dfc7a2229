/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab --prompts: KV policies against f16 KV on a file of prompts.
 * Each prompt's greedy continuation with each policy (what kvq-run generate
 * --no-prefix-cache prints), and teacher-forced along f16's: the run is
 * ab_prompts.c, a continuation's own measures ab_cont.c, the report
 * (Markdown or JSON) ab_report.c.
 */
#ifndef KVQ_RUN_AB_H
#define KVQ_RUN_AB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "run.h"

/* One prompt's continuation with one policy. */
struct ab_cont {
	uint32_t *ids, n;   /* greedy continuation, without the stop token */
	uint32_t match;     /* its leading tokens equal to f16's */
	bool exact;         /* equal to f16's, token for token (its stop too) */
	uint32_t tf;        /* teacher-forced positions along f16's continuation */
	uint32_t top1;      /* ... where the top token is f16's */
	double kl;          /* ... KL(f16 || this), summed */
	char *text;         /* decoded (NUL-terminated; len bytes) */
	size_t len;
	bool bad;           /* invalid UTF-8 or U+FFFD in text */
};

/* One policy's totals over the prompts run. */
struct ab_row {
	struct kv k;
	bool control;       /* the bf16 row: a format taken as harmless, the noise floor */
	uint64_t exact, match, tf, top1, ngrams, repeats, gen, bad;
	double kl;
};

struct ab_run {
	const char *file;
	struct prompt *p;
	size_t n_prompts, n_run, n_skipped;
	uint32_t *tokens;       /* [prompt]: its tokens in the template */
	bool *skipped;          /* [prompt]: tokens + --gen beyond --ctx */
	struct ab_row *row;     /* [rows]: row 0 is f16, the reference */
	unsigned rows;
	struct ab_cont *c;      /* [prompt][rows] */
	uint32_t ctx, gen;
	double seconds;
};

/* ab_cont.c */
/* Counts the 4-grams of x[0..n) and those equal to an earlier one. */
void ab_rep4(const uint32_t *x, uint32_t n, uint64_t *ngrams, uint64_t *repeats);
/* The bytes of ids[0..n) decoded, malloc'ed and NUL-terminated. */
char *ab_decode(const uint32_t *ids, uint32_t n, size_t *ret_len);
/* Whether s[0..len) holds invalid UTF-8 or U+FFFD; cut: a character left
 * incomplete at the very end does not count (the token limit cut it). */
bool ab_utf8_bad(const char *s, size_t len, bool cut);
/* s[0..len) as a JSON string, invalid UTF-8 as U+FFFD. */
void ab_put_json(FILE *f, const char *s, size_t len);
/* s[0..len) with invalid UTF-8 as U+FFFD. */
void ab_put_text(FILE *f, const char *s, size_t len);

/* ab_report.c: the report on stdout, Markdown or (--json) JSON. */
void ab_report(const struct ab_run *r);

/* ab_prompts.c: kvq-run ab --prompts; returns the exit status. */
int cmd_ab_prompts(void);

#endif
