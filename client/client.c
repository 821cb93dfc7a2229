/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's connection to kvqd (kvq_client_*): connect, attach (the map is
 * the pool's backend's: client_host, client_cuda) and the block requests.
 * The batched requests (client_lookup_many, client_alloc_many,
 * client_commit) write their requests together and read the replies after;
 * the single ones go through them.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blockid.h"
#include "codebook.h"
#include "figure.h"
#include "frame_io.h"
#include "libkvq_internal.h"
#include "memfd.h"
#include "wire_block.h"

/* A daemon that stops answering must not hang a worker forever. */
#define CLIENT_TIMEOUT_MS 30000

/* What a commit seals besides its pairs: nothing (a publish), a Seal for
 * the attention report when one is due and there is no pair (client_commit,
 * the Seal's failure no error), or a Seal whatever (kvq_client_seal). */
enum client_seal { CLIENT_SEAL_NONE, CLIENT_SEAL_DUE, CLIENT_SEAL_ALWAYS };

/* client_commit, sealing as mode says. */
static int client_commit_run(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
			     struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt,
			     enum client_seal mode);

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

int client_attach(kvq_client *c, const struct kvq_attach_params *p)
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
	return client_alloc_many(c, n_open, n_sealed, n_sink, ret_open, ret_reserved, ret_sealed, ret_sink, NULL,
				 NULL);
}

int kvq_client_seal(kvq_client *c, uint32_t n, const uint32_t *open_ids, const uint32_t *sealed_ids)
{
	if (!c || (n && (!open_ids || !sealed_ids)))
		return -EINVAL;
	return client_commit_run(c, n, open_ids, sealed_ids, NULL, 0, NULL, NULL, CLIENT_SEAL_ALWAYS);
}

int kvq_client_publish(kvq_client *c, uint32_t n, const uint32_t *sealed_ids, int64_t parent, const uint32_t *tokens,
		       const void *salt, size_t salt_len, uint32_t *ret_ids)
{
	struct client_chain ch = { .ids = sealed_ids, .n = n, .parent = parent, .tokens = tokens, .salt = salt,
				   .salt_len = salt_len, .ret_ids = ret_ids };

	if (!c || !c->L || n > KVQ_PROTO_MAX_IDS)
		return -EINVAL;
	return client_commit_run(c, 0, NULL, NULL, &ch, 1, NULL, NULL, CLIENT_SEAL_NONE);
}

int kvq_client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t *ret_n)
{
	return client_lookup(c, tokens, n_tokens, max_tokens, salt, salt_len, NULL, 0, ret_ids, ret_n);
}

int client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens, const void *salt,
		  size_t salt_len, const void *rid, size_t rid_len, uint32_t *ret_ids, uint32_t *ret_n)
{
	struct client_prompt p = { .tokens = tokens, .n_tokens = n_tokens, .max_tokens = max_tokens, .salt = salt,
				   .salt_len = salt_len, .rid = rid, .rid_len = rid_len, .ret_ids = ret_ids };
	int r;

	if (!ret_n)
		return -EINVAL;
	r = client_lookup_many(c, &p, 1, NULL);
	if (r == 0)
		*ret_n = p.ret_n;
	return r;
}

int kvq_client_release(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		       const uint32_t *open_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Release rl = KVQ__RELEASE__INIT;
	const size_t nmax = (size_t)n_sealed + n_open;
	struct kvq_block_ref *refs = NULL;
	uint32_t *buf = NULL;
	size_t nr = 0;
	int r;

	if (!c || (n_sealed && !sealed_ids) || (n_open && !open_ids))
		return -EINVAL;
	refs = malloc((nmax + 1) * sizeof(*refs));
	buf = malloc((2 * nmax + 1) * sizeof(*buf));   /* the blocks' wire ids, then the open ids */
	if (!refs || !buf) {
		r = -ENOMEM;
		goto out;
	}
	rl.open_ids = buf + nmax;
	for (uint32_t i = 0; i < n_sealed; i++)
		refs[nr++] = client_block_ref(sealed_ids[i]);
	/* a sink id may come in the open list too (a sequence's block 0 in its window) */
	for (uint32_t i = 0; i < n_open; i++) {
		const struct kvq_block_ref b = client_block_ref(open_ids[i]);

		if (b.cls == KVQ_BLOCK_SINK)
			refs[nr++] = b;
		else
			rl.open_ids[rl.n_open_ids++] = open_ids[i];
	}
	r = kvq_wire_blocks_put(&rl.base, KVQ_WIRE_IDS, refs, nr, buf);
	if (r < 0)
		goto out;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &rl;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_RELEASE_REPLY, NULL);
out:
	free(refs);
	free(buf);
	return r;
}

