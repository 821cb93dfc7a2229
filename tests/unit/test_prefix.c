/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The prefix index (daemon/prefix.h): keys against the documented encoding
 * hashed here with EVP and against two digests computed with Python's
 * hashlib; namespace fields (salt, model id, pool name, and their length
 * prefixes) separate keys; publishing an already-cached key returns the
 * cached block; lookup returns the longest chain, stops at max_tokens in
 * whole blocks (S(n) leaves at least one token) and takes references; a tree
 * of chains sharing prefixes is evicted leaf first, least recently released
 * first, never a referenced block; allocation in a full pool evicts when it
 * can and fails cleanly when it cannot; and random runs of sequences
 * (lookup, allocate, publish, duplicates, release in any order, eviction by
 * allocation and by request, short-lived readers, children published after
 * unheld parents) against a model that keeps the tree in plain arrays and
 * finds victims, pins and matches by scanning, checked after every step.
 */
#include <errno.h>
#include <string.h>

#include <openssl/evp.h>

#include "layout.h"
#include "pool.h"
#include "prefix.h"
#include "../tap.h"

struct env {
	kvq_pool *pool;
	kvq_prefix *x;
};

static struct env env_new(uint32_t n_sealed, uint32_t B, const char *pool_name, const char *model)
{
	struct env e = {0};

	if (kvq_pool_new(n_sealed, 4, 0, &e.pool) != 0 || kvq_prefix_new(e.pool, B, pool_name, model, &e.x) != 0) {
		fprintf(stderr, "cannot create pool/prefix\n");
		abort();
	}
	return e;
}

static void env_free(struct env *e)
{
	kvq_prefix_free(e->x);
	kvq_pool_free(e->pool);
}

/* one private block, or abort: a full pool here is a bug of the test */
static uint32_t alloc1(struct env *e)
{
	uint32_t id;

	if (kvq_pool_alloc_sealed(e->pool, 1, &id) != 0) {
		fprintf(stderr, "test pool full\n");
		abort();
	}
	return id;
}

/* publishes a chain of nb blocks of tokens[nb*B] after parent as the server
 * does (a duplicate's reference moves to the cached block); ids[nb] */
static int publish_chain(struct env *e, int32_t parent, const uint32_t *tokens, uint32_t B, uint32_t nb,
			 const char *salt, uint32_t *ids)
{
	size_t sl = salt ? strlen(salt) : 0;

	for (uint32_t i = 0; i < nb; i++) {
		uint32_t b = alloc1(e), got;
		int r = kvq_prefix_publish(e->x, b, parent, tokens + i * B, salt, sl, &got);

		if (r != 0)
			return r;
		if (got != b) {
			kvq_pool_ref(e->pool, got);
			kvq_pool_unref(e->pool, b);
		}
		ids[i] = got;
		parent = (int32_t)got;
	}
	return 0;
}

static int stats_eq(const struct kvq_pool_stats *a, const struct kvq_pool_stats *b)
{
	return memcmp(a, b, sizeof *a) == 0;
}

static void unref_all(struct env *e, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		kvq_pool_unref(e->pool, ids[i]);
}

/* ------------------------------------------------------------------ keys */

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static size_t put_field(uint8_t *p, const char *s, size_t len)
{
	put32(p, (uint32_t)len);
	memcpy(p + 4, s, len);
	return 4 + len;
}

/* the encoding of prefix.h, written out byte by byte */
static void ref_key(const uint8_t *parent, const uint32_t *tokens, uint32_t B, const char *pool,
		    const char *model, const char *salt, uint8_t *out)
{
	uint8_t buf[32 + 4 * KVQ_MAX_BLOCK_TOKENS + 3 * (4 + 300)];
	size_t n = 0;
	unsigned len;

	if (parent)
		memcpy(buf, parent, 32);
	else
		memset(buf, 0, 32);
	n = 32;
	for (uint32_t i = 0; i < B; i++, n += 4)
		put32(buf + n, tokens[i]);
	n += put_field(buf + n, pool, strlen(pool));
	n += put_field(buf + n, model, strlen(model));
	n += put_field(buf + n, salt ? salt : "", salt ? strlen(salt) : 0);
	if (!EVP_Digest(buf, n, out, &len, EVP_sha256(), NULL) || len != 32)
		abort();
}

static void hex(const char *s, uint8_t *out)
{
	for (int i = 0; i < 32; i++) {
		unsigned v;

		sscanf(s + 2 * i, "%2x", &v);
		out[i] = (uint8_t)v;
	}
}

