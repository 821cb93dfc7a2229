/* SPDX-License-Identifier: Apache-2.0 */
/* Framing of the kvqd protocol: see frame.h and kvq.proto. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"

/* ---------------------------------------------------------------- attention timing */

const double kvq_timing_le[KVQ_TIMING_BUCKETS] = {
	1e-6, 1.5e-6, 2e-6, 3e-6, 5e-6, 7e-6,
	1e-5, 1.5e-5, 2e-5, 3e-5, 5e-5, 7e-5,
	1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7e-4,
	1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7e-3,
	1e-2, 1.5e-2, 2e-2, 3e-2, 5e-2, 7e-2,
	0.1, 0.15, 0.2, 0.3, 0.5, 0.7,
	1.0,
};

unsigned kvq_timing_bucket(double seconds)
{
	unsigned lo = 0, hi = KVQ_TIMING_BUCKETS;

	/* the first bound >= seconds; NaN goes past every bound */
	if (!(seconds <= kvq_timing_le[KVQ_TIMING_BUCKETS - 1]))
		return KVQ_TIMING_BUCKETS;
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (seconds > kvq_timing_le[mid])
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

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

/* ---------------------------------------------------------------- check */

__attribute__((format(printf, 4, 5)))
static int fail(int code, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* A string field: at most max bytes; without control characters (they end
 * up in logs and kvqctl output); with blanks only when allowed. */
static int check_str(const char *s, size_t max, int required, int blanks, const char *what,
		     char *err, size_t errlen)
{
	size_t n;

	if (!s)
		s = "";
	n = strlen(s);
	if (n > max)
		return fail(-E2BIG, err, errlen, "%s: %zu bytes, at most %zu", what, n, max);
	if (required && n == 0)
		return fail(-EINVAL, err, errlen, "%s: empty", what);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x20 || c > 0x7e || (c == ' ' && !blanks))
			return fail(-EINVAL, err, errlen, "%s: byte %zu is not printable ASCII%s", what, i,
				    blanks ? "" : " without blanks");
	}
	return 0;
}

static int check_count(size_t n, size_t max, const char *what, char *err, size_t errlen)
{
	if (n > max)
		return fail(-E2BIG, err, errlen, "%s: %zu, at most %zu", what, n, max);
	return 0;
}

static int check_salt(const ProtobufCBinaryData *s, const char *what, char *err, size_t errlen)
{
	return check_count(s->len, KVQ_PROTO_MAX_SALT, what, err, errlen);
}

static int check_backend(const char *s, int allow_default, const char *what, char *err, size_t errlen)
{
	if (!s)
		s = "";
	if (!strcmp(s, "host") || !strcmp(s, "cuda") || (allow_default && !*s))
		return 0;
	return fail(-EINVAL, err, errlen, "%s: not \"host\" or \"cuda\"", what);
}

static int check_act(int act, const char *what, char *err, size_t errlen)
{
	if (act == KVQ__DTYPE__DTYPE_F16 || act == KVQ__DTYPE__DTYPE_BF16)
		return 0;
	return fail(-EINVAL, err, errlen, "%s: unknown dtype %d", what, act);
}

#define TRY(x)                          \
	do {                            \
		int r_ = (x);           \
		if (r_ < 0)             \
			return r_;      \
	} while (0)

/* An Attach, or a PoolAdd's spec (what names the fields in messages). */
static int check_attach(const Kvq__Attach *a, const char *what, char *err, size_t errlen)
{
	char f[48];

	snprintf(f, sizeof(f), "%s.pool", what);
	TRY(check_str(a->pool, KVQ_PROTO_MAX_NAME, 1, 0, f, err, errlen));
	snprintf(f, sizeof(f), "%s.model_id", what);
	TRY(check_str(a->model_id, KVQ_PROTO_MAX_MODEL_ID, 1, 0, f, err, errlen));
	snprintf(f, sizeof(f), "%s.policy", what);
	TRY(check_str(a->policy, KVQ_PROTO_MAX_POLICY, 1, 1, f, err, errlen));
	snprintf(f, sizeof(f), "%s.act", what);
	TRY(check_act(a->act, f, err, errlen));
	snprintf(f, sizeof(f), "%s.create.backend", what);
	if (a->create)
		TRY(check_backend(a->create->backend, 1, f, err, errlen));
	return 0;
}

