/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's batched requests (client_lookup_many, client_alloc_many,
 * client_commit; libkvq_internal.h): the requests of a call framed into one
 * buffer and written together, their replies read after, split where the
 * protocol's limits say; the single block requests (client.c) go through
 * them.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockid.h"
#include "frame_io.h"
#include "libkvq_internal.h"
#include "wire_block.h"

/*
 * Requests framed into one buffer and written together (one write, as few
 * sendmsg calls as the socket allows), then their replies read in order:
 * kvq.proto lets a client pipeline, and a batch's requests cost one round
 * trip.
 */
struct client_pipe {
	uint8_t *buf;
	size_t len, cap;
	uint64_t first;                 /* the id of the first request queued */
	uint32_t n;                     /* requests queued (or sent, until the next is queued) */
	bool waited;                    /* a reply of the requests sent was read */
};

/* Appends e as a frame, with the connection's next id: 0, or -EMSGSIZE
 * (e over KVQ_FRAME_MAX), -ENOMEM. */
static int pipe_queue(kvq_client *c, struct client_pipe *p, Kvq__Envelope *e)
{
	int n;

	if (p->len == 0)
		p->n = 0;
	e->id = c->conn.next_id + 1;
	n = kvq_frame_size(e);
	if (n < 0)
		return client_fail(c, n, "a request kvqd would not take: %s", kvq_strerror(n));
	if (p->len + (size_t)n > p->cap) {
		size_t cap = 2 * (p->len + (size_t)n);
		uint8_t *b = realloc(p->buf, cap);

		if (!b)
			return -ENOMEM;
		p->buf = b;
		p->cap = cap;
	}
	n = kvq_frame_encode(e, p->buf + p->len, p->cap - p->len);
	if (n < 0)
		return client_fail(c, n, "a request kvqd would not take: %s", kvq_strerror(n));
	c->conn.next_id = e->id;
	if (p->n++ == 0)
		p->first = e->id;
	p->len += (size_t)n;
	return 0;
}

/* Writes what was queued: 0, or a transport error (the connection is
 * broken: what was sent may have been taken). */
static int pipe_send(kvq_client *c, struct client_pipe *p, struct client_count *cnt)
{
	int r;

	if (c->conn.broken)
		return client_fail(c, -ENOTCONN, "connection to kvqd lost earlier");
	r = kvq_frame_send_frames(c->conn.fd, p->buf, p->len, -1, c->conn.timeout_ms);
	p->len = 0;
	p->waited = false;
	if (r < 0) {
		c->conn.broken = true;
		return client_fail(c, r, "sending to kvqd: %s", kvq_strerror(r));
	}
	if (cnt)
		cnt->requests += p->n;
	return 0;
}

/* The reply to the i-th request sent (kvq_conn_reply_refusal: a refusal's
 * body comes back too, *ret NULL when none); the first read of a write is
 * its round trip. */
static int pipe_reply(kvq_client *c, struct client_pipe *p, uint32_t i, Kvq__Envelope__BodyCase want,
		      struct client_count *cnt, Kvq__Envelope **ret)
{
	if (cnt && !p->waited)
		cnt->waits++;
	p->waited = true;
	return kvq_conn_reply_refusal(&c->conn, p->first + i, want, ret);
}

/* The first failure of a batch, r, with its reason kept in msg (later
 * replies overwrite the connection's); 0 leaves *first as it is. */
static void keep_first(kvq_client *c, int r, int *first, char *msg, size_t len)
{
	if (r < 0 && *first == 0) {
		*first = r;
		snprintf(msg, len, "%s", c->conn.msg);
	}
}

int client_release_many(kvq_client *c, const uint32_t *sealed, uint32_t ns, const uint32_t *open, uint32_t no)
{
	const uint32_t half = KVQ_PROTO_MAX_IDS / 2;

	for (uint32_t i = 0; i < ns || i < no; i += half) {
		uint32_t a = ns > i ? ns - i : 0, b = no > i ? no - i : 0;
		int r = kvq_client_release(c, a < half ? a : half, a ? sealed + i : NULL, b < half ? b : half,
					   b ? open + i : NULL);

		if (r < 0)
			return r;
	}
	return 0;
}

