/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA driver at run time (driver.h). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "driver.h"
#include "../seterr.h"

static struct kvq_driver drv;
static int drv_status;                          /* 0, or -ENODEV once loading failed */
static char drv_reason[KVQ_DRIVER_MSG_MAX];     /* why drv_status < 0 */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static const struct {
	const char *name;
	size_t off;
} drv_calls[] = {
#define DRV_CALL(name, version) { #name, offsetof(struct kvq_driver, name) },
	KVQ_DRIVER_CALLS(DRV_CALL)
#undef DRV_CALL
};

static int drv_errno(CUresult r)
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

int kvq_driver_fail(const char *what, CUresult r, char *err, size_t len)
{
	const char *name = NULL, *text = NULL;

	/* the names come from the driver: none when it never loaded */
	if (drv.cuGetErrorName)
		drv.cuGetErrorName(r, &name);
	if (drv.cuGetErrorString)
		drv.cuGetErrorString(r, &text);
	if (name)
		kvq_seterr(err, len, "%s: %s (%s)", what, name, text ? text : "no description");
	else
		kvq_seterr(err, len, "%s: CUDA error %d", what, (int)r);
	return drv_errno(r);
}

/* Why the runtime could not reach a driver, in words an admin can act on. */
static void drv_explain_runtime(cudaError_t e)
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
				kvq_seterr(drv_reason, sizeof drv_reason, "no CUDA driver (libcuda.so.1 not found)");
			else
				kvq_seterr(drv_reason, sizeof drv_reason, "no CUDA driver (%s)", d);
			return;
		}
		dlclose(h);
		kvq_seterr(drv_reason, sizeof drv_reason, "CUDA driver present but unusable: %s (%s)",
			   cudaGetErrorName(e), cudaGetErrorString(e));
		return;
	}
	if (e == cudaErrorInsufficientDriver) {
		kvq_seterr(drv_reason, sizeof drv_reason,
			   "CUDA driver %d.%d is older than the runtime %d.%d built in (%s)", dv / 1000,
			   dv % 1000 / 10, rt / 1000, rt % 1000 / 10, cudaGetErrorName(e));
		return;
	}
	kvq_seterr(drv_reason, sizeof drv_reason, "CUDA runtime: %s (%s)", cudaGetErrorName(e),
		   cudaGetErrorString(e));
}

static void drv_load(void)
{
	CUresult r;

	drv_status = -ENODEV;
	for (size_t i = 0; i < sizeof drv_calls / sizeof drv_calls[0]; i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		void **slot = (void **)((char *)&drv + drv_calls[i].off);
		cudaError_t e;

		e = cudaGetDriverEntryPointByVersion(drv_calls[i].name, slot, KVQ_DRIVER_ABI, cudaEnableDefault,
						     &q);
		if (e != cudaSuccess) {
			drv_explain_runtime(e);
			return;
		}
		if (q != cudaDriverEntryPointSuccess || !*slot) {
			kvq_seterr(drv_reason, sizeof drv_reason, "CUDA driver lacks %s (ABI %d.%d)%s",
				   drv_calls[i].name, KVQ_DRIVER_ABI / 1000, KVQ_DRIVER_ABI % 1000 / 10,
				   q == cudaDriverEntryPointVersionNotSufficent ? ": driver too old" : "");
			return;
		}
	}
	/* a driver that cannot initialise is no usable driver: -ENODEV too */
	r = drv.cuInit(0);
	if (r != CUDA_SUCCESS) {
		kvq_driver_fail("cuInit", r, drv_reason, sizeof drv_reason);
		return;
	}
	drv_status = 0;
}

int kvq_driver_load(const struct kvq_driver **ret_driver, char *err, size_t len)
{
	pthread_once(&drv_once, drv_load);
	if (drv_status < 0) {
		kvq_seterr(err, len, "%s", drv_reason);
		return drv_status;
	}
	*ret_driver = &drv;
	return 0;
}

void kvq_driver_pool_prop(CUmemAllocationProp *ret_prop, int device)
{
	memset(ret_prop, 0, sizeof *ret_prop);
	ret_prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	ret_prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ret_prop->location.id = device;
	ret_prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

int kvq_driver_granularity(int device, CUmemAllocationGranularity_flags which, size_t *ret_bytes, char *err,
			   size_t len)
{
	CUmemAllocationProp prop;
	size_t g = 0;
	CUresult r;

	kvq_driver_pool_prop(&prop, device);
	r = drv.cuMemGetAllocationGranularity(&g, &prop, which);
	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuMemGetAllocationGranularity", r, err, len);
	if (g == 0) {
		kvq_seterr(err, len, "cuMemGetAllocationGranularity: 0");
		return -EIO;
	}
	*ret_bytes = g;
	return 0;
}

int kvq_driver_map(CUmemGenericAllocationHandle h, size_t bytes, size_t align, int device,
		   struct kvq_driver_map *ret_map, char *err, size_t len)
{
	struct kvq_driver_map m = { .bytes = bytes };
	CUmemAccessDesc acc;
	CUresult r;

	if (align == 0 || bytes > SIZE_MAX - (align - 1)) {
		kvq_seterr(err, len, "cannot map %zu bytes at an alignment of %zu", bytes, align);
		return -EINVAL;
	}
	m.reserved = (bytes + align - 1) / align * align;
	r = drv.cuMemAddressReserve(&m.va, m.reserved, align, 0, 0);
	if (r != CUDA_SUCCESS)
		return kvq_driver_fail("cuMemAddressReserve", r, err, len);
	r = drv.cuMemMap(m.va, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		drv.cuMemAddressFree(m.va, m.reserved);
		return kvq_driver_fail("cuMemMap", r, err, len);
	}
	memset(&acc, 0, sizeof acc);
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = device;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = drv.cuMemSetAccess(m.va, bytes, &acc, 1);
	if (r != CUDA_SUCCESS) {
		kvq_driver_unmap(&m);
		return kvq_driver_fail("cuMemSetAccess", r, err, len);
	}
	*ret_map = m;
	return 0;
}

void kvq_driver_unmap(struct kvq_driver_map *map)
{
	if (map->va) {
		drv.cuMemUnmap(map->va, map->bytes);
		drv.cuMemAddressFree(map->va, map->reserved);
	}
	memset(map, 0, sizeof *map);
}
