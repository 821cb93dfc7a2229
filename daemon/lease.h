/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A client's lease: every slot a connection holds, with multiplicity.
 *
 * Sealed ids count references the connection took (alloc, seal, lookup,
 * fork, publish of a duplicate); open ids are held at most once.  The server
 * validates a request against the lease before it changes the pool, and
 * drops the whole lease when the connection goes.  Memory grows with what
 * the client holds, never with the pool: the maps are open addressing hash
 * tables.  kvq_lease_reserve() makes room first so that applying a
 * validated batch cannot fail half-way.
 *
 * A hold is counted twice, in the pool (daemon/pool.h: a reference, or an
 * open slot in use) and here; kvq_lease_take() and kvq_lease_give() move it
 * in both at once, and kvq_lease_drop() gives all of them back.  The other
 * functions are the maps alone (a request also uses them for scratch sets).
 *
 * Not thread-safe: the daemon runs one event loop.
 */
#ifndef KVQD_LEASE_H
#define KVQD_LEASE_H

#include <stdint.h>

#include "pool.h"

typedef struct kvq_lease kvq_lease;

/* Returns 0 and *ret (empty lease), or -ENOMEM. */
int kvq_lease_new(kvq_lease **ret);

/* Frees the lease (NULL is fine); the pool is not touched. */
void kvq_lease_free(kvq_lease *l);

/* Makes room for n_sealed more distinct sealed ids and n_open more open ids,
 * so that the next _add calls up to those counts cannot fail.  0 or -ENOMEM. */
int kvq_lease_reserve(kvq_lease *l, uint32_t n_sealed, uint32_t n_open);

/* References held on sealed id (0 when none). */
uint32_t kvq_lease_sealed(const kvq_lease *l, uint32_t id);

/* Adds n references on sealed id; returns 1 when the id is newly held, 0 when
 * it already was, -ENOMEM (only without kvq_lease_reserve), -EOVERFLOW. */
int kvq_lease_sealed_add(kvq_lease *l, uint32_t id, uint32_t n);

/* Drops n references (n <= kvq_lease_sealed()); returns 1 when the id is no
 * longer held, 0 otherwise, -EINVAL when fewer than n are held. */
int kvq_lease_sealed_sub(kvq_lease *l, uint32_t id, uint32_t n);

/* Whether open id is held. */
int kvq_lease_open_has(const kvq_lease *l, uint32_t id);

/* Holds / gives back open id: 0, -EEXIST / -ENOENT, -ENOMEM. */
int kvq_lease_open_add(kvq_lease *l, uint32_t id);
int kvq_lease_open_del(kvq_lease *l, uint32_t id);

/* Distinct sealed ids held, open ids held. */
uint32_t kvq_lease_n_sealed(const kvq_lease *l);
uint32_t kvq_lease_n_open(const kvq_lease *l);

/* Sealed ids >= first are sink blocks (daemon/pool.h): set before the first
 * add; a new lease has none.  kvq_lease_n_sink() counts the distinct ones
 * held (kvq_lease_n_sealed() counts them too). */
void kvq_lease_set_first_sink(kvq_lease *l, uint32_t first);
uint32_t kvq_lease_n_sink(const kvq_lease *l);

/* Iteration (no changes meanwhile): start with *pos = 0; returns 1 with the
 * next held id and its count (1 for open ids), 0 at the end. */
int kvq_lease_next_sealed(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id, uint32_t *ret_count);
int kvq_lease_next_open(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id);

/* How a hold enters or leaves the pool. */
enum kvq_lease_hold {
	/* references on a sealed block: take adds them in the pool, give drops them */
	KVQ_LEASE_REF = 0,
	/* take: a sealed block with the reference the pool has just granted
	 * (alloc, lookup, seal), not asked for again; give: as KVQ_LEASE_REF */
	KVQ_LEASE_GRANTED,
	/* an open slot kvq_pool_alloc_open() granted: take records it, give
	 * frees it and its reservation */
	KVQ_LEASE_OPEN,
	/* give only: an open slot leaving by kvq_pool_seal(); its block is then
	 * taken as KVQ_LEASE_GRANTED */
	KVQ_LEASE_SEALING,
};

/* Takes n holds on id (n is 1 for an open slot) into l and, as how says,
 * the pool p.  Returns 0, or the pool's or the lease's error with nothing
 * changed (a granted reference stays the caller's to give back); after
 * kvq_lease_reserve() the lease's side cannot fail. */
int kvq_lease_take(kvq_lease *l, kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n);

/* Gives back n holds on id from l and, as how says, the pool p.  Returns 0;
 * -EINVAL (sealed) or -ENOENT (open) when l does not hold them, with nothing
 * changed; or the pool's error once l has let them go (the two disagreed:
 * a broken invariant, for the caller to log). */
int kvq_lease_give(kvq_lease *l, kvq_pool *p, enum kvq_lease_hold how, uint32_t id, uint32_t n);

/* What kvq_lease_drop() gave back: open slots and distinct sealed ids, and
 * how many of each the pool refused (a broken invariant, for the caller to
 * log). */
struct kvq_lease_dropped {
	uint32_t open, sealed;
	uint32_t open_refused, sealed_refused;
};

/* Gives every hold of l back to p (open slots freed with their
 * reservations, each sealed reference dropped) and frees l; NULL is fine.
 * Fills *ret when it is not NULL. */
void kvq_lease_drop(kvq_lease *l, kvq_pool *p, struct kvq_lease_dropped *ret);

/* The tag the lease's holds carry in the pool's owners (kvq_pool_owner:
 * its connection's entry in the pool's books + 1; 0, the default: none). */
void kvq_lease_set_tag(kvq_lease *l, uint16_t tag);

#endif
