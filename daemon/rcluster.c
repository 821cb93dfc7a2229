/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Cluster client (rcluster.h): the key slot, the nodes and their
 * connections, the slot map and its refresh, requests and redirections.
 *
 * Every request holds a timer from its start; a request on the wire holds
 * a send, hiredis's privdata, which hiredis always calls back (with NULL
 * when the connection goes).  A request that ends first (its bound passed)
 * leaves its send behind with no request, and the connection it waited on
 * is closed: replies come in order, so the rest of that connection waits
 * behind it too.  Connections are freed by us only outside their own
 * callbacks, or by hiredis; a node lets go of its connection (ac->data) the
 * moment either starts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis.h>
#include <async.h>

#include "rcluster.h"
#include "rconn.h"

#define RC_HOST_MAX 256
#define RC_MAX_SEEDS 64
#define RC_MAX_CANDIDATES 256      /* nodes asked for the map: seeds and the last map's */
#define RC_MAX_NODES 1024          /* masters and ASK targets known at once */
#define RC_MAX_ARGS 1024
#define RC_REFRESH_MIN_MS 50       /* between two maps asked for */
#define RC_REFRESH_MAX_MS 1000     /* the backoff's bound while the cluster is down or failing over */
#define RC_MAX_MS 3600000          /* a timeout's bound (an hour) */

struct rc_addr {
	char host[RC_HOST_MAX];
	int port;
};

struct rc_node {
	struct rc_node *next;
	kvq_rcluster *rc;
	struct rc_addr addr;
	redisAsyncContext *ac;      /* NULL: no connection */
	struct event *connect_timer;
	bool ready;                 /* connected (and AUTH accepted) */
	bool down;                  /* its connection failed: not tried again before the next map */
	bool auth_refused;
	bool in_map;
};

struct rc_req;
struct rc_send {
	struct rc_req *req;         /* NULL: the request ended without this reply */
	redisAsyncContext *ac;
};

struct rc_req {
	struct rc_req *prev, *next;
	kvq_rcluster *rc;
	struct event *timer;        /* the bound, or an end without a reply (fail) */
	kvq_rcluster_cb *cb;
	void *ctx;
	struct rc_send *send;
	int fail;
	bool parked;                /* waiting for the first map */
	unsigned slot, redirects;
	int argc;
	const char **argv;          /* in this allocation */
	size_t *argvlen;
};

/* One node asked for CLUSTER SLOTS, on a connection of its own so that a
 * node's queue of requests never holds the map up. */
struct rc_probe {
	kvq_rcluster *rc;
	redisAsyncContext *ac;
	struct event *timer;
	struct rc_addr addr;
	bool timed_out;
};

struct kvq_rcluster {
	struct event_base *base;
	struct kvq_rcluster_opts o;
	char *user, *password;
	struct rc_addr *seeds, *cand;
	unsigned nseeds, ncand, cand_next, round_tried;
	int round_status;           /* a failed round's: -EACCES if a node refused AUTH */
	struct rc_node *nodes;
	unsigned nnodes;
	struct rc_node **slots, **next_slots;
	bool have_map, closing, refresh_again;
	unsigned failed_rounds;     /* since the last map */
	int down_status;            /* without a map, requests end with it */
	struct rc_probe *probe;
	struct event *refresh_timer;
	unsigned refresh_ms;
	struct rc_req *reqs;
	unsigned nreqs;
	struct kvq_rcluster_stats st;
};

static const struct {
	const char *name;
	int status;
} failures[KVQ_RC_NFAILURES] = {
#define KVQ_RC_ROW(id, n, s) [KVQ_RC_##id] = { n, s },
	KVQ_RCLUSTER_FAILURES(KVQ_RC_ROW)
#undef KVQ_RC_ROW
};

static void schedule_refresh(kvq_rcluster *rc);
static void req_route(struct rc_req *q);
static void on_reply(redisAsyncContext *ac, void *r, void *privdata);

/* --- the key slot --- */

