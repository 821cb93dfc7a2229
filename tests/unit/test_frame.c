/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Framing and envelopes of the kvqd protocol: every message type through
 * encode -> decoder -> unpack, frames split and coalesced, framing faults,
 * garbage, the unpack budget, limits, and descriptor passing over a
 * socketpair.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame.h"
#include "frame_check.h"
#include "frame_io.h"
#include "kvq.h"
#include "../tap.h"

#define N_ELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- messages */

static uint32_t ids_a[] = { 0, 1, 7, 128, 65535, 1u << 29 };
static uint32_t ids_b[] = { 3, 4, 1000000, 0xffffffffu, 42, 9 };
static uint32_t toks_a[16], toks_b[16], toks_lookup[48];
static uint8_t salt[] = { 0, 1, 2, 0xff, 'x' };
static uint8_t uuid[16] = { 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
static uint8_t sha[KVQ_PROTO_SHA256] = { 0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
					  0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
					  0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad };

static Kvq__Hello hello;
static Kvq__HelloReply hello_reply;
static Kvq__PoolCreate pool_create;
static Kvq__Attach attach;
static Kvq__AttachReply attach_reply;
static Kvq__Alloc alloc_req;
static Kvq__AllocReply alloc_reply;
static Kvq__Seal seal;
static Kvq__SealReply seal_reply;
static Kvq__PublishBlock pub_blocks[2];
static Kvq__PublishBlock *pub_block_ptrs[2] = { &pub_blocks[0], &pub_blocks[1] };
static Kvq__Publish publish;
static Kvq__PublishReply publish_reply;
static Kvq__Lookup lookup;
static Kvq__LookupReply lookup_reply;
static Kvq__Release release;
static Kvq__ReleaseReply release_reply;
static Kvq__Fork fork_req;
static Kvq__ForkReply fork_reply;
static Kvq__Stats stats;
static Kvq__PoolStats pool_stats[2];
static Kvq__PoolStats *pool_stats_ptrs[2] = { &pool_stats[0], &pool_stats[1] };
static Kvq__StatsReply stats_reply;

#define N_BODIES 18

static void messages_init(void)
{
	for (unsigned i = 0; i < 16; i++) {
		toks_a[i] = 100 + i * 977;
		toks_b[i] = 0xfffffff0u + i % 16;
	}
	for (unsigned i = 0; i < 48; i++)
		toks_lookup[i] = i < 16 ? toks_a[i] : i * 31 + 5;

	kvq__hello__init(&hello);
	hello.protocol_version = KVQ_PROTOCOL_VERSION;
	hello.client_name = "worker-7";

	kvq__hello_reply__init(&hello_reply);
	hello_reply.daemon_version = "0.1.0";
	hello_reply.protocol_version = KVQ_PROTOCOL_VERSION;
	hello_reply.client_id = 0x123456789abcull;

	kvq__pool_create__init(&pool_create);
	pool_create.n_sealed = 4096;
	pool_create.n_open = 512;
	pool_create.backend = "host";
	pool_create.device = -1;

	kvq__attach__init(&attach);
	attach.pool = "main";
	attach.model_id = "llama-3.1-8b@5206a32";
	attach.layers = 32;
	attach.kv_heads = 8;
	attach.head_dim = 128;
	attach.block_tokens = 16;
	attach.policy = "0-9:int8; 10-:kivi2";
	attach.window = 64;
	attach.act = KVQ__DTYPE__DTYPE_BF16;
	attach.layout_version = 1;
	attach.create = &pool_create;
	attach.codebooks = true;
	attach.sink_blocks = 1;

	kvq__attach_reply__init(&attach_reply);
	attach_reply.layout_version = 1;
	attach_reply.layers = 32;
	attach_reply.kv_heads = 8;
	attach_reply.head_dim = 128;
	attach_reply.block_tokens = 16;
	attach_reply.window = 64;
	attach_reply.act = KVQ__DTYPE__DTYPE_BF16;
	attach_reply.n_sealed = 4096;
	attach_reply.n_open = 512;
	attach_reply.sink_blocks = 1;
	attach_reply.n_sink = 300;
	attach_reply.policy = "0-9:int8;10-31:kivi2";
	attach_reply.total_bytes = 5000000000ull;
	attach_reply.map_bytes = 5001707520ull;
	attach_reply.backend = "cuda";
	attach_reply.device = 3;
	attach_reply.device_uuid.data = uuid;
	attach_reply.device_uuid.len = sizeof(uuid);
	attach_reply.model_id = "llama-3.1-8b@5206a32";
	attach_reply.codebooks_sha256.data = sha;
	attach_reply.codebooks_sha256.len = sizeof(sha);

	kvq__alloc__init(&alloc_req);
	alloc_req.n_open = 6;
	alloc_req.n_sealed = 6;
	alloc_req.n_sink = 1;

	kvq__alloc_reply__init(&alloc_reply);
	alloc_reply.n_open_ids = N_ELEM(ids_a);
	alloc_reply.open_ids = ids_a;
	alloc_reply.n_reserved_ids = N_ELEM(ids_b);
	alloc_reply.reserved_ids = ids_b;
	alloc_reply.n_sealed_ids = 3;
	alloc_reply.sealed_ids = ids_b + 3;
	alloc_reply.n_sink_ids = 1;
	alloc_reply.sink_ids = ids_a;

	kvq__seal__init(&seal);
	seal.n_open_ids = N_ELEM(ids_a);
	seal.open_ids = ids_a;
	seal.n_sealed_ids = N_ELEM(ids_b);
	seal.sealed_ids = ids_b;
	kvq__seal_reply__init(&seal_reply);

	for (int i = 0; i < 2; i++)
		kvq__publish_block__init(&pub_blocks[i]);
	pub_blocks[0].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID;
	pub_blocks[0].sink_id = 17;
	pub_blocks[0].n_tokens = 16;
	pub_blocks[0].tokens = toks_a;
	pub_blocks[1].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
	pub_blocks[1].sealed_id = 0;  /* id 0 is a real id: presence matters */
	pub_blocks[1].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_SINK_ID;
	pub_blocks[1].parent_sink_id = 0;
	pub_blocks[1].n_tokens = 16;
	pub_blocks[1].tokens = toks_b;
	pub_blocks[1].salt.data = salt;
	pub_blocks[1].salt.len = sizeof(salt);
	kvq__publish__init(&publish);
	publish.n_blocks = 2;
	publish.blocks = pub_block_ptrs;

	kvq__publish_reply__init(&publish_reply);
	publish_reply.n_ids = 2;
	publish_reply.ids = ids_b + 2;

	kvq__lookup__init(&lookup);
	lookup.n_tokens = N_ELEM(toks_lookup);
	lookup.tokens = toks_lookup;
	lookup.max_tokens = 32;
	lookup.salt.data = salt;
	lookup.salt.len = 3;

	kvq__lookup_reply__init(&lookup_reply);
	lookup_reply.n_sealed_ids = 2;
	lookup_reply.sealed_ids = ids_a + 1;
	lookup_reply.n_sink_ids = 1;
	lookup_reply.sink_ids = ids_b;

	kvq__release__init(&release);
	release.n_sealed_ids = N_ELEM(ids_a);
	release.sealed_ids = ids_a;
	release.n_open_ids = 2;
	release.open_ids = ids_b;
	release.n_sink_ids = 1;
	release.sink_ids = ids_b + 2;
	kvq__release_reply__init(&release_reply);

	kvq__fork__init(&fork_req);
	fork_req.n_sealed_ids = N_ELEM(ids_b);
	fork_req.sealed_ids = ids_b;
	fork_req.n_sink_ids = 2;
	fork_req.sink_ids = ids_a;
	kvq__fork_reply__init(&fork_reply);

	kvq__stats__init(&stats);
	stats.pool = "main";

	for (int i = 0; i < 2; i++) {
		Kvq__PoolStats *p = &pool_stats[i];

		kvq__pool_stats__init(p);
		p->name = i ? "second" : "main";
		if (i == 0) {
			p->codebooks_sha256.data = sha;
			p->codebooks_sha256.len = sizeof(sha);
		}
		p->model_id = "m@1";
		p->policy = "int8";
		p->backend = i ? "cuda" : "host";
		p->device = i ? 0 : -1;
		p->layers = 32 + i;
		p->kv_heads = 8;
		p->head_dim = 128;
		p->block_tokens = 16;
		p->window = 16;
		p->total_bytes = 1ull << (33 + i);
		p->n_sealed = 1000 + i;
		p->n_open = 100 + i;
		p->sealed_free = 500;
		p->sealed_reserved = 20;
		p->sealed_held = 30;
		p->cached = 400;
		p->referenced = 300 + i;
		p->open_used = 20;
		p->lookup_tokens = 123456789012ull;
		p->hit_tokens = 98765432ull + i;
		p->evictions = 77;
		p->alloc_failures = 3;
		p->clients = 5 + i;
	}
	kvq__stats_reply__init(&stats_reply);
	stats_reply.daemon_version = "0.1.0";
	stats_reply.uptime_ms = 86400000ull * 30;
	stats_reply.backend = "host";
	stats_reply.n_pools = 2;
	stats_reply.pools = pool_stats_ptrs;
}

/* Envelope number i (0 .. N_BODIES-1) of the sample set: requests carry a
 * status of 0, replies a mix. */
static void envelope_make(Kvq__Envelope *e, int i)
{
	kvq__envelope__init(e);
	e->id = 0xfedcba9876543210ull + (uint64_t)i;
	switch (i) {
	case 0: e->body_case = KVQ__ENVELOPE__BODY_HELLO; e->hello = &hello; break;
	case 1: e->body_case = KVQ__ENVELOPE__BODY_HELLO_REPLY; e->hello_reply = &hello_reply; break;
	case 2: e->body_case = KVQ__ENVELOPE__BODY_ATTACH; e->attach = &attach; break;
	case 3: e->body_case = KVQ__ENVELOPE__BODY_ATTACH_REPLY; e->attach_reply = &attach_reply; break;
	case 4: e->body_case = KVQ__ENVELOPE__BODY_ALLOC; e->alloc = &alloc_req; break;
	case 5: e->body_case = KVQ__ENVELOPE__BODY_ALLOC_REPLY; e->alloc_reply = &alloc_reply; break;
	case 6: e->body_case = KVQ__ENVELOPE__BODY_SEAL; e->seal = &seal; break;
	case 7: e->body_case = KVQ__ENVELOPE__BODY_SEAL_REPLY; e->seal_reply = &seal_reply; break;
	case 8: e->body_case = KVQ__ENVELOPE__BODY_PUBLISH; e->publish = &publish; break;
	case 9: e->body_case = KVQ__ENVELOPE__BODY_PUBLISH_REPLY; e->publish_reply = &publish_reply; break;
	case 10: e->body_case = KVQ__ENVELOPE__BODY_LOOKUP; e->lookup = &lookup; break;
	case 11: e->body_case = KVQ__ENVELOPE__BODY_LOOKUP_REPLY; e->lookup_reply = &lookup_reply; break;
	case 12: e->body_case = KVQ__ENVELOPE__BODY_RELEASE; e->release = &release; break;
	case 13:
		/* an error reply that still carries its (empty) body */
		e->status = KVQ_ELAYOUT;
		e->message = "pool \"main\" has block_tokens 32, not 16";
		e->body_case = KVQ__ENVELOPE__BODY_RELEASE_REPLY;
		e->release_reply = &release_reply;
		break;
	case 14: e->body_case = KVQ__ENVELOPE__BODY_FORK; e->fork = &fork_req; break;
	case 15:
		e->status = -ENOSPC;
		e->message = "";
		e->body_case = KVQ__ENVELOPE__BODY_FORK_REPLY;
		e->fork_reply = &fork_reply;
		break;
	case 16: e->body_case = KVQ__ENVELOPE__BODY_STATS; e->stats = &stats; break;
	case 17: e->body_case = KVQ__ENVELOPE__BODY_STATS_REPLY; e->stats_reply = &stats_reply; break;
	}
}

static int is_request(int i)
{
	return i % 2 == 0;
}

/* ---------------------------------------------------------------- comparison */

static int str_eq(const char *a, const char *b)
{
	return !strcmp(a ? a : "", b ? b : "");
}

static int u32s_eq(size_t na, const uint32_t *a, size_t nb, const uint32_t *b)
{
	return na == nb && (na == 0 || !memcmp(a, b, na * sizeof(*a)));
}

static int bin_eq(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
	return a.len == b.len && (a.len == 0 || !memcmp(a.data, b.data, a.len));
}

static int pool_stats_eq(const Kvq__PoolStats *a, const Kvq__PoolStats *b)
{
	return str_eq(a->name, b->name) && str_eq(a->model_id, b->model_id) && str_eq(a->policy, b->policy) &&
	       str_eq(a->backend, b->backend) && a->device == b->device && a->layers == b->layers &&
	       a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->block_tokens == b->block_tokens &&
	       a->window == b->window && a->total_bytes == b->total_bytes && a->n_sealed == b->n_sealed &&
	       a->n_open == b->n_open && a->sealed_free == b->sealed_free &&
	       a->sealed_reserved == b->sealed_reserved && a->sealed_held == b->sealed_held &&
	       a->cached == b->cached && a->referenced == b->referenced && a->open_used == b->open_used &&
	       a->lookup_tokens == b->lookup_tokens && a->hit_tokens == b->hit_tokens &&
	       a->evictions == b->evictions && a->alloc_failures == b->alloc_failures && a->clients == b->clients &&
	       bin_eq(a->codebooks_sha256, b->codebooks_sha256);
}

static int publish_block_eq(const Kvq__PublishBlock *a, const Kvq__PublishBlock *b)
{
	if (a->block_case != b->block_case || a->parent_case != b->parent_case)
		return 0;
	if (a->block_case == KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID ? a->sealed_id != b->sealed_id
								 : a->sink_id != b->sink_id)
		return 0;
	if (a->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID && a->parent_id != b->parent_id)
		return 0;
	if (a->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_SINK_ID && a->parent_sink_id != b->parent_sink_id)
		return 0;
	return u32s_eq(a->n_tokens, a->tokens, b->n_tokens, b->tokens) && bin_eq(a->salt, b->salt);
}

/* Field by field, every field of every message type. */
static int envelope_eq(const Kvq__Envelope *a, const Kvq__Envelope *b)
{
	if (a->id != b->id || a->status != b->status || !str_eq(a->message, b->message) ||
	    a->body_case != b->body_case)
		return 0;
	switch (a->body_case) {
	case KVQ__ENVELOPE__BODY_HELLO:
		return a->hello->protocol_version == b->hello->protocol_version &&
		       str_eq(a->hello->client_name, b->hello->client_name);
	case KVQ__ENVELOPE__BODY_HELLO_REPLY:
		return str_eq(a->hello_reply->daemon_version, b->hello_reply->daemon_version) &&
		       a->hello_reply->protocol_version == b->hello_reply->protocol_version &&
		       a->hello_reply->client_id == b->hello_reply->client_id;
	case KVQ__ENVELOPE__BODY_ATTACH: {
		const Kvq__Attach *x = a->attach, *y = b->attach;

		if (!!x->create != !!y->create)
			return 0;
		if (x->create && (x->create->n_sealed != y->create->n_sealed || x->create->n_open != y->create->n_open ||
				  !str_eq(x->create->backend, y->create->backend) ||
				  x->create->device != y->create->device))
			return 0;
		return str_eq(x->pool, y->pool) && str_eq(x->model_id, y->model_id) && x->layers == y->layers &&
		       x->kv_heads == y->kv_heads && x->head_dim == y->head_dim &&
		       x->block_tokens == y->block_tokens && str_eq(x->policy, y->policy) &&
		       x->window == y->window && x->act == y->act && x->layout_version == y->layout_version &&
		       x->codebooks == y->codebooks && x->sink_blocks == y->sink_blocks;
	}
	case KVQ__ENVELOPE__BODY_ATTACH_REPLY: {
		const Kvq__AttachReply *x = a->attach_reply, *y = b->attach_reply;

		return x->layout_version == y->layout_version && x->layers == y->layers &&
		       x->kv_heads == y->kv_heads && x->head_dim == y->head_dim &&
		       x->block_tokens == y->block_tokens && x->window == y->window && x->act == y->act &&
		       x->n_sealed == y->n_sealed && x->n_open == y->n_open && str_eq(x->policy, y->policy) &&
		       x->total_bytes == y->total_bytes && x->map_bytes == y->map_bytes &&
		       str_eq(x->backend, y->backend) && x->device == y->device &&
		       bin_eq(x->device_uuid, y->device_uuid) && str_eq(x->model_id, y->model_id) &&
		       bin_eq(x->codebooks_sha256, y->codebooks_sha256) && x->sink_blocks == y->sink_blocks &&
		       x->n_sink == y->n_sink;
	}
	case KVQ__ENVELOPE__BODY_ALLOC:
		return a->alloc->n_open == b->alloc->n_open && a->alloc->n_sealed == b->alloc->n_sealed &&
		       a->alloc->n_sink == b->alloc->n_sink;
	case KVQ__ENVELOPE__BODY_ALLOC_REPLY: {
		const Kvq__AllocReply *x = a->alloc_reply, *y = b->alloc_reply;

		return u32s_eq(x->n_open_ids, x->open_ids, y->n_open_ids, y->open_ids) &&
		       u32s_eq(x->n_reserved_ids, x->reserved_ids, y->n_reserved_ids, y->reserved_ids) &&
		       u32s_eq(x->n_sealed_ids, x->sealed_ids, y->n_sealed_ids, y->sealed_ids) &&
		       u32s_eq(x->n_sink_ids, x->sink_ids, y->n_sink_ids, y->sink_ids);
	}
	case KVQ__ENVELOPE__BODY_SEAL:
		return u32s_eq(a->seal->n_open_ids, a->seal->open_ids, b->seal->n_open_ids, b->seal->open_ids) &&
		       u32s_eq(a->seal->n_sealed_ids, a->seal->sealed_ids, b->seal->n_sealed_ids, b->seal->sealed_ids);
	case KVQ__ENVELOPE__BODY_PUBLISH:
		if (a->publish->n_blocks != b->publish->n_blocks)
			return 0;
		for (size_t i = 0; i < a->publish->n_blocks; i++)
			if (!publish_block_eq(a->publish->blocks[i], b->publish->blocks[i]))
				return 0;
		return 1;
	case KVQ__ENVELOPE__BODY_PUBLISH_REPLY:
		return u32s_eq(a->publish_reply->n_ids, a->publish_reply->ids, b->publish_reply->n_ids,
			       b->publish_reply->ids);
	case KVQ__ENVELOPE__BODY_LOOKUP:
		return u32s_eq(a->lookup->n_tokens, a->lookup->tokens, b->lookup->n_tokens, b->lookup->tokens) &&
		       a->lookup->max_tokens == b->lookup->max_tokens && bin_eq(a->lookup->salt, b->lookup->salt);
	case KVQ__ENVELOPE__BODY_LOOKUP_REPLY:
		return u32s_eq(a->lookup_reply->n_sealed_ids, a->lookup_reply->sealed_ids,
			       b->lookup_reply->n_sealed_ids, b->lookup_reply->sealed_ids) &&
		       u32s_eq(a->lookup_reply->n_sink_ids, a->lookup_reply->sink_ids, b->lookup_reply->n_sink_ids,
			       b->lookup_reply->sink_ids);
	case KVQ__ENVELOPE__BODY_RELEASE:
		return u32s_eq(a->release->n_sealed_ids, a->release->sealed_ids, b->release->n_sealed_ids,
			       b->release->sealed_ids) &&
		       u32s_eq(a->release->n_open_ids, a->release->open_ids, b->release->n_open_ids,
			       b->release->open_ids) &&
		       u32s_eq(a->release->n_sink_ids, a->release->sink_ids, b->release->n_sink_ids,
			       b->release->sink_ids);
	case KVQ__ENVELOPE__BODY_FORK:
		return u32s_eq(a->fork->n_sealed_ids, a->fork->sealed_ids, b->fork->n_sealed_ids, b->fork->sealed_ids) &&
		       u32s_eq(a->fork->n_sink_ids, a->fork->sink_ids, b->fork->n_sink_ids, b->fork->sink_ids);
	case KVQ__ENVELOPE__BODY_STATS:
		return str_eq(a->stats->pool, b->stats->pool);
	case KVQ__ENVELOPE__BODY_STATS_REPLY: {
		const Kvq__StatsReply *x = a->stats_reply, *y = b->stats_reply;

		if (!str_eq(x->daemon_version, y->daemon_version) || x->uptime_ms != y->uptime_ms ||
		    !str_eq(x->backend, y->backend) || x->n_pools != y->n_pools)
			return 0;
		for (size_t i = 0; i < x->n_pools; i++)
			if (!pool_stats_eq(x->pools[i], y->pools[i]))
				return 0;
		return 1;
	}
	case KVQ__ENVELOPE__BODY_SEAL_REPLY:
	case KVQ__ENVELOPE__BODY_RELEASE_REPLY:
	case KVQ__ENVELOPE__BODY_FORK_REPLY:
		return 1;
	default:
		return 0;
	}
}

/* ---------------------------------------------------------------- helpers */

/* All sample envelopes as one stream; frame i ends at ends[i]. */
static uint8_t *stream_make(size_t *ret_len, size_t ends[N_BODIES])
{
	uint8_t *s = NULL;
	size_t len = 0;

	for (int i = 0; i < N_BODIES; i++) {
		Kvq__Envelope e;
		uint8_t *f;
		size_t n;

		envelope_make(&e, i);
		if (kvq_frame_encode_alloc(&e, &f, &n) < 0)
			abort();
		s = realloc(s, len + n);
		if (!s)
			abort();
		memcpy(s + len, f, n);
		len += n;
		ends[i] = len;
		free(f);
	}
	*ret_len = len;
	return s;
}

/* Pulls every complete frame out of d; checks each against the sample it
 * should be.  Returns the frames taken, or -1 on a mismatch or error. */
static int drain(struct kvq_frame_decoder *d, int *next_index)
{
	const uint8_t *p;
	size_t n;
	int r, got = 0;

	while ((r = kvq_frame_decoder_next(d, &p, &n)) == 1) {
		Kvq__Envelope want, *e;

		if (*next_index >= N_BODIES || kvq_frame_unpack(p, n, &e) < 0)
			return -1;
		envelope_make(&want, *next_index);
		r = envelope_eq(e, &want);
		kvq_frame_envelope_free(e);
		if (!r)
			return -1;
		++*next_index;
		got++;
	}
	return r < 0 ? -1 : got;
}

/* Which descriptors 0 .. FD_SCAN-1 are open, by fcntl(F_GETFD). */
#define FD_SCAN 1024
static void fd_census(uint8_t open_fds[FD_SCAN])
{
	for (int fd = 0; fd < FD_SCAN; fd++)
		open_fds[fd] = fcntl(fd, F_GETFD) >= 0;
}

/* Descriptors open now that were not in before; the first such in *ret_fd. */
static int fds_new(const uint8_t before[FD_SCAN], int *ret_fd)
{
	int n = 0;

	*ret_fd = -1;
	for (int fd = 0; fd < FD_SCAN; fd++)
		if (fcntl(fd, F_GETFD) >= 0 && !before[fd]) {
			if (*ret_fd < 0)
				*ret_fd = fd;
			n++;
		}
	return n;
}

/* Sends buf with nfds descriptors (dups of fd) in one SCM_RIGHTS message. */
static int send_with_fds(int sock, const void *buf, size_t len, int fd, int nfds)
{
	union {
		char buf[CMSG_SPACE(32 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { (void *)buf, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	int fds[32], r;

	if (nfds > 32)
		return -1;
	for (int i = 0; i < nfds; i++)
		fds[i] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	memset(&u, 0, sizeof(u));
	msg.msg_control = u.buf;
	msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
	memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	r = (int)sendmsg(sock, &msg, MSG_NOSIGNAL);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	return r;
}

static int make_memfd(void)
{
	int fd = memfd_create("kvq-test", MFD_CLOEXEC);

	if (fd < 0 || ftruncate(fd, 4096) < 0)
		abort();
	return fd;
}

/* ---------------------------------------------------------------- tests */

static void test_roundtrip(void)
{
	for (int i = 0; i < N_BODIES; i++) {
		Kvq__Envelope e, *got = NULL;
		struct kvq_frame_decoder d;
		const uint8_t *p = NULL;
		size_t n = 0, flen = 0;
		uint8_t *f = NULL;
		char err[256] = "";
		int r1, r2, r3 = -1, rc;

		envelope_make(&e, i);
		r1 = kvq_frame_encode_alloc(&e, &f, &flen);
		kvq_frame_decoder_init(&d);
		r2 = r1 == 0 ? kvq_frame_decoder_feed(&d, f, flen) : -1;
		if (r2 == 0)
			r2 = kvq_frame_decoder_next(&d, &p, &n);
		if (r2 == 1)
			r3 = kvq_frame_unpack(p, n, &got);
		ok(r1 == 0 && r2 == 1 && n + KVQ_FRAME_HDR == flen && (int)flen == kvq_frame_size(&e) &&
		   f[0] == (uint8_t)n && f[1] == (uint8_t)(n >> 8) && f[2] == (uint8_t)(n >> 16) && f[3] == 0 &&
		   r3 == 0 && envelope_eq(got, &e) && kvq_frame_decoder_pending(&d) == 0,
		   "round trip of %s (%zu bytes): every field equal",
		   kvq__envelope__descriptor.fields[kvq__envelope__descriptor.n_fields - N_BODIES + i].name, flen);
		rc = got ? kvq_frame_check(got, is_request(i), err, sizeof(err)) : -1;
		ok(rc == 0, "check accepts sample %d as a %s (%s)", i, is_request(i) ? "request" : "reply", err);
		kvq_frame_envelope_free(got);
		kvq_frame_decoder_fini(&d);
		free(f);
	}

	/* The fixed-buffer encoder writes the same bytes. */
	{
		Kvq__Envelope e;
		uint8_t buf[4096], *f;
		size_t n;
		int r;

		envelope_make(&e, 8);
		r = kvq_frame_encode(&e, buf, sizeof(buf));
		ok(r > 0 && kvq_frame_encode_alloc(&e, &f, &n) == 0 && (size_t)r == n && !memcmp(buf, f, n),
		   "encode into a caller buffer = encode_alloc");
		if (r > 0)
			free(f);
		ok(kvq_frame_encode(&e, buf, (size_t)r - 1) == -ENOBUFS, "encode into a buffer one byte short: -ENOBUFS");
	}
}

static void test_split_coalesced(void)
{
	size_t len, ends[N_BODIES];
	uint8_t *s = stream_make(&len, ends);
	struct kvq_frame_decoder d;
	int idx = 0, bad = 0, early = 0;

	/* Byte by byte: a frame comes out exactly when its last byte is in. */
	kvq_frame_decoder_init(&d);
	for (size_t i = 0; i < len; i++) {
		int before = idx, got;

		if (kvq_frame_decoder_feed(&d, s + i, 1) < 0) {
			bad++;
			break;
		}
		got = drain(&d, &idx);
		if (got < 0)
			bad++;
		else if (got && ends[before] != i + 1)
			early++;
		else if (!got && idx < N_BODIES && ends[idx] == i + 1)
			early++;
	}
	ok(!bad && !early && idx == N_BODIES && kvq_frame_decoder_pending(&d) == 0,
	   "byte by byte: %d frames, each exactly at its last byte (%zu bytes)", idx, len);
	kvq_frame_decoder_fini(&d);

	/* All frames in one feed. */
	kvq_frame_decoder_init(&d);
	idx = 0;
	ok(kvq_frame_decoder_feed(&d, s, len) == 0 && drain(&d, &idx) == N_BODIES && idx == N_BODIES &&
	   kvq_frame_decoder_pending(&d) == 0,
	   "coalesced: %d frames from one buffer", N_BODIES);
	kvq_frame_decoder_fini(&d);

	/* Random chunks, 200 times. */
	bad = 0;
	for (int round = 0; round < 200; round++) {
		size_t off = 0;

		kvq_frame_decoder_init(&d);
		idx = 0;
		while (off < len && !bad) {
			size_t n = 1 + tap_rand() % (round % 3 == 0 ? 8 : 300);

			if (n > len - off)
				n = len - off;
			if (kvq_frame_decoder_feed(&d, s + off, n) < 0 || drain(&d, &idx) < 0)
				bad++;
			off += n;
		}
		if (idx != N_BODIES || kvq_frame_decoder_pending(&d) != 0)
			bad++;
		kvq_frame_decoder_fini(&d);
	}
	ok(!bad, "random chunk sizes, 200 rounds: every frame intact and in order");

	/* Over a socket: a stream written in odd pieces comes out whole. */
	{
		int sv[2], fd = -1, r = 0;
		size_t off = 0;

		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			abort();
		kvq_frame_decoder_init(&d);
		idx = 0;
		bad = 0;
		while (off < len) {
			size_t n = 1 + tap_rand() % 97;

			if (n > len - off)
				n = len - off;
			if (kvq_frame_send(sv[0], s + off, n, -1) != (int)n)
				bad++;
			off += n;
			r = kvq_frame_recv(sv[1], &d, &fd);
			if (r <= 0 || drain(&d, &idx) < 0)
				bad++;
		}
		ok(!bad && idx == N_BODIES && fd == -1 && d.fds_dropped == 0,
		   "through a socketpair in pieces: %d frames, no descriptor", idx);
		kvq_frame_decoder_fini(&d);
		close(sv[0]);
		close(sv[1]);
	}
	free(s);
}

static void test_faults(void)
{
	struct kvq_frame_decoder d;
	const uint8_t *p;
	size_t n;
	static const uint8_t zero[4] = { 0, 0, 0, 0 }, ones[4] = { 0xff, 0xff, 0xff, 0xff };
	uint8_t over[4], exact[4];
	int r1, r2, r3;

	kvq_frame_decoder_init(&d);
	r1 = kvq_frame_decoder_feed(&d, zero, 3);
	r2 = kvq_frame_decoder_next(&d, &p, &n);
	kvq_frame_decoder_feed(&d, zero + 3, 1);
	r3 = kvq_frame_decoder_next(&d, &p, &n);
	ok(r1 == 0 && r2 == 0 && r3 == -EPROTO, "length 0: -EPROTO once the prefix is complete (%d)", r3);
	kvq_frame_decoder_feed(&d, "\x05\0\0\0hello", 9);
	ok(kvq_frame_decoder_next(&d, &p, &n) == -EPROTO, "the fault sticks: later bytes are not parsed");
	kvq_frame_decoder_fini(&d);

	kvq_frame_decoder_init(&d);
	kvq_frame_decoder_feed(&d, ones, 4);
	r1 = kvq_frame_decoder_next(&d, &p, &n);
	ok(r1 == -EMSGSIZE && d.cap <= 65536, "length 0xffffffff: -EMSGSIZE, nothing allocated for it (cap %zu)",
	   d.cap);
	kvq_frame_decoder_fini(&d);

	over[0] = 1; over[1] = 0; over[2] = 0x40; over[3] = 0;  /* 4 MiB + 1 */
	kvq_frame_decoder_init(&d);
	kvq_frame_decoder_feed(&d, over, 4);
	r1 = kvq_frame_decoder_next(&d, &p, &n);
	ok(r1 == -EMSGSIZE && d.cap <= 65536, "length 4 MiB + 1: -EMSGSIZE (cap %zu)", d.cap);
	kvq_frame_decoder_fini(&d);

	exact[0] = 0; exact[1] = 0; exact[2] = 0x40; exact[3] = 0;  /* 4 MiB exactly: wait for it */
	kvq_frame_decoder_init(&d);
	kvq_frame_decoder_feed(&d, exact, 4);
	kvq_frame_decoder_feed(&d, "abc", 3);
	r1 = kvq_frame_decoder_next(&d, &p, &n);
	ok(r1 == 0 && kvq_frame_decoder_pending(&d) == 7, "length 4 MiB: accepted, waiting for the payload");
	kvq_frame_decoder_fini(&d);

	/* Truncated frames: the decoder waits, at every cut. */
	{
		Kvq__Envelope e;
		uint8_t *f;
		size_t flen;
		int bad = 0;

		envelope_make(&e, 17);
		if (kvq_frame_encode_alloc(&e, &f, &flen) < 0)
			abort();
		for (size_t cut = 0; cut < flen; cut++) {
			kvq_frame_decoder_init(&d);
			kvq_frame_decoder_feed(&d, f, cut);
			if (kvq_frame_decoder_next(&d, &p, &n) != 0 || kvq_frame_decoder_pending(&d) != cut)
				bad++;
			kvq_frame_decoder_feed(&d, f + cut, flen - cut);
			if (kvq_frame_decoder_next(&d, &p, &n) != 1 || n != flen - 4)
				bad++;
			kvq_frame_decoder_fini(&d);
		}
		ok(!bad, "truncated at each of %zu cuts: need more, then the frame once completed", flen);
		free(f);
	}

	/* A hostile amount of input is refused before it is copied. */
	{
		size_t big = KVQ_FRAME_DECODER_MAX + 1;
		uint8_t *b = calloc(1, big);

		kvq_frame_decoder_init(&d);
		ok(b && kvq_frame_decoder_feed(&d, b, big) == -ENOBUFS && d.cap == 0,
		   "feeding over KVQ_FRAME_DECODER_MAX: -ENOBUFS, nothing allocated");
		kvq_frame_decoder_fini(&d);
		free(b);
	}
}

static void test_max_size(void)
{
	/* message field: tag (1) + length varint (4) + bytes = exactly KVQ_FRAME_MAX */
	size_t slen = KVQ_FRAME_MAX - 5;
	char *msg = malloc(slen + 2);
	Kvq__Envelope e, *got = NULL;
	struct kvq_frame_decoder d;
	const uint8_t *p = NULL;
	uint8_t *f = NULL;
	size_t flen = 0, n = 0;
	int r, sz;

	if (!msg)
		abort();
	memset(msg, 'm', slen + 1);
	msg[slen] = 0;
	kvq__envelope__init(&e);
	e.message = msg;
	sz = kvq_frame_size(&e);
	r = kvq_frame_encode_alloc(&e, &f, &flen);
	ok(sz == (int)(KVQ_FRAME_MAX + KVQ_FRAME_HDR) && r == 0, "an envelope of exactly 4 MiB encodes (%d)", sz);
	kvq_frame_decoder_init(&d);
	r = r == 0 ? kvq_frame_decoder_feed(&d, f, flen) : -1;
	r = r == 0 ? kvq_frame_decoder_next(&d, &p, &n) : -1;
	r = r == 1 ? kvq_frame_unpack(p, n, &got) : -1;
	ok(r == 0 && n == KVQ_FRAME_MAX && got && strlen(got->message) == slen,
	   "and decodes through the decoder and unpack");
	kvq_frame_envelope_free(got);
	/* Once empty, a big buffer is given back on the next small input. */
	kvq_frame_decoder_feed(&d, "\x01", 1);
	ok(d.cap <= 65536, "decoder gives back its 4 MiB buffer once drained (cap %zu)", d.cap);
	kvq_frame_decoder_fini(&d);
	free(f);

	msg[slen] = 'm';
	msg[slen + 1] = 0;
	f = NULL;
	ok(kvq_frame_size(&e) == -EMSGSIZE && kvq_frame_encode_alloc(&e, &f, &flen) == -EMSGSIZE && !f &&
	   kvq_frame_encode(&e, NULL, 0) == -EMSGSIZE,
	   "an envelope of 4 MiB + 1: -EMSGSIZE from size, encode, encode_alloc");
	free(msg);

	{
		size_t nt = 1100000;   /* 5-byte varints: 5.5 MB */
		uint32_t *t = malloc(nt * sizeof(*t));
		Kvq__Lookup l;
		int sv[2];

		if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			abort();
		for (size_t i = 0; i < nt; i++)
			t[i] = 0xf0000000u + (uint32_t)i;
		kvq__lookup__init(&l);
		l.tokens = t;
		l.n_tokens = nt;
		kvq__envelope__init(&e);
		e.id = 1;
		e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
		e.lookup = &l;
		ok(kvq_frame_size(&e) == -EMSGSIZE && kvq_frame_send_envelope(sv[0], &e, -1, 1000) == -EMSGSIZE,
		   "a 5.5 MB lookup: -EMSGSIZE, nothing sent");
		close(sv[0]);
		close(sv[1]);
		free(t);
	}

	kvq__envelope__init(&e);
	ok(kvq_frame_size(&e) == -EINVAL, "an all-default envelope (packs to 0 bytes) is refused: -EINVAL");
}

static void test_garbage(void)
{
	uint8_t buf[512];
	int fails = 0, oks = 0, inconsistent = 0, wiretype = 0;

	for (int i = 0; i < 5000; i++) {
		size_t n = tap_rand() % sizeof(buf);
		Kvq__Envelope *e = (Kvq__Envelope *)&buf;  /* must stay untouched on failure */
		Kvq__Envelope *orig = e;
		int r;

		for (size_t j = 0; j < n; j++)
			buf[j] = (uint8_t)tap_rand();
		if (i % 2 && n > 0)
			buf[0] = (uint8_t)((tap_rand() % 15 + 1) << 3 | 7);  /* wire type 7 does not exist */
		r = kvq_frame_unpack(buf, n, &e);
		if (r == 0) {
			char err[128];

			oks++;
			kvq_frame_check(e, i % 4 < 2, err, sizeof(err));
			kvq_frame_envelope_free(e);
			if (i % 2 && n > 0)
				wiretype++;
		} else if (r == -EBADMSG && e == orig) {
			fails++;
		} else {
			inconsistent++;
		}
	}
	ok(!inconsistent && !wiretype && fails > 2500,
	   "5000 random payloads: %d refused with -EBADMSG, %d parsed (checked, freed); bad wire types all refused",
	   fails, oks);

	/* Valid frames with random damage: parse or refuse, never crash. */
	{
		size_t len, ends[N_BODIES];
		uint8_t *s = stream_make(&len, ends);
		int parsed = 0, refused = 0, other = 0;

		for (int i = 0; i < 3000; i++) {
			int k = (int)(tap_rand() % N_BODIES);
			size_t start = (k ? ends[k - 1] : 0) + 4, n = ends[k] - start;
			uint8_t *m = malloc(n ? n : 1);
			Kvq__Envelope *e;
			int r;

			memcpy(m, s + start, n);
			for (int flips = 1 + (int)(tap_rand() % 4); flips > 0; flips--)
				m[tap_rand() % n] ^= (uint8_t)(1u << (tap_rand() % 8));
			if (i % 3 == 0)
				n = tap_rand() % n;   /* and cut */
			r = kvq_frame_unpack(m, n, &e);
			if (r == 0) {
				char err[128];

				parsed++;
				kvq_frame_check(e, k % 2 == 0, err, sizeof(err));
				kvq_frame_check(e, k % 2 != 0, err, sizeof(err));
				kvq_frame_envelope_free(e);
			} else if (r == -EBADMSG) {
				refused++;
			} else {
				other++;
			}
			free(m);
		}
		ok(!other && refused > 0, "3000 damaged frames: %d refused, %d parsed, no other outcome", refused, parsed);
		free(s);
	}
}

/* Publish { blocks: nblocks empty PublishBlock }, raw: 2 bytes on the wire
 * each, ~100 in memory. */
static uint8_t *empty_blocks_payload(size_t nblocks, size_t *ret_len)
{
	size_t inner = 2 * nblocks, len = 1 + 5 + inner, off = 0;
	uint8_t *p = malloc(len);
	size_t v = inner;

	if (!p)
		abort();
	p[off++] = 12 << 3 | 2;   /* Envelope.publish, length-delimited */
	do {
		p[off++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	for (size_t i = 0; i < nblocks; i++) {
		p[off++] = 1 << 3 | 2;   /* Publish.blocks */
		p[off++] = 0;
	}
	*ret_len = off;
	return p;
}

static void test_budget(void)
{
	Kvq__Envelope *e = NULL;
	uint8_t *p;
	size_t len;
	int r;

	p = empty_blocks_payload((KVQ_FRAME_MAX - 8) / 2, &len);
	r = kvq_frame_unpack(p, len, &e);
	ok(r == -EBADMSG && len <= KVQ_FRAME_MAX,
	   "4 MiB of empty submessages (~200 MiB unpacked): refused by the unpack budget (%d)", r);
	free(p);

	p = empty_blocks_payload(KVQ_PROTO_MAX_IDS, &len);
	e = NULL;
	r = kvq_frame_unpack(p, len, &e);
	ok(r == 0 && e && e->body_case == KVQ__ENVELOPE__BODY_PUBLISH && e->publish->n_blocks == KVQ_PROTO_MAX_IDS,
	   "KVQ_PROTO_MAX_IDS empty submessages: within the budget");
	kvq_frame_envelope_free(e);
	free(p);

	/* Unknown fields (a newer peer): kept by protobuf-c, so budgeted too. */
	{
		size_t n = (KVQ_FRAME_MAX - 16) / 3, off = 0;

		p = malloc(n * 3 + 16);
		if (!p)
			abort();
		p[off++] = 1 << 3;   /* id = 5 */
		p[off++] = 5;
		for (size_t i = 0; i < n; i++) {
			p[off++] = 0xa0;   /* field 100, varint */
			p[off++] = 0x06;
			p[off++] = 0x00;
		}
		r = kvq_frame_unpack(p, off, &e);
		ok(r == -EBADMSG, "4 MiB of unknown fields: refused by the budget (%d)", r);
		e = NULL;
		r = kvq_frame_unpack(p, 2 + 3 * 100, &e);
		ok(r == 0 && e && e->id == 5 && e->body_case == KVQ__ENVELOPE__BODY__NOT_SET,
		   "a few unknown fields parse: body unset");
		if (r == 0) {
			char err[128] = "";

			ok(kvq_frame_check(e, 1, err, sizeof(err)) == -EOPNOTSUPP,
			   "an unknown message body is -EOPNOTSUPP (%s)", err);
		} else {
			ok(0, "an unknown message body is -EOPNOTSUPP");
		}
		kvq_frame_envelope_free(e);
		free(p);
	}
}

static void test_check(void)
{
	Kvq__Envelope e;
	char err[256];
	char longname[KVQ_PROTO_MAX_NAME + 2];
	static uint32_t many[KVQ_PROTO_MAX_IDS + 1];
	Kvq__Alloc a;
	Kvq__Seal s;
	Kvq__Lookup l;
	Kvq__Release rel;
	Kvq__Attach at;
	Kvq__Publish pub;
	Kvq__PublishBlock blk, *blkp = &blk;
	int r;

	envelope_make(&e, 1);
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EOPNOTSUPP, "a reply sent as a request: -EOPNOTSUPP (%s)", err);
	envelope_make(&e, 0);
	r = kvq_frame_check(&e, 0, err, sizeof(err));
	ok(r == -EOPNOTSUPP, "a request sent as a reply: -EOPNOTSUPP (%s)", err);
	e.id = 0;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EBADMSG, "request id 0: -EBADMSG (%s)", err);
	envelope_make(&e, 0);
	e.status = -1;
	ok(kvq_frame_check(&e, 1, NULL, 0) == -EBADMSG, "a request with a status: -EBADMSG (err NULL is fine)");

	envelope_make(&e, 0);
	hello.client_name = "two words";
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "client name with a blank: -EINVAL (%s)", err);
	hello.client_name = "bell\a";
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "client name with a control character: -EINVAL (%s)", err);
	memset(longname, 'n', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	hello.client_name = longname;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -E2BIG, "client name of %zu bytes: -E2BIG (%s)", strlen(longname), err);
	longname[KVQ_PROTO_MAX_NAME] = 0;
	ok(kvq_frame_check(&e, 1, err, sizeof(err)) == 0, "client name of exactly KVQ_PROTO_MAX_NAME bytes: fine");
	hello.client_name = "worker-7";

	at = attach;
	at.pool = "";
	kvq__envelope__init(&e);
	e.id = 9;
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &at;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "attach without a pool name: -EINVAL (%s)", err);
	at = attach;
	at.act = 7;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "attach with an unknown dtype: -EINVAL (%s)", err);

	kvq__alloc__init(&a);
	a.n_open = KVQ_PROTO_MAX_IDS;
	a.n_sealed = 1;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -E2BIG, "alloc of KVQ_PROTO_MAX_IDS + 1 slots: -E2BIG (%s)", err);
	a.n_open = 0xffffffffu;
	a.n_sealed = 0xffffffffu;
	ok(kvq_frame_check(&e, 1, NULL, 0) == -E2BIG, "alloc counts that overflow 32 bits: -E2BIG");

	kvq__seal__init(&s);
	s.n_open_ids = 2;
	s.open_ids = many;
	s.n_sealed_ids = 1;
	s.sealed_ids = many;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &s;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "seal with unequal pairs: -EINVAL (%s)", err);

	kvq__lookup__init(&l);
	l.n_tokens = 10;
	l.tokens = many;
	l.max_tokens = 11;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL, "lookup max_tokens over the tokens sent: -EINVAL (%s)", err);
	l.max_tokens = 10;
	l.salt.len = KVQ_PROTO_MAX_SALT + 1;
	l.salt.data = (uint8_t *)many;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -E2BIG, "lookup salt over KVQ_PROTO_MAX_SALT: -E2BIG (%s)", err);

	kvq__publish_block__init(&blk);
	blk.block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
	blk.n_tokens = KVQ_PROTO_MAX_TOKENS / 2 + 1;
	blk.tokens = many;   /* only counted, never read */
	kvq__publish__init(&pub);
	pub.n_blocks = 1;
	pub.blocks = &blkp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &pub;
	ok(kvq_frame_check(&e, 1, NULL, 0) == 0, "publish of KVQ_PROTO_MAX_TOKENS / 2 + 1 tokens: fine");
	blk.block_case = KVQ__PUBLISH_BLOCK__BLOCK__NOT_SET;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -EINVAL && strstr(err, "no sealed_id or sink_id"), "publish of a block naming no block: -EINVAL (%s)",
	   err);
	blk.block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
	{
		Kvq__PublishBlock *two[2] = { &blk, &blk };

		pub.n_blocks = 2;
		pub.blocks = two;
		r = kvq_frame_check(&e, 1, err, sizeof(err));
		ok(r == -E2BIG, "publish over KVQ_PROTO_MAX_TOKENS in all: -E2BIG (%s)", err);
	}

	kvq__release__init(&rel);
	rel.n_sealed_ids = KVQ_PROTO_MAX_IDS;
	rel.sealed_ids = many;
	rel.n_open_ids = 1;
	rel.open_ids = many;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &rel;
	r = kvq_frame_check(&e, 1, err, sizeof(err));
	ok(r == -E2BIG, "release of KVQ_PROTO_MAX_IDS + 1 ids: -E2BIG (%s)", err);

	/* codebooks_sha256 (version 4): empty or a SHA-256 */
	envelope_make(&e, 3);
	ok(kvq_frame_check(&e, 0, NULL, 0) == 0, "attach reply with a 32-byte codebooks_sha256: fine");
	attach_reply.codebooks_sha256.len = 31;
	r = kvq_frame_check(&e, 0, err, sizeof(err));
	ok(r == -EINVAL && strstr(err, "codebooks_sha256"), "attach reply with a 31-byte codebooks_sha256: -EINVAL (%s)",
	   err);
	attach_reply.codebooks_sha256.len = 0;
	ok(kvq_frame_check(&e, 0, NULL, 0) == 0, "attach reply without codebooks_sha256: fine");
	attach_reply.codebooks_sha256.len = sizeof(sha);
	envelope_make(&e, 17);
	pool_stats[1].codebooks_sha256.data = sha;
	pool_stats[1].codebooks_sha256.len = 16;
	r = kvq_frame_check(&e, 0, err, sizeof(err));
	ok(r == -EINVAL && strstr(err, "pools[].codebooks_sha256"), "stats with a 16-byte codebooks_sha256: -EINVAL (%s)",
	   err);
	pool_stats[1].codebooks_sha256.len = 0;

	kvq__envelope__init(&e);
	e.id = 3;
	e.status = -EPROTO;
	e.message = "hello first";
	ok(kvq_frame_check(&e, 0, NULL, 0) == 0, "an error reply without a body is a valid reply");
	e.status = 5;
	ok(kvq_frame_check(&e, 0, NULL, 0) == -EBADMSG, "a reply with a positive status: -EBADMSG");
	e.status = 0;
	ok(kvq_frame_check(&e, 0, NULL, 0) == -EOPNOTSUPP, "a success reply without a body: -EOPNOTSUPP");
}