int kvq_client_fork(kvq_client *c, uint32_t n, const uint32_t *sealed_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Fork f = KVQ__FORK__INIT;
	struct kvq_block_ref *refs = NULL;
	uint32_t *buf = NULL;
	int r;

	if (!c || (n && !sealed_ids))
		return -EINVAL;
	refs = malloc(((size_t)n + 1) * sizeof(*refs));
	buf = malloc(((size_t)n + 1) * sizeof(*buf));
	if (!refs || !buf) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		refs[i] = client_block_ref(sealed_ids[i]);
	r = kvq_wire_blocks_put(&f.base, KVQ_WIRE_IDS, refs, n, buf);
	if (r < 0)
		goto out;
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &f;
	r = kvq_conn_call(&c->conn, &e, KVQ__ENVELOPE__BODY_FORK_REPLY, NULL);
out:
	free(refs);
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

/* struct kvq_stats' and struct kvq_sink_stats' figures: frozen with the
 * structs (interface 6), each the figure of its field's name. */
#define STATS_FIGURES(X)                                                                                     \
	X(total_bytes) X(n_sealed) X(n_open) X(sealed_free) X(sealed_reserved) X(sealed_held) X(cached)       \
	X(referenced) X(open_used) X(lookup_tokens) X(hit_tokens) X(evictions) X(alloc_failures) X(clients)
#define SINK_STATS_FIGURES(X) X(n_sink) X(sink_free) X(sink_held) X(sink_cached) X(sink_referenced) X(sequences) \
	X(sink_tokens)

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
#define FIGURE(f) st.f = kvq_figure_or_0(p, #f);
	STATS_FIGURES(FIGURE)
#undef FIGURE
	*ret_stats = st;
	kvq_frame_envelope_free(rep);
	return 0;
}

int kvq_client_sink_stats(kvq_client *c, const char *pool, struct kvq_sink_stats *ret_stats)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__PoolStats *p;
	struct kvq_sink_stats st = { 0 };
	int r = pool_stats(c, pool, ret_stats, &rep, &p);

	if (r < 0)
		return r;
	st.sink_blocks = p->sink_blocks;
#define FIGURE(f) st.f = kvq_figure_or_0(p, #f);
	SINK_STATS_FIGURES(FIGURE)
#undef FIGURE
	*ret_stats = st;
	kvq_frame_envelope_free(rep);
	return 0;
}

/* One Stats reply kept for its pool's figures. */
struct kvq_pool_figures {
	Kvq__Envelope *rep;
	const Kvq__PoolStats *p;
};

int kvq_client_pool_figures(kvq_client *c, const char *pool, kvq_pool_figures **ret_figures)
{
	kvq_pool_figures *f;
	int r;

	if (!ret_figures)
		return -EINVAL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	r = pool_stats(c, pool, ret_figures, &f->rep, &f->p);
	if (r < 0) {
		free(f);
		return r;
	}
	*ret_figures = f;
	return 0;
}

size_t kvq_pool_figures_count(const kvq_pool_figures *f)
{
	return f ? f->p->n_figures : 0;
}

int kvq_pool_figures_at(const kvq_pool_figures *f, size_t i, const char **ret_name, uint64_t *ret_value)
{
	if (!f || !ret_name || !ret_value)
		return -EINVAL;
	if (i >= f->p->n_figures)
		return -ENOENT;
	*ret_name = f->p->figures[i]->name;
	*ret_value = f->p->figures[i]->value;
	return 0;
}

int kvq_pool_figures_get(const kvq_pool_figures *f, const char *name, uint64_t *ret_value)
{
	if (!f || !name || !ret_value)
		return -EINVAL;
	return kvq_figure_get(f->p, name, ret_value);
}

void kvq_pool_figures_free(kvq_pool_figures *f)
{
	if (!f)
		return;
	kvq_frame_envelope_free(f->rep);
	free(f);
}

int kvq_client_pool_stat(kvq_client *c, const char *pool, const char *name, uint64_t *ret_value)
{
	kvq_pool_figures *f = NULL;
	int r;

	if (!name || !ret_value)
		return -EINVAL;
	r = kvq_client_pool_figures(c, pool, &f);
	if (r < 0)
		return r;
	r = kvq_pool_figures_get(f, name, ret_value);
	if (r < 0)
		client_fail(c, r, "kvqd reports no figure %s of pool %s", name, f->p->name);
	kvq_pool_figures_free(f);
	return r;
}

/* ---------------------------------------------------------------- batched requests */

/*
 * Requests framed into one buffer and written together (one write, as few
 * sendmsg calls as the socket allows), then their replies read in order:
 * kvq.proto lets a client pipeline, and a batch's requests cost one round
 * trip.
 */
struct client_pipe {
	uint8_t *buf;
	size_t len, cap;
	uint64_t first;                 /* the id of the first request queued */
	uint32_t n;                     /* requests queued (or sent, until the next is queued) */
	bool waited;                    /* a reply of the requests sent was read */
};

/* Appends e as a frame, with the connection's next id: 0, or -EMSGSIZE
 * (e over KVQ_FRAME_MAX), -ENOMEM. */
