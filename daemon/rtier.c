/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's remote tier at work: daemon/rtier.h.  Here its remotes, the
 * tier's life, its stats and its chain keys; its writes in rtier_write.c,
 * its fetches in rtier_fetch.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/random.h>

#include <event2/event.h>
#include <openssl/crypto.h>

#include "blockrec.h"
#include "log.h"
#include "rcluster.h"
#include "remote_key.h"
#include "remote_value.h"
#include "rtier_int.h"
#include "seterr.h"
#include "tier.h"

#define RTIER_VERIFY_MAX 4u       /* threads verifying fetched values */

struct kvq_rtiers {
	struct event_base *base;
	uint32_t n;
	struct rtier_remote *r;
	kvq_copier *verify;                 /* fetched values, verified (a host pool's unpacked too) */
};

static const char *const error_names[] = {
#define KVQ_RTIER_N(id, name) name,
	KVQ_RTIER_ERRORS(KVQ_RTIER_N)
#undef KVQ_RTIER_N
};

/* --------------------------------------------------------------- remotes */

int kvq_rtiers_new(struct event_base *base, const struct kvq_config *cfg, struct kvq_rtiers **ret, char *err,
		   size_t errlen)
{
	struct kvq_rtiers *rs;
	long ncpu;
	int r;

	*ret = NULL;
	if (!cfg->n_remotes)
		return 0;
	rs = calloc(1, sizeof *rs);
	if (!rs || !(rs->r = calloc(cfg->n_remotes, sizeof *rs->r))) {
		free(rs);
		return -ENOMEM;
	}
	rs->base = base;
	/* as many threads as cores, within a bound: a value's HMAC takes
	 * longer than its bytes take to come on loopback */
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	r = kvq_copier_new_threads(base, ncpu < 1 ? 1 : ncpu > RTIER_VERIFY_MAX ? RTIER_VERIFY_MAX : (unsigned)ncpu,
				   "kvqd-verify", &rs->verify);
	if (r < 0) {
		free(rs->r);
		free(rs);
		return kvq_seterr(err, errlen, "the remotes' copy threads: %s", strerror(-r)), r;
	}
	for (uint32_t i = 0; i < cfg->n_remotes; i++) {
		const struct kvq_config_remote *c = &cfg->remotes[i];
		struct rtier_remote *m = &rs->r[i];
		const struct kvq_rcluster_opts o = { .seeds = c->nodes, .user = c->user[0] ? c->user : NULL,
			.password = c->password[0] ? c->password : NULL, .connect_ms = c->connect_timeout_ms,
			.request_ms = c->request_timeout_ms, .max_inflight = c->max_inflight,
			.max_request_bytes = c->max_value_bytes + 4096 };
		char why[256] = "";

		snprintf(m->name, sizeof m->name, "%s", c->name);
		memcpy(m->key, c->hmac_key, c->hmac_key_len);
		m->key_len = c->hmac_key_len;
		m->max_value = c->max_value_bytes;
		m->ttl_ms = (uint64_t)c->ttl_s * 1000;
		m->max_inflight = c->max_inflight;
		rs->n = i + 1;
		r = kvq_rcluster_new(base, &o, &m->rc, why, sizeof why);
		if (r < 0) {
			kvq_seterr(err, errlen, "remote %s: %s", c->name, why[0] ? why : strerror(-r));
			kvq_rtiers_free(rs);
			return r;
		}
		kvq_log(LOG_INFO, "remote %s: cluster client of %s", c->name, c->nodes);
	}
	*ret = rs;
	return 0;
}

void kvq_rtiers_drain(struct kvq_rtiers *rs)
{
	if (rs)
		kvq_copier_drain(rs->verify);
}

void kvq_rtiers_free(struct kvq_rtiers *rs)
{
	if (!rs)
		return;
	for (uint32_t i = 0; i < rs->n; i++) {
		kvq_rcluster_free(rs->r[i].rc);
		OPENSSL_cleanse(rs->r[i].key, sizeof rs->r[i].key);
	}
	kvq_copier_free(rs->verify);
	free(rs->r);
	free(rs);
}

