/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq_batch (kvq.h): a step over many sequences of one client, each phase
 * one call for all of them, and the one path a sequence's own begin,
 * write, attention and commit take (a batch of one, seq.c).  The requests
 * of a phase go out together (client.c: client_lookup_many,
 * client_alloc_many, client_commit); the kernels get every sequence's
 * table in one call (struct client_tables), made once per step.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "libkvq_internal.h"

struct kvq_batch {
	kvq_client *c;
	struct batch_entry *e;
	uint32_t n, cap;
	bool begun;
	uint32_t *indptr;               /* n + 1 entries once begun */
	struct client_tables w, a;      /* the step's write and attention tables */
	struct client_count cnt[2];     /* KVQ_BATCH_BEGIN, KVQ_BATCH_COMMIT */
};

/* ---------------------------------------------------------------- tables */

int client_tables_reserve(struct client_tables *t, uint32_t nseq)
{
	struct kvq_seq_table *tt;
	uint32_t *ns, *no;

	if (nseq <= t->cap)
		return 0;
	tt = realloc(t->t, nseq * sizeof(*tt));
	if (tt)
		t->t = tt;
	ns = realloc(t->ns, nseq * sizeof(*ns));
	if (ns)
		t->ns = ns;
	no = realloc(t->no, nseq * sizeof(*no));
	if (no)
		t->no = no;
	if (!tt || !ns || !no)
		return -ENOMEM;
	t->cap = nseq;
	return 0;
}

void client_tables_set(struct client_tables *t, uint32_t i, const struct kvq_seq_table *tab, uint32_t ns,
		       uint32_t no)
{
	if (i == 0)
		t->rows = t->max_m = t->max_n = 0;
	t->t[i] = *tab;
	t->t[i].row0 = t->rows;
	t->ns[i] = ns;
	t->no[i] = no;
	t->rows += tab->m;
	t->max_m = tab->m > t->max_m ? tab->m : t->max_m;
	t->max_n = tab->n > t->max_n ? tab->n : t->max_n;
	t->nseq = i + 1;
	t->dirty = true;
}

void client_tables_free(kvq_client *c, struct client_tables *t)
{
	/* only the cuda backend makes device copies (c->be is NULL when a new
	 * mapping failed after a lost connection) */
	if (t->dev && client_cuda.tables_free)
		client_cuda.tables_free(c, t->dev);
	free(t->t);
	free(t->ns);
	free(t->no);
	*t = (struct client_tables){ 0 };
}

/* ---------------------------------------------------------------- the step */

/* Gives back the hits e[0..n)'s lookups took, and empties those sequences. */
static void untake_hits(kvq_client *c, struct batch_entry *e, uint32_t n)
{
	uint32_t k = 0, *ids;

	for (uint32_t i = 0; i < n; i++)
		if (e[i].hit)
			k += e[i].s->n_sealed;
	if (!k)
		return;
	ids = malloc(k * sizeof(*ids));
	k = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (!e[i].hit)
			continue;
		for (uint32_t b = 0; ids && b < e[i].s->n_sealed; b++)
			ids[k++] = (uint32_t)e[i].s->sealed[b];
		seq_untake_hit(e[i].s);
		e[i].hit = 0;
	}
	/* a failed release leaves the references to the connection's close */
	if (ids)
		client_release_many(c, ids, k, NULL, 0);
	free(ids);
}

/* The lookups of e[0..n)'s KVQ_BATCH_LOOKUP sequences, in one request (a
 * prompt too short to match a whole block is not sent); each hit taken as
 * its sequence's prefix (e[i].hit).  On failure nothing is held and no
 * sequence changed. */
