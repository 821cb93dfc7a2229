/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The (K format, V format) pairs that have CUDA attention kernels: one row
 * per pair, from which the explicit instances of every compile file, the
 * dispatcher's declarations and its lookup (dispatch.cu) and the write
 * kernels per pair (write.cu) are all generated.  A pair not listed is
 * refused with -ENOTSUP; adding one is a row here.  Every kernel of a row is
 * built for head dims 64 and 128 and FP16/BF16 activations (KVQ_CUDA_EACH).
 *
 * Columns, after the pair: 1 or 0 for each kernel family
 *   attn  attn_kernel (attention.cuh), which takes every shape; a pair
 *         without it is refused (kvq_cuda_attention_supported)
 *   fast  decode_kernel (decode.cuh) and prefill_kernel (prefill.cuh), for
 *         blocks of a multiple of 32 tokens; int4 K needs 4- or 2-bit V
 *         (dec_raw)
 *   pq    pq_decode_kernel (decode_pq.cuh), for the decode steps of a pair
 *         with codebook V (K: a codebook format, or 8 bits by token) in
 *         blocks of a multiple of 32 tokens
 *   sm90  decode90_kernel (decode_sm90.cuh), the Hopper decode kernel that
 *         takes decode_kernel's steps on a device of compute capability
 *         9.0; only in a row with fast, built for sm_90a alone and only
 *         where the build has architecture 90 (KVQ_CUDA_SM90)
 * and the file: the letter of the compile files (attn_inst_a.cu,
 * decode_inst_a.cu, prefill_inst_a.cu, decode_pq_inst_a.cu,
 * decode_sm90_inst_a.cu; or _b) that build the row's instances, so a
 * parallel build splits the work.
 * KVQ_CUDA_PAIRS_EXTRA, when a build defines it, appends rows (the test of
 * a throwaway row, tests/gpu/cuda_row.h).
 */
#ifndef KVQ_CUDA_INSTANCES_H
#define KVQ_CUDA_INSTANCES_H

#ifndef KVQ_CUDA_PAIRS_EXTRA
#define KVQ_CUDA_PAIRS_EXTRA(X, ...)
#endif

/* X(K, V, attn, fast, pq, sm90, file, ...): the arguments after the
 * table's first are passed on to every row. */
#define KVQ_CUDA_PAIR_TABLE(X, ...) \
	/* K         V          attn fast pq sm90 file */ \
	X(F16,       F16,       1,   1,   0, 1,   a, __VA_ARGS__) \
	X(BF16,      BF16,      1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT8,      INT8,      1,   1,   0, 1,   a, __VA_ARGS__) \
	X(FP8,       FP8,       1,   1,   0, 1,   a, __VA_ARGS__) \
	X(FP8E5M2,   FP8E5M2,   1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT8,      FP8,       1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT8,      INT4G32,   1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT8,      INT4G64,   1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT8,      INT4G128,  1,   1,   0, 1,   a, __VA_ARGS__) \
	X(INT4G64,   KIVI2,     1,   1,   0, 1,   a, __VA_ARGS__) \
	X(PQ2,       PQ2,       1,   0,   1, 0,   a, __VA_ARGS__) \
	X(INT8,      PQ2,       1,   0,   1, 0,   a, __VA_ARGS__) \
	X(INT4G32,   INT4G32,   1,   1,   0, 1,   b, __VA_ARGS__) \
	X(INT4G64,   INT4G64,   1,   1,   0, 1,   b, __VA_ARGS__) \
	X(INT4G128,  INT4G128,  1,   1,   0, 1,   b, __VA_ARGS__) \
	X(KIVI4,     KIVI4,     1,   1,   0, 1,   b, __VA_ARGS__) \
	X(KIVI2,     KIVI2,     1,   1,   0, 1,   b, __VA_ARGS__) \
	X(INT8,      KIVI4,     1,   1,   0, 1,   b, __VA_ARGS__) \
	X(INT8,      KIVI2,     1,   1,   0, 1,   b, __VA_ARGS__) \
	X(FP8,       INT4G32,   1,   1,   0, 1,   b, __VA_ARGS__) \
	X(F16,       INT8,      1,   1,   0, 1,   b, __VA_ARGS__) \
	X(PQ1,       PQ1,       1,   0,   1, 0,   b, __VA_ARGS__) \
	X(KIVI4,     PQ2,       1,   0,   0, 0,   b, __VA_ARGS__) \
	KVQ_CUDA_PAIRS_EXTRA(X, __VA_ARGS__)

/* Y(K, V) for every row (write.cu: a write and seal kernel per pair). */
#define KVQ_CUDA_PAIRS(Y) KVQ_CUDA_PAIR_TABLE(KVQ_CUDA_PAIRS_ROW, Y)
#define KVQ_CUDA_PAIRS_ROW(K, V, attn, fast, pq, sm90, file, Y) Y(K, V)

/* The four instances of one pair: Y(KF, VF, D, ACT, ...), the arguments
 * after V passed on. */
