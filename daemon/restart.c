/* SPDX-License-Identifier: Apache-2.0 */
/* A restart that keeps the warm cache: what pools leave, what the next kvqd takes back (restart.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "procs.h"
#include "restart.h"

struct kvq_restart_found {
	kvq_books *b;
	uint32_t serial;
};

struct kvq_restart_unread {
	char name[sizeof(((struct kvq_books_id *)0)->name)];
	char why[sizeof(((struct kvq_restart_pool *)0)->cold)];
};

struct kvq_restart_plan {
	kvq_books *b;
	uint32_t serial;
	int mem_fd, tier_fd;
	uint64_t mem_size;
	uint8_t *adopt;                   /* per block: enum kvq_pool_adopt */
	uint32_t *open;                   /* per open slot: its reserved id, UINT32_MAX free */
	uint32_t *order, n_order;         /* the cached blocks, each after its parent */
	struct kvq_restart_holds *holds;  /* NULL: nobody alive to hold for */
	int32_t *entry_pid;               /* per books client entry: its index in holds->pids, or -1 */
	int32_t *who, *open_who;          /* per block, per open slot: for whom it is held (holds.h), -2 not */
	uint64_t t0;
};

static uint64_t now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static void name_of(char *buf, size_t len, const char *what, uint32_t serial)
{
	snprintf(buf, len, "kvq.%s.%u", what, serial);
}

static int take(const struct kvq_restart *rs, const char *what, uint32_t serial)
{
	char name[64];

	name_of(name, sizeof name, what, serial);
	return rs->keep ? rs->keep->take(rs->keep->arg, name) : -1;
}

/* The descriptors of serial out of the store (and closed, where they were
 * passed): the memory goes once nothing else holds it. */
static void forget(const struct kvq_restart *rs, uint32_t serial)
{
	static const char *const what[] = { "books", "pool", "tier" };
	char name[64];

	if (!rs->keep)
		return;
	for (size_t i = 0; i < sizeof what / sizeof what[0]; i++) {
		int fd = take(rs, what[i], serial);

		if (fd >= 0)
			close(fd);
		name_of(name, sizeof name, what[i], serial);
		rs->keep->remove(rs->keep->arg, name, false);
	}
}

static kvq_procs *procs_of(const struct kvq_restart *rs)
{
	return rs && rs->keep ? rs->keep->procs : NULL;
}

static void holds_free(struct kvq_restart_holds *h)
{
	if (!h)
		return;
	free(h->ids);
	free(h->id_who);
	free(h->open);
	free(h->open_who);
	free(h->pids);
	free(h->starts);
	free(h->holders);
	free(h->entries);
	free(h->gone);
	free(h);
}

/* ------------------------------------------------------------ start */

int kvq_restart_init(struct kvq_restart *rs, const struct kvq_keep *keep)
{
	uint32_t *serials = NULL, n = 0, cap = 0;
	const char *name;

	memset(rs, 0, sizeof *rs);
	rs->keep = keep;
	rs->start_us = now_us();
	if (!keep)
		return 0;
	/* the serials first: taking a descriptor may change the list */
	for (size_t i = 0; (name = keep->name_at(keep->arg, i)); i++) {
		unsigned serial;
		int end = 0;

		if (strncmp(name, "kvq.", 4) || sscanf(name + 4, "%*[a-z].%u%n", &serial, &end) != 1 || name[4 + end])
			continue;
		if (serial >= rs->next_serial)
			rs->next_serial = serial + 1;
		if (strncmp(name, "kvq.books.", 10))
			continue;
		if (n == cap) {
			uint32_t *m = realloc(serials, (cap = cap ? 2 * cap : 16) * sizeof *m);

			if (!m) {
				free(serials);
				return -ENOMEM;
			}
			serials = m;
		}
		serials[n++] = serial;
	}
	rs->found = calloc(n + 1, sizeof *rs->found);
	rs->unread = calloc(n + 1, sizeof *rs->unread);
	if (!rs->found || !rs->unread) {
		free(serials);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct kvq_restart_unread *u;
		char why[256] = "";
		kvq_books *b;
		int fd = take(rs, "books", serials[i]), r;

		if (fd < 0)
			continue;
		u = &rs->unread[rs->n_unread];
		if (kvq_books_peek_name(fd, u->name, sizeof u->name) < 0)
			u->name[0] = 0;
		r = kvq_books_open(fd, &b, why, sizeof why);
		if (r < 0) {
			kvq_log(LOG_WARNING, "restart: stored books kvq.books.%u%s%s: %s: its pool starts cold", serials[i],
				u->name[0] ? " of pool " : "", u->name, why);
			snprintf(u->why, sizeof u->why, "%s", why);
			rs->n_unread += u->name[0] != 0;
			forget(rs, serials[i]);
			rs->pools_cold++;
			continue;
		}
		rs->found[rs->n_found++] = (struct kvq_restart_found){ b, serials[i] };
	}
	free(serials);
	return 0;
}

