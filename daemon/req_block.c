/* SPDX-License-Identifier: Apache-2.0 */
/* Block requests of an attached connection: Alloc, Seal, Publish, Lookup,
 * Release, Fork.  Each checks the whole batch against the pool and the
 * lease, makes room in the lease, then applies it (kvq_lease_take and
 * kvq_lease_give move every hold in both). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "log.h"
#include "request.h"

/* Block ids on the wire: sealed ids 0 .. n_sealed-1 and sink ids 0 ..
 * n_sink-1 in their own fields; daemon/pool.h numbers sink s as block
 * n_sealed + s.  Returns 0 and *ret (the block id), or -1 when id is out of
 * its class's range. */
static int block_of(const struct kvq_pools_rec *p, int sink, uint32_t id, uint32_t *ret)
{
	if (id >= (sink ? p->L->n_sink : p->L->n_sealed))
		return -1;
	*ret = sink ? p->L->n_sealed + id : id;
	return 0;
}

/* The wire id of block b (its class follows from b). */
static uint32_t wire_of(const struct kvq_pools_rec *p, uint32_t b)
{
	return b >= p->L->n_sealed ? b - p->L->n_sealed : b;
}

/* The block ids of sealed[n_sealed] then sink[n_sink]: sealed itself when
 * there is no sink id, else a new array in *owned (free it; NULL when none
 * was needed), and *ret 0; or *ret -EINVAL (an id out of range, err set)
 * or -ENOMEM. */
static const uint32_t *blocks_of(const struct kvq_pools_rec *p, const uint32_t *sealed, size_t n_sealed,
				 const uint32_t *sink, size_t n_sink, const char *what, uint32_t **owned, int *ret,
				 char *err, size_t errlen)
{
	uint32_t *b = NULL, id;

	*owned = NULL;
	*ret = -ENOMEM;
	if (n_sink && !(b = calloc(n_sealed + n_sink, sizeof(*b))))
		return NULL;
	for (size_t i = 0; i < n_sealed + n_sink; i++) {
		int is_sink = i >= n_sealed;

		if (block_of(p, is_sink, is_sink ? sink[i - n_sealed] : sealed[i], &id) < 0) {
			free(b);
			*ret = -EINVAL;
			kvq_seterr(err, errlen, "%s.%s[%zu] = %u: out of range", what, is_sink ? "sink_ids" : "sealed_ids",
				   is_sink ? i - n_sealed : i, is_sink ? sink[i - n_sealed] : sealed[i]);
			return NULL;
		}
		if (b)
			b[i] = id;
	}
	*owned = b;
	*ret = 0;
	return b ? b : sealed;
}