static int pipe_queue(kvq_client *c, struct client_pipe *p, Kvq__Envelope *e)
{
	int n;

	if (p->len == 0)
		p->n = 0;
	e->id = c->conn.next_id + 1;
	n = kvq_frame_size(e);
	if (n < 0)
		return client_fail(c, n, "a request kvqd would not take: %s", kvq_strerror(n));
	if (p->len + (size_t)n > p->cap) {
		size_t cap = 2 * (p->len + (size_t)n);
		uint8_t *b = realloc(p->buf, cap);

		if (!b)
			return -ENOMEM;
		p->buf = b;
		p->cap = cap;
	}
	n = kvq_frame_encode(e, p->buf + p->len, p->cap - p->len);
	if (n < 0)
		return client_fail(c, n, "a request kvqd would not take: %s", kvq_strerror(n));
	c->conn.next_id = e->id;
	if (p->n++ == 0)
		p->first = e->id;
	p->len += (size_t)n;
	return 0;
}

/* Writes what was queued: 0, or a transport error (the connection is
 * broken: what was sent may have been taken). */
static int pipe_send(kvq_client *c, struct client_pipe *p, struct client_count *cnt)
{
	int r;

	if (c->conn.broken)
		return client_fail(c, -ENOTCONN, "connection to kvqd lost earlier");
	r = kvq_frame_send_frames(c->conn.fd, p->buf, p->len, -1, c->conn.timeout_ms);
	p->len = 0;
	p->waited = false;
	if (r < 0) {
		c->conn.broken = true;
		return client_fail(c, r, "sending to kvqd: %s", kvq_strerror(r));
	}
	if (cnt)
		cnt->requests += p->n;
	return 0;
}

/* The reply to the i-th request sent (kvq_conn_reply_refusal: a refusal's
 * body comes back too, *ret NULL when none); the first read of a write is
 * its round trip. */
static int pipe_reply(kvq_client *c, struct client_pipe *p, uint32_t i, Kvq__Envelope__BodyCase want,
		      struct client_count *cnt, Kvq__Envelope **ret)
{
	if (cnt && !p->waited)
		cnt->waits++;
	p->waited = true;
	return kvq_conn_reply_refusal(&c->conn, p->first + i, want, ret);
}

/* The first failure of a batch, r, with its reason kept in msg (later
 * replies overwrite the connection's); 0 leaves *first as it is. */
static void keep_first(kvq_client *c, int r, int *first, char *msg, size_t len)
{
	if (r < 0 && *first == 0) {
		*first = r;
		snprintf(msg, len, "%s", c->conn.msg);
	}
}

/* Gives back references and slots taken in a batch that failed: a Release
 * per piece (each within the protocol's limits); failures are the
 * connection's (a broken one drops everything). */
static void give_back(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		      const uint32_t *open_ids, struct client_count *cnt)
{
	if ((!n_sealed && !n_open) || c->conn.broken)
		return;
	if (kvq_client_release(c, n_sealed, sealed_ids, n_open, open_ids) < 0)
		c->conn.broken = true;   /* holds we could not give back: closing drops them */
	if (cnt) {
		cnt->requests++;
		cnt->waits++;
	}
}

enum { PART_OPEN, PART_SEALED, PART_SINK };

/* Slots of one Alloc request and what came of it; the daemon's three
 * checks (kvq.proto, AllocReply) need open, open + sealed and sink slots. */
struct alloc_part {
	uint32_t n[3];                  /* open, sealed, sink (PART_*) */
	bool granted;
	uint32_t short_[3];             /* the refusal's shortfall per check */
	bool nospc;
};

static uint64_t part_need(const struct alloc_part *a, int k)
{
	return k == PART_OPEN ? a->n[PART_OPEN] :
	       k == PART_SEALED ? (uint64_t)a->n[PART_OPEN] + a->n[PART_SEALED] : a->n[PART_SINK];
}

/*
 * The shortfall of an allocation split over parts a[n], as one request of
 * all of them would have had it: for each check, from the first refusal
 * short in it, what that one was short plus what the others asked for that
 * was not granted before it (kvqd counted those as taken).  0 for a check
 * no refusal was short in.
 */
static uint32_t alloc_shortfall(const struct alloc_part *a, uint32_t n)
{
	uint64_t total = 0;

	for (int k = 0; k < 3; k++)
		for (uint32_t g = 0; g < n; g++) {
			uint64_t s = a[g].short_[k];

			if (!a[g].nospc || !s)
				continue;
			for (uint32_t i = 0; i < n; i++)
				if (i != g && !(i < g && a[i].granted))
					s += part_need(&a[i], k);
			total += s;
			break;
		}
	return total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
}

/* Part i's reply: its ids into the caller's arrays at the parts' offsets
 * at[]; KVQ_EPROTOCOL (the connection broken) when it does not match. */
