/* SPDX-License-Identifier: Apache-2.0 */
/* The packed block record (blockrec.h, which documents its bytes). */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "blockrec.h"
#include "seterr.h"

/* Header fields' offsets (blockrec.h). */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 8,
	OFF_FLAGS = 12,
	OFF_LENGTH = 16,
	OFF_CHECKSUM = 24,
	OFF_CLASS = 32,
	OFF_LAYERS = 36,
	OFF_HEADS = 40,
	OFF_DIM = 44,
	OFF_TOKENS_B = 48,
	OFF_LAYOUT_VERSION = 52,
	OFF_FINGERPRINT = 56,
	OFF_KEY = 64,
	OFF_PARENT = 96,
};
_Static_assert(OFF_PARENT + KVQ_BLOCKREC_KEY_LEN == KVQ_BLOCKREC_HEADER, "the header's fields fill it");
_Static_assert(sizeof(KVQ_BLOCKREC_MAGIC) - 1 == OFF_VERSION, "an 8-byte magic");

/* FNV-1a 64 (offset basis and prime of the FNV specification): the
 * fingerprint's digest, over a few hundred bytes. */
#define FNV_BASIS 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * FNV_PRIME;
	return h;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static uint64_t fnv_u32(uint64_t h, uint32_t v)
{
	uint8_t b[4];

	put32(b, v);
	return fnv1a(h, b, sizeof b);
}

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
	uint8_t b[8];

	put64(b, v);
	return fnv1a(h, b, sizeof b);
}

uint64_t kvq_blockrec_fingerprint(const struct kvq_layout *L)
{
	uint64_t h = FNV_BASIS;

	h = fnv_u32(h, L->version);
	h = fnv_u32(h, L->layers);
	h = fnv_u32(h, L->kv_heads);
	h = fnv_u32(h, L->head_dim);
	h = fnv_u32(h, L->block_tokens);
	h = fnv_u32(h, (uint32_t)L->act);
	for (uint32_t l = 0; l < L->layers; l++) {
		const struct kvq_layer_layout *ll = &L->layer[l];

		h = fnv_u32(h, (uint32_t)ll->kfmt);
		h = fnv_u32(h, (uint32_t)ll->vfmt);
		h = fnv_u32(h, ll->rot);
		h = fnv_u64(h, ll->sealed_slice);
		h = fnv_u64(h, ll->open_slice);
		for (int f = 0; f < KVQ_NFIELDS; f++) {
			h = fnv_u32(h, ll->off[f]);
			h = fnv_u32(h, ll->size[f]);
		}
	}
	return h;
}

static uint64_t tokens_bytes(const struct kvq_layout *L)
{
	return (uint64_t)L->block_tokens * 4u;
}

uint64_t kvq_blockrec_size(const struct kvq_layout *L, uint32_t cls)
{
	if (cls >= KVQ_BLOCK_NCLASS)
		return 0;
	return KVQ_BLOCKREC_HEADER + tokens_bytes(L) + kvq_layout_block_bytes(L, cls);
}

/* XXH64 (the xxHash specification, seed 0): a few GB/s in plain C, where
 * FNV-1a's byte-serial chain would cost a block's copy many times over. */
#define XXH_P1 0x9e3779b185ebca87ull
#define XXH_P2 0xc2b2ae3d27d4eb4full
#define XXH_P3 0x165667b19e3779f9ull
#define XXH_P4 0x85ebca77c2b2ae63ull
#define XXH_P5 0x27d4eb2f165667c5ull

static uint64_t rotl(uint64_t x, int r)
{
	return x << r | x >> (64 - r);
}

static uint64_t xxh_round(uint64_t acc, uint64_t lane)
{
	return rotl(acc + lane * XXH_P2, 31) * XXH_P1;
}

static uint64_t xxh_merge(uint64_t acc, uint64_t v)
{
	return (acc ^ xxh_round(0, v)) * XXH_P1 + XXH_P4;
}

