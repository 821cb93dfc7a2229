/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's host tier at work: demotion of cached blocks into it, and their
 * promotion back for a Lookup (docs/DESIGN.md, "The host tier").  Joins the
 * pool's books (daemon/pool.h), its prefix index (daemon/prefix.h), the
 * tier's records (daemon/tier.h) and the copy engine (daemon/copier.h).
 *
 * Demotion.  kvq_tiering_demote, called after each request on the pool and
 * after each copy, keeps a reserve of free slots: when free and demoting
 * slots of a class fall under reserve_pct of its slots, the least recently
 * used evictable blocks leave the index (kvq_prefix_demote: DEMOTING in the
 * pool), a tier record is reserved for each, and one job packs them all
 * (kernels/blockrec.h) into the tier; when it ran, each record is
 * committed and its slot freed.  An allocation that needs a demoting slot
 * takes it (daemon/pool.h): the cancel hook bumps the slot's generation,
 * so the job's record for it is dropped when the job comes back.  A block
 * the pool drops without a copy takes the tier's records below it along
 * (kvq_tier_drop_under), so every record's parent is in the pool or the
 * tier.
 *
 * Promotion.  kvq_tiering_promote takes READY records (chains found by the
 * caller, daemon/req_lookup.c), allocates a pool slot for each as any
 * allocation does, and one job unpacks them; ready() is then called on the
 * loop, and the caller publishes the blocks and ends the promotion with
 * kvq_promotion_end.
 *
 * Not thread-safe: the loop's; the copy thread runs only the jobs' run().
 */
#ifndef KVQD_TIERING_H
#define KVQD_TIERING_H

#include <stdbool.h>
#include <stdint.h>

#include "copier.h"
#include "pool.h"
#include "prefix.h"
#include "tier.h"

struct kvq_tiering;

/* What the tier works on: an allocated pool's parts (daemon/pools.h). */
struct kvq_tiering_pool {
	const char *name;              /* for the log */
	struct kvq_backend_mem *mem;   /* its memory: mem->map, or its backend's channel (backend.h) */
	const struct kvq_layout *L;
	kvq_pool *pool;
	kvq_prefix *prefix;
	int tier_fd;                   /* the memfd of its tier an earlier kvqd made (taken), or -1 */
};

/* The tier of an allocated pool p (copied): capacity bytes of records
 * (tier.h), its copies on *cp (read at each copy: the daemon swaps its
 * copier once): through the daemon's mapping of the pool (host), else the
 * backend's channel (cuda: the tier pinned, the pool mapped in the
 * device's primary context).  Hooks itself into p's books and index.
 * Returns 0 and *ret, or a negative code with err set (-EOPNOTSUPP: the
 * pool's memory cannot be reached, or the tier not pinned). */
int kvq_tiering_new(const struct kvq_tiering_pool *p, uint64_t capacity, kvq_copier *const *cp, struct kvq_tiering **ret,
		    char *err, size_t errlen);

/* Waits for the tier's copies (kvq_copier_drain), unhooks it and frees it
 * (NULL is fine); before the pool's memory goes. */
void kvq_tiering_free(struct kvq_tiering *tg);

/* Starts demotions while free slots are short of reserve_pct percent of a
 * class's slots, at most max_inflight blocks in flight. */
void kvq_tiering_demote(struct kvq_tiering *tg, uint32_t reserve_pct, uint32_t max_inflight);

/* Demotes up to count evictable blocks now, in the eviction order, beyond
 * the reserve and the in-flight bound (an admin's Evict with demote):
 * how many left the index for the tier (their copies run on). */
uint32_t kvq_tiering_demote_count(struct kvq_tiering *tg, uint32_t count);

/* Demotes the block under key when it is an evictable leaf (a
 * tensor-parallel group's member, told that another member demoted it):
 * 0, -ENOENT, -EBUSY (kvq_prefix_demote_key) or -ESHUTDOWN. */
int kvq_tiering_demote_key(struct kvq_tiering *tg, const uint8_t *key);

/* The READY record under key, or -1. */
int64_t kvq_tiering_find(const struct kvq_tiering *tg, const uint8_t *key);

/* Counts tokens of a lookup's hit that the tier served. */
void kvq_tiering_count_hit(struct kvq_tiering *tg, uint64_t tokens);

struct kvq_promotion {
	struct kvq_copy_job job;
	struct kvq_tiering *tg;
	uint32_t n;                    /* records, in chain order within each chain */
	uint32_t *rec, *id;            /* the records, the pool slots they go to */
	int result;                    /* the copy's: 0 or a negative code */
	void (*ready)(struct kvq_promotion *pr, void *arg);
	void *arg;
};

/*
 * Copies records rec[n] (READY, found with kvq_tiering_find) into new pool
 * slots of their classes (PRIVATE, one reference each: the caller's);
 * ready(pr, arg) is called on the loop once they are in place (pr->result
 * 0) or the copy failed.  Returns 0 and *ret, -ENOSPC (the pool has no
 * room for them; nothing changed) or -ENOMEM.
 */
int kvq_tiering_promote(struct kvq_tiering *tg, const uint32_t *rec, uint32_t n,
			void (*ready)(struct kvq_promotion *pr, void *arg), void *arg, struct kvq_promotion **ret);

/* Promotes records rec[n], a chain's next blocks after the block cached
 * under parent_key (NULL: the chain's first), holding tokens[n x B], with
 * nobody waiting: once in place they are published in order with salt and
 * stay cached with no reference (a tensor-parallel group's lookup, which
 * answers with what every member holds now).  0, -ENOSPC (no room; nothing
 * changed) or -ENOMEM. */
int kvq_tiering_promote_chain(struct kvq_tiering *tg, const uint32_t *rec, uint32_t n, const uint8_t *parent_key,
			      const uint32_t *tokens, const void *salt, size_t salt_len);

/* Ends pr: the records whose consumed[] is true are in the pool now (their
 * tier records freed), the others go back to READY (consumed NULL: all
 * do); frees pr.  The slots are the caller's (published or released). */
void kvq_promotion_end(struct kvq_promotion *pr, const bool *consumed);

void kvq_tiering_stats(const struct kvq_tiering *tg, struct kvq_tiering_stats *ret);

/* The tier's records. */
kvq_tier *kvq_tiering_tier(const struct kvq_tiering *tg);

#endif
