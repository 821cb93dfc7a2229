/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench: helpers its benchmarks share: medians, deterministic random
 * data, anonymous maps (bench.h has the clock).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "bench.h"

int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double median(double *v, unsigned n)
{
	qsort(v, n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double rng_unit(uint64_t *s)
{
	return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float rng_normal(uint64_t *s)
{
	double u = rng_unit(s), v = rng_unit(s);

	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

void shuffle_ids(int32_t *ids, uint32_t n, uint64_t *s)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)i;
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(rng_next(s) % i);
		int32_t t = ids[i - 1];
		ids[i - 1] = ids[j];
		ids[j] = t;
	}
}

void *map_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

kvq_client *bench_attach(const char *socket, const char *name, const struct kvq_attach_params *a)
{
	kvq_client *c = NULL;

	if (kvq_client_connect(socket, name, &c) < 0 || kvq_client_attach(c, a) < 0) {
		fprintf(stderr, PROG ": %s: attach %s: %s\n", name, a->pool, c ? kvq_client_error(c) : "no connection");
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

uint64_t bench_figure(kvq_client *c, const char *name)
{
	uint64_t v = 0;

	return kvq_client_pool_stat(c, NULL, name, &v) < 0 ? 0 : v;
}
