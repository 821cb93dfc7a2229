/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's copy engine: one thread that runs copy jobs off the event
 * loop and hands each back to the loop when it ran (an eventfd wakes the
 * loop), so the loop never waits for a copy.  Jobs run in the order they
 * were submitted (a copier of several threads: kvq_copier_new_threads).  What a job copies is its owner's (daemon/tiering.c): the
 * host tier's records to and from a pool's memory.
 *
 * Without an event base (tests that run a state in process) a job runs at
 * once, on the caller's thread, and is handed back before submit returns.
 */
#ifndef KVQD_COPIER_H
#define KVQD_COPIER_H

#include <stdint.h>

struct event_base;
typedef struct kvq_copier kvq_copier;

struct kvq_copy_job {
	struct kvq_copy_job *next;              /* the copier's */
	/* On the copy thread: the copy.  Returns 0 or a negative code. */
	int (*run)(struct kvq_copy_job *j);
	/* On the loop, after run, with its result: the job's end (it may
	 * free the job). */
	void (*done)(struct kvq_copy_job *j, int result);
	int result;                             /* the copier's */
	uint64_t bytes;                         /* run sets: bytes it copied */
	double seconds;                         /* the copier sets: run's time */
};

/* A copier whose jobs come back on base (NULL: synchronous).  Returns 0 and
 * *ret, or a negative code. */
int kvq_copier_new(struct event_base *base, kvq_copier **ret);

/* The same with n threads (0: 1) named name (15 characters are kept;
 * kvq_copier_new's: kvqd-copy) taking the jobs from one queue: jobs
 * start in the order submitted but, n > 1, run side by side and come back
 * in the order they end; for jobs that touch nothing another job does
 * (the remote tier's verification of fetched values into slots of their
 * own: daemon/rtier.h).  With fewer threads when some could not start. */
int kvq_copier_new_threads(struct event_base *base, unsigned n, const char *name, kvq_copier **ret);

/* Queues j; its done comes later on the loop (at once when synchronous). */
void kvq_copier_submit(kvq_copier *c, struct kvq_copy_job *j);

/* Waits until every job submitted ran and hands them all back (their done
 * called) before it returns: before the memory a job copies goes. */
void kvq_copier_drain(kvq_copier *c);

/* Drains, stops the thread, frees (NULL is fine). */
void kvq_copier_free(kvq_copier *c);

#endif
