/* SPDX-License-Identifier: Apache-2.0 */
/* A tensor-parallel group's fetch from the remote tier: group_fetch.h. */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "group_fetch.h"
#include "rtier.h"
#include "tiering.h"

struct kvq_group_fetch {
	struct kvq_pools_rec **m;
	uint32_t world, n, end;               /* blocks [n, end) asked, of the chain from its first */
	uint32_t *tok;                        /* the chain's tokens, end * B */
	uint8_t salt[KVQ_PREFIX_MAX_SALT];
	size_t salt_len;
	uint8_t (*chain)[KVQ_CHAINKEY_LEN];   /* per member, per block: its remote chain key */
	struct kvq_rtier_fetch **rf;          /* per member; NULL: its GETs all failed */
	uint32_t pending;                     /* members whose GETs are out */
	void (*done)(void *arg);
	void *arg;
	uint32_t *held;                       /* per member, end ids: its chain, the fetch's references */
	uint32_t *nheld;                      /* per member */
	struct kvq_rtier_get **got;           /* per member: its fetch's gets, while placing */
};

bool kvq_group_fetch_wanted(struct kvq_pools_rec *const *m, uint32_t world, const uint32_t *tokens, uint32_t n,
			    uint32_t end, const void *salt, size_t salt_len)
{
	const uint32_t B = m[0] ? m[0]->L->block_tokens : 1;
	uint8_t key[KVQ_PREFIX_KEY_LEN], parent[KVQ_PREFIX_KEY_LEN];

	if (end <= n || salt_len > KVQ_PREFIX_MAX_SALT || salt_len > KVQ_CHAINKEY_MAX_SALT)
		return false;
	for (uint32_t r = 0; r < world; r++)
		if (!m[r] || !m[r]->rtier)
			return false;
	/* block n's key, in the group's namespace (every member's) */
	for (uint32_t k = 0; k <= n; k++)
		if (kvq_prefix_chain_key(m[0]->prefix, k ? parent : NULL, tokens + (size_t)k * B, salt, salt_len, key) < 0)
			return false;
		else
			memcpy(parent, key, sizeof key);
	for (uint32_t r = 0; r < world; r++)
		if (m[r]->tiering && kvq_tiering_find(m[r]->tiering, key) >= 0)
			return false;
	return true;
}

static uint8_t *chain_at(struct kvq_group_fetch *f, uint32_t r, uint32_t k)
{
	return f->chain[(size_t)r * f->end + k];
}

static void member_done(void *arg)
{
	struct kvq_group_fetch *f = arg;

	if (--f->pending == 0)
		f->done(f->arg);
}

int kvq_group_fetch_start(struct kvq_pools_rec *const *m, uint32_t world, const uint32_t *tokens, uint32_t n,
			  uint32_t end, const void *salt, size_t salt_len, void (*done)(void *arg), void *arg,
			  struct kvq_group_fetch **ret)
{
	const uint32_t B = m[0]->L->block_tokens;
	struct kvq_group_fetch *f = calloc(1, sizeof *f);
	struct kvq_rtier_get *g = calloc((size_t)(end - n) + 1, sizeof *g);