static int alloc_take(kvq_client *c, const Kvq__AllocReply *ar, const struct alloc_part *a, uint32_t at[3],
		      uint32_t *ret_open, uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink,
		      struct kvq_block_ref *refs)
{
	uint32_t *out[KVQ_BLOCK_NCLASS] = { [KVQ_BLOCK_SEALED] = ret_sealed + at[PART_SEALED],
					    [KVQ_BLOCK_SINK] = ret_sink + at[PART_SINK] };
	const size_t nb = (size_t)a->n[PART_SEALED] + a->n[PART_SINK];
	size_t n, k[KVQ_BLOCK_NCLASS] = { 0 };
	int r = kvq_wire_blocks_get(&ar->base, KVQ_WIRE_IDS, refs, nb, &n);

	for (size_t i = 0; r == 0 && i < n; i++)
		k[refs[i].cls]++;
	if (r < 0 || ar->n_open_ids != a->n[PART_OPEN] || ar->n_reserved_ids != a->n[PART_OPEN] ||
	    k[KVQ_BLOCK_SEALED] != a->n[PART_SEALED] || k[KVQ_BLOCK_SINK] != a->n[PART_SINK]) {
		c->conn.broken = true;   /* the daemon holds slots we cannot name: drop them all */
		return client_fail(c, KVQ_EPROTOCOL, "alloc reply with the wrong counts");
	}
	if (ar->n_open_ids) {
		memcpy(ret_open + at[PART_OPEN], ar->open_ids, ar->n_open_ids * sizeof(uint32_t));
		memcpy(ret_reserved + at[PART_OPEN], ar->reserved_ids, ar->n_open_ids * sizeof(uint32_t));
	}
	memset(k, 0, sizeof(k));
	for (size_t i = 0; i < nb; i++)
		out[refs[i].cls][k[refs[i].cls]++] = client_block_id(refs[i]);
	return 0;
}

int client_alloc_many(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t n_sink, uint32_t *ret_open,
		      uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink, uint32_t *ret_short,
		      struct client_count *cnt)
{
	const uint64_t total = (uint64_t)n_open + n_sealed + n_sink;
	const uint32_t nreq = total ? (uint32_t)((total + KVQ_PROTO_MAX_IDS - 1) / KVQ_PROTO_MAX_IDS) : 1;
	uint32_t left[3] = { n_open, n_sealed, n_sink }, at[3] = { 0 }, got[3] = { 0 };
	struct client_pipe pipe = { 0 };
	struct alloc_part *a = NULL;
	struct kvq_block_ref *refs = NULL;
	char msg[sizeof(c->conn.msg)];
	int r, first = 0;

	if (!c || (n_open && (!ret_open || !ret_reserved)) || (n_sealed && !ret_sealed) || (n_sink && !ret_sink))
		return -EINVAL;
	if (ret_short)
		*ret_short = 0;
	/* before the requests: a reply that cannot be read leaves slots no one can name */
	a = calloc(nreq, sizeof(*a));
	refs = calloc((total < KVQ_PROTO_MAX_IDS ? total : KVQ_PROTO_MAX_IDS) + 1, sizeof(*refs));
	if (!a || !refs) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < nreq; i++) {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		Kvq__Alloc q = KVQ__ALLOC__INIT;
		uint32_t room = KVQ_PROTO_MAX_IDS;

		/* open slots first, then sealed, then sink, each request full */
		for (int k = 0; k < 3; k++) {
			a[i].n[k] = left[k] < room ? left[k] : room;
			left[k] -= a[i].n[k];
			room -= a[i].n[k];
		}
		q.n_open = a[i].n[PART_OPEN];
		q.n_sealed = a[i].n[PART_SEALED];
		q.n_sink = a[i].n[PART_SINK];
		e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
		e.alloc = &q;
		r = pipe_queue(c, &pipe, &e);
		if (r < 0)
			goto out;
	}
	r = pipe_send(c, &pipe, cnt);
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < nreq && !c->conn.broken; i++) {
		Kvq__Envelope *rep = NULL;

		r = pipe_reply(c, &pipe, i, KVQ__ENVELOPE__BODY_ALLOC_REPLY, cnt, &rep);
		if (r == 0)
			r = alloc_take(c, rep->alloc_reply, &a[i], at, ret_open, ret_reserved, ret_sealed, ret_sink,
				       refs);
		a[i].granted = r == 0;
		if (r == -ENOSPC && rep) {
			a[i].nospc = true;
			a[i].short_[PART_OPEN] = rep->alloc_reply->short_open;
			a[i].short_[PART_SEALED] = rep->alloc_reply->short_sealed;
			a[i].short_[PART_SINK] = rep->alloc_reply->short_sink;
		}
		kvq_frame_envelope_free(rep);
		keep_first(c, r, &first, msg, sizeof(msg));
		for (int k = 0; k < 3; k++)
			at[k] += a[i].n[k];
	}
	r = first;
	if (r == 0)
		goto out;
	/* all or nothing: what the other requests granted goes back */
	for (uint32_t i = 0; i < nreq; i++) {
		if (a[i].granted)
			give_back(c, a[i].n[PART_SEALED], ret_sealed + got[PART_SEALED], a[i].n[PART_OPEN],
				  ret_open + got[PART_OPEN], cnt);
		if (a[i].granted && a[i].n[PART_SINK])
			give_back(c, a[i].n[PART_SINK], ret_sink + got[PART_SINK], 0, NULL, cnt);
		for (int k = 0; k < 3; k++)
			got[k] += a[i].n[k];
	}
	if (r == -ENOSPC && ret_short)
		*ret_short = alloc_shortfall(a, nreq);
	client_fail(c, r, "%s", msg);