/* The books found for pool name, claimed (out of the list), or NULL. */
static struct kvq_restart_found *claim(struct kvq_restart *rs, const char *name, struct kvq_restart_found *ret)
{
	for (size_t i = 0; i < rs->n_found; i++)
		if (!strcmp(kvq_books_identity(rs->found[i].b)->name, name)) {
			*ret = rs->found[i];
			rs->found[i] = rs->found[--rs->n_found];
			return ret;
		}
	return NULL;
}

static void plan_free(struct kvq_restart_plan *pl)
{
	if (!pl)
		return;
	if (pl->mem_fd >= 0)
		close(pl->mem_fd);
	if (pl->tier_fd >= 0)
		close(pl->tier_fd);
	free(pl->adopt);
	free(pl->open);
	free(pl->order);
	free(pl->entry_pid);
	free(pl->who);
	free(pl->open_who);
	holds_free(pl->holds);
	free(pl);
}

void kvq_restart_plan_drop(struct kvq_restart *rs, struct kvq_restart_pool *kept, struct kvq_restart_plan *pl,
			   const char *name, const char *why)
{
	if (!pl)
		return;
	snprintf(kept->cold, sizeof kept->cold, "%s", why);
	kvq_log(LOG_WARNING, "restart: pool %s starts cold: %s", name, why);
	rs->pools_cold++;
	kvq_books_free(pl->b);
	pl->b = NULL;
	forget(rs, pl->serial);
	plan_free(pl);
}

/* Block ids by their keys (arg: the keys), for the duplicate check. */
static int by_key(const void *a, const void *b, void *arg)
{
	const uint8_t (*keys)[KVQ_BOOKS_KEY_LEN] = arg;
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	int c = memcmp(keys[x], keys[y], KVQ_BOOKS_KEY_LEN);

	return c ? c : (x > y) - (x < y);
}

/* For whom a slot whose owner tag is tag stays held: a process alive at
 * the start (its index), all of them (-1: no single holder known), or
 * nobody (-2: its holder is gone, or nobody is alive). */
static int32_t holder(const struct kvq_restart_plan *pl, uint16_t tag)
{
	if (!pl->holds)
		return -2;
	if (tag == 0 || tag == KVQ_POOL_OWNERS_SEVERAL || tag - 1u >= kvq_books_n_clients(pl->b))
		return -1;
	return pl->entry_pid[tag - 1] >= 0 ? pl->entry_pid[tag - 1] : -2;
}

