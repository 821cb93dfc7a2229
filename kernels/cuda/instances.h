/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The (K format, V format) pairs that have attention kernels, each built for
 * head dims 64 and 128 and FP16/BF16 activations.  Two halves, compiled in
 * two files (attn_inst_a.cu, attn_inst_b.cu) so a parallel build splits the
 * work.  A pair not listed is refused with -ENOTSUP; adding one is a line here.
 * Each listed pair also has its own append/seal kernel (write.cu); others
 * are written by the one that chooses the format per part.
 */
#ifndef KVQ_CUDA_INSTANCES_H
#define KVQ_CUDA_INSTANCES_H

#define KVQ_CUDA_PAIRS_A(X) \
	X(F16, F16) X(BF16, BF16) X(INT8, INT8) X(FP8, FP8) X(FP8E5M2, FP8E5M2) \
	X(INT8, FP8) X(INT8, INT4G32) X(INT8, INT4G64) X(INT8, INT4G128) X(INT4G64, KIVI2) \
	X(PQ2, PQ2) X(INT8, PQ2)

#define KVQ_CUDA_PAIRS_B(X) \
	X(INT4G32, INT4G32) X(INT4G64, INT4G64) X(INT4G128, INT4G128) X(KIVI4, KIVI4) X(KIVI2, KIVI2) \
	X(INT8, KIVI4) X(INT8, KIVI2) X(FP8, INT4G32) X(F16, INT8) X(PQ1, PQ1) X(KIVI4, PQ2)

#define KVQ_CUDA_PAIRS(X) KVQ_CUDA_PAIRS_A(X) KVQ_CUDA_PAIRS_B(X)

/* Pairs (of the lists above) that also have the fast kernels for blocks of
 * a multiple of 32 tokens: decode (decode.cuh, compiled in decode_inst_a.cu
 * and decode_inst_b.cu, one half each) and prefill (prefill.cuh,
 * prefill_inst_a.cu and prefill_inst_b.cu).  A pair with int4 K needs 4- or
 * 2-bit V (dec_raw). */
#define KVQ_CUDA_FAST_PAIRS_A(X) \
	X(F16, F16) X(BF16, BF16) X(INT8, INT8) X(FP8, FP8) X(FP8E5M2, FP8E5M2) X(INT8, FP8) X(F16, INT8) \
	X(INT8, INT4G32) X(INT8, INT4G64) X(INT8, INT4G128) X(INT4G64, KIVI2)

#define KVQ_CUDA_FAST_PAIRS_B(X) \
	X(INT4G32, INT4G32) X(INT4G64, INT4G64) X(INT4G128, INT4G128) X(KIVI4, KIVI4) X(KIVI2, KIVI2) \
	X(INT8, KIVI4) X(INT8, KIVI2) X(FP8, INT4G32)

#define KVQ_CUDA_FAST_PAIRS(X) KVQ_CUDA_FAST_PAIRS_A(X) KVQ_CUDA_FAST_PAIRS_B(X)

/* Pairs (of the lists above) with codebook V whose decode steps take
 * pq_decode_kernel (decode_pq.cuh, compiled in decode_pq_inst.cu) in blocks
 * of a multiple of 32 tokens (K: a codebook format, or 8 bits by token);
 * their other shapes take attn_kernel. */
#define KVQ_CUDA_PQ_PAIRS(X) X(PQ2, PQ2) X(PQ1, PQ1) X(INT8, PQ2)

/* The four instances of one pair. */
#define KVQ_CUDA_EACH(Y, K, V) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 64, KVQ_DT_F16) Y(KVQ_FMT_##K, KVQ_FMT_##V, 128, KVQ_DT_F16) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 64, KVQ_DT_BF16) Y(KVQ_FMT_##K, KVQ_FMT_##V, 128, KVQ_DT_BF16)

#endif
