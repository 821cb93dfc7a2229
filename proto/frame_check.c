/* SPDX-License-Identifier: Apache-2.0 */
/* The stateless check of an envelope against the protocol's limits
 * (frame_check.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "frame_check.h"

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

/* One prompt's fields (Lookup's own, or a LookupPrompt's); a request id is
 * the group's to check (a pool of no group ignores it). */
static int check_prompt(size_t n_tokens, uint32_t max_tokens, const ProtobufCBinaryData *salt, const char *what,
			char *err, size_t errlen)
{
	TRY(check_salt(salt, "lookup.salt", err, errlen));
	if (max_tokens > n_tokens)
		return fail(-EINVAL, err, errlen, "%s.max_tokens %u over the %zu tokens sent", what, max_tokens,
			    n_tokens);
	return 0;
}

/* A Lookup: its own fields or (version 8) prompts, not both; the limits
 * over all prompts but the ids' (that needs the pool's B: the daemon's). */
static int check_lookup(const Kvq__Lookup *l, char *err, size_t errlen)
{
	size_t tokens = 0;

	if (!l->n_prompts) {
		TRY(check_count(l->n_tokens, KVQ_PROTO_MAX_TOKENS, "lookup.tokens", err, errlen));
		return check_prompt(l->n_tokens, l->max_tokens, &l->salt, "lookup", err, errlen);
	}
	if (l->n_tokens || l->max_tokens || l->salt.len || l->request_id.len)
		return fail(-EINVAL, err, errlen, "lookup: prompts and fields of its own (one form or the other)");
	TRY(check_count(l->n_prompts, KVQ_PROTO_MAX_PROMPTS, "lookup.prompts", err, errlen));
	for (size_t i = 0; i < l->n_prompts; i++) {
		const Kvq__LookupPrompt *q = l->prompts[i];
		char what[40];

		snprintf(what, sizeof(what), "lookup.prompts[%zu]", i);
		TRY(check_prompt(q->n_tokens, q->max_tokens, &q->salt, what, err, errlen));
		tokens += q->n_tokens;
	}
	return check_count(tokens, KVQ_PROTO_MAX_TOKENS, "lookup.prompts: tokens", err, errlen);
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
	case KVQ__ENVELOPE__BODY_LOOKUP:
		return check_lookup(e->lookup, err, errlen);
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
		/* a refusal's body (version 8) says what was short and grants nothing */
		if (e->status < 0 && a->n_open_ids + a->n_sealed_ids + a->n_sink_ids)
			return fail(-EINVAL, err, errlen, "alloc_reply: ids with a refusal");
		return check_count(a->n_open_ids + a->n_sealed_ids + a->n_sink_ids, KVQ_PROTO_MAX_IDS,
				   "alloc_reply: ids", err, errlen);
	}
	case KVQ__ENVELOPE__BODY_PUBLISH_REPLY:
		return check_count(e->publish_reply->n_ids, KVQ_PROTO_MAX_IDS, "publish_reply.ids", err, errlen);
	case KVQ__ENVELOPE__BODY_LOOKUP_REPLY: {
		const Kvq__LookupReply *l = e->lookup_reply;
		size_t ids = l->n_sealed_ids + l->n_sink_ids;

		TRY(check_count(l->n_hits, KVQ_PROTO_MAX_PROMPTS, "lookup_reply.hits", err, errlen));
		for (size_t i = 0; i < l->n_hits; i++)
			ids += l->hits[i]->n_sealed_ids + l->hits[i]->n_sink_ids;
		return check_count(ids, KVQ_PROTO_MAX_IDS, "lookup_reply: ids", err, errlen);
	}
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
