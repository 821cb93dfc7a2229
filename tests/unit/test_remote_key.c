/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's names and values (daemon/remote_key.h,
 * daemon/remote_value.h): the identity digest equal for equal pools and
 * different for each single field; remote chain keys made of the namespace,
 * never of the pool's name; Redis keys whose hash tag puts every rank of a
 * block on one slot; values that round-trip, whose MAC is OpenSSL's
 * one-shot HMAC of the documented input, and every refusal: each cut
 * length, each byte flipped, copies under other keys, other identities,
 * another cluster key, oversize.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "prefix.h"
#include "rcluster.h"
#include "remote_key.h"
#include "remote_value.h"
#include "../tap.h"

/* ------------------------------------------------------------ identity */

struct id_case {
	struct kvq_remote_identity id;
	struct kvq_policy policy;
	uint8_t books[32];
};

static void base(struct id_case *c, const char *policy)
{
	char err[256];

	memset(c, 0, sizeof *c);
	if (kvq_policy_parse(policy, 4, &c->policy, err, sizeof err) < 0) {
		fprintf(stderr, "policy %s: %s\n", policy, err);
		exit(1);
	}
	memset(c->books, 0x42, sizeof c->books);
	c->id = (struct kvq_remote_identity){
		.model = "meta-llama/Llama-3.1-8B@0e9e39f", .policy = &c->policy, .layers = 4, .kv_heads = 2,
		.head_dim = 64, .block_tokens = 32, .window = 32, .sink_blocks = 0, .act = KVQ_DT_F16,
		.layout_version = KVQ_LAYOUT_VERSION, .fingerprint = 0x0123456789abcdefull, .codebooks_sha256 = NULL,
	};
}

static void digest(const struct id_case *c, uint8_t out[32])
{
	if (kvq_remote_identity_digest(&c->id, out) != 0) {
		fprintf(stderr, "identity digest failed\n");
		exit(1);
	}
}

static void test_identity(void)
{
	struct id_case a, b;
	uint8_t da[32], db[32];
	static const char *const fields[] = {
		"model", "policy", "rotation", "layers", "kv_heads", "head_dim", "block_tokens", "window",
		"sink_blocks", "act", "layout_version", "fingerprint", "codebooks", "codebooks' digest",
	};

	base(&a, "int8");
	base(&b, "0-1:int8;2-:k=int8,v=int8");
	digest(&a, da);
	digest(&b, db);
	ok(memcmp(da, db, 32) == 0, "identity: equal pools (one policy spelled two ways) give one digest");

	for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
		base(&b, f == 1 ? "0-1:int8;2-:fp8" : f == 2 ? "int8+rot" : "int8");
		switch (f) {
		case 0: b.id.model = "meta-llama/Llama-3.1-8B@0e9e39e"; break;
		case 3: b.id.layers = 5; break;
		case 4: b.id.kv_heads = 4; break;
		case 5: b.id.head_dim = 128; break;
		case 6: b.id.block_tokens = 16; break;
		case 7: b.id.window = 64; break;
		case 8: b.id.sink_blocks = 1; break;
		case 9: b.id.act = KVQ_DT_BF16; break;
		case 10: b.id.layout_version++; break;
		case 11: b.id.fingerprint ^= 1ull << 63; break;
		case 12: b.id.codebooks_sha256 = b.books; break;
		case 13:
			/* both with codebooks, of other contents */
			a.id.codebooks_sha256 = a.books;
			b.id.codebooks_sha256 = b.books;
			b.books[31] ^= 1;
			digest(&a, da);
			break;
		}
		digest(&b, db);
		ok(memcmp(da, db, 32) != 0, "identity: another %s gives another digest", fields[f]);
	}
	base(&a, "int8");
	a.id.policy = NULL;
	ok(kvq_remote_identity_digest(&a.id, da) == -EINVAL, "identity: no policy is -EINVAL");
}

/* ------------------------------------------------------------ chain keys */

static struct kvq_config_pool pool(const char *name, const char *space, const char *model)
{
	struct kvq_config_pool p;

	memset(&p, 0, sizeof p);
	snprintf(p.name, sizeof p.name, "%s", name);
	snprintf(p.model, sizeof p.model, "%s", model);
	snprintf(p.remote, sizeof p.remote, "fleet");
	snprintf(p.remote_namespace, sizeof p.remote_namespace, "%s", space);
	p.block_tokens = 16;
	return p;
}

