/* SPDX-License-Identifier: Apache-2.0 */
/* The copy engine: threads, a queue, an eventfd back to the loop (copier.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "copier.h"

struct kvq_copier {
	pthread_t *threads;
	unsigned nthreads;                   /* started */
	char name[16];                       /* the threads' (ps, top, /proc/PID/task/TID/comm) */
	bool started, stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;                   /* work queued, or stop */
	pthread_cond_t idle;                 /* the thread finished a job */
	struct kvq_copy_job *queue, **queue_tail;   /* submitted, not taken yet */
	struct kvq_copy_job *ran, **ran_tail;
	unsigned busy;                       /* jobs taken, not yet on ran */
	int efd;
	struct event *ev;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_one(struct kvq_copy_job *j)
{
	double t0 = now_s();

	j->result = j->run(j);
	j->seconds = now_s() - t0;
}

static void *worker(void *arg)
{
	struct kvq_copier *c = arg;
	const uint64_t one = 1;

	pthread_setname_np(pthread_self(), c->name);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct kvq_copy_job *j;
		bool wake;

		while (!c->queue && !c->stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (!c->queue)
			break;
		j = c->queue;
		c->queue = j->next;
		if (!c->queue)
			c->queue_tail = &c->queue;
		c->busy++;
		pthread_mutex_unlock(&c->mu);
		run_one(j);
		pthread_mutex_lock(&c->mu);
		j->next = NULL;
		wake = !c->ran;
		*c->ran_tail = j;
		c->ran_tail = &j->next;
		c->busy--;
		pthread_cond_broadcast(&c->idle);
		/* one wake-up per batch: while jobs wait on ran, the loop has one
		 * coming and takes them all (a full counter means as much) */
		if (wake && write(c->efd, &one, sizeof one) < 0 && errno != EAGAIN)
			break;
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Hands back every job that ran. */
static void hand_back(struct kvq_copier *c)
{
	struct kvq_copy_job *j;

	pthread_mutex_lock(&c->mu);
	j = c->ran;
	c->ran = NULL;
	c->ran_tail = &c->ran;
	pthread_mutex_unlock(&c->mu);
	while (j) {
		struct kvq_copy_job *next = j->next;

		j->done(j, j->result);
		j = next;
	}
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	uint64_t n;

	(void)what;
	if (read(fd, &n, sizeof n) < 0 && errno != EAGAIN)
		return;
	hand_back(arg);
}

int kvq_copier_new_threads(struct event_base *base, unsigned n, const char *name, kvq_copier **ret)
{
	struct kvq_copier *c = calloc(1, sizeof *c);

	if (!c)
		return -ENOMEM;
	snprintf(c->name, sizeof c->name, "%s", name);
	c->efd = -1;
	c->queue_tail = &c->queue;
	c->ran_tail = &c->ran;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	pthread_cond_init(&c->idle, NULL);
	if (base) {
		c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		c->ev = c->efd >= 0 ? event_new(base, c->efd, EV_READ | EV_PERSIST, on_event, c) : NULL;
		c->threads = calloc(n ? n : 1, sizeof *c->threads);
		if (!c->ev || !c->threads || event_add(c->ev, NULL) < 0) {
			kvq_copier_free(c);
			return -ENOMEM;
		}
		c->started = true;
		while (c->nthreads < (n ? n : 1) && pthread_create(&c->threads[c->nthreads], NULL, worker, c) == 0)
			c->nthreads++;
		if (!c->nthreads) {
			kvq_copier_free(c);
			return -ENOMEM;
		}
	}
	*ret = c;
	return 0;
}

int kvq_copier_new(struct event_base *base, kvq_copier **ret)
{
	return kvq_copier_new_threads(base, 1, "kvqd-copy", ret);
}

void kvq_copier_submit(kvq_copier *c, struct kvq_copy_job *j)
{
	j->next = NULL;
	if (!c->started) {
		run_one(j);
		j->done(j, j->result);
		return;
	}
	pthread_mutex_lock(&c->mu);
	*c->queue_tail = j;
	c->queue_tail = &j->next;
	pthread_cond_signal(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

void kvq_copier_drain(kvq_copier *c)
{
	if (!c || !c->started)
		return;
	/* a job's done may submit more: until none is left */
	for (;;) {
		bool any;

		pthread_mutex_lock(&c->mu);
		while (c->queue || c->busy)
			pthread_cond_wait(&c->idle, &c->mu);
		any = c->ran != NULL;
		pthread_mutex_unlock(&c->mu);
		if (!any)
			break;
		hand_back(c);
	}
}

void kvq_copier_free(kvq_copier *c)
{
	if (!c)
		return;
	if (c->started) {
		kvq_copier_drain(c);
		pthread_mutex_lock(&c->mu);
		c->stop = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		for (unsigned i = 0; i < c->nthreads; i++)
			pthread_join(c->threads[i], NULL);
	}
	free(c->threads);
	if (c->ev)
		event_free(c->ev);
	if (c->efd >= 0)
		close(c->efd);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->idle);
	free(c);
}
