/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver at run time (kernels/cuda/driver.h): driver errors as the
 * tree's codes and messages, the arguments the mapping refuses before any
 * driver call, and loading: where libcuda.so.1 is absent, -ENODEV with the
 * reason every time; where a driver loads, every entry point of the table;
 * where a device is usable, an allocation mapped, written through the
 * mapping, read back with cudart and unmapped (skipped elsewhere).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/driver.h"
#include "../tap.h"
#include "../libcuda.h"

/* Before the driver is loaded: the code from the result alone, the number
 * in the message (the driver names results once it is there). */
static void test_errors_unloaded(void)
{
	static const struct {
		CUresult r;
		int code;
	} map[] = {
		{ CUDA_ERROR_OUT_OF_MEMORY, -ENOMEM },   { CUDA_ERROR_INVALID_VALUE, -EINVAL },
		{ CUDA_ERROR_NOT_SUPPORTED, -EOPNOTSUPP }, { CUDA_ERROR_NO_DEVICE, -ENODEV },
		{ CUDA_ERROR_INVALID_DEVICE, -ENODEV },  { CUDA_ERROR_LAUNCH_FAILED, -EIO },
		{ CUDA_ERROR_UNKNOWN, -EIO },
	};
	char err[KVQ_DRIVER_MSG_MAX], want[KVQ_DRIVER_MSG_MAX];

	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		int rc = kvq_driver_fail("cuMemMap", map[i].r, err, sizeof err);

		snprintf(want, sizeof want, "cuMemMap: CUDA error %d", (int)map[i].r);
		ok(rc == map[i].code && strcmp(err, want) == 0, "CUresult %d: %d, \"%s\"", (int)map[i].r, rc, err);
	}
	ok(kvq_driver_fail("cuInit", CUDA_ERROR_NO_DEVICE, NULL, 0) == -ENODEV, "no message buffer: the code only");
}

/* Refused before any driver call: nothing reserved, *ret_map untouched. */
static void test_map_arguments(void)
{
	struct kvq_driver_map m, poison;
	char err[KVQ_DRIVER_MSG_MAX];

	memset(&poison, 0xab, sizeof poison);
	m = poison;
	ok(kvq_driver_map(1, 4096, 0, 0, &m, err, sizeof err) == -EINVAL && !memcmp(&m, &poison, sizeof m),
	   "map at alignment 0: -EINVAL (%s)", err);
	ok(kvq_driver_map(1, SIZE_MAX - 100, 4096, 0, &m, err, sizeof err) == -EINVAL &&
	   !memcmp(&m, &poison, sizeof m), "map of a size that cannot be rounded up: -EINVAL (%s)", err);
}

/* An allocation of the pools' kind, mapped and written through the map. */
static void test_map_device(const struct kvq_driver *cu)
{
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop;
	struct kvq_driver_map m;
	char err[KVQ_DRIVER_MSG_MAX];
	uint32_t in[1024], out[1024];
	size_t g = 0, bytes;
	CUcontext ctx;
	CUdevice dev;
	int n = 0, rc;

	if (cu->cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 1 || cu->cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
		ok(1, "mapping # SKIP no CUDA device");
		return;
	}
	rc = kvq_driver_granularity(0, CU_MEM_ALLOC_GRANULARITY_MINIMUM, &g, err, sizeof err);
	if (!ok(rc == 0 && g > 0, "granularity of device 0: %zu KiB (%s)", g >> 10, rc ? err : "ok"))
		return;
	if (!ok(cu->cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cu->cuCtxSetCurrent(ctx) == CUDA_SUCCESS,
		"primary context of device 0 current"))
		return;
	/* cuMemMap maps whole granules */
	bytes = 3 * g;
	kvq_driver_pool_prop(&prop, 0);
	if (!ok(cu->cuMemCreate(&h, bytes, &prop, 0) == CUDA_SUCCESS, "cuMemCreate of 3 granules")) {
		cu->cuDevicePrimaryCtxRelease(dev);
		return;
	}
	rc = kvq_driver_map(h, bytes, g, 0, &m, err, sizeof err);
	cu->cuMemRelease(h);
	if (!ok(rc == 0 && m.va && m.va % g == 0 && m.bytes == bytes && m.reserved == bytes,
		"mapped %zu bytes (%s)", bytes, rc ? err : "ok")) {
		cu->cuDevicePrimaryCtxRelease(dev);
		return;
	}
	for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
		in[i] = (uint32_t)(i * 2654435761u);
	memset(out, 0, sizeof out);
	ok(cu->cuMemcpyHtoD(m.va + 2 * g, in, sizeof in) == CUDA_SUCCESS &&
	   cudaMemcpy(out, (void *)(uintptr_t)(m.va + 2 * g), sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess &&
	   !memcmp(in, out, sizeof in), "written through the driver, read back through cudart, past 2 granules");
	kvq_driver_unmap(&m);
	ok(m.va == 0 && m.bytes == 0 && m.reserved == 0, "unmapped");
	cu->cuDevicePrimaryCtxRelease(dev);
}

int main(void)
{
	const struct kvq_driver *cu = NULL, *sentinel = (const struct kvq_driver *)&cu;
	char err[KVQ_DRIVER_MSG_MAX] = "", again[KVQ_DRIVER_MSG_MAX] = "";
	int rc, present = libcuda_present();

	test_errors_unloaded();
	test_map_arguments();

	cu = sentinel;
	rc = kvq_driver_load(&cu, err, sizeof err);
	diag("libcuda.so.1 %s; load: %d (%s)", present ? "loads" : "absent", rc, rc ? err : "ok");
	if (rc < 0) {
		ok(rc == -ENODEV && err[0] && cu == sentinel, "load fails with -ENODEV and a reason, nothing returned");
		if (!present)
			ok(strcmp(err, "no CUDA driver (libcuda.so.1 not found)") == 0,
			   "without a driver the reason names libcuda.so.1");
		else
			ok(1, "the reason names libcuda.so.1 # SKIP a driver is here, unusable: %s", err);
		ok(kvq_driver_load(&cu, again, sizeof again) == rc && !strcmp(again, err) && cu == sentinel,
		   "loaded once: the same failure again");
		ok(1, "entry points # SKIP no usable driver");
		ok(1, "mapping # SKIP no usable driver");
		return done_testing();
	}
	ok(cu != sentinel && cu != NULL, "loaded");
#define CHECK_CALL(name, version) ok(cu->name != NULL, "entry point %s", #name);
	KVQ_DRIVER_CALLS(CHECK_CALL)
#undef CHECK_CALL
	rc = kvq_driver_fail("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY, err, sizeof err);
	ok(rc == -ENOMEM && strncmp(err, "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (", 36) == 0,
	   "with the driver, the result's name and text: %s", err);
	test_map_device(cu);
	return done_testing();
}