/* Gives back references and slots taken in a batch that failed: a Release
 * per piece (each within the protocol's limits); failures are the
 * connection's (a broken one drops everything). */
static void give_back(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		      const uint32_t *open_ids, struct client_count *cnt)
{
	if ((!n_sealed && !n_open) || c->conn.broken)
		return;
	if (client_release_many(c, sealed_ids, n_sealed, open_ids, n_open) < 0)
		c->conn.broken = true;   /* holds we could not give back: closing drops them */
	if (cnt) {
		cnt->requests++;
		cnt->waits++;
	}
}

enum { PART_OPEN, PART_SEALED, PART_SINK };

/* Slots of one Alloc request and what came of it; the daemon's three
 * checks (kvq.proto, AllocReply) need open, open + sealed and sink slots. */
struct alloc_part {
	uint32_t n[3];                  /* open, sealed, sink (PART_*) */
	bool granted;
	uint32_t short_[3];             /* the refusal's shortfall per check */
	bool nospc;
};

static uint64_t part_need(const struct alloc_part *a, int k)
{
	return k == PART_OPEN ? a->n[PART_OPEN] :
	       k == PART_SEALED ? (uint64_t)a->n[PART_OPEN] + a->n[PART_SEALED] : a->n[PART_SINK];
}

/*
 * The shortfall of an allocation split over parts a[n], as one request of
 * all of them would have had it: for each check, from the first refusal
 * short in it, what that one was short plus what the others asked for that
 * was not granted before it (kvqd counted those as taken).  0 for a check
 * no refusal was short in.
 */
static uint32_t alloc_shortfall(const struct alloc_part *a, uint32_t n)
{
	uint64_t total = 0;

	for (int k = 0; k < 3; k++)
		for (uint32_t g = 0; g < n; g++) {
			uint64_t s = a[g].short_[k];

			if (!a[g].nospc || !s)
				continue;
			for (uint32_t i = 0; i < n; i++)
				if (i != g && !(i < g && a[i].granted))
					s += part_need(&a[i], k);
			total += s;
			break;
		}
	return total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
}

/* Part i's reply: its ids into the caller's arrays at the parts' offsets
 * at[]; KVQ_EPROTOCOL (the connection broken) when it does not match. */
static int alloc_take(kvq_client *c, const Kvq__AllocReply *ar, const struct alloc_part *a, uint32_t at[3],
		      uint32_t *ret_open, uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink,
		      struct kvq_block_ref *refs)
{
	uint32_t *out[KVQ_BLOCK_NCLASS] = { [KVQ_BLOCK_SEALED] = ret_sealed + at[PART_SEALED],
					    [KVQ_BLOCK_SINK] = ret_sink + at[PART_SINK] };
	const size_t nb = (size_t)a->n[PART_SEALED] + a->n[PART_SINK];
	size_t n, k[KVQ_BLOCK_NCLASS] = { 0 };
	int r = kvq_wire_blocks_get(&ar->base, KVQ_WIRE_IDS, refs, nb, &n);

	for (size_t i = 0; r == 0 && i < n; i++)
		k[refs[i].cls]++;
	if (r < 0 || ar->n_open_ids != a->n[PART_OPEN] || ar->n_reserved_ids != a->n[PART_OPEN] ||
	    k[KVQ_BLOCK_SEALED] != a->n[PART_SEALED] || k[KVQ_BLOCK_SINK] != a->n[PART_SINK]) {
		c->conn.broken = true;   /* the daemon holds slots we cannot name: drop them all */
		return client_fail(c, KVQ_EPROTOCOL, "alloc reply with the wrong counts");
	}
	if (ar->n_open_ids) {
		memcpy(ret_open + at[PART_OPEN], ar->open_ids, ar->n_open_ids * sizeof(uint32_t));
		memcpy(ret_reserved + at[PART_OPEN], ar->reserved_ids, ar->n_open_ids * sizeof(uint32_t));
	}
	memset(k, 0, sizeof(k));
	for (size_t i = 0; i < nb; i++)
		out[refs[i].cls][k[refs[i].cls]++] = client_block_id(refs[i]);
	return 0;
}