/* The books' blocks read whole into pl: 0, or -EBADMSG with why. */
static int plan_blocks(struct kvq_restart_plan *pl, const struct kvq_books_id *id, char *why, size_t len)
{
	const uint32_t nb = id->n_sealed + id->n_sink;
	const uint8_t *states = kvq_books_states(pl->b);
	const uint32_t *open = kvq_books_open_slots(pl->b);
	const uint16_t *owners = kvq_books_owners(pl->b), *open_owners = kvq_books_open_owners(pl->b);
	uint8_t (*key)[KVQ_BOOKS_KEY_LEN] = calloc((size_t)nb + 1, sizeof *key);
	int32_t *parent = calloc((size_t)nb + 1, sizeof *parent);
	uint8_t *ok = calloc((size_t)nb + 1, 1);      /* 1 has a key, 2 restorable, 3 not, 4 an open slot's */
	uint32_t *stack = calloc((size_t)nb + 1, sizeof *stack), n_keyed = 0;
	int r = -ENOMEM;

	pl->adopt = calloc((size_t)nb + 1, 1);
	pl->open = calloc((size_t)id->n_open + 1, sizeof *pl->open);
	pl->order = calloc((size_t)nb + 1, sizeof *pl->order);
	pl->who = calloc((size_t)nb + 1, sizeof *pl->who);
	pl->open_who = calloc((size_t)id->n_open + 1, sizeof *pl->open_who);
	if (!key || !parent || !ok || !stack || !pl->adopt || !pl->open || !pl->order || !pl->who || !pl->open_who) {
		snprintf(why, len, "out of memory");
		goto out;
	}
	r = -EBADMSG;
	for (uint32_t b = 0; b < nb; b++) {
		int k = kvq_books_key_get(pl->b, b, key[b], &parent[b]);

		if ((states[b] & ~KVQ_POOL_MIRROR_HELD) > KVQ_POOL_DEMOTING) {
			snprintf(why, len, "books: block %u in no state", b);
			goto out;
		}
		if (k < 0 || (k > 0 && (parent[b] < -1 || parent[b] >= (int32_t)nb))) {
			snprintf(why, len, "books: block %u's key entry is corrupt", b);
			goto out;
		}
		if (k > 0 && (states[b] & ~KVQ_POOL_MIRROR_HELD) == KVQ_POOL_CACHED) {
			ok[b] = 1;
			stack[n_keyed++] = b;
		}
	}
	/* a key twice (only corruption makes one): neither is trusted */
	qsort_r(stack, n_keyed, sizeof *stack, by_key, key);
	for (uint32_t i = 1; i < n_keyed; i++)
		if (!memcmp(key[stack[i]], key[stack[i - 1]], KVQ_BOOKS_KEY_LEN))
			ok[stack[i]] = ok[stack[i - 1]] = 3;
	/* restorable: a keyed block whose parents up to the root all are; the
	 * chain walked once, then each block on it settled, parents first */
	for (uint32_t b = 0; b < nb; b++) {
		uint32_t depth = 0;
		int32_t x = (int32_t)b;
		uint8_t verdict;

		while (x >= 0 && ok[x] == 1 && depth <= nb) {
			stack[depth++] = (uint32_t)x;
			x = parent[x];
		}
		verdict = x < 0 || ok[x] == 2 ? 2 : 3;
		if (depth > nb)
			verdict = 3;   /* a cycle */
		while (depth-- > 0) {
			ok[stack[depth]] = verdict;
			if (verdict == 2)
				pl->order[pl->n_order++] = stack[depth];
		}
	}
	for (uint32_t b = 0; b < nb; b++) {
		const int32_t w = states[b] & KVQ_POOL_MIRROR_HELD ? holder(pl, owners[b]) : -2;

		pl->who[b] = w;
		if (ok[b] == 2)
			pl->adopt[b] = w != -2 ? KVQ_POOL_ADOPT_CACHED_HELD : KVQ_POOL_ADOPT_CACHED;
		else if (w != -2)
			pl->adopt[b] = (states[b] & ~KVQ_POOL_MIRROR_HELD) == KVQ_POOL_RESERVED && b < id->n_sealed
					       ? KVQ_POOL_ADOPT_RESERVED
					       : KVQ_POOL_ADOPT_PRIVATE;
	}
	for (uint32_t o = 0; o < id->n_open; o++) {
		const int32_t w = open[o] == UINT32_MAX ? -2 : holder(pl, open_owners[o]);

		pl->open[o] = UINT32_MAX;
		pl->open_who[o] = -2;
		if (open[o] == UINT32_MAX)
			continue;
		if (open[o] >= id->n_sealed || ok[open[o]] == 4 ||
		    (states[open[o]] & ~KVQ_POOL_MIRROR_HELD) != KVQ_POOL_RESERVED) {
			snprintf(why, len, "books: open slot %u names block %u, not reserved for it", o, open[o]);
			goto out;
		}
		ok[open[o]] = 4;   /* named */
		/* the open slot and its reservation go together, as their holder */
		pl->who[open[o]] = w;
		pl->adopt[open[o]] = w != -2 ? KVQ_POOL_ADOPT_RESERVED : KVQ_POOL_ADOPT_FREE;
		if (w == -2)
			continue;
		pl->open[o] = open[o];
		pl->open_who[o] = w;
	}
	/* reserved for no open slot (a kill between the two writes): the
	 * client never learnt of it, but held is held */
	for (uint32_t b = 0; b < id->n_sealed; b++)
		if (pl->adopt[b] == KVQ_POOL_ADOPT_RESERVED && ok[b] != 4)
			pl->adopt[b] = KVQ_POOL_ADOPT_PRIVATE;
	r = 0;
out:
	free(key);
	free(parent);
	free(ok);
	free(stack);
	return r;
}

