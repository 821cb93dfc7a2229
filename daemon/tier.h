/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host tier of one pool: block records (kernels/blockrec.h) in host
 * memory behind the pool, found by prefix key.  Bookkeeping and memory
 * only: which records exist, where, in which state, and which goes when
 * room is needed; the copies are daemon/tiering.c's.
 *
 * Memory: one sealed memfd (the host backend's, daemon/backend.h) of the
 * tier's capacity, cut into record slots of two sizes: sealed blocks' and,
 * in a pool with sink blocks, sink blocks' (kvq_blockrec_size, rounded up
 * to 64 bytes).  The capacity is split between the two in the proportion
 * of the pool's own sealed and sink slots (by bytes), so a tier keeps the
 * pool's mix.  Never mapped by a client: only the daemon reads it.
 *
 * Record states:
 *   FREE      no record.
 *   INCOMING  reserved for a block whose copy from the pool is in flight;
 *             found by no lookup; READY at kvq_tier_commit, FREE at
 *             kvq_tier_abort.
 *   READY     a whole record: found by kvq_tier_find, evictable when it is
 *             a leaf (no record of the tier names it as parent).
 *   OUTGOING  being copied back into the pool (kvq_tier_take): neither
 *             found nor evictable; FREE or READY at kvq_tier_taken.
 *
 * A chain stays whole: every record's parent is a block of the pool or a
 * record of the tier.  Eviction here goes leaf first, least recently
 * stored first (a binary heap of READY leaves, as daemon/prefix.c keeps);
 * when the pool drops a block without a copy, kvq_tier_drop_under drops
 * the records below it.  A record DOOMED while INCOMING or OUTGOING (its
 * parent went) is freed when its copy ends.
 *
 * Not thread-safe: the event loop's.  The copy thread touches only the
 * bytes of records whose state the loop holds INCOMING or OUTGOING.
 */
#ifndef KVQD_TIER_H
#define KVQD_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "hist.h"
#include "layout.h"

typedef struct kvq_tier kvq_tier;

#define KVQ_TIER_KEY_LEN 32u

struct kvq_tier_stats {
	uint64_t capacity;            /* bytes of the memfd */
	uint32_t slots[2];            /* record slots by class (sealed, sink) */
	uint32_t records[2];          /* READY, INCOMING or OUTGOING, by class */
	uint64_t bytes;               /* of those records (their record sizes) */
	uint64_t evictions;           /* READY records evicted for room, ever */
	uint64_t dropped;             /* records dropped: parent gone, or a copy given up */
};

/* A tier's records and its traffic (daemon/tiering.h counts it), for the
 * pool's figures (daemon/figures.h). */
struct kvq_tiering_stats {
	struct kvq_tier_stats tier;
	uint64_t demotions;            /* blocks stored in the tier */
	uint64_t promotions;           /* blocks copied back for lookups */
	uint64_t cancelled;            /* demotions whose slot an allocation took first */
	uint64_t copy_bytes;           /* both ways */
	uint64_t copy_us, copies;      /* time of the copy jobs, in microseconds, and their number */
	struct kvq_hist copy_time;     /* each copy job's time (the metrics' kvq_tier_copy_seconds) */
	uint64_t hit_tokens;           /* tokens of lookups' hits the tier served */
	uint64_t open_us;              /* its start: memory made or taken back, pinned (cuda pools) */
};

/*
 * A tier of capacity bytes for pool layout L (its slot counts set the
 * split between sealed and sink records); label names the memfd.  Returns
 * 0 and *ret, -EINVAL (capacity holds no sealed record; err says how many
 * bytes one takes), -ENOMEM, or the backend's code, with err set.  fd -1
 * makes new memory; else fd (taken, closed on failure too) is the memfd of
 * such a tier an earlier kvqd made (daemon/books.h), taken back with every
 * record FREE until kvq_tier_restore.
 */
int kvq_tier_new(const struct kvq_layout *L, uint64_t capacity, const char *label, int fd, kvq_tier **ret,
		 char *err, size_t errlen);

