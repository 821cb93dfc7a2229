/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The staged seal (write.cu's seal_head): a CTA of WRITE_THREADS threads
 * seals a block's head slice from its staged rows in three phases between
 * barriers, every format (part_run): teams of lanes, one per parameter
 * entry (a token, a token's group, a channel), reduce its range with
 * shuffles; one thread per entry makes the FP16 parameters; threads each
 * make one word of storage order (16 bytes, 8 of 2-bit codes), eight
 * elements of a row of K or a column of V at a time, and store it at once;
 * a codebook format's (pq2, pq1) one code per (token, subspace) at a time,
 * the nearest of the head's centroids (kvq_pq_encode).  write.cu takes it
 * where the seal by tiles (seal_tiles.cuh) does not apply.  zero_gaps
 * serves both seals.
 */
#ifndef KVQ_CUDA_SEAL_STAGED_CUH
#define KVQ_CUDA_SEAL_STAGED_CUH

#include "codes.cuh"
#include "common.cuh"
#include "rows.cuh"

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

} /* namespace kvq */

#endif