static void test_keys(void)
{
	struct env e = env_new(16, 4, "pool", "model");
	uint32_t tok[12], ids[3], ids2[3];
	uint8_t want[32], got[32], prev[32], kat[32];
	int good = 1;

	for (int i = 0; i < 12; i++)
		tok[i] = (uint32_t)tap_rand();
	ok(publish_chain(&e, -1, tok, 4, 3, NULL, ids) == 0 && ids[0] != ids[1] && ids[1] != ids[2],
	   "a chain of 3 blocks published");
	for (int i = 0; i < 3; i++) {
		ref_key(i ? prev : NULL, tok + 4 * i, 4, "pool", "model", NULL, want);
		good &= kvq_prefix_block_key(e.x, ids[i], got) == 0 && memcmp(got, want, 32) == 0;
		good &= kvq_prefix_parent(e.x, ids[i]) == (i ? (int64_t)ids[i - 1] : -1);
		memcpy(prev, want, 32);
	}
	ok(good, "each stored key is SHA-256 of the documented encoding chained from its parent; parents linked");
	ok(publish_chain(&e, -1, tok, 4, 3, "tenant-a", ids2) == 0, "the same tokens published with a salt");
	good = 1;
	for (int i = 0; i < 3; i++) {
		ref_key(i ? prev : NULL, tok + 4 * i, 4, "pool", "model", "tenant-a", want);
		good &= kvq_prefix_block_key(e.x, ids2[i], got) == 0 && memcmp(got, want, 32) == 0;
		good &= ids2[i] != ids[0] && ids2[i] != ids[1] && ids2[i] != ids[2];
		memcpy(prev, want, 32);
	}
	ok(good, "salted keys match too, and they are new blocks (no hit on the unsalted chain)");

	/* digests computed by Python's hashlib from the same description */
	{
		const uint32_t t0[4] = {0, 1, 2, 0xfffffffeu}, t1[4] = {7, 8, 9, 10};

		hex("e2b5d1797fe703e7c6af7add30e22ca53dc1034cf4a436f24e9babc495d1028e", kat);
		ok(kvq_prefix_key(NULL, t0, 4, "pool", "model", NULL, 0, got) == 0 && memcmp(got, kat, 32) == 0,
		   "known answer: first block, no salt");
		memcpy(prev, kat, 32);
		hex("9d0ae9cad55d6f8819d75dd5da8df403e0151b8b00efbbc46f13611dcb1eda4c", kat);
		ok(kvq_prefix_key(prev, t1, 4, "pool", "model", "salt", 4, got) == 0 && memcmp(got, kat, 32) == 0,
		   "known answer: second block, salt \"salt\"");
		ok(kvq_prefix_key(NULL, t0, 4, "pool", "model", "", 0, want) == 0 &&
		   kvq_prefix_key(NULL, t0, 4, "pool", "model", NULL, 0, got) == 0 && memcmp(got, want, 32) == 0,
		   "an empty salt is no salt");
	}

	/* every namespace field counts, and length prefixes keep them apart */
	{
		uint8_t a[32], b[32], c[32], d[32];

		kvq_prefix_key(NULL, tok, 4, "pool", "model", NULL, 0, a);
		kvq_prefix_key(NULL, tok, 4, "pool", "model-ft", NULL, 0, b);
		kvq_prefix_key(NULL, tok, 4, "poolx", "model", NULL, 0, c);
		kvq_prefix_key(NULL, tok, 4, "pool", "model", "s", 1, d);
		ok(memcmp(a, b, 32) && memcmp(a, c, 32) && memcmp(a, d, 32), "model id, pool name and salt change the key");
		kvq_prefix_key(NULL, tok, 4, "ab", "c", NULL, 0, a);
		kvq_prefix_key(NULL, tok, 4, "a", "bc", NULL, 0, b);
		kvq_prefix_key(NULL, tok, 4, "a", "b", "c", 1, c);
		ok(memcmp(a, b, 32) && memcmp(b, c, 32) && memcmp(a, c, 32),
		   "(\"ab\",\"c\"), (\"a\",\"bc\") and (\"a\",\"b\",salt \"c\") differ: fields are length-prefixed");
		ok(kvq_prefix_key(NULL, tok, 4, "pool", "model", "x", KVQ_PREFIX_MAX_SALT + 1, a) == -EINVAL &&
		   kvq_prefix_key(NULL, tok, 0, "pool", "model", NULL, 0, a) == -EINVAL &&
		   kvq_prefix_key(NULL, tok, 4, "pool", "model", NULL, 1, a) == -EINVAL,
		   "salt too long, zero tokens, NULL salt with a length: -EINVAL");
	}

	/* another model with the same geometry never hits */
	{
		struct env e2 = env_new(16, 4, "pool", "model-ft");
		uint32_t hit[3], n = 99, o[3];

		publish_chain(&e2, -1, tok, 4, 3, NULL, o);
		kvq_prefix_block_key(e.x, ids[0], want);
		kvq_prefix_block_key(e2.x, o[0], got);
		ok(memcmp(want, got, 32) != 0, "same tokens, other model id: other key");
		unref_all(&e2, o, 3);
		ok(kvq_prefix_lookup(e2.x, tok, 12, 12, NULL, 0, hit, 3, &n) == 0 && n == 3,
		   "(control: the fine-tune's own index hits its own chain)");
		unref_all(&e2, hit, n);
		env_free(&e2);
	}
	unref_all(&e, ids, 3);
	unref_all(&e, ids2, 3);
	env_free(&e);
}

/* ------------------------------------------------------------ salt, dup */

static void test_salt_and_duplicates(void)
{
	struct env e = env_new(16, 4, "pool", "model");
	struct kvq_pool_stats before, after;
	uint32_t tok[8], ids[2], hit[2], n = 99, dup, got = 12345;

	for (int i = 0; i < 8; i++)
		tok[i] = (uint32_t)i * 1000u;
	publish_chain(&e, -1, tok, 4, 2, "A", ids);
	ok(kvq_prefix_lookup(e.x, tok, 8, 8, "B", 1, hit, 2, &n) == 0 && n == 0, "other salt: no hit");
	ok(kvq_prefix_lookup(e.x, tok, 8, 8, NULL, 0, hit, 2, &n) == 0 && n == 0, "no salt: no hit");
	ok(kvq_prefix_lookup(e.x, tok, 8, 8, "A", 1, hit, 2, &n) == 0 && n == 2 && hit[0] == ids[0] &&
	   hit[1] == ids[1], "same salt: both blocks");
	unref_all(&e, hit, n);

	dup = alloc1(&e);
	kvq_pool_stats(e.pool, &before);
	ok(kvq_prefix_publish(e.x, dup, (int32_t)ids[0], tok + 4, "A", 1, &got) == 0 && got == ids[1],
	   "publishing an already cached key returns the cached block");
	kvq_pool_stats(e.pool, &after);
	ok(stats_eq(&before, &after) && kvq_pool_state(e.pool, dup) == KVQ_POOL_PRIVATE &&
	   kvq_pool_refs(e.pool, dup) == 1 && kvq_prefix_block_key(e.x, dup, (uint8_t[32]){0}) == -EINVAL,
	   "and changes nothing: the duplicate stays private, unindexed");
	ok(kvq_pool_ref(e.pool, got) == 0 && kvq_pool_unref(e.pool, dup) == 0 &&
	   kvq_pool_state(e.pool, dup) == KVQ_POOL_FREE && kvq_pool_refs(e.pool, ids[1]) == 2,
	   "the caller moves its reference: duplicate freed, cached block has 2 refs");
	kvq_pool_unref(e.pool, ids[1]);

	/* bad publishes change nothing */
	dup = alloc1(&e);
	kvq_pool_stats(e.pool, &before);
	ok(kvq_prefix_publish(e.x, dup, 15, tok, NULL, 0, &got) == -EINVAL, "parent not cached: -EINVAL");
	ok(kvq_prefix_publish(e.x, dup, 16, tok, NULL, 0, &got) == -ERANGE &&
	   kvq_prefix_publish(e.x, dup, -2, tok, NULL, 0, &got) == -ERANGE &&
	   kvq_prefix_publish(e.x, 16, -1, tok, NULL, 0, &got) == -ERANGE, "ids out of range: -ERANGE");
	ok(kvq_prefix_publish(e.x, ids[0], -1, tok + 4, NULL, 0, &got) == -EINVAL,
	   "publishing a cached block again: -EINVAL");
	ok(kvq_prefix_publish(e.x, 14, -1, tok + 4, NULL, 0, &got) == -EINVAL, "publishing a free slot: -EINVAL");
	ok(kvq_prefix_publish(e.x, dup, -1, tok, "x", KVQ_PREFIX_MAX_SALT + 1, &got) == -EINVAL,
	   "salt too long: -EINVAL");
	kvq_pool_stats(e.pool, &after);
	ok(stats_eq(&before, &after) && got == ids[1], "none of them changed anything");
	kvq_pool_unref(e.pool, dup);
	unref_all(&e, ids, 2);
	env_free(&e);
}

