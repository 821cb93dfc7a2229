/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the fuzzers' seed corpus (tests/fuzz/corpus/): sessions of real
 * requests, encoded as clients send them and answered by the daemon's
 * table in process (tests/inproc.h), each request built from the replies
 * before it (the ids Alloc gave, the chain Publish made).  Each session is
 * one input of fuzz_request (records as that target reads them, with the
 * same four connections) and one of fuzz_frame (a chunking byte, then
 * every request and reply frame of the session); a few framing faults are
 * added for fuzz_frame.  Usage: fuzz-seeds FRAME_DIR REQUEST_DIR
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_state.h"
#include "timing_buckets.h"

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static struct inproc t;
static struct kvq_conn *slot[FUZZ_SLOTS];
static uid_t slot_uid[FUZZ_SLOTS];
static struct buf frames, records;
static const char *frame_dir, *request_dir;
static uint32_t tokens[4 * INPROC_B];

static void put(struct buf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p) {
			perror("fuzz-seeds");
			exit(1);
		}
	}
	if (n)   /* an empty payload may come with p NULL */
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

static void record(uint8_t op, const uint8_t *payload, size_t len)
{
	uint8_t hdr[3] = { op, (uint8_t)len, (uint8_t)(len >> 8) };

	if (len > 0xffff) {
		fprintf(stderr, "fuzz-seeds: a request of %zu bytes\n", len);
		exit(1);
	}
	put(&records, hdr, sizeof(hdr));
	put(&records, payload, len);
}

static void frame_of(const Kvq__Envelope *e)
{
	uint8_t *b;
	size_t n;

	if (kvq_frame_encode_alloc(e, &b, &n) < 0) {
		fprintf(stderr, "fuzz-seeds: an envelope does not encode\n");
		exit(1);
	}
	put(&frames, b, n);
	free(b);
}

static struct kvq_conn *conn_new(int s)
{
	struct kvq_conn *c = inproc_conn(&t, slot_uid[s]);

	if (!c) {
		fprintf(stderr, "fuzz-seeds: no connection\n");
		exit(1);
	}
	return c;
}

/* Sends e from slot s as fuzz_request will: returns the status, *r the
 * reply (kvq_reply_fini it). */
static int call(int s, Kvq__Envelope *e, struct kvq_reply *r)
{
	uint8_t *b;
	size_t n, row;

	e->id = ++t.next_req;
	if (kvq_frame_encode_alloc(e, &b, &n) < 0) {
		fprintf(stderr, "fuzz-seeds: a request does not encode\n");
		exit(1);
	}
	record((uint8_t)s, b + KVQ_FRAME_HDR, n - KVQ_FRAME_HDR);
	put(&frames, b, n);
	kvq_dispatch_frame(t.rows, t.n_rows, slot[s], b + KVQ_FRAME_HDR, n - KVQ_FRAME_HDR, -1, r, &row);
	free(b);
	frame_of(&r->e);
	if (getenv("KVQ_TEST_VERBOSE"))
		fprintf(stderr, "slot %d: body %d: %d %s\n", s, (int)e->body_case, r->e.status,
			r->e.message ? r->e.message : "");
	if (r->close_after) {
		kvq_state_conn_free(slot[s]);
		slot[s] = conn_new(s);
	}
	return r->e.status;
}

static int status(int s, Kvq__Envelope *e)
{
	struct kvq_reply r;
	int st = call(s, e, &r);

	kvq_reply_fini(&r);
	return st;
}

/* op 5 (close), 6 (exiting) or 7 (an exiting one goes), as fuzz_request
 * reads them. */
static void event(int s, int what)
{
	record((uint8_t)(what << 2 | s), NULL, 0);
	if (what == 7) {
		if (t.st.dying)
			kvq_state_conn_free(t.st.dying);
		return;
	}
	if (what == 5)
		kvq_state_conn_free(slot[s]);
	else
		kvq_state_conn_exiting(slot[s]);
	slot[s] = conn_new(s);
}

