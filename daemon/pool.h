/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Slot bookkeeping of one pool: which sealed, open and sink slots
 * (kernels/layout.h) are free, reserved, private, cached, and how many
 * references each block has.  No I/O, no GPU: the server calls this after
 * validating a request, and the kernels write the slots the ids name.
 *
 * Ids.  Open ids 0 .. n_open-1.  Blocks, the slots that hold a sealed block
 * or a sequence's first block kept exact (a sink), share one id space here:
 * sealed slots 0 .. n_sealed-1, then sink slots n_sealed .. n_sealed +
 * n_sink - 1 (kernels/layout.h, kvq_layout_block_id: sink s is block id
 * n_sealed + s).  Sink and sealed blocks go through the same states and references
 * and the prefix cache treats them alike; each class has its own free slots,
 * and a sink slot is never reserved (a sequence takes one at its start with
 * kvq_pool_alloc_sink()).  "Sealed id" below means any block id.
 *
 * Sealed slot states:
 *
 *   FREE      on the free stack.
 *   RESERVED  held for one open slot, so that sealing it never fails for lack
 *             of room; becomes PRIVATE at kvq_pool_seal(), FREE at
 *             kvq_pool_release_open().
 *   PRIVATE   a sealed block (from kvq_pool_seal() or kvq_pool_alloc_sealed())
 *             not in the prefix cache; refs >= 1; freed when its last
 *             reference goes.
 *   CACHED    in the prefix cache (kvq_pool_cache_insert()); refs >= 0.  At
 *             refs == 0 it stays cached, owned by the cache, until the cache
 *             evicts it (kvq_pool_cache_evicted()).
 *
 *   DEMOTING  left the prefix cache for the pool's host tier
 *             (daemon/tiering.h) with no reference; its bytes are being
 *             copied.  FREE at kvq_pool_demoted() when the copy ends, or at
 *             once when an allocation needs the slot: make_room takes
 *             demoting slots before it evicts, telling the transit's
 *             cancel() so that the copy, whose bytes may now change, is
 *             dropped.  An allocation never waits for a copy.
 *
 * Open slots are FREE or USED; a USED open slot always owns exactly one
 * RESERVED sealed slot, so stats.sealed_reserved == stats.open_used.
 *
 * Ownership.  The pool owns slot states and reference counts.  The prefix
 * cache (daemon/prefix.h) owns keys, parents and the eviction order; it
 * attaches itself with kvq_pool_set_cache().  The pool tells the cache when a
 * cached block gains its first or loses its last reference (held()), and when
 * an allocation needs room it asks how many blocks the cache could evict
 * (evictable()) and has it evict exactly the shortfall (evict()), the cache
 * handing each victim back through kvq_pool_cache_evicted().  Because the pool
 * asks before evicting, an allocation that cannot be satisfied evicts nothing.
 *
 * Cost.  Allocation and release pop and push stacks of ids; no operation
 * scans the slots.  Allocation that has to evict pays for the evictions
 * (daemon/prefix.h gives their cost).
 *
 * Errors.  -ENOSPC is the named "pool full" error: a batch that does not fit
 * even after evicting every evictable block.  -ERANGE: an id outside its id
 * space.  -EINVAL: an id in the wrong state for the operation.  -EOVERFLOW:
 * a reference count at KVQ_POOL_MAX_REFS.  On any error nothing changes but
 * the stats counter of failed allocations.
 *
 * Not thread-safe: the daemon runs one event loop.
 */
#ifndef KVQD_POOL_H
#define KVQD_POOL_H

#include <stdint.h>

typedef struct kvq_pool kvq_pool;

enum kvq_pool_state {
	KVQ_POOL_FREE = 0,
	KVQ_POOL_RESERVED,
	KVQ_POOL_PRIVATE,
	KVQ_POOL_CACHED,
	KVQ_POOL_DEMOTING,
};

/* Masks of states for kvq_pool_check_sealed(). */
#define KVQ_POOL_BIT(state) (1u << (state))
#define KVQ_POOL_SEALED_BLOCK (KVQ_POOL_BIT(KVQ_POOL_PRIVATE) | KVQ_POOL_BIT(KVQ_POOL_CACHED))

/* References one sealed block can carry: far above any real number of
 * holders, far below wrap-around. */
#define KVQ_POOL_MAX_REFS (1u << 30)

struct kvq_pool_stats {
	uint32_t n_sealed, n_open, n_sink; /* capacity of each class */
	uint32_t sealed_free;          /* on the free stack */
	uint32_t sealed_reserved;      /* reserved for used open slots */
	uint32_t sealed_private;       /* sealed, not cached */
	uint32_t sealed_cached;        /* in the prefix cache */
	uint32_t cached_referenced;    /* cached with refs > 0 */
	uint32_t sealed_evictable;     /* cached blocks eviction could free now */
	uint32_t open_free, open_used;
	uint32_t sealed_demoting;      /* copies to the host tier in flight */
	uint32_t sink_free, sink_private, sink_cached, sink_referenced, sink_evictable; /* as sealed_* */
	uint32_t sink_demoting;
	uint64_t refs, sink_refs;      /* sum of the sealed blocks' references, of the sink blocks' */
	uint64_t evictions;            /* blocks evicted, ever */
	uint64_t alloc_failures;       /* allocations refused with -ENOSPC */
};