/* ---------------------------------------------------------------- lookup */

static void test_lookup(void)
{
	struct env e = env_new(16, 4, "pool", "model");
	struct kvq_pool_stats st;
	uint32_t tok[17], ids[4], hit[4], n = 99, other[16];
	struct kvq_layout L = {.block_tokens = 4, .window = 4};
	int good = 1;

	for (int i = 0; i < 17; i++)
		tok[i] = (uint32_t)(i * 7 + 1);
	publish_chain(&e, -1, tok, 4, 4, NULL, ids);
	unref_all(&e, ids, 4);
	kvq_pool_stats(e.pool, &st);
	ok(st.sealed_cached == 4 && st.cached_referenced == 0 && st.sealed_evictable == 4 && st.refs == 0,
	   "4 cached blocks, none referenced, all evictable");

	ok(kvq_prefix_lookup(e.x, tok, 17, kvq_layout_split(&L, 17), NULL, 0, hit, 4, &n) == 0 && n == 4 &&
	   !memcmp(hit, ids, sizeof ids), "17-token prompt, S(17)=16: all 4 blocks, in chain order");
	for (int i = 0; i < 4; i++)
		good &= kvq_pool_refs(e.pool, ids[i]) == 1;
	kvq_pool_stats(e.pool, &st);
	ok(good && st.cached_referenced == 4 && st.sealed_evictable == 0, "one reference on each, none evictable");
	unref_all(&e, hit, n);
	kvq_pool_stats(e.pool, &st);
	ok(st.cached_referenced == 0 && st.sealed_evictable == 4 && st.sealed_cached == 4,
	   "released: all back on the LRU, still cached");

	ok(kvq_prefix_lookup(e.x, tok, 16, kvq_layout_split(&L, 16), NULL, 0, hit, 4, &n) == 0 && n == 3,
	   "16-token prompt, S(16)=12: 3 blocks (one token is left to compute)");
	unref_all(&e, hit, n);
	ok(kvq_prefix_lookup(e.x, tok, 16, 15, NULL, 0, hit, 4, &n) == 0 && n == 3,
	   "max_tokens 15 rounds down to 3 blocks");
	unref_all(&e, hit, n);
	ok(kvq_prefix_lookup(e.x, tok, 16, 3, NULL, 0, hit, 4, &n) == 0 && n == 0, "max_tokens 3: no block");
	ok(kvq_prefix_lookup(e.x, tok, 10, 16, NULL, 0, hit, 4, &n) == 0 && n == 2,
	   "10 tokens: 2 whole blocks");
	unref_all(&e, hit, n);
	ok(kvq_prefix_lookup(e.x, tok, 16, 16, NULL, 0, hit, 1, &n) == 0 && n == 1 && hit[0] == ids[0],
	   "max_ids 1: the first block only");
	unref_all(&e, hit, n);

	memcpy(other, tok, sizeof other);
	other[9] ^= 1;   /* differs inside block 2 */
	ok(kvq_prefix_lookup(e.x, other, 16, 16, NULL, 0, hit, 4, &n) == 0 && n == 2 && hit[1] == ids[1],
	   "tokens differ in block 2: the 2-block prefix");
	unref_all(&e, hit, n);
	other[9] = tok[9];
	other[1] ^= 1;
	ok(kvq_prefix_lookup(e.x, other, 16, 16, NULL, 0, hit, 4, &n) == 0 && n == 0,
	   "tokens differ in block 0: nothing, even though later blocks match");
	n = 99;
	ok(kvq_prefix_lookup(e.x, NULL, 0, 0, NULL, 0, NULL, 0, &n) == 0 && n == 0, "empty prompt: no block");
	kvq_pool_stats(e.pool, &st);
	ok(st.refs == 0 && st.sealed_evictable == 4, "every reference lookup took was given back");
	env_free(&e);
}

/* ------------------------------------------ what a tensor-parallel group uses */

struct hook_log {
	int calls;
	uint8_t key[KVQ_PREFIX_KEY_LEN];
};

static void log_hook(void *arg, const uint8_t *key, int demote)
{
	(void)demote;
	struct hook_log *h = arg;

	h->calls++;
	memcpy(h->key, key, KVQ_PREFIX_KEY_LEN);
}

static int keep_key(void *arg, const uint8_t *key)
{
	return !memcmp(arg, key, KVQ_PREFIX_KEY_LEN);
}

/* kvq_prefix_match (no reference), kvq_prefix_evict_key (only an evictable
 * leaf), the evict hook (told each victim's key before it goes),
 * kvq_prefix_has and kvq_prefix_evict_unless (chains from their ends) */