/* A little-endian u64 from any address: one load where the host is
 * little-endian (the compiler sees through the memcpy). */
static uint64_t load64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof v);
	return le64toh(v);
}

/* XXH64 over a record as it is written or read, stripe by stripe, so that
 * each slice is hashed while it is still in cache: the first 32-byte
 * stripe (which holds the checksum field, taken as zeros) at begin, then
 * every whole stripe below upto, then the tail at the end. */
struct xxh {
	uint64_t v0, v1, v2, v3;
	uint64_t at;                   /* bytes hashed, a multiple of 32 */
};

static void xxh_begin(struct xxh *x, const uint8_t *rec)
{
	uint8_t first[32];

	memcpy(first, rec, sizeof first);
	memset(first + OFF_CHECKSUM, 0, 8);
	x->v0 = xxh_round(XXH_P1 + XXH_P2, load64(first));
	x->v1 = xxh_round(XXH_P2, load64(first + 8));
	x->v2 = xxh_round(0, load64(first + 16));
	x->v3 = xxh_round(0 - XXH_P1, load64(first + 24));
	x->at = 32;
}

static void xxh_stripes(struct xxh *x, const uint8_t *rec, uint64_t upto)
{
	/* four independent lanes in registers: the loop runs at memory speed */
	uint64_t v0 = x->v0, v1 = x->v1, v2 = x->v2, v3 = x->v3, i = x->at;

	for (; i + 32 <= upto; i += 32) {
		v0 = xxh_round(v0, load64(rec + i));
		v1 = xxh_round(v1, load64(rec + i + 8));
		v2 = xxh_round(v2, load64(rec + i + 16));
		v3 = xxh_round(v3, load64(rec + i + 24));
	}
	x->v0 = v0, x->v1 = v1, x->v2 = v2, x->v3 = v3;
	x->at = i;
}

static uint64_t xxh_final(struct xxh *x, const uint8_t *p, uint64_t length)
{
	uint64_t acc, i;

	xxh_stripes(x, p, length);
	i = x->at;
	acc = rotl(x->v0, 1) + rotl(x->v1, 7) + rotl(x->v2, 12) + rotl(x->v3, 18);
	acc = xxh_merge(acc, x->v0);
	acc = xxh_merge(acc, x->v1);
	acc = xxh_merge(acc, x->v2);
	acc = xxh_merge(acc, x->v3);
	acc += length;
	for (; i + 8 <= length; i += 8)
		acc = rotl(acc ^ xxh_round(0, load64(p + i)), 27) * XXH_P1 + XXH_P4;
	if (i + 4 <= length) {
		acc = rotl(acc ^ (uint64_t)get32(p + i) * XXH_P1, 23) * XXH_P2 + XXH_P3;
		i += 4;
	}
	for (; i < length; i++)
		acc = rotl(acc ^ (uint64_t)p[i] * XXH_P5, 11) * XXH_P1;
	acc = (acc ^ acc >> 33) * XXH_P2;
	acc = (acc ^ acc >> 29) * XXH_P3;
	return acc ^ acc >> 32;
}

/* XXH64 of a record of length bytes (more than 32) with its checksum field
 * as zeros. */
static uint64_t checksum(const uint8_t *rec, uint64_t length)
{
	struct xxh x;

	xxh_begin(&x, rec);
	return xxh_final(&x, rec, length);
}

