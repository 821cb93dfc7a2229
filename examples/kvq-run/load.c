/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: the model: the GGUF file, its tokenizer and layers, the
 * fingerprint that names its pools, and the K centers of --k-center.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "mm.h"
#include "model_gpu.h"
#include "run.h"

static gguf_file *gf;
tok *tk;
model *md;
uint64_t model_fp;
char model_name[96];   /* general.name, blanks as '-' (the pool's model id) */
float *k_center;       /* --k-center */
uint32_t k_center_hash;
double *k_sum;         /* calibrate */
bool want_k_sum;
void (*kv_tap)(void *arg, uint32_t layer, uint32_t n, const uint16_t *k, const uint16_t *v);
void *kv_tap_arg;
static struct model_cfg cfg;  /* the model file's shape (before the model loads) */

/* Reads --k-center for this model (geometry and fingerprint must match the
 * calibration; K means of rotated K, from an earlier kvq-run that rotated
 * K itself, are refused: K is centered before libkvq rotates it now). */
static void read_k_center(void)
{
	struct kc_head h;
	uint32_t L = cfg.layers, H = cfg.kv_heads, D = cfg.head_dim;
	FILE *f = fopen(o.k_center, "rb");
	size_t n;

	if (!f)
		die("--k-center %s: %s", o.k_center, strerror(errno));
	if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, KC_MAGIC, 8))
		die("--k-center %s: not a kvq-run calibrate file", o.k_center);
	if (h.layers != L || h.kv_heads != H || h.head_dim != D || h.model_fp != model_fp)
		die("--k-center %s: calibrated for another model", o.k_center);
	if (h.rotate)
		die("--k-center %s: means of K that an earlier kvq-run rotated itself; --rotate is the policy's "
		    "+rot now and K is centered before it: calibrate again", o.k_center);
	n = (size_t)L * H * D;
	k_center = malloc(n * sizeof(float));
	if (!k_center)
		die("%s", strerror(ENOMEM));
	if (fread(k_center, sizeof(float), n, f) != n || fgetc(f) != EOF)
		die("--k-center %s: truncated or too long", o.k_center);
	fclose(f);
	k_center_hash = 2166136261u;
	for (size_t i = 0; i < n * sizeof(float); i++)
		k_center_hash = (k_center_hash ^ ((const uint8_t *)k_center)[i]) * 16777619u;
	for (size_t i = 0; i < n; i++)
		if (!isfinite(k_center[i]))
			die("--k-center %s: not finite", o.k_center);
}

/* A fingerprint of the weights for the pool's model id: size and a sample
 * of the tensor bytes. */
static uint64_t fingerprint(void)
{
	const struct gguf_tensor *t = gguf_tensor(gf, "token_embd.weight");
	uint64_t h = 0xcbf29ce484222325ull;
	size_t n = t->row_bytes * t->rows;

	for (size_t i = 0; i < n; i += 4099)
		h = (h ^ t->data[i]) * 0x100000001b3ull;
	return h ^ n;
}

void load(void)
{
	const char *path = o.model ? o.model : getenv("KVQ_MODEL");
	struct gguf_str name;
	char err[256] = "";
	int r;

	if (!path)
		die("no model: --model PATH or KVQ_MODEL (tools/fetch-model.sh fetches it)");
	r = gguf_open(path, &gf, err, sizeof(err));
	if (r < 0)
		die("%s", err);
	model_fp = fingerprint();
	if (model_read_cfg(gf, &cfg, err, sizeof(err)) < 0)
		die("%s: %s", path, err);
	if (o.k_center)
		read_k_center();
	if (want_k_sum && !(k_sum = calloc((size_t)cfg.layers * cfg.kv_heads * cfg.head_dim, sizeof(double))))
		die("%s", strerror(ENOMEM));
	/* generate's step rows (--step-tokens), else a prompt chunk */
	struct model_opts mo = { .max_batch = o.step_tokens > o.batch ? o.step_tokens : o.batch,
		.k_center = k_center, .k_sum = k_sum,
		.kv_tap = kv_tap, .kv_tap_arg = kv_tap_arg, .gpu = o.gpu ? o.device : -1,
		.gpu_flags = (o.tf32 ? GPU_FWD_TF32 : 0) | (o.no_graphs ? GPU_FWD_NO_GRAPHS : 0) |
			     (o.fp16 ? GPU_FWD_F16 : 0) };
	if (tok_new(gf, &tk, err, sizeof(err)) < 0 || model_load(gf, &mo, &md, err, sizeof(err)) < 0)
		die("%s: %s", path, err);
	if (gguf_get_str(gf, "general.name", &name) < 0 || name.len == 0)
		name = (struct gguf_str){ "model", 5 };
	for (uint32_t i = 0; i < name.len && i + 1 < sizeof(model_name); i++)
		model_name[i] = name.p[i] > ' ' && name.p[i] < 127 ? name.p[i] : '-';
	mm_set_threads(o.threads);
}
