/* SPDX-License-Identifier: Apache-2.0 */
/*
 * k-means for the codebooks of the product-quantized formats (codebook.h):
 * k-means++ seeding, then Lloyd iterations.  Deterministic for a seed: a
 * PRNG of its own (splitmix64) and a fixed order of every sum.
 *
 * A point goes to the centroid at the least squared distance, a float sum
 * over j in order, the lowest index among equals: kvq_pq_encode's rule, so
 * the clusters are those the encoder will draw (up to the centroids' FP16
 * rounding).  The distances of one point to a block of centroids are
 * summed from centroids stored dimension-major, which lets the compiler
 * vectorise across centroids while each centroid's sum keeps its order.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codebook.h"

struct km {
	const float *x;
	size_t n;
	unsigned d, k;
	float *cent;        /* [k][d], the caller's */
	float *ct;          /* [d][k]: cent transposed, for the assignment */
	unsigned *assign;   /* [n] */
	double *dist;       /* [n]: seeding's D^2, then each point's distance to its centroid */
	double *sum;        /* [k][d] */
	size_t *count;      /* [k] */
	uint64_t rng;
};

/* splitmix64 */
static uint64_t km_rand(struct km *m)
{
	uint64_t z = (m->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static double km_unit(struct km *m)
{
	return (double)(km_rand(m) >> 11) * 0x1p-53;
}

/* uniform in [0, n) */
static size_t km_index(struct km *m, size_t n)
{
	size_t i = (size_t)(km_unit(m) * (double)n);

	return i < n ? i : n - 1;
}

/* Squared distance in double: seeding's weights, which must not overflow. */
static double km_d2(const float *a, const float *b, unsigned d)
{
	double s = 0;

	for (unsigned j = 0; j < d; j++) {
		double e = (double)a[j] - b[j];
		s += e * e;
	}
	return s;
}

/* k-means++: the first centre uniform, each next one a point drawn with
 * probability proportional to its squared distance from the nearest centre
 * so far; once every point is a centre (n < k, or repeated points) the rest
 * repeat points drawn uniformly. */
static void km_seed(struct km *m)
{
	const float *x = m->x;
	unsigned d = m->d;
	size_t p = km_index(m, m->n);

	memcpy(m->cent, x + p * d, d * sizeof(float));
	for (size_t i = 0; i < m->n; i++)
		m->dist[i] = km_d2(x + i * d, m->cent, d);
	for (unsigned c = 1; c < m->k; c++) {
		double total = 0, cum = 0, r;
		float *cc = m->cent + (size_t)c * d;

		for (size_t i = 0; i < m->n; i++)
			total += m->dist[i];
		if (total > 0) {
			r = km_unit(m) * total;
			/* the last point of positive weight, should rounding carry r past the sum */
			for (p = m->n; p-- > 0 && m->dist[p] == 0;)
				;
			for (size_t i = 0; i < m->n; i++) {
				cum += m->dist[i];
				if (cum > r) {
					p = i;
					break;
				}
			}
		} else {
			p = km_index(m, m->n);
		}
		memcpy(cc, x + p * d, d * sizeof(float));
		for (size_t i = 0; i < m->n; i++) {
			double e = km_d2(x + i * d, cc, d);
			if (e < m->dist[i])
				m->dist[i] = e;
		}
	}
}

#define KM_BLOCK 8u   /* centroids whose distances one pass over j sums */

/* Squared distances of point xi to centroids c0 .. c0 + nb - 1 into acc:
 * each a float sum over j in order (the rule), the centroids side by side
 * (blocks of KM_BLOCK, a constant count the compiler vectorises). */
static void km_dists(const struct km *m, const float *xi, unsigned c0, unsigned nb, float *restrict acc)
{
	unsigned k = m->k;

	for (unsigned c = 0; c < KM_BLOCK; c++)
		acc[c] = 0.0f;
	for (unsigned j = 0; j < m->d; j++) {
		const float *restrict row = m->ct + (size_t)j * k + c0;
		float xj = xi[j];

		if (nb == KM_BLOCK) {
			for (unsigned c = 0; c < KM_BLOCK; c++) {
				float e = xj - row[c];
				acc[c] = acc[c] + e * e;
			}
		} else {
			for (unsigned c = 0; c < nb; c++) {
				float e = xj - row[c];
				acc[c] = acc[c] + e * e;
			}
		}
	}
}

/* Each point to its nearest centroid; returns how many changed centroid,
 * *ret_loss the mean squared distance. */
static size_t km_assign(struct km *m, double *ret_loss)
{
	unsigned d = m->d, k = m->k;
	size_t changed = 0;
	double total = 0;

	for (unsigned c = 0; c < k; c++)
		for (unsigned j = 0; j < d; j++)
			m->ct[(size_t)j * k + c] = m->cent[(size_t)c * d + j];
	for (size_t i = 0; i < m->n; i++) {
		float acc[KM_BLOCK], best = INFINITY;
		unsigned bi = 0;

		for (unsigned c0 = 0; c0 < k; c0 += KM_BLOCK) {
			unsigned nb = k - c0 < KM_BLOCK ? k - c0 : KM_BLOCK;

			km_dists(m, m->x + i * d, c0, nb, acc);
			/* in index order, strictly less: the lowest index among equals */
			for (unsigned c = 0; c < nb; c++)
				if (acc[c] < best) {
					best = acc[c];
					bi = c0 + c;
				}
		}
		changed += m->assign[i] != bi;
		m->assign[i] = bi;
		m->dist[i] = best;
		total += best;
	}
	*ret_loss = total / (double)m->n;
	return changed;
}

static void km_sums(struct km *m)
{
	unsigned d = m->d;

	memset(m->sum, 0, (size_t)m->k * d * sizeof(double));
	memset(m->count, 0, m->k * sizeof(size_t));
	for (size_t i = 0; i < m->n; i++) {
		double *s = m->sum + (size_t)m->assign[i] * d;

		m->count[m->assign[i]]++;
		for (unsigned j = 0; j < d; j++)
			s[j] += m->x[i * d + j];
	}
}

/* The point farthest from its centroid among those that are not alone in
 * their cluster and not on their centroid, or n when there is none. */
static size_t km_farthest(const struct km *m)
{
	size_t p = m->n;
	double far = 0;

	for (size_t i = 0; i < m->n; i++)
		if (m->dist[i] > far && m->count[m->assign[i]] > 1) {
			far = m->dist[i];
			p = i;
		}
	return p;
}

/* Centroids to the means of their clusters; an empty cluster first takes
 * the point farthest from its centroid (km_farthest).  Where no point can
 * be taken (each is on its centroid or alone in its cluster: n < k, or
 * repeated points) an empty cluster's centroid stays as it is; taking one
 * would only empty another.  Returns 1 when a point was moved. */
static int km_update(struct km *m)
{
	unsigned d = m->d;
	int moved = 0;

	km_sums(m);
	for (unsigned c = 0; c < m->k; c++) {
		size_t p;

		if (m->count[c])
			continue;
		p = km_farthest(m);
		if (p == m->n)
			break;
		m->count[m->assign[p]]--;
		m->count[c] = 1;
		m->assign[p] = c;
		m->dist[p] = 0;
		moved = 1;
	}
	if (moved)
		km_sums(m);
	for (unsigned c = 0; c < m->k; c++) {
		if (!m->count[c])
			continue;
		for (unsigned j = 0; j < d; j++)
			m->cent[(size_t)c * d + j] = (float)(m->sum[(size_t)c * d + j] / (double)m->count[c]);
	}
	return moved;
}

/* The arrays of a run over x[n][d] into cent[k][d]: 0, or -ENOMEM (km_free
 * frees what was allocated either way). */
static int km_alloc(struct km *m, const float *x, size_t n, unsigned d, unsigned k, float *cent, uint64_t seed)
{
	*m = (struct km){ .x = x, .n = n, .d = d, .k = k, .cent = cent, .rng = seed };
	m->ct = malloc((size_t)k * d * sizeof(float));
	m->assign = calloc(n, sizeof(unsigned));
	m->dist = malloc(n * sizeof(double));
	m->sum = malloc((size_t)k * d * sizeof(double));
	m->count = malloc(k * sizeof(size_t));
	return m->ct && m->assign && m->dist && m->sum && m->count ? 0 : -ENOMEM;
}

static void km_free(struct km *m)
{
	free(m->ct);
	free(m->assign);
	free(m->dist);
	free(m->sum);
	free(m->count);
}

/* Lloyd iterations from the centroids in m->cent: loss[0] of them, then
 * at most iters iterations; returns the iterations run. */
static unsigned km_lloyd(struct km *m, unsigned iters, double *loss)
{
	double l = 0;
	unsigned run = 0;

	km_assign(m, &l);
	if (loss)
		loss[0] = l;
	while (run < iters) {
		int moved = km_update(m);
		size_t changed = km_assign(m, &l);

		run++;
		if (loss)
			loss[run] = l;
		if (!changed && !moved)
			break;
	}
	for (unsigned t = run + 1; loss && t <= iters; t++)
		loss[t] = l;
	return run;
}

int kvq_kmeans(const float *x, size_t n, unsigned d, unsigned k, unsigned iters, uint64_t seed, float *cent,
	       double *loss)
{
	struct km m;
	int r;

	/* non-finite points have no mean and would poison every centroid */
	if (!x || !cent || n == 0 || d == 0 || k == 0 || iters > INT_MAX || n > SIZE_MAX / sizeof(double) / d ||
	    k > SIZE_MAX / sizeof(double) / d)
		return -EINVAL;
	for (size_t i = 0; i < n * d; i++)
		if (!isfinite(x[i]))
			return -EINVAL;
	r = km_alloc(&m, x, n, d, k, cent, seed);
	if (r == 0) {
		km_seed(&m);
		r = (int)km_lloyd(&m, iters, loss);
	}
	km_free(&m);
	return r;
}