uint16_t kvq_rcluster_crc16(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned kvq_rcluster_slot(const void *key, size_t keylen)
{
	const char *k = key, *open = memchr(k, '{', keylen), *close;

	if (open) {
		close = memchr(open + 1, '}', keylen - (size_t)(open + 1 - k));
		if (close && close > open + 1)
			return kvq_rcluster_crc16(open + 1, (size_t)(close - open - 1)) % KVQ_RCLUSTER_SLOTS;
	}
	return kvq_rcluster_crc16(k, keylen) % KVQ_RCLUSTER_SLOTS;
}

const char *kvq_rcluster_status_name(int status)
{
	if (!status)
		return "ok";
	for (int i = 0; i < KVQ_RC_NFAILURES; i++)
		if (failures[i].status == status)
			return failures[i].name;
	return "error";
}

/* --- small helpers --- */

static struct timeval ms_tv(unsigned ms)
{
	return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

/* "host:port" or "[v6]:port" of len bytes.  Returns 0 or -EINVAL. */
static int addr_parse(const char *s, size_t len, struct rc_addr *a)
{
	const char *colon = NULL, *host = s;
	size_t hlen;
	char num[8];
	char *end;
	long port;

	for (size_t i = 0; i < len; i++)
		if (s[i] == ':')
			colon = s + i;
	if (!colon || colon == s || (size_t)(s + len - colon - 1) >= sizeof(num) || colon + 1 == s + len)
		return -EINVAL;
	hlen = (size_t)(colon - s);
	if (s[0] == '[' && colon[-1] == ']') {
		host++;
		hlen -= 2;
	}
	if (!hlen || hlen >= RC_HOST_MAX)
		return -EINVAL;
	memcpy(num, colon + 1, (size_t)(s + len - colon - 1));
	num[s + len - colon - 1] = '\0';
	port = strtol(num, &end, 10);
	if (*end || port < 1 || port > 65535)
		return -EINVAL;
	memcpy(a->host, host, hlen);
	a->host[hlen] = '\0';
	a->port = (int)port;
	return 0;
}

static bool addr_eq(const struct rc_addr *a, const struct rc_addr *b)
{
	return a->port == b->port && !strcmp(a->host, b->host);
}

/* A new connection attached to the loop, AUTH queued first, or NULL. */
static redisAsyncContext *conn_open(kvq_rcluster *rc, const struct rc_addr *a, redisCallbackFn *auth_cb)
{
	redisAsyncContext *ac = redisAsyncConnect(a->host, a->port);

	if (!ac)
		return NULL;
	if (ac->err || kvq_rconn_attach(ac, rc->base) < 0) {
		redisAsyncFree(ac);
		return NULL;
	}
	/* hiredis 0.14 opens its sockets without it */
	fcntl(ac->c.fd, F_SETFD, FD_CLOEXEC);
	if (rc->password) {
		const char *argv[3] = { "AUTH", rc->user ? rc->user : rc->password, rc->password };

		redisAsyncCommandArgv(ac, auth_cb, NULL, rc->user ? 3 : 2, argv, NULL);
	}
	return ac;
}

static bool reply_is(const redisReply *r, const char *prefix)
{
	size_t n = strlen(prefix);

	return r->type == REDIS_REPLY_ERROR && r->len >= n && !strncmp(r->str, prefix, n);
}

static bool reply_auth_refused(const redisReply *r)
{
	return reply_is(r, "NOAUTH") || reply_is(r, "WRONGPASS") || reply_is(r, "ERR invalid password");
}

/* --- nodes --- */

static void on_connect_timer(evutil_socket_t fd, short what, void *arg);
static void on_connect(const redisAsyncContext *ac, int status);
static void on_disconnect(const redisAsyncContext *ac, int status);

static struct rc_node *node_find(kvq_rcluster *rc, const struct rc_addr *a)
{
	for (struct rc_node *n = rc->nodes; n; n = n->next)
		if (addr_eq(&n->addr, a))
			return n;
	return NULL;
}

static struct rc_node *node_get(kvq_rcluster *rc, const struct rc_addr *a)
{
	struct rc_node *n = node_find(rc, a);

	if (n || rc->nnodes >= RC_MAX_NODES)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->connect_timer = evtimer_new(rc->base, on_connect_timer, n);
	if (!n->connect_timer) {
		free(n);
		return NULL;
	}
	n->rc = rc;
	n->addr = *a;
	n->next = rc->nodes;
	rc->nodes = n;
	rc->nnodes++;
	return n;
}

/* The node lets go of its connection; returns it (NULL: none). */
static redisAsyncContext *node_detach(struct rc_node *n)
{
	redisAsyncContext *ac = n->ac;

	if (ac)
		ac->data = NULL;
	n->ac = NULL;
	n->ready = false;
	evtimer_del(n->connect_timer);
	return ac;
}

/* The node's connection failed and hiredis is freeing it. */
static void node_lost(struct rc_node *n)
{
	node_detach(n);
	n->down = true;
	schedule_refresh(n->rc);
}

/* Closes the node's connection, its requests ending with -ECONNRESET: only
 * outside that connection's callbacks. */
static void node_kill(struct rc_node *n)
{
	redisAsyncContext *ac = node_detach(n);

	n->down = true;
	schedule_refresh(n->rc);
	if (ac)
		redisAsyncFree(ac);
}

/* Every master answers: a failure after this one starts the backoff again. */
static void backoff_check(kvq_rcluster *rc)
{
	for (struct rc_node *m = rc->nodes; m; m = m->next)
		if (m->in_map && !m->ready)
			return;
	rc->refresh_ms = RC_REFRESH_MIN_MS;
}

static void node_ready(struct rc_node *n)
{
	n->ready = true;
	backoff_check(n->rc);
}

static void on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
	struct rc_node *n = ac->data;
	redisReply *reply = r;

	(void)privdata;
	if (!n || !reply)
		return;
	if (reply->type == REDIS_REPLY_ERROR) {
		/* the requests queued behind get NOAUTH, which ends them with -EACCES */
		n->auth_refused = true;
		schedule_refresh(n->rc);
		return;
	}
	node_ready(n);
}

static int node_connect(struct rc_node *n)
{
	kvq_rcluster *rc = n->rc;
	struct timeval tv = ms_tv(rc->o.connect_ms);

	n->ac = conn_open(rc, &n->addr, on_auth);
	if (!n->ac) {
		n->down = true;
		schedule_refresh(rc);
		return -ECONNRESET;
	}
	n->ac->data = n;
	redisAsyncSetConnectCallback(n->ac, on_connect);
	redisAsyncSetDisconnectCallback(n->ac, on_disconnect);
	evtimer_add(n->connect_timer, &tv);
	return 0;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
	struct rc_node *n = ac->data;

	if (!n)
		return;
	if (status != REDIS_OK) {
		node_lost(n);
		return;
	}
	evtimer_del(n->connect_timer);
	if (!n->rc->password)
		node_ready(n);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	struct rc_node *n = ac->data;

	(void)status;
	if (n)
		node_lost(n);
}

static void on_connect_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	node_kill(arg);
}

