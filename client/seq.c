/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq_seq: a sequence's block table on an attached client (kvq.h), the
 * same for every backend; the kernels and the waits are the backend's
 * (c->be, libkvq_internal.h).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "blockid.h"
#include "libkvq_internal.h"

/* kvq_seq_table.sink (kernels/layout.h) of a table whose block 0 is the
 * sequence's: that block's entry is the first sealed one (ns of them) or
 * else the first open one (no); 0 when it is no sink. */
static uint32_t table_sink(const int32_t *sealed, uint32_t ns, const int32_t *open, uint32_t no)
{
	int32_t id = ns ? sealed[0] : no ? open[0] : -1;

	return id >= 0 ? kvq_seq_table_sink(client_block_ref((uint32_t)id)) : 0;
}

static int seq_reserve_tokens(kvq_seq *s, uint32_t need)
{
	uint32_t *t;
	uint32_t cap = s->cap ? s->cap : 256;

	if (need <= s->cap)
		return 0;
	while (cap < need)
		cap = cap > UINT32_MAX / 2 ? need : cap * 2;
	t = realloc(s->tokens, (size_t)cap * sizeof(*t));
	if (!t)
		return -ENOMEM;
	s->tokens = t;
	s->cap = cap;
	return 0;
}

uint32_t seq_lookup_max(const struct kvq_layout *L, uint32_t n)
{
	uint32_t max = kvq_layout_split(L, n);

	return max / L->block_tokens > KVQ_PROTO_MAX_IDS ? KVQ_PROTO_MAX_IDS * L->block_tokens : max;
}

int seq_live(const kvq_seq *s)
{
	if (s->epoch == s->c->epoch && !s->c->conn.broken)
		return 0;
	return client_fail(s->c, -ESTALE, "a sequence of a connection to kvqd that was lost: free it and start "
			   "again (kvq_seq_from_prompt finds what was published)");
}

