/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame_io.h"
#include "log.h"
#include "peer.h"

/* An output buffer this large or smaller is kept once empty; a larger one
 * is freed, so that idle connections hold little. */
#define PEER_OUT_KEEP 65536u
#define PEER_OUT_MIN 4096u

struct kvq_peer {
	int fd;
	struct event *rev, *wev, *mev;  /* readable, writable, more frames buffered */
	bool reading;
	bool more;                      /* frames may wait in dec: decode them before reading */
	bool throttled;                 /* stopped for its output (counted once per stop) */
	struct kvq_frame_decoder dec;
	uint8_t *out;                   /* [off, end) waits to be sent */
	size_t out_cap, out_off, out_end;
	int out_fd;                     /* sent with the byte at out_fd_at, or -1 (not owned) */
	size_t out_fd_at;
	bool close_after_flush;
	bool held;                      /* kvq_peer_hold: no frame decoded, nothing read */
	char label[32];
	const struct kvq_peer_cb *cb;
	void *arg;
	struct kvq_peer_limits *lim;
};

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void on_more(evutil_socket_t fd, short what, void *arg);

int kvq_peer_new(struct event_base *base, int fd, const char *label, const struct kvq_peer_cb *cb, void *arg,
		 struct kvq_peer_limits *lim, kvq_peer **ret)
{
	kvq_peer *p = calloc(1, sizeof(*p));

	if (!p) {
		close(fd);
		return -ENOMEM;
	}
	p->fd = fd;
	p->out_fd = -1;
	p->cb = cb;
	p->arg = arg;
	p->lim = lim;
	snprintf(p->label, sizeof(p->label), "%s", label);
	kvq_frame_decoder_init(&p->dec);
	p->rev = event_new(base, fd, EV_READ | EV_PERSIST, on_read, p);
	p->wev = event_new(base, fd, EV_WRITE | EV_PERSIST, on_write, p);
	p->mev = event_new(base, -1, 0, on_more, p);
	if (!p->rev || !p->wev || !p->mev || event_add(p->rev, NULL) < 0) {
		kvq_peer_free(p);
		return -ENOMEM;
	}
	p->reading = true;
	*ret = p;
	return 0;
}

void kvq_peer_free(kvq_peer *p)
{
	if (!p)
		return;
	if (p->rev)
		event_free(p->rev);
	if (p->wev)
		event_free(p->wev);
	if (p->mev)
		event_free(p->mev);
	close(p->fd);
	kvq_frame_decoder_fini(&p->dec);
	free(p->out);
	free(p);
}

static size_t pending(const kvq_peer *p)
{
	return p->out_end - p->out_off;
}

static bool over_output(const kvq_peer *p)
{
	return pending(p) >= p->lim->max_output;
}

static void update_events(kvq_peer *p)
{
	bool blocked = p->close_after_flush || p->held || over_output(p);
	bool want_read = !blocked && !p->more;

	if (over_output(p) && !p->throttled) {
		p->throttled = true;
		p->lim->n_backpressure++;
	} else if (!over_output(p)) {
		p->throttled = false;
	}
	if (want_read != p->reading) {
		if (want_read)
			event_add(p->rev, NULL);
		else
			event_del(p->rev);
		p->reading = want_read;
	}
	/* frames already buffered go on at the loop's next turn */
	if (p->more && !blocked)
		event_active(p->mev, EV_TIMEOUT, 0);
	/* write interest only while output is queued */
	if (pending(p))
		event_add(p->wev, NULL);
	else
		event_del(p->wev);
}

/* Sends what the socket takes: 0 (all sent, or the socket is full) or a
 * send error. */
static int send_out(kvq_peer *p)
{
	while (pending(p)) {
		size_t len = pending(p);
		int fd = -1, n;

		/* the descriptor goes with its frame's first byte, on a send of its own */
		if (p->out_fd >= 0) {
			if (p->out_fd_at == p->out_off)
				fd = p->out_fd;
			else
				len = p->out_fd_at - p->out_off;
		}
		n = kvq_frame_send(p->fd, p->out + p->out_off, len, fd);
		if (n == -EAGAIN)
			return 0;
		if (n < 0)
			return n;
		if (fd >= 0)
			p->out_fd = -1;
		p->out_off += (size_t)n;
	}
	p->out_off = p->out_end = 0;
	if (p->out_cap > PEER_OUT_KEEP) {
		free(p->out);
		p->out = NULL;
		p->out_cap = 0;
	}
	return 0;
}

