/* SPDX-License-Identifier: Apache-2.0 */
/* Chain keys of blocks in a namespace (chainkey.h). */
#include <errno.h>
#include <string.h>

#include "chainkey.h"
#include "layout.h"

#if OPENSSL_VERSION_NUMBER < 0x30000000L
/* OpenSSL 1.1 has no explicit fetch; its EVP_sha256() costs nothing per use */
#define EVP_MD_fetch(lib, name, props) ((EVP_MD *)EVP_sha256())
#define EVP_MD_free(md) ((void)(md))
#endif

static void put_u32le(uint8_t *p, uint32_t v)
{
	for (unsigned i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static int digest_field(EVP_MD_CTX *c, const void *s, uint32_t len)
{
	uint8_t l[4];

	put_u32le(l, len);
	return EVP_DigestUpdate(c, l, 4) && (len == 0 || EVP_DigestUpdate(c, s, len));
}

int kvq_chainkey_init(struct kvq_chainkey *k, uint32_t B, const char *space, const char *model)
{
	size_t sl, ml;

	memset(k, 0, sizeof *k);
	if (!space || !model || B == 0 || B > KVQ_MAX_BLOCK_TOKENS)
		return -EINVAL;
	sl = strnlen(space, KVQ_CHAINKEY_MAX_NAME + 1);
	ml = strnlen(model, KVQ_CHAINKEY_MAX_NAME + 1);
	if (sl == 0 || ml == 0 || sl > KVQ_CHAINKEY_MAX_NAME || ml > KVQ_CHAINKEY_MAX_NAME)
		return -EINVAL;
	k->B = B;
	memcpy(k->space, space, sl);
	memcpy(k->model, model, ml);
	k->space_len = (uint32_t)sl;
	k->model_len = (uint32_t)ml;
	k->md = EVP_MD_fetch(NULL, "SHA256", NULL);
	k->ctx = EVP_MD_CTX_new();
	if (!k->md || !k->ctx) {
		kvq_chainkey_fini(k);
		return -EIO;
	}
	return 0;
}

void kvq_chainkey_fini(struct kvq_chainkey *k)
{
	EVP_MD_CTX_free(k->ctx);
	EVP_MD_free(k->md);
	k->ctx = NULL;
	k->md = NULL;
}

int kvq_chainkey_make(struct kvq_chainkey *k, const uint8_t *parent, const uint32_t *tokens, const void *salt,
		      size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN])
{
	static const uint8_t zero[KVQ_CHAINKEY_LEN];
	uint8_t tok[4 * KVQ_MAX_BLOCK_TOKENS];
	unsigned int len = 0;

	if (!tokens || salt_len > KVQ_CHAINKEY_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	for (uint32_t i = 0; i < k->B; i++)
		put_u32le(tok + 4 * i, tokens[i]);
	if (!EVP_DigestInit_ex(k->ctx, k->md, NULL) ||
	    !EVP_DigestUpdate(k->ctx, parent ? parent : zero, KVQ_CHAINKEY_LEN) ||
	    !EVP_DigestUpdate(k->ctx, tok, 4 * (size_t)k->B) || !digest_field(k->ctx, k->space, k->space_len) ||
	    !digest_field(k->ctx, k->model, k->model_len) || !digest_field(k->ctx, salt, (uint32_t)salt_len) ||
	    !EVP_DigestFinal_ex(k->ctx, ret, &len) || len != KVQ_CHAINKEY_LEN)
		return -EIO;
	return 0;
}

int kvq_chainkey_once(const uint8_t *parent, const uint32_t *tokens, uint32_t B, const char *space,
		      const char *model, const void *salt, size_t salt_len, uint8_t ret[KVQ_CHAINKEY_LEN])
{
	struct kvq_chainkey k;
	int r;

	if ((r = kvq_chainkey_init(&k, B, space, model)) < 0)
		return r;
	r = kvq_chainkey_make(&k, parent, tokens, salt, salt_len, ret);
	kvq_chainkey_fini(&k);
	return r;
}
