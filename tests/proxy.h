/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A counting proxy for the integration tests: it listens on a Unix socket
 * of its own, takes one connection and forwards its bytes both ways to
 * kvqd's socket on a thread, descriptors (SCM_RIGHTS: an Attach's
 * codebooks, the pool's memfd in its reply) with the bytes they came with.
 * It counts what passes without decoding a message: bytes, frames (the
 * length prefix, proto/frame.h) and descriptors each way, and round trips:
 * the turns where bytes from the client are followed by bytes from the
 * daemon.  A client that writes several requests together and then reads
 * their replies costs one round trip; one that waits for each reply before
 * the next request costs one per request.  The counts are the client's
 * library's own business only in that they must agree with it.
 *
 * The proxy counts bytes before it forwards them, so a call that read its
 * replies has been counted when it returns: test_proxy_snap before and
 * test_proxy_since after measure the call.  While bytes wait on both sides
 * the client's go first, so a client's requests written together stay one
 * turn even when the daemon answers the first before the proxy read the
 * last.
 */
#ifndef KVQ_TEST_PROXY_H
#define KVQ_TEST_PROXY_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { PROXY_UP = 0, PROXY_DOWN = 1 };   /* client to daemon, daemon to client */

/* Counts over a span (test_proxy_since) or since the start. */
struct proxy_count {
	uint64_t trips;             /* client bytes followed by daemon bytes */
	uint64_t frames[2];         /* frames begun, by direction */
	uint64_t bytes[2];
	uint64_t fds[2];            /* descriptors forwarded */
};

struct proxy {
	char path[108];             /* where the client connects */
	char target[108];           /* kvqd's socket */
	int lfd, cfd, dfd;
	pthread_t thread;
	bool running;
	int err;                    /* the thread's first failure (negative errno), 0 */
	int last;                   /* direction of the last bytes forwarded, -1 none (thread only) */
	struct {                    /* the frame being read, by direction (thread only) */
		uint8_t hdr[4];
		unsigned have;
		uint64_t left;
	} fr[2];
	_Atomic uint64_t trips, frames[2], bytes[2], fds[2];
	uint8_t buf[1 << 18];       /* one read (thread only) */
};

/* Counts frames beginning in buf[n] going direction dir. */
static void proxy_frames(struct proxy *p, int dir, const uint8_t *buf, size_t n)
{
	while (n) {
		if (p->fr[dir].left) {
			size_t k = p->fr[dir].left < n ? (size_t)p->fr[dir].left : n;

			p->fr[dir].left -= k;
			buf += k;
			n -= k;
			continue;
		}
		p->fr[dir].hdr[p->fr[dir].have++] = *buf++;
		n--;
		if (p->fr[dir].have == 4) {
			const uint8_t *h = p->fr[dir].hdr;

			p->fr[dir].left = (uint64_t)h[0] | (uint64_t)h[1] << 8 | (uint64_t)h[2] << 16 |
					  (uint64_t)h[3] << 24;
			p->fr[dir].have = 0;
			atomic_fetch_add(&p->frames[dir], 1);
		}
	}
}

/* One read from `from` forwarded to `to` with its descriptors.  Returns
 * the bytes (0: end of stream) or a negative errno. */
