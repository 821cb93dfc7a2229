/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport of one control connection, after tmux's proc.c: a
 * non-blocking Unix stream socket on the daemon's libevent loop, frames in
 * (proto/frame.h) and replies out, with write interest only while output is
 * queued.  It knows no requests: each frame goes to the owner's callback,
 * which may queue replies.
 *
 * What one peer may cost is bounded by its limits (struct kvq_peer_limits,
 * kvqd.conf's max_output and frames_per_wakeup): replies are encoded into
 * one output buffer, whose pending bytes are what counts; before each frame
 * is decoded the pending output is checked, and past max_output no more
 * frames are decoded nor bytes read until the client has read enough; after
 * frames_per_wakeup frames the peer yields to the others and goes on at the
 * loop's next turn.  Input is one frame plus one read at most, since
 * nothing more is read while complete frames wait, and one descriptor at
 * most: the one that came with the frame being read (proto/frame_io.h,
 * kvq_frame_recv_fds); every other is closed on receipt.
 */
#ifndef KVQD_PEER_H
#define KVQD_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "frame.h"

typedef struct kvq_peer kvq_peer;

/* Shared by the peers of a server, which may change the limits at any time
 * (SIGHUP); read at each use. */
struct kvq_peer_limits {
	size_t max_output;          /* pending reply bytes past which no frame is decoded */
	unsigned frames_per_wakeup; /* frames decoded per turn of the loop */
	uint64_t n_backpressure;    /* times a peer stopped reading for its output */
};

struct kvq_peer_cb {
	/* One frame's payload, valid during the call, and the descriptor that
	 * came with it (kvq.proto, "File descriptors") or -1: the peer's, which
	 * closes it after the call.  It may queue frames and ask for the close
	 * after them, but not free the peer. */
	void (*frame)(kvq_peer *p, const uint8_t *payload, size_t len, int fd, void *arg);
	/* The peer is done: end of stream, an error, a framing fault, or its
	 * last frame sent after kvq_peer_close_after().  why says which; the
	 * callee frees the peer (kvq_peer_free) and must not use it otherwise. */
	void (*closed)(kvq_peer *p, const char *why, void *arg);
};

/* A peer on fd (connected, non-blocking, close-on-exec; the peer owns it
 * from now on, and closes it on failure too); label names it in log lines
 * ("client 7").  cb, arg and lim are kept.  Returns 0 and *ret, or
 * -ENOMEM. */
int kvq_peer_new(struct event_base *base, int fd, const char *label, const struct kvq_peer_cb *cb, void *arg,
		 struct kvq_peer_limits *lim, kvq_peer **ret);

/* Encodes e as one frame at the end of the output, with fd passed on its
 * first byte when fd >= 0 (not owned; one at a time).  Sending starts when
 * the event loop next runs.  Returns 0, -EMSGSIZE (over KVQ_FRAME_MAX),
 * -EBUSY (a descriptor waits already) or -ENOMEM. */
int kvq_peer_queue(kvq_peer *p, const Kvq__Envelope *e, int fd);

/* held: decodes no more frames and reads nothing (a reply waits, and
 * replies go in order); frames already read wait too.  Not held: goes on,
 * the waiting frames first. */
void kvq_peer_hold(kvq_peer *p, bool held);

/* Reads no more frames; closes once everything queued is sent. */
void kvq_peer_close_after(kvq_peer *p);

/* Queues e and sends what the socket takes now, without waiting: a last
 * word (why the connection ends) before the owner frees the peer. */
void kvq_peer_send_last(kvq_peer *p, const Kvq__Envelope *e);

/* Closes the socket, drops what is queued and frees; NULL is fine. */
void kvq_peer_free(kvq_peer *p);

#endif
