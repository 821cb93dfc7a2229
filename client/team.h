/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A fork-join team of threads for the host backend's pass over a batch
 * (client/host.c): team_run calls fn(arg, i) once for each i < count, on
 * the team's threads and the caller's, and returns when every call has
 * returned.  The threads start at the first run that has work for them and
 * live until team_free; they keep the CPU kernels' per-thread scratch
 * between calls.  A team is used by one thread at a time (its client's).
 */
#ifndef KVQ_CLIENT_TEAM_H
#define KVQ_CLIENT_TEAM_H

#include <stdint.h>

struct team;

/* A team of up to n threads besides the caller (0: none; every run then
 * runs on the caller alone), or NULL without memory. */
struct team *team_new(uint32_t n);

/* Runs fn(arg, i) for i = 0 .. count - 1; returns the first negative
 * return in index order, else 0.  Threads that cannot be started leave
 * their share to the others. */
int team_run(struct team *t, uint32_t count, int (*fn)(void *arg, uint32_t i), void *arg);

/* Stops and joins the threads and frees t; NULL is fine. */
void team_free(struct team *t);

/* Threads a host pool's team gets: KVQ_CPU_THREADS (0 or 1: none beside
 * the caller) or the CPUs this process may run on, at most 16, less the
 * caller's. */
uint32_t team_default_threads(void);

#endif
