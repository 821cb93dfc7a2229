/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefix index of one pool: sealed blocks by content key, so that a
 * prompt prefix one worker computed is reused, still quantized, by others.
 *
 * Key of a block (KVQ_PREFIX_KEY_LEN = 32 bytes): its chain key (chainkey.h)
 * in the pool's name, SHA-256 over, in order:
 *
 *   parent key          32 bytes: the parent block's key, or 32 zero bytes
 *                       for the first block of a sequence
 *   tokens              B token ids, each a u32 little-endian (4*B bytes)
 *   u32 LE len, pool    the pool name, len bytes (no terminator)
 *   u32 LE len, model   the model id, len bytes
 *   u32 LE len, salt    the per-request salt, len bytes; len 0 when there is
 *                       none (no salt and an empty salt are the same)
 *
 * The daemon computes keys from the tokens the client sends and the parent
 * the client names by block id; the client never supplies a key.  A salt
 * keeps tenants from hitting each other's blocks, it does not keep them from
 * writing them: isolation takes separate pools.
 *
 * Ownership.  daemon/pool.h owns slot states and reference counts; this index
 * owns, for each CACHED block, its key, its parent, its count of cached
 * children and its place in the eviction order.  kvq_prefix_new() attaches the
 * index to its pool (kvq_pool_set_cache()), so that the pool tells it about
 * references and asks it to evict when allocation needs room; evicted slots go
 * back to the pool through kvq_pool_cache_evicted().  Free the index before
 * its pool.
 *
 * Eviction.  Only a block with no reference and no cached child (a leaf) is
 * evictable, so a chain is evicted from its end and a cached block's parent is
 * always cached.  Among evictable leaves, the one whose last reference went
 * longest ago goes first (least recently used).  A parent becomes a leaf when
 * its last child is evicted and then takes its place by its own release time,
 * which an append-only LRU list cannot do: the order is a binary heap of
 * evictable leaves, O(log n) per change.
 *
 * In a pool with sink slots (pool.h) a chain's first block is a sink block
 * and the rest sealed ones (the server checks it at publish), so a sink is
 * evicted after its chain, as any parent; the eviction order is one for both
 * classes, and an allocation short of one class evicts in that order until
 * enough of its class went.
 *
 * To refuse an allocation without evicting anything, the pool needs the
 * number of blocks eviction can reach: a cached block is reachable unless it
 * or one of its descendants is referenced ("pinned").  Each block counts its
 * pinned children, and a change of pinned state is carried up the chain only
 * while ancestors change too; a client that holds a chain from its root (as
 * lookup and publish leave it) stops the carry at once.  Worst case: the depth
 * of the chain, never the size of the pool.
 *
 * Cost: hash table of key -> block with chaining, sized from n_sealed,
 * bucket index from the key through a random multiplier (an attacker who can
 * compute keys cannot aim tokens at one bucket): O(1) expected per lookup,
 * insert and removal.
 *
 * Not thread-safe: the daemon runs one event loop.
 */
#ifndef KVQD_PREFIX_H
#define KVQD_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

typedef struct kvq_prefix kvq_prefix;

#define KVQ_PREFIX_KEY_LEN 32u
#define KVQ_PREFIX_MAX_NAME 256u   /* bytes of a pool name or model id */
#define KVQ_PREFIX_MAX_SALT 256u   /* bytes of a salt */

/*
 * New index for pool (its n_sealed + n_sink blocks, pool.h) with blocks of block_tokens tokens
 * (1 .. KVQ_MAX_BLOCK_TOKENS) and the namespace pool_name, model_id (each
 * 1 .. KVQ_PREFIX_MAX_NAME bytes).  Attaches itself to pool.  Returns 0 and
 * *ret, -EINVAL, -ENOMEM, or -EIO when libcrypto fails.
 */
int kvq_prefix_new(kvq_pool *pool, uint32_t block_tokens, const char *pool_name, const char *model_id,
		   kvq_prefix **ret);

