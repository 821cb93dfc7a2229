/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Append and seal on the GPU.  One CTA per (block, KV head).  A block that
 * leaves the open window is staged in shared memory by asynchronous 16-byte
 * copies of its rows (from the open slot and from the input alike), K and V
 * together where both fit.
 * At D = 64 and 128, for pairs of scalar formats (tiles_fit says which), a
 * CTA of two warps then seals it by tiles (seal_tiles.cuh): each warp one
 * part, alone, its ranges, parameters and codes from 8 x 8 tiles of the
 * staged rows (on an H100, kivi2 at D = 128: 19 thread instructions an
 * element, staging included, against 66 for the staged seal below).
 * Elsewhere (other head dims, codebook formats, pairs without kernels of
 * their own) the staged seal below: its parameters take two steps: teams of lanes,
 * one per entry (a token, a token's group, a channel), reduce its range with
 * shuffles, then one thread per entry makes the FP16 parameters.  Its codes
 * come from threads that each make one word of storage order (16 bytes, 8
 * of 2-bit codes), eight elements of a row of K or a column of V at a time,
 * and store it at once; a codebook format's (pq2, pq1) one code per
 * (token, subspace) at a time, the nearest of the head's centroids
 * (kvq_pq_encode).  Each format is one instance of the same templates
 * (fmt<F>), and each (K, V) pair of instances.h has a kernel of its own:
 * one holding every format's code was too large for the instruction caches
 * (pairs not listed still take it).  The arithmetic is kvq_format.h's, so
 * the bytes equal the CPU seal's (kernels/cpu/write.c): that header has no
 * expression a compiler could contract into an FMA, min, max and |x| give
 * the same result in any order of reduction (a zero bound's sign, which
 * does depend on it, is dropped by kvq_asym_params), a quotient taken by a
 * reciprocal is used only where it provably rounds as the true division
 * (rint_by_recip), and FP8 codes come from the conversion instruction only
 * where it rounds and saturates as kvq_fp8_encode_generic (fp8_codes).
 */
#include <cuda_fp8.h>
#include <cuda_pipeline_primitives.h>

#include "codes.cuh"
#include "common.cuh"
#include "instances.h"
#include "rows.cuh"
#include "seal_tiles.cuh"

namespace kvq {

#define WRITE_THREADS 128   /* a power of two: v_first takes a remainder by it */

/* Both parts are staged at once while they take at most this much. */
#define SEAL_BOTH_MAX (64u * 1024u)

/* Parameter entries of one part at most: a group is at least 32 wide. */
static __host__ __device__ uint32_t seal_max_params(uint32_t B, uint32_t D)
{
	uint32_t n = B * D / 32;

	return n > B ? (n > D ? n : D) : (B > D ? B : D);
}

/* Shared memory of the seal staging `parts` parts (1 or 2): rows, then the
 * parameters as floats. */
static __host__ __device__ size_t seal_smem(uint32_t B, uint32_t D, uint32_t parts)
{
	return parts * ((size_t)B * (D + SEAL_PAD) * 2 + (size_t)seal_max_params(B, D) * sizeof(float2));
}

static uint32_t seal_parts(uint32_t B, uint32_t D)
{
	return seal_smem(B, D, 2) <= SEAL_BOTH_MAX ? 2 : 1;
}

/* Rows of a block being sealed: token t comes from the open slot while
 * t < from_open, else from input row in_row + (t - from_open). */
struct rows {
	const uint8_t *open;     /* open head slice, or NULL */
	const uint8_t *in_k, *in_v;
	uint32_t from_open;
	uint64_t in_row;         /* input row of token from_open */
	uint32_t in_stride;      /* bytes between input rows (all heads) */

	__device__ const uint16_t *get(const layer_dev &l, uint32_t t, int is_v) const
	{
		uint32_t row = l.D * 2;
		if (t < from_open)
			return reinterpret_cast<const uint16_t *>(open + (is_v ? (size_t)l.B * row : 0) + (size_t)t * row);
		const uint8_t *in = is_v ? in_v : in_k;
		return reinterpret_cast<const uint16_t *>(in + (in_row + t - from_open) * in_stride);
	}
};

/* Stages parts p0 .. p0 + n - 1 (0: K, 1: V) of the block: part p from
 * xs + (p - p0) * B * (D + SEAL_PAD), in xs_at's order.  Asynchronous
 * 16-byte copies: all of a thread's are in flight at once, through no
 * register.  The caller waits (stage_wait) and synchronises. */
__device__ void stage_rows(const layer_dev &l, const rows &src, uint32_t p0, uint32_t n, uint16_t *xs)
{
	const uint32_t vec = l.D / 8, stride = l.D + SEAL_PAD, total = n * l.B * vec;
	/* piece i is piece c of row t of part p0 + p; stepped, not divided,
	 * from one of a thread's pieces to the next */
	const uint32_t dt = blockDim.x / vec, dc = blockDim.x % vec;
	uint32_t c = threadIdx.x % vec, t = threadIdx.x / vec, p = 0;

	for (; t >= l.B; t -= l.B)
		p++;
	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		__pipeline_memcpy_async(xs + p * l.B * stride + xs_at(t, c * 8, stride),
					src.get(l, t, (int)(p0 + p)) + c * 8, 16);
		c += dc;
		t += dt;
		if (c >= vec) {
			c -= vec;
			t++;
		}
		for (; t >= l.B; t -= l.B)
			p++;
	}
	__pipeline_commit();
}

__device__ __forceinline__ void stage_wait(void)
{
	__pipeline_wait_prior(0);
}

/* One part (K or V) of a head being sealed. */
struct part {
	const uint16_t *xs;      /* staged rows (xs_at) */
	float2 *ps;              /* per entry: its range, then {1 / scale (recip) or scale, zero} */
	uint8_t *codes, *params; /* its fields in the sealed head slice */
	uint32_t B, D;
	int act;
	uint32_t first;          /* this thread's first word of codes (< blockDim.x) */
	const uint16_t *cb;      /* a codebook format's: the head's codebooks (codebook_of) */
};

/* Elements in one thread's word of codes: 16 bytes, or 8 of 2-bit codes. */
static constexpr __host__ __device__ uint32_t word_elems(unsigned bits)
{
	return 128 / bits < 32 ? 128 / bits : 32;
}

/* Lanes that reduce one parameter entry: along the head dim (a token, a
 * group) each takes pieces of eight elements, up to eight lanes; down a
 * channel eight take every eighth token. */
static constexpr __host__ __device__ unsigned team_lanes(int kind, unsigned G)
{
	return kind == KVQ_PARAM_GROUP && G < 64 ? (G >= 16 ? G / 8 : 1u) : 8u;
}

/* Parameters of a part, first step: the range of each entry (min and
 * max, or 0 and the largest magnitude) into shared memory. */
template <int F, int IS_V> __device__ void part_reduce(const part &p)
{
	constexpr int kind = IS_V ? fmt<F>::kind_v : fmt<F>::kind_k;
	constexpr unsigned G = IS_V ? fmt<F>::group_v : fmt<F>::group_k, T = team_lanes(kind, G);

	if constexpr (kind != KVQ_PARAM_NONE) {
		const uint32_t B = p.B, D = p.D, row = D + SEAL_PAD, np = kvq_param_count(kind, G, B, D);
		const uint32_t lane = threadIdx.x % T;

		/* every thread takes every round: the shuffles need whole warps */
		for (uint32_t base = 0; base < np * T; base += blockDim.x) {
			const uint32_t j = (base + threadIdx.x) / T;
			/* the CPU's amax starts at 0 (an all-NaN row gives scale 0) */
			float lo = INFINITY, hi = kind == KVQ_PARAM_TOKEN ? 0.0f : -INFINITY;
			if constexpr (kind == KVQ_PARAM_CHANNEL) {
				for (uint32_t t = lane; j < np && t < B; t += T) {
					const float v = act_f(p.act, p.xs[xs_at(t, j, row)]);
					lo = fminf(lo, v);
					hi = fmaxf(hi, v);
				}
			} else if (j < np) {
				uint32_t t, d0, len;
				if constexpr (kind == KVQ_PARAM_TOKEN) {
					t = j;
					d0 = 0;
					len = D;
				} else if constexpr (IS_V) {   /* GROUP entries [g][t] */
					t = j % B;
					d0 = j / B * G;
					len = G;
				} else {                       /* GROUP entries [t][g] */
					t = j / (D / G);
					d0 = j % (D / G) * G;
					len = G;
				}
				for (uint32_t d = d0 + lane * 8; d < d0 + len; d += T * 8) {
					float f[8];
					unpack8(p.act, *reinterpret_cast<const uint4 *>(p.xs + xs_at(t, d, row)), f);
#pragma unroll
					for (unsigned e = 0; e < 8; e++) {
						if (kind == KVQ_PARAM_TOKEN) {
							hi = fmaxf(hi, fabsf(f[e]));
						} else {
							lo = fminf(lo, f[e]);
							hi = fmaxf(hi, f[e]);
						}
					}
				}
			}
#pragma unroll
			for (unsigned o = T / 2; o; o /= 2) {
				if (kind != KVQ_PARAM_TOKEN)
					lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
				hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
			}
			if (j < np && !lane)
				p.ps[j] = make_float2(lo, hi);
		}
	}
}

/* Parameters of a part, second step: one thread per entry turns its range
 * into FP16 parameters as the CPU's seal_part() does, to the slice and, as
 * floats for the codes, to shared memory.  V's entries start half a CTA on,
 * so that K's and V's are made by different warps. */
template <int F, int IS_V> __device__ void part_finish(const part &p)
{
	constexpr int kind = IS_V ? fmt<F>::kind_v : fmt<F>::kind_k;
	constexpr unsigned G = IS_V ? fmt<F>::group_v : fmt<F>::group_k;

	if constexpr (kind != KVQ_PARAM_NONE) {
		const uint32_t np = kvq_param_count(kind, G, p.B, p.D);
		const float qmax = kvq_fmt_qmax(F);

		for (uint32_t j = (threadIdx.x + (IS_V ? blockDim.x / 2 : 0)) % blockDim.x; j < np; j += blockDim.x) {
			const float2 r = p.ps[j];
			uint16_t s, z = 0;
			if (kind == KVQ_PARAM_TOKEN) {
				s = kvq_sym_scale(r.y, qmax);
				reinterpret_cast<uint16_t *>(p.params)[j] = s;
			} else {
				kvq_asym_params(r.x, r.y, qmax, &s, &z);
				reinterpret_cast<uint32_t *>(p.params)[j] = s | (uint32_t)z << 16;
			}
			const bool nan = recip<F>::ok && !recip_in_range(kind, r, s, z);
			p.ps[j] = make_float2(nan ? __int_as_float(0x7fc00000) : scale_f<F>(s), kvq_f16_to_f32(z));
		}
	}
}

/* Codes of eight elements that follow each other in storage order from
 * (t, d): along the head dim for K, along the tokens for V; activations of
 * dtype DT (p.act). */
template <int F, int IS_V, int DT>
__device__ __forceinline__ void chunk_codes(const part &p, uint32_t t, uint32_t d, uint32_t code[8])
{
	constexpr int kind = IS_V ? fmt<F>::kind_v : fmt<F>::kind_k;
	constexpr unsigned G = IS_V ? fmt<F>::group_v : fmt<F>::group_k;
	const uint32_t row = p.D + SEAL_PAD;
	uint16_t x[8];

	if (IS_V) {   /* t % 8 == 0: rows t .. t + 7 share their XOR */
		const uint16_t *x0 = p.xs + xs_at(t, d, row);
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			x[e] = x0[e * row];
	} else {
		const uint4 v = *reinterpret_cast<const uint4 *>(p.xs + xs_at(t, d, row));
		const uint32_t w[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			x[e] = (uint16_t)(w[e / 2] >> (e % 2 * 16));
	}
	if constexpr (kind == KVQ_PARAM_NONE) {
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			code[e] = code16<F>(DT, x[e]);
	} else {
		const float qmax = kvq_fmt_qmax(F);
		float f[8];
		if (DT == KVQ_DT_BF16) {
#pragma unroll
			for (unsigned e = 0; e < 8; e++)
				f[e] = __uint_as_float((uint32_t)x[e] << 16);
		} else {
#pragma unroll
			for (unsigned e = 0; e < 8; e++)
				f[e] = __half2float(__ushort_as_half(x[e]));
		}
		/* V (by token) and a channel's K take eight entries in a row, from an
		 * even one; K by token or group one entry (a group is 32 or more) */
		const uint32_t i0 = kvq_param_index(kind, G, IS_V, t, d, p.B, p.D);
		float2 s[8];
		if (IS_V || kind == KVQ_PARAM_CHANNEL) {
#pragma unroll
			for (unsigned e = 0; e < 8; e += 2) {
				const float4 v = *reinterpret_cast<const float4 *>(p.ps + i0 + e);
				s[e] = make_float2(v.x, v.y);
				s[e + 1] = make_float2(v.z, v.w);
			}
		} else {
#pragma unroll
			for (unsigned e = 0; e < 8; e++)
				s[e] = p.ps[i0];
		}
		if constexpr (recip<F>::ok) {
			bool sure = true;
#pragma unroll
			for (unsigned e = 0; e < 8; e++) {
				/* as kvq_code_sym/asym: x - z, then the quotient; the
				 * code in the low bits (an 8-bit one packed by its byte) */
				sure &= rint_by_recip(kind == KVQ_PARAM_TOKEN ? f[e] : __fsub_rn(f[e], s[e].y), s[e].x,
						      recip_sure(qmax), &code[e]);
				if (fmt<F>::bits < 8)
					code[e] &= (1u << fmt<F>::bits) - 1u;
			}
			if (!sure) {   /* a quotient near a half-integer: the reference, scales from the slice */
				const uint16_t *w = reinterpret_cast<const uint16_t *>(p.params);
#pragma unroll
				for (unsigned e = 0; e < 8; e++) {
					const uint32_t i = i0 + (IS_V || kind == KVQ_PARAM_CHANNEL ? e : 0);
					const float sc = kvq_f16_to_f32(kind == KVQ_PARAM_TOKEN ? w[i] : w[2 * i]);
					code[e] = kind == KVQ_PARAM_TOKEN ? kvq_code_sym(F, f[e], sc)
									  : kvq_code_asym(f[e], sc, s[e].y, qmax);
				}
			}
		} else if constexpr (fp8_hw<F>::ok) {
			fp8_codes<F>(f, s, code);
		} else {
#pragma unroll
			for (unsigned e = 0; e < 8; e++)
				code[e] = kind == KVQ_PARAM_TOKEN ? kvq_code_sym(F, f[e], s[e].x)
								  : kvq_code_asym(f[e], s[e].x, s[e].y, qmax);
		}
	}
}

/* Codes of a part: each thread makes whole words of storage order (K
 * [t][d], V [d][t]; kvq_format.h), E elements in E / 8 chunks of eight:
 * 16 bytes, or 8 of 2-bit codes (32 elements, as many words as 4-bit);
 * words p.first, p.first + blockDim.x, ... */
template <int F, int IS_V, int DT> __device__ void part_codes_dt(const part &p)
{
	constexpr unsigned bits = fmt<F>::bits, E = word_elems(bits), words = E * bits / 32;
	const uint32_t inner = IS_V ? p.B : p.D, nw = p.B * p.D / E;
	/* storage rows of `inner` elements (a token's D for K, a dim's B for V):
	 * word w starts at row a0, element b0; stepped, not divided, from one of
	 * a thread's words to the next */
	const uint32_t da = blockDim.x * E / inner, db = blockDim.x * E % inner;
	uint32_t a0 = p.first * E / inner, b0 = p.first * E % inner;

	for (uint32_t w = p.first; w < nw; w += blockDim.x) {
		uint32_t word[words] = {}, a = a0, b = b0;
		/* 8-, 4- and 2-bit codes: a chunk is 64, 32 or 16 bits of the word,
		 * shifted in from the top, so that the chunks' loop needs no
		 * unrolling (one copy of chunk_codes, not two or four: smaller
		 * kernels, fewer instruction fetches; unrolled, the seal of a
		 * 4-bit format ran 1.7x slower on an H200) */
		uint64_t lo = 0, hi = 0;
		a0 += da;
		b0 += db;
		if (b0 >= inner) {
			b0 -= inner;
			a0++;
		}
#pragma unroll 1
		for (unsigned c = 0; c < E / 8; c++) {
			uint32_t code[8];
			chunk_codes<F, IS_V, DT>(p, IS_V ? b : a, IS_V ? a : b, code);
			if constexpr (bits == 16) {   /* a code's two bytes */
#pragma unroll
				for (unsigned e = 0; e < 8; e += 2)
					word[(c * 8 + e) / 2] = __byte_perm(code[e], code[e + 1], 0x5410);
			} else if constexpr (bits == 8) {   /* a code's low byte */
				lo = hi;
				hi = __byte_perm(__byte_perm(code[0], code[1], 0x0040), __byte_perm(code[2], code[3], 0x0040),
						 0x5410) |
				     (uint64_t)__byte_perm(__byte_perm(code[4], code[5], 0x0040),
							   __byte_perm(code[6], code[7], 0x0040), 0x5410) << 32;
			} else {
				uint32_t v = 0;
#pragma unroll
				for (unsigned e = 0; e < 8; e++)
					v |= code[e] << (e * bits);
				if constexpr (bits == 4) {
					lo = lo >> 32 | hi << 32;
					hi = hi >> 32 | (uint64_t)v << 32;
				} else {
					lo = lo >> 16 | (uint64_t)v << 48;
				}
			}
			b += 8;
			if (b == inner) {
				b = 0;
				a++;
			}
		}
		if constexpr (bits <= 8) {
			word[0] = (uint32_t)lo;
			word[1] = (uint32_t)(lo >> 32);
			if constexpr (words == 4) {
				word[2] = (uint32_t)hi;
				word[3] = (uint32_t)(hi >> 32);
			}
		}
		if constexpr (words == 4)
			reinterpret_cast<uint4 *>(p.codes)[w] = make_uint4(word[0], word[1], word[2], word[3]);
		else
			reinterpret_cast<uint2 *>(p.codes)[w] = make_uint2(word[0], word[1]);
	}
}

/* The activation dtype as a template argument: no choice per element. */
template <int F, int IS_V> __device__ void part_codes(const part &p)
{
	if (p.act == KVQ_DT_BF16)
		part_codes_dt<F, IS_V, KVQ_DT_BF16>(p);
	else
		part_codes_dt<F, IS_V, KVQ_DT_F16>(p);
}

/* Codes of a part of a codebook format: the nearest centroid of each
 * (token, subspace), kvq_pq_encode as the CPU's seal, one code per thread
 * at a time in storage order (K [t][m], V [m][t]); the centroids are read
 * through the cache, the subvector from the staged rows. */
template <int F, int IS_V> __device__ void part_pq_codes(const part &p)
{
	constexpr unsigned d = fmt<F>::subdim;
	const uint32_t M = p.D / d, n = p.B * M, row = p.D + SEAL_PAD;

	for (uint32_t i = p.first; i < n; i += blockDim.x) {
		const uint32_t t = IS_V ? i % p.B : i / M, m = IS_V ? i / p.B : i % M;
		float x[d];
#pragma unroll
		for (unsigned j = 0; j < d; j++)
			x[j] = act_f(p.act, p.xs[xs_at(t, m * d + j, row)]);
		p.codes[i] = (uint8_t)kvq_pq_encode(x, p.cb + (size_t)m * KVQ_CB_CENTROIDS * d, d);
	}
}

/* Phase 0 (ranges), 1 (parameters) or 2 (codes) of a part of format F. */
template <int F, int IS_V> __device__ __forceinline__ void part_phase(int phase, const part &p)
{
	if constexpr ((IS_V ? fmt<F>::kind_v : fmt<F>::kind_k) == KVQ_PARAM_CODEBOOK) {
		if (phase == 2)   /* no parameters */
			part_pq_codes<F, IS_V>(p);
	} else if (phase == 0)
		part_reduce<F, IS_V>(p);
	else if (phase == 1)
		part_finish<F, IS_V>(p);
	else
		part_codes<F, IS_V>(p);
}

/* The same for format FIX, or (FIX = ANY_FMT) for format f, chosen here
 * (a kernel of every format's code, whose size costs instruction fetches). */
#define ANY_FMT (-1)
template <int IS_V, int FIX> __device__ void part_run(int f, int phase, const part &p)
{
	if constexpr (FIX != ANY_FMT) {
		part_phase<FIX, IS_V>(phase, p);
	} else {
		switch (f) {
#define SEAL_FMT(ID, ...) \
	case KVQ_FMT_##ID: \
		part_phase<KVQ_FMT_##ID, IS_V>(phase, p); \
		break;
			KVQ_FORMATS(SEAL_FMT)
#undef SEAL_FMT
		default:
			break;
		}
	}
}

/* Bytes of the slice that belong to no field are zero, as on the CPU: any
 * before the first field, and the padding after each up to the next. */
__device__ void zero_gaps(const layer_dev &l, uint8_t *dst)
{
	if (threadIdx.x >= 32)   /* a few bytes: one warp */
		return;
#pragma unroll
	for (int f = -1; f < KVQ_NFIELDS; f++) {
		const uint32_t from = f < 0 ? 0 : l.off[f] + l.size[f];
		uint32_t to = l.sealed_head;
#pragma unroll
		for (int g = 0; g < KVQ_NFIELDS; g++)
			if (l.size[g] && l.off[g] >= from && l.off[g] < to)
				to = l.off[g];
		for (uint32_t i = from + threadIdx.x; i < to; i += 32)
			dst[i] = 0;
	}
}

/* A thread's first word of V's codes.  With both parts staged, its words
 * of V's follow its words of K's in one sequence over the CTA: threads with
 * fewer of K's start on V's, so none idles while others make K's.  (Made
 * where it is used, from the kernel's parameters: a variable kept across
 * the phases would take a register.) */
__device__ __forceinline__ uint32_t v_first(const layer_dev &l, uint32_t parts)
{
	const uint32_t nwk = l.B * l.D / word_elems(kvq_fmt_bits(l.kfmt));

	return parts == 2 ? (threadIdx.x - nwk) % WRITE_THREADS : threadIdx.x;
}

/* Seals one head of one block into the sealed head slice dst, staging
 * `parts` parts (2: K and V together, 1: one after the other); a rotated
 * part's rows from the input are rotated once staged (those from the open
 * slot were when the write put them there). */
template <int FK, int FV>
__device__ void seal_head(const layer_dev &l, const uint8_t *base, uint32_t h, uint8_t *dst, const rows &src,
			  uint8_t *smem, uint32_t parts)
{
	const uint32_t B = l.B, D = l.D;
	uint16_t *xs = reinterpret_cast<uint16_t *>(smem);
	float2 *ps = reinterpret_cast<float2 *>(smem + (size_t)parts * B * (D + SEAL_PAD) * 2);

	zero_gaps(l, dst);
	for (uint32_t p0 = 0; p0 < 2; p0 += parts) {
		if (p0)
			__syncthreads();   /* K's codes are made: its rows may go */
		stage_rows(l, src, p0, parts, xs);
		stage_wait();
		__syncthreads();
		if (l.rot && src.from_open < B) {
			for (uint32_t i = 0; i < parts; i++)
				if (l.rot & (p0 + i ? KVQ_ROT_V : KVQ_ROT_K))
					rotate_staged(xs + (size_t)i * B * (D + SEAL_PAD), src.from_open, B, D, l.act,
						      kvq_rot_block(D, (int)(p0 + i)));
			__syncthreads();
		}
		for (int phase = 0; phase < 3; phase++) {
			for (uint32_t i = 0; i < parts; i++) {
				const uint16_t *x = xs + (size_t)i * B * (D + SEAL_PAD);
				float2 *p = ps + (size_t)i * seal_max_params(B, D);
				/* constant field indices: a computed one would copy l to local memory */
				if (p0 + i)
					part_run<1, FV>(l.vfmt, phase, { x, p, dst + l.off[KVQ_V_CODES], dst + l.off[KVQ_V_PARAMS],
								    B, D, l.act, phase == 2 ? v_first(l, parts) : 0,
								    codebook_of(l, base, 1, h) });
				else
					part_run<0, FK>(l.kfmt, phase, { x, p, dst + l.off[KVQ_K_CODES], dst + l.off[KVQ_K_PARAMS],
								    B, D, l.act, threadIdx.x, codebook_of(l, base, 0, h) });
			}
			if (phase < 2)
				__syncthreads();   /* ranges, then parameters, are in shared memory */
		}
	}
}

/* Whether a pair's parts are sealed by tiles (seal_tiles.cuh): scalar
 * formats both.  (Its kernels' other conditions, the head dim and the
 * staged rows' size, are tiles_fit's.) */
template <int FK, int FV> struct tiles_pair {
	static constexpr bool ok = FK != ANY_FMT && FV != ANY_FMT && fmt<FK>::kind_k != KVQ_PARAM_CODEBOOK &&
				   fmt<FV>::kind_v != KVQ_PARAM_CODEBOOK;
};

/* Threads of a CTA that seals by tiles: a warp for K, one for V. */
#define TILE_THREADS 64

/* Shared memory of the seal by tiles: both parts' rows. */
static size_t tiles_smem(uint32_t B, uint32_t D)
{
	return 2 * (size_t)B * (D + SEAL_PAD) * 2;
}

/* Whether a layer seals by tiles: at D = 64 or 128 in whole passes
 * (tiling<D>::tokens: 16 tokens at D = 128, 32 at 64) whose rows fit; at
 * D = 128 not where both formats have 8 bits or more, bf16 aside: there
 * the staged seal's four warps a block hide the latency better than the
 * tiles' two, and its few instructions an element are no cost (on an
 * H100, 64 x 2048 prefill: f16 94 % of copy bandwidth staged, 90 % by
 * tiles; int8 67 % and 63 %; fp8 63 % and 56 %; at D = 64 the tiles win
 * for every format, as at D = 128 for 4- and 2-bit ones and bf16). */
static bool tiles_fit(const layer_dev &l)
{
	const uint32_t B = l.B, D = l.D;
	const bool wide = kvq_fmt_bits(l.kfmt) >= 8 && kvq_fmt_bits(l.vfmt) >= 8 && l.kfmt != KVQ_FMT_BF16 &&
			  l.vfmt != KVQ_FMT_BF16;

	return (D == 64 || (D == 128 && !wide)) && B % (2048 / D) == 0 && tiles_smem(B, D) <= 96 * 1024;
}

/* Stages both parts of a block for the seal by tiles: a thread's 16-byte
 * piece of a row is the same in every row it copies, its rows TILE_THREADS
 * / (D / 8) apart, their addresses stepped; asynchronous copies, as
 * stage_rows. */
template <uint32_t D> __device__ void stage_tiles(const layer_dev &l, const rows &src, uint16_t *xs)
{
	constexpr uint32_t vec = D / 8, step = TILE_THREADS / vec, row = D + SEAL_PAD, orow = D * 2;
	const uint32_t c = threadIdx.x % vec, t0 = threadIdx.x / vec;

#pragma unroll
	for (uint32_t p = 0; p < 2; p++) {
		/* rows t0, t0 + step, ...: from the open slot, then the input */
		const uint8_t *po = src.open + (size_t)p * l.B * orow + (size_t)t0 * orow + c * 16;
		const uint8_t *pi = (p ? src.in_v : src.in_k) + ((int64_t)src.in_row - src.from_open + t0) * src.in_stride + c * 16;
		const size_t di = (size_t)step * src.in_stride;
		uint16_t *x = xs + (size_t)p * l.B * row;
		for (uint32_t t = t0; t < l.B; t += step, po += step * orow, pi += di)
			__pipeline_memcpy_async(x + xs_at(t, c * 8, row), t < src.from_open ? po : pi, 16);
	}
	__pipeline_commit();
}

/* Seals one head of one block by tiles: K's and V's rows staged together
 * (a rotated part's from the input rotated there), then warp 0 seals K,
 * warp 1 V, each alone (tile_seal). */
template <int FK, int FV>
__device__ void seal_head_tiles(const layer_dev &l, uint8_t *dst, const rows &src, uint8_t *smem)
{
	const uint32_t B = l.B, D = l.D;
	uint16_t *xs = reinterpret_cast<uint16_t *>(smem);

	zero_gaps(l, dst);
	if (D == 128)
		stage_tiles<128>(l, src, xs);
	else
		stage_tiles<64>(l, src, xs);
	stage_wait();
	__syncthreads();
	if (l.rot && src.from_open < B) {
		for (uint32_t i = 0; i < 2; i++)
			if (l.rot & (i ? KVQ_ROT_V : KVQ_ROT_K))
				rotate_staged(xs + (size_t)i * B * (D + SEAL_PAD), src.from_open, B, D, l.act,
					      kvq_rot_block(D, (int)i));
		__syncthreads();
	}
	if (threadIdx.x < 32)
		tile_seal<FK, 0>(D, l.act, xs, B, dst + l.off[KVQ_K_CODES], dst + l.off[KVQ_K_PARAMS]);
	else
		tile_seal<FV, 1>(D, l.act, xs + (size_t)B * (D + SEAL_PAD), B, dst + l.off[KVQ_V_CODES],
				 dst + l.off[KVQ_V_PARAMS]);
}

/* seal_head_tiles (TILES) or seal_head. */
template <int FK, int FV, int TILES>
__device__ __forceinline__ void seal_one(const layer_dev &l, const uint8_t *base, uint32_t h, uint8_t *dst,
					 const rows &src, uint8_t *smem, uint32_t parts)
{
	if constexpr (TILES && tiles_pair<FK, FV>::ok)
		seal_head_tiles<FK, FV>(l, dst, src, smem);
	else
		seal_head<FK, FV>(l, base, h, dst, src, smem, parts);
}

__device__ __forceinline__ uint8_t *sealed_head_w(const layer_dev &l, uint8_t *base, uint32_t id, uint32_t h)
{
	return const_cast<uint8_t *>(sealed_head(l, base, id, h));
}

/* Copies input rows into an open slot's rows (16 bytes at a time: D % 8 == 0),
 * a rotated layer's through append_rows_rot_g or append_rows_rot (rows.cuh). */
__device__ void append_rows(const layer_dev &l, uint8_t *open, uint32_t r0, uint32_t r1,
			    const uint8_t *in_k, const uint8_t *in_v, uint64_t in_row, uint32_t in_stride)
{
	if (l.rot && (l.D == 64 || l.D == 128)) {
		if (l.D == 64)
			append_rows_rot_g<1>(l, open, r0, r1, in_k, in_v, in_row, in_stride);
		else
			append_rows_rot_g<2>(l, open, r0, r1, in_k, in_v, in_row, in_stride);
		return;
	}
	if (l.rot) {
#define APPEND_ROT(E) append_rows_rot<E>(l, open, r0, r1, in_k, in_v, in_row, in_stride)
		KVQ_LANE_ELEMS(l.D, APPEND_ROT)
#undef APPEND_ROT
		return;
	}
	const uint32_t row = l.D * 2, vec = row / 16;
	const uint32_t total = (r1 - r0) * vec * 2;

	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		uint32_t is_v = i / ((r1 - r0) * vec), j = i % ((r1 - r0) * vec);
		uint32_t r = r0 + j / vec, x = j % vec;
		const uint8_t *in = (is_v ? in_v : in_k) + (in_row + (r - r0)) * in_stride;
		uint8_t *o = open + (is_v ? (size_t)l.B * row : 0) + (size_t)r * row;
		reinterpret_cast<uint4 *>(o)[x] = reinterpret_cast<const uint4 *>(in)[x];
	}
}

/* Staged seal: eleven CTAs of 128 threads per SM, as many as the staged
 * rows' shared memory allows (40 registers; some pairs' kernels spill a few
 * bytes): the more blocks in different phases at once, the more their
 * staging, barriers and arithmetic overlap (on an H200, 6 CTAs of 256
 * threads were 8-16 % slower).  By tiles (TILES): CTAs of two warps, twelve
 * per SM.
 * FK, FV: the formats of K and V, or ANY_FMT (chosen per part inside). */
template <int FK, int FV, int TILES>
__global__ void __launch_bounds__(TILES ? TILE_THREADS : WRITE_THREADS, TILES ? 12 : 11)
	write_kernel(layer_dev l, uint8_t *base, const kvq_seq_table *seqs, const uint8_t *kin, const uint8_t *vin,
		     uint32_t parts)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const kvq_seq_table s = seqs[blockIdx.z];
	const uint32_t h = blockIdx.y, B = l.B;
	const uint64_t n = s.n, n2 = (uint64_t)s.n + s.m;
	const uint32_t s0 = split_of(l, s.n), s1 = split_of(l, (uint32_t)n2);
	const uint32_t blk = s0 / B + blockIdx.x;
	const uint32_t stride = l.H * l.D * 2;
	const uint64_t pos0 = (uint64_t)blk * B;

	if (pos0 >= n2)
		return;
	/* a sink block (kernels/layout.h) lives in its sink slice, an open
	 * one, and is never sealed */
	const bool sink = blk == 0 && s.sink;
	int32_t o = -1;
	if (sink) {
		if (s.sink > l.n_sink)
			return;
		o = (int32_t)kvq_table_sink_open_id(l.n_open, s.sink);
	} else if (pos0 < n || blk >= s1 / B) {
		o = s.open[blk - s0 / B];
		if (o < 0 || (uint32_t)o >= l.n_open)
			return;
	}
	if (blk < s1 / B && !sink) {
		int32_t sid = s.sealed[blk];
		if (sid < 0 || (uint32_t)sid >= l.n_sealed)
			return;
		rows src;
		src.open = o >= 0 ? open_head(l, base, (uint32_t)o, h) : NULL;
		src.in_k = kin + (size_t)h * l.D * 2;
		src.in_v = vin + (size_t)h * l.D * 2;
		src.from_open = pos0 < n ? (uint32_t)(n - pos0 < B ? n - pos0 : B) : 0;
		src.in_row = (uint64_t)s.row0 + (pos0 + src.from_open - n);
		src.in_stride = stride;
		seal_one<FK, FV, TILES>(l, base, h, sealed_head_w(l, base, (uint32_t)sid, h), src, smem, parts);
		return;
	}
	uint64_t p0 = pos0 > n ? pos0 : n, p1 = pos0 + B < n2 ? pos0 + B : n2;
	if (p1 <= p0)
		return;   /* a window block of stored tokens that stays open */
	append_rows(l, const_cast<uint8_t *>(open_head(l, base, (uint32_t)o, h)), (uint32_t)(p0 - pos0),
		    (uint32_t)(p1 - pos0), kin + (size_t)h * l.D * 2, vin + (size_t)h * l.D * 2,
		    s.row0 + (p0 - n), stride);
}

