/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every systemd call of the daemon: readiness and status notification, the
 * watchdog, socket activation, and the file descriptor store that keeps
 * descriptors (pool memory, the books) across a restart.  Built without
 * libsystemd (HAVE_SYSTEMD unset) each function is a no-op that reports
 * "not under systemd", so the daemon runs the same everywhere else.
 */
#ifndef KVQD_SD_H
#define KVQD_SD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Names the daemon gives the descriptors it stores begin with this; a
 * socket unit's names (FileDescriptorName=, by default the unit's name)
 * never should. */
#define KVQ_SD_FDNAME_PREFIX "kvq."

/* The descriptors the service manager passed at start, socket units' and
 * the fd store's alike, in the order passed.  A slot whose descriptor was
 * taken holds -1. */
struct kvq_sd_fds {
	size_t n;
	int *fd;
	char **name;
};

/* Fills *ret with the descriptors passed at start (LISTEN_FDS, LISTEN_PID,
 * LISTEN_FDNAMES; a descriptor without a name is "unknown"), each
 * close-on-exec, and unsets those variables.  Returns their number (0 when
 * none, *ret then empty), or a negative errno with *ret untouched. */
int kvq_sd_fds_get(struct kvq_sd_fds *ret);

/* The descriptor passed under name, now the caller's (its slot becomes
 * -1), or -1.  A name passed more than once means its last descriptor; the
 * earlier ones stay for kvq_sd_fds_free(). */
int kvq_sd_fds_take(struct kvq_sd_fds *s, const char *name);

/* The control socket from a socket unit: the one passed descriptor that is
 * a listening Unix stream socket with a name outside KVQ_SD_FDNAME_PREFIX,
 * now the caller's as with kvq_sd_fds_take().  Returns it, -ENOENT when
 * none was passed, or -E2BIG when two were (nothing taken). */
int kvq_sd_fds_listen_socket(struct kvq_sd_fds *s);

/* Closes every descriptor nobody took and empties s.  An empty or freed
 * set is fine. */
void kvq_sd_fds_free(struct kvq_sd_fds *s);

/* Whether a service manager listens (NOTIFY_SOCKET) and this build can
 * hand it descriptors to store. */
bool kvq_sd_fdstore_available(void);

/* Stores a copy of fd under name in the service manager's fd store
 * (FDSTORE=1); the manager passes it back at the next start until the unit
 * is stopped or kvq_sd_fdstore_remove() drops it.  fd stays the caller's.
 * name: 1 to 255 printable ASCII characters without ':'.  Returns 0,
 * -EINVAL for a bad name, -ENOTCONN when no service manager listens (or
 * this build has no libsystemd), or a send error. */
int kvq_sd_fdstore_add(const char *name, int fd);

/* Drops every descriptor stored under name (FDSTOREREMOVE=1).  Returns as
 * kvq_sd_fdstore_add(). */
int kvq_sd_fdstore_remove(const char *name);

/* Whether name may name stored descriptors: 1 to 255 printable ASCII
 * characters without ':' (systemd's fdname_is_valid, less the empty
 * name). */
bool kvq_sd_fdname_valid(const char *name);

/* The most descriptors one notify message carries (SCM_MAX_FD is more). */
#define KVQ_SD_MSG_FDS 4u

/* The fd store's message for name into buf: FDSTORE=1 (remove false: the
 * descriptors go with it) or FDSTOREREMOVE=1.  Returns 0, -EINVAL for a
 * bad name or -ENAMETOOLONG when buf is short. */
int kvq_sd_fdstore_msg(char *buf, size_t len, bool remove, const char *name);

/* A socket of the daemon's own to the service manager (NOTIFY_SOCKET),
 * connected, non-blocking and close-on-exec, for messages that must never
 * wait on the manager (daemon/fdq.h).  Returns it, -ENOTCONN when no
 * manager listens (or this build has no libsystemd), -EAFNOSUPPORT for
 * an address that is not a Unix socket's, or a socket error. */
int kvq_sd_notify_open(void);

/* Sends msg with n_fd descriptors (copies; at most KVQ_SD_MSG_FDS) on
 * sock without waiting.  Returns 0, -EAGAIN when the manager's queue is
 * full, or a send error (-ECONNREFUSED: the manager's socket went). */
int kvq_sd_notify_send(int sock, const char *msg, const int *fd, unsigned n_fd);

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
