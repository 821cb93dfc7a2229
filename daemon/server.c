/* SPDX-License-Identifier: Apache-2.0 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "frame.h"
#include "kvq_wire.h"
#include "layout.h"
#include "log.h"
#include "pool.h"
#include "prefix.h"
#include "server.h"
#include "session.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59    /* Linux 4.13; older C libraries lack the name */
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Supplementary groups taken from SO_PEERGROUPS for ACLs; more are ignored. */
#define SRV_MAX_GROUPS 64
/* A pool created on attach without slot counts gets one open slot per this
 * many sealed ones: the window is a few blocks per sequence, the prefix
 * cache wants the rest. */
#define SRV_SEALED_PER_OPEN 8u
#define SRV_ERR 256

struct srv_pool {
	struct srv_pool *next;
	char name[KVQ_PROTO_MAX_NAME + 1];
	char model[KVQ_PROTO_MAX_MODEL_ID + 1];
	char policy_str[KVQ_POLICY_MAX_LEN + 1];     /* canonical */
	struct kvq_policy policy;
	struct kvq_layout_params params;             /* n_sealed/n_open 0 until allocated */
	struct kvq_config_acl acl;
	uint64_t quota;                              /* per uid, bytes */
	struct kvq_config_amount capacity;
	const struct kvq_backend *backend;
	int device;
	bool allocated;                              /* memory, layout and books exist */
	struct kvq_layout *L;
	struct kvq_backend_mem mem;
	kvq_pool *pool;
	kvq_prefix *prefix;
	uint64_t lookup_tokens, hit_tokens;
	uint64_t alloc_failures;                     /* refused before the pool was asked */
	uint64_t device_memory;                      /* of its device, when allocated */
	uint32_t clients;                            /* attached, exiting ones included */
};

struct srv_out {
	struct srv_out *next;
	uint8_t *buf;
	size_t len, off;
	int fd;          /* sent with the first byte, not owned */
};

struct srv_conn {
	kvq_server *srv;
	struct srv_conn *prev, *next;
	int fd;
	struct event *rev, *wev;
	bool reading;
	struct kvq_frame_decoder dec;
	struct srv_out *out_head, *out_tail;
	size_t out_bytes;
	bool close_after_flush;
	uint64_t id;
	char name[KVQ_PROTO_MAX_NAME + 1];
	uid_t uid;
	gid_t groups[SRV_MAX_GROUPS + 1];            /* primary gid first */
	size_t n_groups;
	pid_t pid;
	int pidfd;
	struct event *pev;                           /* dying peer: waits for its exit */
	bool hello;
	struct srv_pool *pool;
	kvq_session *lease;
};

struct kvq_server {
	struct event_base *base;
	const struct kvq_config *cfg;
	const struct kvq_backend *backend;
	char backend_reason[KVQ_BACKEND_MSG_MAX];
	int device;
	int listen_fd;
	struct event *lev;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];   /* unlinked at exit when set */
	struct srv_pool *pools;
	struct srv_conn *conns;                      /* live connections */
	struct srv_conn *dying;                      /* closed, lease kept until the peer exits */
	uint32_t n_conns;
	uint64_t next_id;
	struct timespec started;
	struct kvq_metrics_hist latency[KVQ_REQ_COUNT];
};

static void conn_on_read(evutil_socket_t fd, short what, void *arg);
static void conn_on_write(evutil_socket_t fd, short what, void *arg);
static void conn_on_pidfd(evutil_socket_t fd, short what, void *arg);
static void srv_on_accept(evutil_socket_t fd, short what, void *arg);

/* ---------------------------------------------------------------- pools */

static struct srv_pool *pool_find(kvq_server *s, const char *name)
{
	for (struct srv_pool *p = s->pools; p; p = p->next)
		if (!strcmp(p->name, name))
			return p;
	return NULL;
}

static uint64_t pool_budget_used(const kvq_server *s, const struct kvq_backend *b, int device)
{
	uint64_t used = 0;

	for (const struct srv_pool *p = s->pools; p; p = p->next)
		if (p->allocated && p->backend == b && p->device == device)
			used += p->mem.size;
	return used;
}

/* Slot counts for a pool of at most capacity bytes.  Given counts are taken
 * as they are; otherwise both come from the capacity. */
static int pool_size(struct srv_pool *p, uint32_t want_sealed, uint32_t want_open, uint64_t capacity,
		     char *err, size_t errlen)
{
	struct kvq_layout_params q = p->params;
	struct kvq_layout *L = NULL;
	uint64_t per;
	int r;

	if (want_sealed && want_open) {
		q.n_sealed = want_sealed;
		q.n_open = want_open;
		r = kvq_layout_new(&q, &L, err, errlen);
		if (r < 0)
			return r;
		if (L->total_bytes > capacity) {
			kvq_seterr(err, errlen, "%u sealed + %u open slots need %llu bytes, capacity is %llu",
				   want_sealed, want_open, (unsigned long long)L->total_bytes,
				   (unsigned long long)capacity);
			kvq_layout_free(L);
			return -ENOSPC;
		}
		kvq_layout_free(L);
		p->params = q;
		return 0;
	}
	q.n_sealed = q.n_open = 1;
	r = kvq_layout_new(&q, &L, err, errlen);
	if (r < 0)
		return r;
	per = L->sealed_block_bytes * SRV_SEALED_PER_OPEN + L->open_block_bytes;
	kvq_layout_free(L);
	q.n_open = capacity / per > KVQ_MAX_SLOTS / SRV_SEALED_PER_OPEN ? KVQ_MAX_SLOTS / SRV_SEALED_PER_OPEN
									: (uint32_t)(capacity / per);
	q.n_sealed = q.n_open * SRV_SEALED_PER_OPEN;
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
		q.n_sealed = q.n_open * SRV_SEALED_PER_OPEN;
	}
	kvq_seterr(err, errlen, "capacity %llu bytes holds no block", (unsigned long long)capacity);
	return -ENOSPC;
}

/* Gives back the memory and books of p; the record stays (not allocated). */
static void pool_release(struct srv_pool *p)
{
	kvq_prefix_free(p->prefix);
	p->prefix = NULL;
	kvq_pool_free(p->pool);
	p->pool = NULL;
	kvq_backend_mem_destroy(&p->mem);
	kvq_layout_free(p->L);
	p->L = NULL;
	p->allocated = false;
}

/* Allocates memory and books of p (params, policy, backend, device set). */
static int pool_allocate(kvq_server *s, struct srv_pool *p, uint32_t want_sealed, uint32_t want_open,
			 char *err, size_t errlen)
{
	uint64_t total = 0, budget, used, capacity;
	int r;

	r = p->backend->total_memory(p->device, &total, err, errlen);
	if (r < 0)
		return r;
	budget = kvq_config_amount_bytes(&s->cfg->memory_budget, total);
	used = pool_budget_used(s, p->backend, p->device);
	capacity = kvq_config_amount_bytes(&p->capacity, budget);
	if (used >= budget || capacity > budget - used) {
		kvq_seterr(err, errlen, "pool of %llu bytes over the memory budget (%llu of %llu used)",
			   (unsigned long long)capacity, (unsigned long long)used, (unsigned long long)budget);
		return -ENOSPC;
	}
	p->params.policy = &p->policy;
	r = pool_size(p, want_sealed, want_open, capacity, err, errlen);
	if (r < 0)
		return r;
	r = kvq_layout_new(&p->params, &p->L, err, errlen);
	if (r < 0)
		return r;
	r = kvq_backend_mem_create(p->backend, p->L->total_bytes, p->device, p->name, &p->mem, err, errlen);
	if (r < 0)
		goto fail;
	r = kvq_pool_new(p->L->n_sealed, p->L->n_open, &p->pool);
	if (r < 0)
		goto fail;
	r = kvq_prefix_new(p->pool, p->L->block_tokens, p->name, p->model, &p->prefix);
	if (r < 0)
		goto fail;
	p->allocated = true;
	p->device_memory = total;
	kvq_log(LOG_INFO, "pool %s: %s on %s, %u layers, %u kv heads, head dim %u, %u tokens/block, window %u, "
		"%u sealed + %u open slots, %llu bytes", p->name, p->policy_str, p->backend->name, p->L->layers,
		p->L->kv_heads, p->L->head_dim, p->L->block_tokens, p->L->window, p->L->n_sealed, p->L->n_open,
		(unsigned long long)p->mem.size);
	return 0;
fail:
	if (r != -ENOSPC && !(err && *err))
		kvq_seterr(err, errlen, "%s", strerror(-r));
	pool_release(p);
	return r;
}