static int check_request(const Kvq__Envelope *e, char *err, size_t errlen)
{
	switch (e->body_case) {
	case KVQ__ENVELOPE__BODY_HELLO:
		return check_str(e->hello->client_name, KVQ_PROTO_MAX_NAME, 1, 0, "hello.client_name", err,
				 errlen);
	case KVQ__ENVELOPE__BODY_ATTACH:
		return check_attach(e->attach, "attach", err, errlen);
	case KVQ__ENVELOPE__BODY_EVICT:
		return check_str(e->evict->pool, KVQ_PROTO_MAX_NAME, 1, 0, "evict.pool", err, errlen);
	case KVQ__ENVELOPE__BODY_POOL_ADD: {
		const Kvq__PoolAdd *a = e->pool_add;

		if (!a->spec || !a->spec->create)
			return fail(-EINVAL, err, errlen, "pool_add: spec and spec.create are required");
		TRY(check_attach(a->spec, "pool_add.spec", err, errlen));
		TRY(check_count(a->n_acl_uids, KVQ_PROTO_MAX_ACL, "pool_add.acl_uids", err, errlen));
		return check_count(a->n_acl_gids, KVQ_PROTO_MAX_ACL, "pool_add.acl_gids", err, errlen);
	}
	case KVQ__ENVELOPE__BODY_POOL_DROP:
		return check_str(e->pool_drop->pool, KVQ_PROTO_MAX_NAME, 1, 0, "pool_drop.pool", err, errlen);
	case KVQ__ENVELOPE__BODY_ALLOC:
		return check_count((size_t)e->alloc->n_open + e->alloc->n_sealed + e->alloc->n_sink, KVQ_PROTO_MAX_IDS,
				   "alloc.n_open + alloc.n_sealed + alloc.n_sink", err, errlen);
	case KVQ__ENVELOPE__BODY_SEAL:
		TRY(check_count(e->seal->n_open_ids, KVQ_PROTO_MAX_IDS, "seal.open_ids", err, errlen));
		if (e->seal->n_open_ids != e->seal->n_sealed_ids)
			return fail(-EINVAL, err, errlen, "seal: %zu open ids, %zu sealed ids", e->seal->n_open_ids,
				    e->seal->n_sealed_ids);
		return 0;
	case KVQ__ENVELOPE__BODY_PUBLISH: {
		const Kvq__Publish *p = e->publish;
		size_t tokens = 0;

		TRY(check_count(p->n_blocks, KVQ_PROTO_MAX_IDS, "publish.blocks", err, errlen));
		for (size_t i = 0; i < p->n_blocks; i++) {
			const Kvq__PublishBlock *b = p->blocks[i];

			if (b->n_tokens == 0)
				return fail(-EINVAL, err, errlen, "publish.blocks[%zu]: no tokens", i);
			if (b->block_case == KVQ__PUBLISH_BLOCK__BLOCK__NOT_SET)
				return fail(-EINVAL, err, errlen, "publish.blocks[%zu]: no sealed_id or sink_id", i);
			TRY(check_salt(&b->salt, "publish.blocks[].salt", err, errlen));
			tokens += b->n_tokens;
		}
		return check_count(tokens, KVQ_PROTO_MAX_TOKENS, "publish: tokens", err, errlen);
	}
	case KVQ__ENVELOPE__BODY_LOOKUP: {
		const Kvq__Lookup *l = e->lookup;

		TRY(check_count(l->n_tokens, KVQ_PROTO_MAX_TOKENS, "lookup.tokens", err, errlen));
		TRY(check_salt(&l->salt, "lookup.salt", err, errlen));
		if (l->max_tokens > l->n_tokens)
			return fail(-EINVAL, err, errlen, "lookup.max_tokens %u over the %zu tokens sent",
				    l->max_tokens, l->n_tokens);
		return 0;
	}
	case KVQ__ENVELOPE__BODY_RELEASE:
		return check_count(e->release->n_sealed_ids + e->release->n_open_ids + e->release->n_sink_ids,
				   KVQ_PROTO_MAX_IDS, "release: ids", err, errlen);
	case KVQ__ENVELOPE__BODY_FORK:
		return check_count(e->fork->n_sealed_ids + e->fork->n_sink_ids, KVQ_PROTO_MAX_IDS, "fork: ids", err,
				   errlen);
	case KVQ__ENVELOPE__BODY_STATS:
		return check_str(e->stats->pool, KVQ_PROTO_MAX_NAME, 0, 0, "stats.pool", err, errlen);
	case KVQ__ENVELOPE__BODY__NOT_SET:
		return fail(-EOPNOTSUPP, err, errlen, "no message body, or one this version does not know");
	default:
		return fail(-EOPNOTSUPP, err, errlen, "a reply (body %d) sent as a request", (int)e->body_case);
	}
}