template <int FK, int FV, int TILES>
__global__ void __launch_bounds__(TILES ? TILE_THREADS : WRITE_THREADS)
	seal_kernel(layer_dev l, uint8_t *base, const int32_t *pairs, uint32_t parts)
{
	extern __shared__ __align__(16) uint8_t smem[];
	const int32_t o = pairs[2 * blockIdx.x], sid = pairs[2 * blockIdx.x + 1];
	const uint32_t h = blockIdx.y;

	if (o < 0 || (uint32_t)o >= l.n_open || sid < 0 || (uint32_t)sid >= l.n_sealed)
		return;
	rows src;
	src.open = open_head(l, base, (uint32_t)o, h);
	src.in_k = src.in_v = NULL;
	src.from_open = l.B;
	src.in_row = 0;
	src.in_stride = 0;
	seal_one<FK, FV, TILES>(l, base, h, sealed_head_w(l, base, (uint32_t)sid, h), src, smem, parts);
}

/* The write and seal kernels for a layer: its pair's own where the pair has
 * attention kernels (instances.h), else the one that chooses per part. */
template <int FK, int FV> static const void *tiles_write(void)
{
	if constexpr (tiles_pair<FK, FV>::ok)
		return (const void *)write_kernel<FK, FV, 1>;
	return NULL;
}

