/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Framing of the kvqd protocol (proto/kvq.proto): a little-endian u32 length,
 * then one serialized Kvq__Envelope of that many bytes; the protocol's
 * version and limits.  Encoding, an incremental decoder for nonblocking
 * reads and unpacking with a memory budget.  The check against the limits
 * is frame_check.h, sending and receiving on a socket frame_io.h, the
 * attention-timing buckets timing_buckets.h.
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
#define KVQ_PROTOCOL_VERSION 10u

#define KVQ_FRAME_HDR 4u                /* the length prefix */
#define KVQ_FRAME_MAX (4u << 20)        /* largest envelope; a frame is HDR + envelope */

/* Limits on what a peer controls (kvq.proto, "Limits"); over one: -E2BIG. */
#define KVQ_PROTO_MAX_IDS 65536u        /* slot ids or slots asked for per request; chain length */
#define KVQ_PROTO_MAX_TOKENS 524288u    /* token ids per request: 2.5 MiB packed at worst */
#define KVQ_PROTO_MAX_PROMPTS 1024u    /* prompts in one Lookup (their tokens: within MAX_TOKENS) */
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
 * Memory protobuf-c may allocate to unpack one envelope.  Unpacked size is
 * not bounded by the frame: an empty submessage is 2 bytes on the wire and
 * ~100 in memory, an unknown field 2 bytes and two allocations.  The largest
 * legitimate request within the limits above unpacks to ~16 MiB.
 */
#define KVQ_FRAME_UNPACK_MAX (32u << 20)

/* Bytes kvq_frame_recv asks the kernel for at most, besides the rest of a
 * frame already announced. */
#define KVQ_FRAME_READ 65536u

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

/* For a reader that fills d itself (frame_io.c): makes room for the next
 * read, the rest of an announced frame or KVQ_FRAME_READ bytes, within
 * KVQ_FRAME_DECODER_MAX; returns 0 and *ret_room, the bytes free at
 * d->buf + d->end, or -ENOBUFS (d is full: take frames first), -ENOMEM. */
int kvq_frame_decoder_space(struct kvq_frame_decoder *d, size_t *ret_room);

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


#endif
