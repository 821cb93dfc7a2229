/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The service manager's fd store as the daemon's modules see it
 * (daemon/restart.h, daemon/procs.h).
 */
#ifndef KVQD_KEEP_H
#define KVQD_KEEP_H

#include <stdbool.h>
#include <stddef.h>

struct kvq_procs;

/* The service manager's side, as kvqd sees it (daemon/main.c gives one
 * over daemon/sd.h and daemon/fdq.h; tests none). */
struct kvq_keep {
	void *arg;
	/* the descriptor passed at start under name, taken (-1: none) */
	int (*take)(void *arg, const char *name);
	/* the i-th name passed at start, NULL past the last */
	const char *(*name_at)(void *arg, size_t i);
	/* keep fd (a copy) under name for the next start; forget name.
	 * Neither waits on the manager; may_drop: the message may be lost
	 * when the manager reads late (-ENOBUFS) */
	int (*store)(void *arg, const char *name, int fd, bool may_drop);
	int (*remove)(void *arg, const char *name, bool may_drop);
	/* the client processes whose pidfds are kept (the server sets it) */
	struct kvq_procs *procs;
};

#endif
