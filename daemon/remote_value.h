/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block's value in the remote tier (docs/DESIGN.md §4, "The remote
 * tier"): a header, the payload (the packed block record, kernels/blockrec.h,
 * byte for byte) and an HMAC-SHA256 with the remote's key.  Layout
 * (integers little-endian, offsets in bytes):
 *
 *   0    8  magic         KVQ_REMOTE_VALUE_MAGIC
 *   8    4  version       KVQ_REMOTE_VALUE_VERSION
 *   12   4  flags         KVQ_REMOTE_VALUE_PARENT: the block has a parent;
 *                         no other bit is set
 *   16   4  rank          } the record's tensor-parallel rank, of world
 *   20   4  world         } ranks (0 of 1 outside a group)
 *   24   8  payload length
 *   32  32  identity      the pool's identity digest (remote_key.h)
 *   64  32  chain key     the block's remote chain key
 *   96  32  parent        its parent's remote chain key, or zeros
 *   128     payload
 *   ..  32  HMAC-SHA256   with the remote's key over: the Redis key's
 *                         length (u32) and bytes (kvq_remote_redis_key of
 *                         identity, chain key, rank, world), the header
 *                         and the payload
 *
 * The MAC covers the key the value is stored under, so a value copied
 * under another key (another block, rank or identity) fails it; the
 * verifier also compares the header with the key it asked for first, to
 * tell such a copy from a damaged value.
 *
 * The refusals, each a status and a name (kvq_remote_refusal_name, the
 * error counters' kind), checked in this order:
 *
 *   -EFBIG            oversize   over max_value (before anything is read)
 *   -ENOMSG           magic      the first bytes are not the magic
 *   -EMSGSIZE         truncated  shorter than a header and a MAC, or a length
 *                                other than the header's (cut, or trailing
 *                                bytes)
 *   -EPROTONOSUPPORT  version    another version (or, MAC checked, a flag
 *                                no writer of this version sets)
 *   -EMEDIUMTYPE      identity   the header names another identity than
 *                                the one asked for
 *   -ENOKEY           key        another chain key, rank or world than
 *                                asked for: a copy under another key
 *   -EBADMSG          hmac       any other byte changed, or another key
 *                                signed it
 */
#ifndef KVQD_REMOTE_VALUE_H
#define KVQD_REMOTE_VALUE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "remote_key.h"

#define KVQ_REMOTE_VALUE_MAGIC "KVQRVALU"   /* 8 bytes, no terminator */
#define KVQ_REMOTE_VALUE_VERSION 1u
#define KVQ_REMOTE_VALUE_HEADER 128u
#define KVQ_REMOTE_VALUE_MAC 32u
#define KVQ_REMOTE_VALUE_PARENT 1u

#define KVQ_REMOTE_NREFUSALS 7

/* What names a value: its identity, chain key and rank of world; with
 * its parent's chain key where it has one. */
struct kvq_remote_value_head {
	uint8_t identity[KVQ_REMOTE_DIGEST_LEN];
	uint8_t chain[KVQ_CHAINKEY_LEN];
	int has_parent;
	uint8_t parent[KVQ_CHAINKEY_LEN];       /* zeros without one */
	uint32_t rank, world;
};

typedef struct kvq_remote_codec kvq_remote_codec;

/* A codec with the remote's HMAC key key[key_len] (copied; 32 bytes or
 * more) and values of at most max_value bytes; threads may encode and
 * verify with one codec at once.  Returns 0 and *ret, -EINVAL or -ENOMEM /
 * -EIO (libcrypto). */
int kvq_remote_codec_new(const void *key, size_t key_len, size_t max_value, kvq_remote_codec **ret);

/* Frees (NULL is fine); the key is wiped. */
void kvq_remote_codec_free(kvq_remote_codec *c);

/* Bytes of the value of a payload of plen bytes. */
size_t kvq_remote_value_size(size_t plen);

/* Where the payload starts in a value: a packer may write the record
 * there first and pass that pointer as payload (it is then not copied). */
static inline void *kvq_remote_value_payload(void *buf)
{
	return (uint8_t *)buf + KVQ_REMOTE_VALUE_HEADER;
}

/* Writes the value of payload[plen] named by h (rank < world, as
 * kvq_remote_redis_key) into buf[len].  Returns 0 and its size in
 * *ret_len, -EFBIG (over max_value), -ENOSPC (len short of it), -EINVAL
 * or -EIO; on failure buf's contents are undefined. */
int kvq_remote_value_encode(kvq_remote_codec *c, const struct kvq_remote_value_head *h, const void *payload,
			    size_t plen, void *buf, size_t len, size_t *ret_len);

/* Checks buf[len], read under the key of want's identity, chain key, rank
 * and world (want's parent is not compared).  Returns 0 with the header
 * in *ret_head and the payload at *ret_payload (in buf) of *ret_plen
 * bytes, or a refusal's status (the table above: nothing returned), or
 * -EINVAL / -EIO.  Compares the MAC in constant time; reads nothing past
 * buf[len]. */
int kvq_remote_value_verify(kvq_remote_codec *c, const struct kvq_remote_value_head *want, const void *buf,
			    size_t len, struct kvq_remote_value_head *ret_head, const void **ret_payload,
			    size_t *ret_plen);

/* The refusal of a status, as an index (0 .. KVQ_REMOTE_NREFUSALS - 1, in
 * the order above), or -1 for 0 and any other status. */
int kvq_remote_refusal_index(int status);

/* Its name ("truncated", ...; "ok" for 0, "error" for another). */
const char *kvq_remote_refusal_name(int status);

#endif