template <int FK, int FV> static const void *tiles_seal(void)
{
	if constexpr (tiles_pair<FK, FV>::ok)
		return (const void *)seal_kernel<FK, FV, 1>;
	return NULL;
}

struct write_fns {
	int k, v;
	const void *write, *seal;       /* staged */
	const void *write_t, *seal_t;   /* by tiles, or NULL */
};
#define WRITE_PAIR(K, V) \
	{ KVQ_FMT_##K, KVQ_FMT_##V, (const void *)write_kernel<KVQ_FMT_##K, KVQ_FMT_##V, 0>, \
	  (const void *)seal_kernel<KVQ_FMT_##K, KVQ_FMT_##V, 0>, tiles_write<KVQ_FMT_##K, KVQ_FMT_##V>(), \
	  tiles_seal<KVQ_FMT_##K, KVQ_FMT_##V>() },
static const write_fns fns_by_pair[] = { KVQ_CUDA_PAIRS(WRITE_PAIR) };
#undef WRITE_PAIR
static const write_fns fns_any = { ANY_FMT, ANY_FMT, (const void *)write_kernel<ANY_FMT, ANY_FMT, 0>,
				   (const void *)seal_kernel<ANY_FMT, ANY_FMT, 0>, NULL, NULL };

/* The kernel of a layer's write (or seal), its CTA's threads, its parts
 * staged at once and its shared memory: by tiles where its pair has them
 * and they fit, else staged. */
struct write_plan {
	const void *fn;
	uint32_t threads, parts;
	size_t smem;
};

static write_plan plan_for(const layer_dev &l, bool seal)
{
	const write_fns *f = &fns_any;

	for (const write_fns &p : fns_by_pair)
		if (p.k == l.kfmt && p.v == l.vfmt)
			f = &p;
	if (f->write_t && tiles_fit(l))
		return { seal ? f->seal_t : f->write_t, TILE_THREADS, 2, tiles_smem(l.B, l.D) };
	const uint32_t parts = seal_parts(l.B, l.D);
	return { seal ? f->seal : f->write, WRITE_THREADS, parts, seal_smem(l.B, l.D, parts) };
}

static int write_args_ok(const struct kvq_layout *L, uint32_t layer)
{
	if (!L || layer >= L->layers || L->head_dim % 8 || seal_smem(L->block_tokens, L->head_dim, 1) > 160 * 1024)
		return 0;
	return 1;
}

static int launch_setup(const void *fn, size_t smem)
{
	if (smem > 48 * 1024 &&
	    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
		return fail_launch();
	return 0;
}

} /* namespace kvq */

using namespace kvq;

extern "C" int kvq_cuda_write(const struct kvq_layout *L, void *base, uint32_t layer,
			      const struct kvq_seq_table *seqs, uint32_t nseq, uint32_t max_m,
			      const void *k, const void *v, void *stream)
{
	if (!write_args_ok(L, layer) || !base || (nseq && !seqs) || (max_m && (!k || !v)) ||
	    max_m > (1u << 24) || nseq > 65535 || L->kv_heads > 65535)
		return -EINVAL;
	if (!nseq)
		return 0;
	const uint32_t B = L->block_tokens;
	/* blocks from S(n)/B to the last one holding a new token */
	const uint32_t nblk = (L->window + max_m) / B + 2;
	layer_dev ld = layer_of(L, layer);
	write_plan w = plan_for(ld, false);
	int r = launch_setup(w.fn, w.smem);
	if (r)
		return r;
	uint8_t *b = (uint8_t *)base;
	const uint8_t *kin = (const uint8_t *)k, *vin = (const uint8_t *)v;
	void *args[] = { &ld, &b, &seqs, &kin, &vin, &w.parts };
	return cudaLaunchKernel(w.fn, dim3(nblk, L->kv_heads, nseq), dim3(w.threads), args, w.smem,
				(cudaStream_t)stream) == cudaSuccess ? 0 : fail_launch();
}

extern "C" int kvq_cuda_seal(const struct kvq_layout *L, void *base, uint32_t layer,
			     const int32_t *pairs, uint32_t npairs, void *stream)
{
	if (!write_args_ok(L, layer) || !base || (npairs && !pairs) || npairs > (1u << 30) || L->kv_heads > 65535)
		return -EINVAL;
	if (!npairs)
		return 0;
	layer_dev ld = layer_of(L, layer);
	write_plan w = plan_for(ld, true);
	int r = launch_setup(w.fn, w.smem);
	if (r)
		return r;
	uint8_t *b = (uint8_t *)base;
	void *args[] = { &ld, &b, &pairs, &w.parts };
	return cudaLaunchKernel(w.fn, dim3(npairs, L->kv_heads), dim3(w.threads), args, w.smem,
				(cudaStream_t)stream) == cudaSuccess ? 0 : fail_launch();
}
