/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run generate: its sequences (each a chat prompt, or a continuation
 * point of FILE), the steps that run them together as one batch
 * (gen_batch.c) and the report of what the steps took (gen_report.c).
 */
#ifndef KVQ_RUN_GEN_H
#define KVQ_RUN_GEN_H

#include "run.h"

/* One sequence of the run. */
struct gen_seq {
	uint32_t *ids, n;      /* its prompt (owned by the run's inputs, maybe shared) */
	unsigned from;         /* --prompts: its line in the file; FILE: its first token's offset */
	uint32_t hit;          /* prompt tokens found in the prefix cache */
	uint32_t fed;          /* prompt tokens in the sequence, the hit's included */
	uint32_t *out, g;      /* the tokens generated (out: --max-tokens entries) */
	uint32_t next;         /* the last of them, fed at the next step */
	bool done;
	kvq_seq *s;            /* NULL once done: freed as a server frees a finished one */
};

/* Steps by what their rows were: prompt chunks only, decode only, both. */
enum { GEN_PREFILL, GEN_DECODE, GEN_MIXED, GEN_KINDS };

/* What a run's steps took. */
struct gen_figs {
	uint32_t steps[GEN_KINDS];
	uint64_t rows[GEN_KINDS];
	struct model_times t[GEN_KINDS];   /* the steps' model_times summed by kind */
	double *decode_ms;     /* each decode step's latency */
	uint32_t n_decode_ms;
	uint64_t kv_peak;      /* bytes the live sequences' blocks held, the most after a step */
	uint64_t kv_peak_tokens;  /* the tokens they held then */
	double t_prefilled;    /* seconds until the last prompt was in (its first token chosen) */
	double t_lookup;       /* seconds of the prompts' prefix lookups before the steps (a remote
	                        * tier's fetch among them: kvqd answers a lookup once it holds the hit) */
	double t_total;
	uint64_t generated;
};

/* gen_batch.c: runs seq[0..n) (their sequences made, prefix hits taken)
 * to the end as one batch on k: at most budget rows a step, every
 * decoding sequence's token first, then prompt chunks (chunk_len) as they
 * fit; greedy, stopping at stop (>= 0), the end-of-sequence token (unless
 * --ignore-eos: a measurement wants every sequence's --max-tokens) or
 * --max-tokens.  With print, sequence 0's tokens are printed as they come.
 * die()s on a failed step. */
void gen_run(struct kv *k, struct gen_seq *seq, uint32_t n, uint32_t budget, int stop, bool print,
	     struct gen_figs *f);

/* gen_report.c: the run's figures on stderr (and every sequence's
 * continuation on stdout, for more than one), or all of it as JSON on
 * stdout (--json). */
void gen_report(const struct kv *k, const struct gen_seq *seq, uint32_t n, uint32_t budget,
		const struct gen_figs *f);

#endif
