/* SPDX-License-Identifier: Apache-2.0 */
/* The codebook file of the product-quantized formats, kvq-codebook(5)
 * (codebook.h). */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "codebook.h"
#include "seterr.h"

/* ------------------------------------------------------------------ the file */

#define HDR_FIXED 48u        /* magic .. data_bytes; the subspace dims follow */
#define BOM_REVERSED 0x04030201u

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t align16(uint64_t x)
{
	return (x + 15u) & ~(uint64_t)15u;
}

/* 1 if d is the subspace dim of a codebook format of the table. */
static int is_subdim(unsigned d)
{
	for (int f = 0; f < KVQ_FMT_COUNT; f++)
		if (kvq_fmt_param_kind(f, 0) == KVQ_PARAM_CODEBOOK && kvq_fmt_subdim(f) == d)
			return 1;
	return 0;
}

/* Header fields after the magic: geometry, subspace dims and sizes.  *ret_hdr
 * gets the bytes before the padding, *ret_total the file's size they imply. */
static int check_header(const uint8_t *b, size_t len, uint64_t *ret_hdr, uint64_t *ret_total, char *err,
			size_t errlen)
{
	uint32_t version = get32(b + 8), bom = get32(b + 12);
	uint32_t layers = get32(b + 16), H = get32(b + 20), D = get32(b + 24), cents = get32(b + 28);
	uint32_t transforms = get32(b + 32), plen = get32(b + 36);
	uint64_t data_bytes = get64(b + 40), hdr, want = 0, total;
	int any = 0;

	if (bom == BOM_REVERSED) {
		kvq_seterr(err, errlen, "codebook file: written in the other byte order (mark 0x%08x)", bom);
		return -EINVAL;
	}
	if (version != KVQ_CB_VERSION) {
		kvq_seterr(err, errlen, "codebook file: version %u, not %u", version, KVQ_CB_VERSION);
		return -EINVAL;
	}
	if (bom != KVQ_CB_BOM) {
		kvq_seterr(err, errlen, "codebook file: bad byte order mark 0x%08x", bom);
		return -EINVAL;
	}
	if (layers == 0 || layers > KVQ_MAX_LAYERS) {
		kvq_seterr(err, errlen, "codebook file: layers %u out of range 1-%u", layers, KVQ_MAX_LAYERS);
		return -EINVAL;
	}
	if (H == 0 || H > KVQ_MAX_HEADS) {
		kvq_seterr(err, errlen, "codebook file: kv heads %u out of range 1-%u", H, KVQ_MAX_HEADS);
		return -EINVAL;
	}
	if (D < 32 || D > KVQ_MAX_HEAD_DIM || D % 32) {
		kvq_seterr(err, errlen, "codebook file: head dim %u is not a multiple of 32 in 32-%u", D,
			   KVQ_MAX_HEAD_DIM);
		return -EINVAL;
	}
	if (cents != KVQ_CB_CENTROIDS) {
		kvq_seterr(err, errlen, "codebook file: %u centroids, not %u", cents, KVQ_CB_CENTROIDS);
		return -EINVAL;
	}
	if (transforms & ~(KVQ_CB_ROTATE | KVQ_CB_K_CENTER)) {
		kvq_seterr(err, errlen, "codebook file: unknown transforms 0x%x", transforms);
		return -EINVAL;
	}
	if (plen > KVQ_POLICY_MAX_LEN) {
		kvq_seterr(err, errlen, "codebook file: policy length %u exceeds %u", plen, KVQ_POLICY_MAX_LEN);
		return -EINVAL;
	}
	hdr = HDR_FIXED + 2ull * layers + plen;
	if (len < hdr) {
		kvq_seterr(err, errlen, "codebook file: truncated: %zu bytes, the header alone is %llu", len,
			   (unsigned long long)hdr);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < 2 * layers; i++) {
		unsigned d = b[HDR_FIXED + i];
		uint32_t l = i % layers;
		const char *kv = i < layers ? "K" : "V";

		if (d == 0)
			continue;
		if (!is_subdim(d)) {
			kvq_seterr(err, errlen, "codebook file: layer %u %s: subspace dim %u is no codebook format's",
				   l, kv, d);
			return -EINVAL;
		}
		if (D % d) {
			kvq_seterr(err, errlen, "codebook file: layer %u %s: subspace dim %u does not divide head dim %u",
				   l, kv, d, D);
			return -EINVAL;
		}
		any = 1;
		want += kvq_codebook_part(H, D);
	}
	if (!any) {
		kvq_seterr(err, errlen, "codebook file: no layer has codebooks (every subspace dim is 0)");
		return -EINVAL;
	}
	if (data_bytes != want) {
		kvq_seterr(err, errlen, "codebook file: data_bytes %llu, the subspace dims imply %llu",
			   (unsigned long long)data_bytes, (unsigned long long)want);
		return -EINVAL;
	}
	/* hdr < 2^14 and want < 2^35: no overflow */
	total = align16(hdr) + want;
	if (total > KVQ_CB_MAX_FILE) {
		kvq_seterr(err, errlen, "codebook file: %llu bytes exceed the limit of %llu",
			   (unsigned long long)total, (unsigned long long)KVQ_CB_MAX_FILE);
		return -EINVAL;
	}
	if (len < total) {
		kvq_seterr(err, errlen, "codebook file: truncated: %zu bytes, the header says %llu", len,
			   (unsigned long long)total);
		return -EINVAL;
	}
	if (len > total) {
		kvq_seterr(err, errlen, "codebook file: bytes after the data: %zu bytes, the header says %llu", len,
			   (unsigned long long)total);
		return -EINVAL;
	}
	*ret_hdr = hdr;
	*ret_total = total;
	return 0;
}