int client_alloc_many(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t n_sink, uint32_t *ret_open,
		      uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink, uint32_t *ret_short,
		      struct client_count *cnt)
{
	const uint64_t total = (uint64_t)n_open + n_sealed + n_sink;
	const uint32_t nreq = total ? (uint32_t)((total + KVQ_PROTO_MAX_IDS - 1) / KVQ_PROTO_MAX_IDS) : 1;
	uint32_t left[3] = { n_open, n_sealed, n_sink }, at[3] = { 0 }, got[3] = { 0 };
	struct client_pipe pipe = { 0 };
	struct alloc_part *a = NULL;
	struct kvq_block_ref *refs = NULL;
	char msg[sizeof(c->conn.msg)];
	int r, first = 0;

	if (!c || (n_open && (!ret_open || !ret_reserved)) || (n_sealed && !ret_sealed) || (n_sink && !ret_sink))
		return -EINVAL;
	if ((r = client_recover(c)) < 0)
		return r;
	if (ret_short)
		*ret_short = 0;
	/* before the requests: a reply that cannot be read leaves slots no one can name */
	a = calloc(nreq, sizeof(*a));
	refs = calloc((total < KVQ_PROTO_MAX_IDS ? total : KVQ_PROTO_MAX_IDS) + 1, sizeof(*refs));
	if (!a || !refs) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < nreq; i++) {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		Kvq__Alloc q = KVQ__ALLOC__INIT;
		uint32_t room = KVQ_PROTO_MAX_IDS;

		/* open slots first, then sealed, then sink, each request full */
		for (int k = 0; k < 3; k++) {
			a[i].n[k] = left[k] < room ? left[k] : room;
			left[k] -= a[i].n[k];
			room -= a[i].n[k];
		}
		q.n_open = a[i].n[PART_OPEN];
		q.n_sealed = a[i].n[PART_SEALED];
		q.n_sink = a[i].n[PART_SINK];
		e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
		e.alloc = &q;
		r = pipe_queue(c, &pipe, &e);
		if (r < 0)
			goto out;
	}
	r = pipe_send(c, &pipe, cnt);
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < nreq && !c->conn.broken; i++) {
		Kvq__Envelope *rep = NULL;

		r = pipe_reply(c, &pipe, i, KVQ__ENVELOPE__BODY_ALLOC_REPLY, cnt, &rep);
		if (r == 0)
			r = alloc_take(c, rep->alloc_reply, &a[i], at, ret_open, ret_reserved, ret_sealed, ret_sink,
				       refs);
		a[i].granted = r == 0;
		if (r == -ENOSPC && rep) {
			a[i].nospc = true;
			a[i].short_[PART_OPEN] = rep->alloc_reply->short_open;
			a[i].short_[PART_SEALED] = rep->alloc_reply->short_sealed;
			a[i].short_[PART_SINK] = rep->alloc_reply->short_sink;
		}
		kvq_frame_envelope_free(rep);
		keep_first(c, r, &first, msg, sizeof(msg));
		for (int k = 0; k < 3; k++)
			at[k] += a[i].n[k];
	}
	r = first;
	if (r == 0)
		goto out;
	/* all or nothing: what the other requests granted goes back */
	for (uint32_t i = 0; i < nreq; i++) {
		if (a[i].granted)
			give_back(c, a[i].n[PART_SEALED], ret_sealed + got[PART_SEALED], a[i].n[PART_OPEN],
				  ret_open + got[PART_OPEN], cnt);
		if (a[i].granted && a[i].n[PART_SINK])
			give_back(c, a[i].n[PART_SINK], ret_sink + got[PART_SINK], 0, NULL, cnt);
		for (int k = 0; k < 3; k++)
			got[k] += a[i].n[k];
	}
	if (r == -ENOSPC && ret_short)
		*ret_short = alloc_shortfall(a, nreq);
	client_fail(c, r, "%s", msg);
