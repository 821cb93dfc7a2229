/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon/request.h: a request row that only this test has, on the Stats
 * body, admin only and after an Attach, goes into a table made with the
 * daemon's rows (KVQ_REQUESTS) and needs no other edit: its handler runs only
 * once its preconditions hold, its reply body is ready, the daemon's rows
 * still answer, and what no row names counts as the last row ("other").
 */
#include <errno.h>
#include <string.h>

#include "../tap.h"
#include "../inproc.h"

static int probes;
static const struct kvq_conn *probed_by;

static int probe(struct kvq_conn *c, const Kvq__Envelope *req, struct kvq_reply *r, char *err, size_t errlen)
{
	probes++;
	probed_by = c;
	r->e.stats_reply->daemon_version = "probe";
	r->e.stats_reply->uptime_ms = req->id;
	return 0;
}

/* The extra row first: the first row naming a body takes it. */
static const struct kvq_request table[] = {
	{ "probe", KVQ__ENVELOPE__BODY_STATS, KVQ__ENVELOPE__BODY_STATS_REPLY, probe,
	  KVQ_REQ_ATTACHED | KVQ_REQ_ADMIN, "probing" },
	KVQ_REQUESTS(KVQ_REQUEST_ROW)
	KVQ_REQUEST_OTHER
};
#define N_ROWS (sizeof(table) / sizeof(table[0]))

static int refused(struct inproc *t, struct kvq_conn *c, int status, const char *message, const char *what)
{
	Kvq__Envelope e;
	Kvq__Stats s;
	struct kvq_reply r;
	int before = probes, st, good;

	inproc_stats_req(&e, &s);
	st = inproc_call(t, c, &e, &r);
	good = st == status && probes == before && r.e.body_case == KVQ__ENVELOPE__BODY__NOT_SET &&
	       strstr(r.e.message, message) && t->last_row == 0;
	ok(good, "%s: %d '%s', the handler did not run", what, st, r.e.message);
	kvq_reply_fini(&r);
	return good;
}

int main(void)
{
	struct inproc t;
	struct kvq_conn *admin, *other;
	struct kvq_reply r;
	Kvq__Envelope e;
	Kvq__Stats s;
	uint8_t junk[3] = { 0xff, 0xff, 0xff };
	size_t row = 99;
	int st;

	if (!ok(inproc_start(&t, table, N_ROWS) == 0, "a daemon state in process, the table with a probe row"))
		return done_testing();
	admin = inproc_conn(&t, 0);
	other = inproc_conn(&t, inproc_other_uid());
	ok(admin && other, "two connections without sockets: root and uid %u", (unsigned)inproc_other_uid());

	refused(&t, admin, -EPROTO, "Hello first", "before Hello");
	ok(inproc_hello(&t, admin) == 0 && inproc_hello(&t, other) == 0 && t.last_row == 1,
	   "Hello through the daemon's own row");
	refused(&t, admin, -EPROTO, "Attach first", "before Attach");
	ok(inproc_attach(&t, admin, INPROC_POOL, false) == 0 && inproc_attach(&t, other, INPROC_POOL, false) == 0,
	   "both attach to the configured pool");
	refused(&t, other, -EPERM, "probing needs root or admin rights", "a uid without admin rights");

	inproc_stats_req(&e, &s);
	st = inproc_call(&t, admin, &e, &r);
	ok(st == 0 && probes == 1 && probed_by == admin && t.last_row == 0, "root, attached: the handler ran (%d)",
	   st);
	ok(r.e.body_case == KVQ__ENVELOPE__BODY_STATS_REPLY && r.e.stats_reply &&
	   !strcmp(r.e.stats_reply->daemon_version, "probe") && r.e.stats_reply->uptime_ms == e.id,
	   "its reply body, made ready by the table, carries what it wrote");
	kvq_reply_fini(&r);
	ok(!strcmp(table[t.last_row].name, "probe"), "the request counts under the row's name");

	/* the daemon's rows behind it are untouched */
	{
		Kvq__Envelope a = KVQ__ENVELOPE__INIT;
		Kvq__Alloc al = KVQ__ALLOC__INIT;

		al.n_sealed = 1;
		a.body_case = KVQ__ENVELOPE__BODY_ALLOC;
		a.alloc = &al;
		st = inproc_call(&t, other, &a, &r);
		ok(st == 0 && r.e.alloc_reply && r.e.alloc_reply->n_sealed_ids == 1 &&
		   !strcmp(table[t.last_row].name, "alloc"), "Alloc still goes to the daemon's handler (%d)", st);
		kvq_reply_fini(&r);
	}

	/* a body no row names: the protocol's check refuses it, as "other" */
	{
		Kvq__Envelope a = KVQ__ENVELOPE__INIT;
		Kvq__SealReply sr = KVQ__SEAL_REPLY__INIT;

		a.body_case = KVQ__ENVELOPE__BODY_SEAL_REPLY;
		a.seal_reply = &sr;
		st = inproc_call(&t, admin, &a, &r);
		ok(st == -EOPNOTSUPP && t.last_row == N_ROWS - 1 && !strcmp(table[t.last_row].name, "other"),
		   "a reply sent as a request: %d, counted as other", st);
		kvq_reply_fini(&r);
	}
	ok(kvq_dispatch_frame(table, N_ROWS, admin, junk, sizeof(junk), -1, &r, &row) == -EBADMSG &&
	   r.e.status == -EBADMSG && r.e.id == 0 && !strcmp(r.e.message, "the envelope does not parse") && row == 99,
	   "a frame that does not parse: -EBADMSG for id 0, no row");
	kvq_reply_fini(&r);

	/* the daemon's own table has the rows in the metrics' order, "other" last */
	ok(kvq_requests_n == 13 && !strcmp(kvq_requests[0].name, "hello") &&
	   !strcmp(kvq_requests[kvq_requests_n - 1].name, "other") && !kvq_requests[kvq_requests_n - 1].handler,
	   "the daemon's table: %zu rows, hello first, other last", kvq_requests_n);
	inproc_stop(&t);
	return done_testing();
}
