/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The packed block record (kernels/blockrec.h): its size from the layout's
 * fields; its header read back field by field and its checksum recomputed
 * here; sealed and sink blocks of several policies packed from one host
 * pool and unpacked into another slot of another pool, the slices equal
 * layer by layer and every other byte untouched; a pool of other slot
 * counts takes it; each refusal with its code (magic, version, length,
 * layout, checksum, class, range), a refused unpack writing nothing, and
 * no read past the end of a short buffer.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "blockrec.h"
#include "layout.h"
#include "policy.h"
#include "../tap.h"

/* ------------------------------------------------------------- helpers */

struct pool {
	struct kvq_policy pol;
	struct kvq_layout *L;
	uint8_t *base;
};

static void pool_new(struct pool *p, const char *policy, uint32_t layers, uint32_t H, uint32_t D, uint32_t B,
		     uint32_t n_sealed, uint32_t n_sink, int act)
{
	struct kvq_layout_params lp = {
		.layers = layers, .kv_heads = H, .head_dim = D, .block_tokens = B, .window = 0,
		.n_sealed = n_sealed, .n_open = 2, .sink_blocks = n_sink ? 1 : 0, .n_sink = n_sink,
		.act = act, .policy = &p->pol,
	};
	char err[256];

	if (kvq_policy_parse(policy, layers, &p->pol, err, sizeof err) != 0 ||
	    kvq_layout_new(&lp, &p->L, err, sizeof err) != 0) {
		/* a bad pool is a bug of this test, not of the record */
		fprintf(stderr, "test pool '%s': %s\n", policy, err);
		abort();
	}
	p->base = malloc(p->L->total_bytes);
	if (!p->base)
		abort();
	for (uint64_t i = 0; i < p->L->total_bytes; i++)
		p->base[i] = (uint8_t)tap_rand();
}

static void pool_free(struct pool *p)
{
	kvq_layout_free(p->L);
	free(p->base);
}

/* A slice's place, from the layout's fields as layout.h describes them
 * (not through kvq_layout_slice_off). */
static uint64_t slice_off(const struct kvq_layout *L, uint32_t cls, uint32_t index, uint32_t l)
{
	const struct kvq_layer_layout *ll = &L->layer[l];

	if (cls == KVQ_BLOCK_SINK)
		return ll->region + (uint64_t)L->n_sealed * ll->sealed_slice +
		       ((uint64_t)L->n_open + index) * ll->open_slice;
	return ll->region + (uint64_t)index * ll->sealed_slice;
}

static uint64_t slice_len(const struct kvq_layout *L, uint32_t cls, uint32_t l)
{
	const struct kvq_layer_layout *ll = &L->layer[l];

	return cls == KVQ_BLOCK_SINK ? (uint64_t)L->kv_heads * ll->open_head : (uint64_t)L->kv_heads * ll->sealed_head;
}