static int hello(int s, uint32_t version)
{
	Kvq__Envelope e;
	Kvq__Hello h;

	inproc_hello_req(&e, &h, version);
	return status(s, &e);
}

static int attach(int s, const char *pool, bool create)
{
	Kvq__PoolCreate pc;
	Kvq__Attach a;
	Kvq__Envelope e;

	inproc_attach_req(&e, &a, &pc, pool, create);
	return status(s, &e);
}

/* An Attach that creates pool with policy, announcing codebooks or not: no
 * descriptor comes in process, so a codebook policy is refused either way
 * (kvq.proto, "File descriptors"), and so is an announcement. */
static int attach_codebooks(int s, const char *pool, const char *policy, bool announce)
{
	Kvq__PoolCreate pc;
	Kvq__Attach a;
	Kvq__Envelope e;

	inproc_attach_req(&e, &a, &pc, pool, true);
	a.policy = (char *)policy;
	a.codebooks = announce;
	return status(s, &e);
}

static int alloc(int s, uint32_t n_open, uint32_t n_sealed, uint32_t *ret_open, uint32_t *ret_resv,
		 uint32_t *ret_sealed)
{
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct kvq_reply r;
	int st;

	a.n_open = n_open;
	a.n_sealed = n_sealed;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	st = call(s, &e, &r);
	if (st == 0) {
		memcpy(ret_open, r.e.alloc_reply->open_ids, n_open * sizeof(uint32_t));
		memcpy(ret_resv, r.e.alloc_reply->reserved_ids, n_open * sizeof(uint32_t));
		memcpy(ret_sealed, r.e.alloc_reply->sealed_ids, n_sealed * sizeof(uint32_t));
	}
	kvq_reply_fini(&r);
	return st;
}

static int seal(int s, uint32_t *open, uint32_t *sealed, size_t n)
{
	Kvq__Seal q = KVQ__SEAL__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	q.n_open_ids = q.n_sealed_ids = n;
	q.open_ids = open;
	q.sealed_ids = sealed;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &q;
	return status(s, &e);
}

/* An empty Seal with an attention report: a bin of the pool's pair and one
 * of a pair it lacks (dropped). */
static int seal_report(int s)
{
	static uint64_t buckets[2][KVQ_TIMING_BUCKETS + 1] = { { [4] = 3 }, { [10] = 1 } };
	Kvq__AttentionBin b[2], *pb[2] = { &b[0], &b[1] };
	Kvq__AttentionReport rep = KVQ__ATTENTION_REPORT__INIT;
	Kvq__Seal q = KVQ__SEAL__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	for (int i = 0; i < 2; i++) {
		kvq__attention_bin__init(&b[i]);
		b[i].phase = (uint32_t)i;
		b[i].k_format = i ? "f16" : "int8";
		b[i].v_format = i ? "f16" : "int8";
		b[i].n_buckets = KVQ_TIMING_BUCKETS + 1;
		b[i].buckets = buckets[i];
		b[i].seconds = i ? 6e-5 : 1.2e-5;
		b[i].kv_bytes = 4096;
	}
	rep.n_bins = 2;
	rep.bins = pb;
	q.attention = &rep;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &q;
	return status(s, &e);
}

/* ids[n] as a chain of token blocks 0, 1, ... (salted when salt); the ids
 * to use come back in ids. */
static int publish(int s, uint32_t *ids, size_t n, const char *salt)
{
	Kvq__PublishBlock b[4], *pb[4];
	Kvq__Publish q;
	Kvq__Envelope e;
	struct kvq_reply r;
	int st;

	inproc_publish_req(&e, &q, b, pb, ids, n, tokens, salt);
	st = call(s, &e, &r);
	if (st == 0)
		memcpy(ids, r.e.publish_reply->ids, n * sizeof(uint32_t));
	kvq_reply_fini(&r);
	return st;
}