out:
	free(pipe.buf);
	free(refs);
	free(a);
	return r;
}

/* Blocks a prompt's hit can have: max_tokens / B, within a request's ids. */
static uint32_t prompt_ids(const kvq_client *c, const struct client_prompt *p)
{
	const uint32_t n = p->max_tokens / c->L->block_tokens;

	return n < KVQ_PROTO_MAX_IDS ? n : KVQ_PROTO_MAX_IDS;
}

/* Frame bytes a request has for its body's items (the envelope's own
 * fields and the body's tag and length take the rest). */
#define CLIENT_FRAME_ROOM (KVQ_FRAME_MAX - 64u)

/* Bytes a repeated message field's item m takes: tag, length, itself. */
static size_t item_bytes(const ProtobufCMessage *m)
{
	return protobuf_c_message_get_packed_size(m) + 6;
}

/* Prompt i's hit from h into p->ret_ids: 0, or KVQ_EPROTOCOL (the
 * connection broken: references we cannot name). */
static int lookup_take(kvq_client *c, const Kvq__LookupHit *h, struct client_prompt *p, struct kvq_block_ref *refs)
{
	const uint32_t max = prompt_ids(c, p);
	size_t n;
	int r = kvq_wire_blocks_get(&h->base, KVQ_WIRE_CHAIN, refs, max, &n);

	/* a chain: block 0's sink first, when the pool keeps one, and only there */
	for (size_t i = 1; r == 0 && i < n; i++)
		r = refs[i].cls == KVQ_BLOCK_SINK ? -EINVAL : 0;
	if (r < 0) {
		c->conn.broken = true;
		return client_fail(c, KVQ_EPROTOCOL, "lookup reply longer than asked for");
	}
	for (size_t i = 0; i < n; i++)
		p->ret_ids[i] = client_block_id(refs[i]);
	p->ret_n = (uint32_t)n;
	return 0;
}