/* Detaches the index from its pool and frees it (NULL is fine).  Blocks it
 * held stay CACHED in the pool: free the pool next. */
void kvq_prefix_free(kvq_prefix *x);

/*
 * The key of a block, as documented above: parent_key is 32 bytes or NULL for
 * the first block; tokens[block_tokens]; salt may be NULL when salt_len is 0.
 * Returns 0 and ret_key[32], -EINVAL (lengths beyond the limits) or -EIO.
 */
int kvq_prefix_key(const uint8_t *parent_key, const uint32_t *tokens, uint32_t block_tokens,
		   const char *pool_name, const char *model_id, const void *salt, size_t salt_len,
		   uint8_t ret_key[KVQ_PREFIX_KEY_LEN]);

/*
 * Publishes PRIVATE block id, holding tokens[B], after parent (a CACHED block,
 * or -1 for the first block of a sequence).  When the key is not cached yet
 * the block becomes CACHED (keeping its references) and *ret_id = id.  When
 * it is, nothing changes and *ret_id is the cached block: the caller then
 * takes a reference on it and drops its duplicate.  Returns 0, -ERANGE (id or
 * parent out of range), -EINVAL (id not private, parent not cached, salt too
 * long) or -EIO.
 */
int kvq_prefix_publish(kvq_prefix *x, uint32_t id, int32_t parent, const uint32_t *tokens,
		       const void *salt, size_t salt_len, uint32_t *ret_id);

/*
 * Longest chain of cached blocks matching tokens[n_tokens] from its start, in
 * whole blocks, covering at most max_tokens tokens (rounded down to whole
 * blocks; callers pass S(n) of the prompt, kvq_layout_split()) and at most
 * max_ids blocks.  Takes one reference on each block returned.  Returns 0 and
 * ret_ids[*ret_count] (possibly none), -EINVAL (salt too long), -EOVERFLOW (a
 * block at KVQ_POOL_MAX_REFS; nothing taken) or -EIO.
 */
int kvq_prefix_lookup(kvq_prefix *x, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t max_ids,
		      uint32_t *ret_count);

/* The length in blocks of the chain kvq_prefix_lookup would return, with
 * no reference taken: 0 and *ret_count, -EINVAL or -EIO. */
int kvq_prefix_match(kvq_prefix *x, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		     const void *salt, size_t salt_len, uint32_t max_ids, uint32_t *ret_count);

/*
 * Evicts up to count evictable blocks, leaf first, least recently used first
 * (also what the pool calls when allocation needs room).  Writes the victims
 * to ret_ids[] when it is not NULL (room for count) and their number to
 * *ret_evicted.  Returns 0.
 */
int kvq_prefix_evict(kvq_prefix *x, uint32_t count, uint32_t *ret_ids, uint32_t *ret_evicted);

/* Evicts the block cached under key when it is an evictable leaf: 0,
 * -ENOENT (no such block) or -EBUSY (referenced, or a parent). */
int kvq_prefix_evict_key(kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN]);

/* Whether a block is cached under key. */
int kvq_prefix_has(const kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN]);

/* Evicts every evictable block whose key keep(arg, key) rejects, leaf first
 * (a parent that becomes an evictable leaf is asked too); returns how many,
 * or -ENOMEM (nothing evicted). */
int kvq_prefix_evict_unless(kvq_prefix *x, int (*keep)(void *arg, const uint8_t *key), void *arg);

/* hook (NULL: none) is told the key of every block the index evicts, before
 * the block goes, and whether it goes to the host tier (demote) or is
 * dropped (a tensor-parallel group's members evict and demote together,
 * daemon/groups.h); it may evict or demote blocks of other indexes, not
 * this one's. */
void kvq_prefix_set_evict_hook(kvq_prefix *x, void (*hook)(void *arg, const uint8_t *key, int demote),
			       void *arg);

/* hook (NULL: none) is told the key of every block the index evicts
 * without a copy to the host tier (not those kvq_prefix_demote takes),
 * before it goes: the tier drops the records below it (daemon/tiering.h). */
