/* SPDX-License-Identifier: Apache-2.0 */
/* One request through the table (request.h): checks, row, preconditions,
 * handler, and the error reply when any of them says no. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame_check.h"
#include "log.h"
#include "request.h"
#include "seterr.h"

const struct kvq_request kvq_requests[] = { KVQ_REQUESTS(KVQ_REQUEST_ROW) KVQ_REQUEST_OTHER };
const size_t kvq_requests_n = sizeof(kvq_requests) / sizeof(kvq_requests[0]);

static void reply_init(struct kvq_reply *r, int req_fd)
{
	memset(r, 0, sizeof(*r));
	kvq__envelope__init(&r->e);
	r->fd = -1;
	r->req_fd = req_fd;
}

void kvq_reply_fini(struct kvq_reply *r)
{
	for (size_t i = 0; i < sizeof(r->mem) / sizeof(r->mem[0]); i++)
		free(r->mem[i]);
	free(r->body);
	kvq_frame_envelope_free(r->req);
}

static const struct kvq_request *row_of(const struct kvq_request *rows, size_t n, Kvq__Envelope__BodyCase body)
{
	for (size_t i = 0; i + 1 < n; i++)
		if (rows[i].body == body)
			return &rows[i];
	return &rows[n - 1];
}

static int preconditions(const struct kvq_request *row, const struct kvq_conn *c, const Kvq__Envelope *req,
			 char *err, size_t errlen)
{
	if (!(row->flags & KVQ_REQ_FIRST) && !c->hello)
		return kvq_seterr(err, errlen, "Hello first"), -EPROTO;
	if ((row->flags & KVQ_REQ_FIRST) && c->hello)
		return kvq_seterr(err, errlen, "Hello once"), -EPROTO;
	if ((row->flags & KVQ_REQ_ATTACHED) && !c->pool)
		return kvq_seterr(err, errlen, "Attach first"), -EPROTO;
	if ((row->flags & KVQ_REQ_ADMIN) && !kvq_conn_is_admin(c))
		return kvq_seterr(err, errlen,
				  "%s needs root or admin rights (kvqd.conf admin_uids, admin_gids); uid %u has none",
				  row->what, (unsigned)c->uid), -EPERM;
	if (!row->handler)
		return kvq_seterr(err, errlen, "request type %d", (int)req->body_case), -EOPNOTSUPP;
	return 0;
}

/* The row's reply body, empty, where the envelope's field points. */
static int reply_body(struct kvq_reply *r, Kvq__Envelope__BodyCase reply)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(&kvq__envelope__descriptor, (unsigned)reply);
	const ProtobufCMessageDescriptor *d;

	if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE)
		return -EINVAL;
	d = f->descriptor;
	r->body = calloc(1, d->sizeof_message);
	if (!r->body)
		return -ENOMEM;
	protobuf_c_message_init(d, r->body);
	memcpy((char *)&r->e + f->offset, &r->body, sizeof(r->body));
	r->e.body_case = reply;
	return 0;
}

static void reply_error(struct kvq_conn *c, struct kvq_reply *r, int status)
{
	if (!r->message[0])
		snprintf(r->message, sizeof(r->message), "%s", status <= -1000 ? "layout" : strerror(-status));
	r->e.status = status;
	r->e.message = r->message;
	kvq_log(LOG_DEBUG, "client %llu: request %llu: %d %s", (unsigned long long)c->id,
		(unsigned long long)r->e.id, status, r->message);
}

size_t kvq_dispatch(const struct kvq_request *rows, size_t n, struct kvq_conn *c, const Kvq__Envelope *req,
		    int req_fd, struct kvq_reply *r)
{
	const struct kvq_request *row = row_of(rows, n, req->body_case);
	char *err = r->message;
	size_t errlen = sizeof(r->message);
	int ret;

	reply_init(r, req_fd);
	r->e.id = req->id;
	ret = kvq_frame_check(req, 1, err, errlen);
	if (ret == 0)
		ret = preconditions(row, c, req, err, errlen);
	if (ret == 0)
		ret = reply_body(r, row->reply);
	if (ret == 0)
		ret = row->handler(c, req, r, err, errlen);
	if (ret == 0 && r->wait && r->wait->ready) {
		struct kvq_wait *w = r->wait;

		r->wait = NULL;
		ret = w->finish(w, c, r, false, err, errlen);
	}
	if (ret < 0) {
		/* a refusal has no body but one that describes it (kvq.proto,
		 * "Requests and replies") */
		if (!r->refusal_body)
			r->e.body_case = KVQ__ENVELOPE__BODY__NOT_SET;
		r->fd = -1;
		reply_error(c, r, ret);
	}
	return (size_t)(row - rows);
}

void kvq_dispatch_finish(struct kvq_conn *c, struct kvq_reply *r, bool timed_out)
{
	struct kvq_wait *w = r->wait;
	int ret;

	r->wait = NULL;
	ret = w->finish(w, c, r, timed_out, r->message, sizeof(r->message));
	if (ret < 0 && c) {
		if (!r->refusal_body)
			r->e.body_case = KVQ__ENVELOPE__BODY__NOT_SET;
		r->fd = -1;
		reply_error(c, r, ret);
	}
}

int kvq_dispatch_frame(const struct kvq_request *rows, size_t n, struct kvq_conn *c, const uint8_t *payload,
		       size_t len, int req_fd, struct kvq_reply *r, size_t *ret_row)
{
	Kvq__Envelope *req = NULL;

	if (kvq_frame_unpack(payload, len, &req) < 0) {
		reply_init(r, -1);
		snprintf(r->message, sizeof(r->message), "the envelope does not parse");
		reply_error(c, r, -EBADMSG);
		return -EBADMSG;
	}
	*ret_row = kvq_dispatch(rows, n, c, req, req_fd, r);
	r->req = req;
	return 0;
}
