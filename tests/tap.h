/* SPDX-License-Identifier: Apache-2.0 */
/* Minimal TAP producer for the C tests: ok(), diag(), done_testing(). */
#ifndef KVQ_TAP_H
#define KVQ_TAP_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed;

__attribute__((format(printf, 2, 3), unused))
static int ok(int cond, const char *fmt, ...)
{
	va_list ap;

	tap_n++;
	if (!cond)
		tap_failed++;
	printf("%s %d - ", cond ? "ok" : "not ok", tap_n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return cond;
}

__attribute__((format(printf, 1, 2), unused))
static void diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

__attribute__((unused))
static int done_testing(void)
{
	printf("1..%d\n", tap_n);
	return tap_failed ? 1 : 0;
}

/* xorshift64*: reproducible random numbers for tests (seed from KVQ_TEST_SEED) */
static uint64_t tap_rng_state = 0x9e3779b97f4a7c15ull;

__attribute__((unused))
static void tap_seed(void)
{
	const char *s = getenv("KVQ_TEST_SEED");
	if (s && *s)
		tap_rng_state = strtoull(s, NULL, 0) | 1;
	diag("seed %#llx (set KVQ_TEST_SEED to repeat)", (unsigned long long)tap_rng_state);
}

__attribute__((unused))
static uint64_t tap_rand(void)
{
	tap_rng_state ^= tap_rng_state >> 12;
	tap_rng_state ^= tap_rng_state << 25;
	tap_rng_state ^= tap_rng_state >> 27;
	return tap_rng_state * 0x2545f4914f6cdd1dull;
}

/* uniform in [-1, 1) */
__attribute__((unused))
static double tap_uniform(void)
{
	return (double)(tap_rand() >> 11) / 4503599627370496.0 - 1.0;
}

/* roughly normal (sum of uniforms) */
__attribute__((unused))
static double tap_normal(void)
{
	double s = 0;
	for (int i = 0; i < 4; i++)
		s += tap_uniform();
	return s * 0.8660254037844386;
}

#endif
