/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier's writes (daemon/rtier.h): the write queue and its
 * drain, write-through at publish, write-back at eviction (the leave hooks
 * of the prefix index and of the host tier). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis.h>

#include "blockrec.h"
#include "log.h"
#include "rcluster.h"
#include "remote_key.h"
#include "remote_value.h"
#include "rtier_int.h"
#include "tier.h"

/* ----------------------------------------------------------------- write */

static void write_cb(void *ctx, int status, struct redisReply *reply)
{
	struct kvq_rtier *t = ctx;

	t->writing--;
	if (status < 0)
		rtier_error(t, rtier_status_error(status), "a write");
	else if (reply->type != REDIS_REPLY_STATUS)
		rtier_error(t, KVQ_RTIER_E_REPLY, "a write");
	else
		t->st.written++;
	if (t->qlen && t->drain)
		event_active(t->drain, EV_TIMEOUT, 0);
	rtier_unref(t);
}

/* w's value into a new buffer (*ret, *ret_len; free it): its block packed
 * from the pool (a pool kvqd does not map: its slices DMA'd into the
 * staging), or its record copied from the host tier's (rec, NULL: none),
 * summed (it leaves the process, kernels/blockrec.h); the header and the
 * HMAC.  0, or a negative code (logged). */
static int value_make(struct kvq_rtier *t, const struct rtier_write *w, const void *rec, uint32_t cls,
		      uint8_t **ret, size_t *ret_len)
{
	const struct kvq_layout *L = t->p.L;
	struct kvq_block_ref ref = rec ? (struct kvq_block_ref){ .cls = cls } : kvq_layout_block_ref(L, w->id);
	const uint64_t rlen = kvq_blockrec_size(L, ref.cls);
	const size_t vlen = kvq_remote_value_size(rlen);
	struct kvq_remote_value_head h = { .has_parent = w->has_parent, .rank = t->rank, .world = t->world };
	const uint8_t *lparent = w->has_parent ? w->lparent : NULL;
	char why[160] = "";
	uint8_t *buf = malloc(vlen);
	int r;

	if (!buf)
		return -ENOMEM;
	if (!rec && t->stage) {
		const uint8_t *staged;

		r = kvq_rstage_pull(t->stage, ref, &staged, why, sizeof why);
		if (r < 0) {
			kvq_log(LOG_ERR, "pool %s: block %u not written to remote %s: %s", t->p.name, w->id,
				t->rm->name, why);
			free(buf);
			return r;
		}
		rec = staged;
	}
	memcpy(h.identity, t->identity, sizeof h.identity);
	memcpy(h.chain, w->chain, sizeof h.chain);
	if (w->has_parent)
		memcpy(h.parent, w->parent, sizeof h.parent);
	if (rec) {
		/* the tier's record is unsummed, the staged one has no header:
		 * sealed, summed */
		memcpy(kvq_remote_value_payload(buf), rec, rlen);
		r = kvq_blockrec_seal(L, ref.cls, w->lkey, lparent, NULL, 1, kvq_remote_value_payload(buf), rlen);
	} else {
		r = kvq_blockrec_pack(L, t->p.map, ref, w->lkey, lparent, NULL, 1, kvq_remote_value_payload(buf), rlen,
				      why, sizeof why);
	}
	if (r == 0)
		r = kvq_remote_value_encode(t->codec, &h, kvq_remote_value_payload(buf), rlen, buf, vlen, ret_len);
	if (r < 0) {
		kvq_log(LOG_ERR, "pool %s: block %u not written to remote %s: %s", t->p.name, w->id, t->rm->name,
			r == -EFBIG ? "over max_value_bytes" : why[0] ? why : strerror(-r));
		free(buf);
		return r;
	}
	*ret = buf;
	return 0;
}

/* SETs value buf[len] under w's key: 0, or a negative code (counted). */
static int value_send(struct kvq_rtier *t, const struct rtier_write *w, const uint8_t *buf, size_t len)
{
	char key[KVQ_REMOTE_KEY_MAX];
	int klen = kvq_remote_redis_key(t->identity, w->chain, t->rank, t->world, key, sizeof key), r;

	r = klen < 0 ? klen : kvq_rcluster_set(t->rm->rc, key, (size_t)klen, buf, len, t->rm->ttl_ms, write_cb, t);
	if (r < 0) {
		rtier_error(t, rtier_status_error(r), "a write");
		return r;
	}
	t->refs++;
	t->writing++;
	t->st.bytes_out += len;
	return 0;
}

/* Writes w: its value made at eviction (write-back), or its block packed
 * now if it is still cached under its key (write-through).  0, or a
 * negative code (counted). */