int client_lookup_many(kvq_client *c, struct client_prompt *p, uint32_t n, struct client_count *cnt)
{
	Kvq__LookupPrompt *lp = NULL, **ptrs = NULL;
	Kvq__Lookup *req = NULL;        /* one per request: [first, first + n) of the prompts */
	uint32_t *first = NULL, nreq = 0, held = 0, *ids = NULL;
	struct client_pipe pipe = { 0 };
	struct kvq_block_ref *refs = NULL;
	char msg[sizeof(c->conn.msg)];
	size_t bytes, longest = 0;
	int r, bad = 0;

	if (!c || !c->L || (n && !p))
		return -EINVAL;
	if ((r = client_recover(c)) < 0)
		return r;
	for (uint32_t i = 0; i < n; i++)
		if ((p[i].n_tokens && !p[i].tokens) || p[i].max_tokens > p[i].n_tokens ||
		    (p[i].max_tokens >= c->L->block_tokens && !p[i].ret_ids) || p[i].salt_len > KVQ_PROTO_MAX_SALT ||
		    p[i].rid_len > KVQ_PROTO_MAX_REQUEST_ID || (p[i].rid_len && !p[i].rid))
			return -EINVAL;
		else if (prompt_ids(c, &p[i]) > longest)
			longest = prompt_ids(c, &p[i]);
	if (!n)
		return 0;
	r = -ENOMEM;
	lp = calloc(n, sizeof(*lp));
	ptrs = calloc(n, sizeof(*ptrs));
	req = calloc(n, sizeof(*req));
	first = calloc(n, sizeof(*first));
	refs = calloc(longest + 1, sizeof(*refs));
	if (!lp || !ptrs || !req || !first || !refs)
		goto out;
	/* prompts in order, as many to a request as the limits allow */
	bytes = 0;
	for (uint32_t i = 0, ni = 0, nt = 0; i < n; i++) {
		const uint32_t k = prompt_ids(c, &p[i]);
		size_t b;

		kvq__lookup_prompt__init(&lp[i]);
		lp[i].n_tokens = p[i].n_tokens;
		lp[i].tokens = (uint32_t *)p[i].tokens;
		lp[i].max_tokens = p[i].max_tokens;
		lp[i].salt.data = (uint8_t *)p[i].salt;
		lp[i].salt.len = p[i].salt ? p[i].salt_len : 0;
		lp[i].request_id.data = (uint8_t *)p[i].rid;
		lp[i].request_id.len = p[i].rid_len;
		ptrs[i] = &lp[i];
		b = item_bytes(&lp[i].base);
		if (!nreq || req[nreq - 1].n_prompts == KVQ_PROTO_MAX_PROMPTS || ni + k > KVQ_PROTO_MAX_IDS ||
		    (uint64_t)nt + p[i].n_tokens > KVQ_PROTO_MAX_TOKENS || bytes + b > CLIENT_FRAME_ROOM) {
			kvq__lookup__init(&req[nreq]);
			req[nreq].prompts = &ptrs[i];
			first[nreq++] = i;
			ni = nt = 0;
			bytes = 0;
		}
		req[nreq - 1].n_prompts++;
		ni += k;
		nt += p[i].n_tokens;
		bytes += b;
	}
	for (uint32_t q = 0; q < nreq; q++) {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;

		e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
		e.lookup = &req[q];
		r = pipe_queue(c, &pipe, &e);
		if (r < 0)
			goto out;
	}
	r = pipe_send(c, &pipe, cnt);
	if (r < 0)
		goto out;
	/* every prompt's ids, for a failure's Release: the hits of the requests that succeeded */
	for (uint32_t q = 0; q < nreq && !c->conn.broken; q++) {
		Kvq__Envelope *rep = NULL;
		const uint32_t np = (uint32_t)req[q].n_prompts;

		r = pipe_reply(c, &pipe, q, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, cnt, &rep);
		if (r == 0 && rep->lookup_reply->n_hits != np) {
			c->conn.broken = true;
			r = client_fail(c, KVQ_EPROTOCOL, "lookup reply with %zu hits for %u prompts",
					rep->lookup_reply->n_hits, np);
		}
		for (uint32_t i = 0; r == 0 && i < np; i++)
			r = lookup_take(c, rep->lookup_reply->hits[i], &p[first[q] + i], refs);
		kvq_frame_envelope_free(rep);
		if (r == 0)
			for (uint32_t i = 0; i < np; i++)
				held += p[first[q] + i].ret_n;
		else
			req[q].n_prompts = 0;   /* none of its prompts holds anything */
		keep_first(c, r, &bad, msg, sizeof(msg));
	}
	r = bad;
	if (r == 0)
		goto out;
	/* all or nothing: the hits of the requests that succeeded go back */
	ids = malloc(((size_t)held + 1) * sizeof(*ids));
	if (!ids) {
		c->conn.broken = true;   /* closing drops them */
		goto out;
	}
	for (uint32_t q = 0; q < nreq; q++) {
		uint32_t m = 0;

		for (uint32_t i = 0; i < req[q].n_prompts; i++) {
			memcpy(ids + m, p[first[q] + i].ret_ids, p[first[q] + i].ret_n * sizeof(*ids));
			m += p[first[q] + i].ret_n;
		}
		give_back(c, m, ids, 0, NULL, cnt);
	}
	client_fail(c, r, "%s", msg);
out:
	free(pipe.buf);
	free(ids);
	free(refs);
	free(first);
	free(req);
	free(ptrs);
	free(lp);
	return r;
}

/* A chain's progress over the rounds of a commit: blocks [done, done + n)
 * go in this round's request req. */
struct chain_part {
	uint32_t done, n, req;
	bool failed;
};

/* Block i of chain ch as PublishBlock b: its id, its parent prev (-1:
 * none), its tokens and salt.  0 or -EINVAL. */
