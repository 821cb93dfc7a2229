/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A tensor-parallel group's fetch from the remote tier (docs/DESIGN.md §4,
 * "The remote tier"): for a group lookup whose chain stops in the members'
 * pools, every member GETs its own rank's records of the blocks after the
 * hit (kvq_rtier_set_rank: each rank's key; the chain key is the hash tag,
 * so every rank's record of a block is on one shard and the members' GETs,
 * sent in one turn of the loop, go out together on its connection); once
 * they came back, a block is placed in every member only when every
 * rank's record came verified (or the member caches it already), in chain
 * order up to the first that is missing anywhere.  The group lookup then
 * counts the blocks every member caches, as always (daemon/groups.c).
 * Not thread-safe: the loop's.
 */
#ifndef KVQD_GROUP_FETCH_H
#define KVQD_GROUP_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "pools.h"

struct kvq_group_fetch;

/* Whether members m[0..world) may fetch blocks [n, end) of tokens' chain:
 * each has a remote tier, the chain goes on past n, and no member's host
 * tier holds block n (its promotion is served first). */
bool kvq_group_fetch_wanted(struct kvq_pools_rec *const *m, uint32_t world, const uint32_t *tokens, uint32_t n,
			    uint32_t end, const void *salt, size_t salt_len);

/* Starts every member's GETs of blocks [n, end) of tokens' chain (tokens
 * and salt copied); done(arg) is called on the loop once each came back,
 * never from within this call.  Returns 0 and *ret, -ENOENT (no request
 * went out: done will not be called) or -ENOMEM. */
int kvq_group_fetch_start(struct kvq_pools_rec *const *m, uint32_t world, const uint32_t *tokens, uint32_t n,
			  uint32_t end, const void *salt, size_t salt_len, void (*done)(void *arg), void *arg,
			  struct kvq_group_fetch **ret);

/* Places what came (what has not, yet, is a miss) into every member, in
 * chain order from n up to the first block a rank's record is missing for
 * or that does not fit; each member's chain keeps one reference of the
 * fetch's until kvq_group_fetch_end, so nothing placed is evicted before
 * the group's hit takes its own.  Returns the blocks placed. */
uint32_t kvq_group_fetch_place(struct kvq_group_fetch *f);

/* Drops the fetch's references and frees it (replies still out are
 * dropped as they come; NULL is fine). */
void kvq_group_fetch_end(struct kvq_group_fetch *f);

#endif
