/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's codebooks (kernels/codebook.h) as a client sends them with an
 * Attach or a PoolAdd (kvq.proto, "File descriptors"): the request's
 * descriptor checked (a sealed memfd within KVQ_CB_MAX_FILE, proto/memfd.h),
 * mapped read-only for the request, parsed against a pool's policy and
 * geometry, and its data hashed: SHA-256 of the data part, as it will lie
 * in the pool's codebook region, is what the pool is known by
 * (codebooks_sha256).  What the pool does with them is daemon/pools.h's.
 *
 * Functions return 0 or a negative code with a one-line reason in err.
 */
#ifndef KVQD_CODEBOOKS_H
#define KVQD_CODEBOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "codebook.h"
#include "frame.h"
#include "policy.h"

struct kvq_codebooks {
	void *map;                      /* the file, read-only; NULL: none */
	size_t map_len;
	struct kvq_cb_file file;        /* its data points into map */
	uint8_t sha256[KVQ_PROTO_SHA256];
};

/* Room for a hash in hex, or its first bytes in messages. */
#define KVQ_CODEBOOKS_HEX (2 * KVQ_PROTO_SHA256 + 1)
#define KVQ_CODEBOOKS_SHORT 8u          /* bytes of a hash shown in messages */

/*
 * Checks, maps and parses the descriptor fd (not taken) for a pool of
 * policy at kv_heads, head_dim.  Returns 0 and *ret (kvq_codebooks_close;
 * untouched on failure), -EINVAL (not a sealed memfd, a file that does not
 * parse or fit: err says why), -E2BIG (over KVQ_CB_MAX_FILE), or mmap's
 * error.
 */
int kvq_codebooks_open(int fd, const struct kvq_policy *policy, uint32_t kv_heads, uint32_t head_dim,
		       struct kvq_codebooks *ret, char *err, size_t errlen);

/* Unmaps; an empty (zeroed) or closed one is fine. */
void kvq_codebooks_close(struct kvq_codebooks *cb);

/* The first n bytes of hash h in lowercase hex into buf (2n + 1 bytes). */
void kvq_codebooks_hex(const uint8_t *h, size_t n, char *buf);

#endif