/* ------------------------------------------------------------ the tier */

void rtier_unref(struct kvq_rtier *t)
{
	if (--t->refs)
		return;
	kvq_remote_codec_free(t->codec);
	kvq_remote_codec_free(t->vcodec);
	kvq_chainkey_fini(&t->ck);
	free(t);
}

/* Counts error e, with a rate-limited line. */
void rtier_error(struct kvq_rtier *t, enum kvq_rtier_error e, const char *what)
{
	t->st.errors[e]++;
	if (e != KVQ_RTIER_E_CANCELLED)
		kvq_log_limited(&t->lim[e], LOG_WARNING, "pool %s: remote %s: %s: %s (%s)",
				t->attached ? t->p.name : "?", t->rm->name, what, error_names[e],
				strncmp(what, "a write", 7) && strncmp(what, "the write", 9) ? "a miss" : "not written");
}

void kvq_rtier_count_error(struct kvq_rtier *t, enum kvq_rtier_error e)
{
	rtier_error(t, e, "a fetched record");
}

/* The error of a cluster client's status. */
enum kvq_rtier_error rtier_status_error(int status)
{
	switch (status) {
	case -ETIMEDOUT: return KVQ_RTIER_E_TIMEOUT;
	case -ECONNRESET: return KVQ_RTIER_E_CONN;
	case -ENETDOWN: return KVQ_RTIER_E_DOWN;
	case -ELOOP: return KVQ_RTIER_E_LOOP;
	case -EACCES: return KVQ_RTIER_E_AUTH;
	case -EAGAIN: return KVQ_RTIER_E_FULL;
	case -ECANCELED: return KVQ_RTIER_E_CANCELLED;
	default: return KVQ_RTIER_E_REPLY;
	}
}

int kvq_rtier_new(struct kvq_rtiers *rs, const struct kvq_config_pool *cp, const struct kvq_rtier_pool *p,
		  struct kvq_rtier **ret, char *err, size_t errlen)
{
	struct rtier_remote *rm = NULL;
	struct kvq_rtier *t;
	struct kvq_remote_identity id;
	int r;

