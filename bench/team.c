/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the thread team (persistent workers released by a
 * barrier) and the timing loop that gives a job's median rate and the CPU
 * share the timed runs got.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "team.h"

#define MAX_RUNS 16u

static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double share_of(const struct share *sh)
{
	return sh->avail > 0.0 ? sh->cpu / sh->avail : 0.0;
}

static struct team *team_g;

static void *team_worker(void *p)
{
	unsigned idx = *(unsigned *)p;
	struct team *t = team_g;

	for (;;) {
		pthread_barrier_wait(&t->go);
		if (t->quit)
			return NULL;
		t->fn(t->arg, idx, t->n);
		pthread_barrier_wait(&t->done);
	}
}

int team_start(struct team *t, unsigned n)
{
	memset(t, 0, sizeof *t);
	t->n = n;
	team_g = t;
	if (n < 2)
		return 0;
	t->tid = calloc(n, sizeof *t->tid);
	t->idx = calloc(n, sizeof *t->idx);
	if (!t->tid || !t->idx)
		return -ENOMEM;
	pthread_barrier_init(&t->go, NULL, n);
	pthread_barrier_init(&t->done, NULL, n);
	for (unsigned i = 1; i < n; i++) {
		t->idx[i] = i;
		if (pthread_create(&t->tid[i], NULL, team_worker, &t->idx[i])) {
			fprintf(stderr, PROG ": cannot start thread %u\n", i);
			exit(1);
		}
	}
	return 0;
}

void team_stop(struct team *t)
{
	if (t->n >= 2) {
		t->quit = 1;
		pthread_barrier_wait(&t->go);
		for (unsigned i = 1; i < t->n; i++)
			pthread_join(t->tid[i], NULL);
		pthread_barrier_destroy(&t->go);
		pthread_barrier_destroy(&t->done);
	}
	free(t->tid);
	free(t->idx);
}

/* One step of fn on nthr threads (1, or the whole team). */
static void team_step(struct team *t, unsigned nthr, job_fn fn, void *arg)
{
	if (nthr < 2) {
		fn(arg, 0, 1);
		return;
	}
	t->fn = fn;
	t->arg = arg;
	pthread_barrier_wait(&t->go);
	fn(arg, 0, t->n);
	pthread_barrier_wait(&t->done);
}

/*
 * Median of bytes per second (in GB/s) over rn->n runs, or fewer (not
 * under MIN_RUNS) once rn->budget_s is spent: the slowest formats take about a
 * second per step.  A run repeats steps until it lasts rn->min_run_s, so short
 * steps are not dominated by clock and barrier overhead.  warm says the job
 * has just run (caches, TLB and clocks settled); otherwise one untimed step
 * comes first.
 */
double measure(struct team *t, unsigned nthr, job_fn fn, void *arg, double bytes, const struct runs *rn,
	       int warm, struct share *sh)
{
	double rates[MAX_RUNS], start;
	unsigned r = 0;

	if (!warm)
		team_step(t, nthr, fn, arg);
	start = now_s();
	while (r < rn->n) {
		unsigned steps = 0;
		double t0 = now_s(), c0 = cpu_s(), el;

		do {
			team_step(t, nthr, fn, arg);
			steps++;
			el = now_s() - t0;
		} while (el < rn->min_run_s);
		sh->cpu += cpu_s() - c0;
		sh->avail += nthr * el;
		rates[r++] = bytes * steps / el;
		if (r >= MIN_RUNS && now_s() - start > rn->budget_s)
			break;
	}
	return median(rates, r) / 1e9;
}
