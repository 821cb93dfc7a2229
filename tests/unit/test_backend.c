/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pool memory backends (daemon/backend.h).  Host: a pool made by the
 * "daemon" (this process) is passed with SCM_RIGHTS to a forked "worker"
 * that maps it, reads the daemon's pattern and writes its own, and cannot
 * resize or reseal it; the daemon sees the worker's bytes.  CUDA: on a
 * machine without a driver every call fails with a reason and "auto" picks
 * host; where a GPU is usable a 64 MiB pool is made and checked (skipped,
 * not passed, elsewhere).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "../tap.h"
#include "../libcuda.h"

#define MiB (1ull << 20)
#define HOST_POOL (8 * MiB)
#define CUDA_POOL (64 * MiB)

__attribute__((format(printf, 1, 2)))
static void skip(const char *fmt, ...)
{
	va_list ap;

	printf("ok %d # SKIP ", ++tap_n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static uint8_t pattern(uint64_t i, uint8_t salt)
{
	return (uint8_t)((i * 2654435761u) >> 13) ^ salt;
}

static int cloexec(int fd)
{
	int f = fcntl(fd, F_GETFD);

	return f >= 0 && (f & FD_CLOEXEC);
}

/* ---------------------------------------------------- SCM_RIGHTS */

static int send_fd(int sock, int fd)
{
	char byte = 'F';
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof u.buf };
	struct cmsghdr *c;

	memset(&u, 0, sizeof u);
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1 ? 0 : -1;
}

static int recv_fd(int sock)
{
	char byte;
	struct iovec iov = { .iov_base = &byte, .iov_len = 1 };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof u.buf };
	struct cmsghdr *c;
	int fd = -1;

	/* as libkvq does: the received descriptor must not leak into exec'd children */
	if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&msg);
	if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int)))
		return -1;
	memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

/* What the worker saw, sent back to the parent, which alone prints TAP. */
struct worker_report {
	int got_fd, fd_cloexec, mapped, pattern_ok;
	int shrink_errno, grow_errno, addseal_errno, futureseal_errno;
	int seals;
	long long size_after;
	int map_alive;
};

static int ftruncate_errno(int fd, off_t len)
{
	return ftruncate(fd, len) == 0 ? 0 : errno;
}

static int addseal_errno(int fd, int seals)
{
	return fcntl(fd, F_ADD_SEALS, seals) == 0 ? 0 : errno;
}

/* The worker: maps the pool it is sent, checks the daemon's pattern in the
 * first half, writes its own in the second, tries to resize and reseal. */
static void worker(int sock, uint64_t size)
{
	struct worker_report r = { 0 };
	struct stat st;
	uint8_t *m = MAP_FAILED;
	int fd = recv_fd(sock);

	r.got_fd = fd >= 0;
	if (fd < 0)
		goto out;
	r.fd_cloexec = cloexec(fd);
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	r.mapped = m != MAP_FAILED;
	if (!r.mapped)
		goto out;
	r.pattern_ok = 1;
	for (uint64_t i = 0; i < size / 2; i++)
		if (m[i] != pattern(i, 0x5a)) {
			r.pattern_ok = 0;
			break;
		}
	for (uint64_t i = size / 2; i < size; i++)
		m[i] = pattern(i, 0xc3);

	r.shrink_errno = ftruncate_errno(fd, 4096);
	r.grow_errno = ftruncate_errno(fd, (off_t)size * 2);
	r.addseal_errno = addseal_errno(fd, F_SEAL_WRITE);
	r.futureseal_errno = addseal_errno(fd, F_SEAL_FUTURE_WRITE);
	r.seals = fcntl(fd, F_GET_SEALS);
	r.size_after = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
	/* a shrink that got through would make this SIGBUS */
	m[size - 1] = pattern(size - 1, 0xc3);
	r.map_alive = m[size - 1] == pattern(size - 1, 0xc3) && m[0] == pattern(0, 0x5a);
out:
	if (write(sock, &r, sizeof r) != (ssize_t)sizeof r)
		_exit(3);
	if (m != MAP_FAILED)
		munmap(m, size);
	if (fd >= 0)
		close(fd);
	_exit(0);
}

/* ---------------------------------------------------- host */

