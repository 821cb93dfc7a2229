/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The chain key of a block: its identity in a namespace, from its tokens
 * and its parent's chain key (docs/DESIGN.md §4, "Keys").  KVQ_CHAINKEY_LEN
 * = 32 bytes of SHA-256 over, in order:
 *
 *   parent key          32 bytes, or 32 zero bytes for a first block
 *   tokens              B token ids, each a u32 little-endian
 *   u32 LE len, space   the namespace, len bytes (no terminator)
 *   u32 LE len, model   the model id
 *   u32 LE len, salt    the salt; len 0 without one (no salt and an empty
 *                       salt are the same)
 *
 * The prefix index's namespace is its pool's name (daemon/prefix.h), so two
 * pools never share a key; the remote tier's is the pool's
 * remote_namespace (daemon/remote_key.h), so pools on several nodes do.
 */
#ifndef KVQD_CHAINKEY_H
#define KVQD_CHAINKEY_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#define KVQ_CHAINKEY_LEN 32u
#define KVQ_CHAINKEY_MAX_NAME 256u   /* bytes of a namespace or model id */
#define KVQ_CHAINKEY_MAX_SALT 256u   /* bytes of a salt */

/* One namespace's key maker: its names and a digest context kept between
 * keys (an implicit fetch per key costs more than the hash). */
struct kvq_chainkey {
	EVP_MD *md;
	EVP_MD_CTX *ctx;
	uint32_t B;
	uint32_t space_len, model_len;
	char space[KVQ_CHAINKEY_MAX_NAME];
	char model[KVQ_CHAINKEY_MAX_NAME];
};

/* k for blocks of B tokens (1 .. KVQ_MAX_BLOCK_TOKENS) in namespace space
 * of model (each 1 .. KVQ_CHAINKEY_MAX_NAME bytes).  Returns 0, -EINVAL or
 * -EIO (libcrypto); on failure k needs no fini. */
int kvq_chainkey_init(struct kvq_chainkey *k, uint32_t B, const char *space, const char *model);

/* Releases what init took (a zeroed k is fine). */
void kvq_chainkey_fini(struct kvq_chainkey *k);

/* The key of the block after parent (NULL: a first block) holding
 * tokens[B], with salt[salt_len] (salt may be NULL when salt_len is 0).
 * Returns 0 and ret[KVQ_CHAINKEY_LEN], -EINVAL (salt too long) or -EIO. */
int kvq_chainkey_make(struct kvq_chainkey *k, const uint8_t *parent, const uint32_t *tokens, const void *salt,
		      size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN]);

/* The same key with no kept context, for one key and for tests: 0, -EINVAL,
 * -ENOMEM or -EIO. */
int kvq_chainkey_once(const uint8_t *parent, const uint32_t *tokens, uint32_t B, const char *space,
		      const char *model, const void *salt, size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN]);

#endif