/* Sends what is queued; the peer may be closed (and freed) on return. */
static void flush(kvq_peer *p)
{
	int n = send_out(p);

	if (n < 0) {
		p->cb->closed(p, strerror(-n), p->arg);
		return;
	}
	if (!pending(p) && p->close_after_flush) {
		p->cb->closed(p, "closed after the reply", p->arg);
		return;
	}
	update_events(p);
}

int kvq_peer_queue(kvq_peer *p, const Kvq__Envelope *e, int fd)
{
	int size = kvq_frame_size(e);

	if (size < 0)
		return size;
	if (fd >= 0 && p->out_fd >= 0)
		return -EBUSY;
	if (p->out_off && p->out_end + (size_t)size > p->out_cap) {
		memmove(p->out, p->out + p->out_off, pending(p));
		if (p->out_fd >= 0)
			p->out_fd_at -= p->out_off;
		p->out_end -= p->out_off;
		p->out_off = 0;
	}
	if (p->out_end + (size_t)size > p->out_cap) {
		size_t cap = p->out_cap + p->out_cap / 2;
		uint8_t *b;

		if (cap < p->out_end + (size_t)size)
			cap = p->out_end + (size_t)size;
		if (cap < PEER_OUT_MIN)
			cap = PEER_OUT_MIN;
		b = realloc(p->out, cap);
		if (!b)
			return -ENOMEM;
		p->out = b;
		p->out_cap = cap;
	}
	if (kvq_frame_encode(e, p->out + p->out_end, (size_t)size) != size)
		return -EMSGSIZE;
	if (fd >= 0) {
		p->out_fd = fd;
		p->out_fd_at = p->out_end;
	}
	p->out_end += (size_t)size;
	return 0;
}

void kvq_peer_close_after(kvq_peer *p)
{
	p->close_after_flush = true;
}

void kvq_peer_send_last(kvq_peer *p, const Kvq__Envelope *e)
{
	if (kvq_peer_queue(p, e, -1) == 0)
		send_out(p);
}

/* Decodes the frames buffered, up to the peer's turn; the peer may be
 * closed (and freed) on return. */
static void decode(kvq_peer *p)
{
	unsigned budget = p->lim->frames_per_wakeup;
	const uint8_t *payload;
	size_t len;
	int r, fd;

	p->more = false;
	for (;;) {
		if (p->close_after_flush)
			break;
		if (p->held) {
			p->more = true;
			break;
		}
		/* back-pressure per frame: no reply is made past the output cap */
		if (over_output(p) || budget == 0) {
			p->more = true;
			break;
		}
		r = kvq_frame_decoder_next(&p->dec, &payload, &len);
		if (r == 0)
			break;
		if (r < 0) {
			static struct kvq_log_limit rl;

			kvq_log_limited(&rl, LOG_NOTICE, "%s: framing fault (%s), closing", p->label, strerror(-r));
			p->cb->closed(p, "framing fault", p->arg);
			return;
		}
		fd = kvq_frame_decoder_take_fd(&p->dec);
		p->cb->frame(p, payload, len, fd, p->arg);
		if (fd >= 0)
			close(fd);
		budget--;
	}
	flush(p);
}

void kvq_peer_hold(kvq_peer *p, bool held)
{
	p->held = held;
	update_events(p);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	kvq_peer *p = arg;
	int n;

	n = kvq_frame_recv_fds(p->fd, &p->dec);
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
		kvq_log(LOG_DEBUG, "%s: closed %u descriptors it sent beyond one a request", p->label,
			p->dec.fds_dropped);
		p->dec.fds_dropped = 0;
	}
	decode(p);
}

static void on_more(evutil_socket_t fd, short what, void *arg)
{
	decode(arg);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
	flush(arg);
}