static int lookup(int s, uint32_t n_tokens, uint32_t *ret_ids, size_t *ret_n)
{
	Kvq__Lookup q = KVQ__LOOKUP__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct kvq_reply r;
	int st;

	q.n_tokens = n_tokens;
	q.tokens = tokens;
	q.max_tokens = n_tokens;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &q;
	st = call(s, &e, &r);
	*ret_n = 0;
	if (st == 0) {
		*ret_n = r.e.lookup_reply->n_sealed_ids;
		memcpy(ret_ids, r.e.lookup_reply->sealed_ids, *ret_n * sizeof(uint32_t));
	}
	kvq_reply_fini(&r);
	return st;
}

static int release(int s, uint32_t *sealed, size_t n_sealed, uint32_t *open, size_t n_open)
{
	Kvq__Release q = KVQ__RELEASE__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	q.n_sealed_ids = n_sealed;
	q.sealed_ids = sealed;
	q.n_open_ids = n_open;
	q.open_ids = open;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &q;
	return status(s, &e);
}

static int fork_ids(int s, uint32_t *ids, size_t n)
{
	Kvq__Fork q = KVQ__FORK__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	q.n_sealed_ids = n;
	q.sealed_ids = ids;
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &q;
	return status(s, &e);
}

static int stats(int s, const char *pool)
{
	Kvq__Stats q = KVQ__STATS__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	q.pool = (char *)pool;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &q;
	return status(s, &e);
}

static int admin(int s, Kvq__Envelope__BodyCase body, const char *pool)
{
	Kvq__Evict ev = KVQ__EVICT__INIT;
	Kvq__PoolDrop pd = KVQ__POOL_DROP__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	Kvq__Attach spec = KVQ__ATTACH__INIT;
	Kvq__PoolAdd pa = KVQ__POOL_ADD__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	uint32_t acl = slot_uid[1];

	e.body_case = body;
	ev.pool = pd.pool = spec.pool = (char *)pool;
	e.evict = &ev;
	if (body == KVQ__ENVELOPE__BODY_POOL_DROP) {
		e.pool_drop = &pd;
	} else if (body == KVQ__ENVELOPE__BODY_POOL_ADD) {
		pc.n_sealed = 8;
		pc.n_open = 2;
		pc.backend = "host";
		pc.device = -1;
		spec.model_id = INPROC_MODEL;
		/* "added" is attachable as the sessions attach; others get a mixed policy */
		spec.policy = strcmp(pool, "added") ? "0-0:k=int8,v=int4g32;1-1:int8" : "int8";
		spec.layers = INPROC_L;
		spec.kv_heads = INPROC_H;
		spec.head_dim = INPROC_D;
		spec.block_tokens = INPROC_B;
		spec.act = strcmp(pool, "added") ? KVQ__DTYPE__DTYPE_BF16 : KVQ__DTYPE__DTYPE_F16;
		spec.layout_version = KVQ_LAYOUT_VERSION;
		spec.create = &pc;
		pa.spec = &spec;
		pa.n_acl_uids = 1;
		pa.acl_uids = &acl;
		e.pool_add = &pa;
	}
	return status(s, &e);
}

/* A request on the pool with sink blocks (fuzz_state.h): an Alloc of one
 * sink, one open and one sealed slot. */
static int alloc_sink(int s, uint32_t *sink, uint32_t *open, uint32_t *resv, uint32_t *sealed)
{
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct kvq_reply r;
	int st;

	a.n_open = a.n_sealed = a.n_sink = 1;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	st = call(s, &e, &r);
	if (st == 0) {
		*sink = r.e.alloc_reply->sink_ids[0];
		*open = r.e.alloc_reply->open_ids[0];
		*resv = r.e.alloc_reply->reserved_ids[0];
		*sealed = r.e.alloc_reply->sealed_ids[0];
	}
	kvq_reply_fini(&r);
	return st;
}

/* A chain of token blocks 0, 1, ...: sink (unless it is -1, then the first
 * of sealed[n] starts it), then sealed[n]. */
