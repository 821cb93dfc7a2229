/* SPDX-License-Identifier: Apache-2.0 */
/*
 * k-means of the codebooks (kvq_kmeans, kernels/codebook.h): clusterings
 * whose optimal centroids are known exactly; on random data the loss never
 * rises and its last entry is the loss of the centroids returned,
 * recomputed here; the same seed gives the same bytes; fewer points than
 * centroids; refused arguments.  Re-seeding an empty cluster is tested by
 * starting Lloyd's iterations from chosen centroids: k-means++ seeding
 * almost never leaves a cluster empty, so no input to kvq_kmeans makes it
 * happen reliably.  For that this test compiles kernels/kmeans.c itself,
 * statics included, rather than linking it.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kmeans.c"
#include "../tap.h"

/* ------------------------------------------------------------- helpers */

/* Mean squared distance of each point to its nearest centroid: a float sum
 * over j in order, as the rule says, summed over points in double. */
static double loss_of(const float *x, size_t n, unsigned d, const float *cent, unsigned k)
{
	double total = 0;

	for (size_t i = 0; i < n; i++) {
		float best = INFINITY;

		for (unsigned c = 0; c < k; c++) {
			float s = 0.0f;

			for (unsigned j = 0; j < d; j++) {
				float e = x[i * d + j] - cent[c * d + j];
				s = s + e * e;
			}
			if (s < best)
				best = s;
		}
		total += best;
	}
	return total / (double)n;
}

/* Sorts k points of dimension d lexicographically. */
static void sort_points(float *p, unsigned k, unsigned d)
{
	for (unsigned a = 1; a < k; a++)
		for (unsigned b = a; b > 0; b--) {
			float *u = p + (b - 1) * d, *v = p + b * d, t;
			unsigned j = 0;

			while (j < d && u[j] == v[j])
				j++;
			if (j == d || u[j] < v[j])
				break;
			for (j = 0; j < d; j++) {
				t = u[j];
				u[j] = v[j];
				v[j] = t;
			}
		}
}

static float *random_points(size_t n, unsigned d)
{
	float *x = malloc(n * d * sizeof(float));

	if (!x)
		abort();
	for (size_t i = 0; i < n * d; i++)
		x[i] = (float)tap_normal();
	return x;
}

/* ----------------------------------------------------- known clusterings */

/* Four squares of side 2 with corners 1000 apart: the optimum puts a
 * centroid at each square's centre, every point at squared distance 2. */
static void test_squares(void)
{
	static const float want[8] = { 1, 1, 1, 1001, 1001, 1, 1001, 1001 };
	float x[32], cent[8];
	double loss[21];
	int n = 0, wrong = 0;

	for (int b = 0; b < 4; b++)
		for (int c = 0; c < 4; c++) {
			x[n++] = (float)((b & 1) * 1000 + (c & 1) * 2);
			x[n++] = (float)((b >> 1) * 1000 + (c >> 1) * 2);
		}
	for (uint64_t seed = 1; seed <= 8; seed++) {
		int r = kvq_kmeans(x, 16, 2, 4, 20, seed, cent, loss);
		int tail = 0;

		sort_points(cent, 4, 2);
		for (int t = r + 1; r >= 0 && t <= 20; t++)
			tail += loss[t] != loss[r];
		if (r <= 0 || r >= 20 || memcmp(cent, want, sizeof want) != 0 || loss[r] != 2.0 || tail) {
			if (wrong++ < 3)
				diag("seed %llu: %d iterations, loss %.17g, centroids (%g %g) (%g %g) (%g %g) (%g %g)",
				     (unsigned long long)seed, r, r >= 0 ? loss[r] : 0.0, cent[0], cent[1], cent[2],
				     cent[3], cent[4], cent[5], cent[6], cent[7]);
		}
	}
	ok(wrong == 0, "four squares, 8 seeds: centroids at the centres, loss 2, an early stop whose loss "
	   "repeats to the end");
}

