/* SPDX-License-Identifier: Apache-2.0 */
/* Sealed memfds: see memfd.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memfd.h"

#define MEMFD_CHUNK (1u << 20)

__attribute__((format(printf, 4, 5)))
static int memfd_fail(int r, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return r;
}

/* Writes buf[n] to fd, all of it; 0 or -errno. */
static int write_all(int fd, const uint8_t *buf, size_t n)
{
	while (n) {
		ssize_t w = write(fd, buf, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		buf += w;
		n -= (size_t)w;
	}
	return 0;
}

int kvq_memfd_from_file(const char *path, uint64_t max, const char *name, int *ret_fd, char *err, size_t errlen)
{
	uint8_t *buf = NULL;
	uint64_t total = 0;
	int in, fd = -1, r;

	in = open(path, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return memfd_fail(-errno, err, errlen, "%s: %s", path, strerror(errno));
	buf = malloc(MEMFD_CHUNK);
	if (!buf) {
		r = memfd_fail(-ENOMEM, err, errlen, "%s: %s", path, strerror(ENOMEM));
		goto fail;
	}
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		r = memfd_fail(-errno, err, errlen, "memfd_create: %s", strerror(errno));
		goto fail;
	}
	for (;;) {
		ssize_t n = read(in, buf, MEMFD_CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = memfd_fail(-errno, err, errlen, "%s: %s", path, strerror(errno));
			goto fail;
		}
		if (n == 0)
			break;
		if ((uint64_t)n > max - total) {
			r = memfd_fail(-EFBIG, err, errlen, "%s: over %llu bytes", path, (unsigned long long)max);
			goto fail;
		}
		r = write_all(fd, buf, (size_t)n);
		if (r < 0) {
			memfd_fail(r, err, errlen, "%s: copying into a memfd: %s", path, strerror(-r));
			goto fail;
		}
		total += (uint64_t)n;
	}
	if (fcntl(fd, F_ADD_SEALS, KVQ_MEMFD_SEALS | F_SEAL_SEAL) < 0) {
		r = memfd_fail(-errno, err, errlen, "sealing the memfd: %s", strerror(errno));
		goto fail;
	}
	free(buf);
	close(in);
	*ret_fd = fd;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	free(buf);
	close(in);
	return r;
}

int kvq_memfd_check(int fd, uint64_t max, uint64_t *ret_size, char *err, size_t errlen)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) < 0)
		return memfd_fail(-EINVAL, err, errlen, "the descriptor cannot be examined: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return memfd_fail(-EINVAL, err, errlen, "the descriptor is not a regular file (a sealed memfd is needed)");
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return memfd_fail(-EINVAL, err, errlen, "the descriptor is not a memfd (F_GET_SEALS: %s)",
				  strerror(errno));
	if ((seals & KVQ_MEMFD_SEALS) != KVQ_MEMFD_SEALS)
		return memfd_fail(-EINVAL, err, errlen,
				  "the memfd is not sealed against writing, shrinking and growing (seals 0x%x)",
				  (unsigned)seals);
	if ((uint64_t)st.st_size > max)
		return memfd_fail(-E2BIG, err, errlen, "the memfd holds %llu bytes, at most %llu are taken",
				  (unsigned long long)st.st_size, (unsigned long long)max);
	*ret_size = (uint64_t)st.st_size;
	return 0;
}
