/* SPDX-License-Identifier: Apache-2.0 */
/* A block's value in the remote tier: encode and verify (remote_value.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "remote_value.h"

/* Threads may share one: each MAC has a context of its own, a copy of
 * the template, which is keyed once (a context made and keyed per value
 * cost 3 us, a copy 0.5).  An OpenSSL context is no object to share, so
 * the copies are made one at a time. */
struct kvq_remote_codec {
	EVP_MAC_CTX *tmpl;      /* HMAC-SHA-256 with the remote's key, never updated */
	pthread_mutex_t mu;     /* the template's */
	size_t max_value;
};

/* the refusals in remote_value.h's order */
enum { OVERSIZE, MAGIC, TRUNCATED, VERSION, IDENTITY, KEY, HMAC };
static const struct {
	const char *name;
	int status;
} refusals[KVQ_REMOTE_NREFUSALS] = {
	[OVERSIZE] = { "oversize", -EFBIG }, [MAGIC] = { "magic", -ENOMSG },
	[TRUNCATED] = { "truncated", -EMSGSIZE }, [VERSION] = { "version", -EPROTONOSUPPORT },
	[IDENTITY] = { "identity", -EMEDIUMTYPE }, [KEY] = { "key", -ENOKEY }, [HMAC] = { "hmac", -EBADMSG },
};

#define REFUSE(id) (refusals[id].status)

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

int kvq_remote_codec_new(const void *key, size_t key_len, size_t max_value, kvq_remote_codec **ret)
{
	OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
				OSSL_PARAM_construct_end() };
	kvq_remote_codec *c;
	EVP_MAC *hmac;

	if (!key || key_len < KVQ_CONFIG_HMAC_MIN || key_len > KVQ_CONFIG_HMAC_MAX || !ret ||
	    max_value < KVQ_REMOTE_VALUE_HEADER + KVQ_REMOTE_VALUE_MAC)
		return -EINVAL;
	c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->max_value = max_value;
	pthread_mutex_init(&c->mu, NULL);
	hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	c->tmpl = hmac ? EVP_MAC_CTX_new(hmac) : NULL;
	EVP_MAC_free(hmac);   /* the context holds its own reference */
	if (!c->tmpl || EVP_MAC_init(c->tmpl, key, key_len, params) != 1) {
		kvq_remote_codec_free(c);
		return -EIO;
	}
	*ret = c;
	return 0;
}

void kvq_remote_codec_free(kvq_remote_codec *c)
{
	if (!c)
		return;
	EVP_MAC_CTX_free(c->tmpl);   /* OpenSSL cleanses an HMAC context's key as it frees it */
	pthread_mutex_destroy(&c->mu);
	free(c);
}

size_t kvq_remote_value_size(size_t plen)
{
	return KVQ_REMOTE_VALUE_HEADER + plen + KVQ_REMOTE_VALUE_MAC;
}

/* The MAC of a value whose header is at hdr and payload at hdr + HEADER
 * (plen bytes), stored under the key of h. */
static int mac(kvq_remote_codec *c, const struct kvq_remote_value_head *h, const uint8_t *hdr, size_t plen,
	       uint8_t out[KVQ_REMOTE_VALUE_MAC])
{
	char key[KVQ_REMOTE_KEY_MAX];
	uint8_t klen[4];
	size_t outlen = KVQ_REMOTE_VALUE_MAC;
	int n = kvq_remote_redis_key(h->identity, h->chain, h->rank, h->world, key, sizeof key);
	EVP_MAC_CTX *ctx;

	if (n < 0)
		return n;
	put_le(klen, (uint64_t)n, 4);
	pthread_mutex_lock(&c->mu);
	ctx = EVP_MAC_CTX_dup(c->tmpl);
	pthread_mutex_unlock(&c->mu);
	if (!ctx || EVP_MAC_update(ctx, klen, sizeof klen) != 1 ||
	    EVP_MAC_update(ctx, (const uint8_t *)key, (size_t)n) != 1 ||
	    EVP_MAC_update(ctx, hdr, KVQ_REMOTE_VALUE_HEADER + plen) != 1 ||
	    EVP_MAC_final(ctx, out, &outlen, KVQ_REMOTE_VALUE_MAC) != 1 || outlen != KVQ_REMOTE_VALUE_MAC)
		n = -EIO;
	EVP_MAC_CTX_free(ctx);
	return n < 0 ? n : 0;
}

