/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier's fetches (daemon/rtier.h): GETs, their values verified
 * and unpacked on the verifying threads (a cuda pool's records pushed
 * through the staging on the copy thread), their slots handed back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis.h>

#include "blockrec.h"
#include "rcluster.h"
#include "remote_key.h"
#include "remote_value.h"
#include "rtier_int.h"
#include "seterr.h"

/* ----------------------------------------------------------------- fetch */

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
			rtier_error(f->t, rtier_status_error(status), "a fetch");
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
			rtier_error(t, rtier_status_error(r), "a fetch");
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
