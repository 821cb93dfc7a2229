/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The packed block record: one block (sealed, or a sink block) out of its
 * pool, every layer's slice with the block's prefix key, its parent's key
 * and its tokens, in one self-describing buffer that a pool of the same
 * layout takes back.  What the host tier, the restart snapshot and the
 * remote tier store (docs/DESIGN.md, "Block records").
 *
 * Layout of a record (integers little-endian, offsets in bytes):
 *
 *   0    8  magic          KVQ_BLOCKREC_MAGIC
 *   8    4  version        KVQ_BLOCKREC_VERSION
 *   12   4  flags          KVQ_BLOCKREC_PARENT: the block has a parent;
 *                          KVQ_BLOCKREC_TOKENS: the tokens field holds its
 *                          tokens (a packer that has only the key, as the
 *                          daemon's prefix index, writes zeros);
 *                          KVQ_BLOCKREC_UNSUMMED: the checksum was not
 *                          computed (its field is zero): a record that
 *                          never leaves the memory of the process that
 *                          wrote it (the host tier, whose copies must run
 *                          at the bus's speed); one read from outside
 *                          (a snapshot, a peer) must be summed, and its
 *                          reader refuses one that is not
 *                          (kvq_blockrec_info.summed); no other bit is set
 *   16   8  length         bytes of the whole record (kvq_blockrec_size)
 *   24   8  checksum       XXH64 (seed 0) of the whole record, this field
 *                          taken as 8 zero bytes; zero when unsummed
 *   32   4  class          enum kvq_block_class (blockref.h)
 *   36   4  layers         } the pool's geometry, for the reason a
 *   40   4  kv_heads       } refusal gives; the fingerprint is what
 *   44   4  head_dim       } decides
 *   48   4  block_tokens   B
 *   52   4  layout version KVQ_LAYOUT_VERSION of the packing pool
 *   56   8  fingerprint    kvq_blockrec_fingerprint of the packing pool
 *   64  32  key            the block's prefix key (daemon/prefix.h): its
 *                          identity in every tier
 *   96  32  parent         the parent's key; zeros without a parent
 *   128 4B  tokens         the block's B token ids, u32 each, or zeros
 *   ..      slices         layer 0's slice of the block, then layer 1's, ..
 *                          (kvq_layout_slice_bytes each: sealed_slice, or
 *                          open_slice for a sink block), copied as the
 *                          pool stores them (kvq_format.h)
 *
 * B is a multiple of 16, so the slices start 64-byte aligned in the record.
 * Any change to this layout, the checksum or the fingerprint's input
 * changes KVQ_BLOCKREC_VERSION; a reader takes only its own version.
 */
#ifndef KVQ_BLOCKREC_H
#define KVQ_BLOCKREC_H

#include <stddef.h>
#include <stdint.h>

#include "blockref.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_BLOCKREC_MAGIC "KVQBLKRC"   /* 8 bytes, no terminator */
#define KVQ_BLOCKREC_VERSION 3u        /* 2: the tokens flag; 3: the unsummed flag */
#define KVQ_BLOCKREC_HEADER 128u        /* bytes before the tokens */
#define KVQ_BLOCKREC_KEY_LEN 32u        /* daemon/prefix.h's KVQ_PREFIX_KEY_LEN */
#define KVQ_BLOCKREC_PARENT 1u          /* flags: the parent field is a key */
#define KVQ_BLOCKREC_TOKENS 2u          /* flags: the tokens field holds the tokens */
#define KVQ_BLOCKREC_UNSUMMED 4u        /* flags: no checksum (the field is zero) */

/* The header of a checked record, decoded. */
struct kvq_blockrec_info {
	uint32_t cls;                           /* enum kvq_block_class */
	int has_parent;
	int has_tokens;                         /* tokens[] is the block's; else zeros */
	int summed;                             /* the checksum was computed (and matched) */
	uint8_t key[KVQ_BLOCKREC_KEY_LEN];
	uint8_t parent[KVQ_BLOCKREC_KEY_LEN];   /* zeros without a parent */
	uint32_t n_tokens;                      /* B */
	uint32_t tokens[KVQ_MAX_BLOCK_TOKENS];
};

