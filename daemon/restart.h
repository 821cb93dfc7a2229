/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A restart that keeps the warm cache (docs/DESIGN.md, "Restart").
 *
 * What each pool leaves: when a service manager keeps descriptors for
 * kvqd (systemd's fd store, daemon/sd.h), every allocated pool that is in
 * no tensor-parallel group stores three, named by a serial the books
 * carry: kvq.books.N (its books, daemon/books.h), kvq.pool.N (its memory's
 * exportable descriptor: the memfd, or the CUDA allocation's POSIX fd) and
 * kvq.tier.N (its host tier's memfd, when it has one).  The books are
 * written as the daemon runs; a stop (SIGTERM) seals them, a kill leaves
 * them as they were at that instant.  Dropping a pool removes its three.
 *
 * What the next kvqd takes back: at start it opens every kvq.books.N it
 * was given; a pool of kvqd.conf, or one an Attach or PoolAdd created
 * (rebuilt from the books' record, ACL and quota included), whose identity
 * matches (name, model, policy, geometry, layout fingerprint, slot counts,
 * backend, device, memory and tier sizes, codebooks) and whose books are
 * whole takes its memory back instead of allocating, with its cached
 * blocks, their chains and its host tier's records.  Anything else starts
 * that pool cold, with a log line that says why, and its descriptors are
 * dropped from the store.
 *
 * Workers that outlive the daemon: slots a client held at the restart
 * (open slots, private blocks, references on cached blocks) stay held, by
 * the restored pool itself, while the process the books name as their
 * holder (pid and start time) is alive, and are released when it exits:
 * at once when the store kept its pidfd (kvq.pidfd.PID.START,
 * daemon/procs.h; kvq_restart_holds_exited), else at the next second's
 * look (kvq_restart_holds_check); slots the books name no single holder
 * of are held until every process alive at the start has exited.
 *
 * Not thread-safe: the event loop's.
 */
#ifndef KVQD_RESTART_H
#define KVQD_RESTART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "books.h"
#include "keep.h"
#include "layout.h"
#include "pool.h"
#include "prefix.h"
#include "tier.h"

/* Slots a restored pool holds for connections whose processes may still
 * use them: each slot for the connection the books say holds it (its index
 * in pids), or, where they name none or several, for all of them (-1). */
struct kvq_restart_holds {
	uint32_t *ids, n_ids;       /* blocks with one reference each (private, or cached) */
	int32_t *id_who;            /* whose: a process, -1 all, -2 released */
	uint32_t *open, n_open;     /* used open slots */
	int32_t *open_who;
	pid_t *pids;                /* the connections of processes alive at the start: the pids, */
	uint64_t *starts;           /* their start times, */
	uint64_t *holders;          /* their holders (AttachReply.holder) */
	uint32_t *entries;          /* and their books entries */
	uint8_t *gone;              /* exited since */
	uint32_t n_pids, n_live;
	uint64_t held;              /* slots still held */
};

/* What this file sees of an allocated pool (daemon/pools.c fills it). */
struct kvq_restart_parts {
	const char *name;
	const struct kvq_layout *L;
	kvq_pool *pool;
	kvq_prefix *prefix;
	kvq_tier *tier;             /* its host tier's records, or NULL */
	int mem_fd, tier_fd;        /* the descriptors it stores (tier: -1 without one) */
};

/* A pool's part (struct kvq_pools_rec). */
struct kvq_restart_pool {
	struct kvq_restart *rs;     /* the daemon's, once kept */
	kvq_books *books;           /* written as it runs, or NULL */
	uint32_t serial;            /* its stored descriptors' N */
	bool stored;                /* its descriptors are in the store */
	bool detached;              /* from its pool, at a stop: the books say what was held then */
	uint64_t tier_capacity;     /* bytes of its host tier (pools.c sets it), 0: none */
	struct kvq_restart_holds *holds;   /* or NULL */
	int restored;               /* taken back at this start */
	uint64_t blocks, records;   /* blocks and tier records taken back */
	uint64_t restore_us;        /* its share of the start */
	char cold[192];             /* why it started cold, "" when it did not or had nothing */
};

/* The daemon's part (struct kvq_pools). */
struct kvq_restart {
	const struct kvq_keep *keep;       /* NULL: no service manager */
	struct kvq_restart_found *found;   /* books passed at start, not claimed yet */
	size_t n_found;
	struct kvq_restart_unread *unread; /* books that could not be read: their pools' names, why */
	size_t n_unread;
	uint32_t next_serial;
	bool stopping;                     /* the books are sealed: nothing is recorded any more */
	uint32_t pools_restored, pools_cold;
	uint64_t blocks, records, held;    /* taken back, over all pools */
	uint64_t start_us;                 /* from kvq_restart_init to kvq_restart_done */
};

/* A daemon's part with keep (NULL: none): opens every kvq.books.N passed
 * at start; those that cannot be read are logged and dropped with their
 * pools' descriptors.  Returns 0 or -ENOMEM. */
int kvq_restart_init(struct kvq_restart *rs, const struct kvq_keep *keep);

/* The books found at start and not claimed yet: the last one's identity
 * and policy, or NULL when none is left (pools.c rebuilds pools no
 * section names from them: daemon/pools.h, kvq_pools_restore_rest). */
const struct kvq_books_id *kvq_restart_next(const struct kvq_restart *rs, const char **ret_policy);

/* The books found for name given up: its pool starts cold, why logged. */
void kvq_restart_give_up(struct kvq_restart *rs, const char *name, const char *why);

/* The start is over: stored descriptors no books claimed are dropped, and
 * the figures logged. */
void kvq_restart_done(struct kvq_restart *rs);

/* Frees what init left (not the pools' parts). */
void kvq_restart_fini(struct kvq_restart *rs);

/* A restore's plan: what a pool takes back from its books, made before
 * any memory is touched. */
struct kvq_restart_plan;

/*
 * For a pool of identity want and canonical policy being allocated: the
 * books passed for its name, checked against want and read whole, as a
 * plan, or NULL when there is nothing to take back or it cannot be (logged,
 * the descriptors dropped, kept->cold saying why).
 */
struct kvq_restart_plan *kvq_restart_plan(struct kvq_restart *rs, const struct kvq_books_id *want,
					  const char *policy, struct kvq_restart_pool *kept);

/* The plan's memory and tier descriptors (taken: -1 the second time). */
int kvq_restart_plan_mem(struct kvq_restart_plan *pl, uint64_t *ret_size);
int kvq_restart_plan_tier(struct kvq_restart_plan *pl);

/* Frees a plan not applied (NULL is fine): the pool starts cold, with
 * why; its stored descriptors are dropped. */
void kvq_restart_plan_drop(struct kvq_restart *rs, struct kvq_restart_pool *kept, struct kvq_restart_plan *pl,
			   const char *name, const char *why);

/* The plan carried out on a pool whose pool, index and tier were just
 * made: slots, cached blocks, tier records and holds taken back; the plan
 * freed. */
void kvq_restart_apply(struct kvq_restart *rs, struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt,
		       struct kvq_restart_plan *pl);

/* An allocated pool of identity id: its books written from now on (new
 * ones unless restored) and its descriptors stored.  A failure costs only
 * the restart (logged). */
void kvq_restart_keep(struct kvq_restart *rs, struct kvq_restart_pool *kept, const struct kvq_books_id *id,
		      const char *policy, const struct kvq_restart_parts *pt);

/* The pool's memory is going (before its pool, index and tier): at a
 * stop its books stay sealed and stored; otherwise (a drop) its
 * descriptors leave the store. */
void kvq_restart_release(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt);

/* Stop: the pool's books detached (what the daemon frees from now on is
 * not recorded: clients alive keep their holds at the next start) and
 * sealed.  The caller sets the daemon's stopping. */
void kvq_restart_stop(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt);

/* A connection of process pid (pidfd: the connection's, borrowed, or -1)
 * attached as holder: its books entry (for kvq_restart_detached; -1 when
 * none is recorded); the process's pidfd is stored at its first entry.  What a restored pool
 * holds for a connection from before the restart stays held until its
 * process exits, or a new connection of that process replaces it
 * (kvq_restart_replaced): its old sequences may still write until then. */
int kvq_restart_attached(struct kvq_restart_pool *kept, pid_t pid, int pidfd, uint64_t holder);
void kvq_restart_detached(struct kvq_restart_pool *kept, int entry);

/* Releases the pool's holds of processes that exited (all, once the last
 * did).  Returns whether it still holds. */
int kvq_restart_holds_check(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt);

/* Process (pid, start) exited (its pidfd said so): what the pool held
 * for its connections released, as kvq_restart_holds_check would.
 * Returns whether the pool still holds. */
int kvq_restart_holds_exited(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt, pid_t pid,
			     uint64_t start);

/* The stop begins: nothing leaves the store from now on. */
void kvq_restart_stopping(struct kvq_restart *rs);

/* A connection of process pid (its peer credentials') replaces the one
 * from before the restart that was holder (Attach.replaces): what was
 * held for that one is released (and what was held for all, if it was the
 * last).  Returns the slots released; 0 when no such connection is held
 * for. */
uint64_t kvq_restart_replaced(struct kvq_restart_pool *kept, const struct kvq_restart_parts *pt, pid_t pid,
			      uint64_t holder);

/* The memory id (struct kvq_books_id) of the memory a plan takes back. */
uint64_t kvq_restart_plan_memory_id(const struct kvq_restart_plan *pl);

#endif
