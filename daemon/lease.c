/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "lease.h"

/* Linear probing, backward-shift deletion (no tombstones, so a long-lived
 * lease with churn never degrades).  A count of 0 marks an empty cell. */
struct idmap {
	uint32_t *key;
	uint32_t *cnt;
	uint32_t cap;   /* power of two, or 0 */
	uint32_t n;
};

struct kvq_lease {
	struct idmap sealed, open;
	uint32_t first_sink;   /* sealed ids from here are sink blocks (UINT32_MAX: none) */
	uint32_t n_sink;       /* distinct ones held */
	uint16_t tag;          /* its holds' owner tag in the pool (kvq_lease_set_tag) */
};

static uint32_t idmap_hash(uint32_t k)
{
	k ^= k >> 16;
	k *= 0x7feb352du;
	k ^= k >> 15;
	k *= 0x846ca68bu;
	k ^= k >> 16;
	return k;
}

static uint32_t *idmap_find(const struct idmap *m, uint32_t key)
{
	if (!m->cap)
		return NULL;
	for (uint32_t i = idmap_hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (!m->cnt[i])
			return NULL;
		if (m->key[i] == key)
			return &m->cnt[i];
	}
}

static void idmap_put_raw(struct idmap *m, uint32_t key, uint32_t cnt)
{
	uint32_t i = idmap_hash(key) & (m->cap - 1);

	while (m->cnt[i])
		i = (i + 1) & (m->cap - 1);
	m->key[i] = key;
	m->cnt[i] = cnt;
	m->n++;
}

/* Room for n more entries at a load of at most 1/2. */
static int idmap_reserve(struct idmap *m, uint32_t more)
{
	uint64_t need = ((uint64_t)m->n + more) * 2;
	uint32_t cap = m->cap ? m->cap : 16;
	struct idmap g = { 0 };

	if (need <= m->cap)
		return 0;
	while (cap < need) {
		if (cap >= (1u << 31))
			return -ENOMEM;
		cap *= 2;
	}
	g.key = calloc(cap, sizeof(*g.key));
	g.cnt = calloc(cap, sizeof(*g.cnt));
	if (!g.key || !g.cnt) {
		free(g.key);
		free(g.cnt);
		return -ENOMEM;
	}
	g.cap = cap;
	for (uint32_t i = 0; i < m->cap; i++)
		if (m->cnt[i])
			idmap_put_raw(&g, m->key[i], m->cnt[i]);
	free(m->key);
	free(m->cnt);
	*m = g;
	return 0;
}

static void idmap_remove(struct idmap *m, uint32_t *slot)
{
	uint32_t mask = m->cap - 1, i = (uint32_t)(slot - m->cnt), j = i;

	m->cnt[i] = 0;
	m->n--;
	for (;;) {
		uint32_t h;

		j = (j + 1) & mask;
		if (!m->cnt[j])
			return;
		h = idmap_hash(m->key[j]) & mask;
		/* move j back into the hole at i unless its home lies in (i, j] */
		if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
			m->key[i] = m->key[j];
			m->cnt[i] = m->cnt[j];
			m->cnt[j] = 0;
			i = j;
		}
	}
}

static void idmap_fini(struct idmap *m)
{
	free(m->key);
	free(m->cnt);
}

static int idmap_next(const struct idmap *m, uint32_t *pos, uint32_t *ret_key, uint32_t *ret_cnt)
{
	for (; *pos < m->cap; (*pos)++)
		if (m->cnt[*pos]) {
			*ret_key = m->key[*pos];
			*ret_cnt = m->cnt[*pos];
			(*pos)++;
			return 1;
		}
	return 0;
}

int kvq_lease_new(kvq_lease **ret)
{
	kvq_lease *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->first_sink = UINT32_MAX;
	*ret = l;
	return 0;
}

void kvq_lease_free(kvq_lease *l)
{
	if (!l)
		return;
	idmap_fini(&l->sealed);
	idmap_fini(&l->open);
	free(l);
}

int kvq_lease_reserve(kvq_lease *l, uint32_t n_sealed, uint32_t n_open)
{
	int r = idmap_reserve(&l->sealed, n_sealed);

	return r < 0 ? r : idmap_reserve(&l->open, n_open);
}

uint32_t kvq_lease_sealed(const kvq_lease *l, uint32_t id)
{
	const uint32_t *c = idmap_find(&l->sealed, id);

	return c ? *c : 0;
}

int kvq_lease_sealed_add(kvq_lease *l, uint32_t id, uint32_t n)
{
	uint32_t *c = idmap_find(&l->sealed, id);
	int r;

	if (c) {
		if (*c > UINT32_MAX - n)
			return -EOVERFLOW;
		*c += n;
		return 0;
	}
	if (!n)
		return 0;
	r = idmap_reserve(&l->sealed, 1);
	if (r < 0)
		return r;
	idmap_put_raw(&l->sealed, id, n);
	l->n_sink += id >= l->first_sink;
	return 1;
}

