/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host backend: a pool is a sealed memfd.
 *
 * Seals: F_SEAL_SHRINK and F_SEAL_GROW so that no client's ftruncate can
 * change the size under the others (a shrink would make every other
 * mapping SIGBUS); F_SEAL_SEAL so that no client can add F_SEAL_WRITE or
 * F_SEAL_FUTURE_WRITE and lock every other worker out of writing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "seterr.h"

#define HOST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* The kernel keeps at most 249 bytes of a memfd name. */
#define HOST_NAME_MAX 249

static uint64_t host_page(void)
{
	long p = sysconf(_SC_PAGESIZE);

	return p > 0 ? (uint64_t)p : 4096;
}

static int host_total(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	long pages = sysconf(_SC_PHYS_PAGES);

	if (pages <= 0) {
		kvq_seterr(err, len, "host: cannot read the size of physical memory");
		return -EIO;
	}
	*ret_bytes = (uint64_t)pages * host_page();
	return 0;
}

static int host_granularity(int device, uint64_t *ret_bytes, char *err, size_t len)
{
	*ret_bytes = host_page();
	return 0;
}

/* Makes an empty sealed memfd: proves that memfd_create and sealing work
 * here (seccomp filters and old kernels refuse them). */
static int host_probe(int device, char *reason, size_t len)
{
	uint64_t total = 0;
	int fd, e;

	fd = memfd_create("kvq-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		e = errno;
		kvq_seterr(reason, len, "memfd_create: %s", strerror(e));
		return -e;
	}
	if (fcntl(fd, F_ADD_SEALS, HOST_SEALS) < 0) {
		e = errno;
		close(fd);
		kvq_seterr(reason, len, "memfd sealing: %s", strerror(e));
		return -e;
	}
	close(fd);
	if (host_total(device, &total, reason, len) < 0)
		return -EIO;
	kvq_seterr(reason, len, "sealed memfd pools in host memory (%llu MiB)",
		   (unsigned long long)(total >> 20));
	return 0;
}

/* *ret_mem for the sealed memfd fd of bytes, mapped by the daemon; fd
 * closed on failure. */
static int host_map(int fd, uint64_t bytes, struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	void *map = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e;

	if (map == MAP_FAILED) {
		e = errno;
		kvq_seterr(err, len, "host: mmap of %llu bytes: %s", (unsigned long long)bytes, strerror(e));
		close(fd);
		return -e;
	}
	memset(ret_mem, 0, sizeof *ret_mem);
	ret_mem->backend = &kvq_backend_host;
	ret_mem->fd = fd;
	ret_mem->size = bytes;
	ret_mem->map = map;
	ret_mem->device = 0;
	return 0;
}

static int host_create(uint64_t size, int device, const char *label, struct kvq_backend_mem *ret_mem,
		       char *err, size_t len)
{
	char name[HOST_NAME_MAX + 1];
	uint64_t bytes, total;
	int fd, e;

	if (kvq_backend_round(size, host_page(), &bytes) < 0 || bytes > (uint64_t)INT64_MAX ||
	    bytes > (uint64_t)SIZE_MAX) {
		kvq_seterr(err, len, "host: pool of %llu bytes is too large", (unsigned long long)size);
		return -EFBIG;
	}
	/* fallocate below would fill RAM page by page before failing */
	if (host_total(device, &total, err, len) == 0 && bytes > total) {
		kvq_seterr(err, len, "host: pool of %llu MiB exceeds physical memory (%llu MiB)",
			   (unsigned long long)(bytes >> 20), (unsigned long long)(total >> 20));
		return -ENOMEM;
	}
	/* shows as /memfd:kvq-pool:NAME in /proc/PID/maps of every worker */
	snprintf(name, sizeof name, "kvq-pool:%s", label);
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		e = errno;
		kvq_seterr(err, len, "host: memfd_create: %s", strerror(e));
		return -e;
	}
	if (ftruncate(fd, (off_t)bytes) < 0) {
		e = errno;
		kvq_seterr(err, len, "host: ftruncate to %llu bytes: %s", (unsigned long long)bytes, strerror(e));
		goto fail;
	}
	/*
	 * Allocate every page now, charged to the daemon: a pool that does not
	 * fit fails here with a message instead of SIGBUS or an OOM kill in a
	 * worker that touches a block later.
	 */
	while ((e = fallocate(fd, 0, 0, (off_t)bytes) < 0 ? errno : 0) == EINTR)
		;       /* a signal for the daemon's loop; allocated pages stay */
	if (e && e != EOPNOTSUPP) {
		kvq_seterr(err, len, "host: cannot reserve %llu bytes of host memory: %s",
			   (unsigned long long)bytes, strerror(e));
		goto fail;
	}
	if (fcntl(fd, F_ADD_SEALS, HOST_SEALS) < 0) {
		e = errno;
		kvq_seterr(err, len, "host: sealing the memfd: %s", strerror(e));
		goto fail;
	}
	return host_map(fd, bytes, ret_mem, err, len);
fail:
	close(fd);
	return -e;
}

static int host_adopt(int fd, uint64_t size, int device, struct kvq_backend_mem *ret_mem, char *err, size_t len)
{
	struct stat st;
	int seals, e;

	if (fstat(fd, &st) < 0) {
		e = errno;
		kvq_seterr(err, len, "host: %s", strerror(e));
		goto fail;
	}
	seals = fcntl(fd, F_GET_SEALS);
	e = EINVAL;
	if (seals < 0 || (seals & HOST_SEALS) != HOST_SEALS) {
		kvq_seterr(err, len, "host: the memory is not a sealed memfd");
		goto fail;
	}
	if ((uint64_t)st.st_size != size) {
		kvq_seterr(err, len, "host: memory of %llu bytes, %llu recorded", (unsigned long long)st.st_size,
			   (unsigned long long)size);
		goto fail;
	}
	return host_map(fd, size, ret_mem, err, len);
fail:
	close(fd);
	return -e;
}

static void host_destroy(struct kvq_backend_mem *mem)
{
	if (mem->map)
		munmap(mem->map, (size_t)mem->size);
	if (mem->fd >= 0)
		close(mem->fd);
	mem->map = NULL;
	mem->fd = -1;
}

static int host_write(struct kvq_backend_mem *mem, uint64_t off, const void *src, size_t len, char *err,
		      size_t errlen)
{
	memcpy((uint8_t *)mem->map + off, src, len);
	return 0;
}

const struct kvq_backend kvq_backend_host = {
	.name = "host",
	.compiled = 1,
	.probe = host_probe,
	.granularity = host_granularity,
	.total_memory = host_total,
	.create = host_create,
	.adopt = host_adopt,
	.destroy = host_destroy,
	.write = host_write,
};
