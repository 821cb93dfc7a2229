/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA backend: a pool is one cuMemCreate allocation with POSIX
 * file-descriptor handles, exported once; workers import the descriptor.
 *
 * libcuda is never linked (docs/DESIGN.md, "One build runs with or without a GPU
 * driver"): a program that needs libcuda.so.1 does not even start where
 * there is no driver.  The driver's entry points come at run time from
 * cudaGetDriverEntryPointByVersion of the statically linked cudart (the
 * unversioned call is deprecated in CUDA 13), asked for at one ABI version
 * that matches the PFN_*_vNNNN types used here.  Without a driver the first
 * runtime call fails cleanly (cudaErrorInsufficientDriver) and every
 * function here returns -ENODEV with the reason.
 *
 * The daemon runs no kernels and makes no context: cuMemCreate,
 * cuMemExportToShareableHandle and cuMemRelease need none (checked on an
 * H200 with driver 580: no context current after create, nvidia-smi lists no
 * compute process for the daemon).  cudart 13 needs a 580 driver or later,
 * so no older driver that might want one can run this code.  Only writing a
 * pool's codebooks at its creation (cuda_write) needs one, for as long as
 * the copy takes: the device's primary context, retained and released.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "format.h"

#ifdef KVQ_WITH_CUDA

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

/* Driver ABI of the entry points below: CUDA 12.0 (drivers 525 and later
 * provide it; cudart 13 itself needs a 580 driver). */
#define CUDA_ABI 12000

static struct cuda_driver {
	int status;                        /* 0, or the code of the failed initialisation */
	char reason[KVQ_BACKEND_MSG_MAX];  /* why status < 0 */
	PFN_cuGetErrorName_v6000 get_error_name;
	PFN_cuGetErrorString_v6000 get_error_string;
	PFN_cuInit_v2000 init;
	PFN_cuDriverGetVersion_v2020 driver_version;
	PFN_cuDeviceGetCount_v2000 device_count;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetName_v2000 device_name;
	PFN_cuDeviceGetAttribute_v2000 device_attribute;
	PFN_cuDeviceTotalMem_v3020 device_total_mem;
	PFN_cuMemGetAllocationGranularity_v10020 mem_granularity;
	PFN_cuMemCreate_v10020 mem_create;
	PFN_cuMemExportToShareableHandle_v10020 mem_export;
	PFN_cuMemRelease_v10020 mem_release;
	/* cuda_write: a temporary mapping of a pool and a copy into it */
	PFN_cuDevicePrimaryCtxRetain_v7000 ctx_retain;
	PFN_cuDevicePrimaryCtxRelease_v11000 ctx_release;
	PFN_cuCtxPushCurrent_v4000 ctx_push;
	PFN_cuCtxPopCurrent_v4000 ctx_pop;
	PFN_cuCtxSynchronize_v2000 ctx_sync;
	PFN_cuMemAddressReserve_v10020 addr_reserve;
	PFN_cuMemAddressFree_v10020 addr_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_access;
	PFN_cuMemcpyHtoD_v3020 memcpy_htod;
} drv;

static const struct {
	const char *name;
	size_t off;
} drv_syms[] = {
#define SYM(sym, field) { #sym, offsetof(struct cuda_driver, field) }
	SYM(cuGetErrorName, get_error_name),
	SYM(cuGetErrorString, get_error_string),
	SYM(cuInit, init),
	SYM(cuDriverGetVersion, driver_version),
	SYM(cuDeviceGetCount, device_count),
	SYM(cuDeviceGet, device_get),
	SYM(cuDeviceGetName, device_name),
	SYM(cuDeviceGetAttribute, device_attribute),
	SYM(cuDeviceTotalMem, device_total_mem),
	SYM(cuMemGetAllocationGranularity, mem_granularity),
	SYM(cuMemCreate, mem_create),
	SYM(cuMemExportToShareableHandle, mem_export),
	SYM(cuMemRelease, mem_release),
	SYM(cuDevicePrimaryCtxRetain, ctx_retain),
	SYM(cuDevicePrimaryCtxRelease, ctx_release),
	SYM(cuCtxPushCurrent, ctx_push),
	SYM(cuCtxPopCurrent, ctx_pop),
	SYM(cuCtxSynchronize, ctx_sync),
	SYM(cuMemAddressReserve, addr_reserve),
	SYM(cuMemAddressFree, addr_free),
	SYM(cuMemMap, mem_map),
	SYM(cuMemUnmap, mem_unmap),
	SYM(cuMemSetAccess, mem_access),
	SYM(cuMemcpyHtoD, memcpy_htod),
#undef SYM
};

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static int cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE: return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED: return -EOPNOTSUPP;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE: return -ENODEV;
	default: return -EIO;
	}
}

