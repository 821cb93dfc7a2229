/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the memory passes decode is judged against: read-only
 * and memcpy bandwidth over a buffer at least as large as the largest decode
 * working set, and the AVX2 FMA rate that bounds decode's arithmetic.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include "bench.h"
#include "memory.h"
#include "team.h"

#define PAGE 4096u

static uint64_t sink;

int cpu_has_avx2(void)
{
#ifdef BENCH_X86
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
#else
	return 0;
#endif
}

#ifdef BENCH_X86
/* Eight independent 256-bit accumulators keep enough loads in flight that
 * the sum is limited by memory, not by the add chain. */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t len)
{
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
	uint64_t lane[4];

	for (size_t i = 0; i < len; i += 256) {
		const __m256i *v = (const __m256i *)(p + i);
		a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 0));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
		a4 = _mm256_add_epi64(a4, _mm256_load_si256(v + 4));
		a5 = _mm256_add_epi64(a5, _mm256_load_si256(v + 5));
		a6 = _mm256_add_epi64(a6, _mm256_load_si256(v + 6));
		a7 = _mm256_add_epi64(a7, _mm256_load_si256(v + 7));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	a4 = _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7));
	_mm256_storeu_si256((__m256i *)lane, _mm256_add_epi64(a0, a4));
	return lane[0] + lane[1] + lane[2] + lane[3];
}
#endif

static uint64_t sum_portable(const uint8_t *p, size_t len)
{
	uint64_t a[8] = { 0 };

	for (size_t i = 0; i < len; i += 64)
		for (unsigned k = 0; k < 8; k++) {
			uint64_t w;
			memcpy(&w, p + i + 8 * k, 8);
			a[k] += w;
		}
	return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

struct memjob {
	uint8_t *buf;
	size_t len;   /* read: buf[0, len); copy: first half to second half */
	int avx2;
};

/* Page-aligned share of thread idx of n over len bytes. */
static void share(size_t len, unsigned idx, unsigned n, size_t *a, size_t *b)
{
	size_t chunk = len / n / PAGE * PAGE;

	*a = chunk * idx;
	*b = idx + 1 == n ? len : *a + chunk;
}

static void read_job(void *arg, unsigned idx, unsigned n)
{
	struct memjob *j = arg;
	size_t a, b;
	uint64_t s;

	share(j->len, idx, n, &a, &b);
#ifdef BENCH_X86
	if (j->avx2)
		s = sum_avx2(j->buf + a, b - a);
	else
#endif
		s = sum_portable(j->buf + a, b - a);
	__atomic_fetch_add(&sink, s, __ATOMIC_RELAXED);
}

static void copy_job(void *arg, unsigned idx, unsigned n)
{
	struct memjob *j = arg;
	size_t half = j->len / 2, a, b;

	share(half, idx, n, &a, &b);
	memcpy(j->buf + half + a, j->buf + a, b - a);
}

#ifdef BENCH_X86
#define FMA_STEPS (1u << 21)   /* loop turns of one FMA job: 12 FMAs each */

/* Twelve independent FMA chains per thread: the machine's FMA rate, which
 * bounds decode's floating-point work the way the read pass bounds its
 * memory traffic. */
__attribute__((target("avx2,fma"))) static void fma_job(void *arg, unsigned idx, unsigned n)
{
	__m256 a[12], x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f), sum = _mm256_setzero_ps();
	float lane[8];

	(void)arg;
	(void)n;
	/* distinct starting values: equal chains would be merged into one */
	for (unsigned k = 0; k < 12; k++)
		a[k] = _mm256_set1_ps(0.01f * (float)idx + 0.001f * (float)k);
	for (unsigned i = 0; i < FMA_STEPS; i++) {
#pragma GCC unroll 12
		for (unsigned k = 0; k < 12; k++)
			a[k] = _mm256_fmadd_ps(a[k], x, y);
	}
	for (unsigned k = 0; k < 12; k++)
		sum = _mm256_add_ps(sum, a[k]);
	_mm256_storeu_ps(lane, sum);
	__atomic_fetch_add(&sink, (uint64_t)lane[0], __ATOMIC_RELAXED);
}
#endif

int measure_memory(struct team *t, unsigned threads, int avx2, const struct runs *rn, double bytes, struct membw *m)
{
	size_t len = ((size_t)bytes + 2 * PAGE * threads - 1) / (2 * PAGE * threads) * (2 * PAGE * threads);
	struct memjob j = { .len = len, .avx2 = avx2 };
	struct share sh = { 0 };

	m->fma1 = m->fman = 0.0;
	j.buf = map_anon(len);
	if (!j.buf) {
		fprintf(stderr, PROG ": cannot map %zu bytes for the read pass\n", len);
		return -1;
	}
	/* written, not just mapped: untouched anonymous pages all map the one
	 * zero page, which reads from cache */
	memset(j.buf, 1, len);
	fprintf(stderr, PROG ": read-only and memcpy passes over %.0f MiB\n", (double)len / (1 << 20));
	m->bytes = (double)len;
	m->read1 = measure(t, 1, read_job, &j, (double)len, rn, 0, &sh);
	m->readn = threads > 1 ? measure(t, threads, read_job, &j, (double)len, rn, 0, &sh) : m->read1;
	m->copy1 = measure(t, 1, copy_job, &j, (double)len, rn, 0, &sh);
	m->copyn = threads > 1 ? measure(t, threads, copy_job, &j, (double)len, rn, 0, &sh) : m->copy1;
#ifdef BENCH_X86
	if (avx2) {
		double per = 12.0 * FMA_STEPS;
		m->fma1 = measure(t, 1, fma_job, NULL, per, rn, 0, &sh);
		m->fman = threads > 1 ? measure(t, threads, fma_job, NULL, per * threads, rn, 0, &sh) : m->fma1;
	}
#endif
	m->cpu_share = share_of(&sh);
	munmap(j.buf, len);
	return 0;
}
