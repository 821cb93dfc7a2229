/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's connection to kvqd (kvq_client_*): connect, attach (the map is
 * the pool's backend's: client_host, client_cuda) and the block requests.
 * Synchronous: one request, one reply; the protocol allows pipelining,
 * which a later version can use for a decode step's batch.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "codebook.h"
#include "memfd.h"

/* A daemon that stops answering must not hang a worker forever. */
#define CLIENT_TIMEOUT_MS 30000

int client_fail(kvq_client *c, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->conn.msg, sizeof(c->conn.msg), fmt, ap);
	va_end(ap);
	return r;
}

int kvq_client_connect(const char *path, const char *name, kvq_client **ret_client)
{
	kvq_client *c;
	int r;

	if (!ret_client)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->device = -1;
	kvq_conn_init(&c->conn, CLIENT_TIMEOUT_MS);
	r = kvq_conn_open(&c->conn, path, name ? name : "libkvq");
	if (r < 0) {
		kvq_client_free(c);
		return r;
	}
	*ret_client = c;
	return 0;
}

/* What was timed and not yet reported goes now, once the pool's work has
 * completed; never an error. */
static void flush_timing(kvq_client *c)
{
	if (!c->timing.report_ms || c->conn.broken || c->be->drain(c) < 0)
		return;
	if (c->be->timing_poll)
		c->be->timing_poll(c);
	if (c->timing.any) {
		c->timing.last_ms = INT64_MIN / 2;   /* due now */
		kvq_client_seal(c, 0, NULL, NULL);
	}
}

void kvq_client_free(kvq_client *c)
{
	if (!c)
		return;
	/* the backend waits for the work queued on the pool, then unmaps */
	if (c->be) {
		flush_timing(c);
		c->be->unmap(c);
	}
	kvq_conn_close(&c->conn);
	kvq_layout_free(c->L);
	free(c);
}

const char *kvq_client_error(const kvq_client *c)
{
	return c ? c->conn.msg : "";
}

uint64_t kvq_client_id(const kvq_client *c)
{
	return c ? c->conn.client_id : 0;
}

const struct kvq_layout *kvq_client_layout(const kvq_client *c)
{
	return c && c->base ? c->L : NULL;
}

void *kvq_client_base(const kvq_client *c)
{
	return c ? c->base : NULL;
}

const char *kvq_client_backend(const kvq_client *c)
{
	return c && c->base ? c->backend : NULL;
}

int kvq_client_device(const kvq_client *c)
{
	return c && c->base ? c->device : -1;
}

int kvq_client_set_trace(kvq_client *c, kvq_trace_fn fn, void *ctx)
{
	if (!c)
		return -EINVAL;
	c->trace = fn;
	c->trace_ctx = ctx;
	return 0;
}

void client_trace(kvq_client *c, int op, uint32_t layer, bool device, const void *k, const void *v, const void *q,
		  void *out)
{
	const struct kvq_trace t = { .op = op, .layer = layer, .device = device, .k = k, .v = v, .q = q, .out = out };

	if (c->trace)
		c->trace(c->trace_ctx, &t);
}

unsigned kvq_protocol_version(void)
{
	return KVQ_PROTOCOL_VERSION;
}

int kvq_client_set_stream(kvq_client *c, void *stream)
{
	if (!c)
		return -EINVAL;
	if (stream && !client_cuda.compiled)
		return -ENOTSUP;
	c->stream = stream;
	return 0;
}

int kvq_client_set_group(kvq_client *c, const char *group, uint32_t rank, uint32_t world_size)
{
	if (!c || !group || !*group || strlen(group) > KVQ_PROTO_MAX_NAME || world_size < 2 || rank >= world_size)
		return -EINVAL;
	if (c->base || c->L)
		return client_fail(c, -EISCONN, "already attached to pool %s", c->pool);
	snprintf(c->group, sizeof(c->group), "%s", group);
	c->rank = rank;
	c->world_size = world_size;
	return 0;
}

