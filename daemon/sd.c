/* SPDX-License-Identifier: Apache-2.0 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sd.h"

/* systemd's limit on a descriptor's name (FDNAME_MAX) */
#define FDNAME_MAX 255

static int fdstore_notify(const char *msg, const int *fd, unsigned n_fd);

static int slot_take(struct kvq_sd_fds *s, size_t i)
{
	int fd = s->fd[i];

	s->fd[i] = -1;
	return fd;
}

int kvq_sd_fds_take(struct kvq_sd_fds *s, const char *name)
{
	for (size_t i = s->n; i-- > 0;)
		if (!strcmp(s->name[i], name))
			return slot_take(s, i);
	return -1;
}

void kvq_sd_fds_free(struct kvq_sd_fds *s)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->fd[i] >= 0)
			close(s->fd[i]);
		free(s->name[i]);
	}
	free(s->fd);
	free(s->name);
	*s = (struct kvq_sd_fds){ 0 };
}

/* systemd's rule (fdname_is_valid), less the empty name it would take:
 * printable ASCII, ':' being LISTEN_FDNAMES' separator.  Anything else the
 * manager would store as "stored" or not remove at all. */
static bool fdname_valid(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > FDNAME_MAX)
		return false;
	for (const char *p = name; *p; p++)
		if (*p < ' ' || *p > '~' || *p == ':')
			return false;
	return true;
}

/* what=1 for the descriptors fd (n_fd of them) under name */
static int fdstore_send(const char *what, const char *name, const int *fd, unsigned n_fd)
{
	char msg[sizeof("FDSTOREREMOVE=1\nFDNAME=") + FDNAME_MAX];

	if (!fdname_valid(name))
		return -EINVAL;
	snprintf(msg, sizeof(msg), "%s=1\nFDNAME=%s", what, name);
	return fdstore_notify(msg, fd, n_fd);
}

int kvq_sd_fdstore_add(const char *name, int fd)
{
	return fdstore_send("FDSTORE", name, &fd, 1);
}

int kvq_sd_fdstore_remove(const char *name)
{
	return fdstore_send("FDSTOREREMOVE", name, NULL, 0);
}

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

int kvq_sd_fds_get(struct kvq_sd_fds *ret)
{
	char **names = NULL;
	int *fds, n;

	/* sd_listen_fds() has made each one close-on-exec */
	n = sd_listen_fds_with_names(1, &names);
	if (n <= 0) {
		if (n == 0)
			*ret = (struct kvq_sd_fds){ 0 };
		return n;
	}
	fds = calloc((size_t)n, sizeof(*fds));
	if (!fds) {
		for (int i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		fds[i] = SD_LISTEN_FDS_START + i;
	*ret = (struct kvq_sd_fds){ .n = (size_t)n, .fd = fds, .name = names };
	return n;
}

int kvq_sd_fds_listen_socket(struct kvq_sd_fds *s)
{
	size_t found = s->n;

	for (size_t i = 0; i < s->n; i++) {
		/* our own stored descriptors are never the control socket */
		if (s->fd[i] < 0 || !strncmp(s->name[i], KVQ_SD_FDNAME_PREFIX, strlen(KVQ_SD_FDNAME_PREFIX)))
			continue;
		if (sd_is_socket_unix(s->fd[i], SOCK_STREAM, 1, NULL, 0) <= 0)
			continue;
		if (found < s->n)
			return -E2BIG;
		found = i;
	}
	return found < s->n ? slot_take(s, found) : -ENOENT;
}

bool kvq_sd_fdstore_available(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return e && *e;
}

static int fdstore_notify(const char *msg, const int *fd, unsigned n_fd)
{
	int r = sd_pid_notify_with_fds(0, 0, msg, fd, n_fd);

	if (r < 0)
		return r;
	return r > 0 ? 0 : -ENOTCONN;
}

void kvq_sd_ready(const char *status)
{
	sd_notifyf(0, "READY=1\nSTATUS=%s", status);
}

void kvq_sd_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

void kvq_sd_reloading(void)
{
	sd_notify(0, "RELOADING=1");
}

void kvq_sd_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}

void kvq_sd_watchdog(void)
{
	sd_notify(0, "WATCHDOG=1");
}

uint64_t kvq_sd_watchdog_usec(void)
{
	uint64_t usec = 0;

	return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

#else

int kvq_sd_fds_get(struct kvq_sd_fds *ret)
{
	*ret = (struct kvq_sd_fds){ 0 };
	return 0;
}

int kvq_sd_fds_listen_socket(struct kvq_sd_fds *s)
{
	return -ENOENT;
}

bool kvq_sd_fdstore_available(void)
{
	return false;
}

static int fdstore_notify(const char *msg, const int *fd, unsigned n_fd)
{
	return -ENOTCONN;
}

void kvq_sd_ready(const char *status)
{
}

void kvq_sd_status(const char *status)
{
}

void kvq_sd_reloading(void)
{
}

void kvq_sd_stopping(void)
{
}

void kvq_sd_watchdog(void)
{
}

uint64_t kvq_sd_watchdog_usec(void)
{
	return 0;
}

#endif
