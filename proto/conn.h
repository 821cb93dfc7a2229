/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A blocking client connection to kvqd, for the programs that speak the
 * protocol as clients (libkvq, kvqctl, kvq-bench control, whose pipelined
 * requests are read back with kvq_conn_reply): connect to the socket
 * (kvq_default_socket when none is given), Hello, then requests each read
 * back with its reply, checked against the request (id, kvq_frame_check,
 * body type).  Internal: not installed, not in libkvq's API.
 *
 * Each step is bounded by the connection's timeout_ms: connect (the socket
 * is nonblocking: a daemon whose backlog is full gives -ETIMEDOUT, not a
 * hang), and each request, its send and its reply together.  A frame of id
 * 0 with a negative status where a reply was due is kvqd saying why it ends
 * the connection (a limit, a timeout: kvq.proto, "Refusals"): its status
 * and message are the call's (KVQ_CONN_STATUS), and the connection is
 * broken.
 *
 * Functions return 0 or a negative errno-style code (kvq_wire.h).  Nothing
 * here prints: a failure leaves its kind in c->fault and a one-line reason
 * in c->msg, which callers report in their own words.
 */
#ifndef KVQ_CONN_H
#define KVQ_CONN_H

#include <stdbool.h>
#include <stdint.h>

#include "frame.h"
#include "kvq_wire.h"

/* What the last failure on a connection was. */
enum kvq_conn_fault {
	KVQ_CONN_OK,
	KVQ_CONN_PATH,          /* no socket path (-ENOENT from kvq_default_socket) or one too long */
	KVQ_CONN_SOCKET,        /* socket() failed */
	KVQ_CONN_CONNECT,       /* connect() failed: -ENOENT or -ECONNREFUSED (nobody listens), -EACCES, ... */
	KVQ_CONN_TRANSPORT,     /* sending or reading failed, or the connection broke earlier */
	KVQ_CONN_PROTOCOL,      /* a reply that does not match its request: KVQ_EPROTOCOL */
	KVQ_CONN_STATUS,        /* the daemon refused: its status, its message (or the code's name) in msg */
};

/*
 * Fields are the caller's to read; pool_fd is the caller's to take (set it
 * to -1 then).  broken: a transport fault or a reply out of step, after
 * which every call fails with -ENOTCONN; a caller that finds a reply it
 * cannot account for sets it too.
 */
struct kvq_conn {
	int fd;                         /* the socket, -1 before open */
	int pool_fd;                    /* the first descriptor a reply carried, or -1 */
	bool broken;
	int timeout_ms;                 /* for connect, and each request and its reply (-1: none) */
	enum kvq_conn_fault fault;
	uint64_t next_id;               /* the id of the last request sent */
	uint64_t client_id;             /* the HelloReply's */
	struct kvq_frame_decoder dec;
	char path[108];                 /* the socket's path (the size of sun_path) */
	char msg[KVQ_PROTO_MAX_MESSAGE + 1];
};

/* An unopened connection whose requests wait timeout_ms for their replies. */
void kvq_conn_init(struct kvq_conn *c, int timeout_ms);

/* Connects to path (NULL: kvq_default_socket) and says Hello as name
 * (printable ASCII without blanks, at most KVQ_PROTO_MAX_NAME bytes).
 * Returns 0 with c->client_id, or -ENOENT / -ENAMETOOLONG (KVQ_CONN_PATH),
 * socket()'s error, connect()'s error (-ETIMEDOUT: not taken within
 * timeout_ms), or kvq_conn_call's (-EPROTONOSUPPORT: the daemon speaks
 * another protocol version; -EUSERS, -EMFILE: refused at a limit, the
 * message says which). */
int kvq_conn_open(struct kvq_conn *c, const char *path, const char *name);

/* Sends req (its id is set here) and reads its reply, which must have body
 * type want: returns 0 and *ret (kvq_frame_envelope_free; NULL: freed
 * here), the daemon's negative status, KVQ_EPROTOCOL, -ENOTCONN (broken
 * earlier), -ETIMEDOUT (no reply within timeout_ms of the call) or a
 * transport error (the connection is broken then). */
int kvq_conn_call(struct kvq_conn *c, Kvq__Envelope *req, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret);

/* kvq_conn_call with fd (not taken; -1: none) sent with the request's first
 * byte (kvq.proto, "File descriptors": the codebooks of an Attach or a
 * PoolAdd).  Send it when no reply is outstanding, as kvq_conn_call is. */
int kvq_conn_call_fd(struct kvq_conn *c, Kvq__Envelope *req, int fd, Kvq__Envelope__BodyCase want,
		     Kvq__Envelope **ret);

/* The reply to request id, for a caller that sent its requests itself
 * (kvq_frame_send_envelope, or frames of several requests at once):
 * kvq_conn_call without the send. */
int kvq_conn_reply(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret);

/* kvq_conn_reply for a request whose refusal may carry its reply's body
 * (kvq.proto, "Requests and replies": an Alloc's shortfall): returns as
 * kvq_conn_reply, and sets *ret (kvq_frame_envelope_free) to the reply on
 * success and to a refusal's envelope when it carries a body of type want
 * (its status is the return), to NULL otherwise. */
int kvq_conn_reply_refusal(struct kvq_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, Kvq__Envelope **ret);

/* Closes the socket and pool_fd; c can be opened again.  A connection only
 * initialised is fine. */
void kvq_conn_close(struct kvq_conn *c);

#endif