int kvq_client_attach(kvq_client *c, const struct kvq_attach_params *p)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	struct kvq_layout_params lp;
	struct kvq_layout *L = NULL;
	const Kvq__AttachReply *ar;
	const struct client_backend *be;
	char err[256];
	int r, cb_fd = -1;

	if (!c || !p || !p->pool || !p->model_id || !p->policy)
		return -EINVAL;
	if (c->base || c->L)
		return client_fail(c, -EISCONN, "already attached to pool %s", c->pool);
	/* sealed: what kvqd checks is what it copies into the pool */
	if (p->codebooks) {
		r = kvq_memfd_from_file(p->codebooks, KVQ_CB_MAX_FILE, "kvq-codebooks", &cb_fd, err, sizeof(err));
		if (r < 0)
			return client_fail(c, r, "codebooks: %s", err);
		a.codebooks = true;
	}
	a.pool = (char *)p->pool;
	a.model_id = (char *)p->model_id;
	a.layers = p->layers;
	a.kv_heads = p->kv_heads;
	a.head_dim = p->head_dim;
	a.block_tokens = p->block_tokens;
	a.policy = (char *)p->policy;
	a.window = p->window;
	a.act = p->act == KVQ_ACT_BF16 ? KVQ__DTYPE__DTYPE_BF16 : KVQ__DTYPE__DTYPE_F16;
	a.layout_version = KVQ_LAYOUT_VERSION;
	a.group = c->group;
	a.rank = c->rank;
	a.world_size = c->world_size;
	a.sink_blocks = c->sink_blocks;
	if (p->create) {
		pc.n_sealed = p->n_sealed;
		pc.n_open = p->n_open;
		pc.n_sink = c->n_sink;
		pc.backend = (char *)(p->backend ? p->backend : "");
		pc.device = p->device;
		a.create = &pc;
	}
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = kvq_conn_call_fd(&c->conn, &e, cb_fd, KVQ__ENVELOPE__BODY_ATTACH_REPLY, &rep);
	if (r < 0)
		goto out;
	ar = rep->attach_reply;
	be = !strcmp(ar->backend, client_host.name) ? &client_host
	     : !strcmp(ar->backend, client_cuda.name) ? &client_cuda : NULL;
	if (!be) {
		r = client_fail(c, KVQ_EPROTOCOL, "pool %s is on an unknown backend '%s'", p->pool, ar->backend);
		goto out;
	}
	if (!be->compiled) {
		/* never a silent host fallback on device memory */
		r = client_fail(c, -ENOTSUP, "pool %s is on the cuda backend; this libkvq was built without CUDA",
				p->pool);
		goto out;
	}
	if (c->conn.pool_fd < 0 || ar->map_bytes < ar->total_bytes || ar->map_bytes > SIZE_MAX) {
		r = client_fail(c, KVQ_EPROTOCOL, "attach reply without a descriptor or with a bad size");
		goto out;
	}
	if (kvq_policy_parse(ar->policy, ar->layers, &c->pol, err, sizeof(err)) < 0) {
		r = client_fail(c, KVQ_EPROTOCOL, "pool policy '%s': %s", ar->policy, err);
		goto out;
	}
	lp = (struct kvq_layout_params){ .layers = ar->layers, .kv_heads = ar->kv_heads, .head_dim = ar->head_dim,
		.block_tokens = ar->block_tokens, .window = ar->window, .n_sealed = ar->n_sealed,
		.n_open = ar->n_open, .act = (int)ar->act, .policy = &c->pol, .sink_blocks = ar->sink_blocks,
		.n_sink = ar->n_sink };
	if (ar->layout_version != KVQ_LAYOUT_VERSION) {
		r = client_fail(c, KVQ_ELAYOUT, "pool layout version %u, libkvq has %u", ar->layout_version,
				KVQ_LAYOUT_VERSION);
		goto out;
	}
	if (kvq_layout_new(&lp, &L, err, sizeof(err)) < 0) {
		r = client_fail(c, KVQ_ELAYOUT, "pool layout: %s", err);
		goto out;
	}
	if (L->n_sink && !be->sinks) {
		r = client_fail(c, -ENOTSUP, "pool %s keeps sink blocks: this libkvq's %s kernels do not read them",
				p->pool, be->name);
		goto out;
	}
	if (L->total_bytes != ar->total_bytes || L->window != ar->window) {
		r = client_fail(c, KVQ_ELAYOUT, "pool layout: kvqd counts %llu bytes, libkvq %llu",
				(unsigned long long)ar->total_bytes, (unsigned long long)L->total_bytes);
		goto out;
	}
	r = be->map(c, c->conn.pool_fd, ar->map_bytes, ar->device, ar->device_uuid.data, ar->device_uuid.len);
	if (r < 0)
		goto out;
	/* the mapping keeps the memory: the descriptor is closed at out */
	c->be = be;
	c->L = L;
	L = NULL;
	snprintf(c->backend, sizeof(c->backend), "%s", ar->backend);
	snprintf(c->pool, sizeof(c->pool), "%s", p->pool);
	c->timing.report_ms = ar->attention_report_ms;
	timing_sent(c);
