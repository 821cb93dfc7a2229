/* SPDX-License-Identifier: Apache-2.0 */
#include <config.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
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

bool kvq_sd_fdname_valid(const char *name)
{
	return fdname_valid(name);
}

int kvq_sd_fdstore_msg(char *buf, size_t len, bool remove, const char *name)
{
	int n;

	if (!fdname_valid(name))
		return -EINVAL;
	n = snprintf(buf, len, "%s=1\nFDNAME=%s", remove ? "FDSTOREREMOVE" : "FDSTORE", name);
	return n >= 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
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

int kvq_sd_notify_open(void)
{
	const char *e = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = e ? strlen(e) : 0;
	int fd, r;

	if (!len)
		return -ENOTCONN;
	/* a path, or '@' for an abstract name; systemd's vsock addresses are
	 * for machines, not services */
	if ((e[0] != '/' && e[0] != '@') || len >= sizeof(sa.sun_path))
		return -EAFNOSUPPORT;
	memcpy(sa.sun_path, e, len);
	if (e[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int kvq_sd_notify_send(int sock, const char *msg, const int *fd, unsigned n_fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * KVQ_SD_MSG_FDS)];
	} ctl;
	struct iovec iov = { (void *)msg, strlen(msg) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (n_fd > KVQ_SD_MSG_FDS)
		return -E2BIG;
	if (n_fd) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = &ctl;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fd);
		ctl.h.cmsg_level = SOL_SOCKET;
		ctl.h.cmsg_type = SCM_RIGHTS;
		ctl.h.cmsg_len = CMSG_LEN(sizeof(int) * n_fd);
		memcpy(CMSG_DATA(&ctl.h), fd, sizeof(int) * n_fd);
	}
	/* the kernel adds the credentials the manager asks for (SO_PASSCRED) */
	if (sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return 0;
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

int kvq_sd_notify_open(void)
{
	return -ENOTCONN;
}

int kvq_sd_notify_send(int sock, const char *msg, const int *fd, unsigned n_fd)
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