static int step_lookups(kvq_client *c, struct batch_entry *e, uint32_t n, struct client_count *cnt)
{
	const struct kvq_layout *L = c->L;
	struct client_prompt *p = NULL;
	uint32_t np = 0, *ids = NULL, *at, *who = NULL, j;
	size_t nids = 0;
	int r = 0;

	for (uint32_t i = 0; i < n; i++) {
		e[i].hit = 0;
		if ((e[i].flags & KVQ_BATCH_LOOKUP) && seq_lookup_max(L, e[i].m)) {
			np++;
			nids += seq_lookup_max(L, e[i].m) / L->block_tokens;
		}
	}
	if (!np)
		return 0;
	p = calloc(np, sizeof(*p));
	who = malloc(np * sizeof(*who));   /* prompt j is e[who[j]]'s */
	ids = malloc((nids + 1) * sizeof(*ids));
	if (!p || !who || !ids) {
		r = -ENOMEM;
		goto out;
	}
	np = 0;
	at = ids;
	for (uint32_t i = 0; i < n; i++) {
		const kvq_seq *s = e[i].s;
		const uint32_t max = seq_lookup_max(L, e[i].m);

		if (!(e[i].flags & KVQ_BATCH_LOOKUP) || !max)
			continue;
		p[np] = (struct client_prompt){ .tokens = e[i].tokens, .n_tokens = e[i].m, .max_tokens = max,
			.salt = s->salt_len ? s->salt : NULL, .salt_len = s->salt_len,
			.rid = s->rid_len ? s->rid : NULL, .rid_len = s->rid_len, .ret_ids = at };
		who[np++] = i;
		at += max / L->block_tokens;
	}
	if ((r = client_lookup_many(c, p, np, cnt)) < 0)
		goto out;
	for (j = 0; j < np && r == 0; j++) {
		struct batch_entry *x = &e[who[j]];

		if ((r = seq_take_hit(x->s, x->tokens, p[j].ret_ids, p[j].ret_n)) == 0)
			x->hit = p[j].ret_n * L->block_tokens;
	}
	if (r < 0) {
		/* the hits not taken (the one that failed and those after it), then the ones taken */
		for (j = j - 1; j < np; j++)
			if (p[j].ret_n)
				client_release_many(c, p[j].ret_ids, p[j].ret_n, NULL, 0);
		untake_hits(c, e, n);
	}
out:
	free(p);
	free(who);
	free(ids);
	return r;
}

int batch_step_begin(kvq_client *c, struct batch_entry *e, uint32_t n, uint32_t *ret_short, struct client_count *cnt)
{
	struct seq_need need, sum = { 0 };
	uint32_t *ao = NULL, *ar = NULL, *as = NULL, *ak = NULL, planned = 0, short_by = 0;
	const uint32_t *pao, *par, *pas, *pak;
	int r;

	if (cnt)
		*cnt = (struct client_count){ 0 };
	if (ret_short)
		*ret_short = 0;
	for (uint32_t i = 0; i < n; i++) {
		if ((r = seq_live(e[i].s)) < 0)
			return r;
		if (e[i].s->busy)
			return client_fail(c, -EBUSY, "sequence %u of the step has a write in progress", i);
	}
	if ((r = step_lookups(c, e, n, cnt)) < 0)
		return r;
	for (; planned < n; planned++) {
		if ((r = seq_step_plan(e[planned].s, e[planned].m - e[planned].hit, &need)) < 0)
			goto fail;
		if (sum.open > UINT32_MAX - need.open || sum.sealed > UINT32_MAX - need.sealed ||
		    sum.sink > UINT32_MAX - need.sink) {
			r = client_fail(c, -E2BIG, "the step needs more than 2^32 slots");
			seq_step_drop(e[planned].s);
			goto fail;
		}
		sum.open += need.open;
		sum.sealed += need.sealed;
		sum.sink += need.sink;
	}
	ao = malloc(((size_t)sum.open + 1) * sizeof(*ao));
	ar = malloc(((size_t)sum.open + 1) * sizeof(*ar));
	as = malloc(((size_t)sum.sealed + 1) * sizeof(*as));
	ak = malloc(((size_t)sum.sink + 1) * sizeof(*ak));
	if (!ao || !ar || !as || !ak) {
		r = -ENOMEM;
		goto fail;
	}
	if ((sum.open || sum.sealed || sum.sink) &&
	    (r = client_alloc_many(c, sum.open, sum.sealed, sum.sink, ao, ar, as, ak, &short_by, cnt)) < 0)
		goto fail;
	pao = ao, par = ar, pas = as, pak = ak;
	for (uint32_t i = 0; i < n; i++)
		seq_step_take(e[i].s, e[i].tokens + e[i].hit, e[i].m - e[i].hit, &pao, &par, &pas, &pak);
	r = 0;
	goto out;
fail:
	for (uint32_t i = 0; i < planned; i++)
		seq_step_drop(e[i].s);
	untake_hits(c, e, n);
	if (ret_short)
		*ret_short = short_by;
out:
	free(ao);
	free(ar);
	free(as);
	free(ak);
	return r;
}

