/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's connection to kvqd (kvq_client_*): connect, attach (the map is
 * the pool's backend's: client_host, client_cuda) and the block requests,
 * the single ones through the batched ones (client/batched.c).
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

int client_fail(kvq_client *c, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->conn.msg, sizeof(c->conn.msg), fmt, ap);
	va_end(ap);
	return r;
}

/* What kvq_client_attach was asked, its strings copied: attached again
 * after a lost connection (client_recover). */
struct client_attach {
	struct kvq_attach_params p;
	char *str[5];
};

static void again_free(struct client_attach *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < sizeof a->str / sizeof a->str[0]; i++)
		free(a->str[i]);
	free(a);
}

static struct client_attach *again_new(const struct kvq_attach_params *p)
{
	struct client_attach *a = calloc(1, sizeof *a);
	const char **f[5];

	if (!a)
		return NULL;
	a->p = *p;
	f[0] = &a->p.pool, f[1] = &a->p.model_id, f[2] = &a->p.policy, f[3] = &a->p.backend, f[4] = &a->p.codebooks;
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
		if (*f[i] && !(*f[i] = a->str[i] = strdup(*f[i]))) {
			again_free(a);
			return NULL;
		}
	return a;
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
	/* kept for the Hello of a new connection (client_recover) */
	if (strlen(name ? name : "libkvq") >= sizeof(c->name)) {
		free(c);
		return -EINVAL;
	}
	snprintf(c->name, sizeof(c->name), "%s", name ? name : "libkvq");
	kvq_conn_init(&c->conn, CLIENT_TIMEOUT_MS);
	r = kvq_conn_open(&c->conn, path, c->name);
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
	again_free(c->again);
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

/* Sends p's Attach (replaces: a lost connection's holder, 0 none) and
 * reads its reply into *ret_rep; the descriptor it carries is in
 * c->conn.pool_fd. */
static int attach_send(kvq_client *c, const struct kvq_attach_params *p, uint64_t replaces, Kvq__Envelope **ret_rep)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	char err[256];
	int r, cb_fd = -1;

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
	a.replaces = replaces;
	if (p->create) {
		pc.n_sealed = p->n_sealed;
		pc.n_open = p->n_open;
		pc.n_sink = c->n_sink;
		pc.backend = (char *)(p->backend ? p->backend : "");
		pc.device = p->device;
		pc.host_capacity = p->host_capacity;
		a.create = &pc;
	}
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = kvq_conn_call_fd(&c->conn, &e, cb_fd, KVQ__ENVELOPE__BODY_ATTACH_REPLY, ret_rep);
	if (cb_fd >= 0)
		close(cb_fd);
	return r;
}

/* The attach reply of pool checked: its backend, its policy and the layout
 * made from it. */
static int attach_check(kvq_client *c, const char *pool, const Kvq__AttachReply *ar,
			const struct client_backend **ret_be, struct kvq_policy *pol, struct kvq_layout **ret_L)
{
	const struct client_backend *be;
	struct kvq_layout_params lp;
	struct kvq_layout *L = NULL;
	char err[256];

	be = !strcmp(ar->backend, client_host.name) ? &client_host
	     : !strcmp(ar->backend, client_cuda.name) ? &client_cuda : NULL;
	if (!be)
		return client_fail(c, KVQ_EPROTOCOL, "pool %s is on an unknown backend '%s'", pool, ar->backend);
	/* never a silent host fallback on device memory */
	if (!be->compiled)
		return client_fail(c, -ENOTSUP, "pool %s is on the cuda backend; this libkvq was built without CUDA",
				   pool);
	if (c->conn.pool_fd < 0 || ar->map_bytes < ar->total_bytes || ar->map_bytes > SIZE_MAX)
		return client_fail(c, KVQ_EPROTOCOL, "attach reply without a descriptor or with a bad size");
	if (kvq_policy_parse(ar->policy, ar->layers, pol, err, sizeof(err)) < 0)
		return client_fail(c, KVQ_EPROTOCOL, "pool policy '%s': %s", ar->policy, err);
	lp = (struct kvq_layout_params){ .layers = ar->layers, .kv_heads = ar->kv_heads, .head_dim = ar->head_dim,
		.block_tokens = ar->block_tokens, .window = ar->window, .n_sealed = ar->n_sealed,
		.n_open = ar->n_open, .act = (int)ar->act, .policy = pol, .sink_blocks = ar->sink_blocks,
		.n_sink = ar->n_sink };
	if (ar->layout_version != KVQ_LAYOUT_VERSION)
		return client_fail(c, KVQ_ELAYOUT, "pool layout version %u, libkvq has %u", ar->layout_version,
				   KVQ_LAYOUT_VERSION);
	if (kvq_layout_new(&lp, &L, err, sizeof(err)) < 0)
		return client_fail(c, KVQ_ELAYOUT, "pool layout: %s", err);
	if (L->n_sink && !be->sinks) {
		kvq_layout_free(L);
		return client_fail(c, -ENOTSUP, "pool %s keeps sink blocks: this libkvq's %s kernels do not read them",
				   pool, be->name);
	}
	if (L->total_bytes != ar->total_bytes || L->window != ar->window) {
		client_fail(c, KVQ_ELAYOUT, "pool layout: kvqd counts %llu bytes, libkvq %llu",
			    (unsigned long long)ar->total_bytes, (unsigned long long)L->total_bytes);
		kvq_layout_free(L);
		return KVQ_ELAYOUT;
	}
	*ret_be = be;
	*ret_L = L;
	return 0;
}