static void pool_free(struct srv_pool *p)
{
	if (!p)
		return;
	pool_release(p);
	free(p);
}

/* A pool record from a [pool NAME] section (not allocated). */
static int pool_from_config(kvq_server *s, const struct kvq_config_pool *c, struct srv_pool **ret, char *err,
			    size_t errlen)
{
	struct srv_pool *p = calloc(1, sizeof(*p));
	char why[KVQ_BACKEND_MSG_MAX];
	int r;

	if (!p)
		return -ENOMEM;
	snprintf(p->name, sizeof(p->name), "%s", c->name);
	snprintf(p->model, sizeof(p->model), "%s", c->model);
	p->policy = c->policy;
	r = kvq_policy_format(&p->policy, p->policy_str, sizeof(p->policy_str));
	if (r < 0) {
		kvq_seterr(err, errlen, "pool %s: policy cannot be formatted", c->name);
		free(p);
		return r;
	}
	p->params = (struct kvq_layout_params){ .layers = c->layers, .kv_heads = c->kv_heads,
		.head_dim = c->head_dim, .block_tokens = c->block_tokens, .window = c->window, .act = c->act };
	p->acl = c->acl;
	p->quota = c->quota_per_uid;
	p->capacity = c->capacity;
	p->device = c->device;
	p->mem.fd = -1;
	if (c->device == s->device || s->backend == &kvq_backend_host) {
		p->backend = s->backend;
	} else {
		r = kvq_backend_pick(s->backend->name, c->device, &p->backend, why, sizeof(why));
		if (r < 0) {
			kvq_seterr(err, errlen, "pool %s: %s", c->name, why);
			free(p);
			return r;
		}
	}
	if (p->backend == &kvq_backend_host)
		p->device = 0;
	*ret = p;
	return 0;
}

/* ---------------------------------------------------------------- leases and quotas */

static uint64_t lease_bytes(const struct srv_pool *p, const kvq_session *l)
{
	return (uint64_t)kvq_session_n_sealed(l) * p->L->sealed_block_bytes +
	       (uint64_t)kvq_session_n_open(l) * (p->L->open_block_bytes + p->L->sealed_block_bytes);
}

/* Bytes of pool p that uid holds over all its connections, dying ones too:
 * reconnecting does not escape the quota. */
static uint64_t uid_bytes(const kvq_server *s, const struct srv_pool *p, uid_t uid)
{
	const struct srv_conn *lists[2] = { s->conns, s->dying };
	uint64_t sum = 0;

	for (int i = 0; i < 2; i++)
		for (const struct srv_conn *c = lists[i]; c; c = c->next)
			if (c->pool == p && c->uid == uid && c->lease)
				sum += lease_bytes(p, c->lease);
	return sum;
}

/* Whether uid may take extra more bytes of p. */
static bool quota_allows(const kvq_server *s, const struct srv_pool *p, uid_t uid, uint64_t extra)
{
	uint64_t used;

	if (p->quota == KVQ_CONFIG_UNLIMITED || !extra)
		return true;
	used = uid_bytes(s, p, uid);
	return used <= p->quota && extra <= p->quota - used;
}

/* Gives every hold of the lease back to the pool and empties it. */
static void lease_drop(struct srv_conn *c)
{
	struct srv_pool *p = c->pool;
	uint32_t pos = 0, id, n, open = 0, sealed = 0;

	if (!p || !c->lease)
		return;
	while (kvq_session_next_open(c->lease, &pos, &id)) {
		if (kvq_pool_release_open(p->pool, id) < 0)
			kvq_log(LOG_ERR, "client %llu: open slot %u of its lease is not in use",
				(unsigned long long)c->id, id);
		open++;
	}
	pos = 0;
	while (kvq_session_next_sealed(c->lease, &pos, &id, &n)) {
		for (uint32_t k = 0; k < n; k++)
			if (kvq_pool_unref(p->pool, id) < 0) {
				kvq_log(LOG_ERR, "client %llu: sealed block %u of its lease has no reference",
					(unsigned long long)c->id, id);
				break;
			}
		sealed++;
	}
	kvq_session_free(c->lease);
	c->lease = NULL;
	if (open || sealed)
		kvq_log(LOG_DEBUG, "client %llu: lease dropped (%u open slots, %u sealed blocks)",
			(unsigned long long)c->id, open, sealed);
}

/* ---------------------------------------------------------------- connections */

static void out_free(struct srv_out *o)
{
	free(o->buf);
	free(o);
}

static void conn_unlink(struct srv_conn **list, struct srv_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*list = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

static void conn_push(struct srv_conn **list, struct srv_conn *c)
{
	c->prev = NULL;
	c->next = *list;
	if (*list)
		(*list)->prev = c;
	*list = c;
}

static void conn_free(struct srv_conn *c)
{
	lease_drop(c);
	if (c->pool)
		c->pool->clients--;
	if (c->pev)
		event_free(c->pev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->srv->n_conns--;
	free(c);
}

/*
 * Whether the peer is exiting or gone.  The pidfd turns readable once the
 * process has exited; before that, PF_EXITING in /proc/PID/stat says the
 * exit has begun (a killed process closes its files first).  The pid cannot
 * be reused meanwhile: an unreadable pidfd means it has not been reaped.
 */
static bool peer_dying(const struct srv_conn *c)
{
	struct pollfd pfd = { .fd = c->pidfd, .events = POLLIN };
	char path[64], buf[1024], *p;
	unsigned long flags = 0;
	char state = 0;
	ssize_t n;
	int fd;

	if (poll(&pfd, 1, 0) > 0)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)c->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = 0;
	/* comm may hold blanks and ')': fields resume after the last ')' */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2)
		return false;
	return state == 'Z' || state == 'X' || (flags & 0x4 /* PF_EXITING */);
}

/* Ends a connection: the socket closes now; the lease goes now or when the
 * dying peer has exited. */
static void conn_close(struct srv_conn *c, const char *why)
{
	kvq_server *s = c->srv;
	struct srv_out *o;

	kvq_log(LOG_DEBUG, "client %llu (pid %d): closed: %s", (unsigned long long)c->id, (int)c->pid, why);
	conn_unlink(&s->conns, c);
	event_free(c->rev);
	event_free(c->wev);
	c->rev = c->wev = NULL;
	close(c->fd);
	c->fd = -1;
	kvq_frame_decoder_fini(&c->dec);
	while ((o = c->out_head)) {
		c->out_head = o->next;
		out_free(o);
	}
	if (c->lease && c->pidfd >= 0 && (kvq_session_n_sealed(c->lease) || kvq_session_n_open(c->lease)) &&
	    peer_dying(c)) {
		c->pev = event_new(s->base, c->pidfd, EV_READ, conn_on_pidfd, c);
		if (c->pev && event_add(c->pev, NULL) == 0) {
			kvq_log(LOG_INFO, "client %llu: peer %d is exiting, lease kept until it has exited",
				(unsigned long long)c->id, (int)c->pid);
			conn_push(&s->dying, c);
			return;
		}
		kvq_log(LOG_WARNING, "client %llu: cannot watch pidfd, dropping the lease now",
			(unsigned long long)c->id);
	}
	conn_free(c);
}

static void conn_on_pidfd(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;

	kvq_log(LOG_INFO, "client %llu: peer %d exited, lease dropped", (unsigned long long)c->id, (int)c->pid);
	conn_unlink(&c->srv->dying, c);
	conn_free(c);
}

static void conn_update_events(struct srv_conn *c)
{
	bool want_read = c->out_bytes < KVQ_SERVER_OUT_HIGH && !c->close_after_flush;

	if (want_read != c->reading) {
		if (want_read)
			event_add(c->rev, NULL);
		else
			event_del(c->rev);
		c->reading = want_read;
	}
	/* write interest only while output is queued */
	if (c->out_head)
		event_add(c->wev, NULL);
	else
		event_del(c->wev);
}

/* Sends what is queued; returns 0, or -1 after closing c. */
static int conn_flush(struct srv_conn *c)
{
	struct srv_out *o;

	while ((o = c->out_head)) {
		int n = kvq_frame_send(c->fd, o->buf + o->off, o->len - o->off, o->off ? -1 : o->fd);

		if (n == -EAGAIN)
			break;
		if (n < 0) {
			conn_close(c, strerror(-n));
			return -1;
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off < o->len)
			break;
		c->out_head = o->next;
		if (!c->out_head)
			c->out_tail = NULL;
		out_free(o);
	}
	if (!c->out_head && c->close_after_flush) {
		conn_close(c, "closed after the reply");
		return -1;
	}
	conn_update_events(c);
	return 0;
}