out:
	free(pipe.buf);
	free(refs);
	free(a);
	return r;
}

/* Blocks a prompt's hit can have: max_tokens / B, within a request's ids. */
static uint32_t prompt_ids(const kvq_client *c, const struct client_prompt *p)
{
	const uint32_t n = p->max_tokens / c->L->block_tokens;

	return n < KVQ_PROTO_MAX_IDS ? n : KVQ_PROTO_MAX_IDS;
}

/* Frame bytes a request has for its body's items (the envelope's own
 * fields and the body's tag and length take the rest). */
#define CLIENT_FRAME_ROOM (KVQ_FRAME_MAX - 64u)

/* Bytes a repeated message field's item m takes: tag, length, itself. */
static size_t item_bytes(const ProtobufCMessage *m)
{
	return protobuf_c_message_get_packed_size(m) + 6;
}

/* Prompt i's hit from h into p->ret_ids: 0, or KVQ_EPROTOCOL (the
 * connection broken: references we cannot name). */
static int lookup_take(kvq_client *c, const Kvq__LookupHit *h, struct client_prompt *p, struct kvq_block_ref *refs)
{
	const uint32_t max = prompt_ids(c, p);
	size_t n;
	int r = kvq_wire_blocks_get(&h->base, KVQ_WIRE_CHAIN, refs, max, &n);

	/* a chain: block 0's sink first, when the pool keeps one, and only there */
	for (size_t i = 1; r == 0 && i < n; i++)
		r = refs[i].cls == KVQ_BLOCK_SINK ? -EINVAL : 0;
	if (r < 0) {
		c->conn.broken = true;
		return client_fail(c, KVQ_EPROTOCOL, "lookup reply longer than asked for");
	}
	for (size_t i = 0; i < n; i++)
		p->ret_ids[i] = client_block_id(refs[i]);
	p->ret_n = (uint32_t)n;
	return 0;
}

int client_lookup_many(kvq_client *c, struct client_prompt *p, uint32_t n, struct client_count *cnt)
{
	Kvq__LookupPrompt *lp = NULL, **ptrs = NULL;
	Kvq__Lookup *req = NULL;        /* one per request: [first, first + n) of the prompts */
	uint32_t *first = NULL, nreq = 0, held = 0, *ids = NULL;
	struct client_pipe pipe = { 0 };
	struct kvq_block_ref *refs = NULL;
	char msg[sizeof(c->conn.msg)];
	size_t bytes, longest = 0;
	int r, bad = 0;

	if (!c || !c->L || (n && !p))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if ((p[i].n_tokens && !p[i].tokens) || p[i].max_tokens > p[i].n_tokens ||
		    (p[i].max_tokens >= c->L->block_tokens && !p[i].ret_ids) || p[i].salt_len > KVQ_PROTO_MAX_SALT ||
		    p[i].rid_len > KVQ_PROTO_MAX_REQUEST_ID || (p[i].rid_len && !p[i].rid))
			return -EINVAL;
		else if (prompt_ids(c, &p[i]) > longest)
			longest = prompt_ids(c, &p[i]);
	if (!n)
		return 0;
	r = -ENOMEM;
	lp = calloc(n, sizeof(*lp));
	ptrs = calloc(n, sizeof(*ptrs));
	req = calloc(n, sizeof(*req));
	first = calloc(n, sizeof(*first));
	refs = calloc(longest + 1, sizeof(*refs));
	if (!lp || !ptrs || !req || !first || !refs)
		goto out;
	/* prompts in order, as many to a request as the limits allow */
	bytes = 0;
	for (uint32_t i = 0, ni = 0, nt = 0; i < n; i++) {
		const uint32_t k = prompt_ids(c, &p[i]);
		size_t b;

		kvq__lookup_prompt__init(&lp[i]);
		lp[i].n_tokens = p[i].n_tokens;
		lp[i].tokens = (uint32_t *)p[i].tokens;
		lp[i].max_tokens = p[i].max_tokens;
		lp[i].salt.data = (uint8_t *)p[i].salt;
		lp[i].salt.len = p[i].salt ? p[i].salt_len : 0;
		lp[i].request_id.data = (uint8_t *)p[i].rid;
		lp[i].request_id.len = p[i].rid_len;
		ptrs[i] = &lp[i];
		b = item_bytes(&lp[i].base);
		if (!nreq || req[nreq - 1].n_prompts == KVQ_PROTO_MAX_PROMPTS || ni + k > KVQ_PROTO_MAX_IDS ||
		    (uint64_t)nt + p[i].n_tokens > KVQ_PROTO_MAX_TOKENS || bytes + b > CLIENT_FRAME_ROOM) {
			kvq__lookup__init(&req[nreq]);
			req[nreq].prompts = &ptrs[i];
			first[nreq++] = i;
			ni = nt = 0;
			bytes = 0;
		}
		req[nreq - 1].n_prompts++;
		ni += k;
		nt += p[i].n_tokens;
		bytes += b;
	}
	for (uint32_t q = 0; q < nreq; q++) {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;

		e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
		e.lookup = &req[q];
		r = pipe_queue(c, &pipe, &e);
		if (r < 0)
			goto out;
	}
	r = pipe_send(c, &pipe, cnt);
	if (r < 0)
		goto out;
	/* every prompt's ids, for a failure's Release: the hits of the requests that succeeded */
	for (uint32_t q = 0; q < nreq && !c->conn.broken; q++) {
		Kvq__Envelope *rep = NULL;
		const uint32_t np = (uint32_t)req[q].n_prompts;

		r = pipe_reply(c, &pipe, q, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, cnt, &rep);
		if (r == 0 && rep->lookup_reply->n_hits != np) {
			c->conn.broken = true;
			r = client_fail(c, KVQ_EPROTOCOL, "lookup reply with %zu hits for %u prompts",
					rep->lookup_reply->n_hits, np);
		}
		for (uint32_t i = 0; r == 0 && i < np; i++)
			r = lookup_take(c, rep->lookup_reply->hits[i], &p[first[q] + i], refs);
		kvq_frame_envelope_free(rep);
		if (r == 0)
			for (uint32_t i = 0; i < np; i++)
				held += p[first[q] + i].ret_n;
		else
			req[q].n_prompts = 0;   /* none of its prompts holds anything */
		keep_first(c, r, &bad, msg, sizeof(msg));
	}
	r = bad;
	if (r == 0)
		goto out;
	/* all or nothing: the hits of the requests that succeeded go back */
	ids = malloc(((size_t)held + 1) * sizeof(*ids));
	if (!ids) {
		c->conn.broken = true;   /* closing drops them */
		goto out;
	}
	for (uint32_t q = 0; q < nreq; q++) {
		uint32_t m = 0;

		for (uint32_t i = 0; i < req[q].n_prompts; i++) {
			memcpy(ids + m, p[first[q] + i].ret_ids, p[first[q] + i].ret_n * sizeof(*ids));
			m += p[first[q] + i].ret_n;
		}
		give_back(c, m, ids, 0, NULL, cnt);
	}
	client_fail(c, r, "%s", msg);
out:
	free(pipe.buf);
	free(ids);
	free(refs);
	free(first);
	free(req);
	free(ptrs);
	free(lp);
	return r;
}

