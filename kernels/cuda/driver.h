/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API for every program of the tree that calls it (the
 * daemon's cuda backend, libkvq's import of a cuda pool): one table of
 * entry points, one mapping of driver errors to the tree's codes, one way
 * to map a pool's allocation.  Plain C, no kernels.
 *
 * libcuda is never linked (docs/DESIGN.md, "One build runs with or without
 * a GPU driver"): a program that needs libcuda.so.1 does not even start
 * where there is no driver.  The entry points come at run time from
 * cudaGetDriverEntryPointByVersion of the statically linked cudart (the
 * unversioned call is deprecated in CUDA 13), asked for at one ABI version,
 * KVQ_DRIVER_ABI, that matches the PFN_*_vNNNN types of the table.
 */
#ifndef KVQ_CUDA_DRIVER_H
#define KVQ_CUDA_DRIVER_H

#include <stddef.h>

#include <cuda.h>
#include <cudaTypedefs.h>

/* Driver ABI of the table: CUDA 12.0 (drivers 525 and later provide it;
 * cudart 13 itself needs a 580 driver). */
#define KVQ_DRIVER_ABI 12000

/* Room for a reason or a driver error in the callers' messages. */
#define KVQ_DRIVER_MSG_MAX 256

/*
 * The entry points, one row each: the driver's name and the version of
 * its PFN_ type in cudaTypedefs.h (the newest at or below KVQ_DRIVER_ABI).
 * struct kvq_driver has a member of that name; a driver that lacks one of
 * them is refused as a whole, so every member is callable once loaded.
 */
#define KVQ_DRIVER_CALLS(X)                                                                                \
	X(cuGetErrorName, 6000)                                                                            \
	X(cuGetErrorString, 6000)                                                                          \
	X(cuInit, 2000)                                                                                    \
	X(cuDriverGetVersion, 2020)                                                                        \
	X(cuDeviceGetCount, 2000)                                                                          \
	X(cuDeviceGet, 2000)                                                                               \
	X(cuDeviceGetName, 2000)                                                                           \
	X(cuDeviceGetUuid, 11040)                                                                          \
	X(cuDeviceGetAttribute, 2000)                                                                      \
	X(cuDeviceTotalMem, 3020)                                                                          \
	X(cuDevicePrimaryCtxRetain, 7000)                                                                  \
	X(cuDevicePrimaryCtxRelease, 11000)                                                                \
	X(cuCtxSetCurrent, 4000)                                                                           \
	X(cuCtxPushCurrent, 4000)                                                                          \
	X(cuCtxPopCurrent, 4000)                                                                           \
	X(cuCtxSynchronize, 2000)                                                                          \
	X(cuMemGetAllocationGranularity, 10020)                                                            \
	X(cuMemCreate, 10020)                                                                              \
	X(cuMemExportToShareableHandle, 10020)                                                             \
	X(cuMemImportFromShareableHandle, 10020)                                                           \
	X(cuMemRelease, 10020)                                                                             \
	X(cuMemAddressReserve, 10020)                                                                      \
	X(cuMemAddressFree, 10020)                                                                         \
	X(cuMemMap, 10020)                                                                                 \
	X(cuMemUnmap, 10020)                                                                               \
	X(cuMemSetAccess, 10020)                                                                           \
	X(cuMemcpyHtoD, 3020)                                                                              \
	X(cuMemHostRegister, 6050)                                                                         \
	X(cuMemHostUnregister, 4000)                                                                       \
	X(cuStreamCreate, 2000)                                                                            \
	X(cuStreamDestroy, 4000)                                                                           \
	X(cuStreamSynchronize, 2000)                                                                       \
	X(cuMemcpyDtoHAsync, 3020)                                                                         \
	X(cuMemcpyHtoDAsync, 3020)                                                                         \
	X(cuMemcpy2DAsync, 3020)

/* cuda.h renames some entry points (cuMemcpyHtoD is cuMemcpyHtoD_v2): a
 * member is declared and called through the same macro, so both agree. */
struct kvq_driver {
#define KVQ_DRIVER_MEMBER(name, version) PFN_##name##_v##version name;
	KVQ_DRIVER_CALLS(KVQ_DRIVER_MEMBER)
#undef KVQ_DRIVER_MEMBER
};

/*
 * The driver, its entry points taken and cuInit(0) called once per process
 * (thread-safe).  Returns 0 and *ret_driver; else -ENODEV, every time,
 * with the reason in err ("no CUDA driver (libcuda.so.1 not found)", a
 * driver older than the runtime built in, an entry point it lacks, cuInit's
 * error).  No context is made.
 */
int kvq_driver_load(const struct kvq_driver **ret_driver, char *err, size_t len);

/*
 * A driver error as the tree reports it: "what: CUDA_ERROR_X (text)" into
 * err (kvq_seterr), and the code: -ENOMEM, -EINVAL, -EOPNOTSUPP, -ENODEV
 * (no such device), else -EIO.
 */
int kvq_driver_fail(const char *what, CUresult r, char *err, size_t len);

/* A pool's allocation: pinned memory on device, exportable as a POSIX file
 * descriptor.  The properties cuMemCreate and the granularity query take.
 * The calls below need a loaded driver (kvq_driver_load). */
void kvq_driver_pool_prop(CUmemAllocationProp *ret_prop, int device);

/* The granularity (which: CU_MEM_ALLOC_GRANULARITY_MINIMUM or _RECOMMENDED)
 * of a pool's allocation on device; 0 and *ret_bytes (never 0), or the
 * driver's error (-EIO when it says 0). */
int kvq_driver_granularity(int device, CUmemAllocationGranularity_flags which, size_t *ret_bytes, char *err,
			   size_t len);

/* An allocation mapped into the current context's address space. */
struct kvq_driver_map {
	CUdeviceptr va;                 /* start of the reserved range, where the allocation is mapped */
	size_t bytes;                   /* mapped from va */
	size_t reserved;                /* the range: bytes rounded up to the alignment */
};

/*
 * Reserves a range for bytes of allocation h aligned to align (a
 * granularity), maps h at its start (cuMemMap maps from offset 0 only) and
 * gives device read/write access to it, in the current context.  The
 * mapping holds its own reference to h: the caller may release h after.
 * Returns 0 and *ret_map, or the driver's error (kvq_driver_fail) with
 * nothing left reserved or mapped.
 */
int kvq_driver_map(CUmemGenericAllocationHandle h, size_t bytes, size_t align, int device,
		   struct kvq_driver_map *ret_map, char *err, size_t len);

/* Undoes kvq_driver_map (in a context of the same device); map is zeroed. */
void kvq_driver_unmap(struct kvq_driver_map *map);

#endif