/* The file against the pool's policy and geometry. */
static int check_want(const uint8_t *b, const struct kvq_policy *want, uint32_t H, uint32_t D, char *err,
		      size_t errlen)
{
	uint32_t layers = get32(b + 16);

	if (want->n_layers != layers) {
		kvq_seterr(err, errlen, "codebook file: %u layers, the pool has %u", layers, want->n_layers);
		return -EINVAL;
	}
	if (get32(b + 20) != H) {
		kvq_seterr(err, errlen, "codebook file: %u kv heads, the pool has %u", get32(b + 20), H);
		return -EINVAL;
	}
	if (get32(b + 24) != D) {
		kvq_seterr(err, errlen, "codebook file: head dim %u, the pool's is %u", get32(b + 24), D);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < 2 * layers; i++) {
		uint32_t l = i % layers;
		int is_v = i >= layers;
		unsigned file = b[HDR_FIXED + i], pool = kvq_policy_subdim(want, l, is_v);
		int f = is_v ? want->v[l] : want->k[l];
		const char *kv = is_v ? "V" : "K", *name = kvq_fmt_name(f);

		if (file == pool)
			continue;
		if (!pool)
			kvq_seterr(err, errlen, "codebook file: layer %u: the pool's %s is %s, not a codebook format, "
				   "the file has %s codebooks of subspace dim %u", l, kv, name ? name : "unknown",
				   kv, file);
		else if (!file)
			kvq_seterr(err, errlen, "codebook file: layer %u: the pool's %s is %s, the file has no %s "
				   "codebooks", l, kv, name, kv);
		else
			kvq_seterr(err, errlen, "codebook file: layer %u: the pool's %s is %s, subspace dim %u, the "
				   "file's %s codebooks have subspace dim %u", l, kv, name, pool, kv, file);
		return -EINVAL;
	}
	return 0;
}