out:
	if (cb_fd >= 0)
		close(cb_fd);
	if (c->conn.pool_fd >= 0) {
		close(c->conn.pool_fd);
		c->conn.pool_fd = -1;
	}
	kvq_layout_free(L);
	kvq_frame_envelope_free(rep);
	return r;
}

int kvq_client_set_sinks(kvq_client *c, uint32_t sink_blocks, uint32_t n_sink)
{
	if (!c || sink_blocks > 1 || (!sink_blocks && n_sink) || n_sink > KVQ_MAX_SLOTS)
		return -EINVAL;
	if (c->base || c->L)
		return client_fail(c, -EISCONN, "sink blocks are set before the attach");
	c->sink_blocks = sink_blocks;
	c->n_sink = n_sink;
	return 0;
}

int kvq_client_alloc(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t *ret_open, uint32_t *ret_reserved,
		     uint32_t *ret_sealed)
{
	return client_alloc(c, n_open, n_sealed, 0, ret_open, ret_reserved, ret_sealed, NULL);
}

int kvq_client_alloc_sinks(kvq_client *c, uint32_t n, uint32_t *ret_ids)
{
	return client_alloc(c, 0, 0, n, NULL, NULL, NULL, ret_ids);
}

int client_alloc(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t n_sink, uint32_t *ret_open,
		 uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	const Kvq__AllocReply *ar;
	int r;

	if (!c || (n_open && (!ret_open || !ret_reserved)) || (n_sealed && !ret_sealed) || (n_sink && !ret_sink))
		return -EINVAL;
	a.n_open = n_open;
	a.n_sealed = n_sealed;
	a.n_sink = n_sink;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_ALLOC_REPLY, &rep);
	if (r < 0)
		return r;
	ar = rep->alloc_reply;
	if (ar->n_open_ids != n_open || ar->n_reserved_ids != n_open || ar->n_sealed_ids != n_sealed ||
	    ar->n_sink_ids != n_sink) {
		kvq_frame_envelope_free(rep);
		c->conn.broken = true;   /* the daemon holds slots we cannot name: drop them all */
		return client_fail(c, KVQ_EPROTOCOL, "alloc reply with the wrong counts");
	}
	if (n_open) {
		memcpy(ret_open, ar->open_ids, n_open * sizeof(uint32_t));
		memcpy(ret_reserved, ar->reserved_ids, n_open * sizeof(uint32_t));
	}
	if (n_sealed)
		memcpy(ret_sealed, ar->sealed_ids, n_sealed * sizeof(uint32_t));
	for (uint32_t i = 0; i < n_sink; i++)
		ret_sink[i] = KVQ_SINK_ID(ar->sink_ids[i]);
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_client_seal(kvq_client *c, uint32_t n, const uint32_t *open_ids, const uint32_t *sealed_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Seal s = KVQ__SEAL__INIT;
	Kvq__AttentionReport rep;
	Kvq__AttentionBin bins[KVQ_PROTO_MAX_TIMING_BINS], *ptrs[KVQ_PROTO_MAX_TIMING_BINS];
	bool report;
	int r;

	if (!c || (n && (!open_ids || !sealed_ids)))
		return -EINVAL;
	s.n_open_ids = s.n_sealed_ids = n;
	s.open_ids = (uint32_t *)open_ids;
	s.sealed_ids = (uint32_t *)sealed_ids;
	/* the timings ride along once their interval has passed */
	report = timing_due(c);
	if (report) {
		timing_report(c, &rep, bins, ptrs);
		s.attention = &rep;
	}
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &s;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_SEAL_REPLY, NULL);
	if (r == 0 && report)
		timing_sent(c);
	return r;
}

