/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's names for a block (docs/DESIGN.md §4, "The remote
 * tier"): which pools share (the identity digest), what a block is called
 * in a namespace shared by several nodes (the remote chain key), and the
 * Redis key its record is stored under.
 *
 * Identity digest (KVQ_REMOTE_DIGEST_LEN = 32 bytes): SHA-256 over
 * KVQ_REMOTE_IDENTITY_TAG (with its terminating NUL), then, integers
 * little-endian:
 *
 *   u32 len, model      the model id
 *   u32 len, policy     the canonical policy (kvq_policy_format: every
 *                       layer's formats and rotation)
 *   u32 x 7             layers, kv_heads, head_dim, block_tokens, window,
 *                       sink_blocks, act (the open window's dtype)
 *   u32                 the layout version (KVQ_LAYOUT_VERSION)
 *   u64                 kvq_blockrec_fingerprint of the pool's layout
 *   u32, 32 bytes       1 and the codebooks' SHA-256, or 0 and zeros
 *
 * Pools with equal digests store a block as the same bytes; pools on
 * several nodes share blocks only when they name the same remote and
 * namespace and their digests are equal (the digest is in every Redis key,
 * so another identity's records are never even asked for).
 *
 * Remote chain key: kvq_chainkey (chainkey.h) with the pool's
 * remote_namespace as the namespace, where the prefix index uses the pool's
 * name: the parent's remote chain key, the tokens, the namespace, the model
 * id and the salt the block is published with.
 *
 * Redis key: "kvq:" KVQ_REMOTE_KEY_VERSION ":" hex(identity digest) ":{"
 * hex(remote chain key) "}:" rank "/" world, e.g. "kvq:1:9f..:{3a..}:0/1";
 * the chain key is the hash tag, so every rank's record of one block is on
 * one cluster slot (kvq_rcluster_slot) and one round trip asks them all.
 */
#ifndef KVQD_REMOTE_KEY_H
#define KVQD_REMOTE_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "chainkey.h"
#include "conf.h"
#include "policy.h"

#define KVQ_REMOTE_DIGEST_LEN 32u
#define KVQ_REMOTE_IDENTITY_TAG "kvq remote identity 1"
#define KVQ_REMOTE_KEY_VERSION 1u
#define KVQ_REMOTE_KEY_PREFIX "kvq:"
#define KVQ_REMOTE_MAX_WORLD 1024u    /* ranks of a tensor-parallel group */
/* the longest Redis key, its terminator included */
#define KVQ_REMOTE_KEY_MAX (sizeof KVQ_REMOTE_KEY_PREFIX + 10 + 2 + 2 * KVQ_REMOTE_DIGEST_LEN + 4 + \
			    2 * KVQ_CHAINKEY_LEN + 1 + 10 + 1 + 10)

/* What a pool's blocks mean, for its identity digest. */
struct kvq_remote_identity {
	const char *model;                      /* the model id */
	const struct kvq_policy *policy;
	uint32_t layers, kv_heads, head_dim, block_tokens, window, sink_blocks;
	int32_t act;                            /* KVQ_DT_* of the open window */
	uint32_t layout_version;                /* KVQ_LAYOUT_VERSION */
	uint64_t fingerprint;                   /* kvq_blockrec_fingerprint of its layout */
	const uint8_t *codebooks_sha256;        /* 32 bytes, or NULL: no codebooks */
};

/* The identity digest of id, as above.  Returns 0 and ret[32], -EINVAL (a
 * NULL field, a model id over KVQ_CHAINKEY_MAX_NAME bytes, a policy that
 * does not format) or -EIO (libcrypto). */
int kvq_remote_identity_digest(const struct kvq_remote_identity *id, uint8_t ret[KVQ_REMOTE_DIGEST_LEN]);

/* k, to make remote chain keys of pool pl's blocks: in its
 * remote_namespace, of its model, for its block_tokens.  Returns 0,
 * -EINVAL (pl shares with no remote) or kvq_chainkey_init's codes; release
 * with kvq_chainkey_fini. */
int kvq_remote_chain_init(struct kvq_chainkey *k, const struct kvq_config_pool *pl);

/* The Redis key of rank's record (of world ranks; 0 of 1 outside a
 * group) of the block with remote chain key chain, in a pool of identity
 * digest id, as above, terminated, into buf[len].  Returns its length
 * without the terminator, -EINVAL (rank >= world, world 0 or over
 * KVQ_REMOTE_MAX_WORLD) or -ENOSPC (len short of it: buf untouched). */
int kvq_remote_redis_key(const uint8_t id[KVQ_REMOTE_DIGEST_LEN], const uint8_t chain[KVQ_CHAINKEY_LEN],
			 uint32_t rank, uint32_t world, char *buf, size_t len);

#endif
