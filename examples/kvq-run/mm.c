/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvq_format.h"
#include "mm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MM_X86 1
#endif

#define MM_ROWS 4          /* rows dequantized together */
#define MM_TTILE 128
#define MM_MAX_THREADS 16

static unsigned mm_threads = 1;

unsigned mm_set_threads(unsigned n)
{
	mm_threads = n < 1 ? 1 : n > MM_MAX_THREADS ? MM_MAX_THREADS : n;
	return mm_threads;
}

void mm_dequant_row(uint32_t type, const uint8_t *row, uint32_t n, float *out)
{
	switch (type) {
	case GGUF_T_F32:
		memcpy(out, row, n * sizeof(float));
		break;
	case GGUF_T_F16:
	case GGUF_T_BF16:
		for (uint32_t i = 0; i < n; i++) {
			uint16_t h;

			memcpy(&h, row + 2 * i, 2);
			out[i] = type == GGUF_T_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
		}
		break;
	case GGUF_T_Q4_0:
	case GGUF_T_Q4_1: {
		/* per 32: fp16 d (, fp16 m), 16 bytes: low nibbles are elements
		 * 0..15, high nibbles 16..31; x = d * q + m (Q4_0: d * (q - 8)) */
		size_t bb = type == GGUF_T_Q4_1 ? 20 : 18;

		for (uint32_t b = 0; b < n / 32; b++) {
			const uint8_t *p = row + b * bb;
			uint16_t dh, mh = 0;
			float d, m;

			memcpy(&dh, p, 2);
			if (type == GGUF_T_Q4_1)
				memcpy(&mh, p + 2, 2);
			d = kvq_f16_to_f32(dh);
			m = type == GGUF_T_Q4_1 ? kvq_f16_to_f32(mh) : -8.0f * d;
			p += bb - 16;
			for (int j = 0; j < 16; j++) {
				out[b * 32 + j] = (float)(p[j] & 15) * d + m;
				out[b * 32 + j + 16] = (float)(p[j] >> 4) * d + m;
			}
		}
		break;
	}
	case GGUF_T_Q8_0:
		for (uint32_t b = 0; b < n / 32; b++) {
			const uint8_t *p = row + b * 34;
			uint16_t dh;
			float d;

			memcpy(&dh, p, 2);
			d = kvq_f16_to_f32(dh);
			for (int j = 0; j < 32; j++)
				out[b * 32 + j] = (float)(int8_t)p[2 + j] * d;
		}
		break;
	default:
		memset(out, 0, n * sizeof(float));
		break;
	}
}

/* ret[r] = dot(w + r * k, x) for r < MM_ROWS. */
static void dot4_portable(const float *w, const float *x, uint32_t k, float *ret)
{
	for (int r = 0; r < MM_ROWS; r++) {
		const float *wr = w + (size_t)r * k;
		float acc[8] = { 0 };

		for (uint32_t i = 0; i < k; i += 8)
			for (int j = 0; j < 8; j++)
				acc[j] += wr[i + j] * x[i + j];
		ret[r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
	}
}

#ifdef MM_X86
__attribute__((target("avx2,fma"))) static float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
	return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void dot4_avx2(const float *w, const float *x, uint32_t k, float *ret)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;

	for (uint32_t i = 0; i < k; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i);

		a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), xv, a0);
		a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + i), xv, a1);
		a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * (size_t)k + i), xv, a2);
		a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * (size_t)k + i), xv, a3);
	}
	ret[0] = hsum(a0);
	ret[1] = hsum(a1);
	ret[2] = hsum(a2);
	ret[3] = hsum(a3);
}

/* Two tokens at once: each row load feeds two FMAs. */
__attribute__((target("avx2,fma"))) static void dot4x2_avx2(const float *w, const float *x, const float *x2,
							     uint32_t k, float *ret, float *ret2)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;

	for (uint32_t i = 0; i < k; i += 8) {
		__m256 xv = _mm256_loadu_ps(x + i), yv = _mm256_loadu_ps(x2 + i), wv;

		wv = _mm256_loadu_ps(w + i);
		a0 = _mm256_fmadd_ps(wv, xv, a0);
		b0 = _mm256_fmadd_ps(wv, yv, b0);
		wv = _mm256_loadu_ps(w + k + i);
		a1 = _mm256_fmadd_ps(wv, xv, a1);
		b1 = _mm256_fmadd_ps(wv, yv, b1);
		wv = _mm256_loadu_ps(w + 2 * (size_t)k + i);
		a2 = _mm256_fmadd_ps(wv, xv, a2);
		b2 = _mm256_fmadd_ps(wv, yv, b2);
		wv = _mm256_loadu_ps(w + 3 * (size_t)k + i);
		a3 = _mm256_fmadd_ps(wv, xv, a3);
		b3 = _mm256_fmadd_ps(wv, yv, b3);
	}
	ret[0] = hsum(a0);
	ret[1] = hsum(a1);
	ret[2] = hsum(a2);
	ret[3] = hsum(a3);
	ret2[0] = hsum(b0);
	ret2[1] = hsum(b1);
	ret2[2] = hsum(b2);
	ret2[3] = hsum(b3);
}


/* Q4_1 rows, 32 values per block: 8 at a time from the nibbles. */
__attribute__((target("avx2,fma"))) static void dequant_q4_1_avx2(const uint8_t *row, uint32_t n, float *out)
{
	for (uint32_t b = 0; b < n / 32; b++) {
		const uint8_t *p = row + b * 20;
		uint16_t dh, mh;

		memcpy(&dh, p, 2);
		memcpy(&mh, p + 2, 2);
		__m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh)), m = _mm256_set1_ps(kvq_f16_to_f32(mh));
		__m128i q = _mm_loadu_si128((const __m128i *)(p + 4));
		__m128i lo = _mm_and_si128(q, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15));
		float *o = out + b * 32;

		_mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m));
		_mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m));
		_mm256_storeu_ps(o + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m));
		_mm256_storeu_ps(o + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m));
	}
}

