/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's layers on the GPU: weights dequantized once into device
 * memory (f32), matrix products by cuBLAS (loaded at run time, so kvq-run
 * runs without it on the CPU path), RMSNorm, RoPE, SwiGLU and conversions by
 * the small kernels of model_gpu.cu, K/V written and attention computed by
 * libkvq on a cuda pool (kvq_seq_write() with device pointers,
 * kvq_seq_attention_device: the project's CUDA kernels, KV read as stored).
 * All work is on the legacy default stream, the one libkvq uses unless told
 * otherwise, so it runs in order with libkvq's.
 */
#ifndef KVQ_RUN_MODEL_GPU_H
#define KVQ_RUN_MODEL_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kvq.h"

#ifdef __cplusplus
extern "C" {
#endif

struct model_cfg;
struct layer_w;
typedef struct gpu_fwd gpu_fwd;

/* Uploads the weights (lw: cfg->layers entries) and k_center (NULL or
 * [layers][kv_heads * head_dim], model.h) on device dev; buffers for
 * max_batch tokens.  Returns 0 and *ret, -ENODEV/-EIO (no GPU, no cuBLAS, a
 * CUDA error; err says which) or -ENOMEM. */
int gpu_fwd_new(const struct model_cfg *cfg, const struct layer_w *lw, const struct gguf_tensor *out_norm,
		const struct gguf_tensor *out, const float *k_center, uint32_t max_batch, int dev, gpu_fwd **ret,
		char *err, size_t errlen);

void gpu_fwd_free(gpu_fwd *g);

/* The layers for n tokens at positions pos0.. whose embeddings x (host,
 * [n][dim]) are given, between kvq_seq_begin and kvq_seq_commit of s (a
 * sequence on a cuda pool); k_center, if given, is subtracted from K.  Returns 0 or a negative code (err
 * filled). */
int gpu_fwd_layers(gpu_fwd *g, kvq_seq *s, const float *x, uint32_t n, uint32_t pos0);

/* Next-token logits [n_out][vocab] (host) of the last n_out of the n tokens
 * of the last gpu_fwd_layers. */
int gpu_fwd_logits(gpu_fwd *g, uint32_t n, uint32_t n_out, float *logits);

/* The message of the last failure. */
const char *gpu_fwd_error(const gpu_fwd *g);

#ifdef __cplusplus
}
#endif

#endif