/* A 64-bit digest (FNV-1a 64 of the fields, each u32 or u64 LE, in this
 * order) of what a block's bytes mean in L: the layout version,
 * layers, heads, head dim, B, the activation dtype and each layer's formats,
 * rotation, slice and field sizes and offsets; not the slot counts, the
 * window or the codebooks' contents (those are the pool's identity). */
uint64_t kvq_blockrec_fingerprint(const struct kvq_layout *L);

/* Bytes of a record of a block of class cls in L, 0 for no class. */
uint64_t kvq_blockrec_size(const struct kvq_layout *L, uint32_t cls);

/*
 * Packs block r of the pool at base (L's bytes, host-addressable), with its
 * key, its parent's key (NULL: none) and tokens[B] (NULL: not known, zeros
 * and no KVQ_BLOCKREC_TOKENS), into buf[len], with the checksum computed
 * as the slices are copied when sum is set (else KVQ_BLOCKREC_UNSUMMED).  Returns
 * 0 with kvq_blockrec_size(L, r.cls) bytes written, -ERANGE (r names no
 * slot of L), -ENOSPC (len too short; nothing written) or -EINVAL (a NULL
 * argument), with a one-line reason in err.
 */
int kvq_blockrec_pack(const struct kvq_layout *L, const void *base, struct kvq_block_ref r,
		      const uint8_t key[KVQ_BLOCKREC_KEY_LEN], const uint8_t *parent, const uint32_t *tokens, int sum,
		      void *buf, size_t len, char *err, size_t errlen);

/* Where layer's slice starts in a record of class cls (its slices are in
 * layer order after the tokens). */
uint64_t kvq_blockrec_slice_at(const struct kvq_layout *L, uint32_t cls, uint32_t layer);

/*
 * Makes buf[len] a record of class cls whose slices are already in place
 * (copied there at kvq_blockrec_slice_at, as by a device's DMA): writes the
 * header and tokens (as kvq_blockrec_pack, key, parent and tokens alike)
 * and, with sum, the checksum over it all (else KVQ_BLOCKREC_UNSUMMED).
 * Returns 0 or -EINVAL (len short of the
 * record, no such class, a NULL argument).
 */
int kvq_blockrec_seal(const struct kvq_layout *L, uint32_t cls, const uint8_t key[KVQ_BLOCKREC_KEY_LEN],
		      const uint8_t *parent, const uint32_t *tokens, int sum, void *buf, size_t len);

/*
 * Checks that buf[len] is exactly one record a pool of layout L takes, in
 * this order: -ENOMSG (shorter than a header or no magic: not a record),
 * -EPROTONOSUPPORT (another version), -EMSGSIZE (length other than len,
 * truncated or trailing bytes), -EMEDIUMTYPE (packed from another layout:
 * the fingerprint differs), -EBADMSG (checksum mismatch, or a header field
 * no writer of this version sets); -EINVAL for a NULL argument.  Returns 0
 * and, where ret is not NULL, the decoded header in *ret; a one-line reason
 * in err otherwise.  Reads nothing past buf[len].
 */
int kvq_blockrec_check(const struct kvq_layout *L, const void *buf, size_t len, struct kvq_blockrec_info *ret,
		       char *err, size_t errlen);

/*
 * Unpacks a record into block r of the pool at base (L's bytes,
 * host-addressable): checks it (kvq_blockrec_check's codes), then -ERANGE
 * (r names no slot of L) or -EINVAL (r of another class than the
 * record's), writing nothing; the checksum is verified in the same pass as
 * the copy, so on its mismatch (-EBADMSG) r's slices hold the record's
 * bytes and must not be used.  Writes only r's slices.  Returns 0, with
 * the decoded header in *ret where it is not NULL (not on failure).
 */
int kvq_blockrec_unpack(const struct kvq_layout *L, void *base, struct kvq_block_ref r, const void *buf,
			size_t len, struct kvq_blockrec_info *ret, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
