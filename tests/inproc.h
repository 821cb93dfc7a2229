/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd's request handlers in process, for unit tests: a daemon state from a
 * config string (host backend, a small budget, one configured pool "shared"
 * that admits anyone, created pools as root and kvqd's user), connections
 * with any uid and no socket, and requests built as envelopes and answered
 * through a request table (daemon/request.h).
 */
#ifndef KVQ_TEST_INPROC_H
#define KVQ_TEST_INPROC_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf_parse.h"
#include "log.h"
#include "request.h"

#define INPROC_POOL "shared"
#define INPROC_MODEL "test/model@1"
#define INPROC_L 2
#define INPROC_H 2
#define INPROC_D 32
#define INPROC_B 16

static const char inproc_conf[] =
	"[kvqd]\nbackend = host\nmemory_budget = 256M\ncreate_on_attach = yes\ncreate_capacity = 8M\n"
	"[pool " INPROC_POOL "]\nmodel = " INPROC_MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\n"
	"block_tokens = 16\npolicy = int8\ncapacity = 4M\n";

struct inproc {
	struct kvq_config *cfg;
	struct kvq_state st;
	const struct kvq_request *rows;   /* the table requests go through */
	size_t n_rows;
	uint64_t next_req;
	size_t last_row;                  /* the row that took the last request */
};

/* A uid that is neither root nor kvqd's: no admin, no pool creation. */
__attribute__((unused))
static uid_t inproc_other_uid(void)
{
	return geteuid() == 4242 ? 4243 : 4242;
}

/* The state from the config text conf, with the daemon's table unless rows
 * is given; 0 or a negative code (printed). */
__attribute__((unused))
static int inproc_start_conf(struct inproc *t, const char *conf, const struct kvq_request *rows, size_t n_rows)
{
	char err[512] = "";
	int r;

	memset(t, 0, sizeof(*t));
	t->rows = rows ? rows : kvq_requests;
	t->n_rows = rows ? n_rows : kvq_requests_n;
	kvq_log_set_level(getenv("KVQ_TEST_VERBOSE") ? LOG_DEBUG : LOG_WARNING);
	r = kvq_config_parse_string(conf, strlen(conf), "inproc.conf", &t->cfg, err, sizeof(err));
	if (r == 0)
		r = kvq_state_init(&t->st, t->cfg, "host", 0, NULL, err, sizeof(err));
	if (r < 0)
		printf("# in-process state: %s\n", err);
	return r;
}

/* inproc_start_conf with inproc_conf. */
__attribute__((unused))
static int inproc_start(struct inproc *t, const struct kvq_request *rows, size_t n_rows)
{
	return inproc_start_conf(t, inproc_conf, rows, n_rows);
}

/* A connection of uid (its only group: gid 0 for root, else 4242), as accept
 * would make it, without a socket. */
__attribute__((unused))
static struct kvq_conn *inproc_conn(struct inproc *t, uid_t uid)
{
	struct kvq_conn *c = NULL;

	if (kvq_state_conn_new(&t->st, &c) < 0)
		return NULL;
	c->uid = uid;
	c->groups[0] = uid ? 4242 : 0;
	c->n_groups = 1;
	c->pid = getpid();
	return c;
}

/* Closes every connection (leases given back) and frees the state. */
__attribute__((unused))
static void inproc_stop(struct inproc *t)
{
	while (t->st.conns)
		kvq_state_conn_free(t->st.conns);
	while (t->st.dying)
		kvq_state_conn_free(t->st.dying);
	kvq_state_fini(&t->st);
	kvq_config_free(t->cfg);
}

/* Sends e (its id set here) from c through the table: returns the reply's
 * status; *r holds the reply (kvq_reply_fini it). */
__attribute__((unused))
static int inproc_call(struct inproc *t, struct kvq_conn *c, Kvq__Envelope *e, struct kvq_reply *r)
{
	e->id = ++t->next_req;
	t->last_row = kvq_dispatch(t->rows, t->n_rows, c, e, -1, r);
	return r->e.status;
}

/* inproc_call when the reply itself is not wanted. */
__attribute__((unused))
static int inproc_status(struct inproc *t, struct kvq_conn *c, Kvq__Envelope *e)
{
	struct kvq_reply r;
	int st = inproc_call(t, c, e, &r);

	kvq_reply_fini(&r);
	return st;
}

/* A Hello of protocol version into e, h. */
__attribute__((unused))
static void inproc_hello_req(Kvq__Envelope *e, Kvq__Hello *h, uint32_t version)
{
	kvq__envelope__init(e);
	kvq__hello__init(h);
	h->protocol_version = version;
	h->client_name = "inproc";
	e->body_case = KVQ__ENVELOPE__BODY_HELLO;
	e->hello = h;
}

__attribute__((unused))
static int inproc_hello(struct inproc *t, struct kvq_conn *c)
{
	Kvq__Envelope e;
	Kvq__Hello h;

	inproc_hello_req(&e, &h, KVQ_PROTOCOL_VERSION);
	return inproc_status(t, c, &e);
}

/* The Attach (and PoolAdd spec) of the test geometry for pool, with pc as
 * its create (NULL: none). */
__attribute__((unused))
static Kvq__Attach inproc_spec(const char *pool, Kvq__PoolCreate *pc)
{
	Kvq__Attach a = { PROTOBUF_C_MESSAGE_INIT(&kvq__attach__descriptor),
			  .pool = (char *)pool, .model_id = INPROC_MODEL, .policy = "int8",
			  .layers = INPROC_L, .kv_heads = INPROC_H, .head_dim = INPROC_D, .block_tokens = INPROC_B,
			  .act = KVQ__DTYPE__DTYPE_F16, .layout_version = KVQ_LAYOUT_VERSION, .create = pc,
			  .group = "" /* as the wire gives it */ };

	return a;
}

/* An Attach to pool (the test geometry, policy int8) into e, a, pc; with
 * create, creating it with 16 sealed + 4 open slots. */
__attribute__((unused))
static void inproc_attach_req(Kvq__Envelope *e, Kvq__Attach *a, Kvq__PoolCreate *pc, const char *pool, bool create)
{
	kvq__pool_create__init(pc);
	pc->n_sealed = 16;
	pc->n_open = 4;
	pc->backend = "";
	pc->device = -1;
	*a = inproc_spec(pool, create ? pc : NULL);
	kvq__envelope__init(e);
	e->body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e->attach = a;
}

__attribute__((unused))
static int inproc_attach(struct inproc *t, struct kvq_conn *c, const char *pool, bool create)
{
	Kvq__PoolCreate pc;
	Kvq__Attach a;
	Kvq__Envelope e;

	inproc_attach_req(&e, &a, &pc, pool, create);
	return inproc_status(t, c, &e);
}

/* A Publish of ids[n] as a chain of blocks 0, 1, ... of tokens (INPROC_B
 * each; salted when salt is not NULL) into e, q, b[n] and pb[n]. */
__attribute__((unused))
static void inproc_publish_req(Kvq__Envelope *e, Kvq__Publish *q, Kvq__PublishBlock *b, Kvq__PublishBlock **pb,
			       const uint32_t *ids, size_t n, uint32_t *tokens, const char *salt)
{
	kvq__envelope__init(e);
	kvq__publish__init(q);
	for (size_t i = 0; i < n; i++) {
		kvq__publish_block__init(&b[i]);
		b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
		b[i].sealed_id = ids[i];
		b[i].n_tokens = INPROC_B;
		b[i].tokens = tokens + i * INPROC_B;
		if (salt) {
			b[i].salt.data = (uint8_t *)salt;
			b[i].salt.len = strlen(salt);
		}
		if (i) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			b[i].parent_id = ids[i - 1];
		}
		pb[i] = &b[i];
	}
	q->n_blocks = n;
	q->blocks = pb;
	e->body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e->publish = q;
}

/* A Stats request (of every pool the caller sees). */
__attribute__((unused))
static void inproc_stats_req(Kvq__Envelope *e, Kvq__Stats *s)
{
	kvq__envelope__init(e);
	kvq__stats__init(s);
	e->body_case = KVQ__ENVELOPE__BODY_STATS;
	e->stats = s;
}

#endif