int kvq_req_alloc(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Alloc *a = req->alloc;
	Kvq__AllocReply *rep = r->e.alloc_reply;
	struct kvq_pools_rec *p = c->pool;
	struct kvq_pool_stats st;
	uint32_t *open = NULL, *resv = NULL, *sealed = NULL, *sink = NULL;
	uint64_t bytes;
	int ret;

	if (a->n_sink && !p->L->n_sink)
		return kvq_seterr(err, errlen, "pool %s has no sink blocks", p->name), -EINVAL;
	bytes = (uint64_t)a->n_open * (p->L->open_block_bytes + p->L->sealed_block_bytes) +
		(uint64_t)a->n_sealed * p->L->sealed_block_bytes + (uint64_t)a->n_sink * p->L->open_block_bytes;
	if (!kvq_state_quota_allows(c->st, p, c->uid, bytes))
		return kvq_seterr(err, errlen, "uid %u would exceed its quota of %llu bytes in pool %s",
				  (unsigned)c->uid, (unsigned long long)p->quota, p->name), -EDQUOT;
	/* every class is checked before any is taken: all or nothing (evicting
	 * for one class only ever frees blocks of the other) */
	kvq_pool_stats(p->pool, &st);
	if (a->n_open > st.open_free ||
	    (uint64_t)a->n_open + a->n_sealed > (uint64_t)st.sealed_free + kvq_prefix_evictable(p->prefix, 0) ||
	    a->n_sink > (uint64_t)st.sink_free + kvq_prefix_evictable(p->prefix, 1)) {
		p->alloc_failures++;
		return kvq_seterr(err, errlen, "pool %s cannot hold %u open + %u sealed + %u sink slots", p->name,
				  a->n_open, a->n_sealed, a->n_sink), -ENOSPC;
	}
	open = calloc(a->n_open + 1, sizeof(*open));
	resv = calloc(a->n_open + 1, sizeof(*resv));
	sealed = calloc(a->n_sealed + 1, sizeof(*sealed));
	sink = a->n_sink ? calloc(a->n_sink, sizeof(*sink)) : NULL;
	if (!open || !resv || !sealed || (a->n_sink && !sink) ||
	    kvq_lease_reserve(c->lease, a->n_sealed + a->n_sink, a->n_open) < 0) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = kvq_pool_alloc_open(p->pool, a->n_open, open, resv);
	if (ret < 0)
		goto fail;
	ret = kvq_pool_alloc_sealed(p->pool, a->n_sealed, sealed);
	if (ret == 0 && (ret = kvq_pool_alloc_sink(p->pool, a->n_sink, sink)) < 0)
		for (uint32_t i = 0; i < a->n_sealed; i++)
			kvq_pool_unref(p->pool, sealed[i]);
	if (ret < 0) {
		/* the open slots just granted, not yet the lease's */
		for (uint32_t i = 0; i < a->n_open; i++)
			kvq_pool_release_open(p->pool, open[i]);
		goto fail;
	}
	for (uint32_t i = 0; i < a->n_open; i++)
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_OPEN, open[i], 1);
	for (uint32_t i = 0; i < a->n_sealed; i++)
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, sealed[i], 1);
	for (uint32_t i = 0; i < a->n_sink; i++) {
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, sink[i], 1);
		sink[i] = wire_of(p, sink[i]);
	}
	rep->n_open_ids = rep->n_reserved_ids = a->n_open;
	rep->open_ids = open;
	rep->reserved_ids = resv;
	rep->n_sealed_ids = a->n_sealed;
	rep->sealed_ids = sealed;
	rep->n_sink_ids = a->n_sink;
	rep->sink_ids = sink;
	r->mem[0] = open;
	r->mem[1] = resv;
	r->mem[2] = sealed;
	r->mem[3] = sink;
	return 0;
fail:
	free(open);
	free(resv);
	free(sealed);
	free(sink);
	if (ret == -ENOSPC)
		kvq_seterr(err, errlen, "pool %s is full", p->name);
	return ret;
}

/* A Seal's attention report, into the sender's pool only: never an error
 * (kvq.proto, "Attention timings"); at most KVQ_TIMING_MAX_CALLS_PER_S
 * calls for each second since the connection's last report. */
static void take_timings(struct kvq_conn *c, const Kvq__AttentionReport *rep)
{
	struct kvq_pools_rec *p = c->pool;
	int64_t since = c->active_ms - c->timing_ms;

	if (!p->attention_report_ms || rep->n_bins > KVQ_PROTO_MAX_TIMING_BINS) {
		kvq_attn_drop(p->attn, rep);
		return;
	}
	kvq_attn_add(p->attn, rep, since > 0 ? (uint64_t)since * (KVQ_TIMING_MAX_CALLS_PER_S / 1000) : 0);
	c->timing_ms = c->active_ms;
}

int kvq_req_seal(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Seal *q = req->seal;
	struct kvq_pools_rec *p = c->pool;
	kvq_lease *seen = NULL;
	int ret = 0;

	ret = kvq_lease_new(&seen);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < q->n_open_ids; i++) {
		uint32_t o = q->open_ids[i], resv;

		if (!kvq_lease_open_has(c->lease, o) || kvq_lease_open_add(seen, o) < 0) {
			ret = (kvq_seterr(err, errlen, "seal.open_ids[%zu] = %u: not held (or named twice)", i, o),
			-EINVAL);
			goto out;
		}
		if (kvq_pool_open_reserved(p->pool, o, &resv) < 0 || resv != q->sealed_ids[i]) {
			ret = (kvq_seterr(err, errlen, "seal.sealed_ids[%zu] = %u: open slot %u reserves another",
					 i, q->sealed_ids[i], o), -EINVAL);
			goto out;
		}
	}
	if (kvq_lease_reserve(c->lease, (uint32_t)q->n_open_ids, 0) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	/* each open slot's block is its reservation, checked above */
	for (size_t i = 0; i < q->n_open_ids; i++) {
		kvq_lease_give(c->lease, p->pool, KVQ_LEASE_SEALING, q->open_ids[i], 1);
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, q->sealed_ids[i], 1);
	}
	if (q->attention)
		take_timings(c, q->attention);
out:
	kvq_lease_free(seen);
	return ret;
}

/* A publish block's own block id (its sealed_id or sink_id) in *blk: 0, or
 * -1 when out of its class's range. */
