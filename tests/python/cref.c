/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The C side of the Python package's tests (tests/python/test_host.py):
 *   cref layout
 *     prints "STRUCT FIELD OFFSET" for every field of the kvq.h structures
 *     the package mirrors with ctypes, and "STRUCT sizeof SIZE";
 *   cref attention SOCKET POOL POLICY IN OUT
 *     attaches to POOL (created with POLICY) and runs IN's steps through
 *     kvq_seq: per step begin, per layer write then attention of the last
 *     n_q tokens, commit; writes every attention output to OUT.
 * IN (little-endian): u32 layers, kv_heads, head_dim, q_heads, n_q,
 * n_steps; u32 step_tokens[n_steps]; u32 tokens[sum]; then per step, per
 * layer: K and V [m][kv_heads][head_dim] as f16 bits, q
 * [n_q][q_heads][head_dim] f32.  OUT: per step, per layer, out like q.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq.h"

#define F(s, f) printf("%s %s %zu\n", #s, #f, offsetof(struct s, f))

static int layout(void)
{
	F(kvq_attach_params, pool); F(kvq_attach_params, model_id); F(kvq_attach_params, layers);
	F(kvq_attach_params, kv_heads); F(kvq_attach_params, head_dim); F(kvq_attach_params, block_tokens);
	F(kvq_attach_params, policy); F(kvq_attach_params, window); F(kvq_attach_params, act);
	F(kvq_attach_params, create); F(kvq_attach_params, n_sealed); F(kvq_attach_params, n_open);
	F(kvq_attach_params, backend); F(kvq_attach_params, device); F(kvq_attach_params, codebooks);
	F(kvq_attach_params, host_capacity);
	printf("kvq_attach_params sizeof %zu\n", sizeof(struct kvq_attach_params));
	F(kvq_stats, name); F(kvq_stats, model_id); F(kvq_stats, backend); F(kvq_stats, device);
	F(kvq_stats, layers); F(kvq_stats, kv_heads); F(kvq_stats, head_dim); F(kvq_stats, block_tokens);
	F(kvq_stats, window); F(kvq_stats, total_bytes); F(kvq_stats, n_sealed); F(kvq_stats, n_open);
	F(kvq_stats, sealed_free); F(kvq_stats, sealed_reserved); F(kvq_stats, sealed_held); F(kvq_stats, cached);
	F(kvq_stats, referenced); F(kvq_stats, open_used); F(kvq_stats, lookup_tokens); F(kvq_stats, hit_tokens);
	F(kvq_stats, evictions); F(kvq_stats, alloc_failures); F(kvq_stats, clients);
	printf("kvq_stats sizeof %zu\n", sizeof(struct kvq_stats));
	F(kvq_trace, op); F(kvq_trace, layer); F(kvq_trace, device); F(kvq_trace, k); F(kvq_trace, v);
	F(kvq_trace, q); F(kvq_trace, out);
	printf("kvq_trace sizeof %zu\n", sizeof(struct kvq_trace));
	return 0;
}

static void *read_n(FILE *f, size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p || fread(p, 1, n, f) != n) {
		fprintf(stderr, "cref: short input\n");
		exit(2);
	}
	return p;
}

static int attention(char **argv)
{
	uint32_t h[6], *steps, *tokens, total = 0, done = 0;
	FILE *in = fopen(argv[4], "rb"), *out = fopen(argv[5], "wb");
	struct kvq_attach_params p = { .pool = argv[2], .model_id = "python-test", .block_tokens = 32,
		.policy = argv[3], .create = 1, .device = -1 };
	kvq_client *c = NULL;
	kvq_seq *s = NULL;
	int r;

	if (!in || !out || fread(h, 4, 6, in) != 6)
		return fprintf(stderr, "cref: cannot read %s or write %s\n", argv[4], argv[5]), 2;
	p.layers = h[0], p.kv_heads = h[1], p.head_dim = h[2];
	steps = read_n(in, h[5] * 4u);
	for (uint32_t i = 0; i < h[5]; i++)
		total += steps[i];
	tokens = read_n(in, (size_t)total * 4);
	if ((r = kvq_client_connect(argv[1], "cref", &c)) < 0)
		return fprintf(stderr, "cref: connect: %s\n", kvq_strerror(r)), 1;
	if (kvq_client_attach(c, &p) < 0 || kvq_seq_new(c, NULL, 0, &s) < 0)
		return fprintf(stderr, "cref: attach: %s\n", kvq_client_error(c)), 1;
	for (uint32_t i = 0; i < h[5]; i++) {
		size_t kv = (size_t)steps[i] * h[1] * h[2] * 2, qn = (size_t)h[4] * h[3] * h[2];
		float *o = malloc(qn * sizeof(float));

		if (kvq_seq_begin(s, tokens + done, steps[i]) < 0)
			return fprintf(stderr, "cref: begin: %s\n", kvq_client_error(c)), 1;
		for (uint32_t l = 0; l < h[0]; l++) {
			void *k = read_n(in, kv), *v = read_n(in, kv);
			float *q = read_n(in, qn * sizeof(float));

			if (kvq_seq_write(s, l, k, v) < 0 || kvq_seq_attention(s, l, h[3], h[4], 0, q, o) < 0)
				return fprintf(stderr, "cref: step %u layer %u: %s\n", i, l, kvq_client_error(c)), 1;
			fwrite(o, sizeof(float), qn, out);
			free(k), free(v), free(q);
		}
		if (kvq_seq_commit(s) < 0)
			return fprintf(stderr, "cref: commit: %s\n", kvq_client_error(c)), 1;
		free(o);
		done += steps[i];
	}
	kvq_seq_free(s);
	kvq_client_free(c);
	free(steps), free(tokens);
	fclose(in);
	return fclose(out) ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "layout"))
		return layout();
	if (argc == 7 && !strcmp(argv[1], "attention"))
		return attention(argv + 1);
	fprintf(stderr, "usage: cref layout | cref attention SOCKET POOL POLICY IN OUT\n");
	return 2;
}