int batch_step_commit(kvq_client *c, struct batch_entry *e, uint32_t n, struct client_count *cnt)
{
	struct client_chain *ch = NULL;
	uint32_t *so = NULL, *ss = NULL, *ids = NULL, *ret = NULL, *idx = NULL;
	size_t n_pairs = 0, n_pub = 0;
	uint32_t nseal = 0, nch = 0;
	bool sealed = false;
	int r;

	if (cnt)
		*cnt = (struct client_count){ 0 };
	for (uint32_t i = 0; i < n; i++)
		if ((r = seq_commit_check(e[i].s)) < 0)
			return r;
	for (uint32_t i = 0; i < n; i++) {
		if ((r = seq_commit_prepare(e[i].s)) < 0)
			return r;
		n_pairs += e[i].s->n_open;
		n_pub += seq_publish_count(e[i].s);
	}
	so = malloc((n_pairs + 1) * sizeof(*so));
	ss = malloc((n_pairs + 1) * sizeof(*ss));
	ids = malloc((n_pub + 1) * sizeof(*ids));
	ret = malloc((n_pub + 1) * sizeof(*ret));
	ch = calloc((size_t)n + 1, sizeof(*ch));
	idx = malloc(((size_t)n + 1) * sizeof(*idx));   /* chain k is sequence idx[k]'s */
	if (!so || !ss || !ids || !ret || !ch || !idx) {
		r = -ENOMEM;
		goto out;
	}
	n_pub = 0;
	for (uint32_t i = 0; i < n; i++) {
		kvq_seq *s = e[i].s;

		nseal += seq_seal_pairs(s, so + nseal, ss + nseal);
		if (!seq_publish_count(s))
			continue;
		seq_chain(s, &ch[nch], ids + n_pub, ret + n_pub);
		n_pub += ch[nch].n;
		idx[nch++] = i;
	}
	/* the write sealed them already; on the GPU, once the stream drains */
	if ((nseal || nch) && (r = c->be->drain(c)) < 0)
		goto out;
	r = client_commit(c, nseal, so, ss, ch, nch, &sealed, cnt);
	for (uint32_t k = 0; k < nch; k++)
		seq_commit_published(e[idx[k]].s, &ch[k]);
	/* a refused Seal leaves the step begun, as it was: free releases it */
	if (sealed)
		for (uint32_t i = 0; i < n; i++)
			seq_commit_adopt(e[i].s);
out:
	free(so);
	free(ss);
	free(ids);
	free(ret);
	free(ch);
	free(idx);
	return r;
}

/* ---------------------------------------------------------------- kvq_batch */

int kvq_batch_new(kvq_client *c, kvq_batch **ret_batch)
{
	kvq_batch *b;

	if (!c || !c->base || !ret_batch)
		return -EINVAL;
	if (!(b = calloc(1, sizeof(*b))))
		return -ENOMEM;
	b->c = c;
	*ret_batch = b;
	return 0;
}

static void batch_forget(kvq_batch *b)
{
	for (uint32_t i = 0; i < b->n; i++)
		free((void *)b->e[i].tokens);
	b->n = 0;
	free(b->indptr);
	b->indptr = NULL;
}

void kvq_batch_free(kvq_batch *b)
{
	if (!b)
		return;
	kvq_batch_abort(b);
	batch_forget(b);
	if (b->c->be)
		b->c->be->drain(b->c);
	client_tables_free(b->c, &b->w);
	client_tables_free(b->c, &b->a);
	free(b->e);
	free(b);
}

uint32_t kvq_batch_size(const kvq_batch *b)
{
	return b ? b->n : 0;
}