static void node_free(struct rc_node *n)
{
	redisAsyncContext *ac = node_detach(n);

	if (ac)
		redisAsyncFree(ac);
	event_free(n->connect_timer);
	free(n);
}

/* --- requests --- */

static int failure_index(int status)
{
	for (int i = 0; i < KVQ_RC_NFAILURES; i++)
		if (failures[i].status == status)
			return i;
	return -1;
}

static void req_end(struct rc_req *q, int status, redisReply *reply)
{
	kvq_rcluster *rc = q->rc;
	int i;

	if (q->prev)
		q->prev->next = q->next;
	else
		rc->reqs = q->next;
	if (q->next)
		q->next->prev = q->prev;
	rc->nreqs--;
	event_free(q->timer);
	if (!status) {
		rc->st.replies++;
	} else if ((i = failure_index(status)) >= 0) {
		rc->st.failures[i]++;
	}
	q->cb(q->ctx, status, status ? NULL : reply);
	free(q);
}

/* Ends q from the loop, not from the caller's stack. */
static void req_fail_soon(struct rc_req *q, int status)
{
	struct timeval zero = { 0, 0 };

	q->fail = status;
	q->parked = false;
	evtimer_del(q->timer);
	evtimer_add(q->timer, &zero);
}

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
	struct rc_req *q = arg;
	struct rc_send *s = q->send;

	(void)fd;
	(void)what;
	if (s) {
		struct rc_node *n = s->ac->data;

		s->req = NULL;
		q->send = NULL;
		/* the connection's later replies wait behind this one */
		if (n) {
			node_kill(n);
		} else {
			schedule_refresh(q->rc);
			redisAsyncFree(s->ac);
		}
	}
	req_end(q, q->fail ? q->fail : -ETIMEDOUT, NULL);
}

