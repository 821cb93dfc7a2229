/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA backend: a pool is one cuMemCreate allocation with POSIX
 * file-descriptor handles, exported once; workers import the descriptor.
 * The driver comes at run time (kernels/cuda/driver.h): without one, every
 * function here returns -ENODEV with the reason.
 *
 * The daemon runs no kernels and makes no context: cuMemCreate,
 * cuMemExportToShareableHandle and cuMemRelease need none (checked on an
 * H200 with driver 580: no context current after create, nvidia-smi lists no
 * compute process for the daemon).  cudart 13 needs a 580 driver or later,
 * so no older driver that might want one can run this code.  Writing a
 * pool's codebooks at its creation (cuda_write) needs one, for as long as
 * the copy takes: the device's primary context, retained and released.  A
 * pool with a host tier holds that context for the tier's life (its
 * channel, chan_open: the pool mapped, the tier pinned, a stream), which
 * costs the device what a context costs (a few hundred MiB).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "seterr.h"

#ifdef KVQ_WITH_CUDA

#include <fcntl.h>
#include <stdint.h>

#include "cuda/driver.h"

static const struct kvq_driver *drv;

/* The device, checked for what pools need: present, VMM with POSIX-fd
 * handles, and a compute mode that lets other processes use it.  The first
 * call loads the driver (-ENODEV with the reason where there is none). */
static int cuda_device(int device, CUdevice *ret_dev, char *err, size_t len)
{
	int n = 0, vmm = 0, posix = 0, mode = 0, rc;
	CUdevice dev;
	CUresult r;

	if ((rc = kvq_driver_load(&drv, err, len)) < 0)
		return rc;
	r = drv->cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuDeviceGetCount", r, err, len);
	if (device < 0 || device >= n) {
		kvq_seterr(err, len, "no CUDA device %d (%d present)", device, n);
		return -ENODEV;
	}
	r = drv->cuDeviceGet(&dev, device);
	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuDeviceGet", r, err, len);
	if ((r = drv->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)) ||
	    (r = drv->cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
					   dev)) ||
	    (r = drv->cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev)))
		return kvq_driver_fail("cuDeviceGetAttribute", r, err, len);
	if (!vmm || !posix) {
		kvq_seterr(err, len, "CUDA device %d cannot export memory as a file descriptor (%s)", device,
			   vmm ? "no POSIX fd handles" : "no virtual memory management");
		return -EOPNOTSUPP;
	}
	if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS || mode == CU_COMPUTEMODE_PROHIBITED) {
		/* workers in other processes could not map the pool */
		kvq_seterr(err, len, "CUDA device %d is in %s compute mode: it cannot be shared", device,
			   mode == CU_COMPUTEMODE_PROHIBITED ? "prohibited" : "exclusive-process");
		return -EPERM;
	}
	*ret_dev = dev;
	return 0;
}

/* The recommended granularity: a multiple of the minimum, which importers
 * align their reservation to. */
static int cuda_granularity_of(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	size_t g = 0;
	int rc;

	if ((rc = kvq_driver_granularity(device, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g, err, len)) < 0)
		return rc;
	*ret_bytes = g;
	return 0;
}

static int cuda_granularity(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	CUdevice dev;
	int rc;

	if ((rc = cuda_device(device, &dev, err, len)) < 0)
		return rc;
	return cuda_granularity_of(device, ret_bytes, err, len);
}

static int cuda_total(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	size_t total = 0;
	CUdevice dev;
	CUresult r;
	int rc;

	if ((rc = cuda_device(device, &dev, err, len)) < 0)
		return rc;
	r = drv->cuDeviceTotalMem(&total, dev);
	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuDeviceTotalMem", r, err, len);
	*ret_bytes = total;
	return 0;
}

static int cuda_probe(int device, char *reason, size_t len)
{
	char name[128] = "";
	uint64_t g = 0, total = 0;
	int version = 0, rc;
	CUdevice dev;

	if ((rc = cuda_device(device, &dev, reason, len)) < 0 ||
	    (rc = cuda_granularity_of(device, &g, reason, len)) < 0 ||
	    (rc = cuda_total(device, &total, reason, len)) < 0)
		return rc;
	if (drv->cuDeviceGetName(name, (int)sizeof name - 1, dev) != CUDA_SUCCESS)
		snprintf(name, sizeof name, "(unnamed)");
	drv->cuDriverGetVersion(&version);
	kvq_seterr(reason, len, "device %d %s, %llu MiB, driver CUDA %d.%d, granularity %llu KiB", device, name,
		   (unsigned long long)(total >> 20), version / 1000, version % 1000 / 10,
		   (unsigned long long)(g >> 10));
	return 0;
}

