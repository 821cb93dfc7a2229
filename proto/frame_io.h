/* SPDX-License-Identifier: Apache-2.0 */
/* Frames over a stream socket (frame.h's framing), descriptors as
 * SCM_RIGHTS; the blocking helpers with deadlines.  Returns as frame.h. */
#ifndef KVQ_FRAME_IO_H
#define KVQ_FRAME_IO_H

#include <stddef.h>

#include "frame.h"

/* Descriptors one kvq_frame_recv can take before the control data is
 * truncated; more than one is a fault anyway. */
#define KVQ_FRAME_RECV_FDS 8u

/*
 * One sendmsg (MSG_NOSIGNAL, retried on EINTR) of buf[len] on a stream
 * socket, with fd as SCM_RIGHTS when fd >= 0.  Returns the bytes sent
 * (> 0; fewer than len when a nonblocking socket filled up: send the rest
 * with fd -1, the descriptor went with the first byte), -EAGAIN when
 * nothing was sent (nor the fd), or another negative errno (-EPIPE when
 * the peer is gone).
 */
int kvq_frame_send(int sock, const void *buf, size_t len, int fd);

/*
 * One recvmsg (MSG_CMSG_CLOEXEC, retried on EINTR) of up to KVQ_FRAME_READ
 * bytes (or the rest of an announced frame) into d.  fd_slot NULL: no
 * descriptor is expected and any that arrives is closed.  Otherwise the
 * first descriptor to arrive while *fd_slot < 0 is stored there (the caller
 * owns it) and every other one is closed.  Returns the bytes read (> 0), 0
 * at end of stream, -EAGAIN, -ENOBUFS (d holds KVQ_FRAME_DECODER_MAX: call
 * kvq_frame_decoder_next first), -EPROTO when the control data was
 * truncated (what arrived is closed, the bytes are buffered; close the
 * connection: a descriptor was lost), or another negative errno.
 */
int kvq_frame_recv(int sock, struct kvq_frame_decoder *d, int *fd_slot);

/*
 * kvq_frame_recv for a reader that gives each frame the descriptor that came
 * with it (kvqd): the first descriptor of a read, while d holds none, is
 * kept in d for the frame that holds the read's first byte
 * (kvq_frame_decoder_take_fd after that frame); every other one is closed
 * (counted in fds_dropped), so d never holds more than one.  Returns as
 * kvq_frame_recv.
 */
int kvq_frame_recv_fds(int sock, struct kvq_frame_decoder *d);

/*
 * For blocking callers (libkvq, kvqctl, tests), on blocking or nonblocking
 * sockets: sends e as one frame, with fd (-1 for none), waiting with poll
 * while the socket is full, at most timeout_ms in all (-1: no limit).
 * Returns 0, -EMSGSIZE, -ETIMEDOUT (part of the frame may be sent: close
 * the connection), -ENOMEM or a send error.
 */
int kvq_frame_send_envelope(int sock, const Kvq__Envelope *e, int fd, int timeout_ms);

/*
 * The same for bytes encoded already (kvq_frame_encode): buf[len], one frame
 * or several, so that a pipelining caller sends its requests in one write.
 * Returns 0, -EINVAL (len 0), -ETIMEDOUT (part of buf may be sent) or a
 * send error.
 */
int kvq_frame_send_frames(int sock, const void *buf, size_t len, int fd, int timeout_ms);

/*
 * Reads until d yields one frame and unpacks it: returns 0 and *ret, or
 * -ETIMEDOUT, -ECONNRESET (end of stream, even inside a frame), a framing
 * fault (-EPROTO, -EMSGSIZE), -EBADMSG, or a receive error.  fd_slot as
 * for kvq_frame_recv: a descriptor stored there is the caller's whatever
 * the return (it may belong to a frame still buffered).  Frames after the
 * one returned stay buffered in d.
 */
int kvq_frame_recv_envelope(int sock, struct kvq_frame_decoder *d, int *fd_slot, int timeout_ms,
			    Kvq__Envelope **ret);

#endif
