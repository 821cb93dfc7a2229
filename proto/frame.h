/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Framing of the kvqd protocol (proto/kvq.proto): a little-endian u32 length,
 * then one serialized Kvq__Envelope of that many bytes.  Encoding, an
 * incremental decoder for nonblocking reads, unpacking with a memory budget,
 * a structural check against the protocol's limits, and sending / receiving
 * with SCM_RIGHTS.
 *
 * Functions return 0 (or a non-negative count) on success and a negative
 * errno-style code on failure; out-parameters named ret_* are untouched on
 * failure.  Nothing here prints.
 */
#ifndef KVQ_FRAME_H
#define KVQ_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "kvq.pb-c.h"

/* Checked at Hello; bump for any change an older peer would misread
 * (kvq.proto, "The version", says what each one changed). */
#define KVQ_PROTOCOL_VERSION 6u

#define KVQ_FRAME_HDR 4u                /* the length prefix */
#define KVQ_FRAME_MAX (4u << 20)        /* largest envelope; a frame is HDR + envelope */

/* Limits on what a peer controls (kvq.proto, "Limits"); over one: -E2BIG. */
#define KVQ_PROTO_MAX_IDS 65536u        /* slot ids or slots asked for per request; chain length */
#define KVQ_PROTO_MAX_TOKENS 524288u    /* token ids per request: 2.5 MiB packed at worst */
#define KVQ_PROTO_MAX_NAME 64u          /* pool, group and client names, bytes */
#define KVQ_PROTO_MAX_REQUEST_ID 64u    /* Lookup.request_id, bytes (a group's lookups) */
#define KVQ_PROTO_MAX_MODEL_ID 256u
#define KVQ_PROTO_MAX_SALT 64u
#define KVQ_PROTO_MAX_POLICY KVQ_POLICY_MAX_LEN
#define KVQ_PROTO_MAX_MESSAGE 1024u     /* a reply's message */
#define KVQ_PROTO_MAX_ACL 63u           /* uids, and gids, in a PoolAdd (root is added) */
#define KVQ_PROTO_MAX_CLIENTS 1024u     /* clients in a StatsReply: the most connections kvqd takes */
#define KVQ_PROTO_MAX_POOLS 256u        /* pools in a StatsReply: the most pools kvqd holds */
#define KVQ_PROTO_MAX_TIMING_BINS 64u   /* bins of an attention report (more: dropped, not refused) */
#define KVQ_PROTO_SHA256 32u            /* bytes of codebooks_sha256 when set */

/*
 * Attention timing (kvq.proto, "Attention timings"): the buckets libkvq
 * sorts its calls into and kvqd exports, their upper bounds in seconds
 * (1 us to 1 s, six a decade: a decode call on a GPU takes microseconds),
 * and what kvqd believes of a report.
 */
#define KVQ_TIMING_BUCKETS 37u
extern const double kvq_timing_le[KVQ_TIMING_BUCKETS];
#define KVQ_TIMING_MAX_CALLS_PER_S 1000000u  /* calls a connection may report per second */
#define KVQ_TIMING_MAX_CALL_S 10.0           /* seconds one call past the last bound may take */
#define KVQ_TIMING_MIN_REPORT_MS 100u        /* kvqd.conf attention_report_ms range */
#define KVQ_TIMING_MAX_REPORT_MS 600000u

/* The bucket of a call of seconds: 0 .. KVQ_TIMING_BUCKETS (past every bound). */
unsigned kvq_timing_bucket(double seconds);

/*
 * Memory protobuf-c may allocate to unpack one envelope.  Unpacked size is
 * not bounded by the frame: an empty submessage is 2 bytes on the wire and
 * ~100 in memory, an unknown field 2 bytes and two allocations.  The largest
 * legitimate request within the limits above unpacks to ~16 MiB.
 */
#define KVQ_FRAME_UNPACK_MAX (32u << 20)

/* Bytes kvq_frame_recv asks the kernel for at most, besides the rest of a
 * frame already announced. */
#define KVQ_FRAME_READ 65536u
/* Descriptors one kvq_frame_recv can take before the control data is
 * truncated; more than one is a fault anyway. */
#define KVQ_FRAME_RECV_FDS 8u

/* ---------------------------------------------------------------- encode */

/* Frame size of e (prefix included); -EMSGSIZE when the envelope is over
 * KVQ_FRAME_MAX, -EINVAL when it packs to nothing (all fields default: a
 * zero length is a framing fault). */
int kvq_frame_size(const Kvq__Envelope *e);

/* Writes e as one frame into buf[len]; returns the frame's length,
 * -EMSGSIZE (envelope over KVQ_FRAME_MAX) or -ENOBUFS (len too small). */
int kvq_frame_encode(const Kvq__Envelope *e, void *buf, size_t len);

