/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the thread team (persistent workers released by a
 * barrier) and the timing loop that gives a job's median rate and the CPU
 * share the timed runs got (bench/team.c).
 */
#ifndef KVQ_BENCH_TEAM_H
#define KVQ_BENCH_TEAM_H

#include <pthread.h>

/* CPU time this process got during timed runs against what its running
 * threads could have used: well below 1 means other processes took the
 * CPUs (the machine may be shared) and the figures are low. */
struct share {
	double cpu, avail;
};

typedef void (*job_fn)(void *arg, unsigned idx, unsigned n);

/* Persistent workers released by a barrier, so a timed step costs two
 * barrier waits rather than thread creation.  The caller is thread 0. */
struct team {
	unsigned n;
	pthread_t *tid;
	unsigned *idx;
	pthread_barrier_t go, done;
	job_fn fn;
	void *arg;
	int quit;
};

/* How long a figure is timed: at most n runs, at least MIN_RUNS once
 * budget_s (per figure, so slow formats keep the command short) is spent;
 * a run lasts at least min_run_s. */
#define MIN_RUNS 3u
struct runs {
	unsigned n;
	double min_run_s;
	double budget_s;
};

/* The CPU time the timed runs got against what their threads could use. */
double share_of(const struct share *sh);
/* Starts n - 1 workers (the caller is thread 0); 0 or -1. */
int team_start(struct team *t, unsigned n);
void team_stop(struct team *t);
/* The median rate of fn on nthr threads in GB/s, bytes a step, timed as rn
 * says (warm: fn has just run, no untimed step first); sh adds the CPU
 * share. */
double measure(struct team *t, unsigned nthr, job_fn fn, void *arg, double bytes, const struct runs *rn,
	       int warm, struct share *sh);

#endif