/* Queues one reply frame (with fd as SCM_RIGHTS when >= 0). */
static int conn_queue(struct srv_conn *c, const Kvq__Envelope *e, int fd)
{
	struct srv_out *o = calloc(1, sizeof(*o));
	int r;

	if (!o)
		return -ENOMEM;
	r = kvq_frame_encode_alloc(e, &o->buf, &o->len);
	if (r < 0) {
		free(o);
		return r;
	}
	o->fd = fd;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += o->len;
	return 0;
}

static void conn_error(struct srv_conn *c, uint64_t id, int status, const char *msg)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	char m[KVQ_PROTO_MAX_MESSAGE];

	snprintf(m, sizeof(m), "%s", msg && *msg ? msg : strerror(status < 0 && status > -4096 ? -status : EINVAL));
	e.id = id;
	e.status = status;
	e.message = m;
	kvq_log(LOG_DEBUG, "client %llu: request %llu: %d %s", (unsigned long long)c->id, (unsigned long long)id,
		status, m);
	if (conn_queue(c, &e, -1) < 0)
		c->close_after_flush = true;
}

/* ---------------------------------------------------------------- requests */

/* A request handler fills the reply's body (allocating with malloc where it
 * has to; the caller frees what reply_free knows) or returns an error with a
 * message; on error nothing has changed. */
struct reply {
	Kvq__Envelope e;
	union {
		Kvq__HelloReply hello;
		Kvq__AttachReply attach;
		Kvq__AllocReply alloc;
		Kvq__SealReply seal;
		Kvq__PublishReply publish;
		Kvq__LookupReply lookup;
		Kvq__ReleaseReply release;
		Kvq__ForkReply fork;
		Kvq__StatsReply stats;
		Kvq__EvictReply evict;
		Kvq__PoolAddReply pool_add;
		Kvq__PoolDropReply pool_drop;
	} u;
	int fd;
	void *mem[4];          /* freed after sending */
	bool close_after;
};

static void reply_free(struct reply *r)
{
	for (size_t i = 0; i < sizeof(r->mem) / sizeof(r->mem[0]); i++)
		free(r->mem[i]);
}

static const char daemon_version[] = PACKAGE_VERSION;

static bool acl_ok(const struct srv_conn *c, const struct kvq_config_acl *acl)
{
	return kvq_config_acl_allows(acl, c->uid, c->groups, c->n_groups);
}

static int do_hello(struct srv_conn *c, const Kvq__Hello *h, struct reply *r, char *err, size_t errlen)
{
	kvq__hello_reply__init(&r->u.hello);
	r->u.hello.daemon_version = (char *)daemon_version;
	r->u.hello.protocol_version = KVQ_PROTOCOL_VERSION;
	r->u.hello.client_id = c->id;
	r->e.body_case = KVQ__ENVELOPE__BODY_HELLO_REPLY;
	r->e.hello_reply = &r->u.hello;
	if (h->protocol_version != KVQ_PROTOCOL_VERSION) {
		kvq_seterr(err, errlen, "protocol version %u, this daemon speaks %u", h->protocol_version,
			   KVQ_PROTOCOL_VERSION);
		r->close_after = true;
		return -EPROTONOSUPPORT;
	}
	c->hello = true;
	snprintf(c->name, sizeof(c->name), "%s", h->client_name);
	kvq_log(LOG_INFO, "client %llu: hello from %s (pid %d, uid %u)", (unsigned long long)c->id, c->name,
		(int)c->pid, (unsigned)c->uid);
	return 0;
}

/* A pool described by an Attach, for creation on attach. */
/* A pool created on attach: the client's geometry and policy; attachable by
 * its creator's user, root and the daemon's user (a pool is a trust
 * boundary: whoever maps it can read and write all of it). */
static int pool_from_attach(kvq_server *s, const Kvq__Attach *a, uid_t creator, struct srv_pool **ret, char *err,
			    size_t errlen)
{
	const Kvq__PoolCreate *pc = a->create;
	struct srv_pool *p = calloc(1, sizeof(*p));
	char why[KVQ_BACKEND_MSG_MAX];
	int r;

	if (!p)
		return -ENOMEM;
	p->mem.fd = -1;
	snprintf(p->name, sizeof(p->name), "%s", a->pool);
	snprintf(p->model, sizeof(p->model), "%s", a->model_id);
	if (a->layers == 0 || a->layers > KVQ_MAX_LAYERS) {
		kvq_seterr(err, errlen, "attach.layers %u out of 1..%u", a->layers, KVQ_MAX_LAYERS);
		r = -EINVAL;
		goto fail;
	}
	r = kvq_policy_parse(a->policy, a->layers, &p->policy, err, errlen);
	if (r < 0) {
		r = KVQ_EPOLICY;
		goto fail;
	}
	r = kvq_policy_format(&p->policy, p->policy_str, sizeof(p->policy_str));
	if (r < 0)
		goto fail;
	p->params = (struct kvq_layout_params){ .layers = a->layers, .kv_heads = a->kv_heads,
		.head_dim = a->head_dim, .block_tokens = a->block_tokens, .window = a->window,
		.act = (int)a->act };
	p->acl.any = false;
	p->acl.uids[p->acl.n_uids++] = creator;
	if (creator != 0)
		p->acl.uids[p->acl.n_uids++] = 0;
	if (geteuid() != 0 && geteuid() != creator)
		p->acl.uids[p->acl.n_uids++] = geteuid();
	p->quota = s->cfg->quota_per_uid;
	p->capacity = s->cfg->create_capacity;
	p->device = pc->device < 0 ? s->device : pc->device;
	if (!pc->backend[0] && (p->device == s->device || s->backend == &kvq_backend_host)) {
		p->backend = s->backend;
	} else {
		r = kvq_backend_pick(pc->backend[0] ? pc->backend : s->backend->name, p->device, &p->backend,
				     why, sizeof(why));
		if (r < 0) {
			kvq_seterr(err, errlen, "%s", why);
			goto fail;
		}
	}
	if (p->backend == &kvq_backend_host)
		p->device = 0;
	*ret = p;
	return 0;
fail:
	free(p);
	return r;
}

/* Layers past n_layers are not part of a policy (the parser leaves them be). */
static bool policy_equal(const struct kvq_policy *a, const struct kvq_policy *b)
{
	return a->n_layers == b->n_layers && a->n_layers <= KVQ_MAX_LAYERS && !memcmp(a->k, b->k, a->n_layers) &&
	       !memcmp(a->v, b->v, a->n_layers);
}