/* A codebooks_sha256: empty, or a SHA-256. */
static int check_sha256(const ProtobufCBinaryData *h, const char *what, char *err, size_t errlen)
{
	if (h->len != 0 && h->len != KVQ_PROTO_SHA256)
		return fail(-EINVAL, err, errlen, "%s: %zu bytes, not %u", what, h->len, KVQ_PROTO_SHA256);
	return 0;
}

static int check_pool_stats(const Kvq__PoolStats *p, char *err, size_t errlen)
{
	TRY(check_sha256(&p->codebooks_sha256, "pools[].codebooks_sha256", err, errlen));
	TRY(check_str(p->name, KVQ_PROTO_MAX_NAME, 1, 0, "pools[].name", err, errlen));
	TRY(check_str(p->model_id, KVQ_PROTO_MAX_MODEL_ID, 1, 0, "pools[].model_id", err, errlen));
	TRY(check_str(p->policy, KVQ_PROTO_MAX_POLICY, 1, 1, "pools[].policy", err, errlen));
	return check_backend(p->backend, 0, "pools[].backend", err, errlen);
}

static int check_reply(const Kvq__Envelope *e, char *err, size_t errlen)
{
	if (e->status > 0)
		return fail(-EBADMSG, err, errlen, "positive status %d", (int)e->status);
	TRY(check_str(e->message, KVQ_PROTO_MAX_MESSAGE, 0, 1, "message", err, errlen));
	switch (e->body_case) {
	case KVQ__ENVELOPE__BODY__NOT_SET:
		if (e->status < 0)
			return 0;
		return fail(-EOPNOTSUPP, err, errlen, "no reply body, or one this version does not know");
	case KVQ__ENVELOPE__BODY_HELLO_REPLY:
		return check_str(e->hello_reply->daemon_version, KVQ_PROTO_MAX_NAME, 1, 0,
				 "hello_reply.daemon_version", err, errlen);
	case KVQ__ENVELOPE__BODY_ATTACH_REPLY: {
		const Kvq__AttachReply *a = e->attach_reply;

		TRY(check_str(a->policy, KVQ_PROTO_MAX_POLICY, 1, 1, "attach_reply.policy", err, errlen));
		TRY(check_str(a->model_id, KVQ_PROTO_MAX_MODEL_ID, 1, 0, "attach_reply.model_id", err, errlen));
		TRY(check_backend(a->backend, 0, "attach_reply.backend", err, errlen));
		TRY(check_act(a->act, "attach_reply.act", err, errlen));
		if (a->device_uuid.len != 0 && a->device_uuid.len != 16)
			return fail(-EINVAL, err, errlen, "attach_reply.device_uuid: %zu bytes, not 16",
				    a->device_uuid.len);
		if (a->map_bytes < a->total_bytes)
			return fail(-EINVAL, err, errlen, "attach_reply.map_bytes under total_bytes");
		return check_sha256(&a->codebooks_sha256, "attach_reply.codebooks_sha256", err, errlen);
	}
	case KVQ__ENVELOPE__BODY_ALLOC_REPLY: {
		const Kvq__AllocReply *a = e->alloc_reply;

		if (a->n_open_ids != a->n_reserved_ids)
			return fail(-EINVAL, err, errlen, "alloc_reply: %zu open ids, %zu reserved ids",
				    a->n_open_ids, a->n_reserved_ids);
		return check_count(a->n_open_ids + a->n_sealed_ids + a->n_sink_ids, KVQ_PROTO_MAX_IDS,
				   "alloc_reply: ids", err, errlen);
	}
	case KVQ__ENVELOPE__BODY_PUBLISH_REPLY:
		return check_count(e->publish_reply->n_ids, KVQ_PROTO_MAX_IDS, "publish_reply.ids", err, errlen);
	case KVQ__ENVELOPE__BODY_LOOKUP_REPLY:
		return check_count(e->lookup_reply->n_sealed_ids + e->lookup_reply->n_sink_ids, KVQ_PROTO_MAX_IDS,
				   "lookup_reply: ids", err, errlen);
	case KVQ__ENVELOPE__BODY_SEAL_REPLY:
	case KVQ__ENVELOPE__BODY_RELEASE_REPLY:
	case KVQ__ENVELOPE__BODY_FORK_REPLY:
	case KVQ__ENVELOPE__BODY_EVICT_REPLY:
	case KVQ__ENVELOPE__BODY_POOL_DROP_REPLY:
		return 0;
	case KVQ__ENVELOPE__BODY_POOL_ADD_REPLY:
		if (!e->pool_add_reply->pool)
			return fail(-EINVAL, err, errlen, "pool_add_reply: no pool");
		return check_pool_stats(e->pool_add_reply->pool, err, errlen);
	case KVQ__ENVELOPE__BODY_STATS_REPLY: {
		const Kvq__StatsReply *s = e->stats_reply;

		TRY(check_str(s->daemon_version, KVQ_PROTO_MAX_NAME, 1, 0, "stats_reply.daemon_version", err,
			      errlen));
		TRY(check_backend(s->backend, 0, "stats_reply.backend", err, errlen));
		TRY(check_count(s->n_pools, KVQ_PROTO_MAX_POOLS, "stats_reply.pools", err, errlen));
		for (size_t i = 0; i < s->n_pools; i++)
			TRY(check_pool_stats(s->pools[i], err, errlen));
		TRY(check_count(s->n_clients, KVQ_PROTO_MAX_CLIENTS, "stats_reply.clients", err, errlen));
		for (size_t i = 0; i < s->n_clients; i++) {
			TRY(check_str(s->clients[i]->name, KVQ_PROTO_MAX_NAME, 0, 0, "clients[].name", err, errlen));
			TRY(check_str(s->clients[i]->pool, KVQ_PROTO_MAX_NAME, 0, 0, "clients[].pool", err, errlen));
		}
		return 0;
	}
	default:
		return fail(-EOPNOTSUPP, err, errlen, "a request (body %d) sent as a reply", (int)e->body_case);
	}
}

