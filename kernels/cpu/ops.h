/* SPDX-License-Identifier: Apache-2.0 */
/* Inner loops of the CPU kernels, one table per instruction set.  Row lengths
 * passed to decode and dots are multiples of 16. */
#ifndef KVQ_CPU_OPS_H
#define KVQ_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../layout.h"

/* One sealed head slice, its parameters converted to float (ops->params). */
struct kvq_blk {
	int kfmt, vfmt, kkind, vkind;
	unsigned kgroup, vgroup;
	uint32_t B, D;
	const uint8_t *kc, *vc;
	const float *ks, *kz, *vs, *vz;
	/* a head slice the caller will read soon (NULL if none): the K loop
	 * prefetches its first half and the V loop its second, spread over
	 * their iterations so the misses stay within the line-fill buffers */
	const uint8_t *next;
	uint32_t next_bytes;
	/* query rows of the quad that are real (1-4); the rest are zero padding,
	 * whose scores and accumulator lanes a kernel may leave at zero */
	uint32_t rows;
};

/* Query rows are processed four at a time ("quads"); V accumulates in a
 * transposed accumulator accT[d * 4 + r] so each dimension's four row sums
 * land in one 128-bit add. */
struct kvq_cpu_ops {
	const char *name;
	/* elements first .. first+n-1 of a packed code array -> float, no scale */
	void (*decode)(int fmt, const uint8_t *codes, uint32_t first, uint32_t n, float *out);
	/* ret[i * rs] = dot(x, y + i * ys) over n, for i < m */
	void (*dots)(const float *x, const float *y, size_t ys, uint32_t m, uint32_t n, float *ret, size_t rs);
	/* FP16 parameters -> float: count scales (PARAM_TOKEN) or count {s, z}
	 * pairs into s and z; count is a multiple of 16 */
	void (*params)(const uint8_t *p, int kind, uint32_t count, float *s, float *z);
	/* sc[r * ldsc + t] = q_r . k_t for the 4 rows q + r * D and tokens t < tmax
	 * of a sealed block, K dequantized on the fly */
	void (*k_scores4)(const struct kvq_blk *b, const float *q, uint32_t tmax, float *sc, size_t ldsc);
	/* accT[d * 4 + r] += sum over t < B of p[r * ldp + t] * v_t[d], V of a
	 * sealed block (p is 0 where a token is masked) */
	void (*v_accum4)(const struct kvq_blk *b, const float *p, size_t ldp, float *accT);
	/* accT[d * 4 + r] += p[r * ldp] * row[d] for d < n (one open-window token) */
	void (*v_row4)(const float *row, const float *p, size_t ldp, uint32_t n, float *accT);
	/* accT[d * 4 + r] *= al[r] for d < n (online-softmax rescale) */
	void (*scale4)(float *accT, const float *al, uint32_t n);
	/* the largest of x[0 .. n-1], -inf for n = 0 */
	float (*max)(const float *x, uint32_t n);
	/* x = exp(x - mx), returns the sum; -inf gives 0 */
	float (*expsum)(float *x, float mx, uint32_t n);
};

extern const struct kvq_cpu_ops kvq_cpu_ops_portable;
#ifdef HAVE_X86_SIMD
extern const struct kvq_cpu_ops kvq_cpu_ops_avx2;
#endif

const struct kvq_cpu_ops *kvq_cpu_ops(void);

#endif