/* A chain's progress over the rounds of a commit: blocks [done, done + n)
 * go in this round's request req. */
struct chain_part {
	uint32_t done, n, req;
	bool failed;
};

/* Block i of chain ch as PublishBlock b: its id, its parent prev (-1:
 * none), its tokens and salt.  0 or -EINVAL. */
static int chain_block(const kvq_client *c, const struct client_chain *ch, uint32_t i, int64_t prev,
		       Kvq__PublishBlock *b)
{
	const struct kvq_block_ref id = client_block_ref(ch->ids[i]);
	const struct kvq_block_ref par = client_block_ref((uint32_t)prev);
	const uint32_t B = c->L->block_tokens;

	kvq__publish_block__init(b);
	if (kvq_wire_blocks_put(&b->base, KVQ_WIRE_BLOCK, &id, 1, NULL) < 0 ||
	    kvq_wire_blocks_put(&b->base, KVQ_WIRE_PARENT, &par, prev >= 0, NULL) < 0)
		return -EINVAL;
	b->n_tokens = B;
	b->tokens = (uint32_t *)ch->tokens + (size_t)i * B;
	b->salt.data = (uint8_t *)ch->salt;
	b->salt.len = ch->salt ? ch->salt_len : 0;
	return 0;
}

/* A chain kvq_client_publish would take: 0 or -EINVAL. */
static int chain_ok(const kvq_client *c, const struct client_chain *ch)
{
	if (!c->L || !ch->n || !ch->ids || !ch->tokens || !ch->ret_ids || ch->salt_len > KVQ_PROTO_MAX_SALT ||
	    ch->parent > (int64_t)UINT32_MAX)
		return -EINVAL;
	/* ids carry their class (KVQ_SINK_ID); a sink can start a chain only */
	for (uint32_t i = 1; i < ch->n; i++)
		if (client_block_ref(ch->ids[i]).cls == KVQ_BLOCK_SINK)
			return -EINVAL;
	return 0;
}

/* Queues the Seal requests of a commit: pairs within KVQ_PROTO_MAX_IDS
 * each, the first carrying the attention report when one is due (rep,
 * bins, ptrs: its room; *ret_report whether it went); with no pair, one
 * Seal when mode asks (for the report alone: CLIENT_SEAL_DUE).  Returns
 * the number queued in *ret_n, 0 or pipe_queue's error. */