/* *ret_mem for allocation h of bytes on device and its descriptor fd, or,
 * when fd cannot be made close-on-exec, both given up (released, closed)
 * and a negative code. */
static int cuda_mem(int fd, CUmemGenericAllocationHandle h, uint64_t bytes, int device,
		    struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	int rc;

	/* driver 580 sets close-on-exec on what it exports, but does not
	 * document it, and a stored descriptor comes as the manager made it;
	 * the daemon is single-threaded, so no exec can slip in before this */
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		rc = -errno;
		kvq_seterr(err, len, "cuda: close-on-exec on the pool's descriptor: %s", strerror(-rc));
		close(fd);
		drv->cuMemRelease(h);
		return rc;
	}
	memset(ret_mem, 0, sizeof *ret_mem);
	ret_mem->backend = &kvq_backend_cuda;
	ret_mem->fd = fd;
	ret_mem->size = bytes;
	ret_mem->map = NULL;
	ret_mem->device = device;
	ret_mem->handle = (uint64_t)h;
	return 0;
}

static int cuda_create(uint64_t size, int device, const char *label, struct kvq_backend_mem *ret_mem,
		       char *err, size_t len)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	uint64_t g, bytes;
	CUdevice dev;
	CUresult r;
	int fd = -1, rc;

	if ((rc = cuda_device(device, &dev, err, len)) < 0 ||
	    (rc = cuda_granularity_of(device, &g, err, len)) < 0)
		return rc;
	if (kvq_backend_round(size, g, &bytes) < 0 || bytes > (uint64_t)SIZE_MAX) {
		kvq_seterr(err, len, "cuda: pool of %llu bytes is too large", (unsigned long long)size);
		return -EFBIG;
	}
	kvq_driver_pool_prop(&prop, device);
	r = drv->cuMemCreate(&h, (size_t)bytes, &prop, 0);
	if (r != CUDA_SUCCESS) {
		char what[96];

		snprintf(what, sizeof what, "cuMemCreate of %llu bytes on device %d", (unsigned long long)bytes,
			 device);
		return kvq_driver_fail(what, r, err, len);
	}
	r = drv->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		rc = kvq_driver_fail("cuMemExportToShareableHandle", r, err, len);
		drv->cuMemRelease(h);
		return rc;
	}
	(void)label;    /* device memory has no name the kernel shows */
	return cuda_mem(fd, h, bytes, device, ret_mem, err, len);
}

static int cuda_adopt(int fd, uint64_t size, int device, struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	CUmemGenericAllocationHandle h;
	uint64_t g;
	CUdevice dev;
	CUresult r;
	int rc;

	if ((rc = cuda_device(device, &dev, err, len)) < 0 || (rc = cuda_granularity_of(device, &g, err, len)) < 0)
		goto fail;
	rc = -EINVAL;
	if (size == 0 || size % g) {
		kvq_seterr(err, len, "cuda: %llu bytes recorded, not a multiple of the granularity",
			   (unsigned long long)size);
		goto fail;
	}
	r = drv->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		rc = kvq_driver_fail("cuMemImportFromShareableHandle", r, err, len);
		goto fail;
	}
	return cuda_mem(fd, h, size, device, ret_mem, err, len);
fail:
	close(fd);
	return rc;
}

static void cuda_destroy(struct kvq_backend_mem *mem)
{
	if (mem->fd >= 0)
		close(mem->fd);
	mem->fd = -1;
	/* workers that imported it keep the memory until they unmap */
	drv->cuMemRelease((CUmemGenericAllocationHandle)mem->handle);
	mem->handle = 0;
}

/* The copy into a mapping of the pool, complete before the mapping goes. */
static int cuda_copy(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, uint64_t g,
		     char *err, size_t errlen)
{
	struct kvq_driver_map m;
	CUresult r;
	int rc;

	rc = kvq_driver_map((CUmemGenericAllocationHandle)mem->handle, (size_t)mem->size, (size_t)g, mem->device,
			    &m, err, errlen);
	if (rc < 0)
		return rc;
	if ((r = drv->cuMemcpyHtoD(m.va + off, src, len)) != CUDA_SUCCESS)
		rc = kvq_driver_fail("cuMemcpyHtoD", r, err, errlen);
	else if ((r = drv->cuCtxSynchronize()) != CUDA_SUCCESS)
		rc = kvq_driver_fail("cuCtxSynchronize", r, err, errlen);
	kvq_driver_unmap(&m);
	return rc;
}