int kvq_client_publish(kvq_client *c, uint32_t n, const uint32_t *sealed_ids, int64_t parent, const uint32_t *tokens,
		       const void *salt, size_t salt_len, uint32_t *ret_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Publish p = KVQ__PUBLISH__INIT;
	Kvq__PublishBlock *b = NULL, **bp = NULL;
	uint32_t B;
	int r;

	if (!c || !c->L || !n || !sealed_ids || !tokens || !ret_ids || salt_len > KVQ_PROTO_MAX_SALT ||
	    parent > (int64_t)UINT32_MAX || n > KVQ_PROTO_MAX_IDS)
		return -EINVAL;
	/* ids carry their class (KVQ_SINK_ID); a sink can start a chain only */
	for (uint32_t i = 1; i < n; i++)
		if (sealed_ids[i] & KVQ_SINK_FLAG)
			return -EINVAL;
	B = c->L->block_tokens;
	b = calloc(n, sizeof(*b));
	bp = calloc(n, sizeof(*bp));
	if (!b || !bp) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t id = sealed_ids[i], par = i ? sealed_ids[i - 1] : (uint32_t)parent;

		kvq__publish_block__init(&b[i]);
		if (id & KVQ_SINK_FLAG) {
			b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID;
			b[i].sink_id = id & ~KVQ_SINK_FLAG;
		} else {
			b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
			b[i].sealed_id = id;
		}
		if ((i || parent >= 0) && (par & KVQ_SINK_FLAG)) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_SINK_ID;
			b[i].parent_sink_id = par & ~KVQ_SINK_FLAG;
		} else if (i || parent >= 0) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			b[i].parent_id = par;
		}
		b[i].n_tokens = B;
		b[i].tokens = (uint32_t *)tokens + (size_t)i * B;
		b[i].salt.data = (uint8_t *)salt;
		b[i].salt.len = salt ? salt_len : 0;
		bp[i] = &b[i];
	}
	p.n_blocks = n;
	p.blocks = bp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &p;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_PUBLISH_REPLY, &rep);
	if (r < 0)
		goto out;
	if (rep->publish_reply->n_ids != n) {
		c->conn.broken = true;
		r = client_fail(c, KVQ_EPROTOCOL, "publish reply with the wrong count");
		goto out;
	}
	/* a reply id is of its block's class */
	for (uint32_t i = 0; i < n; i++)
		ret_ids[i] = rep->publish_reply->ids[i] | (sealed_ids[i] & KVQ_SINK_FLAG);
out:
	kvq_frame_envelope_free(rep);
	free(bp);
	free(b);
	return r;
}

int kvq_client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t *ret_n)
{
	return client_lookup(c, tokens, n_tokens, max_tokens, salt, salt_len, NULL, 0, ret_ids, ret_n);
}

