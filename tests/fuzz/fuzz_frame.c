/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the frame decoder and the envelope functions on a byte
 * stream as a peer would send it.  The first byte seeds how the stream is
 * cut into reads; the rest is the stream.  Checked against a plain reading
 * of the framing (kvq.proto): the decoder yields the same frames, the same
 * fault at the same place, and keeps the rest pending.  Each frame's
 * envelope, when it parses, is checked both ways and packed again: the
 * packed form unpacks to an envelope that packs to the same bytes and that
 * kvq_frame_check judges the same way.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "frame_check.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The framing read plainly: frames start at offsets 0, 4 + len0, ...; the
 * first bad length is the fault, at the offset of its prefix. */
struct expect {
	size_t n_frames;
	size_t consumed;        /* bytes of whole frames before the fault or the rest */
	int fault;              /* 0, -EPROTO or -EMSGSIZE */
};

static void expect_of(const uint8_t *s, size_t n, struct expect *x)
{
	size_t pos = 0;

	memset(x, 0, sizeof(*x));
	while (n - pos >= KVQ_FRAME_HDR) {
		uint32_t len = le32(s + pos);

		if (len == 0 || len > KVQ_FRAME_MAX) {
			x->fault = len == 0 ? -EPROTO : -EMSGSIZE;
			break;
		}
		if (n - pos - KVQ_FRAME_HDR < len)
			break;
		pos += KVQ_FRAME_HDR + len;
		x->n_frames++;
	}
	x->consumed = pos;
}

/* kvq_frame_check's code, and that its message is a terminated string. */
static int check(const Kvq__Envelope *e, int is_request)
{
	char err[256];
	int r;

	memset(err, 'x', sizeof(err));
	err[0] = 0;
	r = kvq_frame_check(e, is_request, err, sizeof(err));
	FUZZ_ASSERT(r <= 0);
	FUZZ_ASSERT(memchr(err, 0, sizeof(err)));
	FUZZ_ASSERT(r == 0 || err[0]);
	return r;
}

/* Whether m or a submessage kept an unknown field of number 0: protobuf-c
 * 1.4.1 takes one written as a longer varint (0x82 0x00) and packs it back
 * as the one byte 0x02, which its parser refuses; kvqd never packs what it
 * received, so only the round trip below is spared. */
static bool tag0_unknown(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	for (unsigned i = 0; i < m->n_unknown_fields; i++)
		if (m->unknown_fields[i].tag == 0)
			return true;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *at = (const char *)m + f->offset;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
			ProtobufCMessage *const *sub = *(ProtobufCMessage *const *const *)at;

			for (size_t k = 0; k < n; k++)
				if (tag0_unknown(sub[k]))
					return true;
		} else {
			const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)at;

			/* a oneof member is there only when its case is set */
			if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
			    *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
				continue;
			if (sub && tag0_unknown(sub))
				return true;
		}
	}
	return false;
}

static void envelope(const uint8_t *payload, size_t len)
{
	Kvq__Envelope *e = NULL, *e2 = NULL;
	struct kvq_frame_decoder d;
	const uint8_t *p2;
	uint8_t *buf = NULL, *buf2 = NULL;
	size_t blen = 0, blen2 = 0, len2;
	int r, req, rep;

	if (kvq_frame_unpack(payload, len, &e) < 0)
		return;
	req = check(e, 1);
	rep = check(e, 0);
	r = kvq_frame_encode_alloc(e, &buf, &blen);
	if (r < 0) {
		/* unknown fields are dropped, so only defaults pack to nothing */
		FUZZ_ASSERT(r == -EINVAL || r == -EMSGSIZE);
		kvq_frame_envelope_free(e);
		return;
	}
	FUZZ_ASSERT(blen > KVQ_FRAME_HDR && le32(buf) == blen - KVQ_FRAME_HDR);
	FUZZ_ASSERT(kvq_frame_size(e) == (int)blen);
	/* through a decoder again, as the peer would read it */
	kvq_frame_decoder_init(&d);
	FUZZ_ASSERT(kvq_frame_decoder_feed(&d, buf, blen) == 0);
	FUZZ_ASSERT(kvq_frame_decoder_next(&d, &p2, &len2) == 1 && len2 == blen - KVQ_FRAME_HDR);
	FUZZ_ASSERT(kvq_frame_decoder_pending(&d) == 0);
	if (tag0_unknown(&e->base)) {
		kvq_frame_decoder_fini(&d);
		free(buf);
		kvq_frame_envelope_free(e);
		return;
	}
	FUZZ_ASSERT(kvq_frame_unpack(p2, len2, &e2) == 0);
	kvq_frame_decoder_fini(&d);
	FUZZ_ASSERT(check(e2, 1) == req && check(e2, 0) == rep);
	FUZZ_ASSERT(e2->body_case == e->body_case && e2->id == e->id && e2->status == e->status);
	FUZZ_ASSERT(kvq_frame_encode_alloc(e2, &buf2, &blen2) == 0);
	FUZZ_ASSERT(blen2 == blen && !memcmp(buf, buf2, blen));
	free(buf);
	free(buf2);
	kvq_frame_envelope_free(e);
	kvq_frame_envelope_free(e2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvq_frame_decoder d;
	struct expect x;
	const uint8_t *s;
	size_t n, fed = 0, frames = 0, at = 0;
	uint32_t rng;
	int fault = 0;

	if (size < 1)
		return 0;
	rng = data[0] * 2654435761u + 1;
	s = data + 1;
	n = size - 1;
	expect_of(s, n, &x);
	kvq_frame_decoder_init(&d);
	while (fed < n && !fault) {
		size_t piece;

		rng = rng * 1103515245u + 12345u;
		/* mostly small reads, at times the rest at once */
		piece = (rng >> 16) % 8 == 0 ? n - fed : 1 + (rng >> 16) % 13;
		if (piece > n - fed)
			piece = n - fed;
		FUZZ_ASSERT(kvq_frame_decoder_feed(&d, s + fed, piece) == 0);
		fed += piece;
		for (;;) {
			const uint8_t *p;
			size_t len;
			int r = kvq_frame_decoder_next(&d, &p, &len);

			if (r == 0)
				break;
			if (r < 0) {
				/* reported as soon as its prefix is in, and it sticks */
				FUZZ_ASSERT(r == x.fault && at == x.consumed);
				FUZZ_ASSERT(fed - piece < at + KVQ_FRAME_HDR && fed >= at + KVQ_FRAME_HDR);
				FUZZ_ASSERT(kvq_frame_decoder_next(&d, &p, &len) == r);
				fault = r;
				break;
			}
			FUZZ_ASSERT(r == 1 && frames < x.n_frames);
			FUZZ_ASSERT(len == le32(s + at) && p && !memcmp(p, s + at + KVQ_FRAME_HDR, len));
			at += KVQ_FRAME_HDR + len;
			frames++;
			envelope(p, len);
		}
	}
	FUZZ_ASSERT(fault == x.fault && frames == x.n_frames && at == x.consumed);
	if (!fault)
		FUZZ_ASSERT(kvq_frame_decoder_pending(&d) == n - at);
	kvq_frame_decoder_fini(&d);
	return 0;
}
