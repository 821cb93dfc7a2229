/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier's names for a block (remote_key.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "remote_key.h"

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static int update_field(EVP_MD_CTX *c, const void *s, size_t len)
{
	uint8_t l[4];

	put_le(l, len, 4);
	return EVP_DigestUpdate(c, l, 4) && (len == 0 || EVP_DigestUpdate(c, s, len));
}

int kvq_remote_identity_digest(const struct kvq_remote_identity *id, uint8_t ret[KVQ_REMOTE_DIGEST_LEN])
{
	static const uint8_t none[KVQ_REMOTE_DIGEST_LEN];
	uint8_t fixed[4 * 8 + 8 + 4];
	char *policy;
	size_t ml;
	unsigned int len = 0;
	EVP_MD_CTX *c;
	int plen, r = -EIO;

	if (!id || !id->model || !id->policy)
		return -EINVAL;
	ml = strnlen(id->model, KVQ_CHAINKEY_MAX_NAME + 1);
	if (ml > KVQ_CHAINKEY_MAX_NAME)
		return -EINVAL;
	policy = malloc(KVQ_POLICY_MAX_LEN + 1);
	if (!policy)
		return -ENOMEM;
	plen = kvq_policy_format(id->policy, policy, KVQ_POLICY_MAX_LEN + 1);
	if (plen < 0) {
		free(policy);
		return -EINVAL;
	}
	put_le(fixed, id->layers, 4);
	put_le(fixed + 4, id->kv_heads, 4);
	put_le(fixed + 8, id->head_dim, 4);
	put_le(fixed + 12, id->block_tokens, 4);
	put_le(fixed + 16, id->window, 4);
	put_le(fixed + 20, id->sink_blocks, 4);
	put_le(fixed + 24, (uint32_t)id->act, 4);
	put_le(fixed + 28, id->layout_version, 4);
	put_le(fixed + 32, id->fingerprint, 8);
	put_le(fixed + 40, id->codebooks_sha256 ? 1 : 0, 4);
	c = EVP_MD_CTX_new();
	if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
	    EVP_DigestUpdate(c, KVQ_REMOTE_IDENTITY_TAG, sizeof KVQ_REMOTE_IDENTITY_TAG) &&
	    update_field(c, id->model, ml) && update_field(c, policy, (size_t)plen) &&
	    EVP_DigestUpdate(c, fixed, sizeof fixed) &&
	    EVP_DigestUpdate(c, id->codebooks_sha256 ? id->codebooks_sha256 : none, KVQ_REMOTE_DIGEST_LEN) &&
	    EVP_DigestFinal_ex(c, ret, &len) && len == KVQ_REMOTE_DIGEST_LEN)
		r = 0;
	EVP_MD_CTX_free(c);
	free(policy);
	return r;
}

int kvq_remote_chain_init(struct kvq_chainkey *k, const struct kvq_config_pool *pl)
{
	if (!pl || !pl->remote[0] || !pl->remote_namespace[0]) {
		memset(k, 0, sizeof *k);
		return -EINVAL;
	}
	return kvq_chainkey_init(k, pl->block_tokens, pl->remote_namespace, pl->model);
}

static void hex(char *out, const uint8_t *b, size_t n)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

int kvq_remote_redis_key(const uint8_t id[KVQ_REMOTE_DIGEST_LEN], const uint8_t chain[KVQ_CHAINKEY_LEN],
			 uint32_t rank, uint32_t world, char *buf, size_t len)
{
	char idh[2 * KVQ_REMOTE_DIGEST_LEN + 1], ch[2 * KVQ_CHAINKEY_LEN + 1], key[KVQ_REMOTE_KEY_MAX];
	int n;

	if (!id || !chain || !buf || world == 0 || world > KVQ_REMOTE_MAX_WORLD || rank >= world)
		return -EINVAL;
	hex(idh, id, KVQ_REMOTE_DIGEST_LEN);
	hex(ch, chain, KVQ_CHAINKEY_LEN);
	n = snprintf(key, sizeof key, KVQ_REMOTE_KEY_PREFIX "%u:%s:{%s}:%u/%u", KVQ_REMOTE_KEY_VERSION, idh, ch,
		     rank, world);
	if (n < 0 || (size_t)n >= sizeof key)
		return -EIO;
	if ((size_t)n >= len)
		return -ENOSPC;
	memcpy(buf, key, (size_t)n + 1);
	return n;
}