static void req_send(struct rc_req *q, struct rc_node *n, bool asking)
{
	struct rc_send *s;

	if (n->auth_refused) {
		req_fail_soon(q, -EACCES);
		return;
	}
	if (n->down || (!n->ac && node_connect(n) < 0)) {
		schedule_refresh(q->rc);
		req_fail_soon(q, -ECONNRESET);
		return;
	}
	s = malloc(sizeof(*s));
	if (!s) {
		req_fail_soon(q, -ENOMEM);
		return;
	}
	s->req = q;
	s->ac = n->ac;
	if ((asking && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK) ||
	    redisAsyncCommandArgv(n->ac, on_reply, s, q->argc, q->argv, q->argvlen) != REDIS_OK) {
		free(s);
		req_fail_soon(q, -ECONNRESET);
		return;
	}
	q->send = s;
}

static void req_route(struct rc_req *q)
{
	kvq_rcluster *rc = q->rc;
	struct rc_node *n;

	if (!rc->have_map) {
		req_fail_soon(q, rc->down_status);
		return;
	}
	n = rc->slots[q->slot];
	if (!n) {
		schedule_refresh(rc);
		req_fail_soon(q, -ENETDOWN);
		return;
	}
	req_send(q, n, false);
}

/* "MOVED 3999 127.0.0.1:6381" or "ASK ...": follows it.  Returns whether
 * it was one. */
static bool req_redirect(struct rc_req *q, const redisReply *r)
{
	kvq_rcluster *rc = q->rc;
	bool moved = reply_is(r, "MOVED "), ask = reply_is(r, "ASK ");
	const char *p, *sp;
	struct rc_addr a;
	struct rc_node *n;
	unsigned long slot;
	char *end;

	if (!moved && !ask)
		return false;
	p = r->str + (moved ? 6 : 4);
	slot = strtoul(p, &end, 10);
	sp = end;
	if (sp == p || *sp != ' ' || slot >= KVQ_RCLUSTER_SLOTS ||
	    addr_parse(sp + 1, r->len - (size_t)(sp + 1 - r->str), &a) < 0) {
		req_fail_soon(q, -ENETDOWN);
		return true;
	}
	if (moved)
		rc->st.moved++;
	else
		rc->st.ask++;
	if (++q->redirects > rc->o.max_redirects) {
		req_fail_soon(q, -ELOOP);
		return true;
	}
	n = node_get(rc, &a);
	if (!n) {
		req_fail_soon(q, -ENETDOWN);
		return true;
	}
	if (moved) {
		/* the slot's new owner at once; the rest of the map may have moved too */
		rc->slots[slot] = n;
		n->in_map = true;
		schedule_refresh(rc);
	}
	req_send(q, n, ask);
	return true;
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	struct rc_send *s = privdata;
	struct rc_req *q = s->req;
	struct rc_node *n = ac->data;
	redisReply *reply = r;

	free(s);
	if (!reply && n)
		node_lost(n);
	if (!q)
		return;
	q->send = NULL;
	if (!reply) {
		req_end(q, q->rc->closing ? -ECANCELED : -ECONNRESET, NULL);
	} else if (req_redirect(q, reply)) {
		return;
	} else if (reply_is(reply, "CLUSTERDOWN")) {
		schedule_refresh(q->rc);
		req_end(q, -ENETDOWN, NULL);
	} else if (reply_auth_refused(reply)) {
		req_end(q, -EACCES, NULL);
	} else {
		req_end(q, 0, reply);
	}
}

int kvq_rcluster_command(kvq_rcluster *rc, const void *key, size_t keylen, int argc, const char *const *argv,
			 const size_t *argvlen, kvq_rcluster_cb *cb, void *ctx)
{
	struct timeval tv;
	struct rc_req *q;
	size_t total = 0, head;
	char *bytes;

	if (!rc || !cb || argc < 1 || argc > RC_MAX_ARGS || !argv || !argvlen || (!key && keylen))
		return -EINVAL;
	if (rc->closing)
		return -ECANCELED;
	if (rc->nreqs >= rc->o.max_inflight) {
		rc->st.failures[KVQ_RC_FULL]++;
		return -EAGAIN;
	}
	for (int i = 0; i < argc; i++) {
		if ((!argv[i] && argvlen[i]) || argvlen[i] > rc->o.max_request_bytes - total)
			return -E2BIG;
		total += argvlen[i];
	}
	head = sizeof(*q) + (size_t)argc * (sizeof(size_t) + sizeof(char *));
	q = calloc(1, head + total + 1);
	if (!q)
		return -ENOMEM;
	q->timer = evtimer_new(rc->base, on_req_timer, q);
	if (!q->timer) {
		free(q);
		return -ENOMEM;
	}
	q->argvlen = (size_t *)(q + 1);
	q->argv = (const char **)(q->argvlen + argc);
	bytes = (char *)(q->argv + argc);
	for (int i = 0; i < argc; i++) {
		if (argvlen[i])
			memcpy(bytes, argv[i], argvlen[i]);
		q->argv[i] = bytes;
		q->argvlen[i] = argvlen[i];
		bytes += argvlen[i];
	}
	q->argc = argc;
	q->rc = rc;
	q->cb = cb;
	q->ctx = ctx;
	q->slot = kvq_rcluster_slot(key, keylen);
	q->next = rc->reqs;
	if (rc->reqs)
		rc->reqs->prev = q;
	rc->reqs = q;
	rc->nreqs++;
	rc->st.requests++;
	tv = ms_tv(rc->o.request_ms);
	evtimer_add(q->timer, &tv);
	if (!rc->have_map && !rc->failed_rounds)
		q->parked = true;   /* the first round is under way */
	else
		req_route(q);
	return 0;
}