static void test_host_share(void)
{
	struct kvq_backend_mem mem;
	struct worker_report r;
	char err[KVQ_BACKEND_MSG_MAX] = "";
	uint8_t *m;
	int sv[2], status = -1, rc, ok_child, seals;
	pid_t pid;

	rc = kvq_backend_mem_create(&kvq_backend_host, HOST_POOL, 0, "test", &mem, err, sizeof err);
	if (!ok(rc == 0, "host: create a %llu MiB pool (%s)", HOST_POOL / MiB, rc ? err : "ok"))
		return;
	ok(mem.backend == &kvq_backend_host && mem.size == HOST_POOL && mem.map && mem.fd >= 0,
	   "host: size %llu, mapped, fd %d", (unsigned long long)mem.size, mem.fd);
	ok(cloexec(mem.fd), "host: the pool's fd is close-on-exec");
	seals = fcntl(mem.fd, F_GET_SEALS);
	ok(seals == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), "host: sealed against shrink, grow and reseal (%#x)",
	   seals);
	{
		char link[64], target[256] = "";
		ssize_t n;

		snprintf(link, sizeof link, "/proc/self/fd/%d", mem.fd);
		n = readlink(link, target, sizeof target - 1);
		if (n > 0)
			target[n] = '\0';
		ok(strncmp(target, "/memfd:kvq-pool:test", 20) == 0, "host: memfd named after the pool (%s)", target);
	}

	m = mem.map;
	for (uint64_t i = 0; i < mem.size / 2; i++)
		m[i] = pattern(i, 0x5a);

	if (!ok(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair"))
		goto out;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		worker(sv[1], mem.size);
	}
	close(sv[1]);
	ok(pid > 0 && send_fd(sv[0], mem.fd) == 0, "host: fd sent to the worker with SCM_RIGHTS");
	memset(&r, 0, sizeof r);
	rc = pid > 0 ? (int)read(sv[0], &r, sizeof r) : -1;
	close(sv[0]);
	if (pid > 0)
		waitpid(pid, &status, 0);
	ok_child = rc == (int)sizeof r && WIFEXITED(status) && WEXITSTATUS(status) == 0;
	ok(ok_child, "worker reported and exited cleanly (status %#x)", status);
	ok(r.got_fd && r.fd_cloexec, "worker: received the fd (close-on-exec)");
	ok(r.mapped && r.pattern_ok, "worker: mapped the pool and read the daemon's pattern");
	ok(r.shrink_errno == EPERM, "worker: ftruncate shrink fails with EPERM (%s)", strerror(r.shrink_errno));
	ok(r.grow_errno == EPERM, "worker: ftruncate grow fails with EPERM (%s)", strerror(r.grow_errno));
	ok(r.addseal_errno == EPERM && r.futureseal_errno == EPERM,
	   "worker: F_ADD_SEALS (write, future write) fails with EPERM (%s, %s)", strerror(r.addseal_errno),
	   strerror(r.futureseal_errno));
	ok(r.seals == seals, "worker: seals unchanged (%#x)", r.seals);
	ok(r.size_after == (long long)mem.size, "worker: size unchanged (%lld)", r.size_after);
	ok(r.map_alive, "worker: its mapping stays valid after the refused resizes");

	{
		int same = 1;

		for (uint64_t i = mem.size / 2; i < mem.size; i++)
			if (m[i] != pattern(i, 0xc3)) {
				same = 0;
				break;
			}
		ok(ok_child && same, "daemon: sees the worker's writes");
	}
	ok(ftruncate(mem.fd, 0) < 0 && errno == EPERM, "daemon: its own ftruncate is refused too");
	ok(fcntl(mem.fd, F_ADD_SEALS, 0) < 0 && errno == EPERM, "daemon: no seal can be added or changed");
out:
	kvq_backend_mem_destroy(&mem);
	ok(mem.fd == -1 && mem.map == NULL && mem.backend == NULL, "host: destroy leaves an empty object");
	kvq_backend_mem_destroy(&mem);
	kvq_backend_mem_destroy(NULL);
	ok(1, "destroy of an empty object and of NULL is harmless");
}

