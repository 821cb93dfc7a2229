/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: requests through the daemon's table against in-process
 * state (tests/inproc.h: pools, leases, prefix index; no socket), from four
 * connections of different uids that may close or exit between requests.
 *
 * The input is a list of records, each a byte [op], a u16 LE length and that
 * many payload bytes (fewer at the end of the input).  op & 3 is the
 * connection: root, two uids without rights, kvqd's own uid.  op >> 2 is
 * what happens: 0-4 the payload is a frame's envelope, answered as the
 * server answers it; 5 the connection closes (its lease is given back) and
 * a new one takes its place; 6 its peer is exiting (the lease stays until
 * 7 frees the oldest exiting connection); the payload is then ignored.
 * tests/fuzz/seeds.c writes the seed corpus in this form.
 *
 * After every step: each reply is a valid, encodable reply with the
 * request's id; a refused request changed nothing; every pool's slot
 * classes add up to its capacity; every reference and used open slot is
 * one hold of one lease of a connection attached there, and back; a cached
 * block's parent is cached.  At the end, with every connection gone, no
 * pool holds anything for a lease.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame_check.h"
#include "fuzz_state.h"
#include "prefix.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct inproc t;
static uid_t slot_uid[FUZZ_SLOTS];

/* FNV-1a over what a request may change, for "a refusal changed nothing". */
static void mix(uint64_t *h, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		*h ^= (v >> (8 * i)) & 0xff;
		*h *= 1099511628211ull;
	}
}

static uint64_t state_hash(void)
{
	const struct kvq_conn *lists[2] = { t.st.conns, t.st.dying };
	uint64_t h = 14695981039346656037ull;

	for (const struct kvq_pools_rec *p = t.st.pools.head; p; p = p->next) {
		struct kvq_pool_stats s;

		mix(&h, (uintptr_t)p);
		mix(&h, p->allocated);
		mix(&h, p->clients);
		if (!p->allocated)
			continue;
		kvq_pool_stats(p->pool, &s);
		/* counters of refusals (alloc_failures) may move; nothing else */
		mix(&h, s.sealed_free);
		mix(&h, s.sealed_reserved);
		mix(&h, s.sealed_private);
		mix(&h, s.sealed_cached);
		mix(&h, s.cached_referenced);
		mix(&h, s.sealed_evictable);
		mix(&h, s.open_used);
		mix(&h, s.sink_free);
		mix(&h, s.sink_private);
		mix(&h, s.sink_cached);
		mix(&h, s.sink_referenced);
		mix(&h, s.refs);
		mix(&h, s.sink_refs);
		mix(&h, s.evictions);
	}
	for (int l = 0; l < 2; l++)
		for (const struct kvq_conn *c = lists[l]; c; c = c->next) {
			uint32_t pos = 0, id, n;

			mix(&h, c->id);
			mix(&h, c->hello);
			mix(&h, (uintptr_t)c->pool);
			if (!c->lease)
				continue;
			while (kvq_lease_next_sealed(c->lease, &pos, &id, &n) == 1)
				mix(&h, (uint64_t)id << 32 | n);
			pos = 0;
			while (kvq_lease_next_open(c->lease, &pos, &id) == 1)
				mix(&h, id);
		}
	return h;
}

/* The books of p against the leases of the connections attached to it. */
static void check_pool(const struct kvq_pools_rec *p)
{
	const struct kvq_conn *lists[2] = { t.st.conns, t.st.dying };
	struct kvq_pool_stats s;
	uint64_t *refs, total[2] = { 0, 0 };   /* sealed, sink */
	uint8_t *open;
	uint32_t clients = 0, n_open = 0, nb;

	if (!p->allocated) {
		FUZZ_ASSERT(p->clients == 0);
		return;
	}
	kvq_pool_stats(p->pool, &s);
	FUZZ_ASSERT(s.sealed_free + s.sealed_reserved + s.sealed_private + s.sealed_cached == s.n_sealed);
	FUZZ_ASSERT(s.open_free + s.open_used == s.n_open && s.open_used == s.sealed_reserved);
	FUZZ_ASSERT(s.cached_referenced <= s.sealed_cached);
	FUZZ_ASSERT(s.sealed_evictable <= s.sealed_cached - s.cached_referenced);
	FUZZ_ASSERT(s.sink_free + s.sink_private + s.sink_cached == s.n_sink);
	FUZZ_ASSERT(s.sink_referenced <= s.sink_cached && s.sink_evictable <= s.sink_cached - s.sink_referenced);
	/* blocks: sealed ids, then sink ids (daemon/pool.h) */
	nb = s.n_sealed + s.n_sink;
	refs = calloc(nb ? nb : 1, sizeof(*refs));
	open = calloc(s.n_open ? s.n_open : 1, 1);
	FUZZ_ASSERT(refs && open);
	for (int l = 0; l < 2; l++)
		for (const struct kvq_conn *c = lists[l]; c; c = c->next) {
			uint32_t pos = 0, id, n;

			if (c->pool != p)
				continue;
			clients++;
			FUZZ_ASSERT(c->lease);
			while (kvq_lease_next_sealed(c->lease, &pos, &id, &n) == 1) {
				FUZZ_ASSERT(id < nb && n > 0);
				refs[id] += n;
			}
			pos = 0;
			while (kvq_lease_next_open(c->lease, &pos, &id) == 1) {
				FUZZ_ASSERT(id < s.n_open && !open[id]);
				open[id] = 1;
				n_open++;
			}
		}
	FUZZ_ASSERT(clients == p->clients && n_open == s.open_used);
	for (uint32_t id = 0; id < nb; id++) {
		int state = kvq_pool_state(p->pool, id);

		FUZZ_ASSERT(refs[id] == kvq_pool_refs(p->pool, id));
		total[id >= s.n_sealed] += refs[id];
		if (state == KVQ_POOL_CACHED) {
			int64_t parent = kvq_prefix_parent(p->prefix, id);

			FUZZ_ASSERT(parent == -1 || kvq_pool_state(p->pool, (uint32_t)parent) == KVQ_POOL_CACHED);
			/* with sinks a chain starts with its sink and only there */
			FUZZ_ASSERT(!s.n_sink || (parent == -1) == (id >= s.n_sealed));
		} else if (state == KVQ_POOL_FREE) {
			FUZZ_ASSERT(refs[id] == 0);
		}
	}
	FUZZ_ASSERT(total[0] == s.refs && total[1] == s.sink_refs);
	free(refs);
	free(open);
}

