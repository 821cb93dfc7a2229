/* SPDX-License-Identifier: Apache-2.0 */
/* Frames over a stream socket, with SCM_RIGHTS (frame_io.h). */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frame_io.h"

/* kvq_frame_send with extra sendmsg flags: MSG_DONTWAIT lets the blocking
 * helpers keep their deadline on a blocking socket too. */
static int send_flags(int sock, const void *buf, size_t len, int fd, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { (void *)buf, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (!buf || len == 0)
		return -EINVAL;
	/* The count is returned as int; callers send the rest. */
	if (len > INT_MAX)
		iov.iov_len = INT_MAX;
	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return (int)n;
}

int kvq_frame_send(int sock, const void *buf, size_t len, int fd)
{
	return send_flags(sock, buf, len, fd, 0);
}

/* Where the descriptors of a read go: into the caller's slot (the first,
 * while it is empty), to the decoder for their frame (the first, while it
 * holds none), or all closed. */
enum recv_fds { RECV_FDS_SLOT, RECV_FDS_FRAME, RECV_FDS_CLOSE };

/* Descriptors in one control message of a read that began at stream offset
 * at, kept per how (none when keep is 0) or closed. */
static void take_fds(struct kvq_frame_decoder *d, struct cmsghdr *c, enum recv_fds how, int *fd_slot, int keep,
		     uint64_t at)
{
	size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

	for (size_t i = 0; i < n; i++) {
		int fd;

		memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		if (keep && how == RECV_FDS_SLOT && *fd_slot < 0) {
			*fd_slot = fd;
		} else if (keep && how == RECV_FDS_FRAME && !d->has_fd) {
			d->fd = fd;
			d->fd_at = at;
			d->has_fd = true;
		} else {
			close(fd);
			d->fds_dropped++;
		}
	}
}

static int recv_flags(int sock, struct kvq_frame_decoder *d, enum recv_fds how, int *fd_slot, int flags)
{
	union {
		char buf[CMSG_SPACE(KVQ_FRAME_RECV_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t room;
	int truncated, r;
	ssize_t n;

	r = kvq_frame_decoder_space(d, &room);
	if (r < 0)
		return r;
	iov.iov_base = d->buf + d->end;
	iov.iov_len = room;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof(u.buf);
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	truncated = !!(msg.msg_flags & MSG_CTRUNC);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			take_fds(d, c, how, fd_slot, !truncated, d->taken);
	d->end += (size_t)n;
	d->taken += (uint64_t)n;
	/* Some descriptor did not fit and the kernel dropped it: whichever was
	 * meant to be kept may be among them. */
	if (truncated)
		return -EPROTO;
	return (int)n;
}

int kvq_frame_recv(int sock, struct kvq_frame_decoder *d, int *fd_slot)
{
	return recv_flags(sock, d, fd_slot ? RECV_FDS_SLOT : RECV_FDS_CLOSE, fd_slot, 0);
}

int kvq_frame_recv_fds(int sock, struct kvq_frame_decoder *d)
{
	return recv_flags(sock, d, RECV_FDS_FRAME, NULL, 0);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on sock until deadline (ms, CLOCK_MONOTONIC; -1 none).
 * Returns 0 when ready (or in error: the next call reports it), -ETIMEDOUT. */
static int wait_sock(int sock, short events, int64_t deadline)
{
	struct pollfd p = { .fd = sock, .events = events };

	for (;;) {
		int timeout = -1, r;

		if (deadline >= 0) {
			int64_t left = deadline - now_ms();

			if (left <= 0)
				return -ETIMEDOUT;
			timeout = left > INT_MAX ? INT_MAX : (int)left;
		}
		r = poll(&p, 1, timeout);
		if (r > 0)
			return 0;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

int kvq_frame_send_frames(int sock, const void *buf, size_t len, int fd, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	size_t off = 0;
	int r = -EINVAL;

	while (off < len) {
		r = send_flags(sock, (const uint8_t *)buf + off, len - off, off == 0 ? fd : -1, MSG_DONTWAIT);
		if (r > 0) {
			off += (size_t)r;
			continue;
		}
		if (r != -EAGAIN)
			break;
		r = wait_sock(sock, POLLOUT, deadline);
		if (r < 0)
			break;
	}
	return len > 0 && off == len ? 0 : r;
}

int kvq_frame_send_envelope(int sock, const Kvq__Envelope *e, int fd, int timeout_ms)
{
	uint8_t *buf;
	size_t len;
	int r;

	r = kvq_frame_encode_alloc(e, &buf, &len);
	if (r < 0)
		return r;
	r = kvq_frame_send_frames(sock, buf, len, fd, timeout_ms);
	free(buf);
	return r;
}

int kvq_frame_recv_envelope(int sock, struct kvq_frame_decoder *d, int *fd_slot, int timeout_ms,
			    Kvq__Envelope **ret)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	const uint8_t *payload = NULL;
	size_t len = 0;
	int r;

	for (;;) {
		r = kvq_frame_decoder_next(d, &payload, &len);
		if (r < 0)
			return r;
		if (r == 1)
			return kvq_frame_unpack(payload, len, ret);
		r = recv_flags(sock, d, fd_slot ? RECV_FDS_SLOT : RECV_FDS_CLOSE, fd_slot, MSG_DONTWAIT);
		if (r == 0)
			return -ECONNRESET;
		if (r == -EAGAIN)
			r = wait_sock(sock, POLLIN, deadline);
		if (r < 0)
			return r;
	}
}