#define KVQ_CUDA_EACH(Y, K, V, ...) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 64, KVQ_DT_F16, __VA_ARGS__) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 128, KVQ_DT_F16, __VA_ARGS__) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 64, KVQ_DT_BF16, __VA_ARGS__) \
	Y(KVQ_FMT_##K, KVQ_FMT_##V, 128, KVQ_DT_BF16, __VA_ARGS__)

/* Y(KF, VF, D, ACT, attn, fast, pq, sm90) for every instance of every row
 * (dispatch.cu: the declarations and the lookup). */
#define KVQ_CUDA_ALL(Y) KVQ_CUDA_PAIR_TABLE(KVQ_CUDA_ALL_ROW, Y)
#define KVQ_CUDA_ALL_ROW(K, V, attn, fast, pq, sm90, file, Y) KVQ_CUDA_EACH(Y, K, V, attn, fast, pq, sm90)

/* The explicit instances (`template` declarations) of kernel family FAM
 * (attn, decode, prefill, pq, decode90) for every row whose column for FAM
 * is 1 and whose file is the one being compiled. */
#define KVQ_CUDA_INSTANCES(FAM) KVQ_CUDA_PAIR_TABLE(KVQ_CUDA_INST_ROW, FAM)
#define KVQ_CUDA_INST_ROW(K, V, attn, fast, pq, sm90, file, FAM) \
	KVQ_CUDA_IF(KVQ_CUDA_AND(KVQ_CUDA_COL_##FAM(attn, fast, pq, sm90), KVQ_CUDA_HERE(file)), \
		    KVQ_CUDA_EACH(KVQ_CUDA_DECL_##FAM, K, V, template))
#define KVQ_CUDA_COL_attn(attn, fast, pq, sm90) attn
#define KVQ_CUDA_COL_decode(attn, fast, pq, sm90) fast
#define KVQ_CUDA_COL_prefill(attn, fast, pq, sm90) fast
#define KVQ_CUDA_COL_pq(attn, fast, pq, sm90) pq
#define KVQ_CUDA_COL_decode90(attn, fast, pq, sm90) KVQ_CUDA_AND(fast, sm90)

/* A row's sm90 column as the dispatcher sees it: 0 in a build without
 * architecture 90, whose kernels have no Hopper instances. */
#ifdef KVQ_CUDA_SM90
#define KVQ_CUDA_SM90_COL(fast, sm90) KVQ_CUDA_AND(fast, sm90)
#else
#define KVQ_CUDA_SM90_COL(fast, sm90) 0
#endif

/* The declaration of one instance of each family, written once for the
 * compile files (P: template) and dispatch.cu (P: extern template). */
#define KVQ_CUDA_DECL_attn(KF, VF, D, ACT, P) P int attn_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *);
#define KVQ_CUDA_DECL_decode(KF, VF, D, ACT, P) \
	P int decode_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *); \
	P int decode_occupancy<KF, VF, D, ACT>(void);
#define KVQ_CUDA_DECL_prefill(KF, VF, D, ACT, P) \
	P int prefill_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *); \
	P int prefill_rows<KF, VF, D, ACT>(void);
#define KVQ_CUDA_DECL_pq(KF, VF, D, ACT, P) P int pq_decode_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *);
#define KVQ_CUDA_DECL_decode90(KF, VF, D, ACT, P) \
	P int decode90_launch<KF, VF, D, ACT>(const attn_args &, uint32_t, void *); \
	P int decode90_occupancy<KF, VF, D, ACT>(uint32_t);

/* Conditionals on a row's 0/1 columns. */
#define KVQ_CUDA_CAT(a, b) KVQ_CUDA_CAT_(a, b)
#define KVQ_CUDA_CAT_(a, b) a##b
#define KVQ_CUDA_IF_0(...)
#define KVQ_CUDA_IF_1(...) __VA_ARGS__
#define KVQ_CUDA_IF(flag, ...) KVQ_CUDA_CAT(KVQ_CUDA_IF_, flag)(__VA_ARGS__)
#define KVQ_CUDA_OR_NULL_0(...) NULL
#define KVQ_CUDA_OR_NULL_1(...) __VA_ARGS__
#define KVQ_CUDA_OR_NULL(flag, ...) KVQ_CUDA_CAT(KVQ_CUDA_OR_NULL_, flag)(__VA_ARGS__)
#define KVQ_CUDA_AND_00 0
#define KVQ_CUDA_AND_01 0
#define KVQ_CUDA_AND_10 0
#define KVQ_CUDA_AND_11 1
#define KVQ_CUDA_AND(x, y) KVQ_CUDA_CAT(KVQ_CUDA_AND_, KVQ_CUDA_CAT(x, y))

/* 1 when a row's file is the one being compiled, else 0: a compile file
 * defines KVQ_CUDA_FILE_<its letter> as KVQ_CUDA_THIS_FILE before it
 * includes its family's instance header. */
#define KVQ_CUDA_THIS_FILE ~, 1
#define KVQ_CUDA_SECOND(a, b, ...) b
#define KVQ_CUDA_SECOND_(...) KVQ_CUDA_SECOND(__VA_ARGS__)
#define KVQ_CUDA_PROBE(x) KVQ_CUDA_SECOND_(x, 0, ~)
#define KVQ_CUDA_HERE(file) KVQ_CUDA_PROBE(KVQ_CUDA_CAT(KVQ_CUDA_FILE_, file))

#endif
