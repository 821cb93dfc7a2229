/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The seal of a block's head slice by tiles (write.cu's seal_head_tiles,
 * D = 64 or 128, every scalar format): once the block's rows are staged, a
 * warp seals one part (K or V) alone, with no barrier.  A lane takes an
 * 8 x 8 tile of the staged rows at a time (8 tokens from a multiple of 8,
 * 8 dims), D / 8 lanes across a row, 32 / (D / 8) tiles down the tokens
 * a pass:
 *   - ranges from packed 16-bit min/max of the tile in registers (exact: a
 *     min or max of FP16 or BF16 values is one of them; NaN ignored as
 *     fminf/fmaxf do): a token's or a group's along its row, a channel's
 *     down its column;
 *   - the lanes that share an entry (a token, a group, a channel) reduce
 *     it by halving exchanges (team_reduce), so that each lane ends with
 *     the whole range of a few entries and makes only their parameters
 *     (team_make); the others take them by shuffles (team::take);
 *   - codes of a row of the tile (K's storage order, [t][d]) or of a column
 *     (V's, [d][t]) are one word (16, 8, 4 or 2 bytes), read again from
 *     the staged rows, made and stored at once, one word at a time.
 * The arithmetic of every code is codes.cuh's, the CPU's bit for bit.
 */
#ifndef KVQ_CUDA_SEAL_TILES_CUH
#define KVQ_CUDA_SEAL_TILES_CUH

#include "codes.cuh"
#include "common.cuh"
#include "rows.cuh"

namespace kvq {

/* The lanes of a pass at head dim D: DL across a row, TL tiles down. */
template <unsigned D> struct tiling {
	static constexpr unsigned dl = D / 8, tl = 32 / dl, tokens = 8 * tl;
};

/* A 16-bit pair with NaN in both halves (0x7fff is a NaN in FP16 and
 * BF16), which no min or max takes: where a channel's range starts. */
#define TILE_NAN2 0x7fff7fffu

/* Packed min and max of two pairs of activation words (dtype DT): NaN
 * ignored, as fminf/fmaxf. */
template <int DT> __device__ __forceinline__ uint32_t pmin(uint32_t a, uint32_t b)
{
	uint32_t r;
	if (DT == KVQ_DT_BF16)
		asm("min.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	else
		asm("min.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	return r;
}

template <int DT> __device__ __forceinline__ uint32_t pmax(uint32_t a, uint32_t b)
{
	uint32_t r;
	if (DT == KVQ_DT_BF16)
		asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	else
		asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
	return r;
}

template <int DT, bool MAX> __device__ __forceinline__ uint32_t pext(uint32_t a, uint32_t b)
{
	return MAX ? pmax<DT>(a, b) : pmin<DT>(a, b);
}

/* Half h (0: the low one) of a pair of activation words, as a float. */
template <int DT> __device__ __forceinline__ float half_f(uint32_t w, unsigned h)
{
	if (DT == KVQ_DT_BF16)
		return __uint_as_float(h ? w & 0xffff0000u : w << 16);
	return __half2float(__ushort_as_half((unsigned short)(h ? w >> 16 : w)));
}

/* An FP16 scale or zero (never a NaN) as a float. */
__device__ __forceinline__ float param_f(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

/* Loads a tile (w[r][k]: dims 2k, 2k + 1 of row r) from its first row's
 * eight elements at x0, rows `row` halves apart. */
__device__ __forceinline__ void tile_load(const uint16_t *x0, uint32_t row, uint32_t w[8][4])
{
#pragma unroll
	for (unsigned r = 0; r < 8; r++) {
		const uint4 v = *reinterpret_cast<const uint4 *>(x0 + r * row);
		w[r][0] = v.x;
		w[r][1] = v.y;
		w[r][2] = v.z;
		w[r][3] = v.w;
	}
}

/* The team of an entry: N lanes, STRIDE apart, that hold parts of the same
 * eight entries' ranges (entry j in half j % 2 of word j / 2).  Halving
 * exchanges: at step i (0, 1) the lanes whose bit i of their index k is 0
 * keep the lower half of the words they still hold and send the upper
 * half, the others the reverse; from step 2 on (N >= 8) each lane reduces
 * the one word it keeps with its partner's whole.  Lane k ends with S =
 * min(log2 N, 3) bits of k chosen: 8 >> S entries, from entry
 * team_first(k, S), in its words [0, 4 >> S) (for S = 3 one entry, half
 * k >> 2 & 1 of word 0).  MAX: a max (else a min). */
template <int DT, bool MAX, unsigned N, unsigned STRIDE>
__device__ __forceinline__ void team_reduce(uint32_t v[4], uint32_t k)
{
	if (N >= 2) {
		const bool up = k & 1;
#pragma unroll
		for (unsigned i = 0; i < 2; i++) {
			const uint32_t got = __shfl_xor_sync(0xffffffffu, up ? v[i] : v[i + 2], STRIDE);
			v[i] = pext<DT, MAX>(up ? v[i + 2] : v[i], got);
		}
	}
	if (N >= 4) {
		const bool up = k >> 1 & 1;
		const uint32_t got = __shfl_xor_sync(0xffffffffu, up ? v[0] : v[1], 2 * STRIDE);
		v[0] = pext<DT, MAX>(up ? v[1] : v[0], got);
	}
#pragma unroll
	for (unsigned o = 4; o < N; o *= 2)
		v[0] = pext<DT, MAX>(v[0], __shfl_xor_sync(0xffffffffu, v[0], o * STRIDE));
}

static constexpr __host__ __device__ unsigned team_steps(unsigned N)
{
	return N >= 8 ? 3 : N >= 4 ? 2 : N >= 2 ? 1 : 0;
}

/* The first entry lane k holds after team_reduce (S steps): bit 0 of k
 * chose entries 0-3 or 4-7, bit 1 a pair, bit 2 one of the pair. */
__device__ __forceinline__ uint32_t team_first(uint32_t k, unsigned S)
{
	return (S >= 1 ? (k & 1) * 4 : 0) + (S >= 2 ? (k >> 1 & 1) * 2 : 0) + (S >= 3 ? (k >> 2 & 1) : 0);
}

/* The index in the team of a lane that holds entry j, and where: the
 * inverse of team_first. */
static constexpr __host__ __device__ unsigned team_holder(unsigned j, unsigned S)
{
	return (S >= 1 ? j >> 2 & 1 : 0) | (S >= 2 ? (j >> 1 & 1) << 1 : 0) | (S >= 3 ? (j & 1) << 2 : 0);
}

static constexpr __host__ __device__ unsigned team_slot(unsigned j, unsigned S)
{
	return j % (8u >> S);
}

/* An entry's parameters as the CPU's seal_part() makes them from its range
 * (lo, hi as activation words: hi alone, the largest magnitude, for
 * PARAM_TOKEN): *sz the FP16 scale and zero (zero << 16), *r what its codes
 * take (1 / scale, NaN where the reciprocal could stray: rint_by_recip, or
 * the scale for FP8). */
template <int F, int KIND> __device__ __forceinline__ void entry_params(float lo, float hi, uint32_t *sz, float *r)
{
	const float qmax = kvq_fmt_qmax(F);
	uint16_t s, z = 0;

	if (KIND == KVQ_PARAM_TOKEN) {
		hi = fmaxf(hi, 0.0f);   /* the CPU's amax starts at 0 */
		lo = 0.0f;
		s = kvq_sym_scale(hi, qmax);
	} else {
		lo = lo != lo ? INFINITY : lo;   /* no number in the range */
		hi = hi != hi ? -INFINITY : hi;
		kvq_asym_params(lo, hi, qmax, &s, &z);
	}
	*sz = s | (uint32_t)z << 16;
	*r = recip<F>::ok && !recip_in_range(KIND, make_float2(lo, hi), s, z) ? __int_as_float(0x7fc00000)
										: scale_f<F>(s);
}

/* The entries a team's lane makes (team_make) and how the others take
 * them (team_take): S halving steps (team_reduce), M entries a lane. */
template <unsigned N, unsigned STRIDE> struct team {
	static constexpr unsigned S = team_steps(N), M = 8u >> S;
	float r[M], z[M];   /* what the codes of its entries take */
	uint32_t base;      /* the lane of index 0 (of the S bits) of this one's team */

	/* Entry j from its maker: j may differ across calls, not across the
	 * lanes of one call. */
	__device__ __forceinline__ float take(const float (&v)[M], uint32_t j) const
	{
		float x = v[0];
#pragma unroll
		for (unsigned i = 1; i < M; i++)   /* a select (not an indexed load from local memory) */
			asm("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %2, %3;\n\tselp.f32 %0, %1, %0, p;\n\t}"
			    : "+f"(x)
			    : "f"(v[i]), "r"(team_slot(j, S)), "r"(i));
		return __shfl_sync(0xffffffffu, x, base + team_holder(j, S) * STRIDE);
	}
};

/* Parameters of a team's eight entries from its ranges (team_reduce of lo
 * and hi): lane k makes those it holds and stores them (PUT(j, sz), the
 * first of each set of holders only); then the warp's stores are seen by
 * all its lanes (the reference reads them back). */
template <int F, int KIND, int DT, unsigned N, unsigned STRIDE, typename PUT>
__device__ __forceinline__ void team_make(const uint32_t lo[4], const uint32_t hi[4], uint32_t k, uint32_t lane,
					  team<N, STRIDE> &tm, PUT store)
{
	constexpr unsigned S = team<N, STRIDE>::S, M = team<N, STRIDE>::M;
	const uint32_t j0 = team_first(k, S);

	tm.base = lane - (k % (1u << S)) * STRIDE;
#pragma unroll
	for (unsigned i = 0; i < M; i++) {
		/* S = 3: one entry, in half k >> 2 & 1 of word 0 */
		const unsigned wi = S == 3 ? 0 : i / 2, h = S == 3 ? (k >> 2 & 1) : i % 2;
		uint32_t sz;
		entry_params<F, KIND>(half_f<DT>(lo[wi], h), half_f<DT>(hi[wi], h), &sz, &tm.r[i]);
		tm.z[i] = param_f((uint16_t)(sz >> 16));
		if (k < (1u << S))
			store(j0 + i, sz);
	}
	__syncwarp();
}

/* All eight entries of the team: r[j], z[j]. */
template <int KIND, unsigned N, unsigned STRIDE>
__device__ __forceinline__ void team_take(const team<N, STRIDE> &tm, float r[8], float z[8])
{
#pragma unroll
	for (unsigned j = 0; j < 8; j++) {
		r[j] = tm.take(tm.r, j);
		z[j] = KIND == KVQ_PARAM_TOKEN ? 0.0f : tm.take(tm.z, j);
	}
}

/* Ranges of a tile's rows (ROWS) or columns, packed: entry j (row or
 * column j) in half j % 2 of word j / 2.  A token's magnitude (ABS) or
 * its plain min (MAX false) or max. */
template <int DT, bool MAX, bool ABS, bool ROWS>
__device__ __forceinline__ void tile_ranges(const uint32_t w[8][4], uint32_t out[4])
{
	const uint32_t m = ABS ? 0x7fff7fffu : 0xffffffffu;

	if (ROWS) {
#pragma unroll
		for (unsigned r = 0; r < 8; r += 2) {
			const uint32_t a = pext<DT, MAX>(pext<DT, MAX>(w[r][0] & m, w[r][1] & m),
							 pext<DT, MAX>(w[r][2] & m, w[r][3] & m));
			const uint32_t b = pext<DT, MAX>(pext<DT, MAX>(w[r + 1][0] & m, w[r + 1][1] & m),
							 pext<DT, MAX>(w[r + 1][2] & m, w[r + 1][3] & m));
			out[r / 2] = pext<DT, MAX>(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
		}
	} else {
#pragma unroll
		for (unsigned k = 0; k < 4; k++) {
			uint32_t x = w[0][k];
#pragma unroll
			for (unsigned r = 1; r < 8; r++)
				x = pext<DT, MAX>(x, w[r][k]);
			out[k] = x;
		}
	}
}

/* A word of eight codes in storage order, BITS each (element e at bits
 * BITS * e of the word's BITS bytes). */
struct word8 {
	uint32_t v[4];
};

/* The codes of eight activation words x[e] with their entries' r[e], z[e]
 * (entry_params); where a quotient lies too near a half-integer for the
 * reciprocal (rint_by_recip), that element's code is the reference's, from
 * its entry's stored scale (scale(e), as a float): rare, and only for the
 * lanes and elements that need it. */
template <int F, int KIND, int DT, typename SCALE>
__device__ __forceinline__ void word_codes(const uint16_t x[8], const float r[8], const float z[8], SCALE scale,
					   word8 &out)
{
	constexpr unsigned BITS = fmt<F>::bits;
	uint32_t code[8];
	bool sure = true;

#pragma unroll
	for (unsigned e = 0; e < 8; e++) {
		const float f = half_f<DT>(x[e], 0);
		if constexpr (KIND == KVQ_PARAM_NONE)
			code[e] = code16<F>(DT, x[e]);
		else if constexpr (recip<F>::ok)
			sure &= rint_by_recip(KIND == KVQ_PARAM_TOKEN ? f : __fsub_rn(f, z[e]), r[e],
					      recip_sure(kvq_fmt_qmax(F)), &code[e]);
	}
	if constexpr (KIND != KVQ_PARAM_NONE && recip<F>::ok) {
		if (!sure) {
#pragma unroll
			for (unsigned e = 0; e < 8; e++) {
				const float f = half_f<DT>(x[e], 0);
				uint32_t c;
				if (rint_by_recip(KIND == KVQ_PARAM_TOKEN ? f : __fsub_rn(f, z[e]), r[e],
						  recip_sure(kvq_fmt_qmax(F)), &c))
					continue;
				/* biased as the others (rint_by_recip) */
				code[e] = CODE_BIAS + (KIND == KVQ_PARAM_TOKEN
							       ? kvq_code_sym(F, f, scale(e))
							       : kvq_code_asym(f, scale(e), z[e], kvq_fmt_qmax(F)));
			}
		}
	}
	if constexpr (fp8_hw<F>::ok) {
		float f[8];
		float2 sc[8];
#pragma unroll
		for (unsigned e = 0; e < 8; e++) {
			f[e] = half_f<DT>(x[e], 0);
			sc[e] = make_float2(r[e], 0.0f);
		}
		fp8_codes<F>(f, sc, code);
	} else if constexpr (KIND != KVQ_PARAM_NONE && !recip<F>::ok) {
#pragma unroll
		for (unsigned e = 0; e < 8; e++)
			code[e] = kvq_code_sym(F, half_f<DT>(x[e], 0), r[e]);
	}
	if constexpr (BITS == 16) {
#pragma unroll
		for (unsigned e = 0; e < 8; e += 2)
			out.v[e / 2] = __byte_perm(code[e], code[e + 1], 0x5410);
	} else if constexpr (BITS == 8) {   /* a code's low byte */
		out.v[0] = __byte_perm(__byte_perm(code[0], code[1], 0x0040), __byte_perm(code[2], code[3], 0x0040), 0x5410);
		out.v[1] = __byte_perm(__byte_perm(code[4], code[5], 0x0040), __byte_perm(code[6], code[7], 0x0040), 0x5410);
	} else {
		/* codes biased by CODE_BIAS (rint_by_recip): a shift and an add
		 * a code, the biases taken off at once; modulo 2^32 what is
		 * left is the codes in their fields */
		uint32_t v = 0, bias = 0;
#pragma unroll
		for (unsigned e = 0; e < 8; e++) {
			v += code[e] << (e * BITS);
			bias += CODE_BIAS << (e * BITS);
		}
		out.v[0] = v - bias;
	}
}

/* The index of a parameter entry: kvq_param_index's with the constants. */
template <int KIND, int IS_V, unsigned G, unsigned D>
__device__ __forceinline__ uint32_t param_at(uint32_t t, uint32_t d, uint32_t B)
{
	return kvq_param_index(KIND, G, IS_V, t, d, B, D);
}

/* Stores a word of BITS-bit codes at p. */
template <unsigned BITS> __device__ __forceinline__ void word_store(uint8_t *p, const word8 &w)
{
	if constexpr (BITS == 16)
		*reinterpret_cast<uint4 *>(p) = make_uint4(w.v[0], w.v[1], w.v[2], w.v[3]);
	else if constexpr (BITS == 8)
		*reinterpret_cast<uint2 *>(p) = make_uint2(w.v[0], w.v[1]);
	else if constexpr (BITS == 4)
		*reinterpret_cast<uint32_t *>(p) = w.v[0];
	else
		*reinterpret_cast<uint16_t *>(p) = (uint16_t)w.v[0];
}

/* Seals one part of format F (V when IS_V) of a block of B tokens (a
 * multiple of tiling<D>::tokens) from its staged rows xs (xs_at's order,
 * rows of D + SEAL_PAD halves) into its codes and params fields; called by
 * a whole warp.  The words of a tile are made one at a time in a loop (one
 * copy of their code: the warps of one SM run two parts' code at once, and
 * unrolled they missed the instruction caches), each from the staged rows
 * again: a 16-byte load for a row of K, eight 2-byte ones for a column of
 * V. */
template <int F, int IS_V, int DT, unsigned D>
__device__ void tile_part(const uint16_t *xs, uint32_t B, uint8_t *codes, uint8_t *params)
{
	using T = tiling<D>;
	constexpr int KIND = IS_V ? fmt<F>::kind_v : fmt<F>::kind_k;
	constexpr unsigned BITS = fmt<F>::bits, G = IS_V ? fmt<F>::group_v : fmt<F>::group_k;
	/* lanes that share a token's (N = D / 8) or a group's range */
	constexpr unsigned N = KIND == KVQ_PARAM_GROUP ? G / 8 : T::dl;
	constexpr bool ROWS = KIND == KVQ_PARAM_TOKEN || KIND == KVQ_PARAM_GROUP;
	const uint32_t lane = threadIdx.x & 31, dt = lane % T::dl, tt = lane / T::dl, d0 = dt * 8, row = D + SEAL_PAD;
	uint32_t w[8][4];
	float r[8] = {}, z[8] = {};
	team<ROWS ? N : T::tl, ROWS ? 1 : T::dl> tm;

	if constexpr (KIND == KVQ_PARAM_CHANNEL) {   /* a channel's range down all passes first */
		uint32_t lo[4], hi[4];
#pragma unroll
		for (unsigned k = 0; k < 4; k++)
			lo[k] = hi[k] = TILE_NAN2;
		for (uint32_t p = 0; p < B; p += T::tokens) {
			uint32_t a[4], b[4];
			tile_load(xs + xs_at(p + 8 * tt, d0, row), row, w);
			tile_ranges<DT, false, false, false>(w, a);
			tile_ranges<DT, true, false, false>(w, b);
#pragma unroll
			for (unsigned k = 0; k < 4; k++) {
				lo[k] = pmin<DT>(lo[k], a[k]);
				hi[k] = pmax<DT>(hi[k], b[k]);
			}
		}
		team_reduce<DT, false, T::tl, T::dl>(lo, tt);
		team_reduce<DT, true, T::tl, T::dl>(hi, tt);
		team_make<F, KIND, DT>(lo, hi, tt, lane, tm, [&](uint32_t j, uint32_t v) {
			reinterpret_cast<uint32_t *>(params)[d0 + j] = v;
		});
		team_take<KIND>(tm, r, z);
	}
	for (uint32_t p = 0; p < B; p += T::tokens) {
		const uint32_t t0 = p + 8 * tt;
		/* row r of the tile at x0 + r * row: the XOR is the tile's */
		const uint16_t *x0 = xs + xs_at(t0, d0, row);
		if constexpr (ROWS) {
			constexpr bool TOKEN = KIND == KVQ_PARAM_TOKEN;
			uint32_t lo[4] = {}, hi[4];
			tile_load(x0, row, w);
			if (!TOKEN) {
				tile_ranges<DT, false, false, true>(w, lo);
				team_reduce<DT, false, N, 1>(lo, dt % N);
			}
			tile_ranges<DT, true, TOKEN, true>(w, hi);
			team_reduce<DT, true, N, 1>(hi, dt % N);
			team_make<F, KIND, DT>(lo, hi, dt % N, lane, tm, [&](uint32_t j, uint32_t v) {
				if (TOKEN)
					reinterpret_cast<uint16_t *>(params)[t0 + j] = (uint16_t)v;
				else
					reinterpret_cast<uint32_t *>(params)[param_at<KIND, IS_V, N * 8, D>(t0 + j, d0, B)] = v;
			});
			if (IS_V)   /* a column's elements are the tile's rows: all eight */
				team_take<KIND>(tm, r, z);
		}
#pragma unroll 1
		for (uint32_t i = 0; i < 8; i++) {
			uint16_t x[8];
			float rr[8], zz[8];
			if (IS_V) {   /* column i: element e from row e */
#pragma unroll
				for (unsigned e = 0; e < 8; e++)
					x[e] = x0[e * row + i];
			} else {      /* row i */
				const uint4 v = *reinterpret_cast<const uint4 *>(x0 + i * row);
				const uint32_t q[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
				for (unsigned e = 0; e < 8; e++)
					x[e] = (uint16_t)(q[e / 2] >> (e % 2 * 16));
			}
			if (IS_V || KIND == KVQ_PARAM_CHANNEL || KIND == KVQ_PARAM_NONE) {
#pragma unroll
				for (unsigned e = 0; e < 8; e++) {
					rr[e] = r[e];
					zz[e] = z[e];
				}
			} else {      /* K by token or group: row i's entry */
				const float ri = tm.take(tm.r, i), zi = KIND == KVQ_PARAM_TOKEN ? 0.0f : tm.take(tm.z, i);
#pragma unroll
				for (unsigned e = 0; e < 8; e++) {
					rr[e] = ri;
					zz[e] = zi;
				}
			}
			/* the stored scale of element e's entry, for the reference */
			auto scale = [&](unsigned e) {
				const uint32_t t = t0 + (IS_V ? e : i), d = d0 + (IS_V ? i : e);
				if (KIND == KVQ_PARAM_TOKEN)
					return param_f(reinterpret_cast<const uint16_t *>(params)[t]);
				return param_f(reinterpret_cast<const uint16_t *>(
					params)[2 * (KIND == KVQ_PARAM_CHANNEL ? d : param_at<KIND, IS_V, G, D>(t, d, B))]);
			};
			word8 out;
			word_codes<F, KIND, DT>(x, rr, zz, scale, out);
			/* K: row t0 + i from dim d0; V: dim d0 + i from token t0 */
			const uint32_t at = IS_V ? (d0 + i) * B + t0 : (t0 + i) * D + d0;
			word_store<BITS>(codes + at * BITS / 8, out);
		}
	}
}

/* tile_part for the layer's head dim (64 or 128) and activation dtype. */
template <int F, int IS_V>
__device__ void tile_seal(uint32_t D, int act, const uint16_t *xs, uint32_t B, uint8_t *codes, uint8_t *params)
{
	if (D == 128) {
		if (act == KVQ_DT_BF16)
			tile_part<F, IS_V, KVQ_DT_BF16, 128>(xs, B, codes, params);
		else
			tile_part<F, IS_V, KVQ_DT_F16, 128>(xs, B, codes, params);
	} else {
		if (act == KVQ_DT_BF16)
			tile_part<F, IS_V, KVQ_DT_BF16, 64>(xs, B, codes, params);
		else
			tile_part<F, IS_V, KVQ_DT_F16, 64>(xs, B, codes, params);
	}
}

} /* namespace kvq */

#endif
