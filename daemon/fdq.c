/* SPDX-License-Identifier: Apache-2.0 */
/* The fd store's messages, sent without waiting on the service manager (fdq.h). */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "fdq.h"
#include "log.h"
#include "sd.h"

struct fdq_msg {
	TAILQ_ENTRY(fdq_msg) link;
	int fd;                  /* the copy it stores, or -1 (a removal) */
	bool may_drop;
	char name[256];
	char text[sizeof("FDSTOREREMOVE=1\nFDNAME=") + 256];
};

TAILQ_HEAD(fdq_list, fdq_msg);

struct kvq_fdq {
	struct event_base *base;
	int sock;
	struct event *wev;        /* added while a message waits */
	struct fdq_list q;
	size_t n, n_may_drop;
	bool reopened;            /* the socket was opened again once since a send went */
};

static void fdq_on_write(evutil_socket_t fd, short what, void *arg);

static struct kvq_log_limit dropped_rl, failed_rl;

int kvq_fdq_new(struct event_base *base, kvq_fdq **ret)
{
	kvq_fdq *q = calloc(1, sizeof(*q));
	int sock;

	if (!q)
		return -ENOMEM;
	sock = kvq_sd_notify_open();
	if (sock < 0) {
		free(q);
		return sock;
	}
	q->base = base;
	q->sock = sock;
	TAILQ_INIT(&q->q);
	q->wev = event_new(base, sock, EV_WRITE | EV_PERSIST, fdq_on_write, q);
	if (!q->wev) {
		close(sock);
		free(q);
		return -ENOMEM;
	}
	*ret = q;
	return 0;
}

static void msg_free(kvq_fdq *q, struct fdq_msg *m)
{
	TAILQ_REMOVE(&q->q, m, link);
	q->n--;
	q->n_may_drop -= m->may_drop;
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

/* One send; a manager that was restarted (daemon-reexec keeps its socket,
 * a new one has a new one) gets the socket opened again, once. */
static int fdq_send(kvq_fdq *q, const char *text, int fd)
{
	int r = kvq_sd_notify_send(q->sock, text, &fd, fd >= 0 ? 1 : 0);

	if ((r == -ECONNREFUSED || r == -ENOTCONN) && !q->reopened) {
		int sock = kvq_sd_notify_open();

		q->reopened = true;
		if (sock < 0)
			return r;
		event_del(q->wev);
		event_free(q->wev);
		close(q->sock);
		q->sock = sock;
		q->wev = event_new(q->base, sock, EV_WRITE | EV_PERSIST, fdq_on_write, q);
		if (!q->wev)
			return -ENOMEM;
		r = kvq_sd_notify_send(q->sock, text, &fd, fd >= 0 ? 1 : 0);
	}
	if (r == 0)
		q->reopened = false;
	return r;
}

/* Sends what waits, in order, until the manager's queue is full again. */
static void fdq_flush(kvq_fdq *q)
{
	struct fdq_msg *m;

	while ((m = TAILQ_FIRST(&q->q))) {
		int r = fdq_send(q, m->text, m->fd);

		if (r == -EAGAIN)
			break;
		if (r < 0)
			kvq_log_limited(&failed_rl, LOG_WARNING, "fd store: %s for %s not sent: %s",
					m->fd >= 0 ? "FDSTORE=1" : "FDSTOREREMOVE=1", m->name, strerror(-r));
		msg_free(q, m);
	}
	if (!q->wev)
		return;
	if (TAILQ_EMPTY(&q->q))
		event_del(q->wev);
	else
		event_add(q->wev, NULL);
}

static void fdq_on_write(evutil_socket_t fd, short what, void *arg)
{
	fdq_flush(arg);
}

static int fdq_post(kvq_fdq *q, const char *name, int fd, bool may_drop)
{
	struct fdq_msg *m;
	int r;

	if (TAILQ_EMPTY(&q->q)) {
		char text[sizeof(m->text)];

		r = kvq_sd_fdstore_msg(text, sizeof(text), fd < 0, name);
		if (r < 0)
			return r;
		r = fdq_send(q, text, fd);
		if (r != -EAGAIN)
			return r;
	}
	if (may_drop && q->n_may_drop >= KVQ_FDQ_MAX) {
		kvq_log_limited(&dropped_rl, LOG_WARNING, "fd store: the service manager reads late, %u messages "
				"wait: %s for %s dropped (a restart names that process by pid and start time)",
				(unsigned)q->n, fd >= 0 ? "FDSTORE=1" : "FDSTOREREMOVE=1", name);
		return -ENOBUFS;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	r = kvq_sd_fdstore_msg(m->text, sizeof(m->text), fd < 0, name);
	m->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
	if (r < 0 || (fd >= 0 && m->fd < 0)) {
		r = r < 0 ? r : -errno;
		free(m);
		return r;
	}
	snprintf(m->name, sizeof(m->name), "%s", name);
	m->may_drop = may_drop;
	TAILQ_INSERT_TAIL(&q->q, m, link);
	q->n++;
	q->n_may_drop += may_drop;
	if (q->wev)
		event_add(q->wev, NULL);
	return 0;
}

int kvq_fdq_store(kvq_fdq *q, const char *name, int fd, bool may_drop)
{
	if (fd < 0)
		return -EBADF;
	return fdq_post(q, name, fd, may_drop);
}

int kvq_fdq_remove(kvq_fdq *q, const char *name, bool may_drop)
{
	struct fdq_msg *m;

	/* the last message for name, if it is an unsent FDSTORE=1, is taken
	 * back instead: the manager never sees either */
	TAILQ_FOREACH_REVERSE(m, &q->q, fdq_list, link)
		if (!strcmp(m->name, name)) {
			if (m->fd < 0)
				break;
			msg_free(q, m);
			if (TAILQ_EMPTY(&q->q) && q->wev)
				event_del(q->wev);
			return 0;
		}
	return fdq_post(q, name, -1, may_drop);
}

size_t kvq_fdq_queued(const kvq_fdq *q)
{
	return q->n;
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

size_t kvq_fdq_drain(kvq_fdq *q, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;

	if (!q)
		return 0;
	for (;;) {
		struct pollfd p = { .fd = q->sock, .events = POLLOUT };
		long left;

		fdq_flush(q);
		left = deadline - now_ms();
		if (!q->n || left <= 0 || !q->wev)
			break;
		if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
			break;
	}
	if (q->n)
		kvq_log(LOG_WARNING, "fd store: the service manager took no more in %d ms: %zu messages lost",
			timeout_ms, q->n);
	return q->n;
}

void kvq_fdq_free(kvq_fdq *q)
{
	struct fdq_msg *m;

	if (!q)
		return;
	while ((m = TAILQ_FIRST(&q->q)))
		msg_free(q, m);
	if (q->wev)
		event_free(q->wev);
	close(q->sock);
	free(q);
}
