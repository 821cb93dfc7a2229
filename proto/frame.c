/* SPDX-License-Identifier: Apache-2.0 */
/* Framing of the kvqd protocol: encoding, the incremental decoder and
 * unpacking (frame.h, kvq.proto). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"

/* ---------------------------------------------------------------- encode */

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int kvq_frame_size(const Kvq__Envelope *e)
{
	size_t n;

	if (!e)
		return -EINVAL;
	n = protobuf_c_message_get_packed_size(&e->base);
	if (n > KVQ_FRAME_MAX)
		return -EMSGSIZE;
	/* An all-default envelope packs to nothing, and length 0 is a framing
	 * fault: refuse it here rather than have the peer drop the connection. */
	if (n == 0)
		return -EINVAL;
	return (int)(n + KVQ_FRAME_HDR);
}

/* Writes the frame of e, whose size kvq_frame_size gave, at p. */
static int pack_frame(const Kvq__Envelope *e, uint8_t *p, int size)
{
	put_le32(p, (uint32_t)size - KVQ_FRAME_HDR);
	if (protobuf_c_message_pack(&e->base, p + KVQ_FRAME_HDR) != (size_t)size - KVQ_FRAME_HDR)
		return -EINVAL;
	return size;
}

int kvq_frame_encode(const Kvq__Envelope *e, void *buf, size_t len)
{
	int size = kvq_frame_size(e);

	if (size < 0)
		return size;
	if (!buf || len < (size_t)size)
		return -ENOBUFS;
	return pack_frame(e, buf, size);
}

int kvq_frame_encode_alloc(const Kvq__Envelope *e, uint8_t **ret_buf, size_t *ret_len)
{
	uint8_t *buf;
	int size = kvq_frame_size(e);
	int r;

	if (size < 0)
		return size;
	buf = malloc((size_t)size);
	if (!buf)
		return -ENOMEM;
	r = pack_frame(e, buf, size);
	if (r < 0) {
		free(buf);
		return r;
	}
	*ret_buf = buf;
	*ret_len = (size_t)size;
	return 0;
}

/* ---------------------------------------------------------------- decode */

void kvq_frame_decoder_init(struct kvq_frame_decoder *d)
{
	memset(d, 0, sizeof(*d));
}

void kvq_frame_decoder_fini(struct kvq_frame_decoder *d)
{
	if (!d)
		return;
	if (d->has_fd)
		close(d->fd);
	if (d->has_frame_fd)
		close(d->frame_fd);
	free(d->buf);
	memset(d, 0, sizeof(*d));
}

/* Makes room for want more bytes after end.  The caller has checked that
 * the buffered bytes plus want stay within KVQ_FRAME_DECODER_MAX. */
static int decoder_room(struct kvq_frame_decoder *d, size_t want)
{
	size_t used = d->end - d->start, cap;
	uint8_t *p;

	/* Give a large buffer back once it is empty: a connection that sent one
	 * 4 MiB frame should not keep 4 MiB for its lifetime. */
	if (used == 0 && d->cap > 2 * KVQ_FRAME_READ && want <= KVQ_FRAME_READ) {
		free(d->buf);
		d->buf = NULL;
		d->cap = 0;
	}
	if (used == 0)
		d->start = d->end = 0;
	if (d->cap - d->end >= want)
		return 0;
	if (d->start > 0) {
		memmove(d->buf, d->buf + d->start, used);
		d->start = 0;
		d->end = used;
		if (d->cap - d->end >= want)
			return 0;
	}
	cap = d->cap ? d->cap : 4096;
	while (cap - used < want)
		cap *= 2;
	if (cap > KVQ_FRAME_DECODER_MAX)
		cap = used + want > KVQ_FRAME_DECODER_MAX ? used + want : KVQ_FRAME_DECODER_MAX;
	p = realloc(d->buf, cap);
	if (!p)
		return -ENOMEM;
	d->buf = p;
	d->cap = cap;
	return 0;
}