int kvq_batch_add(kvq_batch *b, kvq_seq *s, const uint32_t *tokens, uint32_t m, unsigned flags)
{
	uint32_t *t;

	if (!b)
		return -EINVAL;
	if (!s || !tokens || !m || (flags & ~(unsigned)KVQ_BATCH_LOOKUP))
		return client_fail(b->c, -EINVAL, "add: no sequence, no tokens or unknown flags");
	if (s->c != b->c)
		return client_fail(b->c, -EINVAL, "a sequence of another client");
	if (b->begun || s->busy)
		return client_fail(b->c, -EBUSY, b->begun ? "the step is begun" : "the sequence has a write in progress");
	if ((flags & KVQ_BATCH_LOOKUP) && s->n)
		return client_fail(b->c, -EINVAL, "a lookup for a sequence that is not empty");
	if ((flags & KVQ_BATCH_LOOKUP) && m > KVQ_PROTO_MAX_TOKENS)
		return client_fail(b->c, -E2BIG, "a prompt of %u tokens is over the lookup limit", m);
	for (uint32_t i = 0; i < b->n; i++)
		if (b->e[i].s == s)
			return client_fail(b->c, -EEXIST, "the sequence is in the batch already");
	if (b->n == UINT32_MAX - 1)
		return -E2BIG;
	if (b->n == b->cap) {
		uint32_t cap = b->cap ? b->cap * 2 : 16;
		struct batch_entry *e = realloc(b->e, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		b->e = e;
		b->cap = cap;
	}
	if (!(t = malloc((size_t)m * sizeof(*t))))
		return -ENOMEM;
	memcpy(t, tokens, (size_t)m * sizeof(*t));
	b->e[b->n] = (struct batch_entry){ .s = s, .tokens = t, .m = m, .flags = flags };
	return (int)b->n++;
}

int kvq_batch_clear(kvq_batch *b)
{
	if (!b)
		return -EINVAL;
	if (b->begun)
		return client_fail(b->c, -EBUSY, "the step is begun");
	batch_forget(b);
	return 0;
}

/* The step's tables, made once: the write's and the attention's of every
 * sequence's new rows. */
static int batch_tables(kvq_batch *b)
{
	const uint32_t kv = b->c->L->kv_heads;
	int r;

	if (!(b->indptr = malloc(((size_t)b->n + 1) * sizeof(*b->indptr))) ||
	    client_tables_reserve(&b->w, b->n) < 0 || client_tables_reserve(&b->a, b->n) < 0)
		return -ENOMEM;
	for (uint32_t i = 0; i < b->n; i++) {
		kvq_seq *s = b->e[i].s;
		struct kvq_seq_table t;
		uint32_t ns, no;

		seq_write_table(s, &t, &ns, &no);
		client_tables_set(&b->w, i, &t, ns, no);
		if ((r = seq_attn_table(s, kv, s->m, &t, &ns, &no)) < 0)
			return r;
		client_tables_set(&b->a, i, &t, ns, no);
		b->indptr[i] = b->w.t[i].row0;
	}
	b->indptr[b->n] = b->w.rows;
	return 0;
}

int kvq_batch_begin(kvq_batch *b, uint32_t *ret_short)
{
	int r;

	if (ret_short)
		*ret_short = 0;
	if (!b)
		return -EINVAL;
	if (b->begun)
		return client_fail(b->c, -EBUSY, "the step is begun");
	if (!b->n)
		return client_fail(b->c, -EINVAL, "a step of no sequences");
	free(b->indptr);
	b->indptr = NULL;
	if ((r = batch_step_begin(b->c, b->e, b->n, ret_short, &b->cnt[KVQ_BATCH_BEGIN])) < 0)
		return r;
	b->begun = true;
	if ((r = batch_tables(b)) < 0) {
		kvq_batch_abort(b);
		return r;
	}
	return 0;
}

const uint32_t *kvq_batch_indptr(const kvq_batch *b, uint32_t *ret_nseq)
{
	if (!b || !b->begun)
		return NULL;
	if (ret_nseq)
		*ret_nseq = b->n;
	return b->indptr;
}

uint32_t kvq_batch_hit(const kvq_batch *b, uint32_t i)
{
	return b && i < b->n ? b->e[i].hit : 0;
}

/* 0, or -ESTALE when a sequence of the step is stale (seq_live). */
static int batch_live(const kvq_batch *b)
{
	int r;

	for (uint32_t i = 0; i < b->n; i++)
		if ((r = seq_live(b->e[i].s)) < 0)
			return r;
	return 0;
}

int kvq_batch_write(kvq_batch *b, uint32_t layer, const void *k, const void *v)
{
	int r;

	if (!b)
		return -EINVAL;
	if (!k || !v)
		return client_fail(b->c, -EINVAL, "write: no K or V");
	if (!b->begun || layer >= b->c->L->layers)
		return client_fail(b->c, -EINVAL, "write without begin, or layer %u out of range", layer);
	if ((r = batch_live(b)) < 0)
		return r;
	if ((r = b->c->be->write(b->c, &b->w, layer, k, v)) < 0)
		return r;
	for (uint32_t i = 0; i < b->n; i++)
		b->e[i].s->written[layer] = 1;
	return 0;
}

/* Whether the step's attention may run on layer with q_heads query heads. */
static int batch_attn_check(kvq_batch *b, uint32_t layer, uint32_t q_heads)
{
	const struct kvq_layout *L = b->c->L;
	int r;

	if (!b->begun || layer >= L->layers)
		return client_fail(b->c, -EINVAL, "attention without begin, or layer %u out of range", layer);
	if ((r = batch_live(b)) < 0)
		return r;
	if (!q_heads || q_heads % L->kv_heads)
		return client_fail(b->c, -EINVAL, "attention: bad query counts");
	/* kvq_batch_write marks every sequence at once */
	if (!b->e[0].s->written[layer])
		return client_fail(b->c, -EINVAL, "attention on layer %u before its write", layer);
	return 0;
}

int kvq_batch_attention(kvq_batch *b, uint32_t layer, uint32_t q_heads, float scale, const float *q, float *out)
{
	int r;

	if (!b)
		return -EINVAL;
	if (!q || !out)
		return client_fail(b->c, -EINVAL, "attention: no q or out");
	if ((r = batch_attn_check(b, layer, q_heads)) < 0)
		return r;
	return b->c->be->attention(b->c, &b->a, layer, q_heads, seq_scale(b->c, scale), q, out);
}

int kvq_batch_attention_device(kvq_batch *b, uint32_t layer, uint32_t q_heads, float scale, const void *q,
			       void *out, int out_f32)
{
	int r;

	if (!b)
		return -EINVAL;
	if (!q || !out)
		return client_fail(b->c, -EINVAL, "attention: no q or out");
	if ((r = batch_live(b)) < 0)
		return r;
	if (!b->c->be->attention_device)
		return client_fail(b->c, -ENOTSUP, "attention on device memory needs a cuda pool%s",
				   client_cuda.compiled ? "" : " (libkvq built without CUDA)");
	if ((r = batch_attn_check(b, layer, q_heads)) < 0)
		return r;
	return b->c->be->attention_device(b->c, &b->a, layer, q_heads, seq_scale(b->c, scale), q, out,
					  out_f32 != 0);
}

int kvq_batch_commit(kvq_batch *b)
{
	int r;

	if (!b)
		return -EINVAL;
	if (!b->begun)
		return client_fail(b->c, -EINVAL, "commit without begin");
	r = batch_step_commit(b->c, b->e, b->n, &b->cnt[KVQ_BATCH_COMMIT]);
	/* the step is over once kvqd answered: each sequence keeps what
	 * succeeded; a commit refused before that can be tried again */
	if (r == 0 || b->cnt[KVQ_BATCH_COMMIT].waits)
		b->begun = false;
	return r;
}

void kvq_batch_abort(kvq_batch *b)
{
	uint32_t *sealed = NULL, *open = NULL, ns = 0, no = 0;
	size_t cap = 1;

	if (!b || !b->begun)
		return;
	for (uint32_t i = 0; i < b->n; i++)
		cap += (size_t)b->e[i].s->p_n_sealed + b->e[i].s->p_n_open;
	sealed = malloc(cap * sizeof(*sealed));
	open = malloc(cap * sizeof(*open));
	/* no kernel of ours may still write the slots */
	if (b->c->be)
		b->c->be->drain(b->c);
	for (uint32_t i = 0; i < b->n; i++) {
		kvq_seq *s = b->e[i].s;
		uint32_t a = 0, o = 0;

		if (!s->busy)
			continue;
		/* a stale sequence's slots were its lost connection's (client_recover) */
		if (sealed && open && s->epoch == b->c->epoch)
			seq_step_new_ids(s, sealed + ns, &a, open + no, &o);
		ns += a;
		no += o;
		seq_step_drop(s);
	}
	/* a failed release leaves the holds to the connection's close */
	if (sealed && open)
		client_release_many(b->c, sealed, ns, open, no);
	free(sealed);
	free(open);
	b->begun = false;
}

int kvq_batch_requests(const kvq_batch *b, int phase, uint32_t *ret_requests, uint32_t *ret_waits)
{
	if (!b || (phase != KVQ_BATCH_BEGIN && phase != KVQ_BATCH_COMMIT))
		return -EINVAL;
	if (ret_requests)
		*ret_requests = b->cnt[phase].requests;
	if (ret_waits)
		*ret_waits = b->cnt[phase].waits;
	return 0;
}