static ssize_t proxy_forward(struct proxy *p, int dir, int from, int to)
{
	union {
		char buf[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { p->buf, sizeof p->buf };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof u.buf };
	int fds[8], nfd = 0;
	ssize_t n, off = 0;

	do
		n = recvmsg(from, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return n < 0 ? -errno : 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfd < 8; i++)
				memcpy(&fds[nfd++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	if (dir == PROXY_DOWN && p->last == PROXY_UP)
		atomic_fetch_add(&p->trips, 1);
	p->last = dir;
	proxy_frames(p, dir, p->buf, (size_t)n);
	atomic_fetch_add(&p->bytes[dir], (uint64_t)n);
	atomic_fetch_add(&p->fds[dir], (uint64_t)nfd);
	/* the descriptors go with the first byte, as they came */
	while (off < n) {
		struct iovec out = { p->buf + off, (size_t)(n - off) };
		struct msghdr m = { .msg_iov = &out, .msg_iovlen = 1 };
		ssize_t w;

		if (nfd) {
			memset(&u, 0, sizeof u);
			m.msg_control = u.buf;
			m.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
			CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(nfd * sizeof(int));
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), fds, nfd * sizeof(int));
		}
		do
			w = sendmsg(to, &m, MSG_NOSIGNAL);
		while (w < 0 && errno == EINTR);
		if (w < 0) {
			n = -errno;
			break;
		}
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		nfd = 0;
		off += w;
	}
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
	return n;
}

static void *proxy_main(void *arg)
{
	struct proxy *p = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	p->cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (p->cfd < 0) {
		p->err = -errno;
		return NULL;
	}
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", p->target);
	p->dfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->dfd < 0 || connect(p->dfd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		p->err = -errno;
		return NULL;
	}
	for (;;) {
		struct pollfd pf[2] = { { p->cfd, POLLIN, 0 }, { p->dfd, POLLIN, 0 } };
		ssize_t n;

		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			p->err = -errno;
			break;
		}
		/* the client's bytes first: see the top of this file */
		if (pf[0].revents)
			n = proxy_forward(p, PROXY_UP, p->cfd, p->dfd);
		else
			n = proxy_forward(p, PROXY_DOWN, p->dfd, p->cfd);
		if (n <= 0) {
			if (n < 0 && !p->err)
				p->err = (int)n;
			break;
		}
	}
	/* either side gone: the other sees the end of its stream */
	shutdown(p->cfd, SHUT_RDWR);
	shutdown(p->dfd, SHUT_RDWR);
	return NULL;
}

/* Listens on path and forwards its one connection to target on a thread.
 * Returns 0 or a negative errno. */
__attribute__((unused))
static int test_proxy_start(struct proxy *p, const char *path, const char *target)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int r;

	memset(p, 0, sizeof *p);
	p->cfd = p->dfd = -1;
	p->last = -1;
	snprintf(p->path, sizeof p->path, "%s", path);
	snprintf(p->target, sizeof p->target, "%s", target);
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	p->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->lfd < 0)
		return -errno;
	if (bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(p->lfd, 1) < 0) {
		r = -errno;
		close(p->lfd);
		return r;
	}
	r = -pthread_create(&p->thread, NULL, proxy_main, p);
	if (r < 0) {
		close(p->lfd);
		unlink(path);
		return r;
	}
	p->running = true;
	return 0;
}

/* The counts since the start. */
__attribute__((unused))
static struct proxy_count test_proxy_snap(struct proxy *p)
{
	struct proxy_count c = { .trips = atomic_load(&p->trips) };

	for (int d = 0; d < 2; d++) {
		c.frames[d] = atomic_load(&p->frames[d]);
		c.bytes[d] = atomic_load(&p->bytes[d]);
		c.fds[d] = atomic_load(&p->fds[d]);
	}
	return c;
}

/* The counts since the snapshot `from`. */
__attribute__((unused))
static struct proxy_count test_proxy_since(struct proxy *p, struct proxy_count from)
{
	struct proxy_count c = test_proxy_snap(p);

	c.trips -= from.trips;
	for (int d = 0; d < 2; d++) {
		c.frames[d] -= from.frames[d];
		c.bytes[d] -= from.bytes[d];
		c.fds[d] -= from.fds[d];
	}
	return c;
}

/* After the client closed its connection (or never came): waits for the
 * thread and removes the socket; returns the thread's failure or 0. */
__attribute__((unused))
static int test_proxy_stop(struct proxy *p)
{
	if (!p->running)
		return 0;
	shutdown(p->lfd, SHUT_RDWR);   /* wakes an accept still waiting */
	pthread_join(p->thread, NULL);
	p->running = false;
	close(p->lfd);
	if (p->cfd >= 0)
		close(p->cfd);
	if (p->dfd >= 0)
		close(p->dfd);
	unlink(p->path);
	return p->err;
}

#endif
