/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Importing a cuda pool (daemon/backend.h says what an importer does).  The
 * driver is reached through cudaGetDriverEntryPointByVersion of the
 * statically linked cudart, never by linking libcuda, so libkvq loads
 * where there is no driver and only attaching to a cuda pool fails there.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "cuda_import.h"

#define CUDA_ABI 12000

static struct {
	int status;
	char reason[200];
	PFN_cuGetErrorName_v6000 get_error_name;
	PFN_cuInit_v2000 init;
	PFN_cuDeviceGetCount_v2000 device_count;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetUuid_v11040 device_uuid;
	PFN_cuDevicePrimaryCtxRetain_v7000 ctx_retain;
	PFN_cuDevicePrimaryCtxRelease_v11000 ctx_release;
	PFN_cuCtxSetCurrent_v4000 ctx_set;
	PFN_cuMemGetAllocationGranularity_v10020 mem_granularity;
	PFN_cuMemImportFromShareableHandle_v10020 mem_import;
	PFN_cuMemAddressReserve_v10020 addr_reserve;
	PFN_cuMemAddressFree_v10020 addr_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_access;
	PFN_cuMemRelease_v10020 mem_release;
} cu;

#define CU_SYM(sym, field) { #sym, (void **)&cu.field }
static const struct {
	const char *name;
	void **slot;
} cu_syms[] = {
	CU_SYM(cuGetErrorName, get_error_name), CU_SYM(cuInit, init),
	CU_SYM(cuDeviceGetCount, device_count), CU_SYM(cuDeviceGet, device_get),
	CU_SYM(cuDeviceGetUuid, device_uuid), CU_SYM(cuDevicePrimaryCtxRetain, ctx_retain),
	CU_SYM(cuDevicePrimaryCtxRelease, ctx_release), CU_SYM(cuCtxSetCurrent, ctx_set),
	CU_SYM(cuMemGetAllocationGranularity, mem_granularity),
	CU_SYM(cuMemImportFromShareableHandle, mem_import), CU_SYM(cuMemAddressReserve, addr_reserve),
	CU_SYM(cuMemAddressFree, addr_free), CU_SYM(cuMemMap, mem_map), CU_SYM(cuMemUnmap, mem_unmap),
	CU_SYM(cuMemSetAccess, mem_access), CU_SYM(cuMemRelease, mem_release),
};
#undef CU_SYM

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
	for (size_t i = 0; i < sizeof(cu_syms) / sizeof(cu_syms[0]); i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		cudaError_t e = cudaGetDriverEntryPointByVersion(cu_syms[i].name, cu_syms[i].slot, CUDA_ABI,
								 cudaEnableDefault, &q);

		if (e != cudaSuccess) {
			snprintf(cu.reason, sizeof(cu.reason), "no usable CUDA driver: %s (%s)", cudaGetErrorName(e),
				 cudaGetErrorString(e));
			cu.status = -ENODEV;
			return;
		}
		if (q != cudaDriverEntryPointSuccess || !*cu_syms[i].slot) {
			snprintf(cu.reason, sizeof(cu.reason), "CUDA driver lacks %s (ABI %d.%d)", cu_syms[i].name,
				 CUDA_ABI / 1000, CUDA_ABI % 1000 / 10);
			cu.status = -ENODEV;
			return;
		}
	}
	CUresult r = cu.init(0);

	if (r != CUDA_SUCCESS) {
		const char *n = NULL;

		cu.get_error_name(r, &n);
		snprintf(cu.reason, sizeof(cu.reason), "cuInit: %s", n ? n : "CUDA error");
		cu.status = -ENODEV;
	}
}

int cuda_fail(kvq_client *c, const char *what, CUresult r)
{
	const char *n = NULL;

	if (cu.get_error_name)
		cu.get_error_name(r, &n);
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return client_fail(c, -ENOMEM, "%s: %s", what, n ? n : "CUDA error");
	case CUDA_ERROR_INVALID_VALUE:
		return client_fail(c, -EINVAL, "%s: %s", what, n ? n : "CUDA error");
	case CUDA_ERROR_NOT_SUPPORTED:
		return client_fail(c, -ENOTSUP, "%s: %s", what, n ? n : "CUDA error");
	default:
		return client_fail(c, -EIO, "%s: %s (%d)", what, n ? n : "CUDA error", (int)r);
	}
}

