/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-parallel groups (kvq.proto, "Tensor-parallel groups"): N member
 * pools, one per rank, each with its rank's shard of the model's KV heads,
 * whose prefix caches stay consistent:
 *  - the members' prefix indexes key blocks in the group's namespace (the
 *    group's name where a pool's keys have the pool's), so a block has the
 *    same key on every rank;
 *  - a group lookup sees a block only while every member holds it cached,
 *    and is keyed by a request id the ranks share: the first rank to look
 *    up an id fixes the hit n and takes a reference on those n blocks on
 *    every member at once; the others' references wait for them in a
 *    pending lookup until they look up the same id or the wait times out
 *    (kvqd.conf group_lookup_timeout_ms; at most group_pending_lookups);
 *  - eviction is by group: a member that evicts a block has the others
 *    drop their copy where it is an unreferenced leaf (kvq_prefix's evict
 *    hook); a copy that is referenced stays, invisible, until its own pool
 *    evicts it; demotion to the members' host tiers likewise (a member
 *    without a tier drops its copy);
 *  - a first rank's lookup whose chain goes on in the members' host tiers
 *    (every member holding each next block cached or there) starts each
 *    member's promotion of its part, with nobody waiting: the group's next
 *    lookup counts those blocks (daemon/tiering.h,
 *    kvq_tiering_promote_chain);
 *  - with a remote tier on every member, a first rank's lookup whose chain
 *    goes on there has every member fetch its own rank's records, and
 *    every rank's lookup of the request waits for it: a block is placed
 *    in every member only when every rank's record came, then the hit is
 *    fixed as above (daemon/group_fetch.h);
 *  - a rank that dies in a write has the others release what it does not
 *    hold (kvq_group_rank_lost, from the daemon's lease drop).
 * A member pool leaves its group when its memory is released (PoolDrop,
 * shutdown: pools.c calls kvq_group_leave through the pool's link);
 * pending lookups of the group are then dropped; a group with no member
 * left is freed, so every group has a member.  Not thread-safe: the daemon's one event loop.
 */
#ifndef KVQD_GROUPS_H
#define KVQD_GROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq.pb-c.h"
#include "pools.h"

#define KVQ_GROUP_MAX_RANKS 64u
#define KVQ_GROUP_MAX_REQUEST_ID 64u   /* bytes of a Lookup.request_id */

/* The KV heads of a rank's shard of kv_heads heads over world ranks:
 * kv_heads / world, or 1 when world is a multiple of kv_heads (heads
 * replicated); 0, with the reason in err, when neither divides the other. */
uint32_t kvq_group_shard_heads(uint32_t kv_heads, uint32_t world, char *err, size_t errlen);

/* Checks an Attach that names a group (a->group not empty) against the
 * group as it exists and against pool p (NULL when the attach creates it):
 * 0, *ret_heads (the member pool's KV heads) and *ret_window (the group's
 * window: a rank asking for none gets the others'; a->window before the
 * first member), or a negative code with err filled (-EINVAL, KVQ_ELAYOUT:
 * the group's geometry, policy, window or sink_blocks differs, -EEXIST). */
int kvq_group_check(const struct kvq_pools *ps, const Kvq__Attach *a, const struct kvq_pools_rec *p,
		    uint32_t *ret_heads, uint32_t *ret_window, char *err, size_t errlen);

/* Makes allocated pool p rank a->rank of group a->group (creating the
 * group), after kvq_group_check passed: 0 or -ENOMEM. */
int kvq_group_join(struct kvq_pools *ps, const Kvq__Attach *a, struct kvq_pools_rec *p);

/* p out of its group, if it is in one (its pending lookups dropped); the
 * group freed when it was the last member.  Before p's index goes. */
void kvq_group_leave(struct kvq_pools_rec *p);

/* Rank p's client died in a write (holding unpublished blocks): the other
 * members release (evict) every unreferenced block of theirs that p's
 * index does not hold, which could only become visible once p publishes it
 * (its restart computes them again, and so, missing, do the others). */
void kvq_group_rank_lost(struct kvq_pools_rec *p);

/* A rank's lookup waiting for its group's fetch from the remote tier
 * (kvq_group_lookup returned 1): wake(w) is called on the loop once the
 * hit is fixed (w->on NULL again), and the lookup is then made again. */
struct kvq_group_waiter {
	struct kvq_group_waiter *next;
	void *on;                              /* the group lookup it waits on; NULL: none */
	void (*wake)(struct kvq_group_waiter *w);
	void *arg;                             /* the waiter's own */
};

/*
 * The lookup of member pool p (p->glink.g set) for request rid[rid_len]:
 * up to max_ids ids into ret_ids (*ret_n of them), each with one reference
 * taken for the caller, as kvq_prefix_lookup; the same count for every
 * rank of the request.  now_ms: CLOCK_MONOTONIC; timeout_ms and
 * max_pending: kvqd.conf's.  When every member has a remote tier and the
 * chain may go on there (daemon/group_fetch.h), the first rank's lookup
 * starts the members' fetch and every rank's lookup of that request
 * waits on it in w (NULL: -EAGAIN instead): 1 is returned, nothing taken.
 * Returns 0, 1, -EINVAL (bad request id), -EALREADY (this rank looked the
 * request up already), -EBUSY (max_pending lookups wait), -EOVERFLOW (a
 * block at its reference limit; nothing taken), -EAGAIN, -ENOMEM or -EIO.
 */
int kvq_group_lookup(struct kvq_pools_rec *p, const uint8_t *rid, size_t rid_len, const uint32_t *tokens,
		     uint32_t n_tokens, uint32_t max_tokens, const void *salt, size_t salt_len, uint32_t *ret_ids,
		     uint32_t max_ids, uint32_t *ret_n, int64_t now_ms, uint64_t timeout_ms, uint64_t max_pending,
		     struct kvq_group_waiter *w);

/* w waits no more (its connection went, or its bound passed); with settle,
 * the fetch it waits on ends now: what came is placed and the hit fixed
 * (the other waiters woken), as when every reply came.  w itself is not
 * woken.  Nothing when w waits on nothing. */
void kvq_group_unwait(struct kvq_group_waiter *w, bool settle);

#endif