static int do_attach(struct srv_conn *c, const Kvq__Attach *a, struct reply *r, char *err, size_t errlen)
{
	kvq_server *s = c->srv;
	struct srv_pool *p = pool_find(s, a->pool);
	struct kvq_policy pol;
	bool created = false;
	int ret;

	if (c->pool)
		return kvq_seterr(err, errlen, "already attached to pool %s", c->pool->name), -EISCONN;
	if (!p) {
		if (!a->create)
			return kvq_seterr(err, errlen, "no pool %s", a->pool), -ENOENT;
		if (!s->cfg->create_on_attach || !acl_ok(c, &s->cfg->create_acl))
			return kvq_seterr(err, errlen, "may not create pool %s", a->pool), -EACCES;
		ret = pool_from_attach(s, a, c->uid, &p, err, errlen);
		if (ret < 0)
			return ret;
		created = true;
	} else {
		if (!acl_ok(c, &p->acl))
			return kvq_seterr(err, errlen, "pool %s refuses uid %u", p->name, (unsigned)c->uid), -EACCES;
		if (a->layout_version != KVQ_LAYOUT_VERSION || a->layers != p->params.layers ||
		    a->kv_heads != p->params.kv_heads || a->head_dim != p->params.head_dim ||
		    a->block_tokens != p->params.block_tokens || (int)a->act != p->params.act ||
		    strcmp(a->model_id, p->model) ||
		    (a->window && a->window != (p->L ? p->L->window : p->params.window)))
			return kvq_seterr(err, errlen, "pool %s is model %s, layout v%u, %ux%ux%u, %u tokens/block",
					  p->name, p->model, KVQ_LAYOUT_VERSION, p->params.layers,
					  p->params.kv_heads, p->params.head_dim, p->params.block_tokens),
			       KVQ_ELAYOUT;
		if (kvq_policy_parse(a->policy, a->layers, &pol, err, errlen) < 0)
			return KVQ_EPOLICY;
		if (!policy_equal(&pol, &p->policy))
			return kvq_seterr(err, errlen, "pool %s has policy %s", p->name, p->policy_str), KVQ_ELAYOUT;
	}
	if (created && a->layout_version != KVQ_LAYOUT_VERSION) {
		kvq_seterr(err, errlen, "layout version %u, this daemon has %u", a->layout_version, KVQ_LAYOUT_VERSION);
		free(p);
		return KVQ_ELAYOUT;
	}
	if (!p->allocated) {
		ret = pool_allocate(s, p, created ? a->create->n_sealed : 0, created ? a->create->n_open : 0, err,
				    errlen);
		if (ret < 0) {
			kvq_log(LOG_WARNING, "pool %s: not created: %s", p->name, err);
			if (created)
				free(p);
			return ret;
		}
	}
	ret = kvq_session_new(&c->lease);
	if (ret < 0) {
		if (created)
			pool_free(p);
		return ret;
	}
	if (created) {
		p->next = s->pools;
		s->pools = p;
	}
	c->pool = p;
	p->clients++;

	kvq__attach_reply__init(&r->u.attach);
	r->u.attach.layout_version = p->L->version;
	r->u.attach.layers = p->L->layers;
	r->u.attach.kv_heads = p->L->kv_heads;
	r->u.attach.head_dim = p->L->head_dim;
	r->u.attach.block_tokens = p->L->block_tokens;
	r->u.attach.window = p->L->window;
	r->u.attach.act = (Kvq__DType)p->L->act;
	r->u.attach.n_sealed = p->L->n_sealed;
	r->u.attach.n_open = p->L->n_open;
	r->u.attach.policy = p->policy_str;
	r->u.attach.total_bytes = p->L->total_bytes;
	r->u.attach.map_bytes = p->mem.size;
	r->u.attach.backend = (char *)p->backend->name;
	r->u.attach.device = p->backend == &kvq_backend_host ? -1 : p->device;
	r->u.attach.model_id = p->model;
	r->e.body_case = KVQ__ENVELOPE__BODY_ATTACH_REPLY;
	r->e.attach_reply = &r->u.attach;
	r->fd = p->mem.fd;
	kvq_log(LOG_INFO, "client %llu: attached to pool %s", (unsigned long long)c->id, p->name);
	return 0;
}

static int do_alloc(struct srv_conn *c, const Kvq__Alloc *a, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;
	struct kvq_pool_stats st;
	uint32_t *open = NULL, *resv = NULL, *sealed = NULL;
	uint64_t bytes;
	int ret;

	bytes = (uint64_t)a->n_open * (p->L->open_block_bytes + p->L->sealed_block_bytes) +
		(uint64_t)a->n_sealed * p->L->sealed_block_bytes;
	if (!quota_allows(c->srv, p, c->uid, bytes))
		return kvq_seterr(err, errlen, "uid %u would exceed its quota of %llu bytes in pool %s",
				  (unsigned)c->uid, (unsigned long long)p->quota, p->name), -EDQUOT;
	/* both classes are checked before either is taken: all or nothing */
	kvq_pool_stats(p->pool, &st);
	if (a->n_open > st.open_free ||
	    (uint64_t)a->n_open + a->n_sealed > (uint64_t)st.sealed_free + kvq_prefix_evictable(p->prefix)) {
		p->alloc_failures++;
		return kvq_seterr(err, errlen, "pool %s cannot hold %u open + %u sealed slots", p->name, a->n_open,
				  a->n_sealed), -ENOSPC;
	}
	open = calloc(a->n_open + 1, sizeof(*open));
	resv = calloc(a->n_open + 1, sizeof(*resv));
	sealed = calloc(a->n_sealed + 1, sizeof(*sealed));
	if (!open || !resv || !sealed || kvq_session_reserve(c->lease, a->n_sealed, a->n_open) < 0) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = kvq_pool_alloc_open(p->pool, a->n_open, open, resv);
	if (ret < 0)
		goto fail;
	ret = kvq_pool_alloc_sealed(p->pool, a->n_sealed, sealed);
	if (ret < 0) {
		for (uint32_t i = 0; i < a->n_open; i++)
			kvq_pool_release_open(p->pool, open[i]);
		goto fail;
	}
	for (uint32_t i = 0; i < a->n_open; i++)
		kvq_session_open_add(c->lease, open[i]);
	for (uint32_t i = 0; i < a->n_sealed; i++)
		kvq_session_sealed_add(c->lease, sealed[i], 1);
	kvq__alloc_reply__init(&r->u.alloc);
	r->u.alloc.n_open_ids = r->u.alloc.n_reserved_ids = a->n_open;
	r->u.alloc.open_ids = open;
	r->u.alloc.reserved_ids = resv;
	r->u.alloc.n_sealed_ids = a->n_sealed;
	r->u.alloc.sealed_ids = sealed;
	r->mem[0] = open;
	r->mem[1] = resv;
	r->mem[2] = sealed;
	r->e.body_case = KVQ__ENVELOPE__BODY_ALLOC_REPLY;
	r->e.alloc_reply = &r->u.alloc;
	return 0;
fail:
	free(open);
	free(resv);
	free(sealed);
	if (ret == -ENOSPC)
		kvq_seterr(err, errlen, "pool %s is full", p->name);
	return ret;
}

static int do_seal(struct srv_conn *c, const Kvq__Seal *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;
	kvq_session *seen = NULL;
	int ret = 0;

	ret = kvq_session_new(&seen);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < q->n_open_ids; i++) {
		uint32_t o = q->open_ids[i], resv;

		if (!kvq_session_open_has(c->lease, o) || kvq_session_open_add(seen, o) < 0) {
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
	if (kvq_session_reserve(c->lease, (uint32_t)q->n_open_ids, 0) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < q->n_open_ids; i++) {
		uint32_t id;

		kvq_pool_seal(p->pool, q->open_ids[i], &id);
		kvq_session_open_del(c->lease, q->open_ids[i]);
		kvq_session_sealed_add(c->lease, id, 1);
	}
	kvq__seal_reply__init(&r->u.seal);
	r->e.body_case = KVQ__ENVELOPE__BODY_SEAL_REPLY;
	r->e.seal_reply = &r->u.seal;
out:
	kvq_session_free(seen);
	return ret;
}

static int do_publish(struct srv_conn *c, const Kvq__Publish *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;
	uint32_t B = p->L->block_tokens, *ids = NULL;
	kvq_session *seen = NULL;
	int ret;

	ret = kvq_session_new(&seen);
	if (ret < 0)
		return ret;
	ids = calloc(q->n_blocks + 1, sizeof(*ids));
	if (!ids) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < q->n_blocks; i++) {
		const Kvq__PublishBlock *b = q->blocks[i];

		if (b->n_tokens != B) {
			ret = (kvq_seterr(err, errlen, "publish.blocks[%zu]: %zu tokens, a block has %u", i,
					 b->n_tokens, B), -EINVAL);
			goto out;
		}
		if (!kvq_session_sealed(c->lease, b->sealed_id) ||
		    kvq_pool_check_sealed(p->pool, b->sealed_id, KVQ_POOL_BIT(KVQ_POOL_PRIVATE)) < 0 ||
		    kvq_session_sealed_add(seen, b->sealed_id, 1) != 1) {
			ret = (kvq_seterr(err, errlen,
					 "publish.blocks[%zu].sealed_id %u: not an unpublished block held by the caller "
					 "(or named twice)", i, b->sealed_id), -EINVAL);
			goto out;
		}
		if (b->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID &&
		    !kvq_session_sealed(seen, b->parent_id) &&
		    (!kvq_session_sealed(c->lease, b->parent_id) ||
		     kvq_pool_check_sealed(p->pool, b->parent_id, KVQ_POOL_BIT(KVQ_POOL_CACHED)) < 0)) {
			ret = (kvq_seterr(err, errlen,
					 "publish.blocks[%zu].parent_id %u: neither a cached block the caller holds "
					 "nor an earlier block of this request", i, b->parent_id), -EINVAL);
			goto out;
		}
		if (b->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID && b->parent_id == b->sealed_id) {
			ret = (kvq_seterr(err, errlen, "publish.blocks[%zu]: its own parent", i), -EINVAL);
			goto out;
		}
	}
	if (kvq_session_reserve(c->lease, (uint32_t)q->n_blocks, 0) < 0) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < q->n_blocks; i++) {
		const Kvq__PublishBlock *b = q->blocks[i];
		int32_t parent = -1;
		uint32_t got;

		if (b->parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID) {
			parent = (int32_t)b->parent_id;
			/* an earlier block of this request may have become a cached duplicate */
			for (size_t j = 0; j < i; j++)
				if (q->blocks[j]->sealed_id == b->parent_id)
					parent = (int32_t)ids[j];
		}
		ret = kvq_prefix_publish(p->prefix, b->sealed_id, parent, b->tokens, b->salt.data, b->salt.len, &got);
		if (ret < 0) {
			/* validated above: only libcrypto can fail here */
			kvq_log(LOG_ERR, "pool %s: publish of block %u failed: %s", p->name, b->sealed_id,
				strerror(-ret));
			kvq_seterr(err, errlen, "publish.blocks[%zu] failed; blocks before it are published", i);
			goto out;
		}
		if (got != b->sealed_id) {
			/* the caller's holds move to the cached copy; the duplicate goes */
			uint32_t n = kvq_session_sealed(c->lease, b->sealed_id);

			for (uint32_t k = 0; k < n; k++)
				kvq_pool_ref(p->pool, got);
			for (uint32_t k = 0; k < n; k++)
				kvq_pool_unref(p->pool, b->sealed_id);
			kvq_session_sealed_sub(c->lease, b->sealed_id, n);
			kvq_session_sealed_add(c->lease, got, n);
		}
		ids[i] = got;
	}
	kvq__publish_reply__init(&r->u.publish);
	r->u.publish.n_ids = q->n_blocks;
	r->u.publish.ids = ids;
	r->mem[0] = ids;
	ids = NULL;
	r->e.body_case = KVQ__ENVELOPE__BODY_PUBLISH_REPLY;
	r->e.publish_reply = &r->u.publish;