static int publish_block(const struct kvq_pools_rec *p, const Kvq__PublishBlock *b, uint32_t *blk)
{
	const int sink = b->block_case == KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID;

	return block_of(p, sink, sink ? b->sink_id : b->sealed_id, blk);
}

/* Its parent's block id in *par, or -1 when it has none: 0, or -1 when the
 * id is out of its class's range. */
static int publish_parent(const struct kvq_pools_rec *p, const Kvq__PublishBlock *b, int32_t *par)
{
	const int psink = b->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_SINK_ID;
	uint32_t pb;

	*par = -1;
	if (b->parent_case == KVQ__PUBLISH_BLOCK__PARENT__NOT_SET)
		return 0;
	if (block_of(p, psink, psink ? b->parent_sink_id : b->parent_id, &pb) < 0)
		return -1;
	*par = (int32_t)pb;
	return 0;
}

int kvq_req_publish(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Publish *q = req->publish;
	Kvq__PublishReply *rep = r->e.publish_reply;
	struct kvq_pools_rec *p = c->pool;
	uint32_t B = p->L->block_tokens, *ids = NULL;
	kvq_lease *seen = NULL;     /* the request's blocks, each counted its index + 1 */
	int ret;

	ret = kvq_lease_new(&seen);
	if (ret < 0)
		return ret;
	ids = calloc(q->n_blocks + 1, sizeof(*ids));
	if (!ids) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < q->n_blocks; i++) {
		const Kvq__PublishBlock *b = q->blocks[i];
		const int sink = b->block_case == KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID;
		const int has_parent = b->parent_case != KVQ__PUBLISH_BLOCK__PARENT__NOT_SET;
		const uint32_t wid = sink ? b->sink_id : b->sealed_id;
		const char *fld = sink ? "sink_id" : "sealed_id";
		uint32_t blk = 0;
		int32_t par;

		if (b->n_tokens != B) {
			ret = (kvq_seterr(err, errlen, "publish.blocks[%zu]: %zu tokens, a block has %u", i,
					 b->n_tokens, B), -EINVAL);
			goto out;
		}
		/* in a pool with sink blocks a chain starts with its sink, and
		 * only there; in one without, no sink id is in range */
		if (p->L->n_sink && sink == has_parent) {
			ret = (kvq_seterr(err, errlen, "publish.blocks[%zu]: pool %s keeps sink blocks: a chain's "
					 "first block is its sink block and no other is", i, p->name), -EINVAL);
			goto out;
		}
		if (publish_block(p, b, &blk) < 0 || !kvq_lease_sealed(c->lease, blk) ||
		    kvq_pool_check_sealed(p->pool, blk, KVQ_POOL_BIT(KVQ_POOL_PRIVATE)) < 0 ||
		    kvq_lease_sealed_add(seen, blk, (uint32_t)i + 1) != 1) {
			ret = (kvq_seterr(err, errlen,
					 "publish.blocks[%zu].%s %u: not an unpublished block held by the "
					 "caller (or named twice)", i, fld, wid), -EINVAL);
			goto out;
		}
		if (!has_parent)
			continue;
		if (publish_parent(p, b, &par) < 0 ||
		    (!kvq_lease_sealed(seen, (uint32_t)par) &&
		     (!kvq_lease_sealed(c->lease, (uint32_t)par) ||
		      kvq_pool_check_sealed(p->pool, (uint32_t)par, KVQ_POOL_BIT(KVQ_POOL_CACHED)) < 0))) {
			ret = (kvq_seterr(err, errlen,
					 "publish.blocks[%zu]: its parent is neither a cached block the caller holds "
					 "nor an earlier block of this request", i), -EINVAL);
			goto out;
		}
		if ((uint32_t)par == blk) {
			ret = (kvq_seterr(err, errlen, "publish.blocks[%zu]: its own parent", i), -EINVAL);
			goto out;
		}
	}
	if (kvq_lease_reserve(c->lease, (uint32_t)q->n_blocks, 0) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < q->n_blocks; i++) {
		const Kvq__PublishBlock *b = q->blocks[i];
		uint32_t blk = 0, got, j;
		int32_t parent;

		publish_block(p, b, &blk);   /* validated above */
		publish_parent(p, b, &parent);
		/* a parent published earlier in this request (seen maps it to
		 * its index + 1) may have become a cached duplicate */
		j = parent >= 0 ? kvq_lease_sealed(seen, (uint32_t)parent) : 0;
		if (j)
			parent = (int32_t)ids[j - 1];
		ret = kvq_prefix_publish(p->prefix, blk, parent, b->tokens, b->salt.data, b->salt.len, &got);
		if (ret < 0) {
			/* validated above: only libcrypto can fail here */
			kvq_log(LOG_ERR, "pool %s: publish of block %u failed: %s", p->name, blk, strerror(-ret));
			kvq_seterr(err, errlen, "publish.blocks[%zu] failed; blocks before it are published", i);
			goto out;
		}
		if (got != blk) {
			/* the caller's holds move to the cached copy and the duplicate
			 * goes, unless the copy is at its reference limit */
			uint32_t n = kvq_lease_sealed(c->lease, blk);

			if (kvq_lease_take(c->lease, p->pool, KVQ_LEASE_REF, got, n) == 0)
				kvq_lease_give(c->lease, p->pool, KVQ_LEASE_REF, blk, n);
			else
				got = blk;
		}
		ids[i] = got;
	}
	/* the ids in the blocks' classes, once every parent was resolved */
	for (size_t i = 0; i < q->n_blocks; i++)
		ids[i] = wire_of(p, ids[i]);
	rep->n_ids = q->n_blocks;
	rep->ids = ids;
	r->mem[0] = ids;
	ids = NULL;