/* The processes the books list that are alive: holds for them, or none
 * (the entries of those gone cleared). */
static int plan_holds(struct kvq_restart_plan *pl, const struct kvq_books_id *id)
{
	const uint32_t n = kvq_books_n_clients(pl->b);
	struct kvq_restart_holds *h;

	h = calloc(1, sizeof *h);
	pl->entry_pid = calloc((size_t)n + 1, sizeof *pl->entry_pid);
	if (!h || !pl->entry_pid) {
		free(h);
		return -ENOMEM;
	}
	h->pids = calloc((size_t)n + 1, sizeof *h->pids);
	h->starts = calloc((size_t)n + 1, sizeof *h->starts);
	h->holders = calloc((size_t)n + 1, sizeof *h->holders);
	h->entries = calloc((size_t)n + 1, sizeof *h->entries);
	h->gone = calloc((size_t)n + 1, 1);
	if (!h->pids || !h->starts || !h->holders || !h->entries || !h->gone) {
		holds_free(h);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t start, who;
		pid_t pid = kvq_books_client_pid(pl->b, i, &start, &who);

		pl->entry_pid[i] = -1;
		if (pid <= 0)
			continue;
		if (start && kvq_books_start_time(pid) == start) {
			pl->entry_pid[i] = (int32_t)h->n_pids;
			h->pids[h->n_pids] = pid;
			h->holders[h->n_pids] = who;
			h->entries[h->n_pids] = i;
			h->starts[h->n_pids++] = start;
		} else {
			kvq_books_client_gone(pl->b, (int)i);
		}
	}
	h->n_live = h->n_pids;
	if (kvq_books_clients_lost(pl->b) && h->n_pids == 0)
		kvq_log(LOG_WARNING, "restart: pool %s: attached processes went unrecorded; those recorded are gone",
			id->name);
	if (h->n_pids == 0)
		holds_free(h);
	else
		pl->holds = h;
	return 0;
}

/* The holds' slots, from the plan's adoption. */
static int plan_hold_slots(struct kvq_restart_plan *pl, const struct kvq_books_id *id)
{
	const uint32_t nb = id->n_sealed + id->n_sink;
	struct kvq_restart_holds *h = pl->holds;

	h->ids = calloc((size_t)nb + 1, sizeof *h->ids);
	h->id_who = calloc((size_t)nb + 1, sizeof *h->id_who);
	h->open = calloc((size_t)id->n_open + 1, sizeof *h->open);
	h->open_who = calloc((size_t)id->n_open + 1, sizeof *h->open_who);
	if (!h->ids || !h->id_who || !h->open || !h->open_who)
		return -ENOMEM;
	for (uint32_t b = 0; b < nb; b++)
		if (pl->adopt[b] == KVQ_POOL_ADOPT_CACHED_HELD || pl->adopt[b] == KVQ_POOL_ADOPT_PRIVATE) {
			h->id_who[h->n_ids] = pl->who[b];
			h->ids[h->n_ids++] = b;
		}
	for (uint32_t o = 0; o < id->n_open; o++)
		if (pl->open[o] != UINT32_MAX) {
			h->open_who[h->n_open] = pl->open_who[o];
			h->open[h->n_open++] = o;
		}
	h->held = (uint64_t)h->n_ids + h->n_open;
	return 0;
}

