/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fd store's messages (FDSTORE=1, FDSTOREREMOVE=1) sent without ever
 * waiting on the service manager (docs/DESIGN.md, "Restart").  A message
 * the manager's queue has no room for waits here, in order, and goes when
 * the notify socket is writable again (write interest only while one
 * waits).  Messages that may be lost (a client process's pidfd: the books
 * name the process by pid and start time anyway) are bounded, KVQ_FDQ_MAX
 * of them; past that they are dropped with a rate-limited log line.  A
 * pool's own are never dropped (pools are few).  An unsent FDSTORE=1
 * cancelled by FDSTOREREMOVE=1 of its name leaves the queue with it.
 *
 * Not thread-safe: the event loop's.
 */
#ifndef KVQD_FDQ_H
#define KVQD_FDQ_H

#include <stdbool.h>
#include <stddef.h>

struct event_base;

typedef struct kvq_fdq kvq_fdq;

/* Messages that may be lost, queued at most. */
#define KVQ_FDQ_MAX 64u    /* each holds a descriptor: within kvqd's reserve */

/* A queue on a socket of its own to the manager of NOTIFY_SOCKET.
 * Returns 0 and *ret, -ENOTCONN when no manager listens, -ENOMEM, or
 * kvq_sd_notify_open()'s error. */
int kvq_fdq_new(struct event_base *base, kvq_fdq **ret);

/* FDSTORE=1 of a copy of fd (fd stays the caller's) under name, sent now
 * or queued (may_drop: within KVQ_FDQ_MAX).  Returns 0 (sent or queued),
 * -EINVAL for a bad name, -ENOBUFS when dropped, or a send error (the
 * manager is gone). */
int kvq_fdq_store(kvq_fdq *q, const char *name, int fd, bool may_drop);

/* FDSTOREREMOVE=1 of name, or the cancelling of its unsent FDSTORE=1.
 * Returns as kvq_fdq_store(). */
int kvq_fdq_remove(kvq_fdq *q, const char *name, bool may_drop);

/* Messages waiting. */
size_t kvq_fdq_queued(const kvq_fdq *q);

/* At exit, outside the loop: waits up to timeout_ms for the manager to
 * take what waits.  Returns the messages left (logged). */
size_t kvq_fdq_drain(kvq_fdq *q, int timeout_ms);

/* Closes the socket; what still waits is lost (NULL is fine). */
void kvq_fdq_free(kvq_fdq *q);

#endif