void kvq_prefix_set_drop_hook(kvq_prefix *x, void (*hook)(void *arg, const uint8_t *key), void *arg);

/* hook (NULL: none) is told each block the index evicts, by its id and its
 * parent's (-1: none), and whether it goes to the host tier (demote) or
 * without a copy, while both are still cached and the block's bytes still
 * in its slot: the remote tier's write-back packs it there, or keeps its
 * remote key for the tier's record (daemon/rtier.h). */
void kvq_prefix_set_leave_hook(kvq_prefix *x, void (*hook)(void *arg, uint32_t id, int32_t parent, int demote),
			       void *arg);

/* hook (NULL: none) is told each block that enters the index (publish,
 * restore: its id, key and parent id, -1 for none) and each that leaves it
 * (key NULL), before its slot can change hands: the pool's books
 * (daemon/books.h) keep them for a restart. */
void kvq_prefix_set_record_hook(kvq_prefix *x, void (*hook)(void *arg, uint32_t id, const uint8_t *key,
							    int32_t parent),
				void *arg);

/* A restarted pool's cached block id (CACHED in the pool already,
 * kvq_pool_adopt) back into the index under key after parent (restored
 * before it, or -1), as the last block of its chain; held when the pool
 * counts references on it.  Returns 0, -ERANGE, or -EINVAL (id not cached
 * in the pool or in the index already, parent not in the index, key
 * there already). */
int kvq_prefix_restore(kvq_prefix *x, uint32_t id, const uint8_t key[KVQ_PREFIX_KEY_LEN], int32_t parent);

/* A block kvq_prefix_demote took: its id (now DEMOTING in the pool), key
 * and parent's key (zeros when it has none). */
struct kvq_prefix_victim {
	uint32_t id;
	int cls;                        /* 0 sealed, 1 sink */
	int has_parent;
	uint8_t key[KVQ_PREFIX_KEY_LEN], parent[KVQ_PREFIX_KEY_LEN];
};

/* Takes evictable blocks out of the index in the eviction order (blocks of
 * either class, as an allocation short of class cls evicts them) until
 * count of class cls (0 sealed, 1 sink) or max in all went, into the
 * pool's DEMOTING state (kvq_pool_cache_demoting) for their copy to the
 * host tier; the evict hook is told as for an eviction, the drop hook is
 * not.  Returns how many, ret[0..n). */
uint32_t kvq_prefix_demote(kvq_prefix *x, int cls, uint32_t count, uint32_t max, struct kvq_prefix_victim *ret);

/* Takes the block under key out of the index for its copy to the host
 * tier as kvq_prefix_demote does, when it is an evictable leaf: 0 and *ret,
 * -ENOENT (not cached) or -EBUSY (referenced, or a parent). */
int kvq_prefix_demote_key(kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN], struct kvq_prefix_victim *ret);

/* The key of the block after parent_key (NULL: a first block) holding
 * tokens[B], in this index's namespace.  0, -EINVAL (salt too long) or -EIO. */
int kvq_prefix_chain_key(kvq_prefix *x, const uint8_t *parent_key, const uint32_t *tokens, const void *salt,
			 size_t salt_len, uint8_t ret_key[KVQ_PREFIX_KEY_LEN]);

/* The cached block under key, or -1. */
int64_t kvq_prefix_find(const kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN]);

/* Cached blocks of class cls (0 sealed, 1 sink; -1 both) eviction could
 * free now, leaf by leaf (unpinned ones). */
uint32_t kvq_prefix_evictable(const kvq_prefix *x, int cls);

/* Stored key of CACHED block id.  Returns 0 and ret_key[32], -ERANGE or -EINVAL. */
int kvq_prefix_block_key(const kvq_prefix *x, uint32_t id, uint8_t ret_key[KVQ_PREFIX_KEY_LEN]);

/* Parent of CACHED block id: a block id, -1 for a first block, or -ERANGE /
 * -EINVAL when id is not a cached block. */
int64_t kvq_prefix_parent(const kvq_prefix *x, uint32_t id);

#endif
