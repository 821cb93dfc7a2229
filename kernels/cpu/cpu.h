/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU kernels: the host backend's real path and the reference for the CUDA
 * kernels.  Same contract as the CUDA kernels: write (append into the open
 * window, seal full blocks, prefill straight into sealed slots) and paged
 * attention that reads KV as stored.  A layer whose policy rotates K or V
 * (policy.h, "+rot") has its rows rotated by the write (kvq_rotate) before
 * anything is stored; attention rotates q when K is (rounded to q's own
 * dtype, or to the activation dtype for a float q: the dtype the CUDA
 * kernels take q in), and rotates its output back (in fp32) when V is:
 * callers see no rotation.  All functions are reentrant; none
 * allocates in its loops.  Stack use is about 100 KiB; attention keeps up
 * to 4 MiB of per-thread scratch between calls (decode-sized tiles of all
 * heads, or a codebook format's tables).
 */
#ifndef KVQ_CPU_H
#define KVQ_CPU_H

#include <stdint.h>

#include "../layout.h"

/* Writes one layer of one sequence (struct kvq_seq_table, layout.h): k and
 * v are [rows][kv_heads][head_dim] in the layout's activation dtype, the
 * sequence's new tokens rows w->row0 .. w->row0 + w->m - 1.  Returns 0,
 * -EINVAL (bad ids or counts; nothing written) or -ENOMEM (a rotated layer's
 * rows could not be copied; nothing written). */
int kvq_cpu_write(const struct kvq_layout *L, void *base, uint32_t layer,
		  const struct kvq_seq_table *w, const void *k, const void *v);

/* Seals one full open block into a sealed slot (all heads of one layer). */
int kvq_cpu_seal(const struct kvq_layout *L, void *base, uint32_t layer,
		 uint32_t open_id, uint32_t sealed_id);

struct kvq_attn {
	const struct kvq_layout *L;
	const void *base;
	uint32_t layer;
	uint32_t q_heads;       /* multiple of the layout's kv_heads, at most 64 times it */
	float scale;            /* softmax scale, usually 1/sqrt(head_dim) */
	int q_dtype, out_dtype; /* enum kvq_dtype */
};

/* q and out: rows of [q_heads][head_dim]; sequence i's m queries are rows
 * seqs[i].row0 .. seqs[i].row0 + seqs[i].m - 1 (struct kvq_seq_table).
 * Returns 0, -EINVAL (nothing written) or, for a layer with a codebook
 * format, -ENOMEM when its per-thread tables cannot be allocated (the rows
 * of earlier sequences may be written). */
int kvq_cpu_attention(const struct kvq_attn *a, const struct kvq_seq_table *seqs, uint32_t nseq,
		      const void *q, void *out);

/* Vector paths: "avx2" (x86-64 with AVX2, FMA and F16C) or "portable".
 * The first kernel call picks avx2 where the CPU has it unless the
 * environment variable KVQ_CPU_ISA says "portable".  kvq_cpu_set_isa() takes
 * "auto", "avx2" or "portable"; returns 0 or -ENOTSUP. */
int kvq_cpu_set_isa(const char *name);
const char *kvq_cpu_isa(void);

#endif