out:
	free(ids);
	kvq_session_free(seen);
	return ret;
}

static int do_lookup(struct srv_conn *c, const Kvq__Lookup *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;
	uint32_t max_ids = (uint32_t)(q->n_tokens / p->L->block_tokens), n = 0, fresh = 0;
	uint32_t *ids;
	int ret;

	if (max_ids > KVQ_PROTO_MAX_IDS)
		max_ids = KVQ_PROTO_MAX_IDS;
	ids = calloc(max_ids + 1, sizeof(*ids));
	if (!ids || kvq_session_reserve(c->lease, max_ids, 0) < 0) {
		free(ids);
		return -ENOMEM;
	}
	ret = kvq_prefix_lookup(p->prefix, q->tokens, (uint32_t)q->n_tokens, q->max_tokens, q->salt.data,
				q->salt.len, ids, max_ids, &n);
	if (ret < 0) {
		free(ids);
		return kvq_seterr(err, errlen, "lookup failed: %s", strerror(-ret)), ret;
	}
	for (uint32_t i = 0; i < n; i++)
		if (!kvq_session_sealed(c->lease, ids[i]))
			fresh++;
	if (!quota_allows(c->srv, p, c->uid, (uint64_t)fresh * p->L->sealed_block_bytes)) {
		for (uint32_t i = 0; i < n; i++)
			kvq_pool_unref(p->pool, ids[i]);
		free(ids);
		return kvq_seterr(err, errlen, "uid %u would exceed its quota in pool %s", (unsigned)c->uid,
				  p->name), -EDQUOT;
	}
	for (uint32_t i = 0; i < n; i++)
		kvq_session_sealed_add(c->lease, ids[i], 1);
	p->lookup_tokens += q->max_tokens;
	p->hit_tokens += (uint64_t)n * p->L->block_tokens;
	kvq__lookup_reply__init(&r->u.lookup);
	r->u.lookup.n_sealed_ids = n;
	r->u.lookup.sealed_ids = ids;
	r->mem[0] = ids;
	r->e.body_case = KVQ__ENVELOPE__BODY_LOOKUP_REPLY;
	r->e.lookup_reply = &r->u.lookup;
	return 0;
}

/* Checks that the caller holds every sealed id with its multiplicity in
 * ids[n]; counts are left in *ret_want (free it). */
static int check_held(struct srv_conn *c, const uint32_t *ids, size_t n, const char *what, kvq_session **ret_want,
		      char *err, size_t errlen)
{
	kvq_session *want = NULL;
	int ret = kvq_session_new(&want);

	if (ret < 0)
		return ret;
	for (size_t i = 0; i < n; i++) {
		if (kvq_session_sealed_add(want, ids[i], 1) < 0) {
			kvq_session_free(want);
			return -ENOMEM;
		}
		if (kvq_session_sealed(want, ids[i]) > kvq_session_sealed(c->lease, ids[i])) {
			kvq_session_free(want);
			return kvq_seterr(err, errlen, "%s[%zu] = %u: not held by the caller (that many times)", what,
					  i, ids[i]), -EINVAL;
		}
	}
	*ret_want = want;
	return 0;
}

static int do_release(struct srv_conn *c, const Kvq__Release *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;
	kvq_session *want = NULL;
	int ret;

	ret = check_held(c, q->sealed_ids, q->n_sealed_ids, "release.sealed_ids", &want, err, errlen);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < q->n_open_ids; i++)
		if (!kvq_session_open_has(c->lease, q->open_ids[i]) || kvq_session_open_add(want, q->open_ids[i]) < 0) {
			kvq_session_free(want);
			return kvq_seterr(err, errlen, "release.open_ids[%zu] = %u: not held (or named twice)", i,
					  q->open_ids[i]), -EINVAL;
		}
	for (size_t i = 0; i < q->n_sealed_ids; i++) {
		kvq_pool_unref(p->pool, q->sealed_ids[i]);
		kvq_session_sealed_sub(c->lease, q->sealed_ids[i], 1);
	}
	for (size_t i = 0; i < q->n_open_ids; i++) {
		kvq_pool_release_open(p->pool, q->open_ids[i]);
		kvq_session_open_del(c->lease, q->open_ids[i]);
	}
	kvq_session_free(want);
	kvq__release_reply__init(&r->u.release);
	r->e.body_case = KVQ__ENVELOPE__BODY_RELEASE_REPLY;
	r->e.release_reply = &r->u.release;
	return 0;
}

static int do_fork(struct srv_conn *c, const Kvq__Fork *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = c->pool;

	for (size_t i = 0; i < q->n_sealed_ids; i++) {
		uint32_t id = q->sealed_ids[i];

		if (!kvq_session_sealed(c->lease, id))
			return kvq_seterr(err, errlen, "fork.sealed_ids[%zu] = %u: not held by the caller", i, id),
			       -EINVAL;
		/* a batch naming one id n times must fit below the limits n times over */
		if (kvq_pool_refs(p->pool, id) >= KVQ_POOL_MAX_REFS - q->n_sealed_ids ||
		    kvq_session_sealed(c->lease, id) >= UINT32_MAX - q->n_sealed_ids)
			return kvq_seterr(err, errlen, "fork.sealed_ids[%zu] = %u: too many references", i, id),
			       -EOVERFLOW;
	}
	for (size_t i = 0; i < q->n_sealed_ids; i++) {
		kvq_pool_ref(p->pool, q->sealed_ids[i]);
		kvq_session_sealed_add(c->lease, q->sealed_ids[i], 1);
	}
	kvq__fork_reply__init(&r->u.fork);
	r->e.body_case = KVQ__ENVELOPE__BODY_FORK_REPLY;
	r->e.fork_reply = &r->u.fork;
	return 0;
}

static void pool_info(const struct srv_pool *p, struct kvq_server_pool_info *o)
{
	memset(o, 0, sizeof(*o));
	kvq_pool_stats(p->pool, &o->st);
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
	o->device_memory = p->device_memory;
	o->lookup_tokens = p->lookup_tokens;
	o->hit_tokens = p->hit_tokens;
	o->alloc_failures = o->st.alloc_failures + p->alloc_failures;
	o->clients = p->clients;
}

static void fill_pool_stats(const struct srv_pool *p, Kvq__PoolStats *o)
{
	struct kvq_server_pool_info i;

	pool_info(p, &i);
	kvq__pool_stats__init(o);
	o->name = (char *)i.name;
	o->model_id = (char *)i.model;
	o->policy = (char *)i.policy;
	o->backend = (char *)i.backend;
	o->device = i.device;
	o->layers = i.layers;
	o->kv_heads = i.kv_heads;
	o->head_dim = i.head_dim;
	o->block_tokens = i.block_tokens;
	o->window = i.window;
	o->act = (Kvq__DType)i.act;
	o->total_bytes = i.total_bytes;
	o->sealed_block_bytes = i.sealed_block_bytes;
	o->open_block_bytes = i.open_block_bytes;
	o->device_memory = i.device_memory;
	o->n_sealed = i.st.n_sealed;
	o->n_open = i.st.n_open;
	o->sealed_free = i.st.sealed_free;
	o->sealed_reserved = i.st.sealed_reserved;
	o->sealed_held = i.st.sealed_private;
	o->cached = i.st.sealed_cached;
	o->referenced = i.st.cached_referenced;
	o->open_used = i.st.open_used;
	o->lookup_tokens = i.lookup_tokens;
	o->hit_tokens = i.hit_tokens;
	o->evictions = i.st.evictions;
	o->alloc_failures = i.alloc_failures;
	o->clients = i.clients;
}

