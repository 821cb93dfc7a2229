/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host backend's team of threads (team.h): a generation counter wakes
 * the threads for a run, an atomic index hands out the calls, and the last
 * thread to finish wakes the caller.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "team.h"

struct team {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	pthread_t *th;
	uint32_t want, started;
	uint64_t gen;                   /* one more per run */
	uint32_t busy;                  /* threads still in the current run */
	bool quit;
	/* the run */
	int (*fn)(void *arg, uint32_t i);
	void *arg;
	uint32_t count;
	atomic_uint next;
	int *ret;                       /* per call */
};

static void team_share(struct team *t)
{
	for (uint32_t i; (i = atomic_fetch_add(&t->next, 1)) < t->count;)
		t->ret[i] = t->fn(t->arg, i);
}

static void *team_main(void *p)
{
	struct team *t = p;
	uint64_t seen = 0;

	pthread_mutex_lock(&t->mu);
	for (;;) {
		while (!t->quit && t->gen == seen)
			pthread_cond_wait(&t->go, &t->mu);
		if (t->quit)
			break;
		seen = t->gen;
		pthread_mutex_unlock(&t->mu);
		team_share(t);
		pthread_mutex_lock(&t->mu);
		if (--t->busy == 0)
			pthread_cond_signal(&t->done);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

struct team *team_new(uint32_t n)
{
	struct team *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	if (n && !(t->th = calloc(n, sizeof(*t->th)))) {
		free(t);
		return NULL;
	}
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->go, NULL);
	pthread_cond_init(&t->done, NULL);
	t->want = n;
	return t;
}

int team_run(struct team *t, uint32_t count, int (*fn)(void *arg, uint32_t i), void *arg)
{
	int *ret;
	int r = 0;

	if (!count)
		return 0;
	if (!(ret = malloc(count * sizeof(*ret))))
		return -ENOMEM;
	pthread_mutex_lock(&t->mu);
	/* the threads this run can use, started once */
	while (t->started < t->want && t->started + 1 < count &&
	       pthread_create(&t->th[t->started], NULL, team_main, t) == 0)
		t->started++;
	t->fn = fn;
	t->arg = arg;
	t->count = count;
	t->ret = ret;
	atomic_store(&t->next, 0);
	t->busy = t->started;
	t->gen++;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->mu);
	team_share(t);
	pthread_mutex_lock(&t->mu);
	while (t->busy)
		pthread_cond_wait(&t->done, &t->mu);
	pthread_mutex_unlock(&t->mu);
	for (uint32_t i = 0; i < count && r == 0; i++)
		r = ret[i] < 0 ? ret[i] : 0;
	free(ret);
	return r;
}

void team_free(struct team *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->quit = true;
	pthread_cond_broadcast(&t->go);
	pthread_mutex_unlock(&t->mu);
	for (uint32_t i = 0; i < t->started; i++)
		pthread_join(t->th[i], NULL);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->go);
	pthread_cond_destroy(&t->done);
	free(t->th);
	free(t);
}

uint32_t team_default_threads(void)
{
	const char *e = getenv("KVQ_CPU_THREADS");
	cpu_set_t set;
	long n;

	if (e && *e) {
		n = strtol(e, NULL, 10);
		return n > 1 ? (uint32_t)(n > 64 ? 63 : n - 1) : 0;
	}
	n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	n = n > 16 ? 16 : n;
	return n > 1 ? (uint32_t)(n - 1) : 0;
}
