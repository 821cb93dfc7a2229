/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's remote tier at work (docs/DESIGN.md §4, "The remote tier"):
 * blocks written to and fetched from a Redis Cluster (daemon/rcluster.h),
 * named by their remote chain keys (daemon/remote_key.h), stored as signed
 * values (daemon/remote_value.h) around packed block records
 * (kernels/blockrec.h).  A host pool's records are packed (on the loop)
 * and unpacked (on the copy engine's thread) through kvqd's own mapping of
 * the pool; a cuda pool's, which kvqd does not map, go through a pinned
 * staging and a channel of its backend (daemon/rstage.h): a block's slices
 * DMA'd to the host on the loop and sealed there, a fetched record checked
 * whole (layout, class, checksum) on a verifying thread before the copy
 * thread DMAs its slices into the slot (the staging is one).  A pool
 * whose channel cannot open (no driver) runs without its remote tier.
 *
 * The daemon keeps one cluster client per [remote] section
 * (kvq_rtiers_new, on its event base: a cluster down at start only means
 * misses until it answers); each pool that names a remote has a kvq_rtier
 * with its codec, identity digest and key maker.
 *
 * Remote keys of local blocks.  The record a node packs carries its own
 * prefix key, which differs from node to node; a block is named on the
 * remote by its remote chain key, which needs its parent's.  The tier
 * keeps, per block id, the remote chain key of the block cached there with
 * its local key as a tag (set at publish, by a Lookup's walk and by a
 * fetch): a block whose parent's remote key is not known (promoted from
 * the host tier, restored by a restart, published before the parent's key
 * was made) is not written (counted as dropped).
 *
 * Write (remote_write = through): each block a publish makes cached is
 * queued (bounded: a full queue drops and counts, nobody waits); the queue
 * drains from the loop after the request, each block packed from the pool
 * (a summed record: it leaves the process) only if it is still cached
 * under its key, then SET with the remote's TTL, at most a bound in
 * flight.  remote_write = back: a block is written when it leaves the last
 * local tier, its value made at once, before its bytes can be reused, and
 * queued (bounded in blocks and bytes: full, dropped and counted): when
 * the pool evicts it without a copy (the prefix index's leave hook: packed
 * from its slot), or when the host tier evicts or drops its record (the
 * tier's leave hook: the record copied and summed); a block demoted to the
 * tier has its remote keys kept, by its local key, until then.
 *
 * Fetch: kvq_rtier_fetch GETs a list of blocks (pipelined by the cluster
 * client, one connection per master); as each value arrives, the loop
 * takes it from its reply (no copy), allocates a pool slot for it and
 * hands both to the remotes' copier (daemon/copier.h: as many threads as
 * cores up to 4, values side by side), which verifies the value
 * (kvq_remote_value_verify, with a codec of the tier's own: any refusal
 * is a miss and an error of its kind) and unpacks its record into the
 * slot (a cuda pool's: checks it, then, back on the loop, hands it to the
 * daemon's copy thread for the staging's copy and the DMA), while the
 * loop receives the next values.  The caller publishes the longest run
 * of unpacked blocks when all came back or its bound passed
 * (daemon/req_lookup.c).
 *
 * Not thread-safe: the loop's; the verifying threads run only the fetch
 * jobs' verification and unpacking (a cuda pool's: the check), the copy
 * thread only a cuda pool's staging copy and DMA into the slot.
 */
#ifndef KVQD_RTIER_H
#define KVQD_RTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chainkey.h"
#include "conf.h"
#include "copier.h"
#include "hist.h"
#include "layout.h"
#include "pool.h"
#include "prefix.h"
#include "rstage.h"

struct event_base;
struct kvq_tier;
/* What the remote tier sees of a pool (daemon/pools.c fills it; the tier
 * keeps a copy until it is freed). */
struct kvq_rtier_pool {
	const char *name;                 /* for the log */
	const char *model;
	const struct kvq_policy *policy;
	const struct kvq_layout *L;
	kvq_prefix *prefix;
	kvq_pool *pool;                   /* its books: fetched blocks' slots */
	kvq_copier *const *copier;        /* the copy engine (read at each fetch: the daemon swaps it once) */
	void *map;                        /* the pool's memory as kvqd maps it; NULL: not a host pool */
	struct kvq_backend_mem *mem;      /* the pool's memory: copied through a channel where map is NULL */
	const uint8_t *codebooks_sha256;  /* NULL: no codebooks */
	struct kvq_tier *tier;            /* its host tier's records (daemon/tier.h), or NULL */
};
struct kvq_rtiers;
struct kvq_rtier;

/* The errors of the remote tier, by kind: the cluster client's failures,
 * the value's refusals (remote_value.h), a record that does not unpack,
 * and a reply of another type than asked (an error reply). */
/* Blocks one Lookup fetches at most (its prompts together). */
#define KVQ_RTIER_FETCH_MAX 64u

#define KVQ_RTIER_ERRORS(X) \
	X(TIMEOUT, "timeout") X(CONN, "conn") X(DOWN, "down") X(LOOP, "loop") X(AUTH, "auth") X(FULL, "full") \
	X(CANCELLED, "cancelled") \
	X(OVERSIZE, "oversize") X(MAGIC, "magic") X(TRUNCATED, "truncated") X(VERSION, "version") \
	X(IDENTITY, "identity") X(KEY, "key") X(HMAC, "hmac") X(RECORD, "record") X(REPLY, "reply")

enum kvq_rtier_error {
#define KVQ_RTIER_E(id, name) KVQ_RTIER_E_##id,
	KVQ_RTIER_ERRORS(KVQ_RTIER_E)
#undef KVQ_RTIER_E
	KVQ_RTIER_NERRORS
};

