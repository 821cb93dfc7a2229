/* SPDX-License-Identifier: Apache-2.0 */
/* Codebooks a client sends: see codebooks.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <openssl/evp.h>

#include "codebooks.h"
#include "memfd.h"
#include "seterr.h"

int kvq_codebooks_open(int fd, const struct kvq_policy *policy, uint32_t kv_heads, uint32_t head_dim,
		       struct kvq_codebooks *ret, char *err, size_t errlen)
{
	struct kvq_codebooks cb;
	char why[256] = "";
	unsigned int hlen = 0;
	uint64_t size = 0;
	int r;

	memset(&cb, 0, sizeof(cb));
	r = kvq_memfd_check(fd, KVQ_CB_MAX_FILE, &size, why, sizeof(why));
	if (r < 0)
		return kvq_seterr(err, errlen, "codebooks: %s", why), r;
	if (size == 0)
		return kvq_seterr(err, errlen, "codebooks: the memfd is empty"), -EINVAL;
	/* sealed against shrinking: no SIGBUS while mapped; against writing:
	 * what is parsed and hashed is what is copied */
	cb.map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (cb.map == MAP_FAILED) {
		r = -errno;
		kvq_seterr(err, errlen, "codebooks: mmap of %llu bytes: %s", (unsigned long long)size, strerror(-r));
		return r;
	}
	cb.map_len = (size_t)size;
	/* parse's message names the codebook file itself */
	r = kvq_codebook_parse(cb.map, cb.map_len, policy, kv_heads, head_dim, &cb.file, err, errlen);
	if (r < 0)
		goto fail;
	if (!EVP_Digest(cb.file.data, (size_t)cb.file.data_bytes, cb.sha256, &hlen, EVP_sha256(), NULL) ||
	    hlen != sizeof(cb.sha256)) {
		kvq_seterr(err, errlen, "codebooks: SHA-256 failed");
		r = -EIO;
		goto fail;
	}
	*ret = cb;
	return 0;
fail:
	munmap(cb.map, cb.map_len);
	return r;
}

void kvq_codebooks_close(struct kvq_codebooks *cb)
{
	if (cb->map)
		munmap(cb->map, cb->map_len);
	cb->map = NULL;
	cb->map_len = 0;
}

void kvq_codebooks_hex(const uint8_t *h, size_t n, char *buf)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		buf[2 * i] = digits[h[i] >> 4];
		buf[2 * i + 1] = digits[h[i] & 15];
	}
	buf[2 * n] = 0;
}