/* The checked reply's pool is the client's: mapped unless keep (the
 * mapping already made of the same memory), the layout (*L, taken) and the
 * connection's names. */
static int attach_take(kvq_client *c, const char *pool, const Kvq__AttachReply *ar,
		       const struct client_backend *be, const struct kvq_policy *pol, struct kvq_layout **L, bool keep)
{
	int r;

	if (!keep) {
		r = be->map(c, c->conn.pool_fd, ar->map_bytes, ar->device, ar->device_uuid.data, ar->device_uuid.len);
		if (r < 0)
			return r;
		/* the mapping keeps the memory: the caller closes the descriptor */
		c->be = be;
		c->pol = *pol;
		kvq_layout_free(c->L);
		c->L = *L;
		*L = NULL;
		snprintf(c->backend, sizeof(c->backend), "%s", ar->backend);
		snprintf(c->pool, sizeof(c->pool), "%s", pool);
	}
	c->holder = ar->holder;
	c->memory_id = ar->memory_id;
	c->timing.report_ms = ar->attention_report_ms;
	timing_sent(c);
	return 0;
}

/* What one attach leaves besides the client's state: the descriptor the
 * reply carried, a layout not taken, the reply. */
static void attach_end(kvq_client *c, struct kvq_layout *L, Kvq__Envelope *rep)
{
	if (c->conn.pool_fd >= 0) {
		close(c->conn.pool_fd);
		c->conn.pool_fd = -1;
	}
	kvq_layout_free(L);
	kvq_frame_envelope_free(rep);
}

int client_attach(kvq_client *c, const struct kvq_attach_params *p)
{
	const struct client_backend *be;
	struct kvq_layout *L = NULL;
	struct client_attach *again;
	Kvq__Envelope *rep = NULL;
	struct kvq_policy pol;
	int r;

	if (!c || !p || !p->pool || !p->model_id || !p->policy)
		return -EINVAL;
	if (c->base || c->L)
		return client_fail(c, -EISCONN, "already attached to pool %s", c->pool);
	if (!(again = again_new(p)))
		return -ENOMEM;
	r = attach_send(c, p, 0, &rep);
	if (r == 0)
		r = attach_check(c, p->pool, rep->attach_reply, &be, &pol, &L);
	if (r == 0)
		r = attach_take(c, p->pool, rep->attach_reply, be, &pol, &L, false);
	if (r == 0) {
		c->again = again;
		again = NULL;
	}
	again_free(again);
	attach_end(c, L, rep);
	return r;
}

int client_recover(kvq_client *c)
{
	const struct client_backend *be;
	const Kvq__AttachReply *ar;
	struct kvq_layout *L = NULL;
	Kvq__Envelope *rep = NULL;
	struct kvq_policy pol;
	char path[sizeof(c->conn.path)], msg[sizeof(c->conn.msg)];
	bool keep;
	int r;

	if (!c->conn.broken)
		return 0;
	if (!c->again)
		return client_fail(c, -ENOTCONN, "connection to kvqd lost earlier");
	/* the sequences of before are stale from here on (seq_live), and no
	 * kernel of theirs runs once the new connection releases their slots */
	c->epoch++;
	if (c->be)
		c->be->drain(c);
	snprintf(path, sizeof path, "%s", c->conn.path);
	kvq_conn_close(&c->conn);
	r = kvq_conn_open(&c->conn, path, c->name);
	if (r == 0)
		r = attach_send(c, &c->again->p, c->holder, &rep);
	if (r == 0)
		r = attach_check(c, c->again->p.pool, rep->attach_reply, &be, &pol, &L);
	if (r == 0) {
		ar = rep->attach_reply;
		/* the same memory (a restart that kept it): the mapping stays */
		keep = c->be == be && c->base && ar->memory_id && ar->memory_id == c->memory_id &&
		       ar->map_bytes == c->map_bytes && L->total_bytes == c->L->total_bytes;
		if (!keep && c->be) {
			c->be->unmap(c);
			c->be = NULL;
			c->base = NULL;
		}
		r = attach_take(c, c->again->p.pool, ar, be, &pol, &L, keep);
	}
	attach_end(c, L, rep);
	if (r < 0) {
		/* the next request tries again (conn.path is kept) */
		snprintf(msg, sizeof msg, "%s", c->conn.msg);
		c->conn.broken = true;
		client_fail(c, r, "connection to kvqd lost; connecting again: %.*s", (int)(sizeof msg - 64), msg);
	}
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
	if ((r = client_recover(c)) < 0)
		return r;
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
	if ((r = client_recover(c)) < 0)
		return r;
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
	if ((r = client_recover(c)) < 0)
		return r;
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