int kvq_seq_new(kvq_client *c, const void *salt, size_t salt_len, kvq_seq **ret_seq)
{
	kvq_seq *s;
	int r;

	if (!c || !ret_seq || salt_len > KVQ_PROTO_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	/* a sequence begins on a live connection: a lost one is replaced here */
	if ((r = client_recover(c)) < 0)
		return r;
	if (!c->base)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->written = calloc(c->L->layers, 1);
	if (!s->written) {
		free(s);
		return -ENOMEM;
	}
	s->c = c;
	s->epoch = c->epoch;
	if (salt_len)
		memcpy(s->salt, salt, salt_len);
	s->salt_len = salt_len;
	*ret_seq = s;
	return 0;
}

static void seq_drop_pending(kvq_seq *s)
{
	free(s->p_sealed);
	free(s->p_open);
	free(s->p_resv);
	s->p_sealed = s->p_open = s->p_resv = NULL;
	s->p_n_sealed = s->p_n_open = 0;
	s->busy = false;
}

/* Ids a pending write allocated beyond the committed table: released on
 * free or when begin fails half-way. */
void seq_step_new_ids(const kvq_seq *s, uint32_t *sealed, uint32_t *ns, uint32_t *open, uint32_t *no)
{
	uint32_t nb_old = s->n_sealed + s->n_open;

	*ns = *no = 0;
	for (uint32_t b = nb_old; b < s->p_n_sealed; b++)
		sealed[(*ns)++] = (uint32_t)s->p_sealed[b];
	for (uint32_t j = 0; j < s->p_n_open; j++) {
		uint32_t b = s->n_sealed + j;
		if (b >= nb_old && s->p_open[j] >= 0)
			open[(*no)++] = (uint32_t)s->p_open[j];
	}
}

void kvq_seq_free(kvq_seq *s)
{
	uint32_t *sealed = NULL, *open = NULL, ns = 0, no = 0;
	size_t cap;

	if (!s)
		return;
	/* no kernel of ours may read the slots once they are released (no
	 * backend: a new mapping failed after a lost connection, the old one is gone) */
	if (s->c->be)
		s->c->be->drain(s->c);
	if (s->tabs) {
		client_tables_free(s->c, s->tabs);
		free(s->tabs);
	}
	cap = (size_t)s->n_sealed + s->n_open + s->p_n_sealed + s->p_n_open + 1;
	sealed = malloc(cap * sizeof(*sealed));
	open = malloc(cap * sizeof(*open));
	if (sealed && open) {
		if (s->busy)
			seq_step_new_ids(s, sealed, &ns, open, &no);
		for (uint32_t i = 0; i < s->n_sealed; i++)
			sealed[ns++] = (uint32_t)s->sealed[i];
		for (uint32_t i = 0; i < s->n_open; i++)
			open[no++] = (uint32_t)s->open[i];
		/* a failed release leaves the holds to the connection's close;
		 * a stale sequence's were its lost connection's (client_recover) */
		if (s->epoch == s->c->epoch)
			client_release_many(s->c, sealed, ns, open, no);
	}
	free(sealed);
	free(open);
	seq_drop_pending(s);
	free(s->tokens);
	free(s->sealed);
	free(s->open);
	free(s->resv);
	free(s->c_sealed);
	free(s->c_open);
	free(s->c_resv);
	free(s->written);
	free(s);
}

kvq_client *kvq_seq_client(const kvq_seq *s)
{
	return s ? s->c : NULL;
}

uint32_t kvq_seq_tokens(const kvq_seq *s)
{
	return s ? s->n : 0;
}

int kvq_seq_blocks(const kvq_seq *s, const int32_t **ret_sealed, uint32_t *ret_n_sealed, const int32_t **ret_open,
		   uint32_t *ret_n_open)
{
	if (!s)
		return -EINVAL;
	if (ret_sealed)
		*ret_sealed = s->sealed;
	if (ret_n_sealed)
		*ret_n_sealed = s->n_sealed;
	if (ret_open)
		*ret_open = s->open;
	if (ret_n_open)
		*ret_n_open = s->n_open;
	return 0;
}

int kvq_seq_set_request(kvq_seq *s, const void *id, size_t len)
{
	if (!s || len > KVQ_PROTO_MAX_REQUEST_ID || (len && !id))
		return -EINVAL;
	if (len)
		memcpy(s->rid, id, len);
	s->rid_len = len;
	return 0;
}

int seq_take_hit(kvq_seq *s, const uint32_t *tokens, const uint32_t *ids, uint32_t got)
{
	uint32_t hit = got * s->c->L->block_tokens;
	int32_t *sl;
	int r;

	if (!got)
		return 0;
	if ((r = seq_reserve_tokens(s, hit)) < 0)
		return r;
	if (!(sl = realloc(s->sealed, got * sizeof(*sl))))
		return -ENOMEM;
	s->sealed = sl;
	for (uint32_t i = 0; i < got; i++)
		s->sealed[i] = (int32_t)ids[i];
	s->n_sealed = s->n_pub = got;
	memcpy(s->tokens, tokens, hit * sizeof(*tokens));
	s->n = hit;
	return 0;
}

void seq_untake_hit(kvq_seq *s)
{
	s->n = s->n_sealed = s->n_pub = 0;
}

int kvq_seq_from_prompt(kvq_seq *s, const uint32_t *tokens, uint32_t n, uint32_t *ret_hit)
{
	const struct kvq_layout *L;
	struct client_prompt p = { 0 };
	int r;

	if (!s || (n && !tokens) || !ret_hit)
		return -EINVAL;
	if (n > KVQ_PROTO_MAX_TOKENS)
		return client_fail(s->c, -E2BIG, "a prompt of %u tokens is over the lookup limit", n);
	if ((r = seq_live(s)) < 0)
		return r;
	if (s->n || s->busy)
		return client_fail(s->c, -EBUSY, "from_prompt on a sequence that is not empty");
	L = s->c->L;
	p.max_tokens = seq_lookup_max(L, n);
	if (p.max_tokens == 0) {
		*ret_hit = 0;
		return 0;
	}
	p.tokens = tokens;
	p.n_tokens = n;
	p.salt = s->salt;
	p.salt_len = s->salt_len;
	p.rid = s->rid;
	p.rid_len = s->rid_len;
	if (!(p.ret_ids = malloc((size_t)(p.max_tokens / L->block_tokens) * sizeof(*p.ret_ids))))
		return -ENOMEM;
	r = client_lookup_many(s->c, &p, 1, NULL);
	if (r == 0 && (r = seq_take_hit(s, tokens, p.ret_ids, p.ret_n)) < 0)
		kvq_client_release(s->c, p.ret_n, p.ret_ids, 0, NULL);
	free(p.ret_ids);
	if (r == 0)
		*ret_hit = p.ret_n * L->block_tokens;
	return r;
}

int seq_step_plan(kvq_seq *s, uint32_t m, struct seq_need *need)
{
	const struct kvq_layout *L = s->c->L;
	const uint32_t B = L->block_tokens;
	uint32_t N, s1, nb_old, nb_new;
	bool sinks;
	int r;

	*need = (struct seq_need){ 0 };
	if ((r = seq_live(s)) < 0)
		return r;
	if (!m)
		return client_fail(s->c, -EINVAL, "a step of no tokens");
	if (s->busy)
		return client_fail(s->c, -EBUSY, "a write is in progress (commit first)");
	if (s->n > UINT32_MAX - B - m)
		return -EINVAL;
	N = s->n + m;
	s1 = kvq_layout_split(L, N) / B;
	if (s1 < s->n_sealed)
		return client_fail(s->c, -EINVAL,
				   "appending %u tokens would unseal the cached prefix: append the whole prompt", m);
	nb_old = s->n_sealed + s->n_open;
	nb_new = (N + B - 1) / B;
	/* a pool with sink blocks keeps block 0 in a sink slot from its first token */
	sinks = L->n_sink > 0;
	for (uint32_t b = nb_old; b < nb_new; b++) {
		if (b == 0 && sinks)
			need->sink++;
		else if (b < s1)
			need->sealed++;
		else
			need->open++;
	}
	if (need->open + need->sealed + need->sink > KVQ_PROTO_MAX_IDS)
		return client_fail(s->c, -E2BIG, "%u tokens need more than %u blocks in one step", m,
				   KVQ_PROTO_MAX_IDS);
	if (seq_reserve_tokens(s, N) < 0)
		return -ENOMEM;
	s->p_sealed = calloc(s1 + 1, sizeof(int32_t));
	s->p_open = calloc(nb_new - s->n_sealed + 1, sizeof(int32_t));
	s->p_resv = calloc(nb_new - s->n_sealed + 1, sizeof(int32_t));
	if (!s->p_sealed || !s->p_open || !s->p_resv) {
		seq_drop_pending(s);
		return -ENOMEM;
	}
	return 0;
}

void seq_step_drop(kvq_seq *s)
{
	seq_drop_pending(s);
}

void seq_step_take(kvq_seq *s, const uint32_t *tokens, uint32_t m, const uint32_t **ao, const uint32_t **ar,
		   const uint32_t **as, const uint32_t **ak)
{
	const struct kvq_layout *L = s->c->L;
	const uint32_t B = L->block_tokens, N = s->n + m, s1 = kvq_layout_split(L, N) / B;
	const uint32_t nb_old = s->n_sealed + s->n_open, nb_new = (N + B - 1) / B;
	const bool sinks = L->n_sink > 0;

	/* the table after the write: blocks < s1 sealed, the rest open */
	for (uint32_t b = 0; b < s->n_sealed; b++)
		s->p_sealed[b] = s->sealed[b];
	for (uint32_t b = s->n_sealed; b < nb_new; b++) {
		uint32_t j = b - s->n_sealed;

		if (b < nb_old) {
			s->p_open[j] = s->open[j];
			s->p_resv[j] = s->resv[j];
			if (b < s1)   /* sealed into its reservation; a sink stays where it is */
				s->p_sealed[b] = client_entry_is_sink(s->open[j]) ? s->open[j] : s->resv[j];
		} else if (b == 0 && sinks) {
			const int32_t sk = (int32_t)*(*ak)++;

			s->p_open[j] = b < s1 ? -1 : sk;
			s->p_resv[j] = -1;
			if (b < s1)
				s->p_sealed[b] = sk;
		} else if (b < s1) {
			s->p_open[j] = -1;                  /* straight from the input */
			s->p_resv[j] = -1;
			s->p_sealed[b] = (int32_t)*(*as)++;
		} else {
			s->p_open[j] = (int32_t)*(*ao)++;
			s->p_resv[j] = (int32_t)*(*ar)++;
		}
	}
	s->p_n_sealed = s1;
	s->p_n_open = nb_new - s->n_sealed;
	memcpy(s->tokens + s->n, tokens, (size_t)m * sizeof(*tokens));
	s->m = m;
	memset(s->written, 0, s->c->L->layers);
	s->busy = true;
}

int kvq_seq_begin(kvq_seq *s, const uint32_t *tokens, uint32_t m)
{
	struct batch_entry e;

	if (!s || !tokens || !m)
		return -EINVAL;
	e = (struct batch_entry){ .s = s, .tokens = tokens, .m = m };
	return batch_step_begin(s->c, &e, 1, NULL, NULL);
}

void seq_write_table(const kvq_seq *s, struct kvq_seq_table *w, uint32_t *ns, uint32_t *no)
{
	const uint32_t B = s->c->L->block_tokens;

	*w = (struct kvq_seq_table){ 0 };
	/* shifted past the committed sealed prefix (see struct kvq_seq) */
	w->n = s->n - s->n_sealed * B;
	w->m = s->m;
	w->sealed = s->p_sealed + s->n_sealed;
	w->open = s->p_open;
	/* the table starts at block 0 only while nothing is sealed */
	w->sink = s->n_sealed ? 0 : table_sink(s->p_sealed, s->p_n_sealed, s->p_open, s->p_n_open);
	*ns = s->p_n_sealed - s->n_sealed;
	*no = s->p_n_open;
}

/* A batch of one over the sequence's own tables. */
static struct client_tables *seq_tables(kvq_seq *s)
{
	if (!s->tabs && !(s->tabs = calloc(1, sizeof(*s->tabs))))
		return NULL;
	return client_tables_reserve(s->tabs, 1) < 0 ? NULL : s->tabs;
}

int kvq_seq_write(kvq_seq *s, uint32_t layer, const void *k, const void *v)
{
	struct client_tables *t;
	struct kvq_seq_table w;
	uint32_t ns, no;
	int r;

	if (!s || !k || !v)
		return -EINVAL;
	if ((r = seq_live(s)) < 0)
		return r;
	if (!s->busy || layer >= s->c->L->layers)
		return client_fail(s->c, -EINVAL, "write without begin, or layer %u out of range", layer);
	if (!(t = seq_tables(s)))
		return -ENOMEM;
	seq_write_table(s, &w, &ns, &no);
	client_tables_set(t, 0, &w, ns, no);
	if ((r = s->c->be->write(s->c, t, layer, k, v)) < 0)
		return r;
	s->written[layer] = 1;
	return 0;
}

int seq_commit_check(kvq_seq *s)
{
	int r;

	if ((r = seq_live(s)) < 0)
		return r;
	if (!s->busy)
		return client_fail(s->c, -EINVAL, "commit without begin");
	for (uint32_t l = 0; l < s->c->L->layers; l++)
		if (!s->written[l])
			return client_fail(s->c, -EINVAL, "commit before layer %u was written", l);
	return 0;
}

int seq_commit_prepare(kvq_seq *s)
{
	free(s->c_sealed);
	free(s->c_open);
	free(s->c_resv);
	s->c_sealed = calloc(s->p_n_sealed + 1, sizeof(int32_t));
	s->c_open = calloc(s->p_n_open + 1, sizeof(int32_t));
	s->c_resv = calloc(s->p_n_open + 1, sizeof(int32_t));
	return s->c_sealed && s->c_open && s->c_resv ? 0 : -ENOMEM;
}

uint32_t seq_seal_pairs(const kvq_seq *s, uint32_t *so, uint32_t *ss)
{
	const uint32_t nb_old = s->n_sealed + s->n_open;
	uint32_t n = 0;

	for (uint32_t b = s->n_sealed; b < nb_old && b < s->p_n_sealed; b++) {
		if (client_entry_is_sink(s->open[b - s->n_sealed]))
			continue;   /* a sink block is never sealed: it is a block already */
		so[n] = (uint32_t)s->open[b - s->n_sealed];
		ss[n++] = (uint32_t)s->resv[b - s->n_sealed];
	}
	return n;
}

uint32_t seq_publish_count(const kvq_seq *s)
{
	return s->p_n_sealed - s->n_pub;
}

void seq_chain(kvq_seq *s, struct client_chain *ch, uint32_t *ids, uint32_t *ret_ids)
{
	const uint32_t np = seq_publish_count(s);

	for (uint32_t i = 0; i < np; i++)
		ids[i] = (uint32_t)s->p_sealed[s->n_pub + i];
	*ch = (struct client_chain){ .ids = ids, .n = np, .parent = s->n_pub ? s->p_sealed[s->n_pub - 1] : -1,
		.tokens = s->tokens + (size_t)s->n_pub * s->c->L->block_tokens,
		.salt = s->salt_len ? s->salt : NULL, .salt_len = s->salt_len, .ret_ids = ret_ids };
}

void seq_commit_published(kvq_seq *s, const struct client_chain *ch)
{
	int32_t *to = s->busy ? s->p_sealed : s->sealed;

	if (!ch->published)
		return;
	/* a duplicate of a cached block: use the cached one from now on */
	for (uint32_t i = 0; i < ch->n; i++)
		to[s->n_pub + i] = (int32_t)ch->ret_ids[i];
	s->n_pub += ch->n;
}

void seq_commit_adopt(kvq_seq *s)
{
	const uint32_t s1 = s->p_n_sealed;
	uint32_t no = 0;

	/* the new table: sealed grows to s1, open is what is left */
	memcpy(s->c_sealed, s->p_sealed, s1 * sizeof(int32_t));
	for (uint32_t b = s1; b < s->n_sealed + s->p_n_open; b++) {
		s->c_open[no] = s->p_open[b - s->n_sealed];
		s->c_resv[no++] = s->p_resv[b - s->n_sealed];
	}
	free(s->sealed);
	free(s->open);
	free(s->resv);
	s->sealed = s->c_sealed;
	s->open = s->c_open;
	s->resv = s->c_resv;
	s->c_sealed = s->c_open = s->c_resv = NULL;
	s->n_open = no;
	s->n_sealed = s1;
	s->n += s->m;
	seq_drop_pending(s);
}

int kvq_seq_commit(kvq_seq *s)
{
	struct batch_entry e;

	if (!s)
		return -EINVAL;
	e = (struct batch_entry){ .s = s, .m = s->m };
	return batch_step_commit(s->c, &e, 1, NULL);
}

int seq_attn_table(kvq_seq *s, uint32_t q_heads, uint32_t n_q, struct kvq_seq_table *as, uint32_t *ns,
		   uint32_t *no)
{
	const struct kvq_layout *L = s->c->L;

	*as = (struct kvq_seq_table){ .m = n_q };   /* its queries are rows 0 .. n_q - 1 */
	if (s->busy) {
		as->n = s->n + s->m;
		as->sealed = s->p_sealed;
		as->open = s->p_open + (s->p_n_sealed - s->n_sealed);
		*ns = s->p_n_sealed;
		*no = s->p_n_open - (s->p_n_sealed - s->n_sealed);
	} else {
		/* right after from_prompt the table has no open window: the
		 * kernel's split would not match it */
		if (s->n_sealed * L->block_tokens != kvq_layout_split(L, s->n))
			return client_fail(s->c, -EINVAL, "attention needs the rest of the prompt appended first");
		as->n = s->n;
		as->sealed = s->sealed;
		as->open = s->open;
		*ns = s->n_sealed;
		*no = s->n_open;
	}
	as->sink = table_sink(as->sealed, *ns, as->open, *no);
	if (!n_q || n_q > as->n || !q_heads || q_heads % L->kv_heads)
		return client_fail(s->c, -EINVAL, "attention: bad query counts");
	return 0;
}

float seq_scale(const kvq_client *c, float scale)
{
	return scale > 0 ? scale : 1.0f / sqrtf((float)c->L->head_dim);
}

/* The sequence's attention table for layer, as a batch of one. */
static int seq_attn_tables(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, struct client_tables **ret)
{
	struct kvq_seq_table as;
	uint32_t ns, no;
	int r;

	if (layer >= s->c->L->layers)
		return -EINVAL;
	if ((r = seq_live(s)) < 0)
		return r;
	if (s->busy && !s->written[layer])
		return client_fail(s->c, -EINVAL, "attention on layer %u before its write", layer);
	if ((r = seq_attn_table(s, q_heads, n_q, &as, &ns, &no)) < 0)
		return r;
	if (!(*ret = seq_tables(s)))
		return -ENOMEM;
	client_tables_set(*ret, 0, &as, ns, no);
	return 0;
}

int kvq_seq_attention(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale, const float *q,
		      float *out)
{
	struct client_tables *t;
	int r;

	if (!s || !q || !out)
		return -EINVAL;
	if ((r = seq_attn_tables(s, layer, q_heads, n_q, &t)) < 0)
		return r;
	return s->c->be->attention(s->c, t, layer, q_heads, seq_scale(s->c, scale), q, out);
}

int kvq_seq_attention_device(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale,
			     const void *q, void *out, int out_f32)
{
	struct client_tables *t;
	int r;

	if (!s || !q || !out)
		return -EINVAL;
	if ((r = seq_live(s)) < 0)
		return r;
	if (!s->c->be->attention_device)
		return client_fail(s->c, -ENOTSUP, "attention on device memory needs a cuda pool%s",
				   client_cuda.compiled ? "" : " (libkvq built without CUDA)");
	if ((r = seq_attn_tables(s, layer, q_heads, n_q, &t)) < 0)
		return r;
	return s->c->be->attention_device(s->c, t, layer, q_heads, seq_scale(s->c, scale), q, out, out_f32 != 0);
}

int kvq_seq_fork(kvq_seq *s, kvq_seq **ret_seq)
{
	const struct kvq_layout *L;
	kvq_seq *f = NULL;
	uint32_t *ids = NULL, *ao = NULL, *ar = NULL, sk = 0, k;
	bool forked = false, opened = false;
	int r;

	if (!s || !ret_seq)
		return -EINVAL;
	if ((r = seq_live(s)) < 0)
		return r;
	if (s->busy)
		return client_fail(s->c, -EBUSY, "fork during a write");
	L = s->c->L;
	r = kvq_seq_new(s->c, s->salt, s->salt_len, &f);
	if (r < 0)
		return r;
	ids = calloc(s->n_sealed + 1, sizeof(*ids));
	ao = calloc(s->n_open + 1, sizeof(*ao));
	ar = calloc(s->n_open + 1, sizeof(*ar));
	f->sealed = calloc(s->n_sealed + 1, sizeof(int32_t));
	f->open = calloc(s->n_open + 1, sizeof(int32_t));
	f->resv = calloc(s->n_open + 1, sizeof(int32_t));
	if (!ids || !ao || !ar || !f->sealed || !f->open || !f->resv || seq_reserve_tokens(f, s->n ? s->n : 1) < 0) {
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < s->n_sealed; i++)
		ids[i] = (uint32_t)s->sealed[i];
	if (s->n_sealed) {
		r = kvq_client_fork(s->c, s->n_sealed, ids);
		if (r < 0)
			goto out;
		forked = true;
	}
	/* a sink block still in the window is still written: copied as open ones are */
	k = s->n_open && client_entry_is_sink(s->open[0]) ? 1 : 0;
	if (s->n_open) {
		r = client_alloc(s->c, s->n_open - k, 0, k, ao, ar, NULL, &sk);
		if (r < 0)
			goto out;
		opened = true;
	}
	for (uint32_t i = 0; i < s->n_open; i++) {
		const bool sink = i < k;
		const uint32_t to_id = sink ? client_block_ref(sk).index : ao[i - k];
		const uint32_t from_id = sink ? client_block_ref((uint32_t)s->open[i]).index : (uint32_t)s->open[i];

		for (uint32_t l = 0; l < L->layers; l++) {
			uint8_t *b = s->c->base;
			/* an open (or sink) slice is contiguous over all heads */
			uint8_t *to = b + kvq_layout_off(L, sink ? KVQ_SINK : KVQ_OPEN, to_id, l, 0, KVQ_K_CODES);
			const uint8_t *from = b + kvq_layout_off(L, sink ? KVQ_SINK : KVQ_OPEN, from_id, l, 0, KVQ_K_CODES);

			if ((r = s->c->be->copy(s->c, to, from, L->layer[l].open_slice)) < 0)
				goto out;
		}
		f->open[i] = sink ? (int32_t)sk : (int32_t)ao[i - k];
		f->resv[i] = sink ? -1 : (int32_t)ar[i - k];
	}
	memcpy(f->sealed, s->sealed, s->n_sealed * sizeof(int32_t));
	f->n_sealed = s->n_sealed;
	f->n_pub = s->n_pub;
	f->n_open = s->n_open;
	if (s->n)
		memcpy(f->tokens, s->tokens, (size_t)s->n * sizeof(*f->tokens));
	f->n = s->n;
	*ret_seq = f;
	f = NULL;
	r = 0;
out:
	if (f) {
		/* undo what the daemon granted; kvq_seq_free releases f's table */
		if (opened)
			s->c->be->drain(s->c);   /* copies into ao may be in flight */
		if (forked)
			kvq_client_release(s->c, s->n_sealed, ids, 0, NULL);
		if (opened)
			kvq_client_release(s->c, k, &sk, s->n_open - k, ao);
		kvq_seq_free(f);
	}
	free(ids);
	free(ao);
	free(ar);
	return r;
}
