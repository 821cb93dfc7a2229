/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU kernels: the host backend's real path and the reference for the CUDA
 * kernels.  Same contract as the CUDA kernels: write (append into the open
 * window, seal full blocks, prefill straight into sealed slots) and paged
 * attention that reads KV as stored.  All functions are reentrant; none
 * allocates in its loops.  Stack use is about 100 KiB; attention keeps up
 * to 4 MiB of per-thread scratch between calls (decode-sized tiles of all heads).
 */
#ifndef KVQ_CPU_H
#define KVQ_CPU_H

#include <stdint.h>

#include "../layout.h"

/*
 * One sequence's write of m new tokens after n stored ones.  Blocks are
 * numbered from the sequence's start (block b holds positions b*B .. b*B+B-1).
 *  sealed: ids of blocks 0 .. S(n+m)/B - 1 (only blocks S(n)/B .. are written)
 *  open:   open[j] is the open id of block S(n)/B + j, for every block up to
 *          the last one holding a token (ceil((n+m)/B) - S(n)/B entries);
 *          -1 where a block goes straight from the input to its sealed slot.
 * After the write the sequence's open ids start at open + (S(n+m) - S(n))/B;
 * the open slots before that were sealed and may be released.
 */
struct kvq_seq_write {
	uint32_t n, m;
	const int32_t *sealed;
	const int32_t *open;
};

/* Writes one layer: k and v are [m][kv_heads][head_dim] in the layout's
 * activation dtype.  Returns 0 or -EINVAL (bad ids or counts; nothing written). */
int kvq_cpu_write(const struct kvq_layout *L, void *base, uint32_t layer,
		  const struct kvq_seq_write *w, const void *k, const void *v);

/* Seals one full open block into a sealed slot (all heads of one layer). */
int kvq_cpu_seal(const struct kvq_layout *L, void *base, uint32_t layer,
		 uint32_t open_id, uint32_t sealed_id);

/* A sequence as attention sees it: n tokens stored, the last n_q of them are
 * queries (query i at position n - n_q + i sees positions <= its own).
 * sealed: S(n)/B ids; open: ceil((n - S(n))/B) ids. */
struct kvq_attn_seq {
	uint32_t n, n_q;
	const int32_t *sealed;
	const int32_t *open;
};

struct kvq_attn {
	const struct kvq_layout *L;
	const void *base;
	uint32_t layer;
	uint32_t q_heads;       /* multiple of the layout's kv_heads, at most 64 times it */
	float scale;            /* softmax scale, usually 1/sqrt(head_dim) */
	int q_dtype, out_dtype; /* enum kvq_dtype */
};

/* q and out: for each sequence in turn, n_q rows of [q_heads][head_dim].
 * Returns 0 or -EINVAL (nothing written). */
int kvq_cpu_attention(const struct kvq_attn *a, const struct kvq_attn_seq *seqs, uint32_t nseq,
		      const void *q, void *out);

/* Vector paths: "avx2" (x86-64 with AVX2, FMA and F16C) or "portable".
 * The first kernel call picks avx2 where the CPU has it unless the
 * environment variable KVQ_CPU_ISA says "portable".  kvq_cpu_set_isa() takes
 * "auto", "avx2" or "portable"; returns 0 or -ENOTSUP. */
int kvq_cpu_set_isa(const char *name);
const char *kvq_cpu_isa(void);

#endif