static int chain_block(const kvq_client *c, const struct client_chain *ch, uint32_t i, int64_t prev,
		       Kvq__PublishBlock *b)
{
	const struct kvq_block_ref id = client_block_ref(ch->ids[i]);
	const struct kvq_block_ref par = client_block_ref((uint32_t)prev);
	const uint32_t B = c->L->block_tokens;

	kvq__publish_block__init(b);
	if (kvq_wire_blocks_put(&b->base, KVQ_WIRE_BLOCK, &id, 1, NULL) < 0 ||
	    kvq_wire_blocks_put(&b->base, KVQ_WIRE_PARENT, &par, prev >= 0, NULL) < 0)
		return -EINVAL;
	b->n_tokens = B;
	b->tokens = (uint32_t *)ch->tokens + (size_t)i * B;
	b->salt.data = (uint8_t *)ch->salt;
	b->salt.len = ch->salt ? ch->salt_len : 0;
	return 0;
}

/* A chain kvq_client_publish would take: 0 or -EINVAL. */
static int chain_ok(const kvq_client *c, const struct client_chain *ch)
{
	if (!c->L || !ch->n || !ch->ids || !ch->tokens || !ch->ret_ids || ch->salt_len > KVQ_PROTO_MAX_SALT ||
	    ch->parent > (int64_t)UINT32_MAX)
		return -EINVAL;
	/* ids carry their class (KVQ_SINK_ID); a sink can start a chain only */
	for (uint32_t i = 1; i < ch->n; i++)
		if (client_block_ref(ch->ids[i]).cls == KVQ_BLOCK_SINK)
			return -EINVAL;
	return 0;
}

/* Queues the Seal requests of a commit: pairs within KVQ_PROTO_MAX_IDS
 * each, the first carrying the attention report when one is due (rep,
 * bins, ptrs: its room; *ret_report whether it went); with no pair, one
 * Seal when mode asks (for the report alone: CLIENT_SEAL_DUE).  Returns
 * the number queued in *ret_n, 0 or pipe_queue's error. */
static int commit_seals(kvq_client *c, struct client_pipe *pipe, uint32_t n, const uint32_t *open_ids,
			const uint32_t *sealed_ids, enum client_seal mode, Kvq__AttentionReport *rep,
			Kvq__AttentionBin *bins, Kvq__AttentionBin **ptrs, bool *ret_report, uint32_t *ret_n)
{
	const bool report = mode != CLIENT_SEAL_NONE && timing_due(c);
	uint32_t k = 0;

	*ret_report = false;
	*ret_n = 0;
	if (report)
		timing_report(c, rep, bins, ptrs);
	else if (!n && mode != CLIENT_SEAL_ALWAYS)
		return 0;
	do {
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		Kvq__Seal s = KVQ__SEAL__INIT;
		const uint32_t m = n - k < KVQ_PROTO_MAX_IDS ? n - k : KVQ_PROTO_MAX_IDS;
		int r;

		s.n_open_ids = s.n_sealed_ids = m;
		s.open_ids = (uint32_t *)open_ids + k;
		s.sealed_ids = (uint32_t *)sealed_ids + k;
		/* the timings ride along once their interval has passed */
		if (report && k == 0)
			s.attention = rep;
		e.body_case = KVQ__ENVELOPE__BODY_SEAL;
		e.seal = &s;
		r = pipe_queue(c, pipe, &e);
		if (r < 0)
			return r;
		*ret_report = report;
		++*ret_n;
		k += m;
	} while (k < n);
	return 0;
}

/* Queues a Publish of blocks bp[n]. */
static int commit_publish(kvq_client *c, struct client_pipe *pipe, Kvq__PublishBlock **bp, size_t n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Publish q = KVQ__PUBLISH__INIT;

	q.n_blocks = n;
	q.blocks = bp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &q;
	return pipe_queue(c, pipe, &e);
}

/* Whether n blocks of B tokens and bytes bytes fit one Publish. */
static bool publish_fits(size_t n, uint32_t B, size_t bytes)
{
	return n <= KVQ_PROTO_MAX_IDS && (uint64_t)n * B <= KVQ_PROTO_MAX_TOKENS && bytes <= CLIENT_FRAME_ROOM;
}