/*
 * The prefix cache's side of the pool.  ctx is passed back unchanged.
 *
 * held(ctx, id, 1): cached block id went from 0 to 1 reference;
 * held(ctx, id, 0): from 1 to 0 (it now belongs to the cache alone).
 * evictable(ctx, cls): how many cached blocks of class cls (0 sealed, 1 sink)
 *   evict() could free right now.
 * evict(ctx, cls, count): evict blocks until count of class cls went
 *   (count <= evictable(cls)); blocks of the other class may go on the way,
 *   as the eviction order reaches them; calls kvq_pool_cache_evicted() for
 *   each and returns how many of class cls it evicted.
 */
struct kvq_pool_cache {
	void *ctx;
	void (*held)(void *ctx, uint32_t id, int held);
	uint32_t (*evictable)(void *ctx, int cls);
	uint32_t (*evict)(void *ctx, int cls, uint32_t count);
};

/* The host tier's side of the pool (daemon/tiering.h): cancel(ctx, id)
 * when make_room frees DEMOTING slot id before its copy ended. */
struct kvq_pool_transit {
	void *ctx;
	void (*cancel)(void *ctx, uint32_t id);
};

/* New pool of n_sealed sealed, n_open open and n_sink sink slots, all free
 * (each count at most KVQ_MAX_SLOTS).  Returns 0 and *ret, -EINVAL or
 * -ENOMEM. */
int kvq_pool_new(uint32_t n_sealed, uint32_t n_open, uint32_t n_sink, kvq_pool **ret);

/* Frees the pool (NULL is fine).  Free the attached cache first. */
void kvq_pool_free(kvq_pool *p);

/*
 * Grants count open slots and reserves one sealed slot for each, all or
 * nothing, evicting cached blocks if free sealed slots run short.  Writes the
 * open ids to ret_open[count] and the reserved sealed ids to
 * ret_sealed[count] (ret_sealed may be NULL; kvq_pool_open_reserved() tells
 * it later).  Returns 0 (count 0 is a no-op), or -ENOSPC when fewer than count
 * open slots are free or fewer than count sealed slots are free or evictable.
 */
int kvq_pool_alloc_open(kvq_pool *p, uint32_t count, uint32_t *ret_open, uint32_t *ret_sealed);

/* Grants count sealed slots (prefill writes them directly), all or nothing,
 * evicting as kvq_pool_alloc_open() does; each starts PRIVATE with one
 * reference.  Returns 0 and ret_ids[count], or -ENOSPC. */
int kvq_pool_alloc_sealed(kvq_pool *p, uint32_t count, uint32_t *ret_ids);

/* Grants count sink slots (a sequence's first block is written straight into
 * one) as kvq_pool_alloc_sealed() grants sealed ones, evicting cached blocks
 * until enough sink slots are free.  Returns 0 and ret_ids[count] (block ids
 * n_sealed ..), or -ENOSPC. */
int kvq_pool_alloc_sink(kvq_pool *p, uint32_t count, uint32_t *ret_ids);

/* Seals a used open slot: frees it and makes its reserved sealed slot a
 * PRIVATE block with one reference (its owner's).  Never fails for lack of
 * room.  Returns 0 and *ret_id (the sealed id), -ERANGE or -EINVAL. */
int kvq_pool_seal(kvq_pool *p, uint32_t open_id, uint32_t *ret_id);

/* Frees a used open slot and the sealed slot reserved for it.
 * Returns 0, -ERANGE or -EINVAL. */
int kvq_pool_release_open(kvq_pool *p, uint32_t open_id);

/* Adds a reference to a PRIVATE or CACHED block.
 * Returns 0, -ERANGE, -EINVAL or -EOVERFLOW. */
int kvq_pool_ref(kvq_pool *p, uint32_t id);

/* Drops a reference from a PRIVATE or CACHED block with refs > 0.  A private
 * block's last reference frees it; a cached block's leaves it to the cache.
 * Returns 0, -ERANGE or -EINVAL. */
int kvq_pool_unref(kvq_pool *p, uint32_t id);

/* Validation, changing nothing.  Returns 0 when sealed id is in range and in
 * one of the states of mask (KVQ_POOL_BIT()s), else -ERANGE or -EINVAL. */
int kvq_pool_check_sealed(const kvq_pool *p, uint32_t id, unsigned mask);