/* Q8_0 rows: the same products as the portable loop (int8 -> float, times d). */
__attribute__((target("avx2,fma"))) static void dequant_q8_0_avx2(const uint8_t *row, uint32_t n, float *out)
{
	for (uint32_t b = 0; b < n / 32; b++) {
		const uint8_t *p = row + b * 34;
		uint16_t dh;

		memcpy(&dh, p, 2);
		__m256 d = _mm256_set1_ps(kvq_f16_to_f32(dh));

		for (int j = 0; j < 32; j += 8) {
			__m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + j));

			_mm256_storeu_ps(out + b * 32 + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
		}
	}
}
#endif

typedef void (*dot4_fn)(const float *, const float *, uint32_t, float *);

static dot4_fn dot4(void)
{
	static dot4_fn fn;

	if (!fn) {
		const char *isa = getenv("KVQ_CPU_ISA");

		fn = dot4_portable;
#ifdef MM_X86
		if (!(isa && !strcmp(isa, "portable")) && __builtin_cpu_supports("avx2") &&
		    __builtin_cpu_supports("fma"))
			fn = dot4_avx2;
#else
		(void)isa;
#endif
	}
	return fn;
}

const char *mm_path(void)
{
	return dot4() == dot4_portable ? "portable" : "avx2";
}

struct job {
	const struct gguf_tensor *W;
	const float *x;
	float *y;
	uint32_t T, r0, r1;
};

static void *run_job(void *arg)
{
	const struct job *j = arg;
	uint32_t k = (uint32_t)j->W->ne[0], rows = (uint32_t)j->W->rows;
	float *w = malloc(sizeof(float) * MM_ROWS * k), d[MM_ROWS], d2[MM_ROWS];
	dot4_fn fn = dot4();

	if (!w)
		abort();   /* a few KiB: nothing sensible to do without them */
	for (uint32_t t0 = 0; t0 < j->T; t0 += MM_TTILE) {
		uint32_t t1 = t0 + MM_TTILE < j->T ? t0 + MM_TTILE : j->T;

		for (uint32_t r = j->r0; r < j->r1; r += MM_ROWS) {
			uint32_t nr = r + MM_ROWS <= j->r1 ? MM_ROWS : j->r1 - r;

			for (uint32_t i = 0; i < MM_ROWS; i++)
#ifdef MM_X86
				if (i < nr && fn == dot4_avx2 && j->W->type == GGUF_T_Q4_1)
					dequant_q4_1_avx2(j->W->data + (size_t)(r + i) * j->W->row_bytes, k,
							  w + (size_t)i * k);
				else if (i < nr && fn == dot4_avx2 && j->W->type == GGUF_T_Q8_0)
					dequant_q8_0_avx2(j->W->data + (size_t)(r + i) * j->W->row_bytes, k,
							  w + (size_t)i * k);
				else
#endif
				if (i < nr)
					mm_dequant_row(j->W->type, j->W->data + (size_t)(r + i) * j->W->row_bytes, k,
						       w + (size_t)i * k);
				else
					memset(w + (size_t)i * k, 0, sizeof(float) * k);
			uint32_t t = t0;
#ifdef MM_X86
			/* the same sums as dot4_avx2, two tokens per pass */
			for (; fn == dot4_avx2 && t + 2 <= t1; t += 2) {
				dot4x2_avx2(w, j->x + (size_t)t * k, j->x + (size_t)(t + 1) * k, k, d, d2);
				for (uint32_t i = 0; i < nr; i++) {
					j->y[(size_t)t * rows + r + i] = d[i];
					j->y[(size_t)(t + 1) * rows + r + i] = d2[i];
				}
			}
#endif
			for (; t < t1; t++) {
				fn(w, j->x + (size_t)t * k, k, d);
				for (uint32_t i = 0; i < nr; i++)
					j->y[(size_t)t * rows + r + i] = d[i];
			}
		}
	}
	free(w);
	return NULL;
}

void mm_matmul(const struct gguf_tensor *W, const float *x, uint32_t T, float *y)
{
	uint32_t rows = (uint32_t)W->rows, nt = mm_threads;
	struct job jobs[MM_MAX_THREADS];
	pthread_t th[MM_MAX_THREADS];
	bool started[MM_MAX_THREADS] = { false };
	uint32_t per;

	/* small products are not worth a thread */
	if ((uint64_t)rows * W->ne[0] * T < (1u << 20))
		nt = 1;
	per = (rows / nt + MM_ROWS - 1) / MM_ROWS * MM_ROWS;
	for (uint32_t i = 0; i < nt; i++) {
		uint32_t r0 = i * per, r1 = i + 1 == nt ? rows : (i + 1) * per;

		jobs[i] = (struct job){ W, x, y, T, r0 < rows ? r0 : rows, r1 < rows ? r1 : rows };
	}
	for (uint32_t i = 1; i < nt; i++)
		started[i] = pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0;
	for (uint32_t i = 0; i < nt; i++)
		if (i == 0 || !started[i])
			run_job(&jobs[i]);   /* ours, or one no thread took */
	for (uint32_t i = 1; i < nt; i++)
		if (started[i])
			pthread_join(th[i], NULL);
}