static void test_host_misc(void)
{
	char err[KVQ_BACKEND_MSG_MAX] = "", label[400];
	struct kvq_backend_mem mem, poison;
	uint64_t g = 0, total = 0, r = 0;
	long page = sysconf(_SC_PAGESIZE);
	int rc;

	rc = kvq_backend_host.probe(0, err, sizeof err);
	ok(rc == 0 && err[0], "host: probe (%s)", err);
	rc = kvq_backend_host.granularity(0, &g, err, sizeof err);
	ok(rc == 0 && g == (uint64_t)page, "host: granularity is the page size (%llu)", (unsigned long long)g);
	rc = kvq_backend_host.total_memory(0, &total, err, sizeof err);
	ok(rc == 0 && total > (64 << 20), "host: total memory %llu MiB", (unsigned long long)(total >> 20));

	memset(label, 'x', sizeof label - 1);
	label[sizeof label - 1] = '\0';
	rc = kvq_backend_mem_create(&kvq_backend_host, 5 * MiB + 1, 0, label, &mem, err, sizeof err);
	ok(rc == 0 && mem.size == 5 * MiB + (uint64_t)page,
	   "host: 5 MiB + 1 rounds up to a page (%llu), an overlong label is cut", (unsigned long long)mem.size);
	if (rc == 0)
		kvq_backend_mem_destroy(&mem);

	memset(&poison, 0xab, sizeof poison);
	mem = poison;
	rc = kvq_backend_mem_create(&kvq_backend_host, 0, 0, "zero", &mem, err, sizeof err);
	ok(rc == -EINVAL && memcmp(&mem, &poison, sizeof mem) == 0, "size 0: -EINVAL, object untouched (%s)", err);
	rc = kvq_backend_mem_create(&kvq_backend_host, UINT64_MAX - 1, 0, "huge", &mem, err, sizeof err);
	ok(rc < 0 && memcmp(&mem, &poison, sizeof mem) == 0, "size 2^64-2: %d, object untouched (%s)", rc, err);
	rc = kvq_backend_mem_create(&kvq_backend_host, 1ull << 50, 0, "too-much", &mem, err, sizeof err);
	ok(rc < 0 && memcmp(&mem, &poison, sizeof mem) == 0, "1 PiB of host memory: %d, object untouched (%s)", rc,
	   err);

	ok(kvq_backend_round(1, 4096, &r) == 0 && r == 4096, "round 1 -> 4096");
	ok(kvq_backend_round(4096, 4096, &r) == 0 && r == 4096, "round 4096 -> 4096");
	ok(kvq_backend_round(3 * MiB, 2 * MiB, &r) == 0 && r == 4 * MiB, "round 3 MiB to 2 MiB -> 4 MiB");
	ok(kvq_backend_round(10, 3, &r) == 0 && r == 12, "round 10 to 3 -> 12 (not a power of two)");
	r = 7;
	ok(kvq_backend_round(UINT64_MAX, 2 * MiB, &r) == -EOVERFLOW && r == 7, "round past 2^64: -EOVERFLOW");
	ok(kvq_backend_round(1, 0, &r) == -EINVAL, "round to granularity 0: -EINVAL");

	ok(kvq_backend_by_name("host") == &kvq_backend_host && kvq_backend_by_name("cuda") == &kvq_backend_cuda &&
	   !kvq_backend_by_name("auto") && !kvq_backend_by_name("CUDA") && !kvq_backend_by_name(NULL),
	   "by_name: host and cuda only");
}

/* ---------------------------------------------------- choice and CUDA */