struct kvq_restart_plan *kvq_restart_plan(struct kvq_restart *rs, const struct kvq_books_id *want,
					  const char *policy, struct kvq_restart_pool *kept)
{
	struct kvq_restart_found f;
	struct kvq_restart_plan *pl;
	char why[256] = "";

	if (!rs)
		return NULL;
	if (!claim(rs, want->name, &f)) {
		/* books of this name that could not be read: say why it is cold */
		for (size_t i = 0; i < rs->n_unread; i++)
			if (!strcmp(rs->unread[i].name, want->name)) {
				snprintf(kept->cold, sizeof kept->cold, "%s", rs->unread[i].why);
				rs->unread[i] = rs->unread[--rs->n_unread];
				break;
			}
		return NULL;
	}
	pl = calloc(1, sizeof *pl);
	if (!pl) {
		kvq_books_free(f.b);
		forget(rs, f.serial);
		rs->pools_cold++;
		return NULL;
	}
	pl->t0 = now_us();
	pl->b = f.b;
	pl->serial = f.serial;
	pl->mem_fd = pl->tier_fd = -1;
	if (want->group[0]) {
		snprintf(why, sizeof why, "a tensor-parallel group's member");
		goto cold;
	}
	if (kvq_books_id_diff(pl->b, want, policy, why, sizeof why))
		goto cold;
	/* the plan clears entries of processes gone: a kill from here on must
	 * not find a sealed snapshot whose sum no longer matches */
	kvq_books_unseal(pl->b);
	if (plan_holds(pl, want) < 0 || plan_blocks(pl, want, why, sizeof why) < 0 ||
	    (pl->holds && plan_hold_slots(pl, want) < 0)) {
		if (!why[0])
			snprintf(why, sizeof why, "out of memory");
		goto cold;
	}
	for (uint32_t r = 0; r < kvq_books_n_tier(pl->b); r++) {
		uint8_t key[KVQ_BOOKS_KEY_LEN], parent[KVQ_BOOKS_KEY_LEN];
		uint32_t cls;
		int has_parent;

		if (kvq_books_tier_get(pl->b, r, &cls, key, parent, &has_parent) < 0) {
			snprintf(why, sizeof why, "books: host-tier record %u's entry is corrupt", r);
			goto cold;
		}
	}
	pl->mem_fd = take(rs, "pool", pl->serial);
	pl->mem_size = want->mem_size;
	if (pl->mem_fd < 0) {
		snprintf(why, sizeof why, "its memory was not passed back");
		goto cold;
	}
	if (want->tier_capacity) {
		pl->tier_fd = take(rs, "tier", pl->serial);
		if (pl->tier_fd < 0) {
			snprintf(why, sizeof why, "its host tier was not passed back");
			goto cold;
		}
	}
	return pl;
cold:
	kvq_restart_plan_drop(rs, kept, pl, want->name, why);
	return NULL;
}

int kvq_restart_plan_mem(struct kvq_restart_plan *pl, uint64_t *ret_size)
{
	int fd = pl->mem_fd;

	pl->mem_fd = -1;
	*ret_size = pl->mem_size;
	return fd;
}

int kvq_restart_plan_tier(struct kvq_restart_plan *pl)
{
	int fd = pl->tier_fd;

	pl->tier_fd = -1;
	return fd;
}

static int key_in_pool(void *arg, const uint8_t *key)
{
	return kvq_prefix_find(arg, key) >= 0;
}

void kvq_restart_apply(struct kvq_restart *rs, struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt,
		       struct kvq_restart_plan *pl)
{
	const uint32_t nb = pt->L->n_sealed + pt->L->n_sink;
	uint8_t key[KVQ_BOOKS_KEY_LEN], parent[KVQ_BOOKS_KEY_LEN];
	uint64_t records = 0;
	int32_t par;

