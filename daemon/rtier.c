/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's remote tier at work: daemon/rtier.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/random.h>

#include <event2/event.h>
#include <hiredis.h>
#include <openssl/crypto.h>

#include "blockrec.h"
#include "log.h"
#include "rcluster.h"
#include "remote_key.h"
#include "remote_value.h"
#include "rtier.h"
#include "seterr.h"
#include "tier.h"

#define RTIER_VERIFY_MAX 4u       /* threads verifying fetched values */
#define RTIER_QUEUE_MAX 4096u    /* blocks waiting to be written, per pool */
#define RTIER_QUEUE_BYTES (64u << 20)   /* their values made at eviction (write-back), per pool;
					   an empty queue takes one of any size */

/* One [remote]: its client and what its values need, copied (a reload
 * keeps the running remote). */
struct rtier_remote {
	char name[KVQ_CONFIG_NAME_MAX + 1];
	kvq_rcluster *rc;
	uint8_t key[KVQ_CONFIG_HMAC_MAX];
	uint32_t key_len;
	size_t max_value;
	uint64_t ttl_ms;
	unsigned max_inflight;
};

struct kvq_rtiers {
	struct event_base *base;
	uint32_t n;
	struct rtier_remote *r;
	kvq_copier *verify;                 /* fetched values, verified (a host pool's unpacked too) */
};

/* A block to write: its id and local key (written through: only if still
 * cached so), its remote chain key and its parent's; written back, its
 * value, made when it left the pool. */
struct rtier_write {
	uint32_t id;
	bool has_parent;
	uint8_t lkey[KVQ_CHAINKEY_LEN], lparent[KVQ_CHAINKEY_LEN];
	uint8_t chain[KVQ_CHAINKEY_LEN], parent[KVQ_CHAINKEY_LEN];
	uint8_t *val;
	size_t vlen;
};

/* Write-back in a pool with a host tier: a block demoted there, its remote
 * keys kept (by its local key) for when its record leaves the tier; kept
 * too while the record is promoted back, for when the pool evicts it. */
struct rtier_demoted {
	bool used, has_parent;
	uint8_t lkey[KVQ_CHAINKEY_LEN], lparent[KVQ_CHAINKEY_LEN];
	uint8_t chain[KVQ_CHAINKEY_LEN], parent[KVQ_CHAINKEY_LEN];
};

struct kvq_rtier {
	struct rtier_remote *rm;            /* borrowed: the daemon's remotes outlive the pools */
	struct event_base *base;
	struct kvq_rtier_pool p;            /* the pool's, while attached */
	bool attached;                      /* false once detached */
	kvq_remote_codec *codec;
	kvq_remote_codec *vcodec;           /* the verifying threads': fetched values (shared) */
	struct kvq_rstage *stage;           /* a pool kvqd does not map: its copies; else NULL */
	kvq_copier *verify;                 /* the remotes' verifying threads */
	struct kvq_chainkey ck;
	uint8_t identity[KVQ_REMOTE_DIGEST_LEN];
	int write;                          /* enum kvq_remote_write */
	uint32_t nb;                        /* block ids of the pool */
	uint8_t (*lkey)[KVQ_CHAINKEY_LEN];  /* per block id: the local key its remote key was learnt under */
	uint8_t (*rkey)[KVQ_CHAINKEY_LEN];
	bool *known;
	uint32_t rank, world;               /* in a tensor-parallel group; else 0 of 1 */
	struct rtier_write *q;              /* the write queue, a ring */
	uint32_t qhead, qlen, qcap;
	uint64_t qbytes;                    /* of the values in it */
	struct rtier_demoted *dm;           /* open addressing, dm_bits of slots; NULL: no host tier */
	unsigned dm_bits;
	uint32_t dm_len;
	uint64_t dm_mult;                   /* random odd multiplier of the slot */
	uint32_t writing, max_writing;      /* SETs in flight, their bound */
	struct event *drain;
	uint32_t refs;                      /* the pool's, and one per request or fetch in flight */
	uint32_t jobs;                      /* fetched values on the copy engine */
	struct kvq_rtier_stats st;
	struct kvq_log_limit lim[KVQ_RTIER_NERRORS];
};

