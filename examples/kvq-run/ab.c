/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run ab: KV policies against f16 KV on the same text, in step: the
 * perplexity, KL divergence and top-1 agreement of their next-token
 * distributions, and greedy continuations (repeated 4-grams, agreement).
 * With --prompts FILE: ab_prompts.c.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab.h"

struct ab_stat {
	double nll, kl;
	uint64_t top1;
	/* greedy continuations */
	uint64_t ngrams, repeats, gen, match;
};

int cmd_ab(void)
{
	uint32_t V, ctx, *ids, nk = o.n_kv + 1, gp = o.gen ? o.gen_prompts : 0;
	struct kv k[RUN_MAX_KV + 1] = { { 0 } };
	struct ab_stat st[RUN_MAX_KV + 1] = { { 0 } };
	uint64_t scored = 0;
	size_t n;
	double t0, *lr, *lq, *pref;
	float **logits;
	uint32_t *cont[RUN_MAX_KV + 1];

	if (o.prompts)
		return cmd_ab_prompts();
	if (o.n_kv == 0)
		die("ab needs --kv POLICY");
	load();
	V = model_cfg(md)->vocab;
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx + o.gen > model_cfg(md)->ctx)
		die("--ctx between 2 and the model's context less --gen");
	if (o.score_from + 1 >= ctx)
		die("--score-from %u leaves nothing to score in windows of %u tokens", o.score_from, ctx);
	ids = file_tokens(&n);
	logits = calloc(nk, sizeof(*logits));
	lr = malloc(sizeof(double) * V);
	lq = malloc(sizeof(double) * V);
	pref = malloc(sizeof(double) * V);
	if (!logits || !lr || !lq || !pref)
		die("%s", strerror(ENOMEM));
	for (uint32_t j = 0; j < nk; j++) {
		kv_open(&k[j], j == 0 ? "f16" : o.kv[j - 1], ctx + o.gen, 1);
		logits[j] = malloc(sizeof(float) * V * (size_t)o.batch);
		cont[j] = malloc(sizeof(uint32_t) * (o.gen + 1));
		if (!logits[j] || !cont[j])
			die("%s", strerror(ENOMEM));
	}
	t0 = now_s();
	for (size_t a = 0; a + 1 < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		if (w < 2)
			break;
		for (uint32_t j = 0; j < nk; j++)
			kv_reset(&k[j]);
		/* chunk by chunk, every policy in step, so logits need not be kept */
		for (uint32_t c0 = 0; c0 < w; c0 += o.batch) {
			uint32_t m = w - c0 < o.batch ? w - c0 : o.batch;

			for (uint32_t j = 0; j < nk; j++)
				feed(&k[j], ids + a + c0, m, logits[j], NULL);
			for (uint32_t i = c0 < o.score_from ? o.score_from - c0 : 0; i < m && c0 + i + 1 < w; i++) {
				uint32_t tgt = ids[a + c0 + i + 1];
				const float *ref = logits[0] + (size_t)i * V;
				uint32_t top_ref = argmax(ref, V);

				log_softmax(ref, V, lr);
				for (uint32_t v = 0; v < V; v++)
					pref[v] = exp(lr[v]);
				st[0].nll -= lr[tgt];
				for (uint32_t j = 1; j < nk; j++) {
					const float *q = logits[j] + (size_t)i * V;
					double kl = 0;

					log_softmax(q, V, lq);
					st[j].nll -= lq[tgt];
					for (uint32_t v = 0; v < V; v++)
						kl += pref[v] * (lr[v] - lq[v]);
					st[j].kl += kl;
					st[j].top1 += argmax(q, V) == top_ref;
				}
				scored++;
			}
		}
	}
	/* greedy continuations from gp prompts spread over the text (each the
	 * 256 tokens before its point) */
	for (uint32_t p = 0; p < gp; p++) {
		size_t end = 256 + (n > 512 ? (n - 256) * (p + 1) / (gp + 1) : 0);
		uint32_t plen = (uint32_t)(end < n ? 256 : n - (n > 256 ? n - 256 : 0)), g[RUN_MAX_KV + 1];
		const uint32_t *pr = ids + (end < n ? end : n) - plen;

		for (uint32_t j = 0; j < nk; j++) {
			kv_reset(&k[j]);
			feed(&k[j], pr, plen, NULL, logits[j]);
			g[j] = greedy(&k[j], logits[j], o.gen, -1, cont[j], NULL);
			ab_rep4(cont[j], g[j], &st[j].ngrams, &st[j].repeats);
			st[j].gen += g[j];
			for (uint32_t i = 0; i < g[j] && i < g[0] && cont[j][i] == cont[0][i]; i++)
				st[j].match++;
		}
	}
	if (!scored)
		die("%s: no window reaches --score-from %u", o.file, o.score_from);
	double secs = now_s() - t0, ppl_ref = exp(st[0].nll / scored);
	if (o.json)
		printf("{\"file\":\"%s\",\"ctx\":%u,\"block\":%u,\"score_from\":%u,\"tokens\":%zu,\"scored\":%llu,\"seconds\":%.1f,\"gen\":%u,"
		       "\"gen_prompts\":%u,\"rotate\":%s,\"sink\":%s,\"k_center\":%s,\"path\":\"%s\",\"ref\":{\"kv\":\"f16\","
		       "\"window\":%u,\"bits_per_value\":%.4f,\"ppl\":%.6f,\"rep4\":%.4f},\"results\":[",
		       o.file, ctx, o.block, o.score_from, n, (unsigned long long)scored, secs, o.gen, gp, o.rotate ? "true" : "false",
		       o.sink ? "true" : "false",
		       k_center ? "true" : "false", o.gpu ? "gpu" : "cpu", k[0].window, k[0].bits, ppl_ref,
		       st[0].ngrams ? (double)st[0].repeats / st[0].ngrams : 0.0);
	else
		printf("%s: ctx %u, %zu tokens, %llu scored; f16 KV perplexity %.4f (%.1f s)\n", o.file, ctx, n,
		       (unsigned long long)scored, ppl_ref, secs);
	for (uint32_t j = 1; j < nk; j++) {
		double ppl = exp(st[j].nll / scored), d = 100.0 * (ppl - ppl_ref) / ppl_ref;
		double kl = st[j].kl / scored, top1 = (double)st[j].top1 / scored;
		double r4 = st[j].ngrams ? (double)st[j].repeats / st[j].ngrams : 0.0, r4ref =
			st[0].ngrams ? (double)st[0].repeats / st[0].ngrams : 0.0;
		double match = st[0].gen ? (double)st[j].match / st[0].gen : 0.0;

		if (o.json)
			printf("%s{\"kv\":\"%s\",\"window\":%u,\"bits_per_value\":%.4f,\"seq_bits_per_value\":%.4f,"
			       "\"ppl\":%.6f,\"dppl_pct\":%.4f,\"kl\":%.6f,\"top1\":%.6f,\"rep4\":%.4f,\"cont_match\":%.4f}",
			       j > 1 ? "," : "", k[j].canon, k[j].window, k[j].bits, k[j].seq_bits, ppl, d, kl, top1, r4,
			       match);
		else
			printf("  kv %-32s window %3u  %5.2f bits/value (%5.2f at 2048 tokens)  ppl %.4f (%+.3f%%)  "
			       "KL %.5f  top-1 %.2f%%  repeated 4-grams %.1f%% (f16 %.1f%%)  continuation = f16 for "
			       "%.1f%% of tokens\n", k[j].canon, k[j].window, k[j].bits, k[j].seq_bits, ppl, d, kl,
			       100 * top1, 100 * r4, 100 * r4ref, 100 * match);
	}
	if (o.json)
		printf("]}\n");
	for (uint32_t j = 0; j < nk; j++) {
		free(logits[j]);
		free(cont[j]);
		kv_close(&k[j]);
	}
	free(logits);
	free(lr);
	free(lq);
	free(pref);
	free(ids);
	return 0;
}