int kvq_frame_decoder_space(struct kvq_frame_decoder *d, size_t *ret_room)
{
	size_t used = d->end - d->start, want = KVQ_FRAME_READ, room;
	int r;

	if (used >= KVQ_FRAME_DECODER_MAX)
		return -ENOBUFS;
	/* Read the rest of an announced (valid) frame in one go rather than in
	 * KVQ_FRAME_READ steps, each a memmove and a realloc. */
	if (used >= KVQ_FRAME_HDR && !d->err) {
		uint32_t len = get_le32(d->buf + d->start);

		if (len > 0 && len <= KVQ_FRAME_MAX && KVQ_FRAME_HDR + (size_t)len - used > want)
			want = KVQ_FRAME_HDR + (size_t)len - used;
	}
	if (want > KVQ_FRAME_DECODER_MAX - used)
		want = KVQ_FRAME_DECODER_MAX - used;
	r = decoder_room(d, want);
	if (r < 0)
		return r;
	room = d->cap - d->end;
	if (room > KVQ_FRAME_DECODER_MAX - used)
		room = KVQ_FRAME_DECODER_MAX - used;
	*ret_room = room;
	return 0;
}

int kvq_frame_decoder_feed(struct kvq_frame_decoder *d, const void *data, size_t len)
{
	int r;

	if (len == 0)
		return 0;
	if (len > KVQ_FRAME_DECODER_MAX - (d->end - d->start))
		return -ENOBUFS;
	r = decoder_room(d, len);
	if (r < 0)
		return r;
	memcpy(d->buf + d->end, data, len);
	d->end += len;
	d->taken += len;
	return 0;
}

int kvq_frame_decoder_next(struct kvq_frame_decoder *d, const uint8_t **ret_payload, size_t *ret_len)
{
	size_t avail = d->end - d->start;
	uint64_t at = d->taken - avail;     /* stream offset of the next frame */
	uint32_t len;

	if (d->has_frame_fd) {
		/* the previous frame's, not wanted */
		close(d->frame_fd);
		d->has_frame_fd = false;
		d->fds_dropped++;
	}
	if (d->err)
		return d->err;
	if (avail < KVQ_FRAME_HDR)
		return 0;
	len = get_le32(d->buf + d->start);
	if (len == 0)
		return d->err = -EPROTO;
	if (len > KVQ_FRAME_MAX)
		return d->err = -EMSGSIZE;
	if (avail - KVQ_FRAME_HDR < len)
		return 0;
	*ret_payload = d->buf + d->start + KVQ_FRAME_HDR;
	*ret_len = len;
	/* the descriptor is this frame's when the read that brought it began
	 * inside the frame (never before it: frames before that read were
	 * complete, and returned, first) */
	if (d->has_fd && d->fd_at < at + KVQ_FRAME_HDR + len) {
		d->frame_fd = d->fd;
		d->has_frame_fd = true;
		d->has_fd = false;
	}
	/* Only the indices move: the payload stays where it is until the next
	 * feed or read. */
	d->start += KVQ_FRAME_HDR + (size_t)len;
	return 1;
}

int kvq_frame_decoder_take_fd(struct kvq_frame_decoder *d)
{
	if (!d->has_frame_fd)
		return -1;
	d->has_frame_fd = false;
	return d->frame_fd;
}

size_t kvq_frame_decoder_pending(const struct kvq_frame_decoder *d)
{
	return d->end - d->start;
}

/* ---------------------------------------------------------------- envelopes */

struct unpack_budget {
	size_t left;
};

static void *budget_alloc(void *data, size_t size)
{
	struct unpack_budget *b = data;
	/* Count malloc's own overhead too: protobuf-c makes many small
	 * allocations (one per submessage, per unknown field). */
	size_t cost = size + 16;

	if (cost < size || cost > b->left)
		return NULL;
	b->left -= cost;
	return malloc(size ? size : 1);
}

static void budget_free(void *data, void *p)
{
	free(p);
}

int kvq_frame_unpack(const uint8_t *payload, size_t len, Kvq__Envelope **ret)
{
	struct unpack_budget b = { KVQ_FRAME_UNPACK_MAX };
	ProtobufCAllocator a = { budget_alloc, budget_free, &b };
	Kvq__Envelope *e;

	if (len > KVQ_FRAME_MAX)
		return -EMSGSIZE;
	if (!payload && len)
		return -EINVAL;
	e = kvq__envelope__unpack(&a, len, payload);
	if (!e)
		return -EBADMSG;
	*ret = e;
	return 0;
}

void kvq_frame_envelope_free(Kvq__Envelope *e)
{
	/* budget_alloc is malloc, so the default allocator frees it: the budget
	 * need not outlive the unpack. */
	if (e)
		kvq__envelope__free_unpacked(e, NULL);
}