static int commit_seals(kvq_client *c, struct client_pipe *pipe, uint32_t n, const uint32_t *open_ids,
			const uint32_t *sealed_ids, enum client_seal mode, Kvq__AttentionReport *rep,
			Kvq__AttentionBin *bins, Kvq__AttentionBin **ptrs, bool *ret_report, uint32_t *ret_n)
{
	const bool report = mode != CLIENT_SEAL_NONE && timing_due(c);
	uint32_t k = 0;

	*ret_report = false;
	*ret_n = 0;
	if (report)
		timing_report(c, rep, bins, ptrs);
	else if (!n && mode != CLIENT_SEAL_ALWAYS)
		return 0;
	do {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		Kvq__Seal s = KVQ__SEAL__INIT;
		const uint32_t m = n - k < KVQ_PROTO_MAX_IDS ? n - k : KVQ_PROTO_MAX_IDS;
		int r;

		s.n_open_ids = s.n_sealed_ids = m;
		s.open_ids = (uint32_t *)open_ids + k;
		s.sealed_ids = (uint32_t *)sealed_ids + k;
		/* the timings ride along once their interval has passed */
		if (report && k == 0)
			s.attention = rep;
		e.body_case = KVQ__ENVELOPE__BODY_SEAL;
		e.seal = &s;
		r = pipe_queue(c, pipe, &e);
		if (r < 0)
			return r;
		*ret_report = report;
		++*ret_n;
		k += m;
	} while (k < n);
	return 0;
}

/* Queues a Publish of blocks bp[n]. */
static int commit_publish(kvq_client *c, struct client_pipe *pipe, Kvq__PublishBlock **bp, size_t n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Publish q = KVQ__PUBLISH__INIT;

	q.n_blocks = n;
	q.blocks = bp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &q;
	return pipe_queue(c, pipe, &e);
}

/* Whether n blocks of B tokens and bytes bytes fit one Publish. */
static bool publish_fits(size_t n, uint32_t B, size_t bytes)
{
	return n <= KVQ_PROTO_MAX_IDS && (uint64_t)n * B <= KVQ_PROTO_MAX_TOKENS && bytes <= CLIENT_FRAME_ROOM;
}

/*
 * Queues the Publish requests of one round: each chain's next part in
 * order, whole chains packed greedily into requests within the limits
 * (publish_fits); a chain too long for a request of its own sends what
 * fits and continues next round, its first block then naming the id its
 * predecessor was published as.  b and bp have room for every block.
 * Returns 0 with *ret_n the requests queued, or -EINVAL, pipe_queue's error.
 */
static int commit_round(kvq_client *c, struct client_pipe *pipe, const struct client_chain *ch,
			struct chain_part *part, uint32_t n_chains, Kvq__PublishBlock *b, Kvq__PublishBlock **bp,
			uint32_t *ret_n)
{
	const uint32_t B = c->L->block_tokens;
	size_t used = 0, first = 0, bytes = 0;   /* bp[first, used): the open request's blocks */
	uint32_t nreq = 0;
	int r;

	for (uint32_t i = 0; i < n_chains; i++) {
		struct chain_part *q = &part[i];
		const uint32_t m = ch[i].n - q->done;
		size_t all = 0;

		q->n = 0;
		if (q->failed || !m)
			continue;
		for (uint32_t k = 0; k < m; k++) {
			const uint32_t at = q->done + k;
			/* a continuation's first block: its predecessor as published */
			const int64_t prev = at == 0 ? ch[i].parent : k == 0 ? ch[i].ret_ids[at - 1] : ch[i].ids[at - 1];

			if (chain_block(c, &ch[i], at, prev, &b[used + k]) < 0)
				return -EINVAL;
			all += item_bytes(&b[used + k].base);
		}
		/* whole chains together: one that does not fit starts a request */
		if (used > first && !publish_fits(used - first + m, B, bytes + all)) {
			r = commit_publish(c, pipe, bp + first, used - first);
			if (r < 0)
				return r;
			nreq++;
			first = used;
			bytes = 0;
		}
		for (uint32_t k = 0; k < m; k++) {
			const size_t nb = item_bytes(&b[used].base);

			if (!publish_fits(used - first + 1, B, bytes + nb))
				break;
			bp[used] = &b[used];
			used++;
			bytes += nb;
			q->n++;
		}
		q->req = nreq;
		if (q->n < m) {
			/* the request is full; the rest of the chain waits for its reply */
			r = commit_publish(c, pipe, bp + first, used - first);
			if (r < 0)
				return r;
			nreq++;
			first = used;
			bytes = 0;
		}
	}
	if (used > first) {
		r = commit_publish(c, pipe, bp + first, used - first);
		if (r < 0)
			return r;
		nreq++;
	}
	*ret_n = nreq;
	return 0;
}

/* The reply to a round's Publish request req: the ids of each chain's part
 * in it into its ret_ids; KVQ_EPROTOCOL (the connection broken) when the
 * count differs. */