static void test_group_calls(void)
{
	struct env e = env_new(16, 4, "group", "model");
	struct kvq_pool_stats st;
	struct hook_log h = { 0 };
	uint32_t tok[16], ids[4], hit[4], n = 99;
	uint8_t k0[KVQ_PREFIX_KEY_LEN], k3[KVQ_PREFIX_KEY_LEN];

	for (int i = 0; i < 16; i++)
		tok[i] = (uint32_t)(i * 5 + 3);
	publish_chain(&e, -1, tok, 4, 4, NULL, ids);
	unref_all(&e, ids, 4);
	ok(kvq_prefix_match(e.x, tok, 16, 16, NULL, 0, 4, &n) == 0 && n == 4, "match: the 4-block chain");
	kvq_pool_stats(e.pool, &st);
	ok(st.refs == 0, "match takes no reference");
	ok(kvq_prefix_match(e.x, tok, 16, 12, NULL, 0, 4, &n) == 0 && n == 3 &&
	   kvq_prefix_match(e.x, tok, 16, 16, NULL, 0, 2, &n) == 0 && n == 2, "match: bounded by max_tokens, max_ids");
	kvq_prefix_block_key(e.x, ids[0], k0);
	kvq_prefix_block_key(e.x, ids[3], k3);
	ok(kvq_prefix_evict_key(e.x, k0) == -EBUSY, "evict_key: a parent stays (-EBUSY)");
	ok(kvq_prefix_lookup(e.x, tok, 16, 16, NULL, 0, hit, 4, &n) == 0 && n == 4 &&
	   kvq_prefix_evict_key(e.x, k3) == -EBUSY, "evict_key: a referenced leaf stays (-EBUSY)");
	unref_all(&e, hit, n);
	kvq_prefix_set_evict_hook(e.x, log_hook, &h);
	ok(kvq_prefix_evict_key(e.x, k3) == 0 && h.calls == 1 && !memcmp(h.key, k3, sizeof k3) &&
	   kvq_prefix_match(e.x, tok, 16, 16, NULL, 0, 4, &n) == 0 && n == 3,
	   "evict_key: the unreferenced leaf goes, the hook told its key; the chain is 3 blocks");
	ok(kvq_prefix_evict_key(e.x, k3) == -ENOENT, "evict_key: a key not cached (-ENOENT)");
	ok(kvq_prefix_evict(e.x, 16, NULL, &n) == 0 && n == 3 && h.calls == 4,
	   "LRU eviction tells the hook too (4 victims in all)");
	kvq_prefix_set_evict_hook(e.x, NULL, NULL);
	ok(!kvq_prefix_has(e.x, k0), "has: an evicted key is not cached");
	publish_chain(&e, -1, tok, 4, 4, NULL, ids);
	kvq_prefix_block_key(e.x, ids[0], k0);
	ok(kvq_prefix_has(e.x, k0), "has: a cached key");
	ok(kvq_prefix_lookup(e.x, tok, 16, 8, NULL, 0, hit, 4, &n) == 0 && n == 2 &&
	   kvq_prefix_evict_unless(e.x, keep_key, k0) == 0,
	   "evict_unless: nothing while the chain's end is referenced (its ancestors are parents)");
	unref_all(&e, ids, 4);
	ok(kvq_prefix_evict_unless(e.x, keep_key, k0) == 2 && kvq_prefix_match(e.x, tok, 16, 16, NULL, 0, 4, &n) == 0 &&
	   n == 2, "evict_unless: the unreferenced end of the chain (2 blocks); the referenced ones stay");
	unref_all(&e, hit, 2);
	ok(kvq_prefix_evict_unless(e.x, keep_key, k0) == 1 && kvq_prefix_has(e.x, k0) &&
	   kvq_prefix_match(e.x, tok, 16, 16, NULL, 0, 4, &n) == 0 && n == 1,
	   "evict_unless: then the block it does not keep, and the kept root stays");
	env_free(&e);
}

/* --------------------------------------------------------- eviction order */

static int evict1(struct env *e, uint32_t *victim)
{
	uint32_t n = 0;

	kvq_prefix_evict(e->x, 1, victim, &n);
	return (int)n;
}

