/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every systemd call of the daemon: readiness and status notification, the
 * watchdog, socket activation.  Built without libsystemd (HAVE_SYSTEMD
 * unset) each function is a no-op that reports "not under systemd", so the
 * daemon runs the same everywhere else.
 */
#ifndef KVQD_SD_H
#define KVQD_SD_H

#include <stdint.h>

/* The listening socket systemd passed (kvqd.socket): returns 1 and *ret_fd,
 * 0 when none was passed, or a negative errno (more than one socket, not a
 * Unix stream socket).  Unsets the LISTEN_* variables. */
int kvq_sd_listen_fd(int *ret_fd);

/* READY=1 with a STATUS= line. */
void kvq_sd_ready(const char *status);

/* STATUS= line. */
void kvq_sd_status(const char *status);

/* RELOADING=1 (SIGHUP begins); kvq_sd_ready() ends it. */
void kvq_sd_reloading(void);

/* STOPPING=1. */
void kvq_sd_stopping(void);

/* WATCHDOG=1. */
void kvq_sd_watchdog(void);

/* Watchdog interval in microseconds when systemd expects pings, else 0. */
uint64_t kvq_sd_watchdog_usec(void);

#endif
