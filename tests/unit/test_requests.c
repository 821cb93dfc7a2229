/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's request handlers (daemon/req_*.c) against in-process state,
 * no socket: the order a connection must keep (Hello, then Attach), admin
 * requests refused for a uid without admin rights, and Alloc, Seal,
 * Publish, Lookup, Fork and Release keeping the pool and every lease in
 * balance (each reference and each used open slot is one lease's hold),
 * through refusals that change nothing, a cached duplicate, quotas and
 * connections that go away.
 */
#include <errno.h>
#include <string.h>

#include "../tap.h"
#include "../inproc.h"
#include "frame_check.h"
#include "groups.h"

static struct inproc t;

/* Every reference in the pool and every used open slot belongs to exactly
 * one hold of a lease of a connection attached to it, and back. */
static int balanced(const struct kvq_pools_rec *p)
{
	const struct kvq_conn *lists[2] = { t.st.conns, t.st.dying };
	struct kvq_pool_stats st;
	uint64_t refs = 0, open = 0;

	kvq_pool_stats(p->pool, &st);
	for (uint32_t id = 0; id < st.n_sealed; id++) {
		uint64_t held = 0;

		for (int l = 0; l < 2; l++)
			for (const struct kvq_conn *c = lists[l]; c; c = c->next)
				if (c->pool == p && c->lease)
					held += kvq_lease_sealed(c->lease, id);
		if (held != kvq_pool_refs(p->pool, id))
			return 0;
		refs += held;
	}
	for (int l = 0; l < 2; l++)
		for (const struct kvq_conn *c = lists[l]; c; c = c->next)
			if (c->pool == p && c->lease)
				open += kvq_lease_n_open(c->lease);
	return refs == st.refs && open == st.open_used && st.open_used == st.sealed_reserved;
}

static void env(Kvq__Envelope *e, Kvq__Envelope__BodyCase body)
{
	kvq__envelope__init(e);
	e->body_case = body;
}

static int alloc(struct kvq_conn *c, uint32_t n_open, uint32_t n_sealed, uint32_t *ret_open, uint32_t *ret_resv,
		 uint32_t *ret_sealed)
{
	Kvq__Envelope e;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	struct kvq_reply r;
	int st;

	a.n_open = n_open;
	a.n_sealed = n_sealed;
	env(&e, KVQ__ENVELOPE__BODY_ALLOC);
	e.alloc = &a;
	st = inproc_call(&t, c, &e, &r);
	if (st == 0) {
		memcpy(ret_open, r.e.alloc_reply->open_ids, n_open * sizeof(uint32_t));
		memcpy(ret_resv, r.e.alloc_reply->reserved_ids, n_open * sizeof(uint32_t));
		memcpy(ret_sealed, r.e.alloc_reply->sealed_ids, n_sealed * sizeof(uint32_t));
	}
	kvq_reply_fini(&r);
	return st;
}

static int seal(struct kvq_conn *c, uint32_t open_id, uint32_t sealed_id)
{
	Kvq__Envelope e;
	Kvq__Seal q = KVQ__SEAL__INIT;

	q.n_open_ids = q.n_sealed_ids = 1;
	q.open_ids = &open_id;
	q.sealed_ids = &sealed_id;
	env(&e, KVQ__ENVELOPE__BODY_SEAL);
	e.seal = &q;
	return inproc_status(&t, c, &e);
}

static uint32_t tokens[2 * INPROC_B];

/* Publishes ids[n] as a chain of blocks 0, 1, ... of tokens; the reply's
 * ids go to ret_ids. */
static int publish(struct kvq_conn *c, const uint32_t *ids, size_t n, uint32_t *ret_ids)
{
	Kvq__Envelope e;
	Kvq__Publish q;
	Kvq__PublishBlock b[2], *pb[2];
	struct kvq_reply r;
	int st;

	inproc_publish_req(&e, &q, b, pb, ids, n, tokens, NULL);
	st = inproc_call(&t, c, &e, &r);
	if (st == 0)
		memcpy(ret_ids, r.e.publish_reply->ids, n * sizeof(uint32_t));
	kvq_reply_fini(&r);
	return st;
}

static int lookup(struct kvq_conn *c, uint32_t *ret_ids, size_t *ret_n)
{
	Kvq__Envelope e;
	Kvq__Lookup q = KVQ__LOOKUP__INIT;
	struct kvq_reply r;
	int st;

	q.n_tokens = 2 * INPROC_B;
	q.tokens = tokens;
	q.max_tokens = 2 * INPROC_B;
	env(&e, KVQ__ENVELOPE__BODY_LOOKUP);
	e.lookup = &q;
	st = inproc_call(&t, c, &e, &r);
	if (st == 0) {
		*ret_n = r.e.lookup_reply->n_sealed_ids;
		memcpy(ret_ids, r.e.lookup_reply->sealed_ids, *ret_n * sizeof(uint32_t));
	}
	kvq_reply_fini(&r);
	return st;
}

static int release(struct kvq_conn *c, uint32_t *sealed, size_t n_sealed, uint32_t *open, size_t n_open)
{
	Kvq__Envelope e;
	Kvq__Release q = KVQ__RELEASE__INIT;

	q.n_sealed_ids = n_sealed;
	q.sealed_ids = sealed;
	q.n_open_ids = n_open;
	q.open_ids = open;
	env(&e, KVQ__ENVELOPE__BODY_RELEASE);
	e.release = &q;
	return inproc_status(&t, c, &e);
}

static int fork_ids(struct kvq_conn *c, uint32_t *ids, size_t n)
{
	Kvq__Envelope e;
	Kvq__Fork q = KVQ__FORK__INIT;

	q.n_sealed_ids = n;
	q.sealed_ids = ids;
	env(&e, KVQ__ENVELOPE__BODY_FORK);
	e.fork = &q;
	return inproc_status(&t, c, &e);
}

/* e from c: its status, the reply's message in msg. */
static int call_msg(struct kvq_conn *c, Kvq__Envelope *e, char *msg, size_t len)
{
	struct kvq_reply r;
	int st = inproc_call(&t, c, e, &r);

	snprintf(msg, len, "%s", r.e.message ? r.e.message : "");
	kvq_reply_fini(&r);
	return st;
}

static int admin_req(struct kvq_conn *c, bool drop, const char *pool, char *msg, size_t len)
{
	Kvq__Envelope e;
	Kvq__Evict ev = KVQ__EVICT__INIT;
	Kvq__PoolDrop pd = KVQ__POOL_DROP__INIT;

	ev.pool = pd.pool = (char *)pool;
	if (drop) {
		env(&e, KVQ__ENVELOPE__BODY_POOL_DROP);
		e.pool_drop = &pd;
	} else {
		env(&e, KVQ__ENVELOPE__BODY_EVICT);
		e.evict = &ev;
	}
	return call_msg(c, &e, msg, len);
}

static void order_and_rights(void)
{
	struct kvq_conn *c = inproc_conn(&t, 0), *other = inproc_conn(&t, inproc_other_uid());
	uint32_t o[1], rv[1], s[1];
	char msg[KVQ_PROTO_MAX_MESSAGE];
	Kvq__Envelope e;
	Kvq__Stats st;

	inproc_stats_req(&e, &st);
	ok(inproc_status(&t, c, &e) == -EPROTO, "Stats before Hello: -EPROTO");
	ok(alloc(c, 1, 0, o, rv, s) == -EPROTO && inproc_hello(&t, c) == 0 && inproc_hello(&t, c) == -EPROTO,
	   "Alloc before Hello: -EPROTO; Hello, and a second one: -EPROTO");
	ok(alloc(c, 1, 0, o, rv, s) == -EPROTO && !c->pool, "Alloc before Attach: -EPROTO, nothing held");
	ok(inproc_status(&t, c, &e) == 0, "Stats needs no Attach");
	ok(inproc_hello(&t, other) == 0 && admin_req(other, false, INPROC_POOL, msg, sizeof(msg)) == -EPERM &&
	   strstr(msg, "evict needs root or admin rights") && strstr(msg, "has none"),
	   "Evict from a uid without admin rights: -EPERM (%s)", msg);
	ok(admin_req(other, true, INPROC_POOL, msg, sizeof(msg)) == -EPERM && strstr(msg, "dropping a pool needs"),
	   "PoolDrop likewise (%s)", msg);
	ok(inproc_attach(&t, other, "private", true) == -EACCES, "pool creation refused to that uid: -EACCES");
	ok(admin_req(c, false, "nosuch", msg, sizeof(msg)) == -ENOENT, "root's Evict of no pool: -ENOENT (%s)", msg);
	kvq_state_conn_free(c);
	kvq_state_conn_free(other);
}

static void accounting(void)
{
	struct kvq_conn *a = inproc_conn(&t, 0), *b = inproc_conn(&t, geteuid());
	uint32_t open[2], resv[2], sealed[3], pub[2], dup[1], got[1], look[2], held[2];
	struct kvq_pool_stats st;
	struct kvq_pools_rec *p;
	char msg[KVQ_PROTO_MAX_MESSAGE];
	size_t n = 0;

	for (uint32_t i = 0; i < 2 * INPROC_B; i++)
		tokens[i] = 500 + i;
	ok(inproc_hello(&t, a) == 0 && inproc_attach(&t, a, "private", true) == 0 && a->pool && a->lease,
	   "root creates pool 'private' on attach (16 sealed + 4 open)");
	p = a->pool;
	ok(p->L->n_sealed == 16 && p->L->n_open == 4 && p->clients == 1 && balanced(p), "the pool is empty");

	ok(alloc(a, 2, 3, open, resv, sealed) == 0, "Alloc of 2 open + 3 sealed slots");
	kvq_pool_stats(p->pool, &st);
	ok(st.open_used == 2 && st.sealed_reserved == 2 && st.sealed_private == 3 &&
	   kvq_lease_n_open(a->lease) == 2 && kvq_lease_n_sealed(a->lease) == 3 && balanced(p),
	   "pool and lease: 2 open with reservations, 3 sealed; in balance");
	ok(alloc(a, 3, 0, open, resv, sealed) == -ENOSPC && balanced(p) && kvq_lease_n_open(a->lease) == 2,
	   "Alloc of more open slots than are free: -ENOSPC, nothing taken");

	ok(seal(a, open[0], resv[1]) == -EINVAL && balanced(p), "Seal naming another slot's reservation: -EINVAL");
	ok(seal(a, open[0], resv[0]) == 0, "Seal of one open slot into its reservation");
	kvq_pool_stats(p->pool, &st);
	ok(st.open_used == 1 && st.sealed_private == 4 && kvq_lease_sealed(a->lease, resv[0]) == 1 &&
	   !kvq_lease_open_has(a->lease, open[0]) && balanced(p), "the block is held once, the open slot gone");

	pub[0] = resv[0];
	pub[1] = sealed[0];
	ok(publish(a, pub, 2, pub) == 0 && pub[0] == resv[0] && pub[1] == sealed[0], "Publish of a chain of two");
	kvq_pool_stats(p->pool, &st);
	ok(st.sealed_cached == 2 && st.sealed_private == 2 && balanced(p), "two cached, still held; in balance");

	ok(inproc_hello(&t, b) == 0 && inproc_attach(&t, b, "private", false) == 0 && p->clients == 2,
	   "kvqd's own uid attaches as well");
	ok(alloc(b, 0, 1, open + 1, resv + 1, dup) == 0 && publish(b, dup, 1, got) == 0 && got[0] == resv[0] &&
	   kvq_lease_sealed(b->lease, resv[0]) == 1 && !kvq_lease_sealed(b->lease, dup[0]) &&
	   kvq_pool_state(p->pool, dup[0]) == KVQ_POOL_FREE && balanced(p),
	   "a duplicate publish: the hold moves to the cached block, the copy is freed");
	{
		/* a chain of two duplicates: the second's parent is the first,
		 * which became the cached block, so the second is found under it */
		uint32_t d2[2], g2[2], o2[2], r2[2];
		ok(alloc(b, 0, 2, o2, r2, d2) == 0 && publish(b, d2, 2, g2) == 0 && g2[0] == resv[0] &&
		   g2[1] == sealed[0] && kvq_pool_state(p->pool, d2[0]) == KVQ_POOL_FREE &&
		   kvq_pool_state(p->pool, d2[1]) == KVQ_POOL_FREE && release(b, g2, 2, NULL, 0) == 0 &&
		   kvq_lease_sealed(b->lease, resv[0]) == 1 && !kvq_lease_sealed(b->lease, sealed[0]) && balanced(p),
		   "a chain of two duplicates in one publish: both holds move to the cached chain, both copies freed");
	}
	ok(lookup(b, look, &n) == 0 && n == 2 && look[0] == resv[0] && look[1] == sealed[0] &&
	   kvq_lease_sealed(b->lease, resv[0]) == 2 && balanced(p), "Lookup: the chain of two, one hold each");
	held[0] = look[1];
	ok(fork_ids(a, held, 1) == 0 && kvq_lease_sealed(a->lease, sealed[0]) == 2 &&
	   kvq_pool_refs(p->pool, sealed[0]) == 3 && balanced(p), "Fork: one more reference in pool and lease");
	held[0] = dup[0];
	ok(fork_ids(b, held, 1) == -EINVAL && release(b, held, 1, NULL, 0) == -EINVAL && balanced(p),
	   "Fork and Release of a block not held: -EINVAL, nothing changed");
	held[0] = held[1] = resv[0];
	ok(release(b, held, 2, NULL, 0) == 0 && !kvq_lease_sealed(b->lease, resv[0]) && balanced(p),
	   "Release with multiplicity");

	p->quota = p->L->sealed_block_bytes;
	ok(alloc(b, 0, 2, open + 1, resv + 1, look) == -EDQUOT && balanced(p), "over the uid's quota: -EDQUOT");
	p->quota = KVQ_CONFIG_UNLIMITED;

	ok(admin_req(a, true, "private", msg, sizeof(msg)) == -EBUSY, "PoolDrop with clients: -EBUSY (%s)", msg);
	kvq_state_conn_free(b);
	kvq_state_conn_free(a);
	kvq_pool_stats(p->pool, &st);
	ok(st.refs == 0 && st.open_used == 0 && st.sealed_private == 0 && st.sealed_cached == 2 && p->clients == 0,
	   "both connections gone: every hold given back, the cached chain stays for the LRU");
	a = inproc_conn(&t, 0);
	ok(inproc_hello(&t, a) == 0 && admin_req(a, false, "private", msg, sizeof(msg)) == 0, "root's Evict");
	kvq_pool_stats(p->pool, &st);
	ok(st.sealed_cached == 0 && st.sealed_free == 16, "evicted: the pool is empty again");
	ok(admin_req(a, true, "private", msg, sizeof(msg)) == 0 && !kvq_pools_find(&t.st.pools, "private"),
	   "PoolDrop of the created pool: its record is gone");
	kvq_state_conn_free(a);
}

/* PoolAdd of a small pool called name by c; the reply's message in msg. */
static int pool_add(struct kvq_conn *c, const char *name, char *msg, size_t len)
{
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;   /* slot counts from the capacity */
	Kvq__Attach a;
	Kvq__PoolAdd pa = KVQ__POOL_ADD__INIT;
	Kvq__Envelope e;

	pc.backend = "";
	pc.device = -1;
	a = inproc_spec(name, &pc);
	pa.spec = &a;
	pa.capacity = 128u << 10;
	env(&e, KVQ__ENVELOPE__BODY_POOL_ADD);
	e.pool_add = &pa;
	return call_msg(c, &e, msg, len);
}

/* kvqd holds at most KVQ_PROTO_MAX_POOLS pools, the most a Stats reply
 * lists: the largest Stats reply is within a frame and passes the check. */
static void pool_limit(void)
{
	struct kvq_conn *c = inproc_conn(&t, 0);
	char msg[KVQ_PROTO_MAX_MESSAGE], name[16];
	uint32_t have = 0, added = 0;
	Kvq__Envelope e;
	Kvq__Stats q;
	struct kvq_reply r;
	int st, size = -1;

	for (struct kvq_pools_rec *p = t.st.pools.head; p; p = p->next)
		have++;
	inproc_hello(&t, c);
	for (uint32_t i = have; i < KVQ_PROTO_MAX_POOLS; i++) {
		snprintf(name, sizeof(name), "p%u", i);
		added += pool_add(c, name, msg, sizeof(msg)) == 0;
	}
	ok(have + added == KVQ_PROTO_MAX_POOLS, "%u pools added, %u in all", added, have + added);
	ok(pool_add(c, "onemore", msg, sizeof(msg)) == -ENOSPC && strstr(msg, "256 pools"),
	   "one more: -ENOSPC (%s)", msg);
	ok(inproc_attach(&t, c, "onemore", true) == -ENOSPC, "an attach that would create one: -ENOSPC too");
	inproc_stats_req(&e, &q);
	st = inproc_call(&t, c, &e, &r);
	if (st == 0)
		size = kvq_frame_size(&r.e);
	ok(st == 0 && r.e.stats_reply->n_pools == KVQ_PROTO_MAX_POOLS && kvq_frame_check(&r.e, 0, NULL, 0) == 0 &&
	   size > 0 && size <= (int)(KVQ_FRAME_HDR + KVQ_FRAME_MAX),
	   "Stats of %u pools: a %d-byte reply the clients accept", KVQ_PROTO_MAX_POOLS, size);
	kvq_reply_fini(&r);
	kvq_state_conn_free(c);
}

/* How a tensor-parallel group shards the model's KV heads (groups.h). */
static void group_shards(void)
{
	char err[200] = "";

	ok(kvq_group_shard_heads(8, 2, NULL, 0) == 4 && kvq_group_shard_heads(8, 8, NULL, 0) == 1 &&
	   kvq_group_shard_heads(32, 4, NULL, 0) == 8, "heads split evenly: 8/2 = 4, 8/8 = 1, 32/4 = 8");
	ok(kvq_group_shard_heads(4, 8, NULL, 0) == 1 && kvq_group_shard_heads(3, 6, NULL, 0) == 1,
	   "more ranks than heads, a multiple of them: one head per rank, replicated");
	ok(kvq_group_shard_heads(8, 3, err, sizeof(err)) == 0 && strstr(err, "do not split"),
	   "8 heads over 3 ranks: refused (%s)", err);
	ok(kvq_group_shard_heads(3, 4, NULL, 0) == 0 && kvq_group_shard_heads(8, 1, NULL, 0) == 0 &&
	   kvq_group_shard_heads(64, 65, NULL, 0) == 0, "3 heads over 4 ranks, one rank, 65 ranks: refused");
}

int main(void)
{
	if (!ok(inproc_start(&t, NULL, 0) == 0, "a daemon state in process, the daemon's table"))
		return done_testing();
	order_and_rights();
	accounting();
	pool_limit();
	group_shards();
	inproc_stop(&t);
	return done_testing();
}