	*ret = NULL;
	if (!cp || !cp->remote[0])
		return 0;
	for (uint32_t i = 0; rs && i < rs->n; i++)
		if (!strcmp(rs->r[i].name, cp->remote))
			rm = &rs->r[i];
	if (!rm)
		return kvq_seterr(err, errlen, "pool %s: remote %s is not running (a reload added it?)", p->name,
				  cp->remote), -ENOENT;
	if (!p->map && !p->mem)
		return kvq_seterr(err, errlen, "pool %s: its memory cannot be copied by kvqd", p->name), -EOPNOTSUPP;
	t = calloc(1, sizeof *t);
	if (!t)
		return -ENOMEM;
	t->refs = 1;
	t->rm = rm;
	t->base = rs->base;
	t->p = *p;
	t->attached = true;
	t->write = cp->remote_write;
	t->world = 1;
	t->nb = p->L->n_sealed + p->L->n_sink;
	t->qcap = t->nb < RTIER_QUEUE_MAX ? t->nb + 1 : RTIER_QUEUE_MAX;
	t->max_writing = rm->max_inflight / 2 ? rm->max_inflight / 2 : 1;
	id = (struct kvq_remote_identity){ .model = p->model, .policy = p->policy, .layers = p->L->layers,
		.kv_heads = p->L->kv_heads, .head_dim = p->L->head_dim, .block_tokens = p->L->block_tokens,
		.window = p->L->window, .sink_blocks = p->L->sink_blocks, .act = p->L->act,
		.layout_version = KVQ_LAYOUT_VERSION, .fingerprint = kvq_blockrec_fingerprint(p->L),
		.codebooks_sha256 = p->codebooks_sha256 };
	t->lkey = calloc(t->nb, sizeof *t->lkey);
	t->rkey = calloc(t->nb, sizeof *t->rkey);
	t->known = calloc(t->nb, sizeof *t->known);
	t->q = calloc(t->qcap, sizeof *t->q);
	t->drain = event_new(rs->base, -1, 0, rtier_drain_cb, t);
	r = !t->lkey || !t->rkey || !t->known || !t->q || !t->drain ? -ENOMEM : 0;
	if (r == 0 && (r = kvq_remote_identity_digest(&id, t->identity)) < 0)
		kvq_seterr(err, errlen, "pool %s: its identity digest: %s", p->name, strerror(-r));
	if (r == 0 && ((r = kvq_remote_codec_new(rm->key, rm->key_len, rm->max_value, &t->codec)) < 0 ||
		       (r = kvq_remote_codec_new(rm->key, rm->key_len, rm->max_value, &t->vcodec)) < 0))
		kvq_seterr(err, errlen, "pool %s: the remote's codec: %s", p->name, strerror(-r));
	if (r == 0 && (r = kvq_chainkey_init(&t->ck, p->L->block_tokens, cp->remote_namespace, p->model)) < 0)
		kvq_seterr(err, errlen, "pool %s: remote keys: %s", p->name, strerror(-r));
	if (r == 0 && !p->map) {
		char why[KVQ_BACKEND_MSG_MAX] = "";

		r = kvq_rstage_open(p->mem, p->L, &t->stage, why, sizeof why);
		if (r < 0) {
			kvq_seterr(err, errlen, "pool %s: remote tier not started: its %s memory's copy channel: %s",
				   p->name, p->mem->backend->name, why);
			r = -EOPNOTSUPP;
		}
	}
	if (r == 0 && t->write == KVQ_REMOTE_WRITE_BACK && p->tier) {
		/* room for every record of the tier and every block of the pool */
		uint64_t want = ((uint64_t)kvq_tier_slots(p->tier) + t->nb) * 2;

		for (t->dm_bits = 4; ((uint64_t)1 << t->dm_bits) < want; t->dm_bits++)
			;
		t->dm = calloc((size_t)1 << t->dm_bits, sizeof *t->dm);
		if (!t->dm || getrandom(&t->dm_mult, sizeof t->dm_mult, 0) != sizeof t->dm_mult)
			r = -ENOMEM;
		t->dm_mult |= 1;
	}
	if (r < 0) {
		kvq_rtier_free(t);
		return r;
	}
	/* a cuda pool's values too: only their staging's copy and DMA, one
	 * staging, go on to the daemon's copy thread */
	t->verify = rs->verify;
	if (t->write == KVQ_REMOTE_WRITE_BACK) {
		kvq_prefix_set_leave_hook(p->prefix, rtier_on_leave, t);
		if (p->tier)
			kvq_tier_set_leave_hook(p->tier, rtier_tier_leave, t);
	}
	kvq_log(LOG_INFO, "pool %s: remote %s, namespace %s, write %s", p->name, rm->name, cp->remote_namespace,
		t->write == KVQ_REMOTE_WRITE_THROUGH ? "through" : t->write == KVQ_REMOTE_WRITE_BACK ? "back" : "off");
	*ret = t;
	return 0;
}

/* Nothing of the pool is touched again; the tier goes with its last
 * request. */