/* Same, into a malloc'd buffer: *ret_buf (free() it) and *ret_len; returns
 * 0, -EMSGSIZE or -ENOMEM. */
int kvq_frame_encode_alloc(const Kvq__Envelope *e, uint8_t **ret_buf, size_t *ret_len);

/* ---------------------------------------------------------------- decode */

/*
 * Incremental decoder: bytes go in (kvq_frame_decoder_feed, kvq_frame_recv)
 * in pieces of any size, frames come out (kvq_frame_decoder_next).  It never
 * allocates more than the bytes given to it, so a hostile length costs
 * nothing.  Fields are private; embed it (no allocation until bytes arrive;
 * all zero is an empty decoder too).
 *
 * Read with kvq_frame_recv_fds, it also keeps the descriptor that came with
 * the bytes (one at most) and hands it to its frame: the one whose bytes
 * include the first byte of the read that brought it (kvq.proto, "File
 * descriptors").  Stream offsets count every byte taken since init.
 */
struct kvq_frame_decoder {
	uint8_t *buf;
	size_t cap;             /* bytes allocated */
	size_t start;           /* first byte not yet returned */
	size_t end;             /* one past the last byte buffered */
	int err;                /* sticky framing fault */
	unsigned fds_dropped;   /* descriptors closed on receipt or unclaimed (for logs) */
	uint64_t taken;         /* stream offset of buf[end] */
	bool has_fd;            /* fd waits for its frame ... */
	int fd;
	uint64_t fd_at;         /* ... the one holding this stream offset */
	bool has_frame_fd;      /* frame_fd came with the frame last returned */
	int frame_fd;
};

/* Most bytes a decoder buffers (-ENOBUFS beyond): two largest frames.  A
 * reader that calls _next until it returns 0 before reading again stays
 * below one frame plus one read. */
#define KVQ_FRAME_DECODER_MAX (2 * ((size_t)KVQ_FRAME_HDR + KVQ_FRAME_MAX))

void kvq_frame_decoder_init(struct kvq_frame_decoder *d);

/* Frees the buffer and closes the descriptors it holds; the decoder can be
 * initialised again.  NULL is fine. */
void kvq_frame_decoder_fini(struct kvq_frame_decoder *d);

/* Appends data[len]; returns 0, -ENOBUFS (over KVQ_FRAME_DECODER_MAX
 * buffered) or -ENOMEM. */
int kvq_frame_decoder_feed(struct kvq_frame_decoder *d, const void *data, size_t len);

/*
 * Next complete frame: returns 1 with *ret_payload / *ret_len (the envelope
 * bytes, valid until the next call on d), 0 when more bytes are needed, or
 * a framing fault: -EPROTO (length 0) or -EMSGSIZE (length over
 * KVQ_FRAME_MAX).  A fault is reported as soon as the prefix is in and
 * sticks: the stream cannot be resynchronised.  The previous frame's
 * descriptor, when not taken, is closed here.
 */
int kvq_frame_decoder_next(struct kvq_frame_decoder *d, const uint8_t **ret_payload, size_t *ret_len);

/* The descriptor that came with the frame kvq_frame_decoder_next returned
 * last (kvq_frame_recv_fds), now the caller's; -1 when none came (or it was
 * taken already). */
int kvq_frame_decoder_take_fd(struct kvq_frame_decoder *d);

/* Bytes buffered but not returned as frames: nonzero at end of stream means
 * a truncated frame. */
size_t kvq_frame_decoder_pending(const struct kvq_frame_decoder *d);

/* ---------------------------------------------------------------- envelopes */

/* Unpacks an envelope within KVQ_FRAME_UNPACK_MAX bytes of memory; returns
 * 0 and *ret (kvq_frame_envelope_free), -EBADMSG for bytes that do not
 * parse (or would need more memory), -EMSGSIZE for len over KVQ_FRAME_MAX.
 * Parsing is not validation: see kvq_frame_check. */
int kvq_frame_unpack(const uint8_t *payload, size_t len, Kvq__Envelope **ret);

/* Frees an envelope from kvq_frame_unpack; NULL is fine. */
void kvq_frame_envelope_free(Kvq__Envelope *e);

/*
 * Checks what needs no state against the protocol (kvq.proto, "Limits" and
 * field comments): a body is set; a request is a request type with status 0
 * (is_request) or a reply a reply type; counts, lengths and names are within
 * limits.  Returns 0, -EOPNOTSUPP (no or wrong-direction body), -E2BIG (a
 * limit), -EINVAL (a malformed value, e.g. unequal pairs, a name with
 * blanks) or -EBADMSG (a request with a status), with a message naming the
 * field in err (may be NULL).
 */
int kvq_frame_check(const Kvq__Envelope *e, int is_request, char *err, size_t errlen);

/* ---------------------------------------------------------------- sockets */

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