/*
 * Queues the Publish requests of one round: each chain's next part in
 * order, whole chains packed greedily into requests within the limits
 * (publish_fits); a chain too long for a request of its own sends what
 * fits and continues next round, its first block then naming the id its
 * predecessor was published as.  b and bp have room for every block.
 * Returns 0 with *ret_n the requests queued, or -EINVAL, pipe_queue's error.
 */
static int commit_round(kvq_client *c, struct client_pipe *pipe, const struct client_chain *ch,
			struct chain_part *part, uint32_t n_chains, Kvq__PublishBlock *b, Kvq__PublishBlock **bp,
			uint32_t *ret_n)
{
	const uint32_t B = c->L->block_tokens;
	size_t used = 0, first = 0, bytes = 0;   /* bp[first, used): the open request's blocks */
	uint32_t nreq = 0;
	int r;

	for (uint32_t i = 0; i < n_chains; i++) {
		struct chain_part *q = &part[i];
		const uint32_t m = ch[i].n - q->done;
		size_t all = 0;

		q->n = 0;
		if (q->failed || !m)
			continue;
		for (uint32_t k = 0; k < m; k++) {
			const uint32_t at = q->done + k;
			/* a continuation's first block: its predecessor as published */
			const int64_t prev = at == 0 ? ch[i].parent : k == 0 ? ch[i].ret_ids[at - 1] : ch[i].ids[at - 1];

			if (chain_block(c, &ch[i], at, prev, &b[used + k]) < 0)
				return -EINVAL;
			all += item_bytes(&b[used + k].base);
		}
		/* whole chains together: one that does not fit starts a request */
		if (used > first && !publish_fits(used - first + m, B, bytes + all)) {
			r = commit_publish(c, pipe, bp + first, used - first);
			if (r < 0)
				return r;
			nreq++;
			first = used;
			bytes = 0;
		}
		for (uint32_t k = 0; k < m; k++) {
			const size_t nb = item_bytes(&b[used].base);

			if (!publish_fits(used - first + 1, B, bytes + nb))
				break;
			bp[used] = &b[used];
			used++;
			bytes += nb;
			q->n++;
		}
		q->req = nreq;
		if (q->n < m) {
			/* the request is full; the rest of the chain waits for its reply */
			r = commit_publish(c, pipe, bp + first, used - first);
			if (r < 0)
				return r;
			nreq++;
			first = used;
			bytes = 0;
		}
	}
	if (used > first) {
		r = commit_publish(c, pipe, bp + first, used - first);
		if (r < 0)
			return r;
		nreq++;
	}
	*ret_n = nreq;
	return 0;
}

/* The reply to a round's Publish request req: the ids of each chain's part
 * in it into its ret_ids; KVQ_EPROTOCOL (the connection broken) when the
 * count differs. */
static int commit_take(kvq_client *c, const Kvq__PublishReply *rep, struct client_chain *ch, struct chain_part *part,
		       uint32_t n_chains, uint32_t req)
{
	size_t n = 0, at = 0;

	for (uint32_t i = 0; i < n_chains; i++)
		if (part[i].n && part[i].req == req)
			n += part[i].n;
	if (rep->n_ids != n) {
		c->conn.broken = true;
		return client_fail(c, KVQ_EPROTOCOL, "publish reply with the wrong count");
	}
	for (uint32_t i = 0; i < n_chains; i++) {
		struct chain_part *q = &part[i];

		if (!q->n || q->req != req)
			continue;
		/* a reply id is an index in its block's class */
		for (uint32_t k = q->done; k < q->done + q->n; k++) {
			struct kvq_block_ref got = client_block_ref(ch[i].ids[k]);

			got.index = rep->ids[at++];
			ch[i].ret_ids[k] = client_block_id(got);
		}
		q->done += q->n;
		ch[i].published = q->done == ch[i].n;
	}
	return 0;
}