static void fill_client_stats(const struct srv_conn *c, bool exiting, Kvq__ClientStats *o)
{
	kvq__client_stats__init(o);
	o->id = c->id;
	o->name = (char *)c->name;
	o->pid = (uint32_t)c->pid;
	o->uid = (uint32_t)c->uid;
	o->pool = (char *)(c->pool ? c->pool->name : "");
	o->exiting = exiting;
	if (c->pool && c->lease) {
		o->sealed_blocks = kvq_session_n_sealed(c->lease);
		o->open_blocks = kvq_session_n_open(c->lease);
		o->bytes = lease_bytes(c->pool, c->lease);
	}
}

/* Whether the caller sees pool p in Stats (and may name it in Evict). */
static bool pool_visible(const struct srv_conn *c, const struct srv_pool *p)
{
	return p->allocated && acl_ok(c, &p->acl);
}

static int do_stats(struct srv_conn *c, const Kvq__Stats *q, struct reply *r, char *err, size_t errlen)
{
	kvq_server *s = c->srv;
	const struct srv_conn *lists[2] = { s->conns, s->dying };
	size_t n = 0, k = 0, nc = 0, kc = 0;
	Kvq__PoolStats *st, **pst;
	Kvq__ClientStats *cs, **pcs;
	struct timespec now;

	for (struct srv_pool *p = s->pools; p; p = p->next)
		n++;
	if (q->pool[0]) {
		struct srv_pool *p = pool_find(s, q->pool);

		if (!p || !p->allocated)
			return kvq_seterr(err, errlen, "no pool %s", q->pool), -ENOENT;
		if (!acl_ok(c, &p->acl))
			return kvq_seterr(err, errlen, "pool %s refuses uid %u", p->name, (unsigned)c->uid), -EACCES;
	}
	nc = s->n_conns;
	st = calloc(n + 1, sizeof(*st));
	pst = calloc(n + 1, sizeof(*pst));
	cs = calloc(nc + 1, sizeof(*cs));
	pcs = calloc(nc + 1, sizeof(*pcs));
	if (!st || !pst || !cs || !pcs) {
		free(st);
		free(pst);
		free(cs);
		free(pcs);
		return -ENOMEM;
	}
	for (struct srv_pool *p = s->pools; p; p = p->next) {
		if (!pool_visible(c, p) || (q->pool[0] && strcmp(q->pool, p->name)))
			continue;
		fill_pool_stats(p, &st[k]);
		pst[k] = &st[k];
		k++;
	}
	/* clients of the pools listed, and the caller itself: who else is
	 * connected to a pool the caller cannot see is none of its business */
	for (int l = 0; l < 2; l++)
		for (const struct srv_conn *o = lists[l]; o && kc < nc && kc < KVQ_PROTO_MAX_CLIENTS; o = o->next) {
			if (o != c && !(o->pool && pool_visible(c, o->pool) &&
					(!q->pool[0] || !strcmp(q->pool, o->pool->name))))
				continue;
			fill_client_stats(o, l == 1, &cs[kc]);
			pcs[kc] = &cs[kc];
			kc++;
		}
	clock_gettime(CLOCK_MONOTONIC, &now);
	kvq__stats_reply__init(&r->u.stats);
	r->u.stats.daemon_version = (char *)daemon_version;
	r->u.stats.uptime_ms = (uint64_t)(now.tv_sec - s->started.tv_sec) * 1000 +
			       (uint64_t)((now.tv_nsec - s->started.tv_nsec) / 1000000);
	r->u.stats.backend = (char *)s->backend->name;
	r->u.stats.device = s->backend == &kvq_backend_host ? -1 : s->device;
	r->u.stats.n_pools = k;
	r->u.stats.pools = pst;
	r->u.stats.n_clients = kc;
	r->u.stats.clients = pcs;
	r->mem[0] = st;
	r->mem[1] = pst;
	r->mem[2] = cs;
	r->mem[3] = pcs;
	r->e.body_case = KVQ__ENVELOPE__BODY_STATS_REPLY;
	r->e.stats_reply = &r->u.stats;
	return 0;
}

/* ---------------------------------------------------------------- admin requests */

/* Root, and whoever admin_uids / admin_gids name (by default the daemon's
 * own user): admin requests change what every client of a pool sees. */
static bool is_admin(const struct srv_conn *c)
{
	return c->uid == 0 || acl_ok(c, &c->srv->cfg->admin_acl);
}

static int admin_check(const struct srv_conn *c, const char *what, char *err, size_t errlen)
{
	if (is_admin(c))
		return 0;
	kvq_seterr(err, errlen, "%s needs root or admin rights (kvqd.conf admin_uids, admin_gids); uid %u has none",
		   what, (unsigned)c->uid);
	return -EPERM;
}

/* A pool the caller may name in an admin request: hidden pools read as
 * absent, so the reply does not tell which names exist. */
static int admin_pool(struct srv_conn *c, const char *name, struct srv_pool **ret, char *err, size_t errlen)
{
	struct srv_pool *p = pool_find(c->srv, name);

	if (!p || !pool_visible(c, p))
		return kvq_seterr(err, errlen, "no pool %s", name), -ENOENT;
	*ret = p;
	return 0;
}

static int do_evict(struct srv_conn *c, const Kvq__Evict *q, struct reply *r, char *err, size_t errlen)
{
	struct srv_pool *p = NULL;
	uint32_t want, n = 0;
	int ret;

	ret = admin_check(c, "evict", err, errlen);
	if (ret == 0)
		ret = admin_pool(c, q->pool, &p, err, errlen);
	if (ret < 0)
		return ret;
	want = kvq_prefix_evictable(p->prefix);
	if (q->blocks && q->blocks < want)
		want = q->blocks;
	kvq_prefix_evict(p->prefix, want, NULL, &n);
	kvq_log(LOG_NOTICE, "pool %s: uid %u evicted %u cached blocks", p->name, (unsigned)c->uid, n);
	kvq__evict_reply__init(&r->u.evict);
	r->u.evict.evicted = n;
	r->e.body_case = KVQ__ENVELOPE__BODY_EVICT_REPLY;
	r->e.evict_reply = &r->u.evict;
	return 0;
}

static int do_pool_add(struct srv_conn *c, const Kvq__PoolAdd *q, struct reply *r, char *err, size_t errlen)
{
	kvq_server *s = c->srv;
	const Kvq__Attach *a = q->spec;
	struct srv_pool *p = NULL;
	Kvq__PoolStats *st;
	int ret;

	ret = admin_check(c, "adding a pool", err, errlen);
	if (ret < 0)
		return ret;
	if (pool_find(s, a->pool))
		return kvq_seterr(err, errlen, "pool %s exists", a->pool), -EEXIST;
	if (a->layout_version != KVQ_LAYOUT_VERSION)
		return kvq_seterr(err, errlen, "layout version %u, this daemon has %u", a->layout_version,
				  KVQ_LAYOUT_VERSION), KVQ_ELAYOUT;
	ret = pool_from_attach(s, a, c->uid, &p, err, errlen);
	if (ret < 0)
		return ret;
	if (q->n_acl_uids || q->n_acl_gids) {
		p->acl.n_uids = p->acl.n_gids = 0;
		p->acl.uids[p->acl.n_uids++] = 0;
		for (size_t i = 0; i < q->n_acl_uids; i++)
			p->acl.uids[p->acl.n_uids++] = (uid_t)q->acl_uids[i];
		for (size_t i = 0; i < q->n_acl_gids; i++)
			p->acl.gids[p->acl.n_gids++] = (gid_t)q->acl_gids[i];
	}
	if (q->capacity)
		p->capacity = (struct kvq_config_amount){ .kind = KVQ_AMOUNT_BYTES, .bytes = q->capacity };
	st = calloc(1, sizeof(*st));
	if (!st) {
		free(p);
		return -ENOMEM;
	}
	ret = pool_allocate(s, p, a->create->n_sealed, a->create->n_open, err, errlen);
	if (ret < 0) {
		free(st);
		free(p);
		return ret;
	}
	p->next = s->pools;
	s->pools = p;
	kvq_log(LOG_NOTICE, "pool %s added by uid %u", p->name, (unsigned)c->uid);
	fill_pool_stats(p, st);
	kvq__pool_add_reply__init(&r->u.pool_add);
	r->u.pool_add.pool = st;
	r->mem[0] = st;
	r->e.body_case = KVQ__ENVELOPE__BODY_POOL_ADD_REPLY;
	r->e.pool_add_reply = &r->u.pool_add;
	return 0;
}

