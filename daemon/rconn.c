/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster client's connections on libevent (rconn.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis.h>
#include <async.h>

#include "rconn.h"

#define RCONN_READ 16384u          /* a read when the reply's size is not known yet (hiredis's) */
#define RCONN_READ_MAX (1u << 20)  /* a read at most */
#define RCONN_KEEP (4u << 20)      /* an empty reader's buffer larger than this goes */

struct rconn {
	redisAsyncContext *ac;
	struct event *rev, *wev;
	bool reading, writing;
};

#if HIREDIS_MAJOR == 0
/* hiredis 0.14 exports it without declaring it: redisAsyncHandleRead's
 * second half, the replies parsed and their callbacks run */
void redisProcessCallbacks(redisAsyncContext *ac);

/* The bytes the reply at the head of r's buffer still lacks, when it is a
 * bulk string whose header came (else RCONN_READ), within RCONN_READ_MAX. */
static size_t rconn_want(const redisReader *r)
{
	const char *p = r->buf + r->pos, *end = r->buf + r->len;
	unsigned long long len = 0, total;
	size_t have = (size_t)(end - p);

	if (p == end || *p != '$')
		return RCONN_READ;
	for (p++; p < end && *p >= '0' && *p <= '9' && len < (1ull << 40); p++)
		len = len * 10 + (unsigned)(*p - '0');
	if (p + 1 >= end || p[0] != '\r' || p[1] != '\n')
		return RCONN_READ;   /* not all of the header, or nil ($-1) */
	total = (unsigned long long)(p + 2 - (r->buf + r->pos)) + len + 2;
	if (total <= have)
		return RCONN_READ;
	total -= have;
	return total < RCONN_READ ? RCONN_READ : total > RCONN_READ_MAX ? RCONN_READ_MAX : (size_t)total;
}

/* One read of c's socket into its reader's buffer: 0 (EAGAIN included) or
 * -1 (end of stream, an error, no memory: hiredis's own read path then
 * meets it and ends the connection as it does). */
static int rconn_fill(redisContext *c)
{
	redisReader *r = c->reader;
	size_t want;
	ssize_t n;
	sds b;

	if (r->err)
		return -1;
	if (r->len == 0 && sdsavail(r->buf) > RCONN_KEEP) {
		/* redisReaderFeed's own trim, at a bound that keeps a value's room */
		sdsfree(r->buf);
		r->buf = sdsempty();
		r->pos = 0;
		if (!r->buf)
			return -1;
	}
	want = rconn_want(r);
	b = sdsMakeRoomFor(r->buf, want);
	if (!b)
		return -1;
	r->buf = b;
	n = read(c->fd, b + sdslen(b), want);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	if (n == 0)
		return -1;
	sdsIncrLen(b, (int)n);
	r->len = sdslen(b);
	return 0;
}
#endif

static void rconn_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct rconn *e = arg;
	redisAsyncContext *ac = e->ac;

	(void)fd;
	(void)what;
#if HIREDIS_MAJOR == 0
	if ((ac->c.flags & REDIS_CONNECTED) && !ac->c.err && rconn_fill(&ac->c) == 0) {
		redisProcessCallbacks(ac);   /* may free ac, and e with it */
		return;
	}
#endif
	redisAsyncHandleRead(ac);
}

static void rconn_on_write(evutil_socket_t fd, short what, void *arg)
{
	struct rconn *e = arg;

	(void)fd;
	(void)what;
	redisAsyncHandleWrite(e->ac);
}

/* hiredis asks for each again and again: events change only when wanted */
static void rconn_add_read(void *arg)
{
	struct rconn *e = arg;

	if (!e->reading)
		e->reading = event_add(e->rev, NULL) == 0;
}

static void rconn_del_read(void *arg)
{
	struct rconn *e = arg;

	if (e->reading)
		event_del(e->rev);
	e->reading = false;
}

static void rconn_add_write(void *arg)
{
	struct rconn *e = arg;

	if (!e->writing)
		e->writing = event_add(e->wev, NULL) == 0;
}

static void rconn_del_write(void *arg)
{
	struct rconn *e = arg;

	if (e->writing)
		event_del(e->wev);
	e->writing = false;
}

static void rconn_cleanup(void *arg)
{
	struct rconn *e = arg;

	event_free(e->rev);
	event_free(e->wev);
	free(e);
}

int kvq_rconn_attach(redisAsyncContext *ac, struct event_base *base)
{
	struct rconn *e;

	if (ac->ev.data)
		return -1;
	e = calloc(1, sizeof *e);
	if (!e)
		return -1;
	e->ac = ac;
	e->rev = event_new(base, ac->c.fd, EV_READ | EV_PERSIST, rconn_on_read, e);
	e->wev = event_new(base, ac->c.fd, EV_WRITE | EV_PERSIST, rconn_on_write, e);
	if (!e->rev || !e->wev) {
		if (e->rev)
			event_free(e->rev);
		if (e->wev)
			event_free(e->wev);
		free(e);
		return -1;
	}
	ac->ev.addRead = rconn_add_read;
	ac->ev.delRead = rconn_del_read;
	ac->ev.addWrite = rconn_add_write;
	ac->ev.delWrite = rconn_del_write;
	ac->ev.cleanup = rconn_cleanup;
	ac->ev.data = e;
	/* as the adapter: the first write event tells the connection is up */
	rconn_add_read(e);
	rconn_add_write(e);
	return 0;
}