static void test_eviction_tree(void)
{
	/*
	 *   r -- a -- a1      S1 = r a a1
	 *   |     `-- a2      S2 = r a a2
	 *   `-- b             S3 = r b
	 *   c                 S4 = c
	 */
	struct env e = env_new(16, 2, "pool", "model");
	const uint32_t R[2] = {1, 1}, A[2] = {2, 2}, A1[2] = {3, 3}, A2[2] = {4, 4}, Bt[2] = {5, 5}, C[2] = {6, 6};
	uint32_t r, a, a1, a2, b, c, v = 0, s1[3], s2[3], s3[2], s4, got;
	struct kvq_pool_stats st;

	r = alloc1(&e);
	kvq_prefix_publish(e.x, r, -1, R, NULL, 0, &got);
	a = alloc1(&e);
	kvq_prefix_publish(e.x, a, (int32_t)r, A, NULL, 0, &got);
	a1 = alloc1(&e);
	kvq_prefix_publish(e.x, a1, (int32_t)a, A1, NULL, 0, &got);
	a2 = alloc1(&e);
	kvq_prefix_publish(e.x, a2, (int32_t)a, A2, NULL, 0, &got);
	b = alloc1(&e);
	kvq_prefix_publish(e.x, b, (int32_t)r, Bt, NULL, 0, &got);
	c = alloc1(&e);
	kvq_prefix_publish(e.x, c, -1, C, NULL, 0, &got);
	/* the publisher's references become S1's; S2 and S3 take their own */
	s1[0] = r, s1[1] = a, s1[2] = a1;
	s2[0] = r, s2[1] = a, s2[2] = a2;
	s3[0] = r, s3[1] = b;
	s4 = c;
	kvq_pool_ref(e.pool, r);
	kvq_pool_ref(e.pool, a);
	kvq_pool_ref(e.pool, r);
	ok(kvq_pool_refs(e.pool, r) == 3 && kvq_pool_refs(e.pool, a) == 2 && kvq_prefix_evictable(e.x, -1) == 0,
	   "tree of 6 cached blocks, every one referenced, none evictable");
	ok(evict1(&e, &v) == 0, "evict finds nothing");

	/* S2 leaf first; S1 root first; then c */
	kvq_pool_unref(e.pool, s2[2]);   /* a2 -> 0: t1 */
	kvq_pool_unref(e.pool, s2[1]);
	kvq_pool_unref(e.pool, s2[0]);
	kvq_pool_unref(e.pool, s1[0]);
	kvq_pool_unref(e.pool, s1[1]);   /* a -> 0: t2 */
	kvq_pool_unref(e.pool, s1[2]);   /* a1 -> 0: t3 */
	kvq_pool_unref(e.pool, s4);      /* c -> 0: t4 */
	kvq_pool_stats(e.pool, &st);
	ok(st.sealed_evictable == 4 && kvq_prefix_evictable(e.x, -1) == 4 && st.cached_referenced == 2,
	   "a, a1, a2, c evictable; r (S3, and its child b) and b are not");
	ok(evict1(&e, &v) == 1 && v == a2, "1st victim a2: the oldest leaf");
	ok(evict1(&e, &v) == 1 && v == a1, "2nd victim a1: a is older but still has a child");
	ok(evict1(&e, &v) == 1 && v == a, "3rd victim a: now a leaf, and older than c");
	ok(evict1(&e, &v) == 1 && v == c, "4th victim c");
	ok(evict1(&e, &v) == 0 && kvq_pool_state(e.pool, r) == KVQ_POOL_CACHED &&
	   kvq_pool_state(e.pool, b) == KVQ_POOL_CACHED, "then nothing: r and b are referenced by S3");
	ok(kvq_pool_state(e.pool, a) == KVQ_POOL_FREE && kvq_pool_state(e.pool, a2) == KVQ_POOL_FREE &&
	   kvq_prefix_block_key(e.x, a, (uint8_t[32]){0}) == -EINVAL, "victims are free slots, gone from the index");

	/* S3 root first: r is unreferenced but b pins it */
	kvq_pool_unref(e.pool, s3[0]);
	ok(kvq_prefix_evictable(e.x, -1) == 0 && evict1(&e, &v) == 0, "r released, b still held: nothing evictable");
	kvq_pool_unref(e.pool, s3[1]);
	ok(kvq_prefix_evictable(e.x, -1) == 2, "b released: r and b evictable");
	ok(evict1(&e, &v) == 1 && v == b, "b goes before r, though r was released first");
	ok(evict1(&e, &v) == 1 && v == r, "then r");
	kvq_pool_stats(e.pool, &st);
	ok(st.sealed_cached == 0 && st.sealed_free == 16 && st.evictions == 6, "pool empty, 6 evictions counted");

	/* a child published after a parent nobody holds (an evictable leaf) */
	r = alloc1(&e);
	kvq_prefix_publish(e.x, r, -1, R, NULL, 0, &got);
	kvq_pool_unref(e.pool, r);
	ok(kvq_prefix_evictable(e.x, -1) == 1, "r alone, released: evictable");
	a = alloc1(&e);
	ok(kvq_prefix_publish(e.x, a, (int32_t)r, A, NULL, 0, &got) == 0 && got == a,
	   "a published after the unreferenced r");
	ok(kvq_prefix_evictable(e.x, -1) == 0 && evict1(&e, &v) == 0, "r is no leaf now and a is held: nothing to evict");
	kvq_pool_unref(e.pool, a);
	ok(evict1(&e, &v) == 1 && v == a && evict1(&e, &v) == 1 && v == r, "a released: a, then r");
	env_free(&e);
}

/* ------------------------------------------------------------- full pool */

/* A pool with sink slots: chains start with a sink block; a sink short
 * evicts in the one eviction order (least recently used chains, leaf first)
 * until a sink slot is free, and a referenced chain is never reached. */
static void test_sink_chains(void)
{
	enum { B = 16, NB = 3 };
	struct env e;
	struct kvq_pool_stats st;
	uint32_t tok[3][NB * B], ids[3][NB], got, s;
	int good = 1;

	if (kvq_pool_new(12, 2, 3, &e.pool) != 0 || kvq_prefix_new(e.pool, B, "pool", "model", &e.x) != 0) {
		ok(0, "a pool of 12 sealed and 3 sink slots with its index");
		return;
	}
	for (int c = 0; c < 3; c++)
		for (int i = 0; i < NB * B; i++)
			tok[c][i] = (uint32_t)(1000 * c + i);
	/* three chains: a sink block, then two sealed blocks */
	for (int c = 0; c < 3; c++) {
		good &= kvq_pool_alloc_sink(e.pool, 1, &s) == 0 &&
			kvq_prefix_publish(e.x, s, -1, tok[c], NULL, 0, &got) == 0 && got == s;
		ids[c][0] = s;
		good &= publish_chain(&e, (int32_t)s, tok[c] + B, B, NB - 1, NULL, ids[c] + 1) == 0;
	}
	ok(good && ids[0][0] >= 12 && ids[1][0] >= 12 && ids[2][0] >= 12, "three chains rooted in sink blocks");
	/* chain 1 released first, then 2; chain 0 stays referenced */
	unref_all(&e, ids[1], NB);
	unref_all(&e, ids[2], NB);
	kvq_pool_stats(e.pool, &st);
	ok(st.sink_free == 0 && st.sink_cached == 3 && st.sink_evictable == 2 && st.sealed_evictable == 4 &&
	   kvq_prefix_evictable(e.x, 1) == 2 && kvq_prefix_evictable(e.x, -1) == 6,
	   "2 of 3 sinks evictable (their chains unreferenced), 4 sealed");
	ok(kvq_pool_alloc_sink(e.pool, 1, &s) == 0 && s == ids[1][0], "a sink short takes chain 1's sink");
	kvq_pool_stats(e.pool, &st);
	ok(st.evictions == 3 && st.sealed_cached == 4 && st.sink_cached == 2 &&
	   kvq_prefix_block_key(e.x, ids[2][0], (uint8_t[KVQ_PREFIX_KEY_LEN]){ 0 }) == 0 &&
	   kvq_prefix_parent(e.x, ids[2][2]) == (int64_t)ids[2][1],
	   "chain 1 went leaf first (3 blocks), chain 2 whole");
	{
		uint32_t hit[NB], n = 0;

		good = kvq_prefix_lookup(e.x, tok[2], NB * B, NB * B, NULL, 0, hit, NB, &n) == 0 && n == NB &&
		       hit[0] == ids[2][0];
		unref_all(&e, hit, n);
	}
	ok(good, "a lookup of chain 2 hits its sink block first");
	ok(kvq_pool_alloc_sink(e.pool, 2, ids[1]) == -ENOSPC, "2 sinks with 1 evictable: -ENOSPC");
	kvq_pool_stats(e.pool, &st);
	ok(st.evictions == 3 && st.sink_cached == 2, "the refusal evicted nothing");
	kvq_pool_unref(e.pool, s);
	unref_all(&e, ids[0], NB);
	env_free(&e);
}

