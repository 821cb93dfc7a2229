/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "frame_check.h"
#include "frame_io.h"

__attribute__((format(printf, 4, 5)))
static int conn_fail(struct kvq_conn *c, enum kvq_conn_fault fault, int r, const char *fmt, ...)
{
	va_list ap;

	c->fault = fault;
	va_start(ap, fmt);
	vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
	va_end(ap);
	return r;
}

static int64_t conn_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left to deadline (-1: none), at least 0. */
static int conn_left(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - conn_now_ms();
	return left < 0 ? 0 : left > INT32_MAX ? INT32_MAX : (int)left;
}

/*
 * connect() on the nonblocking socket within c->timeout_ms.  A Unix
 * socket whose backlog is full answers EAGAIN and keeps nothing pending:
 * try again every few milliseconds until the deadline.
 */
static int conn_connect(struct kvq_conn *c, const struct sockaddr_un *a)
{
	int64_t deadline = c->timeout_ms < 0 ? -1 : conn_now_ms() + c->timeout_ms;

	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = POLLOUT };
		socklen_t len = sizeof(int);
		int e = 0;

		if (connect(c->fd, (const struct sockaddr *)a, sizeof(*a)) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EINPROGRESS)
			return conn_fail(c, KVQ_CONN_CONNECT, -errno, "%s: %s", c->path, strerror(errno));
		if (deadline >= 0 && conn_left(deadline) == 0)
			return conn_fail(c, KVQ_CONN_CONNECT, -ETIMEDOUT,
					 "%s: kvqd took no connection within %d ms (its backlog is full)", c->path,
					 c->timeout_ms);
		if (errno == EAGAIN) {
			poll(NULL, 0, 5);
			continue;
		}
		if (poll(&p, 1, conn_left(deadline)) < 0 && errno != EINTR)
			return conn_fail(c, KVQ_CONN_CONNECT, -errno, "%s: %s", c->path, strerror(errno));
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e)
			return conn_fail(c, KVQ_CONN_CONNECT, -e, "%s: %s", c->path, strerror(e));
		if (p.revents & POLLOUT)
			return 0;
	}
}

/* The reply to request id within timeout_ms (kvq_conn_reply); refusal:
 * a refusal's body of type want comes back too (kvq_conn_reply_refusal). */
static int conn_reply_within(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, int timeout_ms,
			     bool refusal, Kvq__Envelope **ret);

void kvq_conn_init(struct kvq_conn *c, int timeout_ms)
{
	memset(c, 0, sizeof(*c));
	c->fd = c->pool_fd = -1;
	c->timeout_ms = timeout_ms;
	kvq_frame_decoder_init(&c->dec);
}

int kvq_conn_open(struct kvq_conn *c, const char *path, const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Hello h = KVQ__HELLO__INIT;
	int r;

	_Static_assert(sizeof(c->path) == sizeof(a.sun_path), "a path the socket address holds");
	if (!path)
		r = kvq_default_socket(c->path, sizeof(c->path));
	else
		r = snprintf(c->path, sizeof(c->path), "%s", path) < (int)sizeof(c->path) ? 0 : -ENAMETOOLONG;
	if (r < 0)
		return conn_fail(c, KVQ_CONN_PATH, r, "socket path: %s", kvq_strerror(r));
	memcpy(a.sun_path, c->path, strlen(c->path));
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->fd < 0)
		return conn_fail(c, KVQ_CONN_SOCKET, -errno, "socket: %s", strerror(errno));
	r = conn_connect(c, &a);
	if (r < 0)
		return r;
	h.protocol_version = KVQ_PROTOCOL_VERSION;
	h.client_name = (char *)name;
	e.body_case = KVQ__ENVELOPE__BODY_HELLO;
	e.hello = &h;
	r = kvq_conn_call(c, &e, KVQ__ENVELOPE__BODY_HELLO_REPLY, &rep);
	if (r < 0)
		return r;
	c->client_id = rep->hello_reply->client_id;
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_conn_call(struct kvq_conn *c, Kvq__Envelope *req, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	return kvq_conn_call_fd(c, req, -1, want, ret);
}