int client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens, const void *salt,
		  size_t salt_len, const void *rid, size_t rid_len, uint32_t *ret_ids, uint32_t *ret_n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Lookup l = KVQ__LOOKUP__INIT;
	size_t n;
	int r;

	if (!c || !c->L || (n_tokens && !tokens) || max_tokens > n_tokens || !ret_n ||
	    (max_tokens >= c->L->block_tokens && !ret_ids) || salt_len > KVQ_PROTO_MAX_SALT ||
	    rid_len > KVQ_PROTO_MAX_REQUEST_ID || (rid_len && !rid))
		return -EINVAL;
	l.n_tokens = n_tokens;
	l.tokens = (uint32_t *)tokens;
	l.max_tokens = max_tokens;
	l.salt.data = (uint8_t *)salt;
	l.salt.len = salt ? salt_len : 0;
	l.request_id.data = (uint8_t *)rid;
	l.request_id.len = rid_len;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, &rep);
	if (r < 0)
		return r;
	n = rep->lookup_reply->n_sealed_ids + rep->lookup_reply->n_sink_ids;
	if (n > max_tokens / c->L->block_tokens || rep->lookup_reply->n_sink_ids > 1) {
		kvq_frame_envelope_free(rep);
		c->conn.broken = true;   /* references we cannot name: drop them all */
		return client_fail(c, KVQ_EPROTOCOL, "lookup reply longer than asked for");
	}
	/* block 0's sink first, when the pool keeps one */
	for (size_t i = 0; i < rep->lookup_reply->n_sink_ids; i++)
		ret_ids[i] = KVQ_SINK_ID(rep->lookup_reply->sink_ids[i]);
	for (size_t i = 0; i < rep->lookup_reply->n_sealed_ids; i++)
		ret_ids[rep->lookup_reply->n_sink_ids + i] = rep->lookup_reply->sealed_ids[i];
	*ret_n = (uint32_t)n;
	kvq_frame_envelope_free(rep);
	return 0;
}

/* How many of ids[n] are sink ids (KVQ_SINK_ID). */
static size_t count_sinks(const uint32_t *ids, uint32_t n)
{
	size_t k = 0;

	for (uint32_t i = 0; i < n; i++)
		k += (ids[i] & KVQ_SINK_FLAG) != 0;
	return k;
}

/* Splits ids (n of them) by class: sealed ones to sealed[*ns], sink ones
 * (KVQ_SINK_ID) to sink[*nk], their flag cleared. */
static void split_ids(const uint32_t *ids, uint32_t n, uint32_t *sealed, size_t *ns, uint32_t *sink, size_t *nk)
{
	for (uint32_t i = 0; i < n; i++) {
		if (ids[i] & KVQ_SINK_FLAG)
			sink[(*nk)++] = ids[i] & ~KVQ_SINK_FLAG;
		else
			sealed[(*ns)++] = ids[i];
	}
}

int kvq_client_release(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		       const uint32_t *open_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Release rl = KVQ__RELEASE__INIT;
	uint32_t *buf = NULL;
	int r;

	if (!c || (n_sealed && !sealed_ids) || (n_open && !open_ids))
		return -EINVAL;
	rl.n_sealed_ids = n_sealed;
	rl.sealed_ids = (uint32_t *)sealed_ids;
	rl.n_open_ids = n_open;
	rl.open_ids = (uint32_t *)open_ids;
	/* a sink id may come in either list (a sequence's block 0 in its window,
	 * or sealed): only then are the lists copied, split by class */
	if (count_sinks(sealed_ids, n_sealed) + count_sinks(open_ids, n_open)) {
		buf = malloc(2 * ((size_t)n_sealed + n_open) * sizeof(*buf));
		if (!buf)
			return -ENOMEM;
		rl.sealed_ids = buf;
		rl.open_ids = buf + n_sealed;
		rl.sink_ids = buf + n_sealed + n_open;
		rl.n_sealed_ids = rl.n_open_ids = 0;
		split_ids(sealed_ids, n_sealed, rl.sealed_ids, &rl.n_sealed_ids, rl.sink_ids, &rl.n_sink_ids);
		split_ids(open_ids, n_open, rl.open_ids, &rl.n_open_ids, rl.sink_ids, &rl.n_sink_ids);
	}
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &rl;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_RELEASE_REPLY, NULL);
	free(buf);
	return r;
}