/* "what: CUDA_ERROR_X (text)" into err; returns the errno-style code. */
static int cuda_fail(char *err, size_t len, const char *what, CUresult r)
{
	const char *name = NULL, *text = NULL;

	if (drv.get_error_name)
		drv.get_error_name(r, &name);
	if (drv.get_error_string)
		drv.get_error_string(r, &text);
	if (name)
		kvq_seterr(err, len, "%s: %s (%s)", what, name, text ? text : "no description");
	else
		kvq_seterr(err, len, "%s: CUDA error %d", what, (int)r);
	return cuda_errno(r);
}

/* Why the runtime could not reach a driver, in words an admin can act on. */
static void cuda_explain_runtime(cudaError_t e)
{
	int rt = 0, dv = 0;
	void *h;

	cudaRuntimeGetVersion(&rt);
	if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&dv) == cudaSuccess && dv == 0) {
		/* cudart found no driver at all: say whether the library is missing */
		h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
		if (!h) {
			const char *d = dlerror();

			if (!d || strstr(d, "No such file"))
				kvq_seterr(drv.reason, sizeof drv.reason, "no CUDA driver (libcuda.so.1 not found)");
			else
				kvq_seterr(drv.reason, sizeof drv.reason, "no CUDA driver (%s)", d);
			return;
		}
		dlclose(h);
		kvq_seterr(drv.reason, sizeof drv.reason, "CUDA driver present but unusable: %s (%s)",
			   cudaGetErrorName(e), cudaGetErrorString(e));
		return;
	}
	if (e == cudaErrorInsufficientDriver) {
		kvq_seterr(drv.reason, sizeof drv.reason,
			   "CUDA driver %d.%d is older than the runtime %d.%d built in (%s)", dv / 1000,
			   dv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorName(e));
		return;
	}
	kvq_seterr(drv.reason, sizeof drv.reason, "CUDA runtime: %s (%s)", cudaGetErrorName(e),
		   cudaGetErrorString(e));
}

static void cuda_load(void)
{
	CUresult r;

	for (size_t i = 0; i < sizeof drv_syms / sizeof drv_syms[0]; i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		void **slot = (void **)((char *)&drv + drv_syms[i].off);
		cudaError_t e;

		e = cudaGetDriverEntryPointByVersion(drv_syms[i].name, slot, CUDA_ABI, cudaEnableDefault, &q);
		if (e != cudaSuccess) {
			cuda_explain_runtime(e);
			drv.status = -ENODEV;
			return;
		}
		if (q != cudaDriverEntryPointSuccess || !*slot) {
			kvq_seterr(drv.reason, sizeof drv.reason, "CUDA driver lacks %s (ABI %d.%d)%s",
				   drv_syms[i].name, CUDA_ABI / 1000, CUDA_ABI % 1000 / 10,
				   q == cudaDriverEntryPointVersionNotSufficent ? ": driver too old" : "");
			drv.status = -ENODEV;
			return;
		}
	}
	r = drv.init(0);
	if (r != CUDA_SUCCESS)
		drv.status = cuda_fail(drv.reason, sizeof drv.reason, "cuInit", r);
}

/* Initialises once per process; 0 or the stored code with reason in err. */
static int cuda_ready(char *err, size_t len)
{
	pthread_once(&drv_once, cuda_load);
	if (drv.status < 0)
		kvq_seterr(err, len, "%s", drv.reason);
	return drv.status;
}

static void cuda_prop(CUmemAllocationProp *prop, int device)
{
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* The device, checked for what pools need: present, VMM with POSIX-fd
 * handles, and a compute mode that lets other processes use it. */
static int cuda_device(int device, CUdevice *ret_dev, char *err, size_t len)
{
	int n = 0, vmm = 0, posix = 0, mode = 0;
	CUdevice dev;
	CUresult r;

	if (cuda_ready(err, len) < 0)
		return drv.status;
	r = drv.device_count(&n);
	if (r != CUDA_SUCCESS)
		return cuda_fail(err, len, "cuDeviceGetCount", r);
	if (device < 0 || device >= n) {
		kvq_seterr(err, len, "no CUDA device %d (%d present)", device, n);
		return -ENODEV;
	}
	r = drv.device_get(&dev, device);
	if (r != CUDA_SUCCESS)
		return cuda_fail(err, len, "cuDeviceGet", r);
	if ((r = drv.device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)) ||
	    (r = drv.device_attribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
				      dev)) ||
	    (r = drv.device_attribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev)))
		return cuda_fail(err, len, "cuDeviceGetAttribute", r);
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

