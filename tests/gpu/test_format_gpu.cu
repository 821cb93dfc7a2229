// SPDX-License-Identifier: Apache-2.0
// The format arithmetic of kernels/kvq_format.h on the GPU: identical bytes to
// the same code on the host (the CPU kernels' path), and agreement with the
// GPU's own conversions (cvt.rn.satfinite to FP8, __float2half_rn/ru/rd,
// __float2bfloat16_rn); and the decode kernels' conversions of codes to
// FP16/BF16 pairs (decode_frag.cuh, convert.cuh) against the codes' values on
// the host.  TAP output; skipped where no CUDA device is usable.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kvq_format.h"
#include "cuda/decode_frag.cuh"

enum { OUT_E4M3, OUT_E5M2, OUT_F16RN, OUT_F16RU, OUT_F16RD, OUT_BF16, OUT_SCALE, OUT_ZERO, NOUT };

static int ntest, nfail;

static void ok(bool cond, const char *what, long bad)
{
	ntest++;
	if (!cond)
		nfail++;
	printf("%s %d - %s (%ld differ)\n", cond ? "ok" : "not ok", ntest, what, bad);
}

// Ours on the device: out[k][i]; theirs (hardware/intrinsics) likewise.
__global__ void convert(const float *x, int n, uint32_t *ours, uint32_t *hw)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	float v = x[i];
	ours[OUT_E4M3 * n + i] = kvq_fp8_e4m3_enc(v);
	ours[OUT_E5M2 * n + i] = kvq_fp8_e5m2_enc(v);
	ours[OUT_F16RN * n + i] = kvq_f16_from_f32_mode(v, KVQ_RNE);
	ours[OUT_F16RU * n + i] = kvq_f16_from_f32_mode(v, KVQ_RUP);
	ours[OUT_F16RD * n + i] = kvq_f16_from_f32_mode(v, KVQ_RDOWN);
	ours[OUT_BF16 * n + i] = kvq_bf16_from_f32(v);
	ours[OUT_SCALE * n + i] = kvq_f16_scale(v);
	ours[OUT_ZERO * n + i] = kvq_f16_zero(v);
	hw[OUT_E4M3 * n + i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
	hw[OUT_E5M2 * n + i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
	hw[OUT_F16RN * n + i] = __half_as_ushort(__float2half_rn(v));
	hw[OUT_F16RU * n + i] = __half_as_ushort(__float2half_ru(v));
	hw[OUT_F16RD * n + i] = __half_as_ushort(__float2half_rd(v));
	hw[OUT_BF16 * n + i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// The decode kernels' pairs of each word w (out: PAIRS words per input):
// 4-bit (dec_nib, i < 4) and 2-bit (dec_crumb, i < 8) codes, then the four
// 8-bit codes of w as int8, e4m3 and e5m2 (dec_cvt_code::four, two pairs
// each); every kind in FP16, then in BF16.
enum { PAIRS_ONE = 4 + 8 + 3 * 2, PAIRS = 2 * PAIRS_ONE };

template <int ACT> __device__ void pairs_of(uint32_t w, uint32_t *o)
{
	for (int i = 0; i < 4; i++)
		o[i] = kvq::dec_nib<ACT>(w, i);
	for (int i = 0; i < 8; i++)
		o[4 + i] = kvq::dec_crumb<ACT>(w, i);
	kvq::dec_cvt_code<KVQ_CODE_SINT, ACT>::four(w, o[12], o[13]);
	kvq::dec_cvt_code<KVQ_CODE_E4M3, ACT>::four(w, o[14], o[15]);
	kvq::dec_cvt_code<KVQ_CODE_E5M2, ACT>::four(w, o[16], o[17]);
}

__global__ void pairs(const uint32_t *w, int n, uint32_t *out)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	pairs_of<KVQ_DT_F16>(w[i], out + (size_t)i * PAIRS);
	pairs_of<KVQ_DT_BF16>(w[i], out + (size_t)i * PAIRS + PAIRS_ONE);
}

// What pair j of word w must hold, as two floats (pairs_of's order).
static void pair_want(uint32_t w, int j, float *a, float *b)
{
	const uint8_t by[4] = { (uint8_t)w, (uint8_t)(w >> 8), (uint8_t)(w >> 16), (uint8_t)(w >> 24) };
	if (j < 4) {   // codes j and j + 4 of 8 nibbles: nibble j of each half
		*a = (float)((w >> (4 * j)) & 15u);
		*b = (float)((w >> (16 + 4 * j)) & 15u);
	} else if (j < 12) {   // crumb j - 4 of each half
		*a = (float)((w >> (2 * (j - 4))) & 3u);
		*b = (float)((w >> (16 + 2 * (j - 4))) & 3u);
	} else {   // codes (0, 1) then (2, 3) of the bytes
		const int k = (j - 12) / 2, lo = (j - 12) % 2 * 2;
		for (int e = 0; e < 2; e++) {
			const uint8_t c = by[lo + e];
			const float f = k == 0 ? (float)(int8_t)c : k == 1 ? kvq_fp8_e4m3_dec(c) : kvq_fp8_e5m2_dec(c);
			*(e ? b : a) = f;
		}
	}
}

// Quantizes one group of G values as the seal step does: symmetric int8 and
// FP8 per group, asymmetric 4- and 2-bit per group.  The same function runs on
// the device and on the host, so any difference is the compilers' arithmetic.
#define G 32
static __host__ __device__ void quantize_group(const float *v, uint8_t *codes, uint16_t *params)
{
	float amax = 0.0f, mn = INFINITY, mx = -INFINITY;
	for (int i = 0; i < G; i++) {
		amax = fmaxf(amax, fabsf(v[i]));
		mn = fminf(mn, v[i]);
		mx = fmaxf(mx, v[i]);
	}
	const int fmts[3] = { KVQ_FMT_INT8, KVQ_FMT_FP8, KVQ_FMT_FP8E5M2 };
	for (int f = 0; f < 3; f++) {
		uint16_t s = kvq_sym_scale(amax, kvq_fmt_qmax(fmts[f]));
		params[f] = s;
		for (int i = 0; i < G; i++)
			codes[f * G + i] = (uint8_t)kvq_code_sym(fmts[f], v[i], kvq_f16_to_f32(s));
	}
	const float qmax[2] = { 15.0f, 3.0f };
	for (int b = 0; b < 2; b++) {
		uint16_t s, z;
		kvq_asym_params(mn, mx, qmax[b], &s, &z);
		params[3 + 2 * b] = s;
		params[4 + 2 * b] = z;
		for (int i = 0; i < G; i++)
			codes[(3 + b) * G + i] =
				(uint8_t)kvq_code_asym(v[i], kvq_f16_to_f32(s), kvq_f16_to_f32(z), qmax[b]);
	}
}

__global__ void quantize(const float *x, int ngroups, uint8_t *codes, uint16_t *params)
{
	int g = blockIdx.x * blockDim.x + threadIdx.x;
	if (g < ngroups)
		quantize_group(x + (size_t)g * G, codes + (size_t)g * 5 * G, params + (size_t)g * 7);
}

static void host_quantize(const float *x, int ngroups, uint8_t *codes, uint16_t *params)
{
	for (int g = 0; g < ngroups; g++)
		quantize_group(x + (size_t)g * G, codes + (size_t)g * 5 * G, params + (size_t)g * 7);
}

#define CHECK(call)                                                                      \
	do {                                                                             \
		cudaError_t e_ = (call);                                                 \
		if (e_ != cudaSuccess) {                                                 \
			printf("Bail out! %s: %s\n", #call, cudaGetErrorString(e_));      \
			exit(1);                                                         \
		}                                                                        \
	} while (0)

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next_rand()
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

int main()
{
	int ndev = 0;
	cudaError_t e = cudaGetDeviceCount(&ndev);
	if (e != cudaSuccess || ndev == 0) {
		printf("1..0 # SKIP no usable CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
		return 0;
	}
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("# device %s, sm_%d%d\n", prop.name, prop.major, prop.minor);

	// inputs: every FP16 value, every FP8 midpoint region via random bits, edge values
	std::vector<float> x;
	for (uint32_t h = 0; h < 65536; h++)
		x.push_back(kvq_f16_to_f32((uint16_t)h));
	for (int i = 0; i < (1 << 22); i++) {
		uint32_t u = (uint32_t)next_rand();
		float f;
		memcpy(&f, &u, 4);
		x.push_back(f);
	}
	const float edge[] = { 0.0f, -0.0f, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65504.0f, 65520.0f,
			       65536.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 1e-45f, -1e-45f, 5.96e-8f, 2.98e-8f };
	x.insert(x.end(), edge, edge + sizeof edge / sizeof edge[0]);
	int n = (int)x.size();

	float *dx;
	uint32_t *dours, *dhw;
	CHECK(cudaMalloc(&dx, sizeof(float) * n));
	CHECK(cudaMalloc(&dours, sizeof(uint32_t) * n * NOUT));
	CHECK(cudaMalloc(&dhw, sizeof(uint32_t) * n * NOUT));
	CHECK(cudaMemset(dours, 0xff, sizeof(uint32_t) * n * NOUT));
	CHECK(cudaMemcpy(dx, x.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
	convert<<<(n + 255) / 256, 256>>>(dx, n, dours, dhw);
	CHECK(cudaGetLastError());
	std::vector<uint32_t> ours((size_t)n * NOUT), hw((size_t)n * NOUT);
	CHECK(cudaMemcpy(ours.data(), dours, sizeof(uint32_t) * n * NOUT, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(hw.data(), dhw, sizeof(uint32_t) * n * NOUT, cudaMemcpyDeviceToHost));

	const char *names[NOUT] = { "fp8 e4m3", "fp8 e5m2", "f16 rn", "f16 up", "f16 down", "bf16 rn",
				    "f16 scale (up, saturating)", "f16 zero (down, saturating)" };
	for (int k = 0; k < NOUT; k++) {
		long bad_host = 0, bad_hw = 0;
		for (int i = 0; i < n; i++) {
			float v = x[i];
			uint32_t host;
			switch (k) {
			case OUT_E4M3: host = kvq_fp8_e4m3_enc(v); break;
			case OUT_E5M2: host = kvq_fp8_e5m2_enc(v); break;
			case OUT_F16RN: host = kvq_f16_from_f32_mode(v, KVQ_RNE); break;
			case OUT_F16RU: host = kvq_f16_from_f32_mode(v, KVQ_RUP); break;
			case OUT_F16RD: host = kvq_f16_from_f32_mode(v, KVQ_RDOWN); break;
			case OUT_BF16: host = kvq_bf16_from_f32(v); break;
			case OUT_SCALE: host = kvq_f16_scale(v); break;
			default: host = kvq_f16_zero(v); break;
			}
			uint32_t o = ours[(size_t)k * n + i];
			bad_host += o != host;
			if (k <= OUT_BF16 && !isnan(v) && o != hw[(size_t)k * n + i]) {
				if (bad_hw < 3)
					printf("# %s(%a): ours %#x, GPU %#x\n", names[k], v, o, hw[(size_t)k * n + i]);
				bad_hw++;
			}
		}
		char what[160];
		snprintf(what, sizeof what, "%s: device bytes equal host bytes on %d inputs", names[k], n);
		ok(bad_host == 0, what, bad_host);
		if (k <= OUT_BF16) {
			snprintf(what, sizeof what, "%s: equal to the GPU's own conversion (NaN inputs aside)", names[k]);
			ok(bad_hw == 0, what, bad_hw);
		}
	}

	// quantization of groups with outliers: device == host, byte for byte
	int ngroups = 1 << 16;
	std::vector<float> v((size_t)ngroups * G);
	for (size_t i = 0; i < v.size(); i++) {
		double u = (double)(next_rand() >> 11) / 9007199254740992.0 - 0.5;
		double scale = (i / G) % 17 == 0 ? 80.0 : ((i / G) % 5 == 0 ? 1e-3 : 1.0);
		v[i] = (float)(u * scale * (i % 29 == 0 ? 60.0 : 1.0));
	}
	float *dv;
	uint8_t *dcodes;
	uint16_t *dparams;
	size_t ncodes = (size_t)ngroups * 5 * G, nparams = (size_t)ngroups * 7;
	CHECK(cudaMalloc(&dv, sizeof(float) * v.size()));
	CHECK(cudaMalloc(&dcodes, ncodes));
	CHECK(cudaMalloc(&dparams, nparams * 2));
	CHECK(cudaMemset(dcodes, 0xa5, ncodes));
	CHECK(cudaMemset(dparams, 0xa5, nparams * 2));
	CHECK(cudaMemcpy(dv, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice));
	quantize<<<(ngroups + 127) / 128, 128>>>(dv, ngroups, dcodes, dparams);
	CHECK(cudaGetLastError());
	std::vector<uint8_t> gc(ncodes), hc(ncodes);
	std::vector<uint16_t> gp(nparams), hp(nparams);
	CHECK(cudaMemcpy(gc.data(), dcodes, ncodes, cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(gp.data(), dparams, nparams * 2, cudaMemcpyDeviceToHost));
	host_quantize(v.data(), ngroups, hc.data(), hp.data());
	long badc = 0, badp = 0;
	for (size_t i = 0; i < ncodes; i++)
		badc += gc[i] != hc[i];
	for (size_t i = 0; i < nparams; i++)
		badp += gp[i] != hp[i];
	ok(badc == 0, "int8/fp8/fp8e5m2/4-bit/2-bit codes of 65536 groups: device == host", badc);
	ok(badp == 0, "their FP16 scales and zeros: device == host", badp);

	// the decode kernels' pairs: every low half with a random high half
	// (and every high half with a random low), each pair's two values equal
	// to its codes' (a NaN code to a NaN)
	std::vector<uint32_t> words;
	for (uint32_t h = 0; h < 65536; h++) {
		words.push_back(h | (uint32_t)next_rand() << 16);
		words.push_back(h << 16 | ((uint32_t)next_rand() & 0xffffu));
	}
	int nw = (int)words.size();
	uint32_t *dw, *dpairs;
	CHECK(cudaMalloc(&dw, sizeof(uint32_t) * nw));
	CHECK(cudaMalloc(&dpairs, sizeof(uint32_t) * nw * PAIRS));
	CHECK(cudaMemcpy(dw, words.data(), sizeof(uint32_t) * nw, cudaMemcpyHostToDevice));
	pairs<<<(nw + 255) / 256, 256>>>(dw, nw, dpairs);
	CHECK(cudaGetLastError());
	std::vector<uint32_t> pr((size_t)nw * PAIRS);
	CHECK(cudaMemcpy(pr.data(), dpairs, sizeof(uint32_t) * nw * PAIRS, cudaMemcpyDeviceToHost));
	const char *kinds[] = { "4-bit codes (dec_nib)", "2-bit codes (dec_crumb)", "int8 codes", "e4m3 codes", "e5m2 codes" };
	for (int act = 0; act < 2; act++)
		for (int kind = 0; kind < 5; kind++) {
			const int j0 = kind == 0 ? 0 : kind == 1 ? 4 : 12 + 2 * (kind - 2), j1 = kind == 0 ? 4 : kind == 1 ? 12 : j0 + 2;
			long bad = 0;
			for (int i = 0; i < nw; i++)
				for (int j = j0; j < j1; j++) {
					const uint32_t g = pr[(size_t)i * PAIRS + act * PAIRS_ONE + j];
					float want[2], got[2];
					pair_want(words[i], j, &want[0], &want[1]);
					for (int e = 0; e < 2; e++) {
						const uint16_t hb = (uint16_t)(e ? g >> 16 : g & 0xffffu);
						got[e] = act ? kvq_bf16_to_f32(hb) : kvq_f16_to_f32(hb);
						if (!(got[e] == want[e] || (isnan(got[e]) && isnan(want[e])))) {
							if (bad < 3)
								printf("# %s, %s: word %#x pair %d: %a, want %a\n", kinds[kind],
								       act ? "bf16" : "f16", words[i], j, got[e], want[e]);
							bad++;
						}
					}
				}
			char what[160];
			snprintf(what, sizeof what, "%s to %s pairs in the decode kernels: %d words, every value exact",
				 kinds[kind], act ? "BF16" : "FP16", nw);
			ok(bad == 0, what, bad);
		}
	cudaFree(dw);
	cudaFree(dpairs);

	cudaFree(dx);
	cudaFree(dours);
	cudaFree(dhw);
	cudaFree(dv);
	cudaFree(dcodes);
	cudaFree(dparams);
	printf("1..%d\n", ntest);
	return nfail ? 1 : 0;
}
