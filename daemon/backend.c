/* SPDX-License-Identifier: Apache-2.0 */
/* Backend choice and the checks common to both backends. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "blockrec.h"
#include "layout.h"
#include "seterr.h"

const struct kvq_backend *kvq_backend_by_name(const char *name)
{
	if (!name)
		return NULL;
	if (strcmp(name, "host") == 0)
		return &kvq_backend_host;
	if (strcmp(name, "cuda") == 0)
		return &kvq_backend_cuda;
	return NULL;
}

int kvq_backend_pick(const char *name, int device, const struct kvq_backend **ret_backend, char *reason,
		     size_t len)
{
	char why[KVQ_BACKEND_MSG_MAX];
	int r;

	if (!name || (strcmp(name, "auto") != 0 && !kvq_backend_by_name(name))) {
		kvq_seterr(reason, len, "unknown backend '%s' (auto, host or cuda)", name ? name : "(null)");
		return -EINVAL;
	}
	if (strcmp(name, "host") == 0) {
		r = kvq_backend_host.probe(device, why, sizeof why);
		kvq_seterr(reason, len, "host: %s", why);
		if (r < 0)
			return r;
		*ret_backend = &kvq_backend_host;
		return 0;
	}

	r = kvq_backend_cuda.probe(device, why, sizeof why);
	if (r == 0) {
		kvq_seterr(reason, len, "cuda: %s", why);
		*ret_backend = &kvq_backend_cuda;
		return 0;
	}
	if (strcmp(name, "cuda") == 0) {
		/* asked for by name: falling back would put the pool in host
		 * memory where workers expect device memory */
		kvq_seterr(reason, len, "cuda: %s", why);
		return r;
	}
	kvq_seterr(reason, len, "host: %s", why);
	*ret_backend = &kvq_backend_host;
	return 0;
}

int kvq_backend_round(uint64_t size, uint64_t granularity, uint64_t *ret_size)
{
	uint64_t rem;

	if (granularity == 0)
		return -EINVAL;
	rem = size % granularity;
	if (rem == 0) {
		*ret_size = size;
		return 0;
	}
	if (size > UINT64_MAX - (granularity - rem))
		return -EOVERFLOW;
	*ret_size = size + (granularity - rem);
	return 0;
}

int kvq_backend_mem_create(const struct kvq_backend *b, uint64_t size, int device, const char *label,
			   struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	if (!b || !ret_mem) {
		kvq_seterr(err, len, "no backend or no memory object");
		return -EINVAL;
	}
	if (size == 0) {
		kvq_seterr(err, len, "%s: pool size 0", b->name);
		return -EINVAL;
	}
	if (device < 0) {
		kvq_seterr(err, len, "%s: device %d", b->name, device);
		return -EINVAL;
	}
	return b->create(size, device, label ? label : "", ret_mem, err, len);
}

int kvq_backend_mem_adopt(const struct kvq_backend *b, int fd, uint64_t size, int device,
			  struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	if (!b->adopt) {
		close(fd);
		return kvq_seterr(err, len, "%s: memory cannot be taken back", b->name), -EOPNOTSUPP;
	}
	return b->adopt(fd, size, device, ret_mem, err, len);
}

int kvq_backend_mem_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
			  size_t errlen)
{
	if (!mem || !mem->backend) {
		kvq_seterr(err, errlen, "no memory to write to");
		return -EINVAL;
	}
	if (off > mem->size || len > mem->size - off) {
		kvq_seterr(err, errlen, "%s: %zu bytes at %llu are outside the pool's %llu", mem->backend->name, len,
			   (unsigned long long)off, (unsigned long long)mem->size);
		return -EINVAL;
	}
	if (len == 0)
		return 0;
	return mem->backend->write(mem, off, src, len, err, errlen);
}

void kvq_backend_mem_destroy(struct kvq_backend_mem *mem)
{
	if (!mem || !mem->backend)
		return;
	mem->backend->destroy(mem);
	memset(mem, 0, sizeof *mem);
	mem->fd = -1;
}

void kvq_backend_block_runs(const struct kvq_layout *L, struct kvq_block_ref r, uint8_t *rec,
			    struct kvq_backend_run *runs)
{
	for (uint32_t l = 0; l < L->layers; l++)
		runs[l] = (struct kvq_backend_run){ .pool_off = kvq_layout_slice_off(L, r, l),
			.host = rec + kvq_blockrec_slice_at(L, r.cls, l), .len = kvq_layout_slice_bytes(L, r.cls, l) };
}
