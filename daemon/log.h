/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's log: one line per message on stderr with a "<N>" syslog level
 * prefix, which journald reads as the priority.  Only the daemon's own
 * parts log (main, server, peer, dispatch, the request handlers, state,
 * pools); the modules they call (pool, prefix, lease, backend, conf) return
 * codes and messages.
 */
#ifndef KVQD_LOG_H
#define KVQD_LOG_H

#include <syslog.h>

/* Least important level written (LOG_EMERG .. LOG_DEBUG); default LOG_INFO. */
void kvq_log_set_level(int level);

/* Level named by s ("err", "warning", "info", "debug", ... or "0".."7"), or -1. */
int kvq_log_level_from_name(const char *s);

void kvq_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A call site's rate limit, for every line a client can cause again and
 * again (refusals, timeouts, framing faults): at most KVQ_LOG_BURST lines
 * per KVQ_LOG_INTERVAL_S seconds; the next line after a quiet spell says
 * how many were dropped.  A static zeroed struct per call site.
 */
#define KVQ_LOG_BURST 5u
#define KVQ_LOG_INTERVAL_S 10
struct kvq_log_limit {
	long window;            /* start of the current interval, CLOCK_MONOTONIC seconds */
	unsigned n;             /* lines written in it */
	unsigned long dropped;  /* since the last line written */
};

void kvq_log_limited(struct kvq_log_limit *rl, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