/* Frees the tier and its memory (NULL is fine). */
void kvq_tier_free(kvq_tier *t);

/* The tier's memory (its memfd and the daemon's mapping). */
const struct kvq_backend_mem *kvq_tier_mem(const kvq_tier *t);

/*
 * Reserves an INCOMING record of class cls (0 sealed, 1 sink) for the
 * block under key whose parent is parent (NULL: none), evicting READY
 * leaves as needed.  Returns the record's index, -EEXIST (key is in the
 * tier already), -ENOSPC (no slot free or evictable) or -EINVAL (a class
 * the tier has no slots of).
 */
int64_t kvq_tier_reserve(kvq_tier *t, uint32_t cls, const uint8_t *key, const uint8_t *parent);

/* INCOMING record rec's copy ended: READY, or, DOOMED meanwhile, FREE
 * (false).  Returns whether it is READY. */
bool kvq_tier_commit(kvq_tier *t, uint32_t rec);

/* INCOMING record rec's copy was given up: FREE. */
void kvq_tier_abort(kvq_tier *t, uint32_t rec);

/* The READY record under key, or -1. */
int64_t kvq_tier_find(const kvq_tier *t, const uint8_t *key);

/* READY record rec is being copied into the pool: OUTGOING. */
void kvq_tier_take(kvq_tier *t, uint32_t rec);

/* OUTGOING record rec's copy ended: FREE when consumed (the block is in
 * the pool now) or DOOMED, else READY again. */
void kvq_tier_taken(kvq_tier *t, uint32_t rec, bool consumed);

/* The pool dropped the block under key: every record below it (children,
 * recursively) dropped.  Returns how many went or were doomed. */
uint32_t kvq_tier_drop_under(kvq_tier *t, const uint8_t *key);

/* Record rec's bytes and size (kvq_blockrec_size of its class). */
uint8_t *kvq_tier_rec(const kvq_tier *t, uint32_t rec, uint64_t *ret_len);

/* Class of record rec, and its key. */
uint32_t kvq_tier_rec_cls(const kvq_tier *t, uint32_t rec);
const uint8_t *kvq_tier_rec_key(const kvq_tier *t, uint32_t rec);

/* Current counters. */
void kvq_tier_stats(const kvq_tier *t, struct kvq_tier_stats *ret);

/* hook (NULL: none) is told each record that goes other than back into
 * the pool, before its slot is freed (its bytes, key and class still
 * there): gone when the block leaves every local tier (evicted for room,
 * dropped below a block the pool dropped), else its copy failed (the
 * remote tier's write-back, daemon/rtier.h). */
void kvq_tier_set_leave_hook(kvq_tier *t, void (*hook)(void *arg, uint32_t r, bool gone), void *arg);

/* hook (NULL: none) is told each record that becomes READY (its class,
 * key and parent, NULL for none) and each that goes (key NULL), before its
 * slot can be reused: the pool's books keep them (daemon/books.h). */
void kvq_tier_set_record_hook(kvq_tier *t, void (*hook)(void *arg, uint32_t r, uint32_t cls, const uint8_t *key,
							 const uint8_t *parent),
			      void *arg);

/* Record slots in all (record indexes 0 .. this - 1). */
uint32_t kvq_tier_slots(const kvq_tier *t);

/* A tier taken back (kvq_tier_new with fd): record r READY again with
 * class cls, key and parent (NULL: none), in any order; then
 * kvq_tier_restore_end, before anything else.  Returns 0, -ERANGE (r not
 * a slot of class cls) or -EINVAL (r not free, key there already). */
int kvq_tier_restore(kvq_tier *t, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent);

/* Drops each record whose parent is neither in the tier nor, by
 * in_pool(arg, key), in the pool, with the records below it, and makes the
 * free slots allocatable.  Returns how many records went. */
uint32_t kvq_tier_restore_end(kvq_tier *t, int (*in_pool)(void *arg, const uint8_t *key), void *arg);

#endif