/* Returns 0 when open id is in range and used, else -ERANGE or -EINVAL. */
int kvq_pool_check_open(const kvq_pool *p, uint32_t open_id);

/* State of sealed slot id (enum kvq_pool_state), or -ERANGE. */
int kvq_pool_state(const kvq_pool *p, uint32_t id);

/* References of sealed slot id (0 when out of range or not a block). */
uint32_t kvq_pool_refs(const kvq_pool *p, uint32_t id);

/* Sealed id reserved for a used open slot.  Returns 0 and *ret_id, -ERANGE
 * or -EINVAL. */
int kvq_pool_open_reserved(const kvq_pool *p, uint32_t open_id, uint32_t *ret_id);

/* Current counters. */
void kvq_pool_stats(const kvq_pool *p, struct kvq_pool_stats *ret);

/* Attaches the prefix cache (c is copied), or detaches it (c NULL). */
void kvq_pool_set_cache(kvq_pool *p, const struct kvq_pool_cache *c);

/* For the cache: a PRIVATE block enters the cache, keeping its references.
 * Returns 0, -ERANGE or -EINVAL. */
int kvq_pool_cache_insert(kvq_pool *p, uint32_t id);

/* For the cache: a CACHED block with no reference was evicted; its slot is
 * free again.  Returns 0, -ERANGE or -EINVAL. */
int kvq_pool_cache_evicted(kvq_pool *p, uint32_t id);

/* For the cache: a CACHED block with no reference left it for the host
 * tier: DEMOTING until kvq_pool_demoted() or a cancel.  Returns 0, -ERANGE
 * or -EINVAL. */
int kvq_pool_cache_demoting(kvq_pool *p, uint32_t id);

/* The copy of DEMOTING block id ended: its slot is free.  Returns 0,
 * -ERANGE or -EINVAL (not demoting: an allocation took it first). */
int kvq_pool_demoted(kvq_pool *p, uint32_t id);

/* Attaches the host tier's transit hooks (t copied), or detaches them. */
void kvq_pool_set_transit(kvq_pool *p, const struct kvq_pool_transit *t);

/* The held bit of a mirrored state byte (kvq_pool_set_mirror). */
#define KVQ_POOL_MIRROR_HELD 0x80u

/* Keeps states[n_sealed + n_sink] (each block's state, with
 * KVQ_POOL_MIRROR_HELD while a client holds it: reserved, private, or
 * cached with references) and open[n_open] (the sealed id reserved for
 * each used open slot, UINT32_MAX for a free one) up to date from now on,
 * each written at its change, before the slot can change hands again
 * (daemon/books.h); both are filled now.  NULL, NULL stops. */
void kvq_pool_set_mirror(kvq_pool *p, uint8_t *states, uint32_t *open);

/* Who holds each block and open slot, as tags of the caller's (the pool's
 * books, daemon/books.h: an attached process's entry + 1): 0 none known,
 * KVQ_POOL_OWNERS_SEVERAL more than one.  With blocks[n_sealed + n_sink]
 * and open[n_open] set (NULL, NULL: none), kvq_pool_owner and
 * kvq_pool_open_owner record a tag's hold, and a slot that stops being held
 * (kvq_pool_set_mirror's held bit goes) loses its tag. */
#define KVQ_POOL_OWNERS_SEVERAL 0xffffu
void kvq_pool_set_owners(kvq_pool *p, uint16_t *blocks, uint16_t *open);

/* tag (not 0) took a hold on block id, or on open slot o and its
 * reservation: recorded, a second tag making it SEVERAL. */
void kvq_pool_owner(kvq_pool *p, uint32_t id, uint16_t tag);
void kvq_pool_open_owner(kvq_pool *p, uint32_t o, uint16_t tag);

/* What a restarted pool takes back for each block (kvq_pool_adopt). */
enum kvq_pool_adopt {
	KVQ_POOL_ADOPT_FREE = 0,
	KVQ_POOL_ADOPT_CACHED,        /* cached, no reference */
	KVQ_POOL_ADOPT_CACHED_HELD,   /* cached, one reference: a restored client's hold */
	KVQ_POOL_ADOPT_PRIVATE,       /* private, one reference: a restored client's hold */
	KVQ_POOL_ADOPT_RESERVED,      /* reserved for the used open slot that names it */
};

/* A pool with nothing allocated yet (a cache may be attached: it is not
 * told) takes its slots as blocks[n_sealed + n_sink] (enum
 * kvq_pool_adopt) and open[n_open] (each used open slot's reserved sealed
 * id, UINT32_MAX when free) say; the cache's blocks enter the index next
 * (kvq_prefix_restore).  Returns 0, or -EINVAL (a used open slot naming
 * no reserved sealed block, a reserved block no open slot or two name, a
 * sink block reserved, a value out of range) with nothing changed. */
int kvq_pool_adopt(kvq_pool *p, const uint8_t *blocks, const uint32_t *open);

#endif