int kvq_remote_value_encode(kvq_remote_codec *c, const struct kvq_remote_value_head *h, const void *payload,
			    size_t plen, void *buf, size_t len, size_t *ret_len)
{
	uint8_t *b = buf;
	size_t size;
	int r;

	if (!c || !h || (plen && !payload) || !buf || !ret_len || h->world == 0 || h->world > KVQ_REMOTE_MAX_WORLD ||
	    h->rank >= h->world)
		return -EINVAL;
	if (plen > c->max_value || kvq_remote_value_size(plen) > c->max_value)
		return -EFBIG;
	size = kvq_remote_value_size(plen);
	if (len < size)
		return -ENOSPC;
	memcpy(b, KVQ_REMOTE_VALUE_MAGIC, 8);
	put_le(b + 8, KVQ_REMOTE_VALUE_VERSION, 4);
	put_le(b + 12, h->has_parent ? KVQ_REMOTE_VALUE_PARENT : 0, 4);
	put_le(b + 16, h->rank, 4);
	put_le(b + 20, h->world, 4);
	put_le(b + 24, plen, 8);
	memcpy(b + 32, h->identity, KVQ_REMOTE_DIGEST_LEN);
	memcpy(b + 64, h->chain, KVQ_CHAINKEY_LEN);
	if (h->has_parent)
		memcpy(b + 96, h->parent, KVQ_CHAINKEY_LEN);
	else
		memset(b + 96, 0, KVQ_CHAINKEY_LEN);
	if (plen && payload != b + KVQ_REMOTE_VALUE_HEADER)
		memmove(b + KVQ_REMOTE_VALUE_HEADER, payload, plen);
	if ((r = mac(c, h, b, plen, b + KVQ_REMOTE_VALUE_HEADER + plen)) < 0)
		return r;
	*ret_len = size;
	return 0;
}

int kvq_remote_value_verify(kvq_remote_codec *c, const struct kvq_remote_value_head *want, const void *buf,
			    size_t len, struct kvq_remote_value_head *ret_head, const void **ret_payload,
			    size_t *ret_plen)
{
	const uint8_t *b = buf;
	uint8_t m[KVQ_REMOTE_VALUE_MAC];
	struct kvq_remote_value_head h;
	uint64_t plen;
	uint32_t flags;
	int r;

	if (!c || !want || (len && !buf) || !ret_head || !ret_payload || !ret_plen)
		return -EINVAL;
	if (len > c->max_value)
		return REFUSE(OVERSIZE);
	if (len && memcmp(b, KVQ_REMOTE_VALUE_MAGIC, len < 8 ? len : 8) != 0)
		return REFUSE(MAGIC);
	if (len < KVQ_REMOTE_VALUE_HEADER + KVQ_REMOTE_VALUE_MAC)
		return REFUSE(TRUNCATED);
	plen = get_le(b + 24, 8);
	if (plen > len || kvq_remote_value_size((size_t)plen) != len)
		return REFUSE(TRUNCATED);
	if (get_le(b + 8, 4) != KVQ_REMOTE_VALUE_VERSION)
		return REFUSE(VERSION);
	if (memcmp(b + 32, want->identity, KVQ_REMOTE_DIGEST_LEN) != 0)
		return REFUSE(IDENTITY);
	memset(&h, 0, sizeof h);
	h.rank = (uint32_t)get_le(b + 16, 4);
	h.world = (uint32_t)get_le(b + 20, 4);
	if (memcmp(b + 64, want->chain, KVQ_CHAINKEY_LEN) != 0 || h.rank != want->rank || h.world != want->world)
		return REFUSE(KEY);
	/* under the key asked for: a copy under another key fails here too */
	if ((r = mac(c, want, b, (size_t)plen, m)) < 0)
		return r;
	if (CRYPTO_memcmp(m, b + KVQ_REMOTE_VALUE_HEADER + plen, KVQ_REMOTE_VALUE_MAC) != 0)
		return REFUSE(HMAC);
	/* signed by a holder of the key: a flag no writer sets is a bug there */
	flags = (uint32_t)get_le(b + 12, 4);
	if (flags & ~KVQ_REMOTE_VALUE_PARENT)
		return REFUSE(VERSION);
	memcpy(h.identity, b + 32, KVQ_REMOTE_DIGEST_LEN);
	memcpy(h.chain, b + 64, KVQ_CHAINKEY_LEN);
	h.has_parent = (flags & KVQ_REMOTE_VALUE_PARENT) != 0;
	memcpy(h.parent, b + 96, KVQ_CHAINKEY_LEN);
	*ret_head = h;
	*ret_payload = b + KVQ_REMOTE_VALUE_HEADER;
	*ret_plen = (size_t)plen;
	return 0;
}

int kvq_remote_refusal_index(int status)
{
	for (int i = 0; status && i < KVQ_REMOTE_NREFUSALS; i++)
		if (refusals[i].status == status)
			return i;
	return -1;
}

const char *kvq_remote_refusal_name(int status)
{
	int i = kvq_remote_refusal_index(status);

	return i >= 0 ? refusals[i].name : status ? "error" : "ok";
}
