/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench: what its commands share: the program's name, the clock and the
 * random generator (inline: timed loops use them), bench/util.c's medians,
 * random data and anonymous maps, a kvqd's pool attached and its figures; and the commands' entry points, which
 * bench/kvq-bench.c's table names.
 */
#ifndef KVQ_BENCH_H
#define KVQ_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "kvq.h"

#define PROG "kvq-bench"

/* Inline: the timed loops read it around every step. */
static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort's comparison of doubles, ascending. */
int cmp_double(const void *a, const void *b);
/* Median of v[0, n), which it sorts. */
double median(double *v, unsigned n);

/* splitmix64: deterministic data, so runs are comparable.  Inline: control's
 * timed loop draws its tokens with it. */
static inline uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
double rng_unit(uint64_t *s);
/* Standard normal (Box-Muller). */
float rng_normal(uint64_t *s);
/* ids[0, n) = a shuffled 0 .. n - 1. */
void shuffle_ids(int32_t *ids, uint32_t n, uint64_t *s);
/* Private anonymous MAP_NORESERVE memory, or NULL. */
void *map_anon(size_t len);

/* A connection to the kvqd of socket, named name, attached as a asks;
 * NULL after a line on stderr. */
kvq_client *bench_attach(const char *socket, const char *name, const struct kvq_attach_params *a);
/* Figure name of c's pool; 0 when it cannot be read. */
uint64_t bench_figure(kvq_client *c, const char *name);

/* The usage text of every command (bench/kvq-bench.c). */
void usage(FILE *f);
/* Each returns the process's exit status. */
int cmd_formats(int argc, char **argv);    /* bench/formats.c */
int cmd_control(int argc, char **argv);    /* bench/control.c */
int cmd_rotation(int argc, char **argv);   /* bench/rotation.c */
int cmd_tier(int argc, char **argv);       /* bench/tier.c */
int cmd_restart(int argc, char **argv);    /* bench/restart.c */
int cmd_remote(int argc, char **argv);     /* bench/remote.c */
int bench_batch(int argc, char **argv);    /* bench/batch.c, in a build with CUDA */

#endif