static int cuda_granularity_of(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	CUmemAllocationProp prop;
	size_t g = 0;
	CUresult r;

	cuda_prop(&prop, device);
	/* the recommended one is a multiple of the minimum, which importers
	 * must align their reservation to */
	r = drv.mem_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS)
		return cuda_fail(err, len, "cuMemGetAllocationGranularity", r);
	if (g == 0) {
		kvq_seterr(err, len, "cuMemGetAllocationGranularity: 0");
		return -EIO;
	}
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
	r = drv.device_total_mem(&total, dev);
	if (r != CUDA_SUCCESS)
		return cuda_fail(err, len, "cuDeviceTotalMem", r);
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
	if (drv.device_name(name, (int)sizeof name - 1, dev) != CUDA_SUCCESS)
		snprintf(name, sizeof name, "(unnamed)");
	drv.driver_version(&version);
	kvq_seterr(reason, len, "device %d %s, %llu MiB, driver CUDA %d.%d, granularity %llu KiB", device, name,
		   (unsigned long long)(total >> 20), version / 1000, version % 1000 / 10,
		   (unsigned long long)(g >> 10));
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
	cuda_prop(&prop, device);
	r = drv.mem_create(&h, (size_t)bytes, &prop, 0);
	if (r != CUDA_SUCCESS) {
		char what[96];

		snprintf(what, sizeof what, "cuMemCreate of %llu bytes on device %d", (unsigned long long)bytes,
			 device);
		return cuda_fail(err, len, what, r);
	}
	r = drv.mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(err, len, "cuMemExportToShareableHandle", r);
		drv.mem_release(h);
		return rc;
	}
	/* driver 580 sets close-on-exec itself, but does not document it; the
	 * daemon is single-threaded, so no exec can slip in before this */
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		rc = -errno;
		kvq_seterr(err, len, "cuda: close-on-exec on the exported descriptor: %s", strerror(-rc));
		close(fd);
		drv.mem_release(h);
		return rc;
	}
	(void)label;    /* device memory has no name the kernel shows */
	memset(ret_mem, 0, sizeof *ret_mem);
	ret_mem->backend = &kvq_backend_cuda;
	ret_mem->fd = fd;
	ret_mem->size = bytes;
	ret_mem->map = NULL;
	ret_mem->device = device;
	ret_mem->handle = (uint64_t)h;
	return 0;
}

static void cuda_destroy(struct kvq_backend_mem *mem)
{
	if (mem->fd >= 0)
		close(mem->fd);
	mem->fd = -1;
	/* workers that imported it keep the memory until they unmap */
	drv.mem_release((CUmemGenericAllocationHandle)mem->handle);
	mem->handle = 0;
}

/*
 * Copies src[len] to byte off of the pool: in the device's primary context
 * (retained for the copy only), the whole allocation mapped at a reserved
 * range (cuMemMap maps from offset 0 only), the copy, a synchronize so it is
 * complete before the mapping goes, then everything undone in reverse.
 */
static int cuda_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
		      size_t errlen)
{
	CUmemAccessDesc acc;
	CUcontext ctx = NULL, popped = NULL;
	CUdeviceptr va = 0;
	CUdevice dev;
	CUresult r = CUDA_SUCCESS;
	const char *what = NULL;
	bool retained = false, pushed = false, mapped = false;
	uint64_t g;
	int rc;

	if ((rc = cuda_device(mem->device, &dev, err, errlen)) < 0 ||
	    (rc = cuda_granularity_of(mem->device, &g, err, errlen)) < 0)
		return rc;
	memset(&acc, 0, sizeof acc);
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = mem->device;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if ((r = drv.ctx_retain(&ctx, dev)) != CUDA_SUCCESS) {
		what = "cuDevicePrimaryCtxRetain";
		goto out;
	}
	retained = true;
	if ((r = drv.ctx_push(ctx)) != CUDA_SUCCESS) {
		what = "cuCtxPushCurrent";
		goto out;
	}
	pushed = true;
	if ((r = drv.addr_reserve(&va, (size_t)mem->size, (size_t)g, 0, 0)) != CUDA_SUCCESS) {
		what = "cuMemAddressReserve";
		va = 0;
		goto out;
	}
	if ((r = drv.mem_map(va, (size_t)mem->size, 0, (CUmemGenericAllocationHandle)mem->handle, 0)) !=
	    CUDA_SUCCESS) {
		what = "cuMemMap";
		goto out;
	}
	mapped = true;
	if ((r = drv.mem_access(va, (size_t)mem->size, &acc, 1)) != CUDA_SUCCESS)
		what = "cuMemSetAccess";
	else if ((r = drv.memcpy_htod(va + off, src, len)) != CUDA_SUCCESS)
		what = "cuMemcpyHtoD";
	else if ((r = drv.ctx_sync()) != CUDA_SUCCESS)
		what = "cuCtxSynchronize";
out:
	if (mapped)
		drv.mem_unmap(va, (size_t)mem->size);
	if (va)
		drv.addr_free(va, (size_t)mem->size);
	if (pushed)
		drv.ctx_pop(&popped);
	if (retained)
		drv.ctx_release(dev);
	return what ? cuda_fail(err, errlen, what, r) : 0;
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
	.destroy = cuda_destroy,
	.write = cuda_write,
};