/* 1-D, clusters of unequal spread: {0, 1, 2, 3} and {100, 104}; centroids
 * 1.5 and 102, loss (2.25 + 0.25 + 0.25 + 2.25 + 4 + 4) / 6 = 13 / 6. */
static void test_line(void)
{
	const float x[6] = { 100, 0, 3, 104, 1, 2 };
	float cent[2];
	double loss[11];
	int r = kvq_kmeans(x, 6, 1, 2, 10, 7, cent, loss);

	sort_points(cent, 2, 1);
	ok(r > 0 && cent[0] == 1.5f && cent[1] == 102.0f && loss[r] == 13.0 / 6.0,
	   "{0 1 2 3} {100 104}: centroids %g %g, loss %.17g", cent[0], cent[1], r > 0 ? loss[r] : 0.0);
}

/* ------------------------------------------------------------ random data */

static void test_random(void)
{
	const size_t n = 5000;
	const unsigned d = 4, k = 256, iters = 25;
	float *x = random_points(n, d), *cent = malloc(k * d * sizeof(float));
	double loss[26], again;
	int r, rises = 0, finite = 1;

	if (!cent)
		abort();
	r = kvq_kmeans(x, n, d, k, iters, tap_rand(), cent, loss);
	for (unsigned t = 1; t <= iters; t++)
		if (loss[t] > loss[t - 1]) {
			if (rises++ < 3)
				diag("iteration %u: loss %.17g after %.17g", t, loss[t], loss[t - 1]);
		}
	for (unsigned i = 0; i < k * d; i++)
		finite &= isfinite(cent[i]) != 0;
	again = loss_of(x, n, d, cent, k);
	ok(r >= 1 && r <= (int)iters && rises == 0, "n=5000 d=4 k=256: the loss never rises over %d iterations "
	   "(%.6f to %.6f)", r, loss[0], loss[iters]);
	ok(finite && again == loss[iters], "the last loss is the returned centroids' (%.17g, recomputed %.17g)",
	   loss[iters], again);
	ok(loss[iters] < 0.8 * loss[0], "Lloyd's iterations improve on the seeding");
	free(cent);
	free(x);
}

static void test_determinism(void)
{
	const size_t n = 2000;
	const unsigned d = 8, k = 64, iters = 10;
	float *x = random_points(n, d), *a = malloc(k * d * sizeof(float)), *b = malloc(k * d * sizeof(float));
	double la[11], lb[11];
	int ra, rb;

	if (!a || !b)
		abort();
	ra = kvq_kmeans(x, n, d, k, iters, 42, a, la);
	rb = kvq_kmeans(x, n, d, k, iters, 42, b, lb);
	ok(ra >= 0 && ra == rb && memcmp(a, b, k * d * sizeof(float)) == 0 && memcmp(la, lb, sizeof la) == 0,
	   "the same seed: the same centroids and losses, bit for bit");
	rb = kvq_kmeans(x, n, d, k, iters, 43, b, NULL);
	ok(rb >= 0 && memcmp(a, b, k * d * sizeof(float)) != 0, "another seed: other centroids; loss may be NULL");
	free(a);
	free(b);
	free(x);
}

/* ------------------------------------------------------ few points */

/* Each centroid one of the points, each point one of the centroids. */
static int repeats_points(const float *x, size_t n, const float *cent, unsigned k, unsigned d)
{
	for (unsigned c = 0; c < k; c++) {
		int found = 0;
		for (size_t i = 0; i < n && !found; i++)
			found = memcmp(cent + c * d, x + i * d, d * sizeof(float)) == 0;
		if (!found)
			return 0;
	}
	for (size_t i = 0; i < n; i++) {
		int found = 0;
		for (unsigned c = 0; c < k && !found; c++)
			found = memcmp(cent + c * d, x + i * d, d * sizeof(float)) == 0;
		if (!found)
			return 0;
	}
	return 1;
}