int kvq_frame_check(const Kvq__Envelope *e, int is_request, char *err, size_t errlen)
{
	if (!e)
		return fail(-EINVAL, err, errlen, "no envelope");
	if (!is_request)
		return check_reply(e, err, errlen);
	if (e->id == 0)
		return fail(-EBADMSG, err, errlen, "request id 0 (reserved)");
	if (e->status != 0 || (e->message && *e->message))
		return fail(-EBADMSG, err, errlen, "a request with a status or message");
	return check_request(e, err, errlen);
}

/* ---------------------------------------------------------------- sockets */

/* kvq_frame_send with extra sendmsg flags: MSG_DONTWAIT lets the blocking
 * helpers keep their deadline on a blocking socket too. */
static int send_flags(int sock, const void *buf, size_t len, int fd, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { (void *)buf, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (!buf || len == 0)
		return -EINVAL;
	/* The count is returned as int; callers send the rest. */
	if (len > INT_MAX)
		iov.iov_len = INT_MAX;
	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return (int)n;
}

int kvq_frame_send(int sock, const void *buf, size_t len, int fd)
{
	return send_flags(sock, buf, len, fd, 0);
}

/* Where the descriptors of a read go: into the caller's slot (the first,
 * while it is empty), to the decoder for their frame (the first, while it
 * holds none), or all closed. */
enum recv_fds { RECV_FDS_SLOT, RECV_FDS_FRAME, RECV_FDS_CLOSE };

/* Descriptors in one control message of a read that began at stream offset
 * at, kept per how (none when keep is 0) or closed. */
static void take_fds(struct kvq_frame_decoder *d, struct cmsghdr *c, enum recv_fds how, int *fd_slot, int keep,
		     uint64_t at)
{
	size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

	for (size_t i = 0; i < n; i++) {
		int fd;

		memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		if (keep && how == RECV_FDS_SLOT && *fd_slot < 0) {
			*fd_slot = fd;
		} else if (keep && how == RECV_FDS_FRAME && !d->has_fd) {
			d->fd = fd;
			d->fd_at = at;
			d->has_fd = true;
		} else {
			close(fd);
			d->fds_dropped++;
		}
	}
}

static int recv_flags(int sock, struct kvq_frame_decoder *d, enum recv_fds how, int *fd_slot, int flags)
{
	union {
		char buf[CMSG_SPACE(KVQ_FRAME_RECV_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t used = d->end - d->start, want = KVQ_FRAME_READ, room;
	int truncated, r;
	ssize_t n;

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
	iov.iov_base = d->buf + d->end;
	iov.iov_len = room;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof(u.buf);
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	truncated = !!(msg.msg_flags & MSG_CTRUNC);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			take_fds(d, c, how, fd_slot, !truncated, d->taken);
	d->end += (size_t)n;
	d->taken += (uint64_t)n;
	/* Some descriptor did not fit and the kernel dropped it: whichever was
	 * meant to be kept may be among them. */
	if (truncated)
		return -EPROTO;
	return (int)n;
}

int kvq_frame_recv(int sock, struct kvq_frame_decoder *d, int *fd_slot)
{
	return recv_flags(sock, d, fd_slot ? RECV_FDS_SLOT : RECV_FDS_CLOSE, fd_slot, 0);
}

int kvq_frame_recv_fds(int sock, struct kvq_frame_decoder *d)
{
	return recv_flags(sock, d, RECV_FDS_FRAME, NULL, 0);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on sock until deadline (ms, CLOCK_MONOTONIC; -1 none).
 * Returns 0 when ready (or in error: the next call reports it), -ETIMEDOUT. */
static int wait_sock(int sock, short events, int64_t deadline)
{
	struct pollfd p = { .fd = sock, .events = events };

	for (;;) {
		int timeout = -1, r;

		if (deadline >= 0) {
			int64_t left = deadline - now_ms();

			if (left <= 0)
				return -ETIMEDOUT;
			timeout = left > INT_MAX ? INT_MAX : (int)left;
		}
		r = poll(&p, 1, timeout);
		if (r > 0)
			return 0;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

int kvq_frame_send_frames(int sock, const void *buf, size_t len, int fd, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	size_t off = 0;
	int r = -EINVAL;

	while (off < len) {
		r = send_flags(sock, (const uint8_t *)buf + off, len - off, off == 0 ? fd : -1, MSG_DONTWAIT);
		if (r > 0) {
			off += (size_t)r;
			continue;
		}
		if (r != -EAGAIN)
			break;
		r = wait_sock(sock, POLLOUT, deadline);
		if (r < 0)
			break;
	}
	return len > 0 && off == len ? 0 : r;
}

int kvq_frame_send_envelope(int sock, const Kvq__Envelope *e, int fd, int timeout_ms)
{
	uint8_t *buf;
	size_t len;
	int r;

	r = kvq_frame_encode_alloc(e, &buf, &len);
	if (r < 0)
		return r;
	r = kvq_frame_send_frames(sock, buf, len, fd, timeout_ms);
	free(buf);
	return r;
}

int kvq_frame_recv_envelope(int sock, struct kvq_frame_decoder *d, int *fd_slot, int timeout_ms,
			    Kvq__Envelope **ret)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	const uint8_t *payload = NULL;
	size_t len = 0;
	int r;

	for (;;) {
		r = kvq_frame_decoder_next(d, &payload, &len);
		if (r < 0)
			return r;
		if (r == 1)
			return kvq_frame_unpack(payload, len, ret);
		r = recv_flags(sock, d, fd_slot ? RECV_FDS_SLOT : RECV_FDS_CLOSE, fd_slot, MSG_DONTWAIT);
		if (r == 0)
			return -ECONNRESET;
		if (r == -EAGAIN)
			r = wait_sock(sock, POLLIN, deadline);
		if (r < 0)
			return r;
	}
}