/* --- the slot map --- */

static void probe_next(kvq_rcluster *rc);

static void cand_add(struct rc_addr *list, unsigned *n, const struct rc_addr *a)
{
	for (unsigned i = 0; i < *n; i++)
		if (addr_eq(&list[i], a))
			return;
	if (*n < RC_MAX_CANDIDATES)
		list[(*n)++] = *a;
}

/* A node entry of CLUSTER SLOTS: [host, port, id, ...]; an empty host is
 * the node asked. */
static int slots_addr(const redisReply *e, const struct rc_addr *asked, struct rc_addr *a)
{
	if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING ||
	    e->element[1]->type != REDIS_REPLY_INTEGER || e->element[1]->integer < 1 ||
	    e->element[1]->integer > 65535 || e->element[0]->len >= RC_HOST_MAX)
		return -EPROTO;
	if (!e->element[0]->len || !strcmp(e->element[0]->str, "?"))
		snprintf(a->host, sizeof(a->host), "%s", asked->host);
	else
		snprintf(a->host, sizeof(a->host), "%s", e->element[0]->str);
	a->port = (int)e->element[1]->integer;
	return 0;
}

static int slots_check(const redisReply *r, const struct rc_addr *asked)
{
	struct rc_addr a;

	if (r->type != REDIS_REPLY_ARRAY || !r->elements)
		return -ENETDOWN;   /* a node that serves no slot yet: the cluster is being made */
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i];

		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
		    e->element[0]->integer > e->element[1]->integer ||
		    e->element[1]->integer >= KVQ_RCLUSTER_SLOTS)
			return -EPROTO;
		for (size_t j = 2; j < e->elements; j++)
			if (slots_addr(e->element[j], asked, &a) < 0)
				return -EPROTO;
	}
	return 0;
}

/* Routes the requests that waited for the first map, or ends them. */
static void parked_go(kvq_rcluster *rc)
{
	for (struct rc_req *q = rc->reqs; q; q = q->next) {
		if (!q->parked)
			continue;
		q->parked = false;
		req_route(q);
	}
}

/* Closes connections after the map changed: callbacks run from here, so
 * the map is whole before. */
static void nodes_close(struct rc_node *retired, redisAsyncContext **kill, unsigned nkill)
{
	while (retired) {
		struct rc_node *next = retired->next;

		node_free(retired);
		retired = next;
	}
	for (unsigned i = 0; i < nkill; i++)
		redisAsyncFree(kill[i]);
	free(kill);
}

/* Takes r (CLUSTER SLOTS from asked) as the map.  Returns 0 or a negative
 * code, the map unchanged. */