static int publish_sink(int s, int64_t sink, uint32_t *sealed, size_t n)
{
	Kvq__PublishBlock b[4], *pb[4];
	Kvq__Publish q = KVQ__PUBLISH__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	size_t nb = 0;

	for (size_t i = 0; i < n + (sink >= 0); i++, nb++) {
		kvq__publish_block__init(&b[i]);
		b[i].n_tokens = INPROC_B;
		b[i].tokens = tokens + i * INPROC_B;
		pb[i] = &b[i];
		if (sink >= 0 && i == 0) {
			b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID;
			b[i].sink_id = (uint32_t)sink;
			continue;
		}
		b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
		b[i].sealed_id = sealed[i - (sink >= 0)];
		if (sink >= 0 && i == 1) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_SINK_ID;
			b[i].parent_sink_id = (uint32_t)sink;
		} else if (i) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			b[i].parent_id = sealed[i - 1 - (sink >= 0)];
		}
	}
	q.n_blocks = nb;
	q.blocks = pb;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &q;
	return status(s, &e);
}

/* Sink ids and sealed ids in one Release or Fork (fork when fork is set). */
static int sink_ids(int s, bool fork, uint32_t *sink, size_t n_sink, uint32_t *sealed, size_t n_sealed)
{
	Kvq__Release rl = KVQ__RELEASE__INIT;
	Kvq__Fork fk = KVQ__FORK__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;

	if (fork) {
		fk.n_sink_ids = n_sink;
		fk.sink_ids = sink;
		fk.n_sealed_ids = n_sealed;
		fk.sealed_ids = sealed;
		e.body_case = KVQ__ENVELOPE__BODY_FORK;
		e.fork = &fk;
	} else {
		rl.n_sink_ids = n_sink;
		rl.sink_ids = sink;
		rl.n_sealed_ids = n_sealed;
		rl.sealed_ids = sealed;
		e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
		e.release = &rl;
	}
	return status(s, &e);
}

/* ---------------------------------------------------------------- sessions */

/* A worker's life: alloc, seal, an attention report, publish a chain, a
 * second worker hits it, forks and releases; a duplicate publish; Stats. */
static void s_prefix(void)
{
	uint32_t open[2], resv[2], sealed[2], chain[3], got[3], dup[1], o[1], r[1];
	size_t n;

	hello(0, KVQ_PROTOCOL_VERSION);
	attach(0, INPROC_POOL, false);
	alloc(0, 2, 2, open, resv, sealed);
	seal(0, open, resv, 2);
	seal_report(0);
	chain[0] = resv[0];
	chain[1] = resv[1];
	chain[2] = sealed[0];
	publish(0, chain, 3, NULL);
	hello(1, KVQ_PROTOCOL_VERSION);
	attach(1, INPROC_POOL, false);
	lookup(1, 3 * INPROC_B, got, &n);
	fork_ids(1, got, n);
	alloc(1, 0, 1, o, r, dup);
	publish(1, dup, 1, NULL);
	release(1, got, n, NULL, 0);
	stats(1, "");
	release(0, chain, 3, NULL, 0);
	stats(0, INPROC_POOL);
}

/* The pool with sink blocks: a chain from its sink (one block sealed out of
 * the window, one straight), a second worker's lookup hits it from the sink
 * on, forks and releases it; a chain without its sink and an attach that
 * does not know sinks are refused; Stats. */