static int write_one(struct kvq_rtier *t, struct rtier_write *w)
{
	uint8_t *buf = w->val;
	size_t len = w->vlen;
	int r = 0;

	if (!buf && kvq_prefix_find(t->p.prefix, w->lkey) != (int64_t)w->id)
		r = -ENOENT;   /* evicted (or demoted) before its turn */
	else if (!buf)
		r = value_make(t, w, NULL, 0, &buf, &len);
	if (r == 0)
		r = value_send(t, w, buf, len);
	if (r < 0)
		t->st.dropped++;
	free(buf);
	w->val = NULL;
	return r;
}

void rtier_drain_cb(evutil_socket_t fd, short what, void *arg)
{
	struct kvq_rtier *t = arg;

	(void)fd;
	(void)what;
	while (t->attached && t->qlen && t->writing < t->max_writing) {
		struct rtier_write w = t->q[t->qhead];

		t->qhead = (t->qhead + 1) % t->qcap;
		t->qlen--;
		t->qbytes -= w.vlen;
		write_one(t, &w);
	}
}

/* w into the write queue: false when it is full (w's value is then the
 * caller's). */
static bool queue_add(struct kvq_rtier *t, const struct rtier_write *w)
{
	if (t->qlen == t->qcap || (t->qbytes && t->qbytes + w->vlen > RTIER_QUEUE_BYTES)) {
		t->st.dropped++;
		rtier_error(t, KVQ_RTIER_E_FULL, "the write queue");
		return false;
	}
	t->q[(t->qhead + t->qlen++) % t->qcap] = *w;
	t->qbytes += w->vlen;
	if (t->qlen == 1)
		event_active(t->drain, EV_TIMEOUT, 0);
	return true;
}

void kvq_rtier_published(struct kvq_rtier *t, uint32_t id, int32_t parent, const uint32_t *tokens,
			 const void *salt, size_t salt_len)
{
	struct rtier_write w = { .id = id, .has_parent = parent >= 0 };
	const uint8_t *prk = NULL;

	/* its local key, looked up once: learnt with it, and written under it */
	if (!t->attached || id >= t->nb || kvq_prefix_block_key(t->p.prefix, id, w.lkey) < 0)
		return;
	if (w.has_parent && rtier_rkey(t, (uint32_t)parent, w.lparent, &prk) < 0) {
		/* its parent's remote key is not known: neither is its own */
		if (t->write == KVQ_REMOTE_WRITE_THROUGH)
			t->st.dropped++;
		return;
	}
	if (prk)
		memcpy(w.parent, prk, sizeof w.parent);
	if (kvq_rtier_chain(t, prk, tokens, salt, salt_len, w.chain) < 0)
		return;
	rtier_learn_as(t, id, w.lkey, w.chain);
	if (t->write == KVQ_REMOTE_WRITE_THROUGH)
		queue_add(t, &w);
}

/* ------------------------------------------------------------ write-back */

static struct rtier_demoted *dm_at(struct kvq_rtier *t, const uint8_t *lkey)
{
	uint64_t v;

	memcpy(&v, lkey, sizeof v);
	return &t->dm[(v * t->dm_mult) >> (64 - t->dm_bits)];
}

static struct rtier_demoted *dm_next(struct kvq_rtier *t, struct rtier_demoted *e)
{
	return e + 1 == t->dm + ((size_t)1 << t->dm_bits) ? t->dm : e + 1;
}

/* The entry of lkey, or NULL. */
static struct rtier_demoted *dm_find(struct kvq_rtier *t, const uint8_t *lkey)
{
	for (struct rtier_demoted *e = t->dm ? dm_at(t, lkey) : NULL; e && e->used; e = dm_next(t, e))
		if (!memcmp(e->lkey, lkey, KVQ_CHAINKEY_LEN))
			return e;
	return NULL;
}

/* w's keys kept under its local key: 0, or -ENOSPC (the map is full). */
static int dm_put(struct kvq_rtier *t, const struct rtier_write *w)
{
	struct rtier_demoted *e = dm_find(t, w->lkey);

	if (!e) {
		if ((uint64_t)(t->dm_len + 1) * 4 > ((uint64_t)3 << t->dm_bits))
			return -ENOSPC;
		for (e = dm_at(t, w->lkey); e->used; e = dm_next(t, e))
			;
		t->dm_len++;
	}
	*e = (struct rtier_demoted){ .used = true, .has_parent = w->has_parent };
	memcpy(e->lkey, w->lkey, KVQ_CHAINKEY_LEN);
	memcpy(e->lparent, w->lparent, KVQ_CHAINKEY_LEN);
	memcpy(e->chain, w->chain, KVQ_CHAINKEY_LEN);
	memcpy(e->parent, w->parent, KVQ_CHAINKEY_LEN);
	return 0;
}