static int map_take(kvq_rcluster *rc, const redisReply *r, const struct rc_addr *asked)
{
	struct rc_node *retired = NULL, **pn;
	redisAsyncContext **kill;
	unsigned nkill = 0, masters = 0;
	struct rc_addr a;
	int ret = slots_check(r, asked);

	if (ret < 0)
		return ret;
	memset(rc->next_slots, 0, KVQ_RCLUSTER_SLOTS * sizeof(*rc->next_slots));
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i];
		struct rc_node *n;

		slots_addr(e->element[2], asked, &a);
		n = node_get(rc, &a);
		if (!n)
			return -ENOMEM;
		for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
			rc->next_slots[s] = n;
	}
	kill = calloc(rc->nnodes, sizeof(*kill));
	if (!kill)
		return -ENOMEM;
	for (struct rc_node *n = rc->nodes; n; n = n->next)
		n->in_map = false;
	for (unsigned s = 0; s < KVQ_RCLUSTER_SLOTS; s++)
		if (rc->next_slots[s])
			rc->next_slots[s]->in_map = true;
	memcpy(rc->slots, rc->next_slots, KVQ_RCLUSTER_SLOTS * sizeof(*rc->slots));
	rc->have_map = true;
	rc->failed_rounds = 0;
	rc->down_status = -ENETDOWN;
	rc->st.refreshes++;
	for (pn = &rc->nodes; *pn;) {
		struct rc_node *n = *pn;

		if (!n->in_map) {
			*pn = n->next;
			rc->nnodes--;
			n->next = retired;
			retired = n;
			continue;
		}
		masters++;
		/* a new map is another try for a node that failed */
		n->down = false;
		if (n->auth_refused && n->ac)
			kill[nkill++] = node_detach(n);
		n->auth_refused = false;
		pn = &n->next;
	}
	rc->st.masters = masters;
	/* the next rounds ask the seeds and every node of this map, replicas too */
	rc->ncand = 0;
	for (unsigned i = 0; i < rc->nseeds; i++)
		cand_add(rc->cand, &rc->ncand, &rc->seeds[i]);
	for (size_t i = 0; i < r->elements; i++)
		for (size_t j = 2; j < r->element[i]->elements; j++)
			if (slots_addr(r->element[i]->element[j], asked, &a) == 0)
				cand_add(rc->cand, &rc->ncand, &a);
	rc->cand_next %= rc->ncand;
	nodes_close(retired, kill, nkill);
	for (struct rc_node *n = rc->nodes; n; n = n->next)
		if (n->in_map && !n->ac && !n->down)
			node_connect(n);
	backoff_check(rc);
	parked_go(rc);
	return 0;
}

static void map_clear(kvq_rcluster *rc)
{
	struct rc_node *retired = rc->nodes;

	rc->have_map = false;
	rc->st.masters = 0;
	memset(rc->slots, 0, KVQ_RCLUSTER_SLOTS * sizeof(*rc->slots));
	rc->nodes = NULL;
	rc->nnodes = 0;
	nodes_close(retired, NULL, 0);
}

/* No node gave a map: without one, requests end at once until one does. */
static void round_failed(kvq_rcluster *rc)
{
	rc->st.refresh_failures++;
	rc->failed_rounds++;
	rc->down_status = rc->round_status;
	for (struct rc_req *q = rc->reqs; q; q = q->next)
		if (q->parked)
			req_fail_soon(q, rc->down_status);
	if (rc->have_map)
		map_clear(rc);
	schedule_refresh(rc);
}

static void probe_end(struct rc_probe *p)
{
	p->rc->probe = NULL;
	event_free(p->timer);
	free(p);
}

static void on_slots(redisAsyncContext *ac, void *r, void *privdata)
{
	struct rc_probe *p = privdata;
	kvq_rcluster *rc = p->rc;
	redisReply *reply = r;
	struct rc_addr asked = p->addr;
	int status = p->timed_out ? -ETIMEDOUT : -ECONNRESET;

	probe_end(p);
	if (reply)
		redisAsyncFree(ac);   /* from its callback: freed when this returns */
	if (rc->closing)
		return;
	if (reply && reply_auth_refused(reply))
		rc->round_status = status = -EACCES;
	else if (reply)
		status = map_take(rc, reply, &asked);
	if (!status) {
		if (rc->refresh_again)
			schedule_refresh(rc);
		return;
	}
	probe_next(rc);
}

static void on_probe_timer(evutil_socket_t fd, short what, void *arg)
{
	struct rc_probe *p = arg;

	(void)fd;
	(void)what;
	p->timed_out = true;
	redisAsyncFree(p->ac);   /* on_slots comes with NULL, from here */
}

static int probe_start(kvq_rcluster *rc, const struct rc_addr *a)
{
	struct timeval tv = ms_tv(rc->o.connect_ms + rc->o.request_ms);
	struct rc_probe *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->timer = evtimer_new(rc->base, on_probe_timer, p);
	p->ac = p->timer ? conn_open(rc, a, NULL) : NULL;
	if (!p->ac) {
		if (p->timer)
			event_free(p->timer);
		free(p);
		return -ECONNRESET;
	}
	p->rc = rc;
	p->addr = *a;
	if (redisAsyncCommand(p->ac, on_slots, p, "CLUSTER SLOTS") != REDIS_OK) {
		redisAsyncFree(p->ac);
		event_free(p->timer);
		free(p);
		return -ECONNRESET;
	}
	rc->probe = p;
	evtimer_add(p->timer, &tv);
	return 0;
}