static void test_few(void)
{
	const float x[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, -10 };
	float dup[40], cent[16];
	double loss[6];
	int r;

	r = kvq_kmeans(x, 5, 2, 8, 5, 3, cent, loss);
	ok(r >= 1 && r < 5 && repeats_points(x, 5, cent, 8, 2) && loss[0] == 0 && loss[5] == 0,
	   "5 points, 8 centroids: the centroids repeat the points, loss 0, early stop (%d)", r);
	r = kvq_kmeans(x, 5, 2, 5, 5, 3, cent, loss);
	ok(r >= 1 && repeats_points(x, 5, cent, 5, 2) && loss[5] == 0, "5 points, 5 centroids: one each");
	r = kvq_kmeans(x, 1, 2, 3, 5, 3, cent, loss);
	ok(r >= 0 && repeats_points(x, 1, cent, 3, 2) && loss[5] == 0, "1 point, 3 centroids");
	/* 20 points at 2 places, 4 centroids */
	for (int i = 0; i < 20; i++) {
		dup[2 * i] = i % 2 ? 5.0f : -5.0f;
		dup[2 * i + 1] = 1.0f;
	}
	r = kvq_kmeans(dup, 20, 2, 4, 5, 9, cent, loss);
	ok(r >= 1 && r < 5 && repeats_points(dup, 20, cent, 4, 2) && loss[5] == 0,
	   "20 points at 2 places, 4 centroids: repeats, loss 0, early stop (%d)", r);
}

/* ------------------------------------------------- re-seeding, from chosen centroids */

/* Lloyd from cent; returns the iterations run, -1 when out of memory. */
static int lloyd(const float *x, size_t n, unsigned d, unsigned k, float *cent, unsigned iters, double *loss)
{
	struct km m;
	int r = km_alloc(&m, x, n, d, k, cent, 0) == 0 ? (int)km_lloyd(&m, iters, loss) : -1;

	km_free(&m);
	return r;
}

static void test_reseed(void)
{
	double loss[6];
	int r;

	{
		/* Nothing is nearest to 100.  The farthest point from its
		 * centroid is 30 (19^2 from 11): it becomes centroid 1, the
		 * others are 1 and 11.  Loss (1 + 1 + 1 + 1 + 361) / 5 = 73, then
		 * 4 / 5; the second iteration changes nothing.  (Without the
		 * re-seeding: 1, 100, 52 / 3.) */
		const float x[5] = { 0, 2, 10, 12, 30 };
		float cent[3] = { 1, 100, 11 };

		r = lloyd(x, 5, 1, 3, cent, 5, loss);
		ok(r == 2 && cent[0] == 1 && cent[1] == 30 && cent[2] == 11 && loss[0] == 73.0 &&
		   loss[1] == 4.0 / 5 && loss[5] == 4.0 / 5, "an empty cluster takes the point farthest from its "
		   "centroid: %g %g %g, loss %g then %g, %d iterations", cent[0], cent[1], cent[2], loss[0],
		   loss[1], r);
	}
	{
		/* Two empty: centroid 3 takes 30 (361 from 11), centroid 4 the
		 * first of the points at 1 from theirs (0, the lowest index);
		 * 1000 is alone in its cluster.  Then 2, 11, 1000, 30, 0, loss
		 * (0 + 0 + 1 + 1 + 0 + 0) / 6. */
		const float x[6] = { 0, 2, 10, 12, 30, 1000 };
		float cent[5] = { 1, 11, 1000, -500, -600 };

		r = lloyd(x, 6, 1, 5, cent, 5, loss);
		ok(r == 2 && cent[0] == 2 && cent[1] == 11 && cent[2] == 1000 && cent[3] == 30 && cent[4] == 0 &&
		   loss[5] == 2.0 / 6, "two empty clusters take the two farthest points, in order: %g %g %g %g %g",
		   cent[0], cent[1], cent[2], cent[3], cent[4]);
	}
	{
		/* 50 is 100 from its centroid 60 but alone in its cluster: it
		 * stays, and the empty centroid 2 takes 0 (0.25 from 0.5, before
		 * 1).  Then 1, 50, 0, loss 0. */
		const float x[3] = { 0, 1, 50 };
		float cent[3] = { 0.5f, 60, 200 };

		r = lloyd(x, 3, 1, 3, cent, 5, loss);
		ok(r == 2 && cent[0] == 1 && cent[1] == 50 && cent[2] == 0 && loss[0] == (0.25 + 0.25 + 100) / 3 &&
		   loss[5] == 0, "a point alone in its cluster is not taken: %g %g %g", cent[0], cent[1], cent[2]);
	}
	{
		/* 2-D: the empty centroid (9, 9) takes (4, 0), 4^2 + 0 from
		 * its centroid (0, 0) where (0, 1) is 1 from it. */
		const float x[6] = { 0, 0, 4, 0, 0, 1 };
		float cent[4] = { 0, 0, 9, 9 };

		r = lloyd(x, 3, 2, 2, cent, 5, loss);
		ok(r == 2 && cent[0] == 0 && cent[1] == 0.5f && cent[2] == 4 && cent[3] == 0,
		   "2-D: the farthest by squared distance: (%g %g) (%g %g)", cent[0], cent[1], cent[2], cent[3]);
	}
	{
		/* ties go to the lower index: 1 is as near 2 as 0 */
		const float x[1] = { 1 };
		float a[2] = { 2, 0 }, b[2] = { 0, 2 };
		struct km m;
		unsigned ga = 9, gb = 9;

		if (km_alloc(&m, x, 1, 1, 2, a, 0) == 0) {
			km_lloyd(&m, 0, loss);
			ga = m.assign[0];
		}
		km_free(&m);
		if (km_alloc(&m, x, 1, 1, 2, b, 0) == 0) {
			km_lloyd(&m, 0, loss);
			gb = m.assign[0];
		}
		km_free(&m);
		ok(ga == 0 && gb == 0 && loss[0] == 1, "a point as near two centroids goes to the lower index");
	}
}

