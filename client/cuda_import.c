/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Importing a cuda pool (daemon/backend.h says what an importer does).  The
 * driver comes at run time (kernels/cuda/driver.h), so libkvq loads where
 * there is no driver and only attaching to a cuda pool fails there.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_import.h"

static const struct kvq_driver *drv;

/* A driver error as libkvq reports it (kvq_driver_fail's code), what
 * failed named in kvq_client_error. */
static int cuda_fail(kvq_client *c, const char *what, CUresult r)
{
	char msg[KVQ_DRIVER_MSG_MAX];
	int rc = kvq_driver_fail(what, r, msg, sizeof(msg));

	return client_fail(c, rc, "%s", msg);
}

void cuda_unimport(kvq_client *c)
{
	struct client_cuda *cu_pool = c->cuda;

	if (!cu_pool)
		return;
	kvq_driver_unmap(&cu_pool->map);
	drv->cuDevicePrimaryCtxRelease(cu_pool->dev);
	free(cu_pool);
	c->cuda = NULL;
	c->base = NULL;
	c->device = -1;
}

int cuda_ready(kvq_client *c)
{
	CUresult r = drv->cuCtxSetCurrent(c->cuda->ctx);

	return r == CUDA_SUCCESS ? 0 : cuda_fail(c, "cuCtxSetCurrent", r);
}

/* The pool's device in this process: by uuid when the daemon sent one
 * (ordinals differ between processes that see other devices), else by
 * ordinal.  Its ordinal here, or the error. */
static int cuda_find_device(kvq_client *c, int ordinal, const uint8_t *uuid, size_t uuid_len, CUdevice *ret_dev)
{
	CUdevice dev = 0;
	int n = 0;
	CUresult r;

	r = drv->cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuDeviceGetCount", r);
	if (uuid_len == sizeof(CUuuid)) {
		for (int i = 0; i < n; i++) {
			CUuuid u;

			if (drv->cuDeviceGet(&dev, i) == CUDA_SUCCESS && drv->cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS &&
			    !memcmp(u.bytes, uuid, sizeof(u.bytes))) {
				*ret_dev = dev;
				return i;
			}
		}
		return client_fail(c, -ENODEV, "the pool's device (uuid from kvqd) is not visible to this process");
	}
	if (ordinal < 0 || ordinal >= n)
		return client_fail(c, -ENODEV, "the pool's device %d is not visible (%d devices)", ordinal, n);
	r = drv->cuDeviceGet(&dev, ordinal);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuDeviceGet", r);
	*ret_dev = dev;
	return ordinal;
}

int cuda_import(kvq_client *c, int fd, uint64_t map_bytes, int ordinal, const uint8_t *uuid, size_t uuid_len)
{
	char msg[KVQ_DRIVER_MSG_MAX];
	CUmemGenericAllocationHandle h;
	struct client_cuda *cu_pool;
	CUcontext ctx;
	CUdevice dev = 0;
	size_t gran = 0;
	int found, rc;
	CUresult r;

	if ((rc = kvq_driver_load(&drv, msg, sizeof(msg))) < 0)
		return client_fail(c, rc, "pool is on the cuda backend: %s", msg);
	if ((found = cuda_find_device(c, ordinal, uuid, uuid_len, &dev)) < 0)
		return found;
	if ((rc = kvq_driver_granularity(dev, CU_MEM_ALLOC_GRANULARITY_MINIMUM, &gran, msg, sizeof(msg))) < 0)
		return client_fail(c, rc, "%s", msg);
	if (map_bytes > SIZE_MAX - gran)
		return client_fail(c, KVQ_EPROTOCOL, "cuda pool of %llu bytes", (unsigned long long)map_bytes);
	r = drv->cuDevicePrimaryCtxRetain(&ctx, dev);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuDevicePrimaryCtxRetain", r);
	r = drv->cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) {
		drv->cuDevicePrimaryCtxRelease(dev);
		return cuda_fail(c, "cuCtxSetCurrent", r);
	}
	r = drv->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		drv->cuDevicePrimaryCtxRelease(dev);
		return cuda_fail(c, "cuMemImportFromShareableHandle", r);
	}
	cu_pool = malloc(sizeof(*cu_pool));
	if (!cu_pool) {
		drv->cuMemRelease(h);
		drv->cuDevicePrimaryCtxRelease(dev);
		return -ENOMEM;
	}
	*cu_pool = (struct client_cuda){ .dev = dev, .ctx = ctx };
	rc = kvq_driver_map(h, (size_t)map_bytes, gran, dev, &cu_pool->map, msg, sizeof(msg));
	drv->cuMemRelease(h); /* the mapping keeps the memory */
	if (rc < 0) {
		drv->cuDevicePrimaryCtxRelease(dev);
		free(cu_pool);
		return client_fail(c, rc, "%s", msg);
	}
	c->cuda = cu_pool;
	c->map_bytes = (size_t)map_bytes;
	c->base = (void *)(uintptr_t)cu_pool->map.va;
	c->device = found;
	return 0;
}
