/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the memory passes decode is judged against
 * (bench/memory.c): read-only and memcpy bandwidth, and the AVX2 FMA rate.
 */
#ifndef KVQ_BENCH_MEMORY_H
#define KVQ_BENCH_MEMORY_H

struct runs;
struct team;

struct membw {
	double read1, readn, copy1, copyn;   /* GB/s */
	double fma1, fman;                   /* G vector (8-lane) FMAs per second; 0 without AVX2 */
	double bytes;
	double cpu_share;
};

/* Nonzero when the CPU runs AVX2 (the read pass's and the FMA pass's path). */
int cpu_has_avx2(void);
/* The passes over at least bytes of memory, on 1 and on threads of the
 * team's threads (avx2: the AVX2 read loop and the FMA pass), timed as rn
 * says; 0, or -1 with a message when the buffer cannot be mapped. */
int measure_memory(struct team *t, unsigned threads, int avx2, const struct runs *rn, double bytes,
		   struct membw *m);

#endif