/* A get's request, then its value's job on the verifying threads (a cuda
 * pool's then on the copy thread). */
struct fetch_req {
	struct kvq_copy_job job;            /* first: the job is the request */
	struct kvq_rtier_fetch *f;
	uint32_t i;
	char *val;                          /* the value, taken from its reply */
	size_t len;
	const void *rec;                    /* a cuda pool's: its record, checked (in val) */
	uint32_t slot;                      /* the slot it goes to (the get's once it is there) */
	enum kvq_rtier_error err;           /* the job's failure */
};

struct kvq_rtier_fetch {
	struct kvq_rtier *t;
	double t0;                          /* its GETs sent */
	uint32_t n, pending;
	bool ended;
	void (*done)(void *arg);
	void *arg;
	struct kvq_rtier_get *g;
	struct fetch_req *req;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

static void rtier_unref(struct kvq_rtier *t)
{
	if (--t->refs)
		return;
	kvq_remote_codec_free(t->codec);
	kvq_remote_codec_free(t->vcodec);
	kvq_chainkey_fini(&t->ck);
	free(t);
}

/* Counts error e, with a rate-limited line. */
static void rtier_error(struct kvq_rtier *t, enum kvq_rtier_error e, const char *what)
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
static enum kvq_rtier_error status_error(int status)
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

static void drain_cb(evutil_socket_t fd, short what, void *arg);
static void on_leave(void *arg, uint32_t id, int32_t parent, int demote);
static void tier_leave(void *arg, uint32_t r, bool gone);

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
	t->drain = event_new(rs->base, -1, 0, drain_cb, t);
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
		kvq_prefix_set_leave_hook(p->prefix, on_leave, t);
		if (p->tier)
			kvq_tier_set_leave_hook(p->tier, tier_leave, t);
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
static void rtier_learn_as(struct kvq_rtier *t, uint32_t id, const uint8_t lkey[KVQ_CHAINKEY_LEN],
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
static int rtier_rkey(struct kvq_rtier *t, uint32_t id, uint8_t lkey[KVQ_CHAINKEY_LEN], const uint8_t **ret)
{
	if (id >= t->nb || kvq_prefix_block_key(t->p.prefix, id, lkey) < 0 || !t->known[id] ||
	    memcmp(t->lkey[id], lkey, KVQ_CHAINKEY_LEN))
		return -ENOENT;
	*ret = t->rkey[id];
	return 0;
}

/* ----------------------------------------------------------------- write */

static void write_cb(void *ctx, int status, struct redisReply *reply)
{
	struct kvq_rtier *t = ctx;

	t->writing--;
	if (status < 0)
		rtier_error(t, status_error(status), "a write");
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
		rtier_error(t, status_error(r), "a write");
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

static void drain_cb(evutil_socket_t fd, short what, void *arg)
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
 * its record leaves the tier (tier_leave). */
static void on_leave(void *arg, uint32_t id, int32_t parent, int demote)
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
static void tier_leave(void *arg, uint32_t r, bool gone)
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

/* ----------------------------------------------------------------- fetch */

static void fetch_free(struct kvq_rtier_fetch *f)
{
	for (uint32_t i = 0; f->t->attached && i < f->n; i++)
		if (f->g[i].slot != UINT32_MAX)
			kvq_pool_unref(f->t->p.pool, f->g[i].slot);
	free(f->g);
	free(f->req);
	rtier_unref(f->t);
	free(f);
}

/* One get of f ended: done once all have, or f freed if it was ended. */
static void fetch_settle(struct kvq_rtier_fetch *f)
{
	if (--f->pending)
		return;
	kvq_hist_observe(&f->t->st.fetch_time, now_s() - f->t0);
	if (f->ended)
		fetch_free(f);
	else
		f->done(f->arg);
}

/* On a verifying thread, a pool kvqd does not map: record rec[len]
 * checked whole (layout, checksum, class of slot) before the copy thread
 * DMAs its slices (fetch_push).  0, or a negative code with why set. */
static int fetch_check(struct kvq_rtier *t, uint32_t slot, const void *rec, size_t len, char *why, size_t whylen)
{
	struct kvq_block_ref ref = kvq_layout_block_ref(t->p.L, slot);
	struct kvq_blockrec_info info;
	int r = kvq_blockrec_check(t->p.L, rec, len, &info, why, whylen);

	if (r == 0 && info.cls != ref.cls) {
		kvq_seterr(why, whylen, "a %s record for a %s slot", kvq_block_class_name(info.cls),
			   kvq_block_class_name(ref.cls));
		r = -EINVAL;
	}
	return r;
}

/* On a verifying thread: q's value verified, its record unpacked into its
 * get's slot (a cuda pool's: checked, for fetch_push).  0, or -1 with
 * q->err set. */
static int fetch_run(struct kvq_copy_job *j)
{
	struct fetch_req *q = (struct fetch_req *)j;
	struct kvq_rtier *t = q->f->t;
	const struct kvq_rtier_get *g = &q->f->g[q->i];
	struct kvq_remote_value_head want = { .rank = t->rank, .world = t->world }, got;
	const void *payload;
	size_t plen;
	char why[160];
	int r, k;

	memcpy(want.identity, t->identity, sizeof want.identity);
	memcpy(want.chain, g->chain, sizeof want.chain);
	r = kvq_remote_value_verify(t->vcodec, &want, q->val, q->len, &got, &payload, &plen);
	if (r < 0) {
		k = kvq_remote_refusal_index(r);
		q->err = k >= 0 ? (enum kvq_rtier_error)(KVQ_RTIER_E_OVERSIZE + k) : KVQ_RTIER_E_REPLY;
		return -1;
	}
	r = t->stage ? fetch_check(t, q->slot, payload, plen, why, sizeof why)
		     : kvq_blockrec_unpack(t->p.L, t->p.map, kvq_layout_block_ref(t->p.L, q->slot), payload, plen,
					   NULL, why, sizeof why);
	if (r < 0) {
		q->err = KVQ_RTIER_E_RECORD;
		return -1;
	}
	q->rec = payload;
	j->bytes = plen;
	return 0;
}

/* On the copy thread, a cuda pool's: q's checked record's slices through
 * the staging into its slot.  0, or -1 with q->err set. */
static int fetch_push(struct kvq_copy_job *j)
{
	struct fetch_req *q = (struct fetch_req *)j;
	struct kvq_rtier *t = q->f->t;
	char why[160];

	if (kvq_rstage_push(t->stage, kvq_layout_block_ref(t->p.L, q->slot), q->rec, why, sizeof why) < 0) {
		q->err = KVQ_RTIER_E_RECORD;
		return -1;
	}
	return 0;
}

/* On the loop, q's job ran: a hit, or a miss and an error of its kind. */
static void fetch_ran(struct kvq_copy_job *j, int result)
{
	struct fetch_req *q = (struct fetch_req *)j;
	struct kvq_rtier_fetch *f = q->f;
	struct kvq_rtier_get *g = &f->g[q->i];

	free(q->val);
	q->val = NULL;
	f->t->jobs--;
	if (result == 0) {
		g->slot = q->slot;   /* only now may the caller publish it */
	} else {
		kvq_pool_unref(f->t->p.pool, q->slot);
		rtier_error(f->t, q->err, "a fetched value");
	}
	fetch_settle(f);
}

/* On the loop, q's value verified: a cuda pool's record, checked, goes on
 * to the copy thread (its staging is one); else q's job ended. */
static void fetch_verified(struct kvq_copy_job *j, int result)
{
	struct fetch_req *q = (struct fetch_req *)j;
	struct kvq_rtier *t = q->f->t;

	if (result < 0 || !t->stage) {
		fetch_ran(j, result);
		return;
	}
	q->job = (struct kvq_copy_job){ .run = fetch_push, .done = fetch_ran };
	kvq_copier_submit(*t->p.copier, &q->job);
}

/* q's reply: its value taken, a slot allocated for it and both on the
 * verifying threads (0: fetch_ran comes), or a miss (-1). */
static int fetch_take(struct fetch_req *q, struct redisReply *reply)
{
	struct kvq_rtier *t = q->f->t;
	struct kvq_rtier_get *g = &q->f->g[q->i];
	int r;

	if (reply->type == REDIS_REPLY_NIL) {
		t->st.absent++;
		return -1;
	}
	if (reply->type != REDIS_REPLY_STRING) {
		rtier_error(t, KVQ_RTIER_E_REPLY, "a fetch");
		return -1;
	}
	t->st.bytes_in += (uint64_t)reply->len;
	if ((size_t)reply->len > t->rm->max_value) {
		/* refused before a slot is taken */
		rtier_error(t, KVQ_RTIER_E_OVERSIZE, "a fetched value");
		return -1;
	}
	r = g->sink ? kvq_pool_alloc_sink(t->p.pool, 1, &q->slot) : kvq_pool_alloc_sealed(t->p.pool, 1, &q->slot);
	if (r < 0)
		return -1;   /* the pool is full of referenced blocks: a miss */
	q->len = (size_t)reply->len;
	q->val = kvq_rcluster_take_str(reply);
	if (!q->val) {
		kvq_pool_unref(t->p.pool, q->slot);
		return -1;
	}
	q->job = (struct kvq_copy_job){ .run = fetch_run, .done = fetch_verified };
	t->jobs++;
	kvq_copier_submit(t->verify, &q->job);
	return 0;
}

static void fetch_cb(void *ctx, int status, struct redisReply *reply)
{
	struct fetch_req *q = ctx;
	struct kvq_rtier_fetch *f = q->f;

	f->g[q->i].done = true;
	if (!f->ended && f->t->attached) {
		if (status < 0)
			rtier_error(f->t, status_error(status), "a fetch");
		else if (fetch_take(q, reply) == 0)
			return;   /* fetch_ran settles it (maybe done already) */
	}
	fetch_settle(f);
}

int kvq_rtier_fetch(struct kvq_rtier *t, const struct kvq_rtier_get *g, uint32_t n, void (*done)(void *arg),
		    void *arg, struct kvq_rtier_fetch **ret)
{
	struct kvq_rtier_fetch *f = calloc(1, sizeof *f);

	if (!f || !(f->g = calloc((size_t)n + 1, sizeof *f->g)) || !(f->req = calloc((size_t)n + 1, sizeof *f->req))) {
		if (f)
			free(f->g);
		free(f);
		return -ENOMEM;
	}
	f->t = t;
	f->t0 = now_s();
	t->refs++;
	f->n = n;
	f->done = done;
	f->arg = arg;
	for (uint32_t i = 0; i < n; i++) {
		char key[KVQ_REMOTE_KEY_MAX];
		int klen, r;

		f->g[i] = g[i];
		f->g[i].slot = UINT32_MAX;
		f->g[i].done = false;
		f->req[i] = (struct fetch_req){ .f = f, .i = i };
		klen = kvq_remote_redis_key(t->identity, g[i].chain, t->rank, t->world, key, sizeof key);
		r = klen < 0 ? klen : kvq_rcluster_get(t->rm->rc, key, (size_t)klen, fetch_cb, &f->req[i]);
		if (r < 0) {
			f->g[i].done = true;
			rtier_error(t, status_error(r), "a fetch");
		} else {
			f->pending++;
		}
	}
	*ret = f;
	return f->pending ? 0 : 1;
}

struct kvq_rtier_get *kvq_rtier_fetch_gets(struct kvq_rtier_fetch *f)
{
	return f->g;
}

void kvq_rtier_fetch_end(struct kvq_rtier_fetch *f)
{
	if (!f)
		return;
	f->ended = true;
	if (!f->pending)
		fetch_free(f);
}
