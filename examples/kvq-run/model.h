/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Llama-architecture decoder (RMSNorm, RoPE, grouped-query attention,
 * SwiGLU) over GGUF weights, with its KV cache in a kvqd pool: each layer's
 * K (after RoPE) and V go to kvq_seq_write and attention is
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

typedef struct model model;

/* The model in f (general.architecture "llama"); at most max_batch tokens
 * per model_forward.  Returns 0 and *ret_model, -EINVAL (missing or
 * misshapen tensors; err says which), -ENOTSUP or -ENOMEM.  f must outlive
 * the model. */
int model_load(const gguf_file *f, uint32_t max_batch, model **ret_model, char *err, size_t errlen);

/* NULL is fine. */
void model_free(model *m);

const struct model_cfg *model_cfg(const model *m);

/* Appends tokens[0..n) (1 <= n <= max_batch) to s at positions
 * kvq_seq_tokens(s)...: begin, per layer write + attention, commit.
 * logits gets the last n_out tokens' next-token logits, [n_out][vocab]
 * (n_out <= n; 0 and NULL allowed).  Returns 0 or a libkvq code. */
int model_forward(model *m, kvq_seq *s, const uint32_t *tokens, uint32_t n, uint32_t n_out, float *logits);

#endif
