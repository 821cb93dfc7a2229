/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A new (K, V) pair of the CUDA kernels is one row of kernels/cuda/
 * instances.h: this test's build adds two throwaway rows (tests/gpu/
 * cuda_row.h, force-included into its own copy of dispatch.cu and into
 * cuda_row_inst.cu, the file the rows name) with no other edit, links them
 * with the library's other kernel objects, and shows through the
 * dispatcher's public calls, on the host, that each row's pair is
 * supported and gets the kernels its flags name at the shapes that take
 * them, and that the table's own rows are still found.  The rows' device
 * code is built as PTX only (the same templates every row compiles to
 * cubins in the library): this test runs no kernel and needs no GPU.
 */
#include <config.h>

#include <stdio.h>
#include <string.h>

#include "cuda/kvq_cuda.h"
#include "policy.h"
#include "../tap.h"

#ifndef KVQ_TEST_CUDA_ROW_H
#error "build with -include tests/gpu/cuda_row.h"
#endif

/* The kernel attention would launch for a layer of policy pol with block
 * size B and max_q query tokens of 4 query heads per KV head (one split:
 * no device is asked how many SMs it has). */
static const char *plan(const char *pol_s, uint32_t B, uint32_t max_q)
{
	static char name[32];
	struct kvq_policy pol;
	struct kvq_layout *L = NULL;
	char err[128];

	if (kvq_policy_parse(pol_s, 1, &pol, err, sizeof err) < 0) {
		diag("%s: %s", pol_s, err);
		return "bad policy";
	}
	struct kvq_layout_params lp = { .layers = 1, .kv_heads = 2, .head_dim = 128, .block_tokens = B,
		.n_sealed = 4, .n_open = 4, .act = KVQ_DT_F16, .policy = &pol };
	if (kvq_layout_new(&lp, &L, err, sizeof err) < 0) {
		diag("%s: %s", pol_s, err);
		return "no layout";
	}
	struct kvq_cuda_attn a = { .L = L, .base = (void *)16, .layer = 0, .q_heads = 2 * 4, .scale = 1,
		.q_dtype = KVQ_DT_F16, .out_dtype = KVQ_DT_F16, .max_n = 4 * B, .max_q = max_q,
		.total_q = max_q, .splits = 1 };
	const char *k = kvq_cuda_attention_plan(&a, 1, NULL);
	snprintf(name, sizeof name, "%s", k ? k : "refused");
	kvq_layout_free(L);
	return name;
}

static void is_plan(const char *pol, uint32_t B, uint32_t max_q, const char *want)
{
	const char *got = plan(pol, B, max_q);

	ok(!strcmp(got, want), "%s, B = %u, %u query token(s): %s (want %s)", pol, B, max_q, got, want);
}

int main(void)
{
	for (int act = KVQ_DT_F16; act <= KVQ_DT_BF16; act++)
		for (uint32_t D = 64; D <= 128; D += 64)
			ok(kvq_cuda_attention_supported(KVQ_FMT_FP8, KVQ_FMT_INT8, D, act) &&
			   kvq_cuda_attention_supported(KVQ_FMT_INT8, KVQ_FMT_PQ1, D, act),
			   "the throwaway rows' pairs are supported at D = %u, act %d", D, act);
	ok(!kvq_cuda_attention_supported(KVQ_FMT_FP8, KVQ_FMT_INT8, 96, KVQ_DT_F16),
	   "but not at a head dim without instances");
	/* fast: decode for a step, prefill for more rows, generic otherwise */
	is_plan("k=fp8,v=int8", 32, 1, "decode");
	is_plan("k=fp8,v=int8", 32, 16, "prefill");
	is_plan("k=fp8,v=int8", 16, 1, "generic");
	/* pq: its decode kernel for a step, generic for more rows */
	is_plan("k=int8,v=pq1", 32, 1, "pq-decode");
	is_plan("k=int8,v=pq1", 32, 16, "generic");
	/* the table's own rows, found as before */
	is_plan("int8", 32, 1, "decode");
	is_plan("pq2", 32, 1, "pq-decode");
	is_plan("k=kivi4,v=pq2", 32, 1, "generic");
	ok(!kvq_cuda_attention_supported(KVQ_FMT_KIVI2, KVQ_FMT_INT4G128, 128, KVQ_DT_F16),
	   "a pair of no row is refused");
	return done_testing();
}