/* A pool's remote figures (daemon/figures.h; all 0 without a remote). */
struct kvq_rtier_stats {
	uint64_t hit_tokens;           /* tokens of lookups' hits the remote served */
	uint64_t fetched;              /* blocks fetched, verified and placed in the pool */
	uint64_t absent;               /* blocks asked for that the remote did not have */
	uint64_t written;              /* blocks SET */
	uint64_t dropped;              /* blocks not written: queue full, parent's key unknown, gone */
	uint64_t bytes_in, bytes_out;  /* of values */
	uint64_t queue;                /* blocks waiting to be written, and SETs in flight */
	uint64_t errors[KVQ_RTIER_NERRORS];
	/* each fetch's time: from its GETs to its last value unpacked or
	 * refused (what a Lookup waits for the remote, its bound aside) */
	struct kvq_hist fetch_time;
	bool on;                       /* the pool has a remote tier */
};

/* The cluster clients of cfg's [remote] sections on base.  Returns 0 and
 * *ret (NULL when there is none), or a negative code with err set. */
int kvq_rtiers_new(struct event_base *base, const struct kvq_config *cfg, struct kvq_rtiers **ret, char *err,
		   size_t errlen);

/* Waits until every fetched value on the verifying threads was verified
 * and unpacked, and hands them back (NULL is fine); a cuda pool's checked
 * records are then on the daemon's copy engine: drain it after. */
void kvq_rtiers_drain(struct kvq_rtiers *rs);

/* Ends every request (its callbacks run) and frees; after the pools' tiers
 * (NULL is fine). */
void kvq_rtiers_free(struct kvq_rtiers *rs);

/* Pool p's remote tier, when its section cp names a remote (else 0 and
 * *ret NULL).  p must be allocated.  Returns 0 or a
 * negative code with err set (-EOPNOTSUPP: a pool kvqd neither maps nor
 * copies through a channel, or whose channel did not open). */
int kvq_rtier_new(struct kvq_rtiers *rs, const struct kvq_config_pool *cp, const struct kvq_rtier_pool *p,
		  struct kvq_rtier **ret, char *err, size_t errlen);

/* Detaches from the pool (nothing of it is touched again) and frees once
 * the last request in flight ended (NULL is fine). */
void kvq_rtier_free(struct kvq_rtier *t);

/* The pool is rank of world in a tensor-parallel group (world 0 or 1:
 * none): its records are written and asked for under that rank's keys. */
void kvq_rtier_set_rank(struct kvq_rtier *t, uint32_t rank, uint32_t world);

void kvq_rtier_stats(const struct kvq_rtier *t, struct kvq_rtier_stats *ret);


/* Counts an error of kind e (a record that did not unpack, ...). */
void kvq_rtier_count_error(struct kvq_rtier *t, enum kvq_rtier_error e);

/* The remote chain key of the block after parent (NULL: a first block)
 * with tokens[B] and salt: 0 or a negative code. */
int kvq_rtier_chain(struct kvq_rtier *t, const uint8_t *parent, const uint32_t *tokens, const void *salt,
		    size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN]);

/* Block id is cached now with remote chain key chain. */
void kvq_rtier_learn(struct kvq_rtier *t, uint32_t id, const uint8_t chain[KVQ_CHAINKEY_LEN]);

/* Block id, just published (cached now, new) after parent (-1: none) with
 * tokens and salt: its remote key learnt and, with remote_write = through,
 * its write queued. */
void kvq_rtier_published(struct kvq_rtier *t, uint32_t id, int32_t parent, const uint32_t *tokens,
			 const void *salt, size_t salt_len);

/* One block of a fetch: what to ask (filled by the caller), then what came. */
struct kvq_rtier_get {
	uint8_t chain[KVQ_CHAINKEY_LEN];
	bool sink;                     /* its slot a sink block's (a chain's first block, in a pool with sinks) */
	bool done;                     /* its reply came (or it failed) */
	/* the slot its record was unpacked into, verified (a reference the
	 * fetch holds until it ends: the caller takes it by setting
	 * UINT32_MAX here), or UINT32_MAX: a miss, or not there yet (a copy
	 * still running when the caller stops waiting stays the fetch's) */
	uint32_t slot;
};

struct kvq_rtier_fetch;

/* GETs g[0..n) (copied into the fetch; read them back with
 * kvq_rtier_fetch_gets); done(arg) is called on the loop once every one
 * came back and was unpacked or refused, never from within this call.  Returns 0 and *ret, 1 and *ret
 * when every request failed at once (done will not be called: end it), or
 * -ENOMEM. */
int kvq_rtier_fetch(struct kvq_rtier *t, const struct kvq_rtier_get *g, uint32_t n, void (*done)(void *arg),
		    void *arg, struct kvq_rtier_fetch **ret);

/* The fetch's blocks, in the order asked. */
struct kvq_rtier_get *kvq_rtier_fetch_gets(struct kvq_rtier_fetch *f);

/* Publishes the block g's fetch unpacked into g->slot (taken from g: set
 * to UINT32_MAX) after parent (-1: none) with tokens and salt; another
 * copy cached meanwhile is taken instead (referenced, the slot dropped).
 * Its remote key learnt, it counts as a block placed and a block of hit
 * tokens.  Returns 0 and *ret_id, holding one reference, or a negative
 * code (the slot dropped). */
int kvq_rtier_place(struct kvq_rtier *t, struct kvq_rtier_get *g, int32_t parent, const uint32_t *tokens,
		    const void *salt, size_t salt_len, uint32_t *ret_id);

/* The caller is done with f: freed now, or when its last reply and copy
 * come (done is then never called); the slots the caller did not take are
 * dropped. */
void kvq_rtier_fetch_end(struct kvq_rtier_fetch *f);

#endif