	if (kvq_pool_adopt(pt->pool, pl->adopt, pl->open) < 0) {
		/* the plan was checked whole: only a bug lands here */
		kvq_log(LOG_ERR, "restart: pool %s: slots not taken back", pt->name);
		kvq_restart_plan_drop(rs, kept, pl, pt->name, "its slots could not be taken back");
		return;
	}
	for (uint32_t i = 0; i < pl->n_order; i++) {
		uint32_t b = pl->order[i];

		if (kvq_books_key_get(pl->b, b, key, &par) == 1)
			kvq_prefix_restore(pt->prefix, b, key, par);
		pl->adopt[b] = 0xff;   /* restored */
	}
	for (uint32_t b = 0; b < nb; b++)
		if (pl->adopt[b] != 0xff)
			kvq_books_key(pl->b, b, NULL, -1);
	for (uint32_t r = 0; r < kvq_books_n_tier(pl->b); r++) {
		uint32_t cls;
		int has_parent;

		if (kvq_books_tier_get(pl->b, r, &cls, key, parent, &has_parent) != 1)
			continue;
		if (pt->tier && r < kvq_tier_slots(pt->tier) &&
		    kvq_tier_restore(pt->tier, r, cls, key, has_parent ? parent : NULL) == 0)
			records++;
		else
			kvq_books_tier(pl->b, r, 0, NULL, NULL);
	}
	if (pt->tier)
		records -= kvq_tier_restore_end(pt->tier, key_in_pool, pt->prefix);
	kept->books = pl->b;
	kept->rs = rs;
	kept->serial = pl->serial;
	kept->stored = true;
	/* each connection held for counts for its process: its stored pidfd
	 * (if the manager passed one) tells of its exit */
	for (uint32_t k = 0; pl->holds && k < pl->holds->n_pids; k++)
		kvq_procs_adopt(procs_of(rs), pl->holds->pids[k], pl->holds->starts[k]);
	kept->restored = 1;
	kept->blocks = pl->n_order;
	kept->records = records;
	kept->holds = pl->holds;
	kept->restore_us = now_us() - pl->t0;
	rs->pools_restored++;
	rs->blocks += pl->n_order;
	rs->records += records;
	if (pl->holds)
		rs->held += pl->holds->held;
	kvq_log(LOG_NOTICE, "restart: pool %s taken back: %u cached blocks, %llu host-tier records, %u slots held "
		"for %u processes still alive, in %.1f ms", pt->name, pl->n_order, (unsigned long long)records,
		pl->holds ? (uint32_t)pl->holds->held : 0, pl->holds ? pl->holds->n_pids : 0,
		(double)kept->restore_us / 1000.0);
	pl->b = NULL;
	pl->holds = NULL;
	plan_free(pl);
}

const struct kvq_books_id *kvq_restart_next(const struct kvq_restart *rs, const char **ret_policy)
{
	if (!rs->n_found)
		return NULL;
	*ret_policy = kvq_books_policy(rs->found[rs->n_found - 1].b);
	return kvq_books_identity(rs->found[rs->n_found - 1].b);
}

void kvq_restart_give_up(struct kvq_restart *rs, const char *name, const char *why)
{
	struct kvq_restart_found f;

	if (!claim(rs, name, &f))
		return;
	kvq_log(LOG_WARNING, "restart: pool %s starts cold: %s", name, why);
	forget(rs, f.serial);
	kvq_books_free(f.b);
	rs->pools_cold++;
}

void kvq_restart_done(struct kvq_restart *rs)
{
	/* memory no books named: nothing can say what it holds */
	if (rs->keep) {
		char (*names)[64] = NULL;
		size_t n = 0;

		while (rs->keep->name_at(rs->keep->arg, n))
			n++;
		names = calloc(n + 1, sizeof *names);
		for (size_t i = 0; names && i < n; i++)
			snprintf(names[i], sizeof names[i], "%s", rs->keep->name_at(rs->keep->arg, i));
		for (size_t i = 0; names && i < n; i++) {
			uint64_t start;
			pid_t pid;
			int fd;

			if (strncmp(names[i], "kvq.", 4) || (fd = rs->keep->take(rs->keep->arg, names[i])) < 0)
				continue;
			close(fd);
			if (kvq_procs_parse(names[i], &pid, &start)) {
				/* a second copy of one taken stays with it */
				if (kvq_procs_known(procs_of(rs), pid, start))
					continue;
				rs->keep->remove(rs->keep->arg, names[i], false);
				kvq_log(LOG_INFO, "restart: stored pidfd of pid %d: no pool holds for that process: "
					"dropped", (int)pid);
				continue;
			}
			rs->keep->remove(rs->keep->arg, names[i], false);
			kvq_log(LOG_INFO, "restart: stored %s belongs to no pool: dropped", names[i]);
		}
		free(names);
	}
	rs->start_us = now_us() - rs->start_us;
	if (rs->pools_restored || rs->pools_cold)
		kvq_log(LOG_NOTICE, "restart: %u pools taken back (%llu cached blocks, %llu host-tier records, %llu "
			"slots held), %u started cold, in %.1f ms", rs->pools_restored, (unsigned long long)rs->blocks,
			(unsigned long long)rs->records, (unsigned long long)rs->held, rs->pools_cold,
			(double)rs->start_us / 1000.0);
}