/* Every FP16 value finite; the first that is not is named by its place. */
static int check_values(const uint8_t *b, uint64_t off, char *err, size_t errlen)
{
	uint32_t layers = get32(b + 16), H = get32(b + 20), D = get32(b + 24);

	for (uint32_t i = 0; i < 2 * layers; i++) {
		uint32_t l = i >> 1;
		int is_v = i & 1;
		unsigned d = b[HDR_FIXED + (is_v ? layers : 0) + l];
		uint64_t words = (uint64_t)KVQ_CB_CENTROIDS * H * D;

		if (!d)
			continue;
		for (uint64_t w = 0; w < words; w++) {
			/* exponent all ones: an infinity or a NaN */
			if ((b[off + 2 * w + 1] & 0x7cu) == 0x7cu) {
				uint64_t sub = w / d / KVQ_CB_CENTROIDS;   /* h * M + m */
				uint32_t M = D / d;

				kvq_seterr(err, errlen, "codebook file: layer %u %s head %u subspace %u centroid %u: %s",
					   l, is_v ? "V" : "K", (uint32_t)(sub / M), (uint32_t)(sub % M),
					   (uint32_t)(w / d % KVQ_CB_CENTROIDS),
					   b[off + 2 * w] || (b[off + 2 * w + 1] & 0x03u) ? "not a number" : "infinite");
				return -EINVAL;
			}
		}
		off += 2 * words;
	}
	return 0;
}

int kvq_codebook_basis(const char *file_policy, uint32_t layers, const struct kvq_policy *want, char *err,
		       size_t errlen)
{
	struct kvq_policy fp;

	if (kvq_policy_parse(file_policy, layers, &fp, NULL, 0) < 0) {
		kvq_seterr(err, errlen, "codebook file: its policy '%.64s' does not parse", file_policy);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < 2 * layers && i < 2 * want->n_layers; i++) {
		uint32_t l = i % layers, bit = i >= layers ? KVQ_ROT_V : KVQ_ROT_K;
		if (kvq_policy_subdim(want, l, i >= layers) && ((fp.rot[l] ^ want->rot[l]) & bit)) {
			kvq_seterr(err, errlen, "codebook file: layer %u: the pool's %s is %srotated (+rot), the "
				   "file's codebooks were calibrated %s", l, bit == KVQ_ROT_V ? "V" : "K",
				   want->rot[l] & bit ? "" : "not ", fp.rot[l] & bit ? "rotated" : "unrotated");
			return -EINVAL;
		}
	}
	return 0;
}

int kvq_codebook_parse(const void *img, size_t len, const struct kvq_policy *want, uint32_t kv_heads,
		       uint32_t head_dim, struct kvq_cb_file *ret, char *err, size_t errlen)
{
	const uint8_t *b = img;
	uint64_t hdr, total;
	uint32_t layers, plen;
	int r;

	if (!img && len) {
		kvq_seterr(err, errlen, "codebook file: no image");
		return -EINVAL;
	}
	if (len < HDR_FIXED) {
		kvq_seterr(err, errlen, "codebook file: truncated: %zu bytes, the header alone is at least %u", len,
			   HDR_FIXED);
		return -EINVAL;
	}
	if (memcmp(b, KVQ_CB_MAGIC, 8) != 0) {
		kvq_seterr(err, errlen, "codebook file: bad magic (not a kvq-codebook(5) file)");
		return -EINVAL;
	}
	r = check_header(b, len, &hdr, &total, err, errlen);
	if (r < 0)
		return r;
	layers = get32(b + 16);
	plen = get32(b + 36);
	for (uint32_t i = 0; i < plen; i++) {
		uint8_t c = b[HDR_FIXED + 2 * layers + i];

		if (c < 0x20 || c > 0x7e) {
			kvq_seterr(err, errlen, "codebook file: policy byte %u is 0x%02x, not printable ASCII", i, c);
			return -EINVAL;
		}
	}
	if (want) {
		char pol[KVQ_POLICY_MAX_LEN + 1];
		memcpy(pol, b + HDR_FIXED + 2 * layers, plen);
		pol[plen] = '\0';
		r = kvq_codebook_basis(pol, layers, want, err, errlen);
		if (r < 0)
			return r;
	}
	for (uint64_t o = hdr; o < align16(hdr); o++)
		if (b[o]) {
			kvq_seterr(err, errlen, "codebook file: padding byte at offset %llu is not zero",
				   (unsigned long long)o);
			return -EINVAL;
		}
	if (want) {
		r = check_want(b, want, kv_heads, head_dim, err, errlen);
		if (r < 0)
			return r;
	}
	r = check_values(b, align16(hdr), err, errlen);
	if (r < 0)
		return r;

	ret->layers = layers;
	ret->kv_heads = get32(b + 20);
	ret->head_dim = get32(b + 24);
	ret->transforms = get32(b + 32);
	memset(ret->k_subdim, 0, sizeof ret->k_subdim);
	memset(ret->v_subdim, 0, sizeof ret->v_subdim);
	memcpy(ret->k_subdim, b + HDR_FIXED, layers);
	memcpy(ret->v_subdim, b + HDR_FIXED + layers, layers);
	memcpy(ret->policy, b + HDR_FIXED + 2 * layers, plen);
	ret->policy[plen] = '\0';
	ret->data = b + align16(hdr);
	ret->data_bytes = total - align16(hdr);
	return 0;
}