static void test_full_pool(void)
{
	struct env e = env_new(8, 2, "pool", "model");
	struct kvq_pool_stats before, after;
	uint32_t tok[16], ids[8], got[8], hit[8], n;

	for (int i = 0; i < 16; i++)
		tok[i] = (uint32_t)i;
	publish_chain(&e, -1, tok, 2, 8, NULL, ids);
	kvq_pool_stats(e.pool, &before);
	ok(before.sealed_free == 0 && before.sealed_cached == 8 && before.cached_referenced == 8,
	   "a chain fills the pool, all referenced");
	ok(kvq_pool_alloc_sealed(e.pool, 1, got) == -ENOSPC && kvq_pool_alloc_open(e.pool, 1, got, NULL) == -ENOSPC,
	   "only referenced blocks: -ENOSPC");
	kvq_pool_stats(e.pool, &after);
	ok(after.alloc_failures == before.alloc_failures + 2 && after.evictions == 0 && after.sealed_cached == 8,
	   "nothing evicted");

	/* the root and the middle released, the end still held: the whole
	 * chain is pinned by its referenced end */
	for (int i = 0; i < 7; i++)
		kvq_pool_unref(e.pool, ids[i]);
	kvq_pool_stats(e.pool, &before);
	ok(before.sealed_evictable == 0 && before.cached_referenced == 1, "7 blocks unreferenced, none evictable");
	ok(kvq_pool_alloc_sealed(e.pool, 1, got) == -ENOSPC, "allocation fails cleanly");
	kvq_pool_stats(e.pool, &after);
	after.alloc_failures--;
	ok(!memcmp(&before, &after, sizeof before), "and changes nothing but the failure count");

	kvq_pool_unref(e.pool, ids[7]);
	ok(kvq_pool_alloc_sealed(e.pool, 3, got) == 0, "end released: 3 blocks granted by evicting");
	kvq_pool_stats(e.pool, &after);
	ok(after.evictions == 3 && after.sealed_cached == 5 && after.sealed_private == 3,
	   "3 evicted, 5 still cached");
	ok(kvq_prefix_lookup(e.x, tok, 16, 16, NULL, 0, hit, 8, &n) == 0 && n == 5 && !memcmp(hit, ids, 5 * 4),
	   "the chain lost its end: lookup finds the first 5 blocks");
	unref_all(&e, hit, n);
	ok(kvq_pool_alloc_open(e.pool, 4, got + 3, NULL) == 0, "4 open slots reserve sealed slots by evicting too");
	ok(kvq_pool_alloc_sealed(e.pool, 2, hit) == -ENOSPC, "then 2 more do not fit in 1 evictable");
	kvq_pool_stats(e.pool, &after);
	ok(after.sealed_cached == 1 && after.sealed_evictable == 1 && after.sealed_reserved == 4,
	   "the refusal left the last cached block");
	env_free(&e);
}

/* ------------------------------------------------ random run against a model */

#define MAXN 256  /* sealed slots, at most */
#define MB 2      /* tokens per block */
#define MAXB 5    /* blocks per sequence */
#define MAXSEQ 64 /* sequences held at once, at most */

struct mblock {
	int state;              /* enum kvq_pool_state */
	uint32_t refs;
	int32_t parent;
	uint32_t tok[MB];
	const char *salt;       /* static strings */
	uint64_t tick;
};

struct mseq {
	int live;
	uint32_t n;
	uint32_t ids[MAXB];
};

struct world {
	struct env e;
	uint32_t n, nseq, alpha;   /* slots, sequences, token values */
	struct mblock b[MAXN];
	struct mseq s[MAXSEQ];
	uint64_t clock;
	int n_implicit;         /* evictions the pool asked for */
	int nbad;
	char bad[200];
};

__attribute__((format(printf, 3, 4)))
static void wexpect(struct world *w, int cond, const char *fmt, ...)
{
	va_list ap;

	if (cond || w->nbad++)
		return;
	va_start(ap, fmt);
	vsnprintf(w->bad, sizeof w->bad, fmt, ap);
	va_end(ap);
}

static int salt_eq(const char *a, const char *b)
{
	return strcmp(a ? a : "", b ? b : "") == 0;
}

static int32_t m_find(const struct world *w, int32_t parent, const uint32_t *tok, const char *salt)
{
	for (int i = 0; i < (int)w->n; i++)
		if (w->b[i].state == KVQ_POOL_CACHED && w->b[i].parent == parent &&
		    !memcmp(w->b[i].tok, tok, sizeof w->b[i].tok) && salt_eq(w->b[i].salt, salt))
			return i;
	return -1;
}

static uint32_t m_evictable(const struct world *w)
{
	uint8_t pinned[MAXN] = {0};
	uint32_t n = 0;

	for (int i = 0; i < (int)w->n; i++)
		if (w->b[i].state == KVQ_POOL_CACHED && w->b[i].refs > 0)
			for (int32_t p = i; p >= 0 && !pinned[p]; p = w->b[p].parent)
				pinned[p] = 1;
	for (int i = 0; i < (int)w->n; i++)
		n += w->b[i].state == KVQ_POOL_CACHED && !pinned[i];
	return n;
}

static int32_t m_victim(const struct world *w)
{
	uint32_t children[MAXN] = {0};
	int32_t v = -1;

	for (int i = 0; i < (int)w->n; i++)
		if (w->b[i].state == KVQ_POOL_CACHED && w->b[i].parent >= 0)
			children[w->b[i].parent]++;
	for (int i = 0; i < (int)w->n; i++)
		if (w->b[i].state == KVQ_POOL_CACHED && w->b[i].refs == 0 && children[i] == 0 &&
		    (v < 0 || w->b[i].tick < w->b[v].tick))
			v = i;
	return v;
}

static uint32_t m_free(const struct world *w)
{
	uint32_t n = 0;

	for (int i = 0; i < (int)w->n; i++)
		n += w->b[i].state == KVQ_POOL_FREE;
	return n;
}

static void m_ref(struct world *w, uint32_t id)
{
	w->b[id].refs++;
}