/*
 * Copies src[len] to byte off of the pool: in the device's primary context
 * (retained for the copy only), the whole allocation mapped, the copy, then
 * everything undone in reverse.
 */
static int cuda_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
		      size_t errlen)
{
	CUcontext ctx = NULL, popped = NULL;
	CUdevice dev;
	CUresult r;
	uint64_t g;
	int rc;

	if ((rc = cuda_device(mem->device, &dev, err, errlen)) < 0 ||
	    (rc = cuda_granularity_of(mem->device, &g, err, errlen)) < 0)
		return rc;
	if ((r = drv->cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS)
		return kvq_driver_fail("cuDevicePrimaryCtxRetain", r, err, errlen);
	if ((r = drv->cuCtxPushCurrent(ctx)) != CUDA_SUCCESS) {
		rc = kvq_driver_fail("cuCtxPushCurrent", r, err, errlen);
	} else {
		rc = cuda_copy(mem, off, src, len, g, err, errlen);
		drv->cuCtxPopCurrent(&popped);
	}
	drv->cuDevicePrimaryCtxRelease(dev);
	return rc;
}

/* ---------------------------------------------------------------- the host tier's channel */

struct kvq_backend_chan {
	CUdevice dev;
	CUcontext ctx;                  /* the device's primary context, retained */
	struct kvq_driver_map map;      /* the pool, mapped in the daemon */
	void *host;                     /* registered (pinned) */
	CUstream stream;
};

static void chan_close(struct kvq_backend_chan *c)
{
	CUcontext popped;

	if (!c)
		return;
	if (c->ctx && drv->cuCtxPushCurrent(c->ctx) == CUDA_SUCCESS) {
		if (c->stream)
			drv->cuStreamDestroy(c->stream);
		if (c->host)
			drv->cuMemHostUnregister(c->host);
		if (c->map.va)
			kvq_driver_unmap(&c->map);
		drv->cuCtxPopCurrent(&popped);
	}
	if (c->ctx)
		drv->cuDevicePrimaryCtxRelease(c->dev);
	free(c);
}

/* Steps of chan_open in the pushed context: map, pin, stream. */
static int chan_setup(struct kvq_backend_chan *c, struct kvq_backend_mem *mem, void *host, uint64_t host_len,
		      char *err, size_t errlen)
{
	uint64_t g;
	CUresult r;
	int rc = cuda_granularity_of(mem->device, &g, err, errlen);

	if (rc < 0)
		return rc;
	rc = kvq_driver_map((CUmemGenericAllocationHandle)mem->handle, (size_t)mem->size, (size_t)g, mem->device,
			    &c->map, err, errlen);
	if (rc < 0)
		return rc;
	if ((r = drv->cuMemHostRegister(host, (size_t)host_len, CU_MEMHOSTREGISTER_PORTABLE)) != CUDA_SUCCESS)
		return kvq_driver_fail("cuMemHostRegister (pinning the host tier)", r, err, errlen);
	c->host = host;
	if ((r = drv->cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
		return kvq_driver_fail("cuStreamCreate", r, err, errlen);
	return 0;
}

static int chan_open(struct kvq_backend_mem *mem, void *host, uint64_t host_len, struct kvq_backend_chan **ret,
		     char *err, size_t errlen)
{
	struct kvq_backend_chan *c = calloc(1, sizeof(*c));
	CUcontext popped;
	CUresult r;
	int rc;

	if (!c)
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	if ((rc = cuda_device(mem->device, &c->dev, err, errlen)) < 0) {
		free(c);
		return rc;
	}
	if ((r = drv->cuDevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS) {
		free(c);
		return kvq_driver_fail("cuDevicePrimaryCtxRetain", r, err, errlen);
	}
	if ((r = drv->cuCtxPushCurrent(c->ctx)) != CUDA_SUCCESS) {
		rc = kvq_driver_fail("cuCtxPushCurrent", r, err, errlen);
	} else {
		rc = chan_setup(c, mem, host, host_len, err, errlen);
		drv->cuCtxPopCurrent(&popped);
	}
	if (rc < 0) {
		chan_close(c);
		return rc;
	}
	*ret = c;
	return 0;
}

/* How many runs from runs[0] (at most n) make one 2D copy: of one length,
 * back to back on the host, a constant pitch in the pool (a block's layer
 * slices, when every layer has the same formats) within the driver's
 * pitch limit. */
static uint32_t chan_rows(const struct kvq_backend_run *runs, uint32_t n)
{
	uint64_t pitch;
	uint32_t k = 1;

	if (n < 2 || runs[1].pool_off <= runs[0].pool_off)
		return 1;
	pitch = runs[1].pool_off - runs[0].pool_off;
	if (pitch < runs[0].len || pitch > INT32_MAX)
		return 1;
	while (k < n && runs[k].len == runs[0].len && runs[k].host == runs[k - 1].host + runs[0].len &&
	       runs[k].pool_off == runs[k - 1].pool_off + pitch)
		k++;
	return k;
}

/* Rows runs[0..k) as one async 2D copy. */
static CUresult chan_2d(struct kvq_backend_chan *c, int to_host, const struct kvq_backend_run *runs, uint32_t k)
{
	CUDA_MEMCPY2D m = { .WidthInBytes = (size_t)runs[0].len, .Height = k };
	size_t pitch = k > 1 ? (size_t)(runs[1].pool_off - runs[0].pool_off) : (size_t)runs[0].len;

	if (to_host) {
		m.srcMemoryType = CU_MEMORYTYPE_DEVICE, m.srcDevice = c->map.va + runs[0].pool_off, m.srcPitch = pitch;
		m.dstMemoryType = CU_MEMORYTYPE_HOST, m.dstHost = runs[0].host, m.dstPitch = (size_t)runs[0].len;
	} else {
		m.srcMemoryType = CU_MEMORYTYPE_HOST, m.srcHost = runs[0].host, m.srcPitch = (size_t)runs[0].len;
		m.dstMemoryType = CU_MEMORYTYPE_DEVICE, m.dstDevice = c->map.va + runs[0].pool_off, m.dstPitch = pitch;
	}
	return drv->cuMemcpy2DAsync(&m, c->stream);
}

/* The runs as async copies on the channel's stream (a block's slices as
 * one 2D copy where they allow: per copy the driver's overhead is a few
 * microseconds, a slice's transfer about as much), then one wait. */
static int chan_copy(struct kvq_backend_chan *c, int to_host, const struct kvq_backend_run *runs, uint32_t n,
		     char *err, size_t errlen)
{
	CUcontext popped;
	CUresult r = drv->cuCtxPushCurrent(c->ctx);

	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuCtxPushCurrent", r, err, errlen);
	for (uint32_t i = 0, k; i < n && r == CUDA_SUCCESS; i += k) {
		k = chan_rows(runs + i, n - i);
		r = chan_2d(c, to_host, runs + i, k);
	}
	if (r != CUDA_SUCCESS)
		kvq_driver_fail("cuMemcpy2DAsync", r, err, errlen);
	/* waited for either way: nothing may run on once the job ends */
	if (drv->cuStreamSynchronize(c->stream) != CUDA_SUCCESS && r == CUDA_SUCCESS)
		r = CUDA_ERROR_UNKNOWN, kvq_seterr(err, errlen, "cuStreamSynchronize failed");
	drv->cuCtxPopCurrent(&popped);
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

#else /* !KVQ_WITH_CUDA */

static int cuda_off(char *err, size_t len)
{
	kvq_seterr(err, len, "built without CUDA");
	return -EOPNOTSUPP;
}

static int cuda_probe(int device, char *reason, size_t len)
{
	return cuda_off(reason, len);
}

static int cuda_granularity(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	return cuda_off(err, len);
}

static int cuda_total(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	return cuda_off(err, len);
}

static int cuda_create(uint64_t size, int device, const char *label, struct kvq_backend_mem *ret_mem,
		       char *err, size_t len)
{
	return cuda_off(err, len);
}

static int cuda_adopt(int fd, uint64_t size, int device, struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	close(fd);
	return cuda_off(err, len);
}

static void cuda_destroy(struct kvq_backend_mem *mem)
{
}

static int cuda_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
		      size_t errlen)
{
	return cuda_off(err, errlen);
}

#endif /* KVQ_WITH_CUDA */

const struct kvq_backend kvq_backend_cuda = {
	.name = "cuda",
#ifdef KVQ_WITH_CUDA
	.compiled = 1,
#endif
	.probe = cuda_probe,
	.granularity = cuda_granularity,
	.total_memory = cuda_total,
	.create = cuda_create,
	.adopt = cuda_adopt,
	.destroy = cuda_destroy,
	.write = cuda_write,
#ifdef KVQ_WITH_CUDA
	.chan_open = chan_open,
	.chan_copy = chan_copy,
	.chan_close = chan_close,
#endif
};