int kvq_lease_sealed_sub(kvq_lease *l, uint32_t id, uint32_t n)
{
	uint32_t *c = idmap_find(&l->sealed, id);

	if (!n)
		return 0;
	if (!c || *c < n)
		return -EINVAL;
	if (*c > n) {
		*c -= n;
		return 0;
	}
	idmap_remove(&l->sealed, c);
	l->n_sink -= id >= l->first_sink;
	return 1;
}

int kvq_lease_open_has(const kvq_lease *l, uint32_t id)
{
	return idmap_find(&l->open, id) != NULL;
}

int kvq_lease_open_add(kvq_lease *l, uint32_t id)
{
	int r;

	if (idmap_find(&l->open, id))
		return -EEXIST;
	r = idmap_reserve(&l->open, 1);
	if (r < 0)
		return r;
	idmap_put_raw(&l->open, id, 1);
	return 0;
}

int kvq_lease_open_del(kvq_lease *l, uint32_t id)
{
	uint32_t *c = idmap_find(&l->open, id);

	if (!c)
		return -ENOENT;
	idmap_remove(&l->open, c);
	return 0;
}

uint32_t kvq_lease_n_sealed(const kvq_lease *l)
{
	return l->sealed.n;
}

uint32_t kvq_lease_n_open(const kvq_lease *l)
{
	return l->open.n;
}

void kvq_lease_set_first_sink(kvq_lease *l, uint32_t first)
{
	l->first_sink = first;
}

uint32_t kvq_lease_n_sink(const kvq_lease *l)
{
	return l->n_sink;
}

int kvq_lease_next_sealed(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id, uint32_t *ret_count)
{
	return idmap_next(&l->sealed, pos, ret_id, ret_count);
}

int kvq_lease_next_open(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id)
{
	uint32_t c;

	return idmap_next(&l->open, pos, ret_id, &c);
}

/* The pool's side of taking a hold. */
static int pool_take(kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n)
{
	int r;

	if (how != KVQ_LEASE_REF)
		return 0;   /* the pool counted it when it granted the slot */
	for (uint32_t k = 0; k < n; k++) {
		r = kvq_pool_ref(p, id);
		if (r < 0) {
			while (k--)
				kvq_pool_unref(p, id);
			return r;
		}
	}
	return 0;
}

/* The pool's side of giving a hold back; stops at the pool's first refusal. */
static int pool_give(kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n)
{
	uint32_t sealed;
	int r;

	switch (how) {
	case KVQ_LEASE_OPEN:
		return kvq_pool_release_open(p, id);
	case KVQ_LEASE_SEALING:
		return kvq_pool_seal(p, id, &sealed);
	default:
		for (uint32_t k = 0; k < n; k++) {
			r = kvq_pool_unref(p, id);
			if (r < 0)
				return r;
		}
		return 0;
	}
}

static bool is_open(enum kvq_lease_hold how)
{
	return how == KVQ_LEASE_OPEN || how == KVQ_LEASE_SEALING;
}

int kvq_lease_take(kvq_lease *l, kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n)
{
	int r;

	if (how == KVQ_LEASE_SEALING)
		return -EINVAL;
	r = pool_take(p, how, id, n);
	if (r < 0)
		return r;
	r = is_open(how) ? kvq_lease_open_add(l, id) : kvq_lease_sealed_add(l, id, n);
	if (r < 0) {
		if (how == KVQ_LEASE_REF)
			pool_give(p, how, id, n);
		return r;
	}
	if (is_open(how))
		kvq_pool_open_owner(p, id, l->tag);
	else
		kvq_pool_owner(p, id, l->tag);
	return 0;
}

void kvq_lease_set_tag(kvq_lease *l, uint16_t tag)
{
	l->tag = tag;
}

int kvq_lease_give(kvq_lease *l, kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n)
{
	int r = is_open(how) ? kvq_lease_open_del(l, id) : kvq_lease_sealed_sub(l, id, n);

	if (r < 0)
		return r;
	return pool_give(p, how, id, n);
}

void kvq_lease_drop(kvq_lease *l, kvq_pool *p, struct kvq_lease_dropped *ret)
{
	struct kvq_lease_dropped d = { 0 };

	/* the maps are walked, not changed, and freed whole afterwards */
	for (uint32_t i = 0; l && i < l->open.cap; i++)
		if (l->open.cnt[i]) {
			d.open++;
			d.open_refused += pool_give(p, KVQ_LEASE_OPEN, l->open.key[i], 1) < 0;
		}
	for (uint32_t i = 0; l && i < l->sealed.cap; i++)
		if (l->sealed.cnt[i]) {
			d.sealed++;
			d.sealed_refused += pool_give(p, KVQ_LEASE_REF, l->sealed.key[i], l->sealed.cnt[i]) < 0;
		}
	kvq_lease_free(l);
	if (ret)
		*ret = d;
}
