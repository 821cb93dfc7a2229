/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The requests of proto/kvq.proto as kvqd answers them: one table with a
 * row per request (its name for logs and the metrics, the body it comes in
 * and its reply's, its handler, its preconditions), and the step that takes
 * one request through it (daemon/dispatch.c): the protocol's checks
 * (kvq_frame_check), the row, its preconditions, the handler, the reply.
 *
 * KVQ_REQUESTS is the list; the table (kvq_requests[]) and the handlers'
 * declarations are made from it, so a request is one line there and its
 * kvq_req_NAME handler (daemon/req_*.c).  A handler validates everything
 * before it changes anything: on error nothing has changed.
 */
#ifndef KVQD_REQUEST_H
#define KVQD_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "state.h"

/* Preconditions of a row, checked in this order before its handler runs;
 * every row but a KVQ_REQ_FIRST one needs the Hello done. */
enum {
	KVQ_REQ_FIRST = 1u << 0,      /* only before the Hello is done (the Hello itself) */
	KVQ_REQ_ATTACHED = 1u << 1,   /* after an Attach */
	KVQ_REQ_ADMIN = 1u << 2,      /* root or kvqd.conf's admin ACL */
};

struct kvq_reply;

/* A reply that waits (a Lookup's promotions, daemon/req_lookup.c): the
 * handler returns 0 with r->wait set; the server keeps the reply, reads no
 * more requests of the connection until it is sent (replies stay in
 * order), and calls finish once the handler's work says it may go on
 * (kvq_conn.resume), once the bound (kvqd.conf host_tier_wait_ms) passed
 * (timed_out), or when the connection closed (c NULL: no reply, and
 * everything the wait held let go).  finish fills r as a handler does
 * (0, or a code with err set) and frees the wait.  A wait that is ready
 * when its handler returns (a synchronous copier) is finished by the
 * dispatcher at once. */
struct kvq_wait {
	bool ready;                             /* the work is done: finish at once */
	int (*finish)(struct kvq_wait *w, struct kvq_conn *c, struct kvq_reply *r, bool timed_out, char *err,
		      size_t errlen);
};

/* A reply being made.  The dispatcher sets the body its row names
 * (r->e.NAME_reply, initialised) and req_fd; handlers fill the body, may
 * set fd, close_after and refusal_body, and leave what they allocate for
 * the reply in mem. */
struct kvq_reply {
	Kvq__Envelope e;
	int req_fd;                             /* came with the request (kvq.proto, "File descriptors"),
						   or -1: the caller's, closed after the request */
	char message[KVQ_PROTO_MAX_MESSAGE];    /* e.message on an error */
	int fd;                                 /* sent with the reply (SCM_RIGHTS), or -1 */
	bool close_after;                       /* close the connection once it is sent */
	bool refusal_body;                      /* the body says why the handler refused (a HelloReply
						   on a version mismatch, an Alloc's shortfall): kept */
	struct kvq_wait *wait;                  /* set: the reply waits (struct kvq_wait) */
	void *mem[4];                           /* freed with the reply */
	void *body;                             /* the reply body */
	Kvq__Envelope *req;                     /* an unpacked request, freed with the reply */
};

/* A handler: 0, or a negative code with a message in err (err empty: the
 * code's own text) and nothing changed. */
typedef int kvq_req_fn(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err,
		       size_t errlen);

struct kvq_request {
	const char *name;                       /* logs, the metrics' label */
	Kvq__Envelope__BodyCase body;           /* the request's body */
	Kvq__Envelope__BodyCase reply;          /* its reply's body */
	kvq_req_fn *handler;                    /* NULL: -EOPNOTSUPP */
	unsigned flags;                         /* KVQ_REQ_* */
	const char *what;                       /* KVQ_REQ_ADMIN: the request in the refusal */
};

/*
 * The requests, one X(name, BODY, flags, what) each, in the metrics' order:
 * name is the Envelope's field and the label, the handler is kvq_req_<name>,
 * the bodies are KVQ__ENVELOPE__BODY_<BODY> and its _REPLY.
 */
#define KVQ_REQUESTS(X) \
	X(hello,     HELLO,     KVQ_REQ_FIRST,    NULL)              \
	X(attach,    ATTACH,    0,                NULL)              \
	X(alloc,     ALLOC,     KVQ_REQ_ATTACHED, NULL)              \
	X(seal,      SEAL,      KVQ_REQ_ATTACHED, NULL)              \
	X(publish,   PUBLISH,   KVQ_REQ_ATTACHED, NULL)              \
	X(lookup,    LOOKUP,    KVQ_REQ_ATTACHED, NULL)              \
	X(release,   RELEASE,   KVQ_REQ_ATTACHED, NULL)              \
	X(fork,      FORK,      KVQ_REQ_ATTACHED, NULL)              \
	X(stats,     STATS,     0,                NULL)              \
	X(evict,     EVICT,     KVQ_REQ_ADMIN,    "evict")           \
	X(pool_add,  POOL_ADD,  KVQ_REQ_ADMIN,    "adding a pool")   \
	X(pool_drop, POOL_DROP, KVQ_REQ_ADMIN,    "dropping a pool")

/* One X of KVQ_REQUESTS as a table row. */
#define KVQ_REQUEST_ROW(name, BODY, flags, what) \
	{ #name, KVQ__ENVELOPE__BODY_##BODY, KVQ__ENVELOPE__BODY_##BODY##_REPLY, kvq_req_##name, flags, what },

/* A table's last row: every body no other row names (kvq_frame_check has
 * refused those already), counted as "other". */
#define KVQ_REQUEST_OTHER \
	{ "other", KVQ__ENVELOPE__BODY__NOT_SET, KVQ__ENVELOPE__BODY__NOT_SET, NULL, KVQ_REQ_ATTACHED, NULL }

#define KVQ_REQUEST_DECLARE(name, BODY, flags, what) kvq_req_fn kvq_req_##name;
KVQ_REQUESTS(KVQ_REQUEST_DECLARE)
#undef KVQ_REQUEST_DECLARE

/* The daemon's table: KVQ_REQUESTS, then KVQ_REQUEST_OTHER. */
extern const struct kvq_request kvq_requests[];
extern const size_t kvq_requests_n;

/*
 * Answers req from c with the table rows[n] (a table ends with
 * KVQ_REQUEST_OTHER; the first row naming req's body takes it), req_fd
 * being the descriptor that came with it (-1: none; not taken: only Attach
 * and PoolAdd look at it, every other request ignores it): fills *r
 * (kvq_reply_fini() after sending) and returns the index of the row that
 * took it, the one whose latency it counts as.
 */
size_t kvq_dispatch(const struct kvq_request *rows, size_t n, struct kvq_conn *c, const Kvq__Envelope *req,
		    int req_fd, struct kvq_reply *r);

/* kvq_dispatch() of one frame's payload.  Returns 0 and *ret_row, or
 * -EBADMSG for an envelope that does not parse (r holds its error reply,
 * which no row counts). */
int kvq_dispatch_frame(const struct kvq_request *rows, size_t n, struct kvq_conn *c, const uint8_t *payload,
		       size_t len, int req_fd, struct kvq_reply *r, size_t *ret_row);

/* Finishes r, a reply that waits (struct kvq_wait), of c (NULL: the
 * connection is gone, nothing is sent): r is then made as kvq_dispatch
 * makes one, an error reply included. */
void kvq_dispatch_finish(struct kvq_conn *c, struct kvq_reply *r, bool timed_out);

/* Frees what r holds (not r). */
void kvq_reply_fini(struct kvq_reply *r);

#endif
