/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run calibrate: K's mean per layer, head and channel over FILE, the
 * file --k-center reads (its format: struct kc_head, run.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

/* K's mean per layer, head and channel over FILE (FP16 KV, windows of
 * --ctx tokens), written to --out for --k-center. */
int cmd_calibrate(void)
{
	const struct model_cfg *c;
	struct kc_head h = { .magic = KC_MAGIC };
	struct kv k = { 0 };
	uint32_t ctx, *ids;
	size_t n, nk;
	FILE *f;

	if (!o.out)
		die("calibrate needs --out PATH");
	if (o.gpu || o.k_center)
		die("calibrate runs on the CPU path, without --k-center");
	want_k_sum = true;
	load();
	c = model_cfg(md);
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > c->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	kv_open(&k, "f16", ctx, 1);
	for (size_t a = 0; a < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		kv_reset(&k);
		feed(&k, ids + a, w, NULL, NULL);
	}
	nk = (size_t)c->layers * c->kv_heads * c->head_dim;
	h.layers = c->layers;
	h.kv_heads = c->kv_heads;
	h.head_dim = c->head_dim;
	h.rotate = o.rotate;
	h.tokens = n;
	h.model_fp = model_fp;
	float *mean = malloc(nk * sizeof(float));
	if (!mean)
		die("%s", strerror(ENOMEM));
	for (size_t i = 0; i < nk; i++)
		mean[i] = (float)(k_sum[i] / (double)n);
	if (!(f = fopen(o.out, "wb")) || fwrite(&h, sizeof(h), 1, f) != 1 || fwrite(mean, sizeof(float), nk, f) != nk ||
	    fclose(f) != 0)
		die("%s: %s", o.out, strerror(errno));
	printf("%s: K means of %u layers x %u heads x %u channels over %zu tokens of %s%s\n", o.out, c->layers,
	       c->kv_heads, c->head_dim, n, o.file, o.rotate ? " (rotated)" : "");
	free(mean);
	free(ids);
	kv_close(&k);
	return 0;
}