/* The header and tokens of a record of class cls (checksum field zero). */
static void put_header(const struct kvq_layout *L, uint32_t cls, const uint8_t *key, const uint8_t *parent,
		       const uint32_t *tokens, int sum, uint8_t *p)
{
	uint64_t at = KVQ_BLOCKREC_HEADER;

	memcpy(p + OFF_MAGIC, KVQ_BLOCKREC_MAGIC, OFF_VERSION);
	put32(p + OFF_VERSION, KVQ_BLOCKREC_VERSION);
	put32(p + OFF_FLAGS, (parent ? KVQ_BLOCKREC_PARENT : 0) | (tokens ? KVQ_BLOCKREC_TOKENS : 0) |
			     (sum ? 0 : KVQ_BLOCKREC_UNSUMMED));
	put64(p + OFF_LENGTH, kvq_blockrec_size(L, cls));
	put64(p + OFF_CHECKSUM, 0);
	put32(p + OFF_CLASS, cls);
	put32(p + OFF_LAYERS, L->layers);
	put32(p + OFF_HEADS, L->kv_heads);
	put32(p + OFF_DIM, L->head_dim);
	put32(p + OFF_TOKENS_B, L->block_tokens);
	put32(p + OFF_LAYOUT_VERSION, L->version);
	put64(p + OFF_FINGERPRINT, kvq_blockrec_fingerprint(L));
	memcpy(p + OFF_KEY, key, KVQ_BLOCKREC_KEY_LEN);
	if (parent)
		memcpy(p + OFF_PARENT, parent, KVQ_BLOCKREC_KEY_LEN);
	else
		memset(p + OFF_PARENT, 0, KVQ_BLOCKREC_KEY_LEN);
	for (uint32_t t = 0; t < L->block_tokens; t++, at += 4)
		put32(p + at, tokens ? tokens[t] : 0);
}

uint64_t kvq_blockrec_slice_at(const struct kvq_layout *L, uint32_t cls, uint32_t layer)
{
	uint64_t at = KVQ_BLOCKREC_HEADER + tokens_bytes(L);

	for (uint32_t l = 0; l < layer; l++)
		at += kvq_layout_slice_bytes(L, cls, l);
	return at;
}

int kvq_blockrec_seal(const struct kvq_layout *L, uint32_t cls, const uint8_t key[KVQ_BLOCKREC_KEY_LEN],
		      const uint8_t *parent, const uint32_t *tokens, int sum, void *buf, size_t len)
{
	uint64_t size = kvq_blockrec_size(L, cls);

	if (!L || !key || !buf || size == 0 || len < size)
		return -EINVAL;
	put_header(L, cls, key, parent, tokens, sum, buf);
	if (sum)
		put64((uint8_t *)buf + OFF_CHECKSUM, checksum(buf, size));
	return 0;
}

int kvq_blockrec_pack(const struct kvq_layout *L, const void *base, struct kvq_block_ref r,
		      const uint8_t key[KVQ_BLOCKREC_KEY_LEN], const uint8_t *parent, const uint32_t *tokens, int sum,
		      void *buf, size_t len, char *err, size_t errlen)
{
	uint8_t *p = buf;
	uint64_t size, at;
	struct xxh x;
	uint32_t id;

	if (!L || !base || !key || !buf) {
		kvq_seterr(err, errlen, "block record: a NULL argument");
		return -EINVAL;
	}
	if (kvq_layout_block_id(L, r, &id) != 0) {
		kvq_seterr(err, errlen, "block record: no %s block %" PRIu32 " in the pool", kvq_block_class_name(r.cls),
			   r.index);
		return -ERANGE;
	}
	size = kvq_blockrec_size(L, r.cls);
	if (len < size) {
		kvq_seterr(err, errlen, "block record: %zu bytes of room, a %s block needs %" PRIu64, len,
			   kvq_block_class_name(r.cls), size);
		return -ENOSPC;
	}

	put_header(L, r.cls, key, parent, tokens, sum, p);
	at = KVQ_BLOCKREC_HEADER + tokens_bytes(L);
	xxh_begin(&x, p);
	for (uint32_t l = 0; l < L->layers; l++) {
		uint64_t n = kvq_layout_slice_bytes(L, r.cls, l);

		memcpy(p + at, (const uint8_t *)base + kvq_layout_slice_off(L, r, l), n);
		at += n;
		if (sum)
			xxh_stripes(&x, p, at);
	}
	if (sum)
		put64(p + OFF_CHECKSUM, xxh_final(&x, p, size));
	return 0;
}