void kvq_restart_fini(struct kvq_restart *rs)
{
	for (size_t i = 0; i < rs->n_found; i++)
		kvq_books_free(rs->found[i].b);
	free(rs->found);
	free(rs->unread);
	rs->found = NULL;
	rs->unread = NULL;
	rs->n_found = rs->n_unread = 0;
}

/* ------------------------------------------------------------ running */

static void on_key(void *arg, uint32_t id, const uint8_t *key, int32_t parent)
{
	kvq_books_key(arg, id, key, parent);
}

static void on_tier(void *arg, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent)
{
	kvq_books_tier(arg, r, cls, key, parent);
}

static void attach_books(const struct kvq_restart_parts *pt, kvq_books *b)
{
	kvq_pool_set_owners(pt->pool, b ? kvq_books_owners(b) : NULL, b ? kvq_books_open_owners(b) : NULL);
	kvq_pool_set_mirror(pt->pool, b ? kvq_books_states(b) : NULL, b ? kvq_books_open_slots(b) : NULL);
	kvq_prefix_set_record_hook(pt->prefix, b ? on_key : NULL, b);
	if (pt->tier)
		kvq_tier_set_record_hook(pt->tier, b ? on_tier : NULL, b);
}

void kvq_restart_keep(struct kvq_restart *rs, struct kvq_restart_pool *kept, const struct kvq_books_id *id,
		      const char *policy, const struct kvq_restart_parts *pt)
{
	char why[256] = "", name[64];
	kvq_books *b;

	if (!rs || !rs->keep || rs->stopping || id->group[0])
		return;
	kept->rs = rs;
	if (kept->books) {
		attach_books(pt, kept->books);
		return;
	}
	if (kvq_books_create(id, policy, pt->tier ? kvq_tier_slots(pt->tier) : 0, KVQ_PROTO_MAX_CLIENTS, &b, why,
			     sizeof why) < 0) {
		kvq_log(LOG_WARNING, "pool %s: no books for a restart: %s", pt->name, why);
		return;
	}
	kept->serial = rs->next_serial++;
	name_of(name, sizeof name, "pool", kept->serial);
	if (rs->keep->store(rs->keep->arg, name, pt->mem_fd, false) < 0)
		goto fail;
	if (pt->tier_fd >= 0) {
		name_of(name, sizeof name, "tier", kept->serial);
		if (rs->keep->store(rs->keep->arg, name, pt->tier_fd, false) < 0)
			goto fail;
	}
	name_of(name, sizeof name, "books", kept->serial);
	if (rs->keep->store(rs->keep->arg, name, kvq_books_fd(b), false) < 0)
		goto fail;
	kept->books = b;
	kept->stored = true;
	attach_books(pt, b);
	return;
fail:
	kvq_log(LOG_WARNING, "pool %s: the service manager keeps no descriptors: it will start cold", pt->name);
	forget(rs, kept->serial);
	kvq_books_free(b);
}

void kvq_restart_release(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt)
{
	struct kvq_restart *rs = kept->rs;

	if (kept->books && !kept->detached && pt->pool)
		attach_books(pt, NULL);
	if (rs && kept->stored && !rs->stopping)
		forget(rs, kept->serial);
	kvq_books_free(kept->books);
	for (uint32_t k = 0; kept->holds && k < kept->holds->n_pids; k++)
		if (!kept->holds->gone[k])
			kvq_procs_put(procs_of(rs), kept->holds->pids[k], kept->holds->starts[k], true);
	holds_free(kept->holds);
	memset(kept, 0, sizeof *kept);
}

void kvq_restart_stop(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt)
{
	if (!kept->books || kept->detached)
		return;
	attach_books(pt, NULL);
	kept->detached = true;
	kvq_books_seal(kept->books);
}

/* ------------------------------------------------------------ holds */