static void test_fd_passing(void)
{
	int sv[2], mfd = make_memfd(), got = -1, r, nnew, newfd;
	struct kvq_frame_decoder d;
	Kvq__Envelope e, *rep = NULL;
	uint8_t before[FD_SCAN];
	char out[8] = "";
	struct stat st1, st2;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	kvq_frame_decoder_init(&d);

	/* The attach reply with the pool's fd. */
	envelope_make(&e, 3);
	r = kvq_frame_send_envelope(sv[0], &e, mfd, 1000);
	r = r == 0 ? kvq_frame_recv_envelope(sv[1], &d, &got, 1000, &rep) : r;
	ok(r == 0 && rep && envelope_eq(rep, &e) && got >= 0 && got != mfd,
	   "attach reply with its fd over a socketpair (fd %d -> %d)", mfd, got);
	kvq_frame_envelope_free(rep);
	rep = NULL;
	ok(got >= 0 && (fcntl(got, F_GETFD) & FD_CLOEXEC), "the received fd is close-on-exec");
	ok(got >= 0 && pwrite(mfd, "kvq-one", 7, 100) == 7 && pread(got, out, 7, 100) == 7 &&
	   !memcmp(out, "kvq-one", 7) && pwrite(got, "two", 3, 200) == 3 && pread(mfd, out, 3, 200) == 3 &&
	   !memcmp(out, "two", 3) && fstat(mfd, &st1) == 0 && fstat(got, &st2) == 0 &&
	   st1.st_ino == st2.st_ino && st1.st_dev == st2.st_dev,
	   "the received fd is the same file: written through one, read through the other");

	/* A second descriptor while the slot is full: closed. */
	fd_census(before);
	envelope_make(&e, 3);
	r = kvq_frame_send_envelope(sv[0], &e, mfd, 1000);
	r = r == 0 ? kvq_frame_recv_envelope(sv[1], &d, &got, 1000, &rep) : r;
	nnew = fds_new(before, &newfd);
	ok(r == 0 && nnew == 0 && d.fds_dropped == 1, "a descriptor while one is held: closed (%d new open)", nnew);
	kvq_frame_envelope_free(rep);
	rep = NULL;
	if (got >= 0)
		close(got);
	got = -1;

	/* Three descriptors in one message: the first kept, the rest closed. */
	{
		uint8_t *f;
		size_t flen;
		int kept;

		envelope_make(&e, 3);
		if (kvq_frame_encode_alloc(&e, &f, &flen) < 0)
			abort();
		fd_census(before);
		r = send_with_fds(sv[0], f, flen, mfd, 3);
		d.fds_dropped = 0;
		r = r == (int)flen ? kvq_frame_recv_envelope(sv[1], &d, &got, 1000, &rep) : -1;
		nnew = fds_new(before, &kept);
		ok(r == 0 && got >= 0 && nnew == 1 && kept == got && d.fds_dropped == 2,
		   "three fds sent: one kept (%d), two closed (new open: %d)", got, nnew);
		kvq_frame_envelope_free(rep);
		rep = NULL;
		if (got >= 0)
			close(got);
		got = -1;

		/* No descriptor expected (the daemon's side): all closed. */
		fd_census(before);
		r = send_with_fds(sv[0], f, flen, mfd, 2);
		d.fds_dropped = 0;
		r = r == (int)flen ? kvq_frame_recv_envelope(sv[1], &d, NULL, 1000, &rep) : -1;
		nnew = fds_new(before, &newfd);
		ok(r == 0 && nnew == 0 && d.fds_dropped == 2,
		   "fds sent where none is expected: both closed (new open: %d)", nnew);
		kvq_frame_envelope_free(rep);
		rep = NULL;

		/* More than fit in the control buffer: MSG_CTRUNC, all closed, an error. */
		fd_census(before);
		r = send_with_fds(sv[0], f, flen, mfd, KVQ_FRAME_RECV_FDS + 4);
		r = r == (int)flen ? kvq_frame_recv(sv[1], &d, &got) : -1;
		nnew = fds_new(before, &newfd);
		ok(r == -EPROTO && got == -1 && nnew == 0,
		   "%u fds (control data truncated): -EPROTO, nothing left open (new open: %d)",
		   KVQ_FRAME_RECV_FDS + 4, nnew);
		kvq_frame_decoder_fini(&d);
		kvq_frame_decoder_init(&d);
		free(f);
	}

	/* An attach reply without the fd: the frame arrives, the slot stays empty. */
	envelope_make(&e, 3);
	r = kvq_frame_send_envelope(sv[0], &e, -1, 1000);
	r = r == 0 ? kvq_frame_recv_envelope(sv[1], &d, &got, 1000, &rep) : r;
	ok(r == 0 && rep && rep->body_case == KVQ__ENVELOPE__BODY_ATTACH_REPLY && rep->status == 0 && got == -1,
	   "attach reply without an fd: decoded, slot still -1 (the caller's fault to report)");
	kvq_frame_envelope_free(rep);
	rep = NULL;

	/* Two requests encoded into one buffer and sent in one call, as a
	 * pipelining client does: both arrive, in order. */
	{
		Kvq__Envelope e2, *rep2 = NULL;
		uint8_t buf[4096];
		int n1, n2;

		envelope_make(&e, 4);
		envelope_make(&e2, 6);
		n1 = kvq_frame_encode(&e, buf, sizeof(buf));
		n2 = n1 > 0 ? kvq_frame_encode(&e2, buf + n1, sizeof(buf) - (size_t)n1) : -1;
		r = n2 > 0 ? kvq_frame_send_frames(sv[0], buf, (size_t)(n1 + n2), -1, 1000) : -1;
		r = r == 0 ? kvq_frame_recv_envelope(sv[1], &d, NULL, 1000, &rep) : r;
		r = r == 0 ? kvq_frame_recv_envelope(sv[1], &d, NULL, 1000, &rep2) : r;
		ok(r == 0 && envelope_eq(rep, &e) && envelope_eq(rep2, &e2) && kvq_frame_decoder_pending(&d) == 0,
		   "two frames in one kvq_frame_send_frames: both decoded, in order");
		ok(kvq_frame_send_frames(sv[0], buf, 0, -1, 1000) == -EINVAL, "kvq_frame_send_frames of nothing: -EINVAL");
		kvq_frame_envelope_free(rep);
		kvq_frame_envelope_free(rep2);
		rep = NULL;
	}

	/* Timeout on a blocking socket with nothing to read. */
	r = kvq_frame_recv_envelope(sv[1], &d, &got, 20, &rep);
	ok(r == -ETIMEDOUT && !rep, "nothing to read within 20 ms on a blocking socket: -ETIMEDOUT");

	/* End of stream inside a frame. */
	{
		uint8_t *f;
		size_t flen;

		envelope_make(&e, 5);
		if (kvq_frame_encode_alloc(&e, &f, &flen) < 0)
			abort();
		r = kvq_frame_send(sv[0], f, flen - 3, -1);
		close(sv[0]);
		r = r == (int)flen - 3 ? kvq_frame_recv_envelope(sv[1], &d, &got, 1000, &rep) : -1;
		ok(r == -ECONNRESET && !rep && kvq_frame_decoder_pending(&d) == flen - 3,
		   "peer closes inside a frame: -ECONNRESET, %zu bytes pending", kvq_frame_decoder_pending(&d));
		free(f);
	}
	ok(kvq_frame_send(sv[1], "x", 1, -1) == -EPIPE, "send to a closed peer: -EPIPE, no SIGPIPE");
	kvq_frame_decoder_fini(&d);
	close(sv[1]);
	close(mfd);
}

