/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Codebooks of the product-quantized formats (pq2, pq1: kvq_format.h) and
 * their file, kvq-codebook(5).
 *
 * A codebook format splits a K or V vector of D values into M = D / d
 * subvectors of d values (d is the format's SUBDIM) and stores per subvector
 * the index of one of KVQ_CB_CENTROIDS centroids.  A pool keeps one codebook
 * per (layer, KV head, K or V, subspace) for the layers whose K or V format
 * is a codebook format: 256 centroids of d FP16 values, 256 * D values per
 * (layer, head, K or V) whatever d is.
 *
 * The codebook data, in the file and in the pool's memory alike (the pool's
 * codebook region, layout.h), is FP16 little-endian in this order:
 *   for each layer l (0 ..), for K then V when that format is a codebook
 *   format: [head h][subspace m][centroid c][j < d]
 * so element (l, kv, h, m, c, j) of a present (l, kv) is at
 *   base(l, kv) + ((h * M + m) * 256 + c) * d + j      (in FP16 words)
 * with base(l, kv) the sum of 256 * H * D over the present (l', kv') before it.
 *
 * The file (all integers little-endian; kvq-codebook(5)):
 *   offset 0   magic "KVQCBOOK" (8 bytes)
 *          8   u32 version (KVQ_CB_VERSION)
 *         12   u32 byte-order mark 0x01020304 (reads 0x04030201 on a peer of
 *              the other order)
 *         16   u32 layers, u32 kv_heads, u32 head_dim, u32 centroids (256)
 *         32   u32 transforms (KVQ_CB_ROTATE | KVQ_CB_K_CENTER: what the K/V
 *              were before k-means; the run that uses the file must apply
 *              the same)
 *         36   u32 policy_len (bytes of the canonical policy, <= KVQ_POLICY_MAX_LEN)
 *         40   u64 data_bytes
 *         48   u8 k_subdim[layers], u8 v_subdim[layers] (0: that layer's K or
 *              V is not a codebook format; else its d)
 *              char policy[policy_len] (canonical, not terminated; informative)
 *              zero padding to a multiple of 16 bytes from the file's start
 *              data: data_bytes bytes, the codebook data above
 *   and nothing after the data.
 */
#ifndef KVQ_CODEBOOK_H
#define KVQ_CODEBOOK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_CB_MAGIC "KVQCBOOK"
#define KVQ_CB_VERSION 1u
#define KVQ_CB_BOM 0x01020304u
/* transforms */
#define KVQ_CB_ROTATE 1u
#define KVQ_CB_K_CENTER 2u
/* The largest file kvqd takes (and so the largest codebook data): 1 GiB. */
#define KVQ_CB_MAX_FILE (1ull << 30)

/* The pool size bits per value are quoted at: codebooks amortised over a
 * pool of 1 GiB (kvq-bench formats, kvq-run, bench/QUALITY.md). */
#define KVQ_CB_POOL_BYTES (1ull << 30)

/* Bytes of one sealed block with its share of the codebooks, in a pool of
 * pool_bytes that holds the codebooks and as many blocks as fit in the
 * rest: block * pool / (pool - codebooks).  The block alone when there are
 * no codebooks; infinity when they fill the pool. */
static inline double kvq_codebook_amortised(uint64_t block_bytes, uint64_t codebook_bytes, uint64_t pool_bytes)
{
	if (codebook_bytes >= pool_bytes)
		return codebook_bytes ? (double)INFINITY : (double)block_bytes;
	return (double)block_bytes * (double)pool_bytes / (double)(pool_bytes - codebook_bytes);
}

/* A file's header, parsed. */
struct kvq_cb_file {
	uint32_t layers, kv_heads, head_dim, transforms;
	uint8_t k_subdim[KVQ_MAX_LAYERS], v_subdim[KVQ_MAX_LAYERS];
	char policy[KVQ_POLICY_MAX_LEN + 1];   /* terminated */
	const uint8_t *data;                    /* into the image parsed */
	uint64_t data_bytes;
};

/*
 * Parses and checks a file image of len bytes: magic, byte order, version,
 * header fields in range, sizes that add up to exactly len, and every value
 * finite.  When want is not NULL the file must also fit a pool of that policy
 * and geometry (layers, kv_heads, head_dim; the codebook formats of every
 * layer's K and V, by subspace dim, and their rotation, "+rot", by the
 * file's policy; transforms are not compared).  Returns 0
 * and *ret (whose data points into img), or -EINVAL with the reason in err.
 */
int kvq_codebook_parse(const void *img, size_t len, const struct kvq_policy *want, uint32_t kv_heads,
		       uint32_t head_dim, struct kvq_cb_file *ret, char *err, size_t errlen);

/*
 * The basis of a file's codebooks against a pool's policy: every codebook
 * part of want (a layer's K or V with pq2/pq1) must be rotated ("+rot")
 * exactly where the file's policy (file_policy, of `layers` layers) rotates
 * it.  0, or -EINVAL with the reason in err (also: a policy that does not
 * parse).  kvq_codebook_parse checks it against want; a client choosing a
 * file that holds more than one pool's codebooks asks it alone.
 */
int kvq_codebook_basis(const char *file_policy, uint32_t layers, const struct kvq_policy *want, char *err,
		       size_t errlen);

/*
 * Writes a file: header from the policy, geometry and transforms, then
 * data_bytes (kvq_codebook_bytes of them) of data.  Returns 0, or a negative
 * errno (-EINVAL: the policy has no codebook format or data_bytes is not its
 * size; an I/O error of write(2)).
 */
int kvq_codebook_write(int fd, const struct kvq_policy *p, uint32_t kv_heads, uint32_t head_dim,
		       uint32_t transforms, const uint16_t *data, uint64_t data_bytes);

/*
 * k-means over n points of dimension d (row-major floats) into k centroids
 * cent[k][d]: k-means++ seeding from a PRNG seeded with seed, then at most
 * iters Lloyd iterations (stopping early when no assignment changes); an
 * empty cluster is re-seeded with the point farthest from its centroid
 * among those not alone in their cluster (none such: it stays empty).
 * Distances are squared Euclidean, ties go to the lower centroid index (as
 * kvq_pq_encode's).  loss, when not NULL, gets iters + 1 entries: the mean
 * squared distance after seeding and after each iteration (entries past an
 * early stop repeat the last).  n < k is allowed (the surplus centroids
 * repeat points).  Returns the iterations run, or -EINVAL / -ENOMEM.
 */
int kvq_kmeans(const float *x, size_t n, unsigned d, unsigned k, unsigned iters, uint64_t seed, float *cent,
	       double *loss);

#ifdef __cplusplus
}
#endif

#endif
