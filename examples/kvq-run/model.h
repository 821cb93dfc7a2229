/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Llama-architecture decoder (RMSNorm, RoPE, grouped-query attention,
 * SwiGLU) over GGUF weights, with its KV cache in a kvqd pool: each layer's
 * K (after RoPE) and V go to kvq_seq_write() and attention is
 * kvq_seq_attention, which reads KV as stored (quantized sealed blocks,
 * FP16 open window), in prefill as in decode.
 */
#ifndef KVQ_RUN_MODEL_H
#define KVQ_RUN_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "kvq.h"

struct model_cfg {
	uint32_t layers, dim, heads, kv_heads, head_dim, ffn, vocab, ctx;
	float eps, rope_base;
};

/* One layer's tensors in the GGUF file. */
struct layer_w {
	const struct gguf_tensor *attn_norm, *q, *k, *v, *o, *ffn_norm, *gate, *up, *down;
};

struct model_opts {
	uint32_t max_batch;   /* tokens per model_forward */
	/* [layers][kv_heads * head_dim] or NULL: subtracted from every K
	 * (after RoPE) before it is written (libkvq rotates it after, +rot).  Attention is
	 * unchanged in exact arithmetic (q.(k - c) differs from q.k by q.c,
	 * the same for every key, which softmax cancels), but per-token
	 * formats no longer spend their range on K's per-channel offsets.
	 * kvq-run calibrate measures c as K's mean over a text. */
	const float *k_center;
	/* [layers][kv_heads * head_dim] or NULL: every K (after
	 * centering) is added here (CPU path), for kvq-run calibrate */
	double *k_sum;
	/* called with each layer's K and V as stored ([n][kv_heads *
	 * head_dim] FP16 as written, after centering; CPU path), for
	 * kvq-run calibrate's codebooks */
	void (*kv_tap)(void *arg, uint32_t layer, uint32_t n, const uint16_t *k, const uint16_t *v);
	void *kv_tap_arg;
	/* >= 0: the layers run on this GPU (model_gpu.h); every sequence
	 * must then be on a cuda pool */
	int gpu;
};

typedef struct model model;

/* The shape of the model in f (general.architecture "llama") without
 * loading it.  Returns 0, or -EINVAL (err says why). */
int model_read_cfg(const gguf_file *f, struct model_cfg *c, char *err, size_t errlen);

/* The model in f (general.architecture "llama").  Returns 0 and
 * *ret_model, -EINVAL (missing or misshapen tensors; err says which),
 * -ENOTSUP, -ENODEV/-EIO (the GPU path could not start; err says why) or
 * -ENOMEM.  f must outlive the model. */
int model_load(const gguf_file *f, const struct model_opts *opts, model **ret_model, char *err, size_t errlen);

/* NULL is fine. */
void model_free(model *m);

const struct model_cfg *model_cfg(const model *m);

/* The GPU path's message about the last failed model_forward, or NULL
 * (then libkvq's kvq_client_error names it). */
const char *model_error(const model *m);

/* Appends tokens[0..n) (1 <= n <= max_batch) to s at positions
 * kvq_seq_tokens(s)...: begin, per layer write + attention, commit.
 * logits gets the last n_out tokens' next-token logits, [n_out][vocab]
 * (n_out <= n; 0 and NULL allowed).  Returns 0 or a libkvq code. */
int model_forward(model *m, kvq_seq *s, const uint32_t *tokens, uint32_t n, uint32_t n_out, float *logits);

#endif