/* Reads what sv has now into d as kvqd does (kvq_frame_recv_fds), then
 * takes every complete frame with its descriptor: fds[i] for frame i (-1:
 * none) into fds[*n ...].  Returns the last read's result. */
static int read_frames(int sock, struct kvq_frame_decoder *d, int *fds, int *n)
{
	const uint8_t *p;
	size_t len;
	int r = kvq_frame_recv_fds(sock, d);

	while (kvq_frame_decoder_next(d, &p, &len) == 1)
		fds[(*n)++] = kvq_frame_decoder_take_fd(d);
	return r;
}

/* Whether a and b are the same open file. */
static int same_file(int a, int b)
{
	struct stat s1, s2;

	return a >= 0 && b >= 0 && fstat(a, &s1) == 0 && fstat(b, &s2) == 0 && s1.st_ino == s2.st_ino &&
	       s1.st_dev == s2.st_dev;
}

/* The daemon's side (kvq_frame_recv_fds): a descriptor goes to the frame
 * whose bytes include the first byte of the read that brought it; one at
 * most is held; what is not taken is closed. */
static void test_fd_frames(void)
{
	int sv[2], mfd = make_memfd(), other = make_memfd(), fds[8], n, nnew, newfd, r;
	struct kvq_frame_decoder d;
	uint8_t before[FD_SCAN];
	uint8_t *f;
	size_t flen;
	Kvq__Envelope e;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	envelope_make(&e, 2);   /* an Attach that announces codebooks */
	if (kvq_frame_encode_alloc(&e, &f, &flen) < 0)
		abort();

	/* a frame without, then one with a descriptor, read as they come */
	kvq_frame_decoder_init(&d);
	n = 0;
	r = kvq_frame_send(sv[0], f, flen, -1);
	r = r == (int)flen ? read_frames(sv[1], &d, fds, &n) : -1;
	r = r > 0 && kvq_frame_send(sv[0], f, flen, mfd) == (int)flen ? read_frames(sv[1], &d, fds, &n) : -1;
	ok(r > 0 && n == 2 && fds[0] == -1 && same_file(fds[1], mfd),
	   "a frame without a descriptor, then one with: the second frame's (%d)", n == 2 ? fds[1] : -2);
	if (n == 2 && fds[1] >= 0)
		close(fds[1]);

	/* the frame in two sends, the descriptor with its first byte, read apart */
	n = 0;
	r = kvq_frame_send(sv[0], f, 7, mfd);
	r = r == 7 ? read_frames(sv[1], &d, fds, &n) : -1;
	r = r > 0 && n == 0 && kvq_frame_send(sv[0], f + 7, flen - 7, -1) == (int)flen - 7
		    ? read_frames(sv[1], &d, fds, &n) : -1;
	ok(r > 0 && n == 1 && same_file(fds[0], mfd), "a frame read in two pieces: its descriptor waits for it");
	if (n == 1 && fds[0] >= 0)
		close(fds[0]);

	/* two frames, each with a descriptor: each its own, as the peer reads
	 * (the kernel ends a read after the bytes that carry descriptors) */
	n = 0;
	r = kvq_frame_send(sv[0], f, flen, mfd);
	r = r == (int)flen && kvq_frame_send(sv[0], f, flen, other) == (int)flen ? read_frames(sv[1], &d, fds, &n) : -1;
	r = r > 0 ? read_frames(sv[1], &d, fds, &n) : -1;
	ok(r > 0 && n == 2 && same_file(fds[0], mfd) && same_file(fds[1], other),
	   "two frames with a descriptor each: each frame its own");
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);

	/* one frame's worth of reads bringing two descriptors: the second closed */
	fd_census(before);
	n = 0;
	d.fds_dropped = 0;
	r = kvq_frame_send(sv[0], f, 5, mfd);
	r = r == 5 ? read_frames(sv[1], &d, fds, &n) : -1;
	r = r > 0 && kvq_frame_send(sv[0], f + 5, flen - 5, other) == (int)flen - 5 ? read_frames(sv[1], &d, fds, &n)
										   : -1;
	ok(r > 0 && n == 1 && same_file(fds[0], mfd) && d.fds_dropped == 1,
	   "a second descriptor for the same frame: closed, the first kept");
	if (n == 1 && fds[0] >= 0)
		close(fds[0]);
	nnew = fds_new(before, &newfd);
	ok(nnew == 0, "nothing else left open (%d new)", nnew);

	/* three descriptors in one message: one kept, two closed */
	fd_census(before);
	n = 0;
	d.fds_dropped = 0;
	r = send_with_fds(sv[0], f, flen, mfd, 3);
	r = r == (int)flen ? read_frames(sv[1], &d, fds, &n) : -1;
	ok(r > 0 && n == 1 && same_file(fds[0], mfd) && d.fds_dropped == 2,
	   "three descriptors with one frame: one for the frame, two closed");
	if (n == 1 && fds[0] >= 0)
		close(fds[0]);
	ok(fds_new(before, &newfd) == 0, "and none left open");

	/* a frame's descriptor not taken: closed by the next call */
	fd_census(before);
	r = kvq_frame_send(sv[0], f, flen, mfd);
	r = r == (int)flen ? kvq_frame_recv_fds(sv[1], &d) : -1;
	{
		const uint8_t *p;
		size_t len;

		r = r > 0 ? kvq_frame_decoder_next(&d, &p, &len) : -1;
		r = r == 1 ? kvq_frame_decoder_next(&d, &p, &len) : -1;
	}
	ok(r == 0 && fds_new(before, &newfd) == 0 && kvq_frame_decoder_take_fd(&d) == -1,
	   "a descriptor its frame's reader did not take: closed by the next kvq_frame_decoder_next");

	/* a descriptor held for a frame still incomplete: closed by fini */
	fd_census(before);
	r = kvq_frame_send(sv[0], f, flen / 2, mfd);
	r = r == (int)flen / 2 ? kvq_frame_recv_fds(sv[1], &d) : -1;
	nnew = fds_new(before, &newfd);
	kvq_frame_decoder_fini(&d);
	ok(r > 0 && nnew == 1 && fds_new(before, &newfd) == 0,
	   "a descriptor waiting for the rest of its frame: held (%d), closed by fini", nnew);

	/* Why a client sends a descriptor only when every earlier request is
	 * answered (kvq.proto): bytes still unread before it join the read
	 * that brings it, and it goes to their frame. */
	kvq_frame_decoder_init(&d);
	n = 0;
	r = kvq_frame_send(sv[0], f, flen, -1);
	r = r == (int)flen && kvq_frame_send(sv[0], f, flen, mfd) == (int)flen ? read_frames(sv[1], &d, fds, &n) : -1;
	ok(r == 2 * (int)flen && n == 2 && same_file(fds[0], mfd) && fds[1] == -1,
	   "a descriptor sent behind an unread frame: one read, the descriptor the first frame's");
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	kvq_frame_decoder_fini(&d);
	free(f);
	close(sv[0]);
	close(sv[1]);
	close(mfd);
	close(other);
}

