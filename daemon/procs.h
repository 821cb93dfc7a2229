/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Client processes whose pidfds the service manager keeps (docs/DESIGN.md,
 * "Restart").  One record per process (pid and start time) that the books
 * name: counted once per connection of it attached to a kept pool and once
 * per connection of it a restored pool holds slots for.  The first count
 * stores a copy of its pidfd as kvq.pidfd.PID.START (kvq_keep's store with
 * may_drop: it never waits, and may be lost); the last one's end removes
 * it.  At start a restored hold takes the pidfd stored for its process and
 * watches it: the process's exit is seen at once, not at the next second's
 * look at /proc.  The pid and start time stay the truth; the pidfd is
 * only a faster way to learn of an exit.
 *
 * Not thread-safe: the event loop's.
 */
#ifndef KVQD_PROCS_H
#define KVQD_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;
struct kvq_keep;

typedef struct kvq_procs kvq_procs;

#define KVQ_PROCS_PREFIX "kvq.pidfd."

/* A watched process (pid, start) exited. */
typedef void kvq_procs_exit_fn(void *arg, pid_t pid, uint64_t start);

/* Records over keep (borrowed: it must outlive them) on base; on_exit
 * called with arg when a watched process exits.  Returns 0 and *ret, or
 * -ENOMEM. */
int kvq_procs_new(struct event_base *base, const struct kvq_keep *keep, kvq_procs_exit_fn *on_exit, void *arg,
		  kvq_procs **ret);

/* The stored name of process (pid, start) into buf (64 bytes are enough). */
void kvq_procs_name(char *buf, size_t len, pid_t pid, uint64_t start);

/* Whether name is a stored pidfd's (KVQ_PROCS_PREFIX, a pid, a start
 * time): 1 with them, else 0. */
int kvq_procs_parse(const char *name, pid_t *ret_pid, uint64_t *ret_start);

/* A connection of (pid, start) attached to a kept pool; pidfd (borrowed,
 * -1: none) is the connection's: a copy is stored at the process's first
 * count. */
void kvq_procs_hold(kvq_procs *ps, pid_t pid, uint64_t start, int pidfd);

/* A restored pool holds for a connection of (pid, start): its stored
 * pidfd, if the manager passed one, taken and watched. */
void kvq_procs_adopt(kvq_procs *ps, pid_t pid, uint64_t start);

/* One count of (pid, start) ended (restored: a restored hold's, the last
 * of which closes the watched pidfd); the last count removes its pidfd
 * from the store (not once stopping). */
void kvq_procs_put(kvq_procs *ps, pid_t pid, uint64_t start, bool restored);

/* Whether a record of (pid, start) exists. */
bool kvq_procs_known(const kvq_procs *ps, pid_t pid, uint64_t start);

/* Records kept, and of them with a pidfd watched. */
size_t kvq_procs_count(const kvq_procs *ps, size_t *ret_watched);

/* A stop: nothing is removed from the store from now on (the next start
 * needs what live clients hold). */
void kvq_procs_stop(kvq_procs *ps);

/* Frees every record (NULL is fine); the store is left as it is. */
void kvq_procs_free(kvq_procs *ps);

#endif