static void m_unref(struct world *w, uint32_t id)
{
	if (--w->b[id].refs > 0)
		return;
	if (w->b[id].state == KVQ_POOL_PRIVATE)
		w->b[id].state = KVQ_POOL_FREE;
	else
		w->b[id].tick = ++w->clock;
}

static void w_unref(struct world *w, uint32_t id)
{
	wexpect(w, kvq_pool_unref(w->e.pool, id) == 0, "unref %u", id);
	m_unref(w, id);
}

/* the model's eviction of the shortfall of an allocation of need blocks */
static void m_make_room(struct world *w, uint32_t need)
{
	while (m_free(w) < need) {
		int32_t v = m_victim(w);

		if (v < 0)
			return;
		w->b[v].state = KVQ_POOL_FREE;
		w->n_implicit++;
	}
}

static void check_world(struct world *w)
{
	struct kvq_pool_stats st;
	uint32_t cached = 0;

	for (uint32_t i = 0; i < w->n; i++) {
		uint8_t k[32];
		int in = kvq_prefix_block_key(w->e.x, i, k) == 0;

		wexpect(w, kvq_pool_state(w->e.pool, i) == w->b[i].state, "block %u state %d, model %d", i,
			kvq_pool_state(w->e.pool, i), w->b[i].state);
		wexpect(w, kvq_pool_refs(w->e.pool, i) == w->b[i].refs, "block %u refs %u, model %u", i,
			kvq_pool_refs(w->e.pool, i), w->b[i].refs);
		wexpect(w, in == (w->b[i].state == KVQ_POOL_CACHED), "block %u indexed %d", i, in);
		if (in)
			wexpect(w, kvq_prefix_parent(w->e.x, i) == w->b[i].parent, "block %u parent", i);
		cached += w->b[i].state == KVQ_POOL_CACHED;
	}
	kvq_pool_stats(w->e.pool, &st);
	wexpect(w, st.sealed_cached == cached && st.sealed_evictable == m_evictable(w),
		"cached %u/%u evictable %u/%u", st.sealed_cached, cached, st.sealed_evictable, m_evictable(w));
}

static const char *const salts[] = {NULL, NULL, NULL, "t1"};

/* a new sequence: lookup, allocate the rest, publish it */
static void w_start(struct world *w, struct mseq *q, int *n_fail, int *n_hit)
{
	uint32_t tok[MAXB * MB], nb = 1 + (uint32_t)(tap_rand() % MAXB), hit[MAXB], n = 0, fresh[MAXB];
	const char *salt = salts[tap_rand() % 4];
	size_t sl = salt ? strlen(salt) : 0;
	int32_t parent = -1;
	uint32_t m_hits = 0;
	int r;

	/* few token values: chains share prefixes often */
	for (uint32_t i = 0; i < nb * MB; i++)
		tok[i] = (uint32_t)(tap_rand() % w->alpha);
	for (; m_hits < nb; m_hits++) {
		int32_t f = m_find(w, parent, tok + m_hits * MB, salt);

		if (f < 0)
			break;
		parent = f;
	}
	r = kvq_prefix_lookup(w->e.x, tok, nb * MB + 1, nb * MB, salt, sl, hit, MAXB, &n);
	wexpect(w, r == 0 && n == m_hits, "lookup gave %d, %u blocks; model %u", r, n, m_hits);
	if (r != 0 || n != m_hits)
		return;
	*n_hit += n > 0;
	for (uint32_t i = 0; i < n; i++)
		m_ref(w, hit[i]);
	if (nb > n) {
		int fit = nb - n <= m_free(w) + m_evictable(w);

		r = kvq_pool_alloc_sealed(w->e.pool, nb - n, fresh);
		wexpect(w, r == (fit ? 0 : -ENOSPC), "alloc_sealed(%u) gave %d, model fit %d", nb - n, r, fit);
		if (r != 0) {
			(*n_fail)++;
			for (uint32_t i = 0; i < n; i++)
				w_unref(w, hit[i]);
			return;
		}
		m_make_room(w, nb - n);
		for (uint32_t i = 0; i < nb - n; i++) {
			wexpect(w, w->b[fresh[i]].state == KVQ_POOL_FREE, "granted block %u not free", fresh[i]);
			w->b[fresh[i]].state = KVQ_POOL_PRIVATE;
			w->b[fresh[i]].refs = 1;
		}
	}
	parent = n ? (int32_t)hit[n - 1] : -1;
	q->n = 0;
	for (uint32_t i = 0; i < n; i++)
		q->ids[q->n++] = hit[i];
	for (uint32_t i = n; i < nb; i++) {
		uint32_t id = fresh[i - n], got;
		struct mblock *mb = &w->b[id];

		r = kvq_prefix_publish(w->e.x, id, parent, tok + i * MB, salt, sl, &got);
		wexpect(w, r == 0 && got == id, "publish %u gave %d, %u", id, r, got);
		mb->state = KVQ_POOL_CACHED;
		mb->parent = parent;
		memcpy(mb->tok, tok + i * MB, sizeof mb->tok);
		mb->salt = salt;
		q->ids[q->n++] = id;
		parent = (int32_t)id;
	}
	q->live = 1;
}

/* releases a sequence's blocks in a random order */
static void w_release(struct world *w, struct mseq *q)
{
	for (uint32_t i = q->n; i > 1; i--) {
		uint32_t j = (uint32_t)(tap_rand() % i), t = q->ids[i - 1];

		q->ids[i - 1] = q->ids[j];
		q->ids[j] = t;
	}
	for (uint32_t i = 0; i < q->n; i++)
		w_unref(w, q->ids[i]);
	q->live = 0;
}

/* another worker sealed the same block: publish returns the cached one */
static void w_duplicate(struct world *w, int *n_dup)
{
	int32_t c = -1;
	uint32_t d, got = UINT32_MAX;
	int r;

	for (int tries = 0; tries < 8 && c < 0; tries++) {
		int32_t i = (int32_t)(tap_rand() % w->n);

		if (w->b[i].state == KVQ_POOL_CACHED)
			c = i;
	}
	if (c < 0 || m_free(w) == 0)
		return;   /* keep the model's eviction out of this path */
	r = kvq_pool_alloc_sealed(w->e.pool, 1, &d);
	wexpect(w, r == 0 && w->b[d].state == KVQ_POOL_FREE, "duplicate's slot");
	w->b[d].state = KVQ_POOL_PRIVATE;
	w->b[d].refs = 1;
	r = kvq_prefix_publish(w->e.x, d, w->b[c].parent, w->b[c].tok, w->b[c].salt,
			       w->b[c].salt ? strlen(w->b[c].salt) : 0, &got);
	wexpect(w, r == 0 && got == (uint32_t)c, "duplicate publish gave %d, %u, want %d", r, got, c);
	wexpect(w, kvq_pool_ref(w->e.pool, (uint32_t)c) == 0, "ref on the cached block");
	m_ref(w, (uint32_t)c);
	w_unref(w, d);
	w_unref(w, (uint32_t)c);
	(*n_dup)++;
}

