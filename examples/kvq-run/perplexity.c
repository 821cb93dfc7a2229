/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run perplexity: FILE's perplexity with one KV policy over
 * non-overlapping windows of --ctx tokens, and --dump's logits.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

int cmd_perplexity(void)
{
	uint32_t V, ctx, *ids;
	struct kv k = { 0 };
	size_t n;
	double nll = 0, t0;
	uint64_t scored = 0;
	unsigned windows = 0;
	float *logits;
	FILE *dump = NULL;

	load();
	V = model_cfg(md)->vocab;
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > model_cfg(md)->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	kv_open(&k, o.kv[0] ? o.kv[0] : "f16", ctx, 1);
	logits = malloc(sizeof(float) * V * ctx);
	double *lp = malloc(sizeof(double) * V);
	if (!logits || !lp)
		die("%s", strerror(ENOMEM));
	if (o.dump && !(dump = fopen(o.dump, "wb")))
		die("%s: %s", o.dump, strerror(errno));
	t0 = now_s();
	/* non-overlapping windows of ctx tokens, each a fresh sequence; every
	 * token after a window's first is scored */
	for (size_t a = 0; a + 1 < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		if (w < 2)
			break;
		kv_reset(&k);
		feed(&k, ids + a, w, logits, NULL);
		/* for tools/model-check.py: per window, the count, the ids and
		 * the logits (uint32, uint32[w], float[w][vocab], little-endian) */
		if (dump && (fwrite(&w, 4, 1, dump) != 1 || fwrite(ids + a, 4, w, dump) != w ||
			     fwrite(logits, sizeof(float) * V, w, dump) != w))
			die("%s: %s", o.dump, strerror(errno));
		for (uint32_t i = 0; i + 1 < w; i++) {
			log_softmax(logits + (size_t)i * V, V, lp);
			nll -= lp[ids[a + i + 1]];
			scored++;
		}
		windows++;
	}
	double secs = now_s() - t0, ppl = exp(nll / scored);
	if (o.json)
		printf("{\"file\":\"%s\",\"kv\":\"%s\",\"window\":%u,\"bits_per_value\":%.4f,\"ctx\":%u,"
		       "\"tokens\":%zu,\"windows\":%u,\"scored\":%llu,\"nll\":%.6f,\"ppl\":%.6f,\"seconds\":%.1f,"
		       "\"rotate\":%s,\"k_center\":%s,\"path\":\"%s\"}\n",
		       o.file, k.canon, k.window, k.bits, ctx, n, windows, (unsigned long long)scored, nll / scored, ppl,
		       secs, o.rotate ? "true" : "false", k_center ? "true" : "false", o.gpu ? "gpu" : "cpu");
	else
		printf("%s: kv %s (window %u, %.2f bits/value), ctx %u: %zu tokens, %u window(s), %llu scored: "
		       "perplexity %.4f (%.1f s)\n",
		       o.file, k.canon, k.window, k.bits, ctx, n, windows, (unsigned long long)scored, ppl, secs);
	if (dump && fclose(dump) != 0)
		die("%s: %s", o.dump, strerror(errno));
	free(lp);
	free(logits);
	free(ids);
	kv_close(&k);
	return 0;
}
