/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport of one control connection, after tmux's proc.c: a
 * non-blocking Unix stream socket on the daemon's libevent loop, frames in
 * (proto/frame.h) and queued frames out, with write interest only while
 * output is queued and no reading while too much is.  It knows no requests:
 * each frame goes to the owner's callback, which may queue replies.
 */
#ifndef KVQD_PEER_H
#define KVQD_PEER_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

/* Reply bytes queued for one peer before it stops reading from it. */
#define KVQ_PEER_OUT_HIGH (8u << 20)

typedef struct kvq_peer kvq_peer;

struct kvq_peer_cb {
	/* One frame's payload, valid during the call.  It may queue frames and
	 * ask for the close after them, but not free the peer. */
	void (*frame)(kvq_peer *p, const uint8_t *payload, size_t len, void *arg);
	/* The peer is done: end of stream, an error, a framing fault, or its
	 * last frame sent after kvq_peer_close_after().  why says which; the
	 * callee frees the peer (kvq_peer_free) and must not use it otherwise. */
	void (*closed)(kvq_peer *p, const char *why, void *arg);
};

/* A peer on fd (connected, non-blocking, close-on-exec; the peer owns it
 * from now on, and closes it on failure too); label names it in log lines
 * ("client 7").  cb and arg are kept.  Returns 0 and *ret, or -ENOMEM. */
int kvq_peer_new(struct event_base *base, int fd, const char *label, const struct kvq_peer_cb *cb, void *arg,
		 kvq_peer **ret);

/* Queues one frame (buf of len bytes from kvq_frame_encode_alloc, which the
 * peer frees in any case) with fd passed on its first byte when fd >= 0
 * (not owned).  Sending starts when the event loop next runs.  Returns 0
 * or -ENOMEM. */
int kvq_peer_queue(kvq_peer *p, uint8_t *buf, size_t len, int fd);

/* Reads no more frames; closes once everything queued is sent. */
void kvq_peer_close_after(kvq_peer *p);

/* Closes the socket, drops what is queued and frees; NULL is fine. */
void kvq_peer_free(kvq_peer *p);

#endif