	if (end - n > KVQ_RTIER_FETCH_MAX)
		end = n + KVQ_RTIER_FETCH_MAX;
	if (!f || !g || !(f->m = calloc(world, sizeof *f->m)) || !(f->rf = calloc(world, sizeof *f->rf)) ||
	    !(f->nheld = calloc(world, sizeof *f->nheld)) || !(f->got = calloc(world, sizeof *f->got)) ||
	    !(f->tok = malloc((size_t)end * B * sizeof *f->tok + 1)) ||
	    !(f->chain = calloc((size_t)world * end + 1, sizeof *f->chain)) ||
	    !(f->held = calloc((size_t)world * end + 1, sizeof *f->held))) {
		free(g);
		kvq_group_fetch_end(f);
		return -ENOMEM;
	}
	memcpy(f->m, m, world * sizeof *m);
	f->world = world;
	f->n = n;
	f->end = end;
	memcpy(f->tok, tokens, (size_t)end * B * sizeof *f->tok);
	if (salt_len)
		memcpy(f->salt, salt, salt_len);
	f->salt_len = salt_len;
	f->done = done;
	f->arg = arg;
	/* each member its own rank's keys, all sent in this turn of the loop */
	for (uint32_t r = 0; r < world; r++) {
		uint32_t k = 0;

		for (; k < end; k++) {
			if (kvq_rtier_chain(m[r]->rtier, k ? chain_at(f, r, k - 1) : NULL, f->tok + (size_t)k * B, f->salt,
					    f->salt_len, chain_at(f, r, k)) < 0)
				break;
			if (k >= n) {
				memcpy(g[k - n].chain, chain_at(f, r, k), KVQ_CHAINKEY_LEN);
				/* a chain's first block takes a sink slot (daemon/prefix.h) */
				g[k - n].sink = k == 0 && m[r]->L->n_sink;
			}
		}
		if (k == end && kvq_rtier_fetch(m[r]->rtier, g, end - n, member_done, f, &f->rf[r]) == 0) {
			f->pending++;
		} else if (f->rf[r]) {
			kvq_rtier_fetch_end(f->rf[r]);
			f->rf[r] = NULL;
		}
	}
	free(g);
	if (!f->pending) {
		kvq_group_fetch_end(f);
		return -ENOENT;
	}
	*ret = f;
	return 0;
}

/* Block k of the chain into member r: the slot its fetch unpacked the
 * verified record into, published after the member's block k - 1
 * (kvq_rtier_place), held by the group's fetch.  true when it is in
 * place. */
static bool place_one(struct kvq_group_fetch *f, uint32_t r, uint32_t k, struct kvq_rtier_get *rec)
{
	struct kvq_pools_rec *p = f->m[r];
	uint32_t *held = f->held + (size_t)r * f->end, got;
	int32_t parent = k ? (int32_t)held[k - 1] : -1;

	if (kvq_rtier_place(p->rtier, rec, parent, f->tok + (size_t)k * p->L->block_tokens, f->salt, f->salt_len,
			    &got) < 0)
		return false;
	held[f->nheld[r]++] = got;
	return true;
}

uint32_t kvq_group_fetch_place(struct kvq_group_fetch *f)
{
	struct kvq_rtier_get **g = f->got;
	const uint32_t B = f->m[0]->L->block_tokens;
	uint32_t k = f->n;

	/* every member's hit held first: the placements' allocations may evict */
	for (uint32_t r = 0; r < f->world; r++) {
		struct kvq_pools_rec *p = f->m[r];
		uint32_t *held = f->held + (size_t)r * f->end;

		if (!f->rf[r] || kvq_prefix_lookup(p->prefix, f->tok, f->n * B, f->n * B, f->salt, f->salt_len, held, f->n,
						   &f->nheld[r]) < 0 || f->nheld[r] < f->n)
			return 0;
		for (uint32_t i = 0; i < f->n; i++)
			kvq_rtier_learn(p->rtier, held[i], chain_at(f, r, i));
		g[r] = kvq_rtier_fetch_gets(f->rf[r]);
	}
	/* a block in every member only when every rank's record came */
	for (; k < f->end; k++) {
		bool all = true;

		for (uint32_t r = 0; r < f->world && all; r++)
			all = g[r][k - f->n].slot != UINT32_MAX;
		for (uint32_t r = 0; r < f->world && all; r++)
			all = place_one(f, r, k, &g[r][k - f->n]);
		if (!all)
			break;
	}
	return k - f->n;
}

void kvq_group_fetch_end(struct kvq_group_fetch *f)
{
	if (!f)
		return;
	for (uint32_t r = 0; r < f->world; r++) {
		kvq_rtier_fetch_end(f->rf[r]);
		for (uint32_t i = 0; f->held && i < f->nheld[r]; i++)
			kvq_pool_unref(f->m[r]->pool, f->held[(size_t)r * f->end + i]);
	}
	free(f->m);
	free(f->rf);
	free(f->nheld);
	free(f->got);
	free(f->tok);
	free(f->chain);
	free(f->held);
	free(f);
}