/* write(2) all of buf: short writes continue, EINTR retries. */
static int write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int kvq_codebook_write(int fd, const struct kvq_policy *p, uint32_t kv_heads, uint32_t head_dim,
		       uint32_t transforms, const uint16_t *data, uint64_t data_bytes)
{
	/* the largest header: 48 + 2 * 256 + 8192, padded */
	uint8_t hdr[HDR_FIXED + 2 * KVQ_MAX_LAYERS + KVQ_POLICY_MAX_LEN + 16];
	char pol[KVQ_POLICY_MAX_LEN + 1];
	uint8_t chunk[8192];
	uint64_t n, done = 0;
	uint32_t layers;
	int plen, r;

	if (!p || !data || p->n_layers == 0 || p->n_layers > KVQ_MAX_LAYERS || kv_heads == 0 ||
	    kv_heads > KVQ_MAX_HEADS || head_dim < 32 || head_dim > KVQ_MAX_HEAD_DIM || head_dim % 32 ||
	    (transforms & ~(KVQ_CB_ROTATE | KVQ_CB_K_CENTER)))
		return -EINVAL;
	n = kvq_codebook_bytes(p, kv_heads, head_dim);
	if (n == 0 || data_bytes != n)
		return -EINVAL;
	plen = kvq_policy_format(p, pol, sizeof pol);
	if (plen < 0)
		return -EINVAL;
	layers = p->n_layers;
	for (uint32_t l = 0; l < layers; l++)
		if (head_dim % kvq_fmt_subdim(p->k[l]) || head_dim % kvq_fmt_subdim(p->v[l]))
			return -EINVAL;

	memset(hdr, 0, sizeof hdr);
	memcpy(hdr, KVQ_CB_MAGIC, 8);
	put32(hdr + 8, KVQ_CB_VERSION);
	put32(hdr + 12, KVQ_CB_BOM);
	put32(hdr + 16, layers);
	put32(hdr + 20, kv_heads);
	put32(hdr + 24, head_dim);
	put32(hdr + 28, KVQ_CB_CENTROIDS);
	put32(hdr + 32, transforms);
	put32(hdr + 36, (uint32_t)plen);
	put64(hdr + 40, data_bytes);
	for (uint32_t l = 0; l < layers; l++) {
		hdr[HDR_FIXED + l] = (uint8_t)kvq_policy_subdim(p, l, 0);
		hdr[HDR_FIXED + layers + l] = (uint8_t)kvq_policy_subdim(p, l, 1);
	}
	memcpy(hdr + HDR_FIXED + 2 * layers, pol, (size_t)plen);
	r = write_all(fd, hdr, (size_t)align16(HDR_FIXED + 2ull * layers + (uint64_t)plen));
	/* the data little-endian whatever the host's order */
	while (r == 0 && done < data_bytes) {
		size_t c = data_bytes - done < sizeof chunk ? (size_t)(data_bytes - done) : sizeof chunk;

		for (size_t i = 0; i < c / 2; i++) {
			uint16_t v = data[done / 2 + i];

			chunk[2 * i] = (uint8_t)v;
			chunk[2 * i + 1] = (uint8_t)(v >> 8);
		}
		r = write_all(fd, chunk, c);
		done += c;
	}
	return r;
}