static int commit_take(kvq_client *c, const Kvq__PublishReply *rep, struct client_chain *ch, struct chain_part *part,
		       uint32_t n_chains, uint32_t req)
{
	size_t n = 0, at = 0;

	for (uint32_t i = 0; i < n_chains; i++)
		if (part[i].n && part[i].req == req)
			n += part[i].n;
	if (rep->n_ids != n) {
		c->conn.broken = true;
		return client_fail(c, KVQ_EPROTOCOL, "publish reply with the wrong count");
	}
	for (uint32_t i = 0; i < n_chains; i++) {
		struct chain_part *q = &part[i];

		if (!q->n || q->req != req)
			continue;
		/* a reply id is an index in its block's class */
		for (uint32_t k = q->done; k < q->done + q->n; k++) {
			struct kvq_block_ref got = client_block_ref(ch[i].ids[k]);

			got.index = rep->ids[at++];
			ch[i].ret_ids[k] = client_block_id(got);
		}
		q->done += q->n;
		ch[i].published = q->done == ch[i].n;
	}
	return 0;
}

/* A round's requests failed: its chains' parts with it. */
static void commit_failed(struct chain_part *part, uint32_t n_chains, uint32_t req)
{
	for (uint32_t i = 0; i < n_chains; i++)
		if (part[i].n && part[i].req == req)
			part[i].failed = true;
}

static int client_commit_run(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
			     struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt,
			     enum client_seal mode)
{
	uint32_t seals_ok = 0;
	Kvq__AttentionReport rep;
	Kvq__AttentionBin bins[KVQ_PROTO_MAX_TIMING_BINS], *bptrs[KVQ_PROTO_MAX_TIMING_BINS];
	struct client_pipe pipe = { 0 };
	struct chain_part *part = NULL;
	Kvq__PublishBlock *b = NULL, **bp = NULL;
	char msg[sizeof(c->conn.msg)];
	uint32_t n_seals = 0, n_pub = 0, total_seals = 0;
	size_t blocks = 0;
	bool report = false;
	int r, bad = 0;

	if (!c || (n_seal && (!open_ids || !sealed_ids)) || (n_chains && !chains))
		return -EINVAL;
	for (uint32_t i = 0; i < n_chains; i++) {
		if (chain_ok(c, &chains[i]) < 0)
			return -EINVAL;
		chains[i].published = false;
		blocks += chains[i].n;
	}
	r = -ENOMEM;
	part = calloc(n_chains + 1, sizeof(*part));
	b = calloc(blocks + 1, sizeof(*b));
	bp = calloc(blocks + 1, sizeof(*bp));
	if (!part || !b || !bp)
		goto out;
	/* the first round: the Seals, then every chain's first part */
	r = commit_seals(c, &pipe, n_seal, open_ids, sealed_ids, mode, &rep, bins, bptrs, &report, &n_seals);
	total_seals = n_seals;
	if (r == 0 && n_chains)
		r = commit_round(c, &pipe, chains, part, n_chains, b, bp, &n_pub);
	while (r == 0 && n_seals + n_pub) {
		r = pipe_send(c, &pipe, cnt);
		for (uint32_t i = 0; r == 0 && i < n_seals; i++) {
			int s = pipe_reply(c, &pipe, i, KVQ__ENVELOPE__BODY_SEAL_REPLY, cnt, NULL);

			if (s == 0 && i == 0 && report)
				timing_sent(c);
			seals_ok += s == 0;
			/* a Seal for the timings alone fails no commit */
			if (n_seal || mode == CLIENT_SEAL_ALWAYS)
				keep_first(c, s, &bad, msg, sizeof(msg));
			r = c->conn.broken ? s : 0;
		}
		for (uint32_t q = 0; r == 0 && q < n_pub; q++) {
			Kvq__Envelope *e = NULL;
			int s = pipe_reply(c, &pipe, n_seals + q, KVQ__ENVELOPE__BODY_PUBLISH_REPLY, cnt, &e);

			if (s == 0)
				s = commit_take(c, e->publish_reply, chains, part, n_chains, q);
			if (s < 0)
				commit_failed(part, n_chains, q);
			kvq_frame_envelope_free(e);
			keep_first(c, s, &bad, msg, sizeof(msg));
			r = c->conn.broken ? s : 0;
		}
		/* the next rounds: the continuations of chains too long for a request */
		n_seals = n_pub = 0;
		if (r == 0)
			r = commit_round(c, &pipe, chains, part, n_chains, b, bp, &n_pub);
	}
	if (r == 0 && bad < 0) {
		r = bad;
		client_fail(c, r, "%s", msg);
	}
out:
	/* the first round's Seals: every one, or no pair to seal */
	if (ret_sealed)
		*ret_sealed = !n_seal || (total_seals && seals_ok == total_seals);
	free(pipe.buf);
	free(bp);
	free(b);
	free(part);
	return r;
}

int client_commit(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
		  struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt)
{
	return client_commit_run(c, n_seal, open_ids, sealed_ids, chains, n_chains, ret_sealed, cnt,
				 CLIENT_SEAL_DUE);
}
