/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pool memory backends: where a pool's bytes live and how they are shared.
 *
 * A backend creates one memory object per pool and hands out a file
 * descriptor for it; the daemon sends that descriptor to each worker with the
 * attach reply (SCM_RIGHTS) and touches KV bytes only for a pool's host
 * tier and remote tier (daemon/tiering.h, daemon/rtier.h: whole blocks,
 * copied through the mapping or a channel): it writes otherwise only a pool's codebooks (kernels/codebook.h), once, at its creation
 * (write).  Both backends serve the same layout (kernels/layout.h): only the
 * memory differs.
 *
 *  - host: a sealed memfd (memfd_create + ftruncate + F_SEAL_SHRINK |
 *    F_SEAL_GROW | F_SEAL_SEAL), fully allocated up front, mapped MAP_SHARED
 *    by the daemon.  The CPU kernels run on it.  Real, not a mock: CPU
 *    inference, CI, machines without a GPU.
 *  - cuda: device memory from cuMemCreate with POSIX file-descriptor handles,
 *    exported with cuMemExportToShareableHandle.  The driver is reached
 *    through cudaGetDriverEntryPointByVersion of the statically linked cudart
 *    (kernels/cuda/driver.h, shared with libkvq), never by linking libcuda,
 *    so one build starts with or without a driver.
 *
 * What an importer (libkvq) does with the descriptor and size it receives:
 *  - host: mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); close
 *    the fd once mapped if it wants.  ftruncate fails with EPERM (sealed), so
 *    no client can shrink the pool under the others (they would SIGBUS).
 *  - cuda (with a context current, e.g. the device's primary context):
 *    cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
 *    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); cuMemAddressReserve(&va,
 *    size, granularity, 0, 0) with the device's granularity (size is already
 *    a multiple of it); cuMemMap(va, size, 0, h, 0); cuMemRelease(h) (the
 *    mapping keeps the memory); cuMemSetAccess(va, size, {location = the
 *    pool's device, flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE}, 1).  Tear
 *    down with cuMemUnmap + cuMemAddressFree.  The fd can be closed after the
 *    import.  The importer's process needs no ptrace rights on the daemon
 *    (unlike pidfd_getfd); the device must not be in exclusive-process mode.
 *
 * The CUDA backend in the daemon: the first probe initialises the driver
 * once per process (cuInit through cudart); the daemon creates no CUDA
 * context (cuMemCreate needs none) and runs no kernels, so its device
 * footprint is its pools plus what the driver keeps for an initialised
 * process.  Figures: bench/RESULTS.md, "CUDA backend in the daemon".  The
 * one exception is a pool with codebooks: write retains the device's primary
 * context for the copy (a temporary mapping of the pool, cuMemcpyHtoD) and
 * releases it at once; and a cuda pool with a host tier or a remote tier,
 * whose channel (chan_open) holds that context, the pool mapped and the
 * tier (or the remote tier's staging, daemon/rstage.h) pinned for the
 * tier's life.
 *
 * Functions return 0 or a negative errno-style code; messages go into a
 * caller's buffer (library code never prints).
 */
#ifndef KVQD_BACKEND_H
#define KVQD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "blockref.h"

struct kvq_layout;

/* Room for a backend's reason or error message; longer ones are cut. */
#define KVQ_BACKEND_MSG_MAX 256

/* A pool's memory.  Fields are read by the daemon; only the backend that
 * made it changes them. */
struct kvq_backend_mem {
	const struct kvq_backend *backend;  /* NULL: empty (never created or destroyed) */
	int fd;            /* exportable descriptor, close-on-exec; the object owns it */
	uint64_t size;     /* bytes allocated: the request rounded up to the granularity */
	void *map;         /* the daemon's own mapping of all size bytes, or NULL (cuda) */
	int device;        /* CUDA device ordinal; 0 for host */
	uint64_t handle;   /* backend-private (cuda: CUmemGenericAllocationHandle) */
};

struct kvq_backend_chan;

/* One run of a block copy (struct kvq_backend chan_copy): len bytes at
 * byte pool_off of the pool and at host. */
struct kvq_backend_run {
	uint64_t pool_off;
	uint8_t *host;
	uint64_t len;
};

struct kvq_backend {
	const char *name;  /* "host" or "cuda" */
	int compiled;      /* 0: this build lacks it (cuda without KVQ_WITH_CUDA) */

	/* Whether the backend can serve device: 0, or a negative code with a
	 * one-line reason ("no CUDA driver (libcuda.so.1 not found)").  On
	 * success reason describes the device (name, memory). */
	int (*probe)(int device, char *reason, size_t len);

	/* Allocation granularity of device in bytes (host: the page size). */
	int (*granularity)(int device, uint64_t *ret_bytes, char *err, size_t len);

	/* Memory a budget given in percent refers to: the device's memory
	 * (cuda) or the machine's physical memory (host). */
	int (*total_memory)(int device, uint64_t *ret_bytes, char *err, size_t len);

	/* Allocates size bytes (rounded up to the granularity) on device; label
	 * names the memory where the kernel shows it (the pool name).  Fills
	 * *ret_mem and returns 0, or returns a negative code with err set and
	 * leaves *ret_mem untouched. */
	int (*create)(uint64_t size, int device, const char *label, struct kvq_backend_mem *ret_mem,
		      char *err, size_t len);

	/* Takes back memory create made in an earlier kvqd, whose exportable
	 * descriptor fd came back from the service manager (docs/DESIGN.md,
	 * "Restart"): fd is taken (closed on failure too), and must be size
	 * bytes on device (host: a sealed memfd of that size, mapped again;
	 * cuda: imported, cuMemImportFromShareableHandle).  Fills *ret_mem as
	 * create does, or returns a negative code with err set. */
	int (*adopt)(int fd, uint64_t size, int device, struct kvq_backend_mem *ret_mem, char *err, size_t len);

	/* Releases everything create made; the memory itself lives on while a
	 * worker still has it mapped or holds a descriptor. */
	void (*destroy)(struct kvq_backend_mem *mem);

	/* Copies src[len] to byte off of mem (inside its size: the caller
	 * checks), complete on return.  Returns 0, or a negative code with err
	 * set. */
	int (*write)(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
		     size_t errlen);

	/* The host tier's and the remote tier's copies of a pool the daemon
	 * does not map (NULL: a backend whose mem->map serves them).  chan_open, on the loop: what
	 * copies between mem and the host memory host[host_len] need (cuda:
	 * the device's primary context retained, the pool mapped in the
	 * daemon, host pinned with cuMemHostRegister, a stream); 0 and *ret,
	 * or a negative code with err set (the tier is then not started).
	 * chan_copy, on the copy thread: the n runs, to the host (to_host) or
	 * into the pool, complete on return.  chan_close, on the loop, after
	 * the last copy. */
	int (*chan_open)(struct kvq_backend_mem *mem, void *host, uint64_t host_len, struct kvq_backend_chan **ret,
			 char *err, size_t errlen);
	int (*chan_copy)(struct kvq_backend_chan *c, int to_host, const struct kvq_backend_run *runs, uint32_t n,
			 char *err, size_t errlen);
	void (*chan_close)(struct kvq_backend_chan *c);
};

extern const struct kvq_backend kvq_backend_host;
extern const struct kvq_backend kvq_backend_cuda;

/* The backend called name ("host", "cuda"), or NULL for any other name
 * ("auto" included: see kvq_backend_pick). */
const struct kvq_backend *kvq_backend_by_name(const char *name);

/*
 * Chooses the backend for name "auto", "host" or "cuda" and device.  "auto"
 * takes cuda when a driver and the device are usable, else host.  Returns 0
 * and *ret_backend, with a one-line reason the caller can log ("cuda: device
 * 0 NVIDIA H200, ..." or "host: no CUDA driver (libcuda.so.1 not found)");
 * -ENODEV (or the probe's code) when "cuda" is asked for and not usable, and
 * -EINVAL for an unknown name, each with the reason.
 */
int kvq_backend_pick(const char *name, int device, const struct kvq_backend **ret_backend, char *reason,
		     size_t len);

/* b->create with the common checks (size > 0, rounding without overflow). */
int kvq_backend_mem_create(const struct kvq_backend *b, uint64_t size, int device, const char *label,
			   struct kvq_backend_mem *ret_mem, char *err, size_t len);

/* b->adopt, fd closed when b has none (-EOPNOTSUPP). */
int kvq_backend_mem_adopt(const struct kvq_backend *b, int fd, uint64_t size, int device,
			  struct kvq_backend_mem *ret_mem, char *err, size_t len);

/* mem->backend->write with the bounds checked (-EINVAL outside mem). */
int kvq_backend_mem_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
			  size_t errlen);

/* Destroys mem through its backend and leaves it empty (fd -1, backend NULL);
 * accepts NULL and an empty mem. */
void kvq_backend_mem_destroy(struct kvq_backend_mem *mem);

/* The runs of block r's slices (L's layers) between the pool and a packed
 * record at rec laid out as kernels/blockrec.h says (kvq_blockrec_slice_at):
 * one per layer, into runs[L->layers].  What a channel copies for the host
 * tier and the remote tier. */
void kvq_backend_block_runs(const struct kvq_layout *L, struct kvq_block_ref r, uint8_t *rec,
			    struct kvq_backend_run *runs);

/* size rounded up to a multiple of granularity (a power of two or not);
 * -EOVERFLOW when that exceeds UINT64_MAX, -EINVAL for granularity 0. */
int kvq_backend_round(uint64_t size, uint64_t granularity, uint64_t *ret_size);

#endif
