/* SPDX-License-Identifier: Apache-2.0 */
/* Block requests of an attached connection: Alloc, Seal, Publish,
 * Release, Fork (Lookup: req_lookup.c).  Each checks the whole batch against the pool and the
 * lease, makes room in the lease, then applies it (kvq_lease_take and
 * kvq_lease_give move every hold in both). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "log.h"
#include "request.h"
#include "wire_block.h"
#include "seterr.h"
#include "timing_buckets.h"

/* The block ids of m's list of blocks (KVQ_WIRE_IDS: Release, Fork), each
 * checked against the pool, in a new array (free it) of *ret_n, and *ret 0;
 * or NULL and *ret -EINVAL (an index out of its class's range, err set) or
 * -ENOMEM. */
static uint32_t *blocks_of(const struct kvq_pools_rec *p, const ProtobufCMessage *m, const char *what,
			   size_t *ret_n, int *ret, char *err, size_t errlen)
{
	struct kvq_block_ref *refs;
	uint32_t *b;
	size_t n, k[KVQ_BLOCK_NCLASS] = { 0 };

	*ret = -ENOMEM;
	kvq_wire_blocks_get(m, KVQ_WIRE_IDS, NULL, 0, &n);
	refs = calloc(n + 1, sizeof(*refs));
	b = calloc(n + 1, sizeof(*b));
	if (!refs || !b || kvq_wire_blocks_get(m, KVQ_WIRE_IDS, refs, n, &n) < 0)
		goto fail;
	for (size_t i = 0; i < n; i++) {
		if (kvq_layout_block_id(p->L, refs[i], &b[i]) < 0) {
			*ret = -EINVAL;
			kvq_seterr(err, errlen, "%s.%s[%zu] = %u: out of range", what,
				   kvq_wire_block_field(KVQ_WIRE_IDS, refs[i].cls), k[refs[i].cls], refs[i].index);
			goto fail;
		}
		k[refs[i].cls]++;   /* the next one's index in its field */
	}
	free(refs);
	*ret_n = n;
	*ret = 0;
	return b;
fail:
	free(refs);
	free(b);
	return NULL;
}

/* Slots of one class an Alloc is short of: need over have, else 0. */
static uint32_t alloc_short(uint64_t need, uint64_t have)
{
	return need > have ? (uint32_t)(need - have) : 0;
}

int kvq_req_alloc(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Alloc *a = req->alloc;
	Kvq__AllocReply *rep = r->e.alloc_reply;
	struct kvq_pools_rec *p = c->pool;
	struct kvq_pool_stats st;
	uint32_t *open = NULL, *resv = NULL, *sealed = NULL, *sink = NULL, *wire = NULL;
	struct kvq_block_ref *refs = NULL;
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
	rep->short_open = alloc_short(a->n_open, st.open_free);
	rep->short_sealed = alloc_short((uint64_t)a->n_open + a->n_sealed,
					(uint64_t)st.sealed_free + kvq_prefix_evictable(p->prefix, 0));
	rep->short_sink = alloc_short(a->n_sink, (uint64_t)st.sink_free + kvq_prefix_evictable(p->prefix, 1));
	if (rep->short_open || rep->short_sealed || rep->short_sink) {
		p->alloc_failures++;
		r->refusal_body = true;   /* the shortfall (kvq.proto, AllocReply) */
		return kvq_seterr(err, errlen, "pool %s cannot hold %u open + %u sealed + %u sink slots "
				  "(short of %u + %u + %u)", p->name, a->n_open, a->n_sealed, a->n_sink,
				  rep->short_open, rep->short_sealed, rep->short_sink), -ENOSPC;
	}
	open = calloc(a->n_open + 1, sizeof(*open));
	resv = calloc(a->n_open + 1, sizeof(*resv));
	sealed = calloc(a->n_sealed + 1, sizeof(*sealed));
	sink = a->n_sink ? calloc(a->n_sink, sizeof(*sink)) : NULL;
	refs = calloc((size_t)a->n_sealed + a->n_sink + 1, sizeof(*refs));
	wire = calloc((size_t)a->n_sealed + a->n_sink + 1, sizeof(*wire));
	if (!open || !resv || !sealed || (a->n_sink && !sink) || !refs || !wire ||
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
	for (uint32_t i = 0; i < a->n_sealed; i++) {
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, sealed[i], 1);
		refs[i] = kvq_layout_block_ref(p->L, sealed[i]);
	}
	for (uint32_t i = 0; i < a->n_sink; i++) {
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_GRANTED, sink[i], 1);
		refs[a->n_sealed + i] = kvq_layout_block_ref(p->L, sink[i]);
	}
	kvq_wire_blocks_put(&rep->base, KVQ_WIRE_IDS, refs, (size_t)a->n_sealed + a->n_sink, wire);
	rep->n_open_ids = rep->n_reserved_ids = a->n_open;
	rep->open_ids = open;
	rep->reserved_ids = resv;
	r->mem[0] = open;
	r->mem[1] = resv;
	r->mem[2] = wire;
	free(sealed);
	free(sink);
	free(refs);
	return 0;
fail:
	free(open);
	free(resv);
	free(sealed);
	free(sink);
	free(refs);
	free(wire);
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

/* A publish block's own reference (g KVQ_WIRE_BLOCK) or its parent's
 * (KVQ_WIRE_PARENT) in *ret: 1, or 0 when it has none. */