static void key_of(const struct kvq_config_pool *p, const uint8_t *parent, const uint32_t *tok, const char *salt,
		   uint8_t out[32])
{
	struct kvq_chainkey k;

	if (kvq_remote_chain_init(&k, p) != 0 ||
	    kvq_chainkey_make(&k, parent, tok, salt, salt ? strlen(salt) : 0, out) != 0) {
		fprintf(stderr, "chain key failed\n");
		exit(1);
	}
	kvq_chainkey_fini(&k);
}

static void test_chain(void)
{
	struct kvq_config_pool a = pool("node-a-pool", "prod", "m"), b = pool("other-name", "prod", "m");
	struct kvq_config_pool ns = pool("node-a-pool", "prod2", "m"), model = pool("node-a-pool", "prod", "m2");
	struct kvq_config_pool off = a;
	struct kvq_chainkey k;
	uint32_t tok[16];
	uint8_t ka[32], kb[32], kp[32], kx[32], parent[32];
	int differs = 1;

	for (int i = 0; i < 16; i++)
		tok[i] = 1000u + (uint32_t)i;
	memset(parent, 0x77, sizeof parent);
	key_of(&a, NULL, tok, NULL, ka);
	key_of(&b, NULL, tok, NULL, kb);
	ok(memcmp(ka, kb, 32) == 0, "chain: pools of other names in one namespace make one key");
	ok(kvq_prefix_key(NULL, tok, 16, "prod", "m", NULL, 0, kp) == 0 && memcmp(ka, kp, 32) == 0,
	   "chain: the prefix index's construction with the namespace in place of the pool name");
	ok(kvq_prefix_key(NULL, tok, 16, "node-a-pool", "m", NULL, 0, kp) == 0 && memcmp(ka, kp, 32) != 0,
	   "chain: not the pool's own prefix key");
	key_of(&ns, NULL, tok, NULL, kx);
	ok(memcmp(ka, kx, 32) != 0, "chain: another namespace, another key");
	key_of(&model, NULL, tok, NULL, kx);
	ok(memcmp(ka, kx, 32) != 0, "chain: another model, another key");
	key_of(&a, NULL, tok, "tenant-1", kx);
	ok(memcmp(ka, kx, 32) != 0, "chain: a salt, another key");
	key_of(&a, NULL, tok, "tenant-2", kb);
	ok(memcmp(kb, kx, 32) != 0, "chain: another salt, another key");
	key_of(&a, parent, tok, NULL, kx);
	ok(memcmp(ka, kx, 32) != 0, "chain: a parent, another key");
	parent[31] ^= 1;
	key_of(&a, parent, tok, NULL, kb);
	ok(memcmp(kb, kx, 32) != 0, "chain: another parent, another key");
	for (int i = 0; i < 16; i++) {
		tok[i]++;
		key_of(&a, NULL, tok, NULL, kx);
		differs &= memcmp(ka, kx, 32) != 0;
		tok[i]--;
	}
	ok(differs, "chain: each token changes the key");
	off.remote[0] = '\0';
	ok(kvq_remote_chain_init(&k, &off) == -EINVAL, "chain: a pool that shares with no remote is -EINVAL");
	kvq_chainkey_fini(&k);
}

/* ------------------------------------------------------------ Redis keys */