int kvq_client_fork(kvq_client *c, uint32_t n, const uint32_t *sealed_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Fork f = KVQ__FORK__INIT;
	uint32_t *buf = NULL;
	int r;

	if (!c || (n && !sealed_ids))
		return -EINVAL;
	f.n_sealed_ids = n;
	f.sealed_ids = (uint32_t *)sealed_ids;
	if (count_sinks(sealed_ids, n)) {
		buf = malloc(2 * (size_t)n * sizeof(*buf));
		if (!buf)
			return -ENOMEM;
		f.sealed_ids = buf;
		f.sink_ids = buf + n;
		f.n_sealed_ids = 0;
		split_ids(sealed_ids, n, f.sealed_ids, &f.n_sealed_ids, f.sink_ids, &f.n_sink_ids);
	}
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &f;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_FORK_REPLY, NULL);
	free(buf);
	return r;
}

/* The Stats reply's record of pool (NULL: the attached one) in *ret_rep
 * (freed by the caller with kvq_frame_envelope_free), or -EINVAL (no c or
 * no out, the caller's ret), -ENOENT, a daemon code; *ret_p points into it. */
static int pool_stats(kvq_client *c, const char *pool, const void *out, Kvq__Envelope **ret_rep,
		      const Kvq__PoolStats **ret_p)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	const Kvq__StatsReply *sr;
	int r;

	if (!c || !out)
		return -EINVAL;
	if (!pool)
		pool = c->pool;
	if (!*pool)
		return client_fail(c, -EINVAL, "no pool named and none attached");
	s.pool = (char *)pool;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, &rep);
	if (r < 0)
		return r;
	sr = rep->stats_reply;
	for (size_t i = 0; i < sr->n_pools; i++)
		if (!strcmp(sr->pools[i]->name, pool)) {
			*ret_rep = rep;
			*ret_p = sr->pools[i];
			c->conn.msg[0] = 0;
			return 0;
		}
	kvq_frame_envelope_free(rep);
	return client_fail(c, -ENOENT, "kvqd reports no pool %s", pool);
}

int kvq_client_stats(kvq_client *c, const char *pool, struct kvq_stats *ret_stats)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__PoolStats *p;
	struct kvq_stats st = { 0 };
	int r = pool_stats(c, pool, ret_stats, &rep, &p);

	if (r < 0)
		return r;
	snprintf(st.name, sizeof(st.name), "%s", p->name);
	snprintf(st.model_id, sizeof(st.model_id), "%s", p->model_id);
	snprintf(st.backend, sizeof(st.backend), "%s", p->backend);
	st.device = p->device;
	st.layers = p->layers;
	st.kv_heads = p->kv_heads;
	st.head_dim = p->head_dim;
	st.block_tokens = p->block_tokens;
	st.window = p->window;
	st.total_bytes = p->total_bytes;
	st.n_sealed = p->n_sealed;
	st.n_open = p->n_open;
	st.sealed_free = p->sealed_free;
	st.sealed_reserved = p->sealed_reserved;
	st.sealed_held = p->sealed_held;
	st.cached = p->cached;
	st.referenced = p->referenced;
	st.open_used = p->open_used;
	st.lookup_tokens = p->lookup_tokens;
	st.hit_tokens = p->hit_tokens;
	st.evictions = p->evictions;
	st.alloc_failures = p->alloc_failures;
	st.clients = p->clients;
	*ret_stats = st;
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_client_sink_stats(kvq_client *c, const char *pool, struct kvq_sink_stats *ret_stats)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__PoolStats *p;
	int r = pool_stats(c, pool, ret_stats, &rep, &p);

	if (r < 0)
		return r;
	*ret_stats = (struct kvq_sink_stats){
		.sink_blocks = p->sink_blocks,
		.n_sink = p->n_sink,
		.sink_free = p->sink_free,
		.sink_held = p->sink_held,
		.sink_cached = p->sink_cached,
		.sink_referenced = p->sink_referenced,
		.sequences = p->sequences,
		.sink_tokens = p->sink_tokens,
	};
	kvq_frame_envelope_free(rep);
	return 0;
}