static int do_pool_drop(struct srv_conn *c, const Kvq__PoolDrop *q, struct reply *r, char *err, size_t errlen)
{
	kvq_server *s = c->srv;
	struct srv_pool *p = NULL;
	int ret;

	ret = admin_check(c, "dropping a pool", err, errlen);
	if (ret == 0)
		ret = admin_pool(c, q->pool, &p, err, errlen);
	if (ret < 0)
		return ret;
	/* exiting clients count too: their GPU work may still touch the memory */
	if (p->clients)
		return kvq_seterr(err, errlen, "pool %s has %u clients attached", p->name, p->clients), -EBUSY;
	if (kvq_config_find_pool(s->cfg, p->name)) {
		/* a configured pool keeps its record: the next attach allocates it again */
		pool_release(p);
	} else {
		for (struct srv_pool **pp = &s->pools; *pp; pp = &(*pp)->next)
			if (*pp == p) {
				*pp = p->next;
				break;
			}
		pool_free(p);
	}
	kvq_log(LOG_NOTICE, "pool %s dropped by uid %u", q->pool, (unsigned)c->uid);
	kvq__pool_drop_reply__init(&r->u.pool_drop);
	r->e.body_case = KVQ__ENVELOPE__BODY_POOL_DROP_REPLY;
	r->e.pool_drop_reply = &r->u.pool_drop;
	return 0;
}

static const char *const req_names[KVQ_REQ_COUNT] = {
	[KVQ_REQ_HELLO] = "hello", [KVQ_REQ_ATTACH] = "attach", [KVQ_REQ_ALLOC] = "alloc",
	[KVQ_REQ_SEAL] = "seal", [KVQ_REQ_PUBLISH] = "publish", [KVQ_REQ_LOOKUP] = "lookup",
	[KVQ_REQ_RELEASE] = "release", [KVQ_REQ_FORK] = "fork", [KVQ_REQ_STATS] = "stats",
	[KVQ_REQ_EVICT] = "evict", [KVQ_REQ_POOL_ADD] = "pool_add", [KVQ_REQ_POOL_DROP] = "pool_drop",
	[KVQ_REQ_OTHER] = "other",
};

const char *kvq_server_req_name(int req)
{
	return req >= 0 && req < KVQ_REQ_COUNT ? req_names[req] : NULL;
}

static int req_type(Kvq__Envelope__BodyCase b)
{
	switch (b) {
	case KVQ__ENVELOPE__BODY_HELLO: return KVQ_REQ_HELLO;
	case KVQ__ENVELOPE__BODY_ATTACH: return KVQ_REQ_ATTACH;
	case KVQ__ENVELOPE__BODY_ALLOC: return KVQ_REQ_ALLOC;
	case KVQ__ENVELOPE__BODY_SEAL: return KVQ_REQ_SEAL;
	case KVQ__ENVELOPE__BODY_PUBLISH: return KVQ_REQ_PUBLISH;
	case KVQ__ENVELOPE__BODY_LOOKUP: return KVQ_REQ_LOOKUP;
	case KVQ__ENVELOPE__BODY_RELEASE: return KVQ_REQ_RELEASE;
	case KVQ__ENVELOPE__BODY_FORK: return KVQ_REQ_FORK;
	case KVQ__ENVELOPE__BODY_STATS: return KVQ_REQ_STATS;
	case KVQ__ENVELOPE__BODY_EVICT: return KVQ_REQ_EVICT;
	case KVQ__ENVELOPE__BODY_POOL_ADD: return KVQ_REQ_POOL_ADD;
	case KVQ__ENVELOPE__BODY_POOL_DROP: return KVQ_REQ_POOL_DROP;
	default: return KVQ_REQ_OTHER;
	}
}