/* a block published after a parent nobody holds (a leaf on the LRU, it may
 * be): the parent stops being evictable while the child is cached */
static void w_extend(struct world *w, int *n_extend)
{
	int32_t c = (int32_t)(tap_rand() % w->n), dup;
	uint32_t tok[MB], d, got = UINT32_MAX;
	int r;

	if (w->b[c].state != KVQ_POOL_CACHED || m_free(w) == 0)
		return;   /* no eviction here: it could take c itself */
	for (int i = 0; i < MB; i++)
		tok[i] = (uint32_t)(tap_rand() % w->alpha);
	dup = m_find(w, c, tok, w->b[c].salt);
	r = kvq_pool_alloc_sealed(w->e.pool, 1, &d);
	wexpect(w, r == 0 && w->b[d].state == KVQ_POOL_FREE, "extension's slot");
	w->b[d].state = KVQ_POOL_PRIVATE;
	w->b[d].refs = 1;
	r = kvq_prefix_publish(w->e.x, d, c, tok, w->b[c].salt, w->b[c].salt ? strlen(w->b[c].salt) : 0, &got);
	wexpect(w, r == 0 && got == (dup >= 0 ? (uint32_t)dup : d), "extension publish gave %d, %u (dup %d)", r,
		got, dup);
	if (dup < 0) {
		w->b[d].state = KVQ_POOL_CACHED;
		w->b[d].parent = c;
		memcpy(w->b[d].tok, tok, sizeof tok);
		w->b[d].salt = w->b[c].salt;
	}
	w_unref(w, d);
	(*n_extend)++;
}

/* a short-lived reader: one reference taken and given back moves a block to
 * the young end of the LRU (a removal from the middle of the heap) */
static void w_touch(struct world *w, int *n_touch)
{
	int32_t c = (int32_t)(tap_rand() % w->n);

	if (w->b[c].state != KVQ_POOL_CACHED)
		return;
	wexpect(w, kvq_pool_ref(w->e.pool, (uint32_t)c) == 0, "touch: ref %d", c);
	m_ref(w, (uint32_t)c);
	w_unref(w, (uint32_t)c);
	(*n_touch)++;
}

static void test_random(uint32_t n_sealed, uint32_t nseq, uint32_t alpha, int steps)
{
	struct world *w = calloc(1, sizeof *w);
	int n_start = 0, n_fail = 0, n_hit = 0, n_dup = 0, n_evict = 0, n_touch = 0, n_extend = 0, step;

	w->n = n_sealed;
	w->nseq = nseq;
	w->alpha = alpha;
	diag("random run: %u slots, %u sequences of up to %u blocks, %u token values", n_sealed, nseq, MAXB, alpha);
	w->e = env_new(n_sealed, MB, "pool", "model");
	for (step = 0; step < steps && !w->nbad; step++) {
		struct mseq *q = &w->s[tap_rand() % w->nseq];
		int op = (int)(tap_rand() % 11);

		if (op < 4) {
			if (q->live)
				w_release(w, q);
			else {
				w_start(w, q, &n_fail, &n_hit);
				n_start++;
			}
		} else if (op < 5) {
			uint32_t v = UINT32_MAX;
			int32_t want = m_victim(w);
			int got = evict1(&w->e, &v);

			wexpect(w, got == (want >= 0) && (want < 0 || v == (uint32_t)want),
				"evict gave %d (%u), model %d", got, v, want);
			if (want >= 0) {
				w->b[want].state = KVQ_POOL_FREE;
				n_evict++;
			}
		} else if (op < 7) {
			w_duplicate(w, &n_dup);
		} else if (op < 10) {
			w_touch(w, &n_touch);
		} else {
			w_extend(w, &n_extend);
		}
		check_world(w);
	}
	diag("random run: %d sequences (%d hit the cache, %d refused), %d evictions by allocation, "
	     "%d explicit, %d duplicates, %d touches, %d extensions", n_start, n_hit, n_fail, w->n_implicit, n_evict,
	     n_dup, n_touch, n_extend);
	ok(!w->nbad, "%d steps: pool and index match the model after every step%s%s", step,
	   w->nbad ? "; first fault: " : "", w->bad);
	ok(n_hit > 0 && n_fail > 0 && n_evict > 0 && w->n_implicit > 0 && n_dup > 0,
	   "the run exercised hits, refusals, both kinds of eviction and duplicates");
	for (uint32_t i = 0; i < w->nseq; i++)
		if (w->s[i].live)
			w_release(w, &w->s[i]);
	{
		uint32_t v, all = 0;
		int32_t want;

		while ((want = m_victim(w)) >= 0) {
			wexpect(w, evict1(&w->e, &v) == 1 && v == (uint32_t)want, "drain: victim %u, model %d", v, want);
			w->b[want].state = KVQ_POOL_FREE;
			all++;
		}
		wexpect(w, evict1(&w->e, &v) == 0, "drain: something left to evict");
		check_world(w);
		ok(!w->nbad && kvq_prefix_evictable(w->e.x, -1) == 0 && m_free(w) == w->n,
		   "everything released and evicted (%u blocks): the pool is empty", all);
	}
	env_free(&w->e);
	free(w);
}

int main(void)
{
	tap_seed();
	test_keys();
	test_salt_and_duplicates();
	test_lookup();
	test_group_calls();
	test_eviction_tree();
	test_sink_chains();
	test_full_pool();
	test_random(24, 10, 2, 6000);     /* small: refusals, deep sharing */
	test_random(96, 64, 4, 30000);    /* wide: big heap, many leaves */
	return done_testing();
}