/* Asks the next candidate not asked in this round; none left: the round
 * failed. */
static void probe_next(kvq_rcluster *rc)
{
	while (rc->round_tried < rc->ncand) {
		const struct rc_addr *a = &rc->cand[rc->cand_next];

		rc->cand_next = (rc->cand_next + 1) % rc->ncand;
		rc->round_tried++;
		if (probe_start(rc, a) == 0)
			return;
	}
	round_failed(rc);
}

static void round_start(kvq_rcluster *rc)
{
	rc->round_tried = 0;
	rc->round_status = -ENETDOWN;
	rc->refresh_again = false;
	probe_next(rc);
}

static void on_refresh_timer(evutil_socket_t fd, short what, void *arg)
{
	kvq_rcluster *rc = arg;

	(void)fd;
	(void)what;
	if (!rc->probe)
		round_start(rc);
}

/* A round soon: after the backoff, which doubles with each until every
 * master answers again (node_ready). */
static void schedule_refresh(kvq_rcluster *rc)
{
	struct timeval tv;

	if (rc->closing)
		return;
	if (rc->probe) {
		rc->refresh_again = true;
		return;
	}
	if (evtimer_pending(rc->refresh_timer, NULL))
		return;
	tv = ms_tv(rc->refresh_ms);
	evtimer_add(rc->refresh_timer, &tv);
	rc->refresh_ms = rc->refresh_ms * 2 > RC_REFRESH_MAX_MS ? RC_REFRESH_MAX_MS : rc->refresh_ms * 2;
}

/* --- the client --- */

static int seeds_parse(kvq_rcluster *rc, const char *seeds, char *err, size_t errlen)
{
	const char *p = seeds;

	while (*p) {
		size_t len = strcspn(p, ",");
		const char *s = p;
		size_t l = len;

		while (l && (*s == ' ' || *s == '\t')) {
			s++;
			l--;
		}
		while (l && (s[l - 1] == ' ' || s[l - 1] == '\t'))
			l--;
		if (rc->nseeds >= RC_MAX_SEEDS || addr_parse(s, l, &rc->seeds[rc->nseeds]) < 0) {
			snprintf(err, errlen, "seed %.*s: not host:port (at most %d seeds)", (int)l, s, RC_MAX_SEEDS);
			return -EINVAL;
		}
		rc->nseeds++;
		p += len;
		if (*p == ',')
			p++;
	}
	if (!rc->nseeds) {
		snprintf(err, errlen, "no seed node");
		return -EINVAL;
	}
	return 0;
}

int kvq_rcluster_new(struct event_base *base, const struct kvq_rcluster_opts *o, kvq_rcluster **ret,
		     char *err, size_t errlen)
{
	kvq_rcluster *rc;
	int r = -ENOMEM;

	if (!base || !o || !o->seeds || !ret || (o->user && !o->password)) {
		snprintf(err, errlen, "seeds are needed, and a user only with a password");
		return -EINVAL;
	}
	if (o->connect_ms > RC_MAX_MS || o->request_ms > RC_MAX_MS) {
		snprintf(err, errlen, "connect_ms and request_ms are at most %d", RC_MAX_MS);
		return -EINVAL;
	}
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	rc->base = base;
	rc->o = *o;
	rc->o.connect_ms = o->connect_ms ? o->connect_ms : 1000;
	rc->o.request_ms = o->request_ms ? o->request_ms : 1000;
	rc->o.max_inflight = o->max_inflight ? o->max_inflight : 1024;
	rc->o.max_redirects = o->max_redirects ? o->max_redirects : 5;
	rc->o.max_request_bytes = o->max_request_bytes ? o->max_request_bytes : (size_t)64 << 20;
	rc->o.seeds = rc->o.user = rc->o.password = NULL;
	rc->refresh_ms = RC_REFRESH_MIN_MS;
	rc->down_status = -ENETDOWN;
	rc->seeds = calloc(RC_MAX_SEEDS, sizeof(*rc->seeds));
	rc->cand = calloc(RC_MAX_CANDIDATES, sizeof(*rc->cand));
	rc->slots = calloc(KVQ_RCLUSTER_SLOTS, sizeof(*rc->slots));
	rc->next_slots = calloc(KVQ_RCLUSTER_SLOTS, sizeof(*rc->next_slots));
	rc->refresh_timer = evtimer_new(base, on_refresh_timer, rc);
	if (o->user)
		rc->user = strdup(o->user);
	if (o->password)
		rc->password = strdup(o->password);
	if (!rc->seeds || !rc->cand || !rc->slots || !rc->next_slots || !rc->refresh_timer ||
	    (o->user && !rc->user) || (o->password && !rc->password))
		goto fail;
	r = seeds_parse(rc, o->seeds, err, errlen);
	if (r < 0)
		goto fail;
	for (unsigned i = 0; i < rc->nseeds; i++)
		cand_add(rc->cand, &rc->ncand, &rc->seeds[i]);
	round_start(rc);
	*ret = rc;
	return 0;
fail:
	kvq_rcluster_free(rc);
	return r;
}