/* One frame of c; returns 0, or -1 when c was closed. */
static int conn_handle(struct srv_conn *c, const uint8_t *payload, size_t len)
{
	Kvq__Envelope *req = NULL;
	struct reply r;
	char err[KVQ_PROTO_MAX_MESSAGE] = "";
	struct timespec t0, t1;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	memset(&r, 0, sizeof(r));
	kvq__envelope__init(&r.e);
	r.fd = -1;
	ret = kvq_frame_unpack(payload, len, &req);
	if (ret < 0) {
		conn_error(c, 0, -EBADMSG, "the envelope does not parse");
		return 0;
	}
	r.e.id = req->id;
	ret = kvq_frame_check(req, 1, err, sizeof(err));
	if (ret == 0 && req->id == 0) {
		ret = -EBADMSG;
		kvq_seterr(err, sizeof(err), "request id 0 is reserved");
	}
	if (ret < 0)
		goto reply;
	if (!c->hello && req->body_case != KVQ__ENVELOPE__BODY_HELLO) {
		ret = -EPROTO;
		kvq_seterr(err, sizeof(err), "Hello first");
		goto reply;
	}
	switch (req->body_case) {
	case KVQ__ENVELOPE__BODY_HELLO:
		if (c->hello) {
			ret = -EPROTO;
			kvq_seterr(err, sizeof(err), "Hello once");
		} else
			ret = do_hello(c, req->hello, &r, err, sizeof(err));
		break;
	case KVQ__ENVELOPE__BODY_STATS:
		ret = do_stats(c, req->stats, &r, err, sizeof(err));
		break;
	case KVQ__ENVELOPE__BODY_ATTACH:
		ret = do_attach(c, req->attach, &r, err, sizeof(err));
		break;
	case KVQ__ENVELOPE__BODY_EVICT:
		ret = do_evict(c, req->evict, &r, err, sizeof(err));
		break;
	case KVQ__ENVELOPE__BODY_POOL_ADD:
		ret = do_pool_add(c, req->pool_add, &r, err, sizeof(err));
		break;
	case KVQ__ENVELOPE__BODY_POOL_DROP:
		ret = do_pool_drop(c, req->pool_drop, &r, err, sizeof(err));
		break;
	default:
		if (!c->pool) {
			ret = -EPROTO;
			kvq_seterr(err, sizeof(err), "Attach first");
			break;
		}
		switch (req->body_case) {
		case KVQ__ENVELOPE__BODY_ALLOC:
			ret = do_alloc(c, req->alloc, &r, err, sizeof(err));
			break;
		case KVQ__ENVELOPE__BODY_SEAL:
			ret = do_seal(c, req->seal, &r, err, sizeof(err));
			break;
		case KVQ__ENVELOPE__BODY_PUBLISH:
			ret = do_publish(c, req->publish, &r, err, sizeof(err));
			break;
		case KVQ__ENVELOPE__BODY_LOOKUP:
			ret = do_lookup(c, req->lookup, &r, err, sizeof(err));
			break;
		case KVQ__ENVELOPE__BODY_RELEASE:
			ret = do_release(c, req->release, &r, err, sizeof(err));
			break;
		case KVQ__ENVELOPE__BODY_FORK:
			ret = do_fork(c, req->fork, &r, err, sizeof(err));
			break;
		default:
			ret = -EOPNOTSUPP;
			kvq_seterr(err, sizeof(err), "request type %d", (int)req->body_case);
			break;
		}
	}
reply:
	if (ret < 0) {
		/* only a version mismatch keeps its body (the daemon's HelloReply) */
		if (ret != -EPROTONOSUPPORT) {
			r.e.body_case = KVQ__ENVELOPE__BODY__NOT_SET;
			r.fd = -1;
		}
		if (!err[0])
			snprintf(err, sizeof(err), "%s", ret <= -1000 ? "layout" : strerror(-ret));
		r.e.status = ret;
		r.e.message = err;
		kvq_log(LOG_DEBUG, "client %llu: request %llu: %d %s", (unsigned long long)c->id,
			(unsigned long long)req->id, ret, err);
	}
	if (conn_queue(c, &r.e, r.fd) < 0) {
		kvq_log(LOG_ERR, "client %llu: reply to request %llu cannot be encoded", (unsigned long long)c->id,
			(unsigned long long)req->id);
		r.close_after = true;
	}
	if (r.close_after)
		c->close_after_flush = true;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	kvq_metrics_observe(&c->srv->latency[req_type(req->body_case)],
			    (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	reply_free(&r);
	kvq_frame_envelope_free(req);
	return 0;
}

static void conn_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct srv_conn *c = arg;
	const uint8_t *payload;
	size_t len;
	int n, r;

	n = kvq_frame_recv(c->fd, &c->dec, NULL);
	if (n == -EAGAIN)
		return;
	if (n == 0) {
		conn_close(c, kvq_frame_decoder_pending(&c->dec) ? "end of stream inside a frame" : "end of stream");
		return;
	}
	if (n < 0 && n != -ENOBUFS) {
		conn_close(c, strerror(-n));
		return;
	}
	if (c->dec.fds_dropped) {
		kvq_log(LOG_DEBUG, "client %llu: closed %u descriptors it sent", (unsigned long long)c->id,
			c->dec.fds_dropped);
		c->dec.fds_dropped = 0;
	}
	while (!c->close_after_flush && (r = kvq_frame_decoder_next(&c->dec, &payload, &len)) != 0) {
		if (r < 0) {
			kvq_log(LOG_NOTICE, "client %llu: framing fault (%s), closing", (unsigned long long)c->id,
				strerror(-r));
			conn_close(c, "framing fault");
			return;
		}
		conn_handle(c, payload, len);
	}
	conn_flush(c);
}

static void conn_on_write(evutil_socket_t fd, short what, void *arg)
{
	conn_flush(arg);
}

static void srv_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	kvq_server *s = arg;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	struct srv_conn *c;
	int fd;

	fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			kvq_log(LOG_WARNING, "accept: %s", strerror(errno));
		return;
	}
	if (s->n_conns >= KVQ_SERVER_MAX_CONNS) {
		kvq_log(LOG_WARNING, "refusing a connection: %u connections open", s->n_conns);
		close(fd);
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		kvq_log(LOG_WARNING, "SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->srv = s;
	c->fd = fd;
	c->id = ++s->next_id;
	c->uid = cred.uid;
	c->pid = cred.pid;
	c->groups[0] = cred.gid;
	c->n_groups = 1;
	{
		gid_t g[SRV_MAX_GROUPS];
		socklen_t glen = sizeof(g);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &glen) == 0)
			for (size_t i = 0; i < glen / sizeof(gid_t) && c->n_groups <= SRV_MAX_GROUPS; i++)
				c->groups[c->n_groups++] = g[i];
	}
	c->pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
	if (c->pidfd < 0)
		kvq_log(LOG_DEBUG, "client %llu: no pidfd for pid %d (%s): its lease goes at disconnect",
			(unsigned long long)c->id, (int)cred.pid, strerror(errno));
	kvq_frame_decoder_init(&c->dec);
	c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
	c->wev = event_new(s->base, fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
	s->n_conns++;
	conn_push(&s->conns, c);
	if (!c->rev || !c->wev || event_add(c->rev, NULL) < 0) {
		conn_close(c, "out of memory");
		return;
	}
	c->reading = true;
	kvq_log(LOG_DEBUG, "client %llu: connected (pid %d, uid %u, gid %u)", (unsigned long long)c->id,
		(int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
}

/* ---------------------------------------------------------------- server */

int kvq_server_new(struct event_base *base, const struct kvq_config *config, const char *backend, int device,
		   kvq_server **ret, char *err, size_t errlen)
{
	kvq_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->base = base;
	s->cfg = config;
	s->device = device;
	s->listen_fd = -1;
	clock_gettime(CLOCK_MONOTONIC, &s->started);
	r = kvq_backend_pick(backend, device, &s->backend, s->backend_reason, sizeof(s->backend_reason));
	if (r < 0) {
		kvq_seterr(err, errlen, "backend %s: %s", backend, s->backend_reason);
		goto fail;
	}
	if (!strcmp(backend, "auto") && s->backend == &kvq_backend_host)
		kvq_log(LOG_NOTICE, "backend auto: using host (%s)", s->backend_reason);
	else
		kvq_log(LOG_INFO, "backend %s", s->backend_reason);
	for (uint32_t i = 0; i < config->n_pools; i++) {
		struct srv_pool *p;

		r = pool_from_config(s, &config->pools[i], &p, err, errlen);
		if (r < 0)
			goto fail;
		p->next = s->pools;
		s->pools = p;
		if (!config->pools[i].create_on_attach) {
			r = pool_allocate(s, p, 0, 0, err, errlen);
			if (r < 0) {
				char m[SRV_ERR];

				snprintf(m, sizeof(m), "%s", err ? err : "");
				kvq_seterr(err, errlen, "pool %s: %s", p->name, m);
				goto fail;
			}
		}
	}
	*ret = s;
	return 0;
fail:
	kvq_server_free(s);
	return r;
}

static int srv_listen_event(kvq_server *s, char *err, size_t errlen)
{
	s->lev = event_new(s->base, s->listen_fd, EV_READ | EV_PERSIST, srv_on_accept, s);
	if (!s->lev || event_add(s->lev, NULL) < 0) {
		kvq_seterr(err, errlen, "cannot watch the listening socket");
		return -ENOMEM;
	}
	return 0;
}

int kvq_server_listen_path(kvq_server *s, const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(a.sun_path))
		return kvq_seterr(err, errlen, "socket path too long: %s", path), -ENAMETOOLONG;
	memcpy(a.sun_path, path, strlen(path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return r = -errno, kvq_seterr(err, errlen, "socket: %s", strerror(errno)), r;
	/* a socket file left by a daemon that died is replaced; anything else is not ours */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		kvq_seterr(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	/* the pool ACLs are the gate; the socket's group may connect */
	chmod(path, 0660);
	s->listen_fd = fd;
	snprintf(s->path, sizeof(s->path), "%s", path);
	return srv_listen_event(s, err, errlen);
}

int kvq_server_listen_fd(kvq_server *s, int fd, char *err, size_t errlen)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return kvq_seterr(err, errlen, "fd %d: %s", fd, strerror(errno)), -EBADF;
	s->listen_fd = fd;
	return srv_listen_event(s, err, errlen);
}

void kvq_server_set_config(kvq_server *s, const struct kvq_config *config)
{
	s->cfg = config;
	for (uint32_t i = 0; i < config->n_pools; i++) {
		const struct kvq_config_pool *cp = &config->pools[i];
		struct srv_pool *p = pool_find(s, cp->name);

		if (!p) {
			kvq_log(LOG_NOTICE, "reload: new pool %s is ignored until restart", cp->name);
			continue;
		}
		p->acl = cp->acl;
		p->quota = cp->quota_per_uid;
	}
	for (struct srv_pool *p = s->pools; p; p = p->next)
		if (!kvq_config_find_pool(config, p->name))
			p->quota = config->quota_per_uid;
}

void kvq_server_status(const kvq_server *s, char *buf, size_t len)
{
	unsigned pools = 0;

	for (const struct srv_pool *p = s->pools; p; p = p->next)
		pools += p->allocated;
	snprintf(buf, len, "%u pools, %u connections, backend %s", pools, s->n_conns, s->backend->name);
}

void kvq_server_free(kvq_server *s)
{
	struct srv_conn *c;
	struct srv_pool *p;

	if (!s)
		return;
	while ((c = s->conns))
		conn_close(c, "server stops");
	while ((c = s->dying)) {
		conn_unlink(&s->dying, c);
		conn_free(c);
	}
	if (s->lev)
		event_free(s->lev);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->path[0])
		unlink(s->path);
	while ((p = s->pools)) {
		s->pools = p->next;
		pool_free(p);
	}
	free(s);
}

int kvq_server_pool_info(const kvq_server *s, uint32_t i, struct kvq_server_pool_info *ret)
{
	for (const struct srv_pool *p = s->pools; p; p = p->next) {
		if (!p->allocated)
			continue;
		if (i-- == 0) {
			pool_info(p, ret);
			return 0;
		}
	}
	return -ENOENT;
}

void kvq_server_connections(const kvq_server *s, uint32_t *ret_live, uint32_t *ret_exiting)
{
	uint32_t dying = 0;

	for (const struct srv_conn *c = s->dying; c; c = c->next)
		dying++;
	*ret_live = s->n_conns - dying;
	*ret_exiting = dying;
}

const struct kvq_metrics_hist *kvq_server_latency(const kvq_server *s, int req)
{
	return req >= 0 && req < KVQ_REQ_COUNT ? &s->latency[req] : NULL;
}
