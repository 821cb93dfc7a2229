/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The model's layers on the GPU: weights dequantized once into device
 * memory (f32), matrix products by cuBLAS (loaded at run time, so kvq-run
 * runs without it on the CPU path), RMSNorm, RoPE, SwiGLU and conversions by
 * the small kernels of model_gpu.cu, K/V written and attention computed by
 * libkvq on a cuda pool for a step's whole batch (kvq_batch_write() with
 * device pointers, kvq_batch_attention_device: the project's CUDA kernels,
 * KV read as stored).
 * The model's work runs on a blocking stream of its own (gpu_fwd_stream),
 * which kvq-run gives its clients too (kvq_client_set_stream), so libkvq's
 * kernels queue behind the model's with no wait between streams; a client
 * left on the legacy default stream still runs in order with it.  The
 * stretches of each layer
 * between libkvq's calls are CUDA graphs, captured once for a step's row
 * count and replayed while steps keep it (decode), so a step costs the
 * host a few launches a layer.
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

/* gpu_fwd_new's flags: the products in TF32 on tensor cores (each input
 * rounded to 10 mantissa bits; plain FP32 otherwise, as the CPU path);
 * every stretch queued kernel by kernel, no graphs; the weight matrices
 * and the products' inputs in FP16 (rounded to nearest), the products on
 * tensor cores with FP32 sums (TF32 then has no effect). */
enum { GPU_FWD_TF32 = 1, GPU_FWD_NO_GRAPHS = 2, GPU_FWD_F16 = 4 };

/* Uploads the weights (lw: cfg->layers entries; q, k and v stacked into
 * one matrix, gate and up into one) and k_center (NULL or [layers]
 * [kv_heads * head_dim], model.h) on device dev; buffers for max_batch
 * rows.  Returns 0 and *ret, -ENODEV/-EIO (no GPU, no cuBLAS, a CUDA
 * error; err says which) or -ENOMEM. */
int gpu_fwd_new(const struct model_cfg *cfg, const struct layer_w *lw, const struct gguf_tensor *out_norm,
		const struct gguf_tensor *out, const float *k_center, uint32_t max_batch, int dev, unsigned flags,
		gpu_fwd **ret, char *err, size_t errlen);

void gpu_fwd_free(gpu_fwd *g);

/* The layers for the n rows of a step of b (a batch on a cuda pool,
 * between kvq_batch_begin and kvq_batch_commit; the sequences' rows packed
 * as kvq_batch_indptr says) whose embeddings x ([n][dim]) and positions
 * pos ([n]) are given in host memory: each product one cuBLAS call over
 * all n rows (q, k and v one call, gate and up one), each layer's K/V write and attention one kvq_batch_write and
 * one kvq_batch_attention_device; k_center, if given, is subtracted from
 * K.  Returns 0 or a negative code: a CUDA or cuBLAS failure's with
 * gpu_fwd_error filled, libkvq's with it empty (kvq_client_error names
 * that). */
int gpu_fwd_layers(gpu_fwd *g, kvq_batch *b, const float *x, uint32_t n, const uint32_t *pos);

/* Next-token logits [n_out][vocab] (host) of the rows rows[0..n_out)
 * (host) of the last gpu_fwd_layers, as one product. */
int gpu_fwd_logits(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, float *logits);

/* The greedy choice (the first of equal maxima) of each of those rows'
 * logits, chosen on the device: ids [n_out] (host). */
int gpu_fwd_greedy(gpu_fwd *g, const uint32_t *rows, uint32_t n_out, uint32_t *ids);

/* Seconds the last gpu_fwd_layers spent in libkvq's K/V writes and in its
 * attention, from event pairs on the stream around each call, and from
 * its first copy to its last kernel (the layers' span on the GPU). */
void gpu_fwd_times(const gpu_fwd *g, double *ret_write, double *ret_attention, double *ret_span);

/* The model's stream (a cudaStream_t), for kvq_client_set_stream. */
void *gpu_fwd_stream(const gpu_fwd *g);

/* The message of the last failure. */
const char *gpu_fwd_error(const gpu_fwd *g);

#ifdef __cplusplus
}
#endif

#endif