void kvq_rcluster_free(kvq_rcluster *rc)
{
	if (!rc)
		return;
	rc->closing = true;
	if (rc->probe)
		redisAsyncFree(rc->probe->ac);   /* on_slots ends the probe */
	while (rc->nodes) {
		struct rc_node *n = rc->nodes;

		rc->nodes = n->next;
		node_free(n);   /* their requests end with -ECANCELED */
	}
	while (rc->reqs)
		req_end(rc->reqs, -ECANCELED, NULL);
	if (rc->refresh_timer)
		event_free(rc->refresh_timer);
	free(rc->seeds);
	free(rc->cand);
	free(rc->slots);
	free(rc->next_slots);
	free(rc->user);
	if (rc->password)
		explicit_bzero(rc->password, strlen(rc->password));
	free(rc->password);
	free(rc);
}

int kvq_rcluster_ready(const kvq_rcluster *rc)
{
	return rc && rc->have_map;
}

void kvq_rcluster_stats(const kvq_rcluster *rc, struct kvq_rcluster_stats *ret)
{
	*ret = rc->st;
	ret->inflight = rc->nreqs;
	ret->connections = 0;
	for (const struct rc_node *n = rc->nodes; n; n = n->next)
		ret->connections += n->ac != NULL;
}

char *kvq_rcluster_take_str(struct redisReply *reply)
{
	char *s;

	if (!reply || reply->type != REDIS_REPLY_STRING)
		return NULL;
#if HIREDIS_MAJOR == 0
	/* hiredis 0.14 allocates a reply's string with malloc and frees it with
	 * free, NULL included (freeReplyObject) */
	s = reply->str;
	reply->str = NULL;
#else
	/* later hiredis may use allocators of its own: a copy */
	s = malloc((size_t)reply->len + 1);
	if (s) {
		memcpy(s, reply->str, (size_t)reply->len);
		s[reply->len] = 0;
	}
#endif
	return s;
}

/* --- one-key commands --- */

static int key_command(kvq_rcluster *rc, const char *cmd, const void *key, size_t keylen, kvq_rcluster_cb *cb,
		       void *ctx)
{
	const char *argv[2] = { cmd, key };
	const size_t argvlen[2] = { strlen(cmd), keylen };

	return kvq_rcluster_command(rc, key, keylen, 2, argv, argvlen, cb, ctx);
}

int kvq_rcluster_get(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx)
{
	return key_command(rc, "GET", key, keylen, cb, ctx);
}

int kvq_rcluster_exists(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx)
{
	return key_command(rc, "EXISTS", key, keylen, cb, ctx);
}

int kvq_rcluster_del(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx)
{
	return key_command(rc, "DEL", key, keylen, cb, ctx);
}

int kvq_rcluster_set(kvq_rcluster *rc, const void *key, size_t keylen, const void *val, size_t vallen,
		     uint64_t ttl_ms, kvq_rcluster_cb *cb, void *ctx)
{
	char ttl[24];
	const char *argv[5] = { "SET", key, val, "PX", ttl };
	size_t argvlen[5] = { 3, keylen, vallen, 2, 0 };

	argvlen[4] = (size_t)snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)ttl_ms);
	return kvq_rcluster_command(rc, key, keylen, ttl_ms ? 5 : 3, argv, argvlen, cb, ctx);
}