/* Releases the holds of connection k (-1: those held for all). */
static void holds_release(struct kvq_restart_holds *h, const struct kvq_restart_parts *pt, int32_t k)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < h->n_open; i++)
		if (h->open_who[i] == k) {
			kvq_pool_release_open(pt->pool, h->open[i]);
			h->open_who[i] = -2;
			n++;
		}
	for (uint32_t i = 0; i < h->n_ids; i++)
		if (h->id_who[i] == k) {
			kvq_pool_unref(pt->pool, h->ids[i]);
			h->id_who[i] = -2;
			n++;
		}
	h->held -= n;
	if (k >= 0)
		kvq_log(LOG_INFO, "restart: pool %s: %llu slots held since the restart for pid %d released",
			pt->name, (unsigned long long)n, (int)h->pids[k]);
	else
		kvq_log(LOG_INFO, "restart: pool %s: %llu slots held since the restart for all released", pt->name,
			(unsigned long long)n);
}

int kvq_restart_attached(struct kvq_restart_pool *kept, pid_t pid, int pidfd, uint64_t holder)
{
	uint64_t start = 0, who;
	int entry;

	if (!kept->books || kept->detached)
		return -1;
	entry = kvq_books_client(kept->books, pid, holder);
	if (entry >= 0 && kvq_books_client_pid(kept->books, (uint32_t)entry, &start, &who) == pid)
		kvq_procs_hold(procs_of(kept->rs), pid, start, pidfd);
	return entry;
}

void kvq_restart_detached(struct kvq_restart_pool *kept, int entry)
{
	uint64_t start = 0, who;
	pid_t pid;

	if (!kept->books || entry < 0)
		return;
	/* a stop keeps the entry (the next start holds for it), not the count */
	pid = kvq_books_client_pid(kept->books, (uint32_t)entry, &start, &who);
	if (pid > 0)
		kvq_procs_put(procs_of(kept->rs), pid, start, false);
	if (!kept->detached)
		kvq_books_client_gone(kept->books, entry);
}

/* Connection k of the holds is over (its process exited, or a new
 * connection replaced it): what was held for it released, its books entry
 * cleared. */
static void holds_end(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt, uint32_t k)
{
	struct kvq_restart_holds *h = kept->holds;

	h->gone[k] = 1;
	h->n_live--;
	holds_release(h, pt, (int32_t)k);
	if (kept->books && !kept->detached)
		kvq_books_client_gone(kept->books, (int)h->entries[k]);
	kvq_procs_put(procs_of(kept->rs), h->pids[k], h->starts[k], true);
}

/* The holds of the last connection gone released too; whether any is
 * still held. */
static int holds_over(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt)
{
	struct kvq_restart_holds *h = kept->holds;

	if (h->n_live > 0)
		return 1;
	holds_release(h, pt, -1);
	kvq_log(LOG_INFO, "restart: pool %s: every slot held since the restart released", pt->name);
	holds_free(h);
	kept->holds = NULL;
	return 0;
}

int kvq_restart_holds_check(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt)
{
	struct kvq_restart_holds *h = kept->holds;

	if (!h)
		return 0;
	for (uint32_t k = 0; k < h->n_pids; k++)
		if (!h->gone[k] && kvq_books_start_time(h->pids[k]) != h->starts[k])
			holds_end(kept, pt, k);
	return holds_over(kept, pt);
}

int kvq_restart_holds_exited(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt, pid_t pid,
			     uint64_t start)
{
	struct kvq_restart_holds *h = kept->holds;
	bool ended = false;

	if (!h)
		return 0;
	for (uint32_t k = 0; k < h->n_pids; k++)
		if (!h->gone[k] && h->pids[k] == pid && h->starts[k] == start) {
			holds_end(kept, pt, k);
			ended = true;
		}
	return ended ? holds_over(kept, pt) : 1;
}

void kvq_restart_stopping(struct kvq_restart *rs)
{
	rs->stopping = true;
	kvq_procs_stop(procs_of(rs));
}

uint64_t kvq_restart_replaced(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt, pid_t pid,
			      uint64_t holder)
{
	struct kvq_restart_holds *h = kept->holds;
	uint64_t before;

	if (!h || !holder)
		return 0;
	before = h->held;
	for (uint32_t k = 0; k < h->n_pids; k++)
		if (!h->gone[k] && h->pids[k] == pid && h->holders[k] == holder) {
			holds_end(kept, pt, k);
			holds_over(kept, pt);
			/* holds_over may have freed h */
			return before - (kept->holds ? kept->holds->held : 0);
		}
	return 0;
}

uint64_t kvq_restart_plan_memory_id(const struct kvq_restart_plan *pl)
{
	return kvq_books_identity(pl->b)->memory_id;
}