/* Refusals of kvq_blockrec_check before the checksum: the cheap ones. */
static int check_header(const struct kvq_layout *L, const uint8_t *p, size_t len, char *err, size_t errlen)
{
	uint64_t length, fp;
	uint32_t version;

	if (len < KVQ_BLOCKREC_HEADER || memcmp(p + OFF_MAGIC, KVQ_BLOCKREC_MAGIC, OFF_VERSION) != 0) {
		kvq_seterr(err, errlen, "not a block record (%s)", len < KVQ_BLOCKREC_HEADER ? "shorter than its header" :
			   "no magic");
		return -ENOMSG;
	}
	version = get32(p + OFF_VERSION);
	if (version != KVQ_BLOCKREC_VERSION) {
		kvq_seterr(err, errlen, "block record version %" PRIu32 ", this build reads %u", version,
			   KVQ_BLOCKREC_VERSION);
		return -EPROTONOSUPPORT;
	}
	length = get64(p + OFF_LENGTH);
	if (length != len) {
		kvq_seterr(err, errlen, "block record of %" PRIu64 " bytes in %zu (%s)", length, len,
			   length > len ? "truncated" : "trailing bytes");
		return -EMSGSIZE;
	}
	fp = get64(p + OFF_FINGERPRINT);
	if (fp != kvq_blockrec_fingerprint(L)) {
		uint32_t g[5] = { get32(p + OFF_LAYOUT_VERSION), get32(p + OFF_LAYERS), get32(p + OFF_HEADS),
				  get32(p + OFF_DIM), get32(p + OFF_TOKENS_B) };
		int same = g[0] == L->version && g[1] == L->layers && g[2] == L->kv_heads && g[3] == L->head_dim &&
			   g[4] == L->block_tokens;

		kvq_seterr(err, errlen,
			   "block record of another layout (layout version %" PRIu32 ", %" PRIu32 " layers, %" PRIu32
			   " heads, head dim %" PRIu32 ", B %" PRIu32 "%s; the pool's: %" PRIu32 ", %" PRIu32 ", %" PRIu32
			   ", %" PRIu32 ", %" PRIu32 ")",
			   g[0], g[1], g[2], g[3], g[4], same ? ", other formats or window dtype" : "", L->version, L->layers,
			   L->kv_heads, L->head_dim, L->block_tokens);
		return -EMEDIUMTYPE;
	}
	return 0;
}

/* The header of a checked record into *ret. */
static void decode(const struct kvq_layout *L, const uint8_t *p, struct kvq_blockrec_info *ret)
{
	ret->cls = get32(p + OFF_CLASS);
	ret->has_parent = !!(get32(p + OFF_FLAGS) & KVQ_BLOCKREC_PARENT);
	ret->has_tokens = !!(get32(p + OFF_FLAGS) & KVQ_BLOCKREC_TOKENS);
	ret->summed = !(get32(p + OFF_FLAGS) & KVQ_BLOCKREC_UNSUMMED);
	memcpy(ret->key, p + OFF_KEY, KVQ_BLOCKREC_KEY_LEN);
	memcpy(ret->parent, p + OFF_PARENT, KVQ_BLOCKREC_KEY_LEN);
	ret->n_tokens = L->block_tokens;
	for (uint32_t t = 0; t < L->block_tokens; t++)
		ret->tokens[t] = get32(p + KVQ_BLOCKREC_HEADER + 4u * t);
}