int kvq_conn_call_fd(struct kvq_conn *c, Kvq__Envelope *req, int fd, Kvq__Envelope__BodyCase want,
		     Kvq__Envelope **ret)
{
	int64_t deadline = c->timeout_ms < 0 ? -1 : conn_now_ms() + c->timeout_ms;
	int r;

	if (c->broken)
		return conn_fail(c, KVQ_CONN_TRANSPORT, -ENOTCONN, "connection to kvqd lost earlier");
	req->id = ++c->next_id;
	r = kvq_frame_send_envelope(c->fd, req, fd, c->timeout_ms);
	if (r == -EPIPE || r == -ECONNRESET) {
		/* kvqd may have said why it closed (a refusal at a limit) */
		int n = conn_reply_within(c, 0, KVQ__ENVELOPE__BODY__NOT_SET, 0, false, NULL);

		if (c->fault == KVQ_CONN_STATUS)
			return n;
	}
	if (r < 0) {
		c->broken = true;
		return conn_fail(c, KVQ_CONN_TRANSPORT, r, "sending to kvqd: %s", kvq_strerror(r));
	}
	return conn_reply_within(c, req->id, want, conn_left(deadline), false, ret);
}

int kvq_conn_reply(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	return conn_reply_within(c, id, want, c->timeout_ms, false, ret);
}

int kvq_conn_reply_refusal(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret)
{
	if (ret)
		*ret = NULL;
	return conn_reply_within(c, id, want, c->timeout_ms, true, ret);
}

static int conn_reply_within(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, int timeout_ms,
			     bool refusal, Kvq__Envelope **ret)
{
	Kvq__Envelope *rep = NULL;
	int r;

	c->msg[0] = 0;
	c->fault = KVQ_CONN_OK;
	if (c->broken)
		return conn_fail(c, KVQ_CONN_TRANSPORT, -ENOTCONN, "connection to kvqd lost earlier");
	r = kvq_frame_recv_envelope(c->fd, &c->dec, &c->pool_fd, timeout_ms, &rep);
	if (r == -ETIMEDOUT) {
		c->broken = true;   /* the reply may still come */
		return conn_fail(c, KVQ_CONN_TRANSPORT, r, "kvqd did not answer within %d ms", timeout_ms);
	}
	if (r < 0) {
		c->broken = true;   /* a reply may be left in flight */
		return conn_fail(c, KVQ_CONN_TRANSPORT, r, "reading from kvqd: %s", kvq_strerror(r));
	}
	if (rep->id == 0 && rep->status < 0) {
		/* no request's reply: kvqd says why it ends the connection (or
		 * could not read a request); nothing more comes in step */
		c->broken = true;
		r = conn_fail(c, KVQ_CONN_STATUS, rep->status, "%s",
			      rep->message && *rep->message ? rep->message : kvq_strerror(rep->status));
	} else if (rep->id != id || kvq_frame_check(rep, 0, NULL, 0) < 0) {
		c->broken = true;
		r = conn_fail(c, KVQ_CONN_PROTOCOL, KVQ_EPROTOCOL, "kvqd sent a reply that does not match the request");
	} else if (rep->status < 0) {
		r = conn_fail(c, KVQ_CONN_STATUS, rep->status, "%s",
			      rep->message && *rep->message ? rep->message : kvq_strerror(rep->status));
	} else if (rep->body_case != want) {
		r = conn_fail(c, KVQ_CONN_PROTOCOL, KVQ_EPROTOCOL, "kvqd answered with another reply type");
	}
	if (ret && (r == 0 || (refusal && c->fault == KVQ_CONN_STATUS && rep->id == id && rep->body_case == want)))
		*ret = rep;
	else
		kvq_frame_envelope_free(rep);
	return r;
}

void kvq_conn_close(struct kvq_conn *c)
{
	if (c->pool_fd >= 0)
		close(c->pool_fd);
	if (c->fd >= 0)
		close(c->fd);
	kvq_frame_decoder_fini(&c->dec);
	kvq_conn_init(c, c->timeout_ms);
}