out:
	free(ids);
	kvq_lease_free(seen);
	return ret;
}

int kvq_req_lookup(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Lookup *q = req->lookup;
	Kvq__LookupReply *rep = r->e.lookup_reply;
	struct kvq_pools_rec *p = c->pool;
	uint32_t max_ids = (uint32_t)(q->n_tokens / p->L->block_tokens), n = 0, sinks = 0;
	uint64_t fresh = 0;
	uint32_t *ids;
	int ret;

	if (max_ids > KVQ_PROTO_MAX_IDS)
		max_ids = KVQ_PROTO_MAX_IDS;
	ids = calloc(max_ids + 1, sizeof(*ids));
	if (!ids || kvq_lease_reserve(c->lease, max_ids, 0) < 0) {
		free(ids);
		return -ENOMEM;
	}
	if (p->glink.g) {
		/* a group's member: the hit the request's first rank fixed */
		const struct kvq_config_limits *lim = &c->st->cfg->limits;

		ret = kvq_group_lookup(p, q->request_id.data, q->request_id.len, q->tokens, (uint32_t)q->n_tokens,
				       q->max_tokens, q->salt.data, q->salt.len, ids, max_ids, &n, c->active_ms,
				       lim->group_lookup_timeout_ms, lim->group_pending_lookups);
		if (ret < 0) {
			free(ids);
			if (ret == -EINVAL)
				return kvq_seterr(err, errlen, "pool %s is rank %u of group %s: a lookup needs a "
						  "request_id of 1 to %u bytes, its other ranks' and no more tokens",
						  p->name, p->glink.rank, p->group, KVQ_GROUP_MAX_REQUEST_ID), ret;
			return kvq_seterr(err, errlen, "group lookup failed: %s", ret == -EALREADY ?
					  "this rank looked the request up already" : ret == -EBUSY ?
					  "too many requests wait for ranks (group_pending_lookups)" : strerror(-ret)), ret;
		}
	} else {
		ret = kvq_prefix_lookup(p->prefix, q->tokens, (uint32_t)q->n_tokens, q->max_tokens, q->salt.data,
					q->salt.len, ids, max_ids, &n);
		if (ret < 0) {
			free(ids);
			return kvq_seterr(err, errlen, "lookup failed: %s", strerror(-ret)), ret;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		if (!kvq_lease_sealed(c->lease, ids[i]))
			fresh += ids[i] >= p->L->n_sealed ? p->L->open_block_bytes : p->L->sealed_block_bytes;
	if (!kvq_state_quota_allows(c->st, p, c->uid, fresh)) {
		/* the references the lookup granted, not yet any lease's */
		for (uint32_t i = 0; i < n; i++)
			kvq_pool_unref(p->pool, ids[i]);
		free(ids);
		return kvq_seterr(err, errlen, "uid %u would exceed its quota in pool %s", (unsigned)c->uid,
				  p->name), -EDQUOT;
	}
	for (uint32_t i = 0; i < n; i++)
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, ids[i], 1);
	p->lookup_tokens += q->max_tokens;
	p->hit_tokens += (uint64_t)n * p->L->block_tokens;
	/* a chain's sink block comes first (daemon/prefix.h): block 0's */
	if (n && ids[0] >= p->L->n_sealed) {
		ids[0] = wire_of(p, ids[0]);
		sinks = 1;
	}
	rep->n_sink_ids = sinks;
	rep->sink_ids = ids;
	rep->n_sealed_ids = n - sinks;
	rep->sealed_ids = ids + sinks;
	r->mem[0] = ids;
	return 0;
}

/* Checks that the caller holds every block with its multiplicity in ids[n]
 * (block ids, daemon/pool.h); counts are left in *ret_want (free it). */
static int check_held(struct kvq_conn *c, const uint32_t *ids, size_t n, const char *what, kvq_lease **ret_want,
		      char *err, size_t errlen)
{
	const struct kvq_pools_rec *p = c->pool;
	kvq_lease *want = NULL;
	int ret = kvq_lease_new(&want);

	if (ret < 0)
		return ret;
	for (size_t i = 0; i < n; i++) {
		if (kvq_lease_sealed_add(want, ids[i], 1) < 0) {
			kvq_lease_free(want);
			return -ENOMEM;
		}
		if (kvq_lease_sealed(want, ids[i]) > kvq_lease_sealed(c->lease, ids[i])) {
			kvq_lease_free(want);
			return kvq_seterr(err, errlen, "%s: block %zu (%s %u): not held by the caller (that many times)",
					  what, i, ids[i] >= p->L->n_sealed ? "sink" : "sealed", wire_of(p, ids[i])),
			       -EINVAL;
		}
	}
	*ret_want = want;
	return 0;
}

int kvq_req_release(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Release *q = req->release;
	struct kvq_pools_rec *p = c->pool;
	kvq_lease *want = NULL;
	size_t nb = q->n_sealed_ids + q->n_sink_ids;
	uint32_t *owned;
	int ret;
	const uint32_t *blk = blocks_of(p, q->sealed_ids, q->n_sealed_ids, q->sink_ids, q->n_sink_ids, "release",
					&owned, &ret, err, errlen);

	if (ret < 0)
		return ret;
	ret = check_held(c, blk, nb, "release", &want, err, errlen);
	if (ret < 0) {
		free(owned);
		return ret;
	}
	for (size_t i = 0; i < q->n_open_ids; i++)
		if (!kvq_lease_open_has(c->lease, q->open_ids[i]) || kvq_lease_open_add(want, q->open_ids[i]) < 0) {
			kvq_lease_free(want);
			free(owned);
			return kvq_seterr(err, errlen, "release.open_ids[%zu] = %u: not held (or named twice)", i,
					  q->open_ids[i]), -EINVAL;
		}
	for (size_t i = 0; i < nb; i++)
		kvq_lease_give(c->lease, p->pool, KVQ_LEASE_REF, blk[i], 1);
	for (size_t i = 0; i < q->n_open_ids; i++)
		kvq_lease_give(c->lease, p->pool, KVQ_LEASE_OPEN, q->open_ids[i], 1);
	kvq_lease_free(want);
	free(owned);
	return 0;
}

int kvq_req_fork(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Fork *q = req->fork;
	struct kvq_pools_rec *p = c->pool;
	size_t nb = q->n_sealed_ids + q->n_sink_ids;
	uint32_t *owned;
	int ret;
	const uint32_t *blk = blocks_of(p, q->sealed_ids, q->n_sealed_ids, q->sink_ids, q->n_sink_ids, "fork", &owned,
					&ret, err, errlen);

	if (ret < 0)
		return ret;
	for (size_t i = 0; i < nb; i++) {
		uint32_t id = blk[i];

		if (!kvq_lease_sealed(c->lease, id)) {
			free(owned);
			return kvq_seterr(err, errlen, "fork: block %zu (%s %u) not held by the caller", i,
					  id >= p->L->n_sealed ? "sink" : "sealed", wire_of(p, id)), -EINVAL;
		}
		/* a batch naming one id n times must fit below the limits n times over */
		if (kvq_pool_refs(p->pool, id) >= KVQ_POOL_MAX_REFS - nb ||
		    kvq_lease_sealed(c->lease, id) >= UINT32_MAX - nb) {
			free(owned);
			return kvq_seterr(err, errlen, "fork: block %zu (%s %u): too many references", i,
					  id >= p->L->n_sealed ? "sink" : "sealed", wire_of(p, id)), -EOVERFLOW;
		}
	}
	for (size_t i = 0; i < nb; i++)
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_REF, blk[i], 1);
	free(owned);
	return 0;
}