static void check_all(void)
{
	for (const struct kvq_pools_rec *p = t.st.pools.head; p; p = p->next)
		check_pool(p);
}

static struct kvq_conn *conn_new(int slot)
{
	struct kvq_conn *c = inproc_conn(&t, slot_uid[slot]);

	FUZZ_ASSERT(c);
	return c;
}

/* One frame from c, answered as the server's conn_on_frame answers it;
 * returns whether the connection is to be closed after the reply. */
static bool request(struct kvq_conn *c, const uint8_t *payload, size_t len)
{
	Kvq__Envelope *req = NULL;
	struct kvq_reply r;
	uint8_t *buf = NULL;
	uint64_t before = state_hash();
	size_t n = 0, row = 0;
	char err[256];
	bool close;
	int parsed;

	/* the request as the dispatcher will see it, for its id */
	if (kvq_frame_unpack(payload, len, &req) < 0)
		req = NULL;
	parsed = kvq_dispatch_frame(t.rows, t.n_rows, c, payload, len, -1, &r, &row) == 0;
	FUZZ_ASSERT(parsed == (req != NULL));
	FUZZ_ASSERT(!parsed || (row < t.n_rows && r.e.id == req->id));
	FUZZ_ASSERT(parsed || (r.e.id == 0 && r.e.status == -EBADMSG));
	FUZZ_ASSERT(kvq_frame_check(&r.e, 0, err, sizeof(err)) == 0);
	FUZZ_ASSERT(kvq_frame_encode_alloc(&r.e, &buf, &n) == 0);
	FUZZ_ASSERT(r.fd < 0 || (r.e.status == 0 && r.e.body_case == KVQ__ENVELOPE__BODY_ATTACH_REPLY));
	if (r.e.status < 0)
		FUZZ_ASSERT(state_hash() == before);
	close = r.close_after;
	free(buf);
	kvq_reply_fini(&r);
	kvq_frame_envelope_free(req);
	return close;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_slot_uids(slot_uid);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvq_conn *slot[FUZZ_SLOTS];
	size_t at = 0;

	FUZZ_ASSERT(inproc_start_conf(&t, fuzz_conf, NULL, 0) == 0);
	/* refusals log warnings: a line per input costs more than the input */
	if (!getenv("KVQ_TEST_VERBOSE"))
		kvq_log_set_level(LOG_ERR);
	for (int i = 0; i < FUZZ_SLOTS; i++)
		slot[i] = conn_new(i);
	while (at < size) {
		uint8_t op = data[at++];
		size_t len = 0;
		int s = op & 3;

		if (size - at >= 2) {
			len = data[at] | (size_t)data[at + 1] << 8;
			at += 2;
		} else {
			at = size;
		}
		if (len > size - at)
			len = size - at;
		switch (op >> 2) {
		case 5:
			kvq_state_conn_free(slot[s]);
			slot[s] = conn_new(s);
			break;
		case 6:
			kvq_state_conn_exiting(slot[s]);
			slot[s] = conn_new(s);
			break;
		case 7:
			if (t.st.dying)
				kvq_state_conn_free(t.st.dying);
			break;
		default:
			if (request(slot[s], data + at, len)) {
				kvq_state_conn_free(slot[s]);
				slot[s] = conn_new(s);
			}
			break;
		}
		at += len;
		check_all();
	}
	/* every process gone: nothing is held for a lease anywhere */
	while (t.st.conns)
		kvq_state_conn_free(t.st.conns);
	while (t.st.dying)
		kvq_state_conn_free(t.st.dying);
	for (const struct kvq_pools_rec *p = t.st.pools.head; p; p = p->next) {
		struct kvq_pool_stats s;

		if (!p->allocated)
			continue;
		kvq_pool_stats(p->pool, &s);
		FUZZ_ASSERT(p->clients == 0 && s.refs == 0 && s.sink_refs == 0 && s.open_used == 0 && s.sealed_reserved == 0 &&
			    s.sealed_private == 0 && s.cached_referenced == 0);
	}
	inproc_stop(&t);
	return 0;
}