static void s_sinks(void)
{
	uint32_t sink = 0, open = 0, resv = 0, sealed = 0, chain[2], y[1] = { 0 }, o[1], r[1];
	Kvq__PoolCreate pc;
	Kvq__Attach a;
	Kvq__Envelope e;

	hello(0, KVQ_PROTOCOL_VERSION);
	inproc_attach_req(&e, &a, &pc, INPROC_POOL "-sink", false);
	a.policy = "int4g32";
	status(0, &e);   /* no sink_blocks: refused */
	a.sink_blocks = 1;
	status(0, &e);
	alloc_sink(0, &sink, &open, &resv, &sealed);
	seal(0, &open, &resv, 1);
	chain[0] = resv;
	chain[1] = sealed;
	publish_sink(0, sink, chain, 2);
	hello(1, KVQ_PROTOCOL_VERSION);
	status(1, &e);
	{
		Kvq__Lookup q = KVQ__LOOKUP__INIT;
		Kvq__Envelope le = KVQ__ENVELOPE__INIT;
		struct kvq_reply rep;
		uint32_t got_sink[1], got[2];
		size_t ns = 0, n = 0;

		q.n_tokens = 3 * INPROC_B;
		q.tokens = tokens;
		q.max_tokens = 3 * INPROC_B;
		le.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
		le.lookup = &q;
		if (call(1, &le, &rep) == 0 && rep.e.lookup_reply->n_sink_ids == 1 &&
		    rep.e.lookup_reply->n_sealed_ids == 2) {
			got_sink[0] = rep.e.lookup_reply->sink_ids[0];
			memcpy(got, rep.e.lookup_reply->sealed_ids, sizeof(got));
			ns = 1;
			n = 2;
		}
		kvq_reply_fini(&rep);
		sink_ids(1, true, got_sink, ns, got, n);
		sink_ids(1, false, got_sink, ns, got, n);
		sink_ids(1, false, got_sink, ns, got, n);
	}
	alloc(1, 0, 1, o, r, y);
	publish_sink(1, -1, y, 1);   /* a chain without its sink: refused */
	stats(1, "");
	sink_ids(0, false, &sink, 1, chain, 2);
	stats(0, INPROC_POOL "-sink");
}

/* Salted and unsalted chains, a lookup that misses, release of open slots. */
static void s_salt(void)
{
	uint32_t open[2], resv[2], sealed[2], got[4];
	size_t n;

	hello(3, KVQ_PROTOCOL_VERSION);
	attach(3, INPROC_POOL, false);
	alloc(3, 2, 2, open, resv, sealed);
	publish(3, sealed, 2, "tenant-a");
	lookup(3, 2 * INPROC_B, got, &n);
	release(3, NULL, 0, open, 2);
	release(3, got, n, NULL, 0);
	release(3, sealed, 2, NULL, 0);
}

/* Root creates a pool on attach, adds and drops one, evicts. */
static void s_admin(void)
{
	uint32_t open[1], resv[1], sealed[2];

	hello(0, KVQ_PROTOCOL_VERSION);
	attach(0, "private", true);
	alloc(0, 1, 2, open, resv, sealed);
	publish(0, sealed, 2, NULL);
	release(0, sealed, 2, NULL, 0);
	admin(0, KVQ__ENVELOPE__BODY_EVICT, "private");
	admin(0, KVQ__ENVELOPE__BODY_POOL_ADD, "added");
	admin(0, KVQ__ENVELOPE__BODY_POOL_ADD, "mixed");
	hello(1, KVQ_PROTOCOL_VERSION);
	attach(1, "mixed", false);
	attach(1, "added", false);
	stats(1, "");
	admin(1, KVQ__ENVELOPE__BODY_POOL_DROP, "added");
	admin(0, KVQ__ENVELOPE__BODY_POOL_DROP, "added");
	event(1, 5);
	admin(0, KVQ__ENVELOPE__BODY_POOL_DROP, "added");
	stats(0, "");
}

/* Workers that die holding blocks: a close, an exiting peer whose lease
 * waits, then its exit. */
static void s_faults(void)
{
	uint32_t open[2], resv[2], sealed[2], got[2];
	size_t n;

	hello(1, KVQ_PROTOCOL_VERSION);
	attach(1, INPROC_POOL, false);
	alloc(1, 2, 2, open, resv, sealed);
	seal(1, open, resv, 1);
	publish(1, resv, 1, NULL);
	event(1, 6);
	hello(2, KVQ_PROTOCOL_VERSION);
	attach(2, INPROC_POOL, false);
	lookup(2, INPROC_B, got, &n);
	event(2, 5);
	event(0, 7);
	hello(1, KVQ_PROTOCOL_VERSION);
	attach(1, INPROC_POOL, false);
	alloc(1, 0, 2, open, resv, sealed);
	fork_ids(1, sealed, 2);
	event(1, 5);
}