static void test_redis_key(void)
{
	uint8_t id[32], chain[32];
	char key[KVQ_REMOTE_KEY_MAX], want[256], tag[70], *b;
	int n, same = 1;
	static const uint32_t worlds[] = { 1, 2, 4, 8, 64, KVQ_REMOTE_MAX_WORLD };

	for (int i = 0; i < 32; i++) {
		id[i] = (uint8_t)i;
		chain[i] = (uint8_t)(0xa0 + i);
	}
	n = kvq_remote_redis_key(id, chain, 1, 2, key, sizeof key);
	snprintf(want, sizeof want, "kvq:1:%s:{%s}:1/2", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
		 "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf");
	ok(n == (int)strlen(want) && strcmp(key, want) == 0, "redis key: %s", key);
	snprintf(tag, sizeof tag, "%.64s", strchr(want, '{') + 1);
	for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
		for (uint32_t r = 0; r < worlds[w]; r++) {
			n = kvq_remote_redis_key(id, chain, r, worlds[w], key, sizeof key);
			same &= n > 0 && kvq_rcluster_slot(key, (size_t)n) == kvq_rcluster_slot(tag, 64);
		}
	ok(same, "redis key: every rank of every world size on the slot of the chain key's hex (%u)",
	   kvq_rcluster_slot(tag, 64));
	chain[0] ^= 1;
	n = kvq_remote_redis_key(id, chain, 0, 1, key, sizeof key);
	b = strchr(key, '{');
	ok(n > 0 && b && kvq_rcluster_slot(key, (size_t)n) == kvq_rcluster_slot(b + 1, 64),
	   "redis key: another block's slot is its own chain key's");
	n = kvq_remote_redis_key(id, chain, KVQ_REMOTE_MAX_WORLD - 1, KVQ_REMOTE_MAX_WORLD, key, sizeof key);
	ok(n > 0 && (size_t)n < KVQ_REMOTE_KEY_MAX, "redis key: the longest fits KVQ_REMOTE_KEY_MAX (%d)", n);
	ok(kvq_remote_redis_key(id, chain, 2, 2, key, sizeof key) == -EINVAL &&
	   kvq_remote_redis_key(id, chain, 0, 0, key, sizeof key) == -EINVAL &&
	   kvq_remote_redis_key(id, chain, 0, KVQ_REMOTE_MAX_WORLD + 1, key, sizeof key) == -EINVAL,
	   "redis key: rank past the world, no world, a world too large: -EINVAL");
	n = kvq_remote_redis_key(id, chain, 0, 1, key, sizeof key);
	strcpy(want, "untouched");
	ok(kvq_remote_redis_key(id, chain, 0, 1, want, (size_t)n) == -ENOSPC && strcmp(want, "untouched") == 0 &&
	   kvq_remote_redis_key(id, chain, 0, 1, want, (size_t)n + 1) == n, "redis key: one byte short is -ENOSPC");
}

/* ------------------------------------------------------------ values */

#define PLEN 4096u
#define VSIZE (KVQ_REMOTE_VALUE_HEADER + PLEN + KVQ_REMOTE_VALUE_MAC)

static const uint8_t cluster_key[40] = "the cluster's key, forty bytes long....";

struct value {
	struct kvq_remote_value_head h;
	uint8_t payload[PLEN];
	uint8_t buf[VSIZE + 16];
	size_t len;
};

static void make_value(kvq_remote_codec *c, struct value *v, int has_parent)
{
	memset(&v->h, 0, sizeof v->h);
	for (int i = 0; i < 32; i++) {
		v->h.identity[i] = (uint8_t)(3 * i + 1);
		v->h.chain[i] = (uint8_t)(5 * i + 2);
		v->h.parent[i] = has_parent ? (uint8_t)(7 * i + 3) : 0;
	}
	v->h.has_parent = has_parent;
	v->h.rank = 1;
	v->h.world = 4;
	for (uint32_t i = 0; i < PLEN; i++)
		v->payload[i] = (uint8_t)tap_rand();
	if (kvq_remote_value_encode(c, &v->h, v->payload, PLEN, v->buf, sizeof v->buf, &v->len) != 0) {
		fprintf(stderr, "encode failed\n");
		exit(1);
	}
}

static int check(kvq_remote_codec *c, const struct kvq_remote_value_head *want, const void *buf, size_t len)
{
	struct kvq_remote_value_head h;
	const void *p;
	size_t plen;

	return kvq_remote_value_verify(c, want, buf, len, &h, &p, &plen);
}

/* The reason a flip of byte i of a value (of PLEN bytes of payload) gives. */
static int flip_reason(size_t i)
{
	if (i < 8)
		return -ENOMSG;
	if (i < 12)
		return -EPROTONOSUPPORT;
	if (i >= 16 && i < 24)
		return -ENOKEY;
	if (i >= 24 && i < 32)
		return -EMSGSIZE;
	if (i >= 32 && i < 64)
		return -EMEDIUMTYPE;
	if (i >= 64 && i < 96)
		return -ENOKEY;
	return -EBADMSG;      /* flags, parent, payload, MAC */
}

