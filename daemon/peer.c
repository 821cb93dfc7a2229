/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "log.h"
#include "peer.h"

struct out {
	struct out *next;
	uint8_t *buf;
	size_t len, off;
	int fd;          /* sent with the first byte, not owned */
};

struct kvq_peer {
	int fd;
	struct event *rev, *wev;
	bool reading;
	struct kvq_frame_decoder dec;
	struct out *out_head, *out_tail;
	size_t out_bytes;
	bool close_after_flush;
	char label[32];
	const struct kvq_peer_cb *cb;
	void *arg;
};

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);

static void out_free(struct out *o)
{
	free(o->buf);
	free(o);
}

int kvq_peer_new(struct event_base *base, int fd, const char *label, const struct kvq_peer_cb *cb, void *arg,
		 kvq_peer **ret)
{
	kvq_peer *p = calloc(1, sizeof(*p));

	if (!p) {
		close(fd);
		return -ENOMEM;
	}
	p->fd = fd;
	p->cb = cb;
	p->arg = arg;
	snprintf(p->label, sizeof(p->label), "%s", label);
	kvq_frame_decoder_init(&p->dec);
	p->rev = event_new(base, fd, EV_READ | EV_PERSIST, on_read, p);
	p->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, on_write, p);
	if (!p->rev || !p->wev || event_add(p->rev, NULL) < 0) {
		kvq_peer_free(p);
		return -ENOMEM;
	}
	p->reading = true;
	*ret = p;
	return 0;
}

void kvq_peer_free(kvq_peer *p)
{
	struct out *o;

	if (!p)
		return;
	if (p->rev)
		event_free(p->rev);
	if (p->wev)
		event_free(p->wev);
	close(p->fd);
	kvq_frame_decoder_fini(&p->dec);
	while ((o = p->out_head)) {
		p->out_head = o->next;
		out_free(o);
	}
	free(p);
}

static void update_events(kvq_peer *p)
{
	bool want_read = p->out_bytes < KVQ_PEER_OUT_HIGH && !p->close_after_flush;

	if (want_read != p->reading) {
		if (want_read)
			event_add(p->rev, NULL);
		else
			event_del(p->rev);
		p->reading = want_read;
	}
	/* write interest only while output is queued */
	if (p->out_head)
		event_add(p->wev, NULL);
	else
		event_del(p->wev);
}

/* Sends what is queued; the peer may be closed (and freed) on return. */
static void flush(kvq_peer *p)
{
	struct out *o;

	while ((o = p->out_head)) {
		int n = kvq_frame_send(p->fd, o->buf + o->off, o->len - o->off, o->off ? -1 : o->fd);

		if (n == -EAGAIN)
			break;
		if (n < 0) {
			p->cb->closed(p, strerror(-n), p->arg);
			return;
		}
		o->off += (size_t)n;
		p->out_bytes -= (size_t)n;
		if (o->off < o->len)
			break;
		p->out_head = o->next;
		if (!p->out_head)
			p->out_tail = NULL;
		out_free(o);
	}
	if (!p->out_head && p->close_after_flush) {
		p->cb->closed(p, "closed after the reply", p->arg);
		return;
	}
	update_events(p);
}

int kvq_peer_queue(kvq_peer *p, uint8_t *buf, size_t len, int fd)
{
	struct out *o = calloc(1, sizeof(*o));

	if (!o) {
		free(buf);
		return -ENOMEM;
	}
	o->buf = buf;
	o->len = len;
	o->fd = fd;
	if (p->out_tail)
		p->out_tail->next = o;
	else
		p->out_head = o;
	p->out_tail = o;
	p->out_bytes += len;
	return 0;
}

void kvq_peer_close_after(kvq_peer *p)
{
	p->close_after_flush = true;
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	kvq_peer *p = arg;
	const uint8_t *payload;
	size_t len;
	int n, r;

	n = kvq_frame_recv(p->fd, &p->dec, NULL);
	if (n == -EAGAIN)
		return;
	if (n == 0) {
		p->cb->closed(p, kvq_frame_decoder_pending(&p->dec) ? "end of stream inside a frame" : "end of stream",
			      p->arg);
		return;
	}
	if (n < 0 && n != -ENOBUFS) {
		p->cb->closed(p, strerror(-n), p->arg);
		return;
	}
	if (p->dec.fds_dropped) {
		kvq_log(LOG_DEBUG, "%s: closed %u descriptors it sent", p->label, p->dec.fds_dropped);
		p->dec.fds_dropped = 0;
	}
	while (!p->close_after_flush && (r = kvq_frame_decoder_next(&p->dec, &payload, &len)) != 0) {
		if (r < 0) {
			kvq_log(LOG_NOTICE, "%s: framing fault (%s), closing", p->label, strerror(-r));
			p->cb->closed(p, "framing fault", p->arg);
			return;
		}
		p->cb->frame(p, payload, len, p->arg);
	}
	flush(p);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
	flush(arg);
}