static uint64_t want_size(const struct kvq_layout *L, uint32_t cls)
{
	uint64_t n = 128u + 4u * (uint64_t)L->block_tokens;

	for (uint32_t l = 0; l < L->layers; l++)
		n += slice_len(L, cls, l);
	return n;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* XXH64, seed 0, as its specification writes it (one shot, byte reads). */
static uint64_t rotl64(uint64_t x, int r)
{
	return x << r | x >> (64 - r);
}

static uint64_t xxh64(const uint8_t *p, size_t n)
{
	const uint64_t P1 = 0x9e3779b185ebca87ull, P2 = 0xc2b2ae3d27d4eb4full, P3 = 0x165667b19e3779f9ull,
		       P4 = 0x85ebca77c2b2ae63ull, P5 = 0x27d4eb2f165667c5ull;
	const uint8_t *end = p + n;
	uint64_t h;

	if (n >= 32) {
		uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;

		while (end - p >= 32) {
			v1 = rotl64(v1 + le64(p) * P2, 31) * P1;
			v2 = rotl64(v2 + le64(p + 8) * P2, 31) * P1;
			v3 = rotl64(v3 + le64(p + 16) * P2, 31) * P1;
			v4 = rotl64(v4 + le64(p + 24) * P2, 31) * P1;
			p += 32;
		}
		h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
		h = (h ^ rotl64(v1 * P2, 31) * P1) * P1 + P4;
		h = (h ^ rotl64(v2 * P2, 31) * P1) * P1 + P4;
		h = (h ^ rotl64(v3 * P2, 31) * P1) * P1 + P4;
		h = (h ^ rotl64(v4 * P2, 31) * P1) * P1 + P4;
	} else {
		h = P5;
	}
	h += n;
	for (; end - p >= 8; p += 8)
		h = rotl64(h ^ rotl64(le64(p) * P2, 31) * P1, 27) * P1 + P4;
	if (end - p >= 4) {
		h = rotl64(h ^ le32(p) * P1, 23) * P2 + P3;
		p += 4;
	}
	for (; p < end; p++)
		h = rotl64(h ^ *p * P5, 11) * P1;
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	return h ^ h >> 32;
}

/* The record's checksum: XXH64 of it with its field (24..31) as zeros. */
static uint64_t sum_record(const uint8_t *r, size_t n)
{
	uint8_t *c = malloc(n);
	uint64_t h;

	if (!c)
		abort();
	memcpy(c, r, n);
	memset(c + 24, 0, 8);
	h = xxh64(c, n);
	free(c);
	return h;
}

/* The reference's own values (xxHash's implementation), so that this one is
 * known right before it judges the records. */
static void xxh64_vectors(void)
{
	uint8_t d[768];

	for (size_t i = 0; i < sizeof d; i++)
		d[i] = (uint8_t)i;
	ok(xxh64(d, 0) == 0xef46db3751d8e999ull && xxh64((const uint8_t *)"abc", 3) == 0x44bc2cf5ad770999ull &&
	   xxh64(d, 100) == 0x6ac1e58032166597ull && xxh64(d, 768) == 0x8e03c838c596036full,
	   "the test's XXH64 gives xxHash's values (0, 3, 100, 768 bytes)");
}

/* Writes a valid checksum into a record whose header a test changed. */
static void reseal(uint8_t *r, size_t n)
{
	put_le(r + 24, sum_record(r, n), 8);
}

struct block {
	uint8_t key[32], parent[32];
	uint32_t tokens[KVQ_MAX_BLOCK_TOKENS];
};

static void block_random(struct block *b)
{
	for (int i = 0; i < 32; i++) {
		b->key[i] = (uint8_t)tap_rand();
		b->parent[i] = (uint8_t)tap_rand();
	}
	for (uint32_t t = 0; t < KVQ_MAX_BLOCK_TOKENS; t++)
		b->tokens[t] = (uint32_t)tap_rand();
}

static uint8_t *pack(const struct pool *p, uint32_t cls, uint32_t index, const struct block *b, int with_parent,
		     size_t *ret_len)
{
	struct kvq_block_ref r = { cls, index };
	size_t n = (size_t)kvq_blockrec_size(p->L, cls);
	uint8_t *buf = malloc(n);
	char err[256];
	int rc;

	if (!buf)
		abort();
	rc = kvq_blockrec_pack(p->L, p->base, r, b->key, with_parent ? b->parent : NULL, b->tokens, 1, buf, n, err,
			       sizeof err);
	if (rc != 0) {
		fprintf(stderr, "pack: %s\n", err);
		abort();
	}
	*ret_len = n;
	return buf;
}

/* ---------------------------------------------------------- round trips */

struct shape {
	const char *policy;
	uint32_t layers, H, D, B, n_sink;
	int act;
};

static const struct shape shapes[] = {
	{ "int8", 2, 2, 64, 16, 0, KVQ_DT_F16 },
	{ "int4g32", 3, 4, 128, 32, 0, KVQ_DT_F16 },
	{ "kivi2", 2, 1, 128, 32, 0, KVQ_DT_BF16 },
	{ "0:int8;1:k=int4g32,v=kivi2;2-3:fp8;4:k=int8+rot,v=int4g64", 5, 2, 64, 16, 0, KVQ_DT_F16 },
	{ "int8", 2, 2, 64, 16, 3, KVQ_DT_F16 },
	{ "0:kivi4;1:int4g32", 2, 2, 128, 32, 2, KVQ_DT_BF16 },
};

/* Pack a block of class cls from one pool, check it, read its header here,
 * unpack it into another slot of a second pool: slices equal, nothing else
 * changed. */
static void round_trip(const struct shape *s, uint32_t cls)
{
	uint32_t n_slots = cls == KVQ_BLOCK_SINK ? s->n_sink : 4;
	uint32_t from = n_slots - 1, to = 0;
	struct pool a, b;
	struct block blk;
	struct kvq_blockrec_info info;
	const char *what = kvq_block_class_name(cls);
	uint8_t *rec, *want;
	size_t len;
	char err[256] = "";
	int rc, with_parent = cls == KVQ_BLOCK_SEALED, same = 1;
	uint64_t at;

	pool_new(&a, s->policy, s->layers, s->H, s->D, s->B, 4, s->n_sink, s->act);
	pool_new(&b, s->policy, s->layers, s->H, s->D, s->B, 4, s->n_sink, s->act);
	block_random(&blk);
	diag("%s, %u layers, H %u, D %u, B %u, a %s block", s->policy, s->layers, s->H, s->D, s->B, what);

	ok(kvq_blockrec_size(a.L, cls) == want_size(a.L, cls),
	   "size %llu = header + 4B + the layers' slices (%llu)", (unsigned long long)kvq_blockrec_size(a.L, cls),
	   (unsigned long long)want_size(a.L, cls));
	ok(kvq_blockrec_size(a.L, cls) == 128u + 4u * s->B + kvq_layout_block_bytes(a.L, cls),
	   "size = header + 4B + the layout's block bytes");

	rec = pack(&a, cls, from, &blk, with_parent, &len);
	ok(memcmp(rec, "KVQBLKRC", 8) == 0 && le32(rec + 8) == KVQ_BLOCKREC_VERSION &&
	   le32(rec + 12) == (with_parent ? 3u : 2u) && le64(rec + 16) == len && le32(rec + 32) == cls,
	   "header: magic, version, flags, length = record size, class");
	ok(le32(rec + 36) == s->layers && le32(rec + 40) == s->H && le32(rec + 44) == s->D && le32(rec + 48) == s->B &&
	   le32(rec + 52) == a.L->version && le64(rec + 56) == kvq_blockrec_fingerprint(a.L),
	   "header: geometry, layout version, fingerprint");
	ok(le64(rec + 24) == sum_record(rec, len), "checksum: XXH64 of the record with its field as zeros");
	{
		int tok_ok = memcmp(rec + 64, blk.key, 32) == 0;

		if (with_parent)
			tok_ok &= memcmp(rec + 96, blk.parent, 32) == 0;
		else
			for (int i = 0; i < 32; i++)
				tok_ok &= rec[96 + i] == 0;
		for (uint32_t t = 0; t < s->B; t++)
			tok_ok &= le32(rec + 128 + 4 * t) == blk.tokens[t];
		ok(tok_ok, "key, parent (%s), tokens as u32 LE", with_parent ? "a key" : "zeros: none");
	}
	at = 128u + 4u * s->B;
	for (uint32_t l = 0; l < s->layers; l++) {
		same &= memcmp(rec + at, a.base + slice_off(a.L, cls, from, l), slice_len(a.L, cls, l)) == 0;
		at += slice_len(a.L, cls, l);
	}
	ok(same && at == len, "slices in layer order, as the pool stores them, to the record's end");
	{
		/* the slices put in place first (as a device's DMA does), then sealed */
		uint8_t *dma = calloc(1, len);
		int rs;

		if (!dma)
			abort();
		for (uint32_t l = 0; l < s->layers; l++)
			memcpy(dma + kvq_blockrec_slice_at(a.L, cls, l), a.base + slice_off(a.L, cls, from, l),
			       slice_len(a.L, cls, l));
		rs = kvq_blockrec_seal(a.L, cls, blk.key, with_parent ? blk.parent : NULL, blk.tokens, 1, dma, len);
		ok(rs == 0 && memcmp(dma, rec, len) == 0 &&
		   kvq_blockrec_seal(a.L, cls, blk.key, NULL, NULL, 1, dma, len - 1) == -EINVAL,
		   "slices placed at kvq_blockrec_slice_at and sealed: the packed record, byte for byte; short: -EINVAL");
		free(dma);
	}

	memset(&info, 0xa5, sizeof info);
	rc = kvq_blockrec_check(b.L, rec, len, &info, err, sizeof err);
	ok(rc == 0, "check against a second pool of the layout: %d %s", rc, err);
	ok(info.cls == cls && info.has_parent == with_parent && info.has_tokens && memcmp(info.key, blk.key, 32) == 0 &&
	   info.n_tokens == s->B && memcmp(info.tokens, blk.tokens, 4u * s->B) == 0 &&
	   (with_parent ? memcmp(info.parent, blk.parent, 32) == 0 : info.parent[0] == 0 && info.parent[31] == 0),
	   "decoded header: class, parent flag, key, parent, tokens");

	want = malloc(b.L->total_bytes);
	if (!want)
		abort();
	memcpy(want, b.base, b.L->total_bytes);
	for (uint32_t l = 0; l < s->layers; l++)
		memcpy(want + slice_off(b.L, cls, to, l), a.base + slice_off(a.L, cls, from, l), slice_len(a.L, cls, l));
	rc = kvq_blockrec_unpack(b.L, b.base, (struct kvq_block_ref){ cls, to }, rec, len, NULL, err, sizeof err);
	ok(rc == 0, "unpack into %s slot %u of the second pool: %d %s", what, to, rc, err);
	same = 1;
	for (uint32_t l = 0; l < s->layers; l++)
		same &= memcmp(b.base + slice_off(b.L, cls, to, l), a.base + slice_off(a.L, cls, from, l),
			       slice_len(a.L, cls, l)) == 0;
	ok(same, "every layer's slice equals the packed one");
	ok(memcmp(want, b.base, b.L->total_bytes) == 0, "no other byte of the pool changed");

	free(want);
	free(rec);
	pool_free(&a);
	pool_free(&b);
}

/* Slot counts are no part of a record: a pool with more slots takes it. */
static void other_counts(void)
{
	struct pool a, b;
	struct block blk;
	uint8_t *rec;
	size_t len;
	char err[256] = "";
	int rc;

	pool_new(&a, "int4g32", 2, 2, 64, 16, 3, 2, KVQ_DT_F16);
	pool_new(&b, "int4g32", 2, 2, 64, 16, 9, 5, KVQ_DT_F16);
	block_random(&blk);
	rec = pack(&a, KVQ_BLOCK_SINK, 1, &blk, 0, &len);
	rc = kvq_blockrec_unpack(b.L, b.base, (struct kvq_block_ref){ KVQ_BLOCK_SINK, 4 }, rec, len, NULL, err,
				 sizeof err);
	ok(rc == 0 && memcmp(b.base + slice_off(b.L, KVQ_BLOCK_SINK, 4, 1), a.base + slice_off(a.L, KVQ_BLOCK_SINK, 1, 1),
			     slice_len(a.L, KVQ_BLOCK_SINK, 1)) == 0,
	   "a sink block of a pool of 3 sealed and 2 sink slots into sink 4 of one of 9 and 5: %d %s", rc, err);
	free(rec);
	pool_free(&a);
	pool_free(&b);
}

/* ------------------------------------------------------------ refusals */

static void refused(const struct kvq_layout *L, const uint8_t *rec, size_t len, int want, const char *what)
{
	char err[256] = "";
	int rc = kvq_blockrec_check(L, rec, len, NULL, err, sizeof err);

	ok(rc == want && (want == 0 || err[0] != '\0'), "%s: %d (%s) \"%s\"", what, rc, strerror(-want), err);
}

/* A copy of rec with one change; the checksum resealed when asked. */
static uint8_t *changed(const uint8_t *rec, size_t len, size_t at, uint64_t v, int n, int seal)
{
	uint8_t *c = malloc(len);

	if (!c)
		abort();
	memcpy(c, rec, len);
	put_le(c + at, v, n);
	if (seal)
		reseal(c, len);
	return c;
}

static void refusals(void)
{
	struct pool a, fmt, heads, act, rot;
	struct block blk;
	uint8_t *rec, *c, *big;
	size_t len;
	uint64_t payload;

	pool_new(&a, "int8", 2, 2, 64, 16, 4, 1, KVQ_DT_F16);
	pool_new(&fmt, "fp8", 2, 2, 64, 16, 4, 1, KVQ_DT_F16);        /* int8's sizes, another format */
	pool_new(&heads, "int8", 2, 4, 64, 16, 4, 1, KVQ_DT_F16);
	pool_new(&act, "int8", 2, 2, 64, 16, 4, 1, KVQ_DT_BF16);
	pool_new(&rot, "int8+rot", 2, 2, 64, 16, 4, 1, KVQ_DT_F16);
	block_random(&blk);
	rec = pack(&a, KVQ_BLOCK_SEALED, 2, &blk, 1, &len);
	payload = 128u + 4u * 16u;

	refused(a.L, rec, len, 0, "the record as packed");
	c = changed(rec, len, 0, 'k', 1, 1);
	refused(a.L, c, len, -ENOMSG, "wrong magic");
	free(c);
	refused(a.L, rec, KVQ_BLOCKREC_HEADER - 1, -ENOMSG, "shorter than a header");
	refused(a.L, rec, 0, -ENOMSG, "empty");
	c = changed(rec, len, 8, KVQ_BLOCKREC_VERSION + 1, 4, 1);
	refused(a.L, c, len, -EPROTONOSUPPORT, "a newer version");
	free(c);
	c = changed(rec, len, 8, 0, 4, 1);
	refused(a.L, c, len, -EPROTONOSUPPORT, "version 0");
	free(c);
	refused(a.L, rec, len - 1, -EMSGSIZE, "truncated by a byte");
	refused(a.L, rec, KVQ_BLOCKREC_HEADER, -EMSGSIZE, "its header alone");
	big = calloc(1, len + 64);
	if (!big)
		abort();
	memcpy(big, rec, len);
	refused(a.L, big, len + 64, -EMSGSIZE, "with trailing bytes");
	free(big);
	c = changed(rec, len, 16, UINT64_MAX, 8, 1);
	refused(a.L, c, len, -EMSGSIZE, "a length field of 2^64-1");
	free(c);

	refused(fmt.L, rec, len, -EMEDIUMTYPE, "into fp8 (int8's sizes)");
	refused(heads.L, rec, len, -EMEDIUMTYPE, "into 4 heads");
	refused(act.L, rec, len, -EMEDIUMTYPE, "into a bf16 window");
	refused(rot.L, rec, len, -EMEDIUMTYPE, "into int8+rot");
	ok(kvq_blockrec_fingerprint(a.L) != kvq_blockrec_fingerprint(fmt.L) &&
	   kvq_blockrec_fingerprint(a.L) != kvq_blockrec_fingerprint(rot.L) &&
	   kvq_blockrec_fingerprint(a.L) != kvq_blockrec_fingerprint(heads.L) &&
	   kvq_blockrec_size(a.L, KVQ_BLOCK_SEALED) == kvq_blockrec_size(fmt.L, KVQ_BLOCK_SEALED),
	   "fingerprints differ where the sizes do not");

	c = changed(rec, len, len - 1, rec[len - 1] ^ 0x10, 1, 0);
	refused(a.L, c, len, -EBADMSG, "the last payload byte flipped");
	free(c);
	c = changed(rec, len, payload, rec[payload] ^ 1, 1, 0);
	refused(a.L, c, len, -EBADMSG, "the first payload byte flipped");
	free(c);
	c = changed(rec, len, 128, rec[128] ^ 0x80, 1, 0);
	refused(a.L, c, len, -EBADMSG, "a token flipped");
	free(c);
	c = changed(rec, len, 64, rec[64] ^ 2, 1, 0);
	refused(a.L, c, len, -EBADMSG, "a key byte flipped");
	free(c);
	c = changed(rec, len, 12, 0, 4, 0);
	refused(a.L, c, len, -EBADMSG, "the parent flag cleared (unsealed)");
	free(c);
	c = changed(rec, len, 12, 11, 4, 1);
	refused(a.L, c, len, -EBADMSG, "an unknown flag (resealed)");
	free(c);
	c = changed(rec, len, 12, 0, 4, 1);
	refused(a.L, c, len, -EBADMSG, "a parent key without its flag (resealed)");
	free(c);
	c = changed(rec, len, 32, KVQ_BLOCK_SINK, 4, 1);
	refused(a.L, c, len, -EBADMSG, "a sealed block's length with class sink (resealed)");
	free(c);
	c = changed(rec, len, 32, KVQ_BLOCK_NCLASS, 4, 1);
	refused(a.L, c, len, -EBADMSG, "an unknown class (resealed)");
	free(c);

	{
		char err[256];
		uint8_t *before = malloc(a.L->total_bytes);
		struct kvq_blockrec_info info;
		int rc1, rc2, rc3;

		if (!before)
			abort();
		memcpy(before, a.base, a.L->total_bytes);
		c = changed(rec, len, len - 1, rec[len - 1] ^ 0x10, 1, 0);
		memset(&info, 0x5a, sizeof info);
		rc1 = kvq_blockrec_unpack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, c, len, &info,
					  err, sizeof err);
		free(c);
		rc2 = kvq_blockrec_unpack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SINK, 0 }, rec, len, &info, err,
					  sizeof err);
		ok(rc2 == -EINVAL, "unpack of a sealed record into a sink slot: %d \"%s\"", rc2, err);
		rc3 = kvq_blockrec_unpack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 4 }, rec, len, &info,
					  err, sizeof err);
		ok(rc3 == -ERANGE, "unpack into sealed 4 of 4: %d \"%s\"", rc3, err);
		/* the checksum is judged after the copy: only the slot's slices may differ */
		for (uint32_t l = 0; l < a.L->layers; l++)
			memcpy(a.base + slice_off(a.L, KVQ_BLOCK_SEALED, 0, l), before + slice_off(a.L, KVQ_BLOCK_SEALED, 0, l),
			       slice_len(a.L, KVQ_BLOCK_SEALED, l));
		ok(rc1 == -EBADMSG && memcmp(before, a.base, a.L->total_bytes) == 0 && info.cls == 0x5a5a5a5a,
		   "refused unpacks (checksum, class, range) wrote nothing outside the slot, nor *ret");
		free(before);
	}

	{
		char err[256];
		size_t n = len - 1;
		uint8_t *buf = malloc(len);
		int rc;

		if (!buf)
			abort();
		memset(buf, 0xee, len);
		rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, blk.key, NULL,
				       blk.tokens, 1, buf, n, err, sizeof err);
		ok(rc == -ENOSPC && buf[0] == 0xee && buf[n - 1] == 0xee, "pack into a byte too few: %d \"%s\"", rc, err);
		rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SINK, 1 }, blk.key, NULL,
				       blk.tokens, 1, buf, len, err, sizeof err);
		ok(rc == -ERANGE, "pack of sink 1 of 1: %d \"%s\"", rc, err);
		rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_NCLASS, 0 }, blk.key, NULL,
				       blk.tokens, 1, buf, len, err, sizeof err);
		ok(rc == -ERANGE, "pack of an unknown class: %d \"%s\"", rc, err);
		rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, NULL, NULL,
				       blk.tokens, 1, buf, len, err, sizeof err);
		ok(rc == -EINVAL, "pack without a key: %d \"%s\"", rc, err);
		ok(kvq_blockrec_size(a.L, KVQ_BLOCK_NCLASS) == 0, "no size for an unknown class");
		{
			struct kvq_blockrec_info info;
			int zeros = 1;

			rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, blk.key, NULL,
					       NULL, 1, buf, len, err, sizeof err);
			for (uint32_t t = 0; t < a.L->block_tokens; t++)
				zeros &= le32(buf + 128 + 4 * t) == 0;
			ok(rc == 0 && le32(buf + 12) == 0 && zeros &&
			   kvq_blockrec_check(a.L, buf, len, &info, err, sizeof err) == 0 && !info.has_tokens,
			   "packed without tokens: no flag, zeros, and it checks: %d \"%s\"", rc, err);
			put_le(buf + 12, 8, 4);
			put_le(buf + 24, 0, 8);
			put_le(buf + 24, sum_record(buf, len), 8);
			refused(a.L, buf, len, -EBADMSG, "flag 8 alone, resealed");
		}
		{
			/* unsummed: the host tier's records, which never leave kvqd */
			struct kvq_blockrec_info info;
			uint8_t *want = malloc(len);
			int rs, same = 1;

			if (!want)
				abort();
			rc = kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, blk.key, NULL,
					       blk.tokens, 1, want, len, err, sizeof err);
			rc |= kvq_blockrec_pack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 0 }, blk.key, NULL,
						blk.tokens, 0, buf, len, err, sizeof err);
			put_le(want + 12, 2 | 4, 4);
			put_le(want + 24, 0, 8);
			ok(rc == 0 && memcmp(buf, want, len) == 0,
			   "packed unsummed: the summed record with flag 4 and a zero checksum, else byte for byte");
			rs = kvq_blockrec_check(a.L, buf, len, &info, err, sizeof err);
			ok(rs == 0 && !info.summed, "it checks, and says it is unsummed: %d \"%s\"", rs, err);
			rs = kvq_blockrec_unpack(a.L, a.base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 1 }, buf, len, NULL,
						 err, sizeof err);
			for (uint32_t l = 0; l < a.L->layers; l++)
				same &= memcmp(a.base + slice_off(a.L, KVQ_BLOCK_SEALED, 1, l),
					       a.base + slice_off(a.L, KVQ_BLOCK_SEALED, 0, l),
					       slice_len(a.L, KVQ_BLOCK_SEALED, l)) == 0;
			ok(rs == 0 && same, "and unpacks into another slot, its slices as the first's: %d", rs);
			put_le(buf + 24, 1, 8);
			refused(a.L, buf, len, -EBADMSG, "an unsummed record with a checksum");
			free(want);
		}
		free(buf);
	}

	free(rec);
	pool_free(&a);
	pool_free(&fmt);
	pool_free(&heads);
	pool_free(&act);
	pool_free(&rot);
}

