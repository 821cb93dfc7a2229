/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "blockrec.h"
#include "kvq_wire.h"
#include "log.h"
#include "pools.h"
#include "seterr.h"
#include "tiering.h"
#include "warm.h"

int kvq_pools_init(struct kvq_pools *ps, const char *backend, int device, const struct kvq_keep *keep, char *err,
		   size_t errlen)
{
	int r;

	memset(ps, 0, sizeof(*ps));
	ps->device = device;
	ps->restart = calloc(1, sizeof *ps->restart);
	if (!ps->restart || kvq_restart_init(ps->restart, keep) < 0) {
		free(ps->restart);
		ps->restart = NULL;
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	r = kvq_backend_pick(backend, device, &ps->backend, ps->backend_reason, sizeof(ps->backend_reason));
	if (r < 0) {
		kvq_seterr(err, errlen, "backend %s: %s", backend, ps->backend_reason);
		return r;
	}
	r = kvq_copier_new(NULL, &ps->copier);
	if (r < 0)
		kvq_seterr(err, errlen, "out of memory");
	return r;
}

void kvq_pools_fini(struct kvq_pools *ps)
{
	struct kvq_pools_rec *p;

	while ((p = ps->head)) {
		ps->head = p->next;
		kvq_pools_rec_free(p);
	}
	kvq_copier_free(ps->copier);
	ps->copier = NULL;
	/* after the pools' tiers: the requests still in flight end here */
	kvq_rtiers_free(ps->rtiers);
	ps->rtiers = NULL;
	if (ps->restart)
		kvq_restart_fini(ps->restart);
	free(ps->restart);
	ps->restart = NULL;
}

struct kvq_pools_rec *kvq_pools_find(const struct kvq_pools *ps, const char *name)
{
	for (struct kvq_pools_rec *p = ps->head; p; p = p->next)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}

void kvq_pools_add(struct kvq_pools *ps, struct kvq_pools_rec *p)
{
	p->next = ps->head;
	ps->head = p;
}

void kvq_pools_remove(struct kvq_pools *ps, struct kvq_pools_rec *p)
{
	for (struct kvq_pools_rec **pp = &ps->head; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	kvq_pools_rec_free(p);
}

/*
 * The one place a pool's backend is chosen: the daemon's own for its device
 * (or for any device when that is host) unless the pool names a backend;
 * otherwise the named one, or the daemon's by name, picked for the pool's
 * device.  A host pool's device is 0.
 */
static int pick_backend(const struct kvq_pools *ps, struct kvq_pools_rec *p, const char *name, char *err,
			size_t errlen)
{
	int r;

	if (!name[0] && (p->device == ps->device || ps->backend == &kvq_backend_host)) {
		p->backend = ps->backend;
	} else {
		r = kvq_backend_pick(name[0] ? name : ps->backend->name, p->device, &p->backend, err, errlen);
		if (r < 0)
			return r;
	}
	if (p->backend == &kvq_backend_host)
		p->device = 0;
	return 0;
}

/* A record with identity, policy (canonical form too), geometry, device and
 * backend (backend "": the daemon's); the caller sets the rest. */
static int rec_new(const struct kvq_pools *ps, const char *name, const char *model, const struct kvq_policy *policy,
		   const struct kvq_layout_params *params, const char *backend, int device,
		   struct kvq_pools_rec **ret, char *err, size_t errlen)
{
	struct kvq_pools_rec *p = calloc(1, sizeof(*p));
	int r;

	if (!p)
		return -ENOMEM;
	p->mem.fd = -1;
	snprintf(p->name, sizeof(p->name), "%s", name);
	snprintf(p->model, sizeof(p->model), "%s", model);
	p->policy = *policy;
	r = kvq_policy_format(&p->policy, p->policy_str, sizeof(p->policy_str));
	if (r < 0) {
		kvq_seterr(err, errlen, "policy cannot be formatted");
		goto fail;
	}
	p->params = *params;
	p->device = device;
	r = pick_backend(ps, p, backend, err, errlen);
	if (r < 0)
		goto fail;
	*ret = p;
	return 0;
fail:
	free(p);
	return r;
}

int kvq_pools_from_config(const struct kvq_pools *ps, const struct kvq_config_pool *c, struct kvq_pools_rec **ret,
			  char *err, size_t errlen)
{
	const struct kvq_layout_params params = { .layers = c->layers, .kv_heads = c->kv_heads,
		.head_dim = c->head_dim, .block_tokens = c->block_tokens, .window = c->window, .act = c->act,
		.sink_blocks = c->sink_blocks };
	char why[KVQ_BACKEND_MSG_MAX] = "";
	struct kvq_pools_rec *p;
	int r;

	r = rec_new(ps, c->name, c->model, &c->policy, &params, "", c->device, &p, why, sizeof(why));
	if (r < 0)
		return kvq_seterr(err, errlen, "pool %s: %s", c->name, why), r;
	p->acl = c->acl;
	p->quota = c->quota_per_uid;
	p->capacity = c->capacity;
	p->host_capacity = c->host_capacity;
	*ret = p;
	return 0;
}

int kvq_pools_from_attach(const struct kvq_pools *ps, const struct kvq_config *cfg, const Kvq__Attach *a,
			  uid_t creator, struct kvq_pools_rec **ret, char *err, size_t errlen)
{
	const Kvq__PoolCreate *pc = a->create;
	const struct kvq_layout_params params = { .layers = a->layers, .kv_heads = a->kv_heads,
		.head_dim = a->head_dim, .block_tokens = a->block_tokens, .window = a->window, .act = (int)a->act,
		.sink_blocks = a->sink_blocks };
	struct kvq_policy policy;
	struct kvq_pools_rec *p;
	uint32_t n = 0;
	int r;

	/* a Stats reply lists every pool: their number bounds its size */
	for (const struct kvq_pools_rec *q = ps->head; q; q = q->next)
		n++;
	if (n >= KVQ_PROTO_MAX_POOLS)
		return kvq_seterr(err, errlen, "kvqd holds %u pools, the most it may", n), -ENOSPC;
	if (a->layers == 0 || a->layers > KVQ_MAX_LAYERS)
		return kvq_seterr(err, errlen, "attach.layers %u out of 1..%u", a->layers, KVQ_MAX_LAYERS), -EINVAL;
	if (kvq_policy_parse(a->policy, a->layers, &policy, err, errlen) < 0)
		return KVQ_EPOLICY;
	r = rec_new(ps, a->pool, a->model_id, &policy, &params, pc->backend, pc->device < 0 ? ps->device : pc->device,
		    &p, err, errlen);
	if (r < 0)
		return r;
	p->acl.any = false;
	p->acl.uids[p->acl.n_uids++] = creator;
	if (creator != 0)
		p->acl.uids[p->acl.n_uids++] = 0;
	if (geteuid() != 0 && geteuid() != creator)
		p->acl.uids[p->acl.n_uids++] = geteuid();
	p->quota = cfg->quota_per_uid;
	p->capacity = cfg->create_capacity;
	p->host_capacity = (struct kvq_config_amount){ .kind = KVQ_AMOUNT_BYTES, .bytes = pc->host_capacity };
	p->attention_report_ms = kvq_pools_report_ms(cfg, p->name);
	p->origin = KVQ_BOOKS_ATTACH;
	*ret = p;
	return 0;
}

uint32_t kvq_pools_report_ms(const struct kvq_config *cfg, const char *name)
{
	const struct kvq_config_pool *c = kvq_config_find_pool(cfg, name);

	return (c ? c->attention_timing : cfg->attention_timing) ? cfg->attention_report_ms : 0;
}

static uint64_t budget_used(const struct kvq_pools *ps, const struct kvq_backend *b, int device)
{
	uint64_t used = 0;

	for (const struct kvq_pools_rec *p = ps->head; p; p = p->next) {
		if (p->allocated && p->backend == b && p->device == device)
			used += p->mem.size;
		/* host tiers live in the host's budget */
		if (p->allocated && p->tiering && b == &kvq_backend_host && device == 0)
			used += kvq_tier_mem(kvq_tiering_tier(p->tiering))->size;
	}
	return used;
}
/* Sets the slot counts of q: n_sink sink slots with sink blocks (0: as many
 * as open slots), none without. */
static void set_counts(struct kvq_layout_params *q, uint32_t n_sealed, uint32_t n_open, uint32_t n_sink)
{
	q->n_sealed = n_sealed;
	q->n_open = n_open;
	q->n_sink = q->sink_blocks ? (n_sink ? n_sink : n_open) : 0;
}

/* Slot counts for a pool of at most capacity bytes.  Given counts are taken
 * as they are; otherwise all come from the capacity. */
static int pool_size(struct kvq_pools_rec *p, uint32_t want_sealed, uint32_t want_open, uint32_t want_sink,
		     uint64_t capacity, char *err, size_t errlen)
{
	struct kvq_layout_params q = p->params;
	struct kvq_layout *L = NULL;
	uint64_t per, room;
	int r;

	if (!q.sink_blocks && want_sink)
		return kvq_seterr(err, errlen, "%u sink slots asked for a pool without sink blocks", want_sink),
		       -EINVAL;
	if (want_sealed && want_open) {
		set_counts(&q, want_sealed, want_open, want_sink);
		r = kvq_layout_new(&q, &L, err, errlen);
		if (r < 0)
			return r;
		if (L->total_bytes > capacity) {
			kvq_seterr(err, errlen,
				   "%u sealed + %u open slots need %llu bytes, %llu fit in the pool's capacity and the budget",
				   want_sealed, want_open, (unsigned long long)L->total_bytes,
				   (unsigned long long)capacity);
			kvq_layout_free(L);
			return -ENOSPC;
		}
		kvq_layout_free(L);
		p->params = q;
		return 0;
	}
	set_counts(&q, 1, 1, 0);
	r = kvq_layout_new(&q, &L, err, errlen);
	if (r < 0)
		return r;
	/* a sink slot per open slot */
	per = L->sealed_block_bytes * KVQ_POOLS_SEALED_PER_OPEN + L->open_block_bytes * (1 + q.sink_blocks);
	/* the codebooks (pq2, pq1) come out of the capacity first */
	room = capacity > L->codebook_bytes ? capacity - L->codebook_bytes : 0;
	kvq_layout_free(L);
	q.n_open = room / per > KVQ_MAX_SLOTS / KVQ_POOLS_SEALED_PER_OPEN
			   ? KVQ_MAX_SLOTS / KVQ_POOLS_SEALED_PER_OPEN
			   : (uint32_t)(room / per);
	set_counts(&q, q.n_open * KVQ_POOLS_SEALED_PER_OPEN, q.n_open, 0);
	/* region alignment can push the total just over: step down until it fits */
	while (q.n_open > 0) {
		r = kvq_layout_new(&q, &L, err, errlen);
		if (r < 0)
			return r;
		if (L->total_bytes <= capacity) {
			kvq_layout_free(L);
			p->params = q;
			return 0;
		}
		kvq_layout_free(L);
		q.n_open -= q.n_open / 64 + 1;
		set_counts(&q, q.n_open * KVQ_POOLS_SEALED_PER_OPEN, q.n_open, 0);
	}
	kvq_seterr(err, errlen, "capacity %llu bytes holds no block", (unsigned long long)capacity);
	return -ENOSPC;
}

/* The first codebook format of policy, by name, or NULL when it has none. */
static const char *codebook_format(const struct kvq_policy *pol)
{
	for (uint32_t l = 0; l < pol->n_layers && l < KVQ_MAX_LAYERS; l++)
		for (int v = 0; v < 2; v++) {
			if (kvq_policy_subdim(pol, l, v))
				return kvq_fmt_name(v ? pol->v[l] : pol->k[l]);
		}
	return NULL;
}

int kvq_pools_codebooks(const struct kvq_pools_rec *p, bool created, const Kvq__Attach *a, int fd,
			struct kvq_codebooks *ret, char *err, size_t errlen)
{
	const char *fmt = codebook_format(&p->policy);
	char sent[KVQ_CODEBOOKS_HEX], have[KVQ_CODEBOOKS_HEX];
	int r;

	memset(ret, 0, sizeof(*ret));
	if (a->codebooks && fd < 0)
		return kvq_seterr(err, errlen, "codebooks announced but no descriptor came with the request"), -EINVAL;
	if (!a->codebooks && fd >= 0)
		return kvq_seterr(err, errlen, "a descriptor came with the request, which announces no codebooks"),
		       -EINVAL;
	if (fd >= 0 && !fmt)
		return kvq_seterr(err, errlen, "policy %s has no codebook format: it takes no codebooks", p->policy_str),
		       -EINVAL;
	if (fd < 0) {
		if (created && fmt)
			return kvq_seterr(err, errlen,
					  "policy %s uses %s: the pool's codebooks must come with the request (kvqctl "
					  "pool create --codebooks, kvq_attach_params.codebooks)", p->policy_str, fmt),
			       -EINVAL;
		return 0;
	}
	r = kvq_codebooks_open(fd, &p->policy, p->params.kv_heads, p->params.head_dim, ret, err, errlen);
	if (r < 0)
		return r;
	if (!created && (!p->has_codebooks || memcmp(ret->sha256, p->codebooks_sha256, KVQ_PROTO_SHA256))) {
		kvq_codebooks_hex(ret->sha256, KVQ_CODEBOOKS_SHORT, sent);
		kvq_codebooks_hex(p->codebooks_sha256, KVQ_CODEBOOKS_SHORT, have);
		kvq_seterr(err, errlen, "codebooks differ from pool %s's (sha256 %s..., the pool's %s...)", p->name,
			   sent, p->has_codebooks ? have : "(none yet)");
		kvq_codebooks_close(ret);
		return KVQ_ELAYOUT;
	}
	return 0;
}

/* What daemon/restart.c sees of p. */
static struct kvq_restart_parts parts_of(const struct kvq_pools_rec *p)
{
	kvq_tier *t = p->tiering ? kvq_tiering_tier(p->tiering) : NULL;

	return (struct kvq_restart_parts){ p->name, p->L, p->pool, p->prefix, t, p->mem.fd,
					   t ? kvq_tier_mem(t)->fd : -1 };
}

/* Everything that decides what p's bytes mean (its layout made, its
 * memory mem_size bytes), and its record (daemon/books.h). */
static void identity(const struct kvq_pools_rec *p, uint64_t mem_size, uint64_t tier_capacity,
		     struct kvq_books_id *id)
{
	memset(id, 0, sizeof *id);
	snprintf(id->name, sizeof id->name, "%s", p->name);
	snprintf(id->model, sizeof id->model, "%s", p->model);
	snprintf(id->group, sizeof id->group, "%s", p->group);
	snprintf(id->backend, sizeof id->backend, "%s", p->backend->name);
	id->device = p->device;
	id->layout_version = KVQ_LAYOUT_VERSION;
	id->fingerprint = kvq_blockrec_fingerprint(p->L);
	id->layers = p->L->layers;
	id->kv_heads = p->L->kv_heads;
	id->head_dim = p->L->head_dim;
	id->block_tokens = p->L->block_tokens;
	id->window = p->L->window;
	id->sink_blocks = p->L->sink_blocks;
	id->act = p->L->act;
	id->n_sealed = p->L->n_sealed;
	id->n_open = p->L->n_open;
	id->n_sink = p->L->n_sink;
	id->mem_size = mem_size;
	id->tier_capacity = tier_capacity;
	id->has_codebooks = p->has_codebooks;
	memcpy(id->codebooks_sha256, p->codebooks_sha256, sizeof id->codebooks_sha256);
	id->origin = p->origin;
	id->acl = p->acl;
	id->quota = p->quota;
	id->capacity = p->capacity;
	id->host_capacity = p->host_capacity;
	id->attention_report_ms = p->attention_report_ms;
	id->memory_id = p->memory_id;
}

void kvq_pools_release(struct kvq_pools_rec *p)
{
	struct kvq_restart_parts pt = parts_of(p);

	kvq_restart_release(&p->kept, &pt);
	if (p->glink.g)
		p->glink.leave(p);
	/* the remote tier first: it unhooks from the host tier's records */
	kvq_rtier_free(p->rtier);
	p->rtier = NULL;
	kvq_tiering_free(p->tiering);
	p->tiering = NULL;
	kvq_attn_free(p->attn);
	p->attn = NULL;
	kvq_prefix_free(p->prefix);
	p->prefix = NULL;
	kvq_pool_free(p->pool);
	p->pool = NULL;
	kvq_warm_stop(p->warm);
	p->warm = NULL;
	kvq_backend_mem_destroy(&p->mem);
	kvq_layout_free(p->L);
	p->L = NULL;
	p->allocated = false;
	p->has_codebooks = false;
	memset(p->codebooks_sha256, 0, sizeof(p->codebooks_sha256));
}

/* A sealed block of p's geometry with f16 K and V: the baseline of the
 * resident figures, as the layout lays it out (kvqctl's too). */
static int f16_block_bytes(const struct kvq_pools_rec *p, uint64_t *ret, char *err, size_t errlen)
{
	struct kvq_layout_params q = p->params;
	struct kvq_policy f16;
	struct kvq_layout *L = NULL;
	int r;

	r = kvq_policy_parse("f16", q.layers, &f16, err, errlen);
	if (r < 0)
		return r;
	q.policy = &f16;
	set_counts(&q, 1, 1, 0);
	r = kvq_layout_new(&q, &L, err, errlen);
	if (r < 0)
		return r;
	*ret = L->sealed_block_bytes;
	kvq_layout_free(L);
	return 0;
}

/* What is resident (struct kvq_resident) in a pool of i's geometry and books. */
static void resident_of(const struct kvq_pools_info *i, uint64_t f16_block_bytes, struct kvq_resident *o)
{
	const struct kvq_pool_stats *st = &i->st;
	uint32_t B = i->block_tokens, per_seq = i->window / i->block_tokens;
	uint64_t distinct = (uint64_t)st->sealed_private + st->cached_referenced;
	uint64_t sinks = (uint64_t)st->sink_private + st->sink_referenced;

	if (per_seq == 0)
		per_seq = 1;
	/* with sink blocks each live sequence holds one sink reference from
	 * its first token (its own block 0, a cached one, a fork's); without,
	 * its open slots tell, at most per_seq of them */
	if (i->sink_blocks)
		o->sequences = st->sink_refs > UINT32_MAX ? UINT32_MAX : (uint32_t)st->sink_refs;
	else
		o->sequences = st->open_used / per_seq + (st->open_used % per_seq != 0);
	o->sealed_tokens = st->refs * B;
	o->sealed_distinct_tokens = distinct * B;
	o->open_tokens_max = (uint64_t)st->open_used * B;
	o->sink_tokens = sinks * B;
	o->bytes = distinct * i->sealed_block_bytes + sinks * i->open_block_bytes +
		   (uint64_t)st->open_used * (i->open_block_bytes + i->sealed_block_bytes);
	o->f16_bytes = (distinct + sinks + st->open_used) * f16_block_bytes;
}

/* p's remote tier, when its section names a remote and the server started
 * the remotes; a pool whose tier cannot start runs without it. */
static void remote_tier(const struct kvq_pools *ps, const struct kvq_config *cfg, struct kvq_pools_rec *p)
{
	const struct kvq_rtier_pool rp = { .name = p->name, .model = p->model, .policy = &p->policy, .L = p->L,
		.prefix = p->prefix, .pool = p->pool, .copier = &ps->copier,
		.map = p->backend == &kvq_backend_host ? p->mem.map : NULL,
		.mem = &p->mem,
		.codebooks_sha256 = p->has_codebooks ? p->codebooks_sha256 : NULL,
		.tier = p->tiering ? kvq_tiering_tier(p->tiering) : NULL };
	char why[256] = "";

	if (ps->rtiers && !p->rtier &&
	    kvq_rtier_new(ps->rtiers, kvq_config_find_pool(cfg, p->name), &rp, &p->rtier, why, sizeof why) < 0)
		kvq_log(LOG_WARNING, "%s: the pool runs without its remote tier", why);
}

int kvq_pools_remotes(struct kvq_pools *ps, struct event_base *base, const struct kvq_config *cfg, char *err,
		      size_t errlen)
{
	int r = kvq_rtiers_new(base, cfg, &ps->rtiers, err, errlen);

	for (struct kvq_pools_rec *p = ps->head; r == 0 && p; p = p->next)
		if (p->allocated)
			remote_tier(ps, cfg, p);
	return r;
}

/* The bytes of p's host tier, when it has a host_capacity (0: none):
 * within the host's budget (the pools there and the other tiers, p's
 * memory of mem_size bytes included), or refused with -ENOSPC. */
static int tier_want(const struct kvq_pools *ps, const struct kvq_config *cfg, const struct kvq_pools_rec *p,
		     uint64_t mem_size, uint64_t *ret, char *err, size_t errlen)
{
	uint64_t total = 0, budget, used, want;
	int r;

	*ret = 0;
	if (p->host_capacity.kind == KVQ_AMOUNT_BYTES && p->host_capacity.bytes == 0)
		return 0;
	r = kvq_backend_host.total_memory(0, &total, err, errlen);
	if (r < 0)
		return r;
	budget = kvq_config_amount_bytes(&cfg->memory_budget, total);
	used = budget_used(ps, &kvq_backend_host, 0) + (p->backend == &kvq_backend_host ? mem_size : 0);
	want = kvq_config_amount_bytes(&p->host_capacity, budget);
	if (want && (used > budget || want > budget - used))
		return kvq_seterr(err, errlen, "host_capacity %llu bytes beyond the host's memory budget "
				  "(%llu of %llu used)", (unsigned long long)want, (unsigned long long)used,
				  (unsigned long long)budget), -ENOSPC;
	*ret = want;
	return 0;
}

/* p's host tier of want bytes (0: none), its memory taken back from
 * tier_fd (taken) when that is not -1; a pool whose memory the daemon
 * cannot copy keeps no tier, and says so in the log. */
static int host_tier(const struct kvq_pools *ps, struct kvq_pools_rec *p, uint64_t want, int tier_fd, char *err,
		     size_t errlen)
{
	char why[KVQ_BACKEND_MSG_MAX] = "";
	int r;

	if (want == 0)
		return 0;
	r = kvq_tiering_new(&(struct kvq_tiering_pool){ p->name, &p->mem, p->L, p->pool, p->prefix, tier_fd }, want,
			    &ps->copier, &p->tiering, why, sizeof why);
	if (r == -EOPNOTSUPP) {
		kvq_log(LOG_WARNING, "%s: the pool runs without its host tier", why);
		return 0;
	}
	if (r < 0)
		return kvq_seterr(err, errlen, "%s", why), r;
	p->kept.tier_capacity = want;
	kvq_log(LOG_INFO, "pool %s: host tier of %llu bytes", p->name, (unsigned long long)want);
	return 0;
}

/* p's memory: taken back as the restart's plan says (*pl set to NULL when
 * that fails: p then starts cold), else new. */
static int pool_memory(const struct kvq_pools *ps, struct kvq_pools_rec *p, struct kvq_restart_plan **pl, char *err,
		       size_t errlen)
{
	char why[KVQ_BACKEND_MSG_MAX] = "";
	uint64_t size;
	int fd, r;

	if (*pl) {
		fd = kvq_restart_plan_mem(*pl, &size);
		r = kvq_backend_mem_adopt(p->backend, fd, size, p->device, &p->mem, why, sizeof why);
		if (r == 0)
			return 0;
		kvq_restart_plan_drop(ps->restart, &p->kept, *pl, p->name, why);
		*pl = NULL;
	}
	return kvq_backend_mem_create(p->backend, p->L->total_bytes, p->device, p->name, &p->mem, err, errlen);
}

int kvq_pools_allocate(const struct kvq_pools *ps, const struct kvq_config *cfg, struct kvq_pools_rec *p,
		       uint32_t want_sealed, uint32_t want_open, uint32_t want_sink, const struct kvq_codebooks *cb,
		       char *err, size_t errlen)
{
	uint64_t total = 0, budget, used, capacity, room, g = 0, mem_size, tier = 0;
	const char *fmt = codebook_format(&p->policy);
	bool have_cb = cb && cb->map;
	struct kvq_restart_plan *pl = NULL;
	struct kvq_restart_parts pt;
	struct kvq_books_id id;
	char hex[KVQ_CODEBOOKS_HEX];
	int r;

	if (!fmt && have_cb)
		return kvq_seterr(err, errlen, "policy %s has no codebook format: it takes no codebooks",
				  p->policy_str), -EINVAL;
	r = p->backend->total_memory(p->device, &total, err, errlen);
	if (r < 0)
		return r;
	budget = kvq_config_amount_bytes(&cfg->memory_budget, total);
	used = budget_used(ps, p->backend, p->device);
	capacity = kvq_config_amount_bytes(&p->capacity, budget);
	room = used >= budget ? 0 : budget - used;
	/* given slot counts need only their layout's bytes; else the whole capacity */
	if (!(want_sealed && want_open) && capacity > room) {
		kvq_seterr(err, errlen, "pool of %llu bytes over the memory budget (%llu of %llu used)",
			   (unsigned long long)capacity, (unsigned long long)used, (unsigned long long)budget);
		return -ENOSPC;
	}
	p->params.policy = &p->policy;
	r = pool_size(p, want_sealed, want_open, want_sink, capacity < room ? capacity : room, err, errlen);
	if (r < 0)
		return r;
	r = kvq_layout_new(&p->params, &p->L, err, errlen);
	if (r < 0)
		return r;
	if ((r = p->backend->granularity(p->device, &g, err, errlen)) < 0 ||
	    (r = kvq_backend_round(p->L->total_bytes, g, &mem_size)) < 0 ||
	    (r = tier_want(ps, cfg, p, mem_size, &tier, err, errlen)) < 0)
		goto fail;
	if (have_cb) {
		memcpy(p->codebooks_sha256, cb->sha256, KVQ_PROTO_SHA256);
		p->has_codebooks = true;
	}
	/* a restart's memory, when its books say the same pool */
	identity(p, mem_size, tier, &id);
	pl = kvq_restart_plan(ps->restart, &id, p->policy_str, &p->kept);
	/* never a codebook pool without its codebooks (kvq_pools_codebooks
	 * refused the request already; this is the pool's own guarantee):
	 * they come with the request or are in the memory taken back */
	if (fmt && !have_cb && !pl) {
		kvq_seterr(err, errlen, "policy %s uses %s: the pool's codebooks must come with the request",
			   p->policy_str, fmt);
		r = -EINVAL;
		goto fail;
	}
	r = pool_memory(ps, p, &pl, err, errlen);
	/* a client that had mapped this memory before the restart keeps its mapping */
	p->memory_id = pl ? kvq_restart_plan_memory_id(pl) : kvq_pools_random_id();
	if (r == 0 && fmt && !have_cb && !pl) {
		kvq_seterr(err, errlen, "policy %s uses %s: its codebooks were not taken back", p->policy_str, fmt);
		r = -EINVAL;
	}
	if (r < 0)
		goto fail;
	if (p->backend == &kvq_backend_host)
		p->warm = kvq_warm_start(p->mem.map, p->mem.size);
	r = kvq_pool_new(p->L->n_sealed, p->L->n_open, p->L->n_sink, &p->pool);
	if (r < 0)
		goto fail;
	/* a group's members key blocks alike: in the group's name */
	r = kvq_prefix_new(p->pool, p->L->block_tokens, p->group[0] ? p->group : p->name, p->model, &p->prefix);
	if (r < 0)
		goto fail;
	r = kvq_attn_new(p->L, &p->attn);
	if (r < 0)
		goto fail;
	r = f16_block_bytes(p, &p->f16_block_bytes, err, errlen);
	if (r < 0)
		goto fail;
	if (have_cb && !pl) {
		if (cb->file.data_bytes != p->L->codebook_bytes) {
			kvq_seterr(err, errlen, "codebooks: %llu bytes of data, the pool's region holds %llu",
				   (unsigned long long)cb->file.data_bytes, (unsigned long long)p->L->codebook_bytes);
			r = -EINVAL;
			goto fail;
		}
		r = kvq_backend_mem_write(&p->mem, p->L->codebook_off, cb->file.data, (size_t)cb->file.data_bytes, err,
					  errlen);
		if (r < 0)
			goto fail;
	}
	if (p->has_codebooks) {
		kvq_codebooks_hex(p->codebooks_sha256, KVQ_PROTO_SHA256, hex);
		kvq_log(LOG_INFO, "pool %s: codebooks of %llu bytes, sha256 %s", p->name,
			(unsigned long long)p->L->codebook_bytes, hex);
	}
	r = host_tier(ps, p, tier, pl ? kvq_restart_plan_tier(pl) : -1, err, errlen);
	if (r < 0)
		goto fail;
	remote_tier(ps, cfg, p);
	pt = parts_of(p);
	if (pl)
		kvq_restart_apply(ps->restart, &p->kept, &pt, pl);
	pl = NULL;
	p->allocated = true;
	p->device_memory = total;
	kvq_log(LOG_INFO, "pool %s: %s on %s, %u layers, %u kv heads, head dim %u, %u tokens/block, window %u, "
		"%u sealed + %u open slots, %llu bytes", p->name, p->policy_str, p->backend->name, p->L->layers,
		p->L->kv_heads, p->L->head_dim, p->L->block_tokens, p->L->window, p->L->n_sealed, p->L->n_open,
		(unsigned long long)p->mem.size);
	identity(p, p->mem.size, p->kept.tier_capacity, &id);
	kvq_restart_keep(ps->restart, &p->kept, &id, p->policy_str, &pt);
	return 0;
fail:
	if (r != -ENOSPC && !(err && *err))
		kvq_seterr(err, errlen, "%s", strerror(-r));
	kvq_restart_plan_drop(ps->restart, &p->kept, pl, p->name, err && *err ? err : strerror(-r));
	kvq_pools_release(p);
	return r;
}

void kvq_pools_rec_free(struct kvq_pools_rec *p)
{
	if (!p)
		return;
	kvq_pools_release(p);
	free(p);
}

void kvq_pools_info(const struct kvq_pools_rec *p, struct kvq_pools_info *o)
{
	memset(o, 0, sizeof(*o));
	kvq_pool_stats(p->pool, &o->st);
	if (p->tiering)
		kvq_tiering_stats(p->tiering, &o->tier);
	if (p->rtier)
		kvq_rtier_stats(p->rtier, &o->remote);
	o->restart.blocks = p->kept.blocks;
	o->restart.records = p->kept.records;
	o->restart.held = p->kept.holds ? p->kept.holds->held : 0;
	o->restart.us = p->kept.restore_us;
	o->restart.cold = p->kept.cold;
	o->name = p->name;
	o->model = p->model;
	o->policy = p->policy_str;
	o->backend = p->backend->name;
	o->device = p->backend == &kvq_backend_host ? -1 : p->device;
	o->layers = p->L->layers;
	o->kv_heads = p->L->kv_heads;
	o->head_dim = p->L->head_dim;
	o->block_tokens = p->L->block_tokens;
	o->window = p->L->window;
	o->act = p->L->act;
	o->total_bytes = p->L->total_bytes;
	o->sealed_block_bytes = p->L->sealed_block_bytes;
	o->open_block_bytes = p->L->open_block_bytes;
	o->sink_blocks = p->L->sink_blocks;
	o->device_memory = p->device_memory;
	o->lookup_tokens = p->lookup_tokens;
	o->hit_tokens = p->hit_tokens;
	o->alloc_failures = o->st.alloc_failures + p->alloc_failures;
	o->clients = p->clients;
	o->attention_report_ms = p->attention_report_ms;
	o->attn = p->attn;
	o->codebooks_sha256 = p->has_codebooks ? p->codebooks_sha256 : NULL;
	o->group = p->glink.g ? p->group : "";
	o->world_size = p->glink.g ? p->glink.world : 0;
	o->rank = p->glink.g ? p->glink.rank : 0;
	o->group_pending = p->glink.g ? *p->glink.pending : 0;
	resident_of(o, p->f16_block_bytes, &o->res);
}

/* A record for books whose pool no section names: what the Attach or
 * PoolAdd that created it set. */
static int rebuild(struct kvq_pools *ps, const struct kvq_books_id *id, const char *policy,
		   struct kvq_pools_rec **ret, char *why, size_t len)
{
	const struct kvq_layout_params params = { .layers = id->layers, .kv_heads = id->kv_heads,
		.head_dim = id->head_dim, .block_tokens = id->block_tokens, .window = id->window, .act = id->act,
		.sink_blocks = id->sink_blocks };
	struct kvq_policy pol;
	struct kvq_pools_rec *p;
	int r;

	if (id->origin != KVQ_BOOKS_ATTACH && id->origin != KVQ_BOOKS_POOLADD)
		return snprintf(why, len, "its kvqd.conf section is gone"), -ENOENT;
	if (kvq_policy_parse(policy, id->layers, &pol, why, len) < 0)
		return -EINVAL;
	r = rec_new(ps, id->name, id->model, &pol, &params, id->backend, id->device, &p, why, len);
	if (r < 0)
		return r;
	snprintf(p->group, sizeof p->group, "%s", id->group);
	p->origin = id->origin;
	p->acl = id->acl;
	p->quota = id->quota;
	p->capacity = id->capacity;
	p->host_capacity = id->host_capacity;
	p->attention_report_ms = id->attention_report_ms;
	p->has_codebooks = id->has_codebooks;
	memcpy(p->codebooks_sha256, id->codebooks_sha256, sizeof p->codebooks_sha256);
	*ret = p;
	return 0;
}

void kvq_pools_restore_rest(struct kvq_pools *ps, const struct kvq_config *cfg)
{
	const struct kvq_books_id *id;
	const char *policy;

	/* pools allocated before the restart that are not yet: kvqd.conf's
	 * created on attach, and those an Attach or a PoolAdd made */
	while ((id = kvq_restart_next(ps->restart, &policy))) {
		char name[KVQ_PROTO_MAX_NAME + 1], why[KVQ_BACKEND_MSG_MAX + 64] = "";
		struct kvq_pools_rec *p = kvq_pools_find(ps, id->name);
		bool made = false;
		int r = 0;

		snprintf(name, sizeof name, "%s", id->name);
		if (!p) {
			r = rebuild(ps, id, policy, &p, why, sizeof why);
			made = r == 0;
		} else if (p->allocated) {
			r = -EEXIST;
			snprintf(why, sizeof why, "a pool of that name is allocated already");
		}
		/* allocate claims the books, or gives them up */
		if (r == 0)
			r = kvq_pools_allocate(ps, cfg, p, id->n_sealed, id->n_open, id->n_sink, NULL, why, sizeof why);
		if (made && r == 0)
			kvq_pools_add(ps, p);
		else if (made)
			kvq_pools_rec_free(p);
		if (r < 0)
			kvq_restart_give_up(ps->restart, name, why);
	}
	kvq_restart_done(ps->restart);
}

void kvq_pools_keep(struct kvq_pools *ps)
{
	/* copies in flight end first: a block on its way to a host tier is
	 * then in the books as the tier's; and no fetched value is being
	 * unpacked into a slot (the verifying threads first: they hand a
	 * cuda pool's checked records on to the copy thread) */
	kvq_rtiers_drain(ps->rtiers);
	kvq_copier_drain(ps->copier);
	for (struct kvq_pools_rec *p = ps->head; p; p = p->next) {
		struct kvq_restart_parts pt = parts_of(p);

		if (p->allocated)
			kvq_restart_stop(&p->kept, &pt);
	}
	/* nothing is recorded or dropped from the store from here on */
	kvq_restart_stopping(ps->restart);
}

int kvq_pools_attached(struct kvq_pools_rec *p, pid_t pid, int pidfd, uint64_t holder)
{
	return kvq_restart_attached(&p->kept, pid, pidfd, holder);
}

uint64_t kvq_pools_replaced(struct kvq_pools_rec *p, pid_t pid, uint64_t holder)
{
	struct kvq_restart_parts pt = parts_of(p);

	return p->allocated ? kvq_restart_replaced(&p->kept, &pt, pid, holder) : 0;
}

uint64_t kvq_pools_random_id(void)
{
	uint64_t v = 0;

	if (getrandom(&v, sizeof v, GRND_NONBLOCK) != sizeof v) {
		struct timespec t;

		/* unpredictability is not needed: uniqueness is (a pid checks who replaces) */
		clock_gettime(CLOCK_REALTIME, &t);
		v = ((uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	}
	return v ? v : 1;
}

void kvq_pools_detached(struct kvq_pools_rec *p, int entry)
{
	kvq_restart_detached(&p->kept, entry);
}

uint32_t kvq_pools_holds_exited(struct kvq_pools *ps, pid_t pid, uint64_t start)
{
	uint32_t n = 0;

	for (struct kvq_pools_rec *p = ps->head; p; p = p->next) {
		struct kvq_restart_parts pt = parts_of(p);

		if (p->allocated)
			n += (uint32_t)kvq_restart_holds_exited(&p->kept, &pt, pid, start);
	}
	return n;
}

uint32_t kvq_pools_holds_check(struct kvq_pools *ps)
{
	uint32_t n = 0;

	for (struct kvq_pools_rec *p = ps->head; p; p = p->next) {
		struct kvq_restart_parts pt = parts_of(p);

		if (p->allocated)
			n += (uint32_t)kvq_restart_holds_check(&p->kept, &pt);
	}
	return n;
}