/* A 3 MiB frame with an fd through nonblocking sockets: partial sends, the
 * fd with the first byte, the rest without. */
static void test_nonblocking(void)
{
	size_t nt = 750000;
	uint32_t *t = malloc(nt * sizeof(*t));
	int sv[2], mfd = make_memfd(), got = -1, sends = 0, bad = 0;
	struct kvq_frame_decoder d;
	Kvq__Lookup l;
	Kvq__Envelope e, *rep = NULL;
	uint8_t *f;
	size_t flen, off = 0;
	const uint8_t *p;
	size_t n;
	int r;

	if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		abort();
	for (size_t i = 0; i < nt; i++)
		t[i] = (uint32_t)(tap_rand() & 0x3ffff);
	kvq__lookup__init(&l);
	l.tokens = t;
	l.n_tokens = nt;
	l.max_tokens = 4096;
	kvq__envelope__init(&e);
	e.id = 77;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	if (kvq_frame_encode_alloc(&e, &f, &flen) < 0)
		abort();
	kvq_frame_decoder_init(&d);
	ok(kvq_frame_recv(sv[1], &d, &got) == -EAGAIN, "nonblocking read with nothing there: -EAGAIN");
	r = 0;
	while (off < flen && !bad) {
		r = kvq_frame_send(sv[0], f + off, flen - off, off == 0 ? mfd : -1);
		if (r > 0) {
			off += (size_t)r;
			sends++;
		} else if (r != -EAGAIN) {
			bad++;
		}
		while ((r = kvq_frame_recv(sv[1], &d, &got)) > 0)
			;
		if (r != -EAGAIN)
			bad++;
	}
	r = kvq_frame_decoder_next(&d, &p, &n);
	r = r == 1 ? kvq_frame_unpack(p, n, &rep) : -1;
	ok(!bad && r == 0 && sends > 1 && envelope_eq(rep, &e) && got >= 0 && d.fds_dropped == 0,
	   "%zu-byte frame in %d partial sends: intact, one fd", flen, sends);
	kvq_frame_envelope_free(rep);
	if (got >= 0)
		close(got);
	kvq_frame_decoder_fini(&d);
	free(f);
	free(t);
	close(sv[0]);
	close(sv[1]);
	close(mfd);
}

int main(void)
{
	tap_seed();
	messages_init();
	test_roundtrip();
	test_split_coalesced();
	test_faults();
	test_max_size();
	test_garbage();
	test_budget();
	test_check();
	test_fd_passing();
	test_fd_frames();
	test_nonblocking();
	return done_testing();
}
