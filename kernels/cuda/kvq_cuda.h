/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA kernels over the pool layout (kernels/layout.h), the same contract as
 * the CPU kernels (kernels/cpu/cpu.h), which are their reference: write
 * (append into open windows, seal full blocks, prefill straight into sealed
 * slots) and paged attention reading KV as stored.  Everything a kernel reads
 * or writes is in device memory: the pool (base), the per-sequence records
 * and their block tables, q, k, v, out and the workspace.  Every call is
 * asynchronous on the given stream (NULL: the legacy default stream).
 *
 * Returns 0, -EINVAL (bad arguments; nothing launched), -ENOTSUP (a
 * combination without an instantiated kernel; nothing launched) or -EIO (a
 * CUDA error; kvq_cuda_error() names it).  A layer whose policy rotates K
 * or V ("+rot", policy.h) is rotated as the CPU kernels do it, bit for bit
 * (kvq_rotate): the write rotates the rows it takes from k and v (the seal
 * reads rows the write rotated), attention rotates q into the workspace
 * and its output back.  A codebook format (pq2, pq1)
 * reads the pool's codebooks (layout.h), which must be in place before the
 * first write.
 *
 * Block ids in the tables are trusted to be in range (the caller owns them
 * and checks them on the host); a kernel skips, rather than writes through,
 * an id outside the pool.
 */
#ifndef KVQ_CUDA_H
#define KVQ_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes one layer for nseq sequences (struct kvq_seq_table, layout.h: the
 * tables and their ids in device memory); k and v are [rows][kv_heads]
 * [head_dim]; max_m bounds every sequence's m.  Blocks that leave the open window are sealed from the
 * open slot and the input in one pass. */
int kvq_cuda_write(const struct kvq_layout *L, void *base, uint32_t layer,
		   const struct kvq_seq_table *seqs, uint32_t nseq, uint32_t max_m,
		   const void *k, const void *v, void *stream);

/* Seals npairs full open blocks of one layer: pairs (device memory) holds
 * {open id, sealed id} pairs. */
int kvq_cuda_seal(const struct kvq_layout *L, void *base, uint32_t layer,
		  const int32_t *pairs, uint32_t npairs, void *stream);

struct kvq_cuda_attn {
	const struct kvq_layout *L;  /* host copy of the layout */
	const void *base;            /* the pool, device address */
	uint32_t layer;
	uint32_t q_heads;            /* kv_heads * g, g = 1..8 */
	float scale;                 /* softmax scale, finite and > 0 (else -EINVAL) */
	int q_dtype;                 /* the layout's activation dtype */
	int out_dtype;               /* f16, bf16 or f32 */
	uint32_t max_n, max_q;       /* bounds on n and m over the sequences */
	uint32_t total_q;            /* rows of q: at least every row0 + m */
	uint32_t splits;             /* KV splits: 0 chooses, else at most this many */
	void *workspace;             /* device memory for split partials */
	size_t workspace_bytes;
	void *stream;
};

/* Bytes of workspace kvq_cuda_attention needs for these arguments: split
 * partials, and a rotated layer's rotated q and fp32 output (without
 * those, -EINVAL). */
size_t kvq_cuda_attention_workspace(const struct kvq_cuda_attn *a, uint32_t nseq);

/* Paged attention over sealed and open blocks in one launch (plus a merge
 * launch when the KV range is split); decode and prefill alike.  seqs
 * (struct kvq_seq_table) in device memory; q and out are [rows][q_heads]
 * [head_dim]. */
int kvq_cuda_attention(const struct kvq_cuda_attn *a, const struct kvq_seq_table *seqs, uint32_t nseq,
		       const void *q, void *out);

/* Which kernel kvq_cuda_attention launches for these arguments: "decode"
 * (decode_kernel), "decode-sm90" (decode90_kernel, on a Hopper GPU),
 * "prefill" (prefill_kernel), "pq-decode" (pq_decode_kernel) or "generic"
 * (attn_kernel),
 * and in *splits (may be NULL) its KV splits; NULL for arguments it refuses
 * or a pair without a kernel. */
const char *kvq_cuda_attention_plan(const struct kvq_cuda_attn *a, uint32_t nseq, uint32_t *splits);

/* 1 if attention has a kernel for this layer's (K, V) formats, head dim and
 * activation dtype, else 0. */
int kvq_cuda_attention_supported(int kfmt, int vfmt, uint32_t head_dim, int act);

/* Name of the last CUDA error of the calling thread ("no error" if none). */
const char *kvq_cuda_error(void);

/* The kernel family attention may take, from the environment variable
 * KVQ_CUDA_KERNELS, read once per process: "auto" (the default: the sm_80
 * kernels on every device, the fastest measured) or "sm90" (the Hopper
 * decode kernel where a pair has it, instances.h's sm90, on a device of
 * compute capability 9.0, in a build with architecture 90). */
const char *kvq_cuda_kernels(void);

#ifdef __cplusplus
}
#endif

#endif