static void rtier_detach(struct kvq_rtier *t)
{
	if (t->attached && t->write == KVQ_REMOTE_WRITE_BACK) {
		kvq_prefix_set_leave_hook(t->p.prefix, NULL, NULL);
		if (t->p.tier)
			kvq_tier_set_leave_hook(t->p.tier, NULL, NULL);
	}
	free(t->dm);
	t->dm = NULL;
	/* no thread writes a slot of the pool after this: the verifying
	 * threads hand a cuda pool's checked records to the copy thread */
	if (t->jobs) {
		kvq_copier_drain(t->verify);
		if (t->stage)
			kvq_copier_drain(*t->p.copier);
	}
	kvq_rstage_close(t->stage);
	t->stage = NULL;
	t->attached = false;
	for (uint32_t i = 0; t->q && i < t->qlen; i++)
		free(t->q[(t->qhead + i) % t->qcap].val);
	if (t->drain)
		event_free(t->drain);
	t->drain = NULL;
	free(t->lkey);
	free(t->rkey);
	free(t->known);
	free(t->q);
	t->lkey = t->rkey = NULL;
	t->known = NULL;
	t->q = NULL;
	t->qlen = 0;
	rtier_unref(t);
}

void kvq_rtier_free(struct kvq_rtier *t)
{
	if (t)
		rtier_detach(t);
}

void kvq_rtier_set_rank(struct kvq_rtier *t, uint32_t rank, uint32_t world)
{
	t->rank = world > 1 ? rank : 0;
	t->world = world > 1 ? world : 1;
}

void kvq_rtier_stats(const struct kvq_rtier *t, struct kvq_rtier_stats *ret)
{
	*ret = t->st;
	ret->queue = (uint64_t)t->qlen + t->writing;
	ret->on = true;
}

int kvq_rtier_place(struct kvq_rtier *t, struct kvq_rtier_get *g, int32_t parent, const uint32_t *tokens,
		    const void *salt, size_t salt_len, uint32_t *ret_id)
{
	uint32_t slot = g->slot, got;
	int r;

	g->slot = UINT32_MAX;
	r = kvq_prefix_publish(t->p.prefix, slot, parent, tokens, salt, salt_len, &got);
	if (r == 0 && got != slot && kvq_pool_ref(t->p.pool, got) < 0)
		r = -EBUSY;
	if (r < 0 || got != slot)
		kvq_pool_unref(t->p.pool, slot);
	if (r < 0)
		return r;
	kvq_rtier_learn(t, got, g->chain);
	t->st.fetched++;
	t->st.hit_tokens += t->p.L->block_tokens;
	*ret_id = got;
	return 0;
}

int kvq_rtier_chain(struct kvq_rtier *t, const uint8_t *parent, const uint32_t *tokens, const void *salt,
		    size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN])
{
	return kvq_chainkey_make(&t->ck, parent, tokens, salt, salt_len, ret);
}

/* Block id, cached under local key lkey, has remote chain key chain. */
void rtier_learn_as(struct kvq_rtier *t, uint32_t id, const uint8_t lkey[KVQ_CHAINKEY_LEN],
		    const uint8_t chain[KVQ_CHAINKEY_LEN])
{
	memcpy(t->lkey[id], lkey, KVQ_CHAINKEY_LEN);
	memcpy(t->rkey[id], chain, KVQ_CHAINKEY_LEN);
	t->known[id] = true;
}

void kvq_rtier_learn(struct kvq_rtier *t, uint32_t id, const uint8_t chain[KVQ_CHAINKEY_LEN])
{
	uint8_t lkey[KVQ_CHAINKEY_LEN];

	if (t->attached && id < t->nb && kvq_prefix_block_key(t->p.prefix, id, lkey) == 0)
		rtier_learn_as(t, id, lkey, chain);
}

/* Block id's remote chain key, if it was learnt under the key it is cached
 * with now: 0, or -ENOENT.  lkey gets its local key. */
int rtier_rkey(struct kvq_rtier *t, uint32_t id, uint8_t lkey[KVQ_CHAINKEY_LEN], const uint8_t **ret)
{
	if (id >= t->nb || kvq_prefix_block_key(t->p.prefix, id, lkey) < 0 || !t->known[id] ||
	    memcmp(t->lkey[id], lkey, KVQ_CHAINKEY_LEN))
		return -ENOENT;
	*ret = t->rkey[id];
	return 0;
}