/* e out of the map (linear probing: the entries after it move up). */
static void dm_del(struct kvq_rtier *t, struct rtier_demoted *e)
{
	struct rtier_demoted *hole = e;

	hole->used = false;
	t->dm_len--;
	for (e = dm_next(t, e); e->used; e = dm_next(t, e)) {
		struct rtier_demoted *home = dm_at(t, e->lkey);
		/* e stays unless the hole lies between its home and it */
		bool stays = hole < e ? home > hole && home <= e : home > hole || home <= e;

		if (!stays) {
			*hole = *e;
			e->used = false;
			hole = e;
		}
	}
}

/* w's value made (from the pool, or rec of class cls from the tier) and
 * queued; full, dropped and counted. */
static void back_queue(struct kvq_rtier *t, struct rtier_write *w, const void *rec, uint32_t cls)
{
	const uint64_t vlen = kvq_remote_value_size(kvq_blockrec_size(t->p.L,
		rec ? cls : kvq_layout_block_ref(t->p.L, w->id).cls));

	if (t->qlen == t->qcap || (t->qbytes && t->qbytes + vlen > RTIER_QUEUE_BYTES)) {
		queue_add(t, w);   /* counts it, refused */
		return;
	}
	if (value_make(t, w, rec, cls, &w->val, &w->vlen) < 0) {
		t->st.dropped++;
		return;
	}
	if (!queue_add(t, w))
		free(w->val);
}

/* Write-back: block id leaves the pool (the prefix index's leave hook),
 * its bytes still in its slot.  Without a copy it leaves every local
 * tier: packed now into its value, queued, so that the slot may be reused
 * at once.  Demoted to the host tier, its remote keys are kept for when
 * its record leaves the tier (rtier_tier_leave). */
void rtier_on_leave(void *arg, uint32_t id, int32_t parent, int demote)
{
	struct kvq_rtier *t = arg;
	struct rtier_write w = { .id = id, .has_parent = parent >= 0 };
	struct rtier_demoted *e = NULL;
	const uint8_t *rk, *prk;

	if (!t->attached)
		return;
	if (rtier_rkey(t, id, w.lkey, &rk) == 0 &&
	    (!w.has_parent || rtier_rkey(t, (uint32_t)parent, w.lparent, &prk) == 0)) {
		memcpy(w.chain, rk, sizeof w.chain);
		if (w.has_parent)
			memcpy(w.parent, prk, sizeof w.parent);
	} else if ((e = dm_find(t, w.lkey))) {
		/* promoted from the host tier: its keys kept from its demotion */
		memcpy(w.lparent, e->lparent, sizeof w.lparent);
		memcpy(w.chain, e->chain, sizeof w.chain);
		memcpy(w.parent, e->parent, sizeof w.parent);
		w.has_parent = e->has_parent;
	} else {
		t->st.dropped++;   /* its remote key (or its parent's) is not known */
		return;
	}
	if (demote) {
		if (dm_put(t, &w) < 0) {
			t->st.dropped++;
			rtier_error(t, KVQ_RTIER_E_FULL, "the write-back's keys of the host tier");
		}
		return;
	}
	if (e)
		dm_del(t, e);
	back_queue(t, &w, NULL, 0);
}

/* Write-back: record r leaves the host tier (the tier's leave hook): gone,
 * its block leaves every local tier and its record is written; else its
 * copy failed and its keys are forgotten. */
void rtier_tier_leave(void *arg, uint32_t r, bool gone)
{
	struct kvq_rtier *t = arg;
	struct rtier_demoted *e = t->attached ? dm_find(t, kvq_tier_rec_key(t->p.tier, r)) : NULL;
	struct rtier_write w = { .id = r };

	if (!e) {
		t->st.dropped += gone && t->attached;
		return;
	}
	w.has_parent = e->has_parent;
	memcpy(w.lkey, e->lkey, sizeof w.lkey);
	memcpy(w.lparent, e->lparent, sizeof w.lparent);
	memcpy(w.chain, e->chain, sizeof w.chain);
	memcpy(w.parent, e->parent, sizeof w.parent);
	dm_del(t, e);
	if (gone)
		back_queue(t, &w, kvq_tier_rec(t->p.tier, r, NULL), kvq_tier_rec_cls(t->p.tier, r));
}