static size_t publish_ref(const Kvq__PublishBlock *b, enum kvq_wire_group g, struct kvq_block_ref *ret)
{
	size_t n = 0;

	return kvq_wire_blocks_get(&b->base, g, ret, 1, &n) == 0 ? n : 0;
}

/* A publish block's own block id in *blk: 0, or -1 when out of its class's
 * range. */
static int publish_block(const struct kvq_pools_rec *p, const Kvq__PublishBlock *b, uint32_t *blk)
{
	struct kvq_block_ref r;

	return publish_ref(b, KVQ_WIRE_BLOCK, &r) && kvq_layout_block_id(p->L, r, blk) == 0 ? 0 : -1;
}

/* Its parent's block id in *par, or -1 when it has none: 0, or -1 when the
 * id is out of its class's range. */
static int publish_parent(const struct kvq_pools_rec *p, const Kvq__PublishBlock *b, int32_t *par)
{
	struct kvq_block_ref r;
	uint32_t pb;

	*par = -1;
	if (!publish_ref(b, KVQ_WIRE_PARENT, &r))
		return 0;
	if (kvq_layout_block_id(p->L, r, &pb) < 0)
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
		struct kvq_block_ref ref = { 0 }, pref;
		const size_t has_ref = publish_ref(b, KVQ_WIRE_BLOCK, &ref);
		const int sink = has_ref && ref.cls == KVQ_BLOCK_SINK;
		const int has_parent = publish_ref(b, KVQ_WIRE_PARENT, &pref) != 0;
		const char *fld = kvq_wire_block_field(KVQ_WIRE_BLOCK, ref.cls);
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
					 "caller (or named twice)", i, fld, ref.index), -EINVAL);
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
		/* a new cached block: its remote key, and its write (daemon/rtier.h) */
		if (got == blk && p->rtier)
			kvq_rtier_published(p->rtier, blk, parent, b->tokens, b->salt.data, b->salt.len);
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
	/* the ids as indexes in the blocks' classes, once every parent was resolved */
	for (size_t i = 0; i < q->n_blocks; i++)
		ids[i] = kvq_layout_block_ref(p->L, ids[i]).index;
	rep->n_ids = q->n_blocks;
	rep->ids = ids;
	r->mem[0] = ids;
	ids = NULL;
out:
	free(ids);
	kvq_lease_free(seen);
	return ret;
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
			const struct kvq_block_ref b = kvq_layout_block_ref(p->L, ids[i]);

			kvq_lease_free(want);
			return kvq_seterr(err, errlen, "%s: block %zu (%s %u): not held by the caller (that many times)",
					  what, i, kvq_block_class_name(b.cls), b.index),
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
	size_t nb = 0;
	int ret;
	uint32_t *blk = blocks_of(p, &q->base, "release", &nb, &ret, err, errlen);

	if (ret < 0)
		return ret;
	ret = check_held(c, blk, nb, "release", &want, err, errlen);
	if (ret < 0) {
		free(blk);
		return ret;
	}
	for (size_t i = 0; i < q->n_open_ids; i++)
		if (!kvq_lease_open_has(c->lease, q->open_ids[i]) || kvq_lease_open_add(want, q->open_ids[i]) < 0) {
			kvq_lease_free(want);
			free(blk);
			return kvq_seterr(err, errlen, "release.open_ids[%zu] = %u: not held (or named twice)", i,
					  q->open_ids[i]), -EINVAL;
		}
	for (size_t i = 0; i < nb; i++)
		kvq_lease_give(c->lease, p->pool, KVQ_LEASE_REF, blk[i], 1);
	for (size_t i = 0; i < q->n_open_ids; i++)
		kvq_lease_give(c->lease, p->pool, KVQ_LEASE_OPEN, q->open_ids[i], 1);
	kvq_lease_free(want);
	free(blk);
	return 0;
}

int kvq_req_fork(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	const Kvq__Fork *q = req->fork;
	struct kvq_pools_rec *p = c->pool;
	size_t nb = 0;
	int ret;
	uint32_t *blk = blocks_of(p, &q->base, "fork", &nb, &ret, err, errlen);

	if (ret < 0)
		return ret;
	for (size_t i = 0; i < nb; i++) {
		const uint32_t id = blk[i];
		const struct kvq_block_ref b = kvq_layout_block_ref(p->L, id);

		if (!kvq_lease_sealed(c->lease, id)) {
			free(blk);
			return kvq_seterr(err, errlen, "fork: block %zu (%s %u) not held by the caller", i,
					  kvq_block_class_name(b.cls), b.index), -EINVAL;
		}
		/* a batch naming one id n times must fit below the limits n times over */
		if (kvq_pool_refs(p->pool, id) >= KVQ_POOL_MAX_REFS - nb ||
		    kvq_lease_sealed(c->lease, id) >= UINT32_MAX - nb) {
			free(blk);
			return kvq_seterr(err, errlen, "fork: block %zu (%s %u): too many references", i,
					  kvq_block_class_name(b.cls), b.index), -EOVERFLOW;
		}
	}
	for (size_t i = 0; i < nb; i++)
		kvq_lease_take(c->lease, p->pool, KVQ_LEASE_REF, blk[i], 1);
	free(blk);
	return 0;
}