/* A round's requests failed: its chains' parts with it. */
static void commit_failed(struct chain_part *part, uint32_t n_chains, uint32_t req)
{
	for (uint32_t i = 0; i < n_chains; i++)
		if (part[i].n && part[i].req == req)
			part[i].failed = true;
}

int client_commit_run(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
			     struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt,
			     enum client_seal mode)
{
	uint32_t seals_ok = 0;
	Kvq__AttentionReport rep;
	Kvq__AttentionBin bins[KVQ_PROTO_MAX_TIMING_BINS], *bptrs[KVQ_PROTO_MAX_TIMING_BINS];
	struct client_pipe pipe = { 0 };
	struct chain_part *part = NULL;
	Kvq__PublishBlock *b = NULL, **bp = NULL;
	char msg[sizeof(c->conn.msg)];
	uint32_t n_seals = 0, n_pub = 0, total_seals = 0;
	size_t blocks = 0;
	bool report = false;
	int r, bad = 0;

	if (!c || (n_seal && (!open_ids || !sealed_ids)) || (n_chains && !chains))
		return -EINVAL;
	for (uint32_t i = 0; i < n_chains; i++) {
		if (chain_ok(c, &chains[i]) < 0)
			return -EINVAL;
		chains[i].published = false;
		blocks += chains[i].n;
	}
	if ((r = client_recover(c)) < 0)
		return r;
	r = -ENOMEM;
	part = calloc(n_chains + 1, sizeof(*part));
	b = calloc(blocks + 1, sizeof(*b));
	bp = calloc(blocks + 1, sizeof(*bp));
	if (!part || !b || !bp)
		goto out;
	/* the first round: the Seals, then every chain's first part */
	r = commit_seals(c, &pipe, n_seal, open_ids, sealed_ids, mode, &rep, bins, bptrs, &report, &n_seals);
	total_seals = n_seals;
	if (r == 0 && n_chains)
		r = commit_round(c, &pipe, chains, part, n_chains, b, bp, &n_pub);
	while (r == 0 && n_seals + n_pub) {
		r = pipe_send(c, &pipe, cnt);
		for (uint32_t i = 0; r == 0 && i < n_seals; i++) {
			int s = pipe_reply(c, &pipe, i, KVQ__ENVELOPE__BODY_SEAL_REPLY, cnt, NULL);

			if (s == 0 && i == 0 && report)
				timing_sent(c);
			seals_ok += s == 0;
			/* a Seal for the timings alone fails no commit */
			if (n_seal || mode == CLIENT_SEAL_ALWAYS)
				keep_first(c, s, &bad, msg, sizeof(msg));
			r = c->conn.broken ? s : 0;
		}
		for (uint32_t q = 0; r == 0 && q < n_pub; q++) {
			Kvq__Envelope *e = NULL;
			int s = pipe_reply(c, &pipe, n_seals + q, KVQ__ENVELOPE__BODY_PUBLISH_REPLY, cnt, &e);

			if (s == 0)
				s = commit_take(c, e->publish_reply, chains, part, n_chains, q);
			if (s < 0)
				commit_failed(part, n_chains, q);
			kvq_frame_envelope_free(e);
			keep_first(c, s, &bad, msg, sizeof(msg));
			r = c->conn.broken ? s : 0;
		}
		/* the next rounds: the continuations of chains too long for a request */
		n_seals = n_pub = 0;
		if (r == 0)
			r = commit_round(c, &pipe, chains, part, n_chains, b, bp, &n_pub);
	}
	if (r == 0 && bad < 0) {
		r = bad;
		client_fail(c, r, "%s", msg);
	}
out:
	/* the first round's Seals: every one, or no pair to seal */
	if (ret_sealed)
		*ret_sealed = !n_seal || (total_seals && seals_ok == total_seals);
	free(pipe.buf);
	free(bp);
	free(b);
	free(part);
	return r;
}

int client_commit(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
		  struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt)
{
	return client_commit_run(c, n_seal, open_ids, sealed_ids, chains, n_chains, ret_sealed, cnt,
				 CLIENT_SEAL_DUE);
}
