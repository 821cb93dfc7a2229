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

#endif
