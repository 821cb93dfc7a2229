/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Llama-architecture decoder (RMSNorm, RoPE, grouped-query attention,
 * SwiGLU) over GGUF weights, with its KV cache in a kvqd pool, a step over
 * a batch of sequences at a time (one sequence is a batch of one): each
 * layer's K (after RoPE) and V go to kvq_batch_write() and attention is
 * kvq_batch_attention, which reads KV as stored (quantized sealed blocks,
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
	uint32_t max_batch;   /* rows (tokens of all sequences) per model_step */
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
	unsigned gpu_flags;   /* model_gpu.h's GPU_FWD_* */
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

/* The GPU path's CUDA stream (a cudaStream_t) for the clients of its
 * sequences (kvq_client_set_stream), or NULL on the CPU path. */
void *model_stream(const model *m);

/* The GPU path's message about the last failed model_step, or NULL
 * (then libkvq's kvq_client_error names it). */
const char *model_error(const model *m);

/* One sequence's part of a step (model_step). */
struct model_seq {
	kvq_seq *s;
	const uint32_t *tokens;   /* its new tokens, at positions kvq_seq_tokens(s)... */
	uint32_t n;               /* how many, >= 1 */
	uint32_t n_out;           /* next-token logits wanted of its last n_out tokens (<= n) */
};

/* Seconds of the last step: the whole step, and libkvq's K/V write
 * and attention within it (on the GPU path timed by events on the stream,
 * so queued work is counted where it runs); where the step's time went
 * on the host: its rows (embeddings), kvq_batch_begin, the layers (on the
 * GPU path until their last kernel ended), kvq_batch_commit and the output
 * (logits or greedy ids);
 * on the GPU path span is the layers' time on the GPU, first copy to last
 * kernel. */
struct model_times {
	double step, write, attention;
	double rows, begin, layers, commit, out, span;
};

/*
 * One step over a batch: each of seq[0..nseq) (sequences of b's client,
 * each once, their rows together at most max_batch) appends its tokens.
 * The rows of all of them go through each projection and the MLP as one
 * matrix; each layer's K/V and attention are one kvq_batch_write and one
 * kvq_batch_attention on b, the step one kvq_batch_begin and one commit.
 * A sequence's rows are computed as they would be alone (the products are
 * row by row; libkvq's attention on a host pool is per sequence).
 * logits gets every sequence's n_out rows in order, [sum n_out][vocab]
 * (NULL when that is 0).  b is empty before and after.  Returns 0 or a
 * libkvq code (the step then abandoned).
 */
int model_step(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, float *logits);

/* model_step, returning only each wanted row's greedy choice into ids
 * ([sum n_out]; the first of equal maxima, as argmax()): on the GPU path
 * chosen on the device, so a decode step copies back a token a sequence,
 * not its logits. */
int model_step_greedy(model *m, kvq_batch *b, const struct model_seq *seq, uint32_t nseq, uint32_t *ids);

/* The times of the last model_step or model_step_greedy. */
const struct model_times *model_times(const model *m);

#endif