/* Every check but the checksum's (kvq_blockrec_check's order otherwise). */
static int check_fields(const struct kvq_layout *L, const uint8_t *p, size_t len, char *err, size_t errlen)
{
	uint32_t flags, cls;
	int rc = check_header(L, p, len, err, errlen);

	if (rc != 0)
		return rc;
	cls = get32(p + OFF_CLASS);
	if (kvq_blockrec_size(L, cls) != len) {
		kvq_seterr(err, errlen, "block record of %zu bytes for class %" PRIu32 " (%s)", len, cls,
			   kvq_block_class_name(cls));
		return -EBADMSG;
	}
	flags = get32(p + OFF_FLAGS);
	if (flags & ~(KVQ_BLOCKREC_PARENT | KVQ_BLOCKREC_TOKENS | KVQ_BLOCKREC_UNSUMMED)) {
		kvq_seterr(err, errlen, "block record: unknown flags %#" PRIx32,
			   flags & ~(KVQ_BLOCKREC_PARENT | KVQ_BLOCKREC_TOKENS | KVQ_BLOCKREC_UNSUMMED));
		return -EBADMSG;
	}
	if ((flags & KVQ_BLOCKREC_UNSUMMED) && get64(p + OFF_CHECKSUM) != 0) {
		kvq_seterr(err, errlen, "block record: a checksum in an unsummed record");
		return -EBADMSG;
	}
	if (!(flags & KVQ_BLOCKREC_PARENT)) {
		static const uint8_t none[KVQ_BLOCKREC_KEY_LEN];

		if (memcmp(p + OFF_PARENT, none, sizeof none) != 0) {
			kvq_seterr(err, errlen, "block record: a parent key without the parent flag");
			return -EBADMSG;
		}
	}
	return 0;
}

static int summed(const uint8_t *p)
{
	return !(get32(p + OFF_FLAGS) & KVQ_BLOCKREC_UNSUMMED);
}

static int bad_checksum(char *err, size_t errlen)
{
	kvq_seterr(err, errlen, "block record: checksum mismatch (its bytes changed)");
	return -EBADMSG;
}

int kvq_blockrec_check(const struct kvq_layout *L, const void *buf, size_t len, struct kvq_blockrec_info *ret,
		       char *err, size_t errlen)
{
	const uint8_t *p = buf;
	int rc;

	if (!L || !buf) {
		kvq_seterr(err, errlen, "block record: a NULL argument");
		return -EINVAL;
	}
	rc = check_fields(L, p, len, err, errlen);
	if (rc != 0)
		return rc;
	if (summed(p) && checksum(p, len) != get64(p + OFF_CHECKSUM))
		return bad_checksum(err, errlen);
	if (ret)
		decode(L, p, ret);
	return 0;
}

int kvq_blockrec_unpack(const struct kvq_layout *L, void *base, struct kvq_block_ref r, const void *buf,
			size_t len, struct kvq_blockrec_info *ret, char *err, size_t errlen)
{
	const uint8_t *p = buf;
	struct xxh x;
	uint64_t at;
	uint32_t id, cls;
	int rc;

	if (!L || !base || !buf) {
		kvq_seterr(err, errlen, "block record: a NULL argument");
		return -EINVAL;
	}
	rc = check_fields(L, p, len, err, errlen);
	if (rc != 0)
		return rc;
	if (kvq_layout_block_id(L, r, &id) != 0) {
		kvq_seterr(err, errlen, "block record: no %s block %" PRIu32 " in the pool", kvq_block_class_name(r.cls),
			   r.index);
		return -ERANGE;
	}
	cls = get32(p + OFF_CLASS);
	if (cls != r.cls) {
		kvq_seterr(err, errlen, "block record of a %s block, the slot is a %s one", kvq_block_class_name(cls),
			   kvq_block_class_name(r.cls));
		return -EINVAL;
	}
	/* each slice hashed as it is copied, while it is in cache: one pass */
	at = KVQ_BLOCKREC_HEADER + tokens_bytes(L);
	xxh_begin(&x, p);
	xxh_stripes(&x, p, at);
	for (uint32_t l = 0; l < L->layers; l++) {
		uint64_t n = kvq_layout_slice_bytes(L, cls, l);

		if (summed(p))
			xxh_stripes(&x, p, at + n);
		memcpy((uint8_t *)base + kvq_layout_slice_off(L, r, l), p + at, n);
		at += n;
	}
	if (summed(p) && xxh_final(&x, p, len) != get64(p + OFF_CHECKSUM))
		return bad_checksum(err, errlen);
	if (ret)
		decode(L, p, ret);
	return 0;
}