static void test_pick_and_cuda(void)
{
	char why[KVQ_BACKEND_MSG_MAX] = "", err[KVQ_BACKEND_MSG_MAX] = "";
	const struct kvq_backend *b = NULL, *sentinel = (const struct kvq_backend *)&b;
	struct kvq_backend_mem mem, poison;
	int probe, rc, driver = libcuda_present();
	uint64_t g = 0;

	b = sentinel;
	ok(kvq_backend_pick("host", 0, &b, why, sizeof why) == 0 && b == &kvq_backend_host &&
	   strncmp(why, "host: ", 6) == 0, "pick host (%s)", why);
	b = sentinel;
	ok(kvq_backend_pick("gpu", 0, &b, why, sizeof why) == -EINVAL && b == sentinel && strstr(why, "gpu"),
	   "pick of an unknown name: -EINVAL (%s)", why);

	probe = kvq_backend_cuda.probe(0, err, sizeof err);
	diag("cuda backend %s; probe: %d (%s); libcuda.so.1 %s", kvq_backend_cuda.compiled ? "built" : "not built",
	     probe, err, driver ? "loads" : "absent");
	if (probe < 0) {
		ok(err[0] != '\0', "cuda: probe fails with a reason (%d: %s)", probe, err);
		if (!kvq_backend_cuda.compiled)
			ok(probe == -EOPNOTSUPP && strcmp(err, "built without CUDA") == 0, "cuda: built without CUDA");
		else if (!driver)
			ok(probe == -ENODEV && strcmp(err, "no CUDA driver (libcuda.so.1 not found)") == 0,
			   "cuda: without a driver the reason names libcuda.so.1");
		else
			skip("a driver is present here, but the device is not usable: %s", err);
		memset(&poison, 0xab, sizeof poison);
		mem = poison;
		err[0] = '\0';
		rc = kvq_backend_mem_create(&kvq_backend_cuda, CUDA_POOL, 0, "gpu", &mem, err, sizeof err);
		ok(rc == probe && err[0] && memcmp(&mem, &poison, sizeof mem) == 0,
		   "cuda: create fails the same way, object untouched (%d: %s)", rc, err);
		ok(kvq_backend_cuda.granularity(0, &g, err, sizeof err) == probe && g == 0,
		   "cuda: granularity fails the same way");
		ok(kvq_backend_cuda.total_memory(0, &g, err, sizeof err) == probe && g == 0,
		   "cuda: total memory fails the same way");
		b = sentinel;
		rc = kvq_backend_pick("cuda", 0, &b, why, sizeof why);
		ok(rc == probe && b == sentinel && strncmp(why, "cuda: ", 6) == 0,
		   "pick cuda: %d, no fallback (%s)", rc, why);
		b = sentinel;
		rc = kvq_backend_pick("auto", 0, &b, why, sizeof why);
		ok(rc == 0 && b == &kvq_backend_host && strncmp(why, "host: ", 6) == 0 && strstr(why, err),
		   "pick auto: host, with the reason (%s)", why);
		skip("no usable CUDA device: %s", err);
		skip("no usable CUDA device: pool size aligned to the granularity");
		skip("no usable CUDA device: exported fd valid and close-on-exec");
		return;
	}

	ok(1, "cuda: probe (%s)", err);
	b = sentinel;
	ok(kvq_backend_pick("auto", 0, &b, why, sizeof why) == 0 && b == &kvq_backend_cuda &&
	   strncmp(why, "cuda: ", 6) == 0, "pick auto: cuda (%s)", why);
	b = sentinel;
	ok(kvq_backend_pick("cuda", 0, &b, why, sizeof why) == 0 && b == &kvq_backend_cuda, "pick cuda");
	rc = kvq_backend_cuda.granularity(0, &g, err, sizeof err);
	ok(rc == 0 && g > 0, "cuda: granularity %llu KiB", (unsigned long long)(g >> 10));
	rc = kvq_backend_cuda.probe(1 << 20, err, sizeof err);
	ok(rc == -ENODEV, "cuda: device 1048576 does not exist (%s)", err);
	rc = kvq_backend_mem_create(&kvq_backend_cuda, CUDA_POOL + 1, 0, "gpu", &mem, err, sizeof err);
	if (!ok(rc == 0, "cuda: create a 64 MiB (+1 byte) pool (%s)", rc ? err : "ok")) {
		skip("no pool");
		skip("no pool");
		return;
	}
	ok(mem.size % g == 0 && mem.size >= CUDA_POOL + 1 && mem.size < CUDA_POOL + 1 + g && !mem.map,
	   "cuda: size %llu is the request rounded up to the granularity, no daemon mapping",
	   (unsigned long long)mem.size);
	ok(mem.fd >= 0 && fcntl(mem.fd, F_GETFD) >= 0 && cloexec(mem.fd), "cuda: exported fd %d valid and close-on-exec",
	   mem.fd);
	kvq_backend_mem_destroy(&mem);
	ok(mem.fd == -1 && mem.backend == NULL, "cuda: destroyed");
}

int main(void)
{
	test_host_misc();
	/* fork before any CUDA call: a child must not inherit a driver state */
	test_host_share();
	test_pick_and_cuda();
	return done_testing();
}