/* ------------------------------------------------------------ arguments */

static void test_args(void)
{
	float x[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, cent[4] = { 7, 7, 7, 7 };
	double loss[3] = { -1, -1, -1 };

	ok(kvq_kmeans(NULL, 4, 2, 2, 2, 0, cent, loss) == -EINVAL && kvq_kmeans(x, 4, 2, 2, 2, 0, NULL, loss) ==
	   -EINVAL, "NULL points or centroids: -EINVAL");
	ok(kvq_kmeans(x, 0, 2, 2, 2, 0, cent, loss) == -EINVAL && kvq_kmeans(x, 4, 0, 2, 2, 0, cent, loss) ==
	   -EINVAL && kvq_kmeans(x, 4, 2, 0, 2, 0, cent, loss) == -EINVAL, "n, d or k 0: -EINVAL");
	ok(kvq_kmeans(x, SIZE_MAX / 2, 4, 2, 2, 0, cent, loss) == -EINVAL, "n * d beyond memory: -EINVAL");
	x[5] = NAN;
	ok(kvq_kmeans(x, 4, 2, 2, 2, 0, cent, loss) == -EINVAL, "a NaN among the points: -EINVAL");
	x[5] = -INFINITY;
	ok(kvq_kmeans(x, 4, 2, 2, 2, 0, cent, loss) == -EINVAL, "an infinity among the points: -EINVAL");
	ok(cent[0] == 7 && cent[1] == 7 && cent[2] == 7 && cent[3] == 7, "refused: the centroids untouched");
	x[5] = 6;
	ok(kvq_kmeans(x, 4, 2, 2, 0, 0, cent, loss) == 0 && loss[0] == loss_of(x, 4, 2, cent, 2) &&
	   loss[1] == -1, "0 iterations: the seeding alone, one loss");
}

int main(void)
{
	tap_seed();
	test_squares();
	test_line();
	test_random();
	test_determinism();
	test_few();
	test_reseed();
	test_args();
	return done_testing();
}