static void test_values(void)
{
	kvq_remote_codec *c = NULL, *other = NULL, *small = NULL;
	struct value *v = calloc(1, sizeof *v), *w = calloc(1, sizeof *w);
	struct kvq_remote_value_head h, want;
	uint8_t *copy = malloc(VSIZE + 1), mac[32], *msg = malloc(4 + KVQ_REMOTE_KEY_MAX + VSIZE);
	char key[KVQ_REMOTE_KEY_MAX];
	const void *p;
	size_t plen, size;
	unsigned maclen = 0;
	int n, all, r;

	ok(kvq_remote_codec_new(cluster_key, 31, 1 << 20, &c) == -EINVAL, "codec: a key of 31 bytes is -EINVAL");
	if (!ok(kvq_remote_codec_new(cluster_key, sizeof cluster_key, 1 << 20, &c) == 0 &&
		kvq_remote_codec_new("another key of the cluster, 32 b", 32, 1 << 20, &other) == 0 &&
		kvq_remote_codec_new(cluster_key, sizeof cluster_key, VSIZE - 1, &small) == 0, "codec: made"))
		return;

	/* round trip, with and without a parent */
	make_value(c, v, 1);
	ok(v->len == VSIZE && kvq_remote_value_size(PLEN) == VSIZE, "value: %zu bytes, header + payload + MAC",
	   v->len);
	r = kvq_remote_value_verify(c, &v->h, v->buf, v->len, &h, &p, &plen);
	ok(r == 0 && memcmp(&h, &v->h, sizeof h) == 0 && p == v->buf + KVQ_REMOTE_VALUE_HEADER && plen == PLEN &&
	   memcmp(p, v->payload, PLEN) == 0, "value: round trip with a parent (%s)", kvq_remote_refusal_name(r));
	make_value(c, w, 0);
	r = kvq_remote_value_verify(c, &w->h, w->buf, w->len, &h, &p, &plen);
	ok(r == 0 && !h.has_parent && memcmp(&h, &w->h, sizeof h) == 0, "value: round trip without a parent");
	want = v->h;
	want.has_parent = 0;
	ok(check(c, &want, v->buf, v->len) == 0, "value: the parent asked for is not compared");

	/* the payload packed in place is not copied and gives the same value */
	memcpy(kvq_remote_value_payload(w->buf), v->payload, PLEN);
	ok(kvq_remote_value_encode(c, &v->h, kvq_remote_value_payload(w->buf), PLEN, w->buf, sizeof w->buf, &size) ==
	   0 && size == v->len && memcmp(w->buf, v->buf, size) == 0, "value: a payload packed in place");

	/* the MAC is HMAC-SHA256 (OpenSSL's one-shot) of key length, key, header, payload */
	n = kvq_remote_redis_key(v->h.identity, v->h.chain, v->h.rank, v->h.world, key, sizeof key);
	msg[0] = (uint8_t)n;
	msg[1] = msg[2] = msg[3] = 0;
	memcpy(msg + 4, key, (size_t)n);
	memcpy(msg + 4 + n, v->buf, KVQ_REMOTE_VALUE_HEADER + PLEN);
	HMAC(EVP_sha256(), cluster_key, sizeof cluster_key, msg, 4 + (size_t)n + KVQ_REMOTE_VALUE_HEADER + PLEN, mac,
	     &maclen);
	ok(maclen == 32 && memcmp(mac, v->buf + KVQ_REMOTE_VALUE_HEADER + PLEN, 32) == 0,
	   "value: its MAC is HMAC-SHA256 of the Redis key (%s), the header and the payload", key);

	/* every cut, and a trailing byte */
	all = 1;
	for (size_t len = 0; len < v->len; len++) {
		memcpy(copy, v->buf, len);
		if ((r = check(c, &v->h, len ? copy : NULL, len)) != -EMSGSIZE) {
			diag("cut at %zu: %s", len, kvq_remote_refusal_name(r));
			all = 0;
		}
	}
	ok(all, "value: cut at each of its %zu lengths: truncated", v->len);
	memcpy(copy, v->buf, v->len);
	copy[v->len] = 0;
	ok(check(c, &v->h, copy, v->len + 1) == -EMSGSIZE, "value: a trailing byte: truncated");

	/* every byte flipped */
	all = 1;
	for (size_t i = 0; i < v->len; i++) {
		memcpy(copy, v->buf, v->len);
		copy[i] ^= (uint8_t)(1u << (i % 8));
		if ((r = check(c, &v->h, copy, v->len)) != flip_reason(i)) {
			diag("byte %zu flipped: %s, wanted %s", i, kvq_remote_refusal_name(r),
			     kvq_remote_refusal_name(flip_reason(i)));
			all = 0;
		}
	}
	ok(all, "value: each of its %zu bytes flipped: magic, version, key, truncated, identity or hmac by place",
	   v->len);

	/* copies under other keys, other identities, another cluster key */
	want = v->h;
	want.chain[5] ^= 0x10;
	ok(check(c, &want, v->buf, v->len) == -ENOKEY, "value: under another block's key: key");
	want = v->h;
	want.rank = 0;
	ok(check(c, &want, v->buf, v->len) == -ENOKEY, "value: under another rank's key: key");
	want = v->h;
	want.world = 8;
	ok(check(c, &want, v->buf, v->len) == -ENOKEY, "value: under another world size's key: key");
	want = v->h;
	want.identity[0] ^= 1;
	ok(check(c, &want, v->buf, v->len) == -EMEDIUMTYPE, "value: asked for by another identity: identity");
	/* the header rewritten to the other key: the MAC still names the first */
	want = v->h;
	want.chain[5] ^= 0x10;
	memcpy(copy, v->buf, v->len);
	memcpy(copy + 64, want.chain, 32);
	ok(check(c, &want, copy, v->len) == -EBADMSG, "value: its header rewritten to another key: hmac");
	ok(check(other, &v->h, v->buf, v->len) == -EBADMSG, "value: another cluster key: hmac");

	/* sizes */
	ok(check(small, &v->h, v->buf, v->len) == -EFBIG, "value: one byte over max_value: oversize");
	ok(kvq_remote_value_encode(small, &v->h, v->payload, PLEN, w->buf, sizeof w->buf, &size) == -EFBIG,
	   "encode: over max_value is -EFBIG");
	ok(kvq_remote_value_encode(c, &v->h, v->payload, PLEN, w->buf, VSIZE - 1, &size) == -ENOSPC,
	   "encode: one byte short of the value is -ENOSPC");
	want = v->h;
	want.rank = 4;
	ok(kvq_remote_value_encode(c, &want, v->payload, PLEN, w->buf, sizeof w->buf, &size) == -EINVAL,
	   "encode: a rank past the world is -EINVAL");

	/* names */
	ok(strcmp(kvq_remote_refusal_name(-EFBIG), "oversize") == 0 &&
	   strcmp(kvq_remote_refusal_name(-ENOMSG), "magic") == 0 &&
	   strcmp(kvq_remote_refusal_name(-EMSGSIZE), "truncated") == 0 &&
	   strcmp(kvq_remote_refusal_name(-EPROTONOSUPPORT), "version") == 0 &&
	   strcmp(kvq_remote_refusal_name(-EMEDIUMTYPE), "identity") == 0 &&
	   strcmp(kvq_remote_refusal_name(-ENOKEY), "key") == 0 &&
	   strcmp(kvq_remote_refusal_name(-EBADMSG), "hmac") == 0 && strcmp(kvq_remote_refusal_name(0), "ok") == 0 &&
	   strcmp(kvq_remote_refusal_name(-EIO), "error") == 0, "refusals: each status's name");
	ok(kvq_remote_refusal_index(-EFBIG) == 0 && kvq_remote_refusal_index(-EBADMSG) == KVQ_REMOTE_NREFUSALS - 1 &&
	   kvq_remote_refusal_index(0) == -1 && kvq_remote_refusal_index(-EIO) == -1, "refusals: their indexes");

	kvq_remote_codec_free(c);
	kvq_remote_codec_free(other);
	kvq_remote_codec_free(small);
	kvq_remote_codec_free(NULL);
	free(v);
	free(w);
	free(copy);
	free(msg);
}

int main(void)
{
	tap_seed();
	test_identity();
	test_chain();
	test_redis_key();
	test_values();
	return done_testing();
}