/* Short buffers that end at an unmapped page: the check reads none of it. */
static void no_overread(void)
{
	long page = sysconf(_SC_PAGESIZE);
	struct pool a;
	struct block blk;
	uint8_t *rec, *map;
	size_t len, span;
	char err[256];
	int rc1, rc2, rc3;

	pool_new(&a, "int8", 1, 1, 32, 16, 1, 0, KVQ_DT_F16);
	block_random(&blk);
	rec = pack(&a, KVQ_BLOCK_SEALED, 0, &blk, 0, &len);
	span = (len + (size_t)page - 1) / (size_t)page * (size_t)page;
	map = mmap(NULL, span + (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED || mprotect(map + span, (size_t)page, PROT_NONE) != 0)
		abort();
	/* the first len - 1 bytes, then the guard page */
	memcpy(map + span - (len - 1), rec, len - 1);
	rc1 = kvq_blockrec_check(a.L, map + span - (len - 1), len - 1, NULL, err, sizeof err);
	memcpy(map + span - 100, rec, 100);
	rc2 = kvq_blockrec_check(a.L, map + span - 100, 100, NULL, err, sizeof err);
	memcpy(map + span - len, rec, len);
	rc3 = kvq_blockrec_check(a.L, map + span - len, len, NULL, err, sizeof err);
	ok(rc1 == -EMSGSIZE && rc2 == -ENOMSG && rc3 == 0,
	   "records cut short before a guard page refused without reading it (%d, %d), a whole one taken (%d)", rc1,
	   rc2, rc3);
	munmap(map, span + (size_t)page);
	free(rec);
	pool_free(&a);
}

int main(void)
{
	tap_seed();
	xxh64_vectors();
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		round_trip(&shapes[i], KVQ_BLOCK_SEALED);
		if (shapes[i].n_sink)
			round_trip(&shapes[i], KVQ_BLOCK_SINK);
	}
	other_counts();
	refusals();
	no_overread();
	return done_testing();
}