/* Refusals: order, versions, rights, ids not held, codebooks. */
static void s_refused(void)
{
	uint32_t open[1], resv[1], sealed[1], bogus[2] = { 3, 3 };

	stats(2, "");
	hello(2, KVQ_PROTOCOL_VERSION + 1);
	hello(2, KVQ_PROTOCOL_VERSION);
	hello(2, KVQ_PROTOCOL_VERSION);
	alloc(2, 1, 0, open, resv, sealed);
	attach(2, "private", true);
	attach(2, INPROC_POOL, false);
	release(2, bogus, 2, NULL, 0);
	fork_ids(2, bogus, 1);
	seal(2, bogus, bogus + 1, 1);
	alloc(2, 4096, 0, open, resv, sealed);
	admin(2, KVQ__ENVELOPE__BODY_EVICT, INPROC_POOL);
	record(2, (const uint8_t *)"\x0a\x05junk", 7);
	hello(0, KVQ_PROTOCOL_VERSION);
	attach_codebooks(0, "pq", "k=int8,v=pq2", false);
	attach_codebooks(0, "pq", "k=int8,v=pq2", true);
	attach_codebooks(0, "pq", "int8", true);
}

static int write_file(const char *dir, const char *name, const struct buf *b)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(b->p, 1, b->len, f) != b->len || fclose(f) != 0) {
		fprintf(stderr, "fuzz-seeds: %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

static int session(const char *name, void (*fn)(void))
{
	uint8_t chunking = (uint8_t)strlen(name);
	int r;

	frames.len = records.len = 0;
	put(&frames, &chunking, 1);
	if (inproc_start_conf(&t, fuzz_conf, NULL, 0) < 0)
		return -1;
	for (int i = 0; i < FUZZ_SLOTS; i++)
		slot[i] = conn_new(i);
	fn();
	inproc_stop(&t);
	r = write_file(frame_dir, name, &frames);
	return r < 0 ? r : write_file(request_dir, name, &records);
}

/* Framing faults and a torn frame, for fuzz_frame. */
static int faults(void)
{
	static const struct {
		const char *name;
		size_t len;
		const char *bytes;
	} f[] = {
		{ "fault-zero", 13, "\x01\x02\x00\x00\x00\x08\x01\x00\x00\x00\x00\x00\x00" },
		{ "fault-big", 11, "\x03\x02\x00\x00\x00\x08\x01\x01\x00\x00\x40" },
		{ "torn", 8, "\x05\x10\x00\x00\x00\x08\x01\x12" },
	};
	struct buf b = { 0 };

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		b.len = 0;
		put(&b, f[i].bytes, f[i].len);
		if (write_file(frame_dir, f[i].name, &b) < 0)
			return -1;
	}
	free(b.p);
	return 0;
}

int main(int argc, char **argv)
{
	int r = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: %s FRAME_DIR REQUEST_DIR\n", argv[0]);
		return 2;
	}
	frame_dir = argv[1];
	request_dir = argv[2];
	/* the uids of fuzz_request's connections */
	fuzz_slot_uids(slot_uid);
	for (uint32_t i = 0; i < 4 * INPROC_B; i++)
		tokens[i] = 1000 + 7 * i;
	if (session("prefix", s_prefix) < 0 || session("salt", s_salt) < 0 || session("admin", s_admin) < 0 ||
	    session("faults", s_faults) < 0 || session("refused", s_refused) < 0 || session("sinks", s_sinks) < 0 ||
	    faults() < 0)
		r = 1;
	free(frames.p);
	free(records.p);
	return r;
}