void cuda_unimport(kvq_client *c)
{
	struct client_cuda *cu_pool = c->cuda;

	if (!cu_pool)
		return;
	if (c->base)
		cu.mem_unmap(cu_pool->va, c->map_bytes);
	cu.addr_free(cu_pool->va, cu_pool->reserved);
	cu.ctx_release(cu_pool->dev);
	free(cu_pool);
	c->cuda = NULL;
	c->base = NULL;
	c->device = -1;
}

int cuda_ready(kvq_client *c)
{
	CUresult r = cu.ctx_set(c->cuda->ctx);

	return r == CUDA_SUCCESS ? 0 : cuda_fail(c, "cuCtxSetCurrent", r);
}

int cuda_import(kvq_client *c, int fd, uint64_t map_bytes, int ordinal, const uint8_t *uuid, size_t uuid_len)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	CUdeviceptr va = 0;
	CUcontext ctx;
	CUdevice dev = 0;
	size_t gran = 0, reserve;
	int n = 0, found = -1;
	CUresult r;

	pthread_once(&cu_once, cu_load);
	if (cu.status < 0)
		return client_fail(c, cu.status, "pool is on the cuda backend: %s", cu.reason);
	r = cu.device_count(&n);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuDeviceGetCount", r);
	if (uuid_len == sizeof(CUuuid)) {
		for (int i = 0; i < n && found < 0; i++) {
			CUuuid u;

			if (cu.device_get(&dev, i) == CUDA_SUCCESS && cu.device_uuid(&u, dev) == CUDA_SUCCESS &&
			    !memcmp(u.bytes, uuid, sizeof(u.bytes)))
				found = i;
		}
		if (found < 0)
			return client_fail(c, -ENODEV,
					   "the pool's device (uuid from kvqd) is not visible to this process");
	} else {
		if (ordinal < 0 || ordinal >= n)
			return client_fail(c, -ENODEV, "the pool's device %d is not visible (%d devices)", ordinal, n);
		r = cu.device_get(&dev, ordinal);
		if (r != CUDA_SUCCESS)
			return cuda_fail(c, "cuDeviceGet", r);
		found = ordinal;
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	r = cu.mem_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuMemGetAllocationGranularity", r);
	if (!gran || map_bytes > SIZE_MAX - gran)
		return client_fail(c, KVQ_EPROTOCOL, "cuda pool of %llu bytes", (unsigned long long)map_bytes);
	reserve = ((size_t)map_bytes + gran - 1) / gran * gran;
	r = cu.ctx_retain(&ctx, dev);
	if (r != CUDA_SUCCESS)
		return cuda_fail(c, "cuDevicePrimaryCtxRetain", r);
	r = cu.ctx_set(ctx);
	if (r != CUDA_SUCCESS) {
		cu.ctx_release(dev);
		return cuda_fail(c, "cuCtxSetCurrent", r);
	}
	r = cu.mem_import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		cu.ctx_release(dev);
		return cuda_fail(c, "cuMemImportFromShareableHandle", r);
	}
	r = cu.addr_reserve(&va, reserve, gran, 0, 0);
	if (r != CUDA_SUCCESS) {
		cu.mem_release(h);
		cu.ctx_release(dev);
		return cuda_fail(c, "cuMemAddressReserve", r);
	}
	c->cuda = malloc(sizeof(*c->cuda));
	if (!c->cuda) {
		cu.addr_free(va, reserve);
		cu.mem_release(h);
		cu.ctx_release(dev);
		return -ENOMEM;
	}
	*c->cuda = (struct client_cuda){ .dev = dev, .ctx = ctx, .va = va, .reserved = reserve };
	r = cu.mem_map(va, (size_t)map_bytes, 0, h, 0);
	cu.mem_release(h); /* the mapping keeps the memory */
	if (r != CUDA_SUCCESS) {
		cuda_unimport(c);
		return cuda_fail(c, "cuMemMap", r);
	}
	c->map_bytes = (size_t)map_bytes;
	c->base = (void *)(uintptr_t)va;
	c->device = found;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = cu.mem_access(va, (size_t)map_bytes, &acc, 1);
	if (r != CUDA_SUCCESS) {
		cuda_unimport(c);
		return cuda_fail(c, "cuMemSetAccess", r);
	}
	return 0;
}
