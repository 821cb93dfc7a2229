/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A client's lease: every slot a connection holds, with multiplicity.
 *
 * Sealed ids count references the connection took (alloc, seal, lookup,
 * fork, publish of a duplicate); open ids are held at most once.  The server
 * validates a request against the lease before it changes the pool, and
 * drops the whole lease when the connection goes (daemon/server.c).  Memory
 * grows with what the client holds, never with the pool: the maps are open
 * addressing hash tables.  kvq_lease_reserve() makes room first so that
 * applying a validated batch cannot fail half-way.
 *
 * Not thread-safe: the daemon runs one event loop.
 */
#ifndef KVQD_LEASE_H
#define KVQD_LEASE_H

#include <stdint.h>

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

/* Iteration (no changes meanwhile): start with *pos = 0; returns 1 with the
 * next held id and its count (1 for open ids), 0 at the end. */
int kvq_lease_next_sealed(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id, uint32_t *ret_count);
int kvq_lease_next_open(const kvq_lease *l, uint32_t *pos, uint32_t *ret_id);

#endif
