/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Starting a real kvqd for the integration and GPU tests: a private temp
 * directory with a small config (create on attach, 256 MiB budget, 8 MiB per
 * created pool), the socket inside it, the daemon from $top_builddir (or
 * $KVQ_TEST_KVQD, to test an installed or debugged one), and a wait until
 * the socket accepts connections.
 */
#ifndef KVQ_TEST_DAEMON_H
#define KVQ_TEST_DAEMON_H

#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* When set, the RLIMIT_NOFILE (soft and hard) the next kvqd starts with. */
__attribute__((unused))
static rlim_t test_daemon_nofile;

/* The kvqd to test: $KVQ_TEST_KVQD, else $top_builddir/daemon/kvqd. */
__attribute__((unused))
static void test_daemon_bin(char *bin, size_t binlen)
{
	const char *top = getenv("top_builddir"), *env_bin = getenv("KVQ_TEST_KVQD");

	if (env_bin)
		snprintf(bin, binlen, "%s", env_bin);
	else
		snprintf(bin, binlen, "%s/daemon/kvqd", top ? top : ".");
}

/* Writes the tests' kvqd.conf to path: the backend, create on attach, 256
 * MiB budget (unless extra sets memory_budget), 8 MiB per created pool
 * (unless extra sets create_capacity),
 * log_level (NULL: warning, debug with $KVQ_TEST_VERBOSE) and extra lines
 * for its [kvqd] section (NULL for none).  Returns 0 or -1. */
__attribute__((unused))
static int test_daemon_conf(const char *path, const char *backend, const char *log_level, const char *extra)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	if (!log_level)
		log_level = getenv("KVQ_TEST_VERBOSE") ? "debug" : "warning";
	fprintf(f, "[kvqd]\nbackend = %s\n%screate_on_attach = yes\n%slog_level = %s\n%s", backend,
		extra && strstr(extra, "memory_budget =") ? "" : "memory_budget = 256M\n",
		extra && strstr(extra, "create_capacity =") ? "" : "create_capacity = 8M\n", log_level,
		extra ? extra : "");
	return fclose(f) ? -1 : 0;
}

/* Starts kvqd with the given backend ("host" or "cuda") and extra lines for
 * its [kvqd] section (NULL for none); fills dir (a new temp directory named
 * after tag), sock and bin.  Returns the daemon's pid, or -1 when it could
 * not start or did not listen within 5 s. */
__attribute__((unused))
static pid_t test_daemon_start_conf(const char *backend, const char *tag, const char *extra, char *dir,
				    size_t dirlen, char *sock, size_t socklen, char *bin, size_t binlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char conf[256];
	pid_t pid;

	snprintf(dir, dirlen, "/tmp/kvqd-%s.XXXXXX", tag);   /* mkdtemp's template */
	if (!mkdtemp(dir))
		return -1;
	snprintf(sock, socklen, "%s/kvqd.sock", dir);
	snprintf(conf, sizeof(conf), "%s/kvqd.conf", dir);
	if (test_daemon_conf(conf, backend, NULL, extra) < 0)
		return -1;
	test_daemon_bin(bin, binlen);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct rlimit rl = { test_daemon_nofile, test_daemon_nofile };

		if (test_daemon_nofile && setrlimit(RLIMIT_NOFILE, &rl) < 0)
			_exit(126);
		/* a test that dies (an assertion, a sanitizer) takes its kvqd with
		 * it: none is left holding the test's output open */
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() == 1)
			_exit(125);
		execl(bin, bin, "--config", conf, "--socket", sock, "--backend", backend, "--foreground",
		      (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	/* poll until the socket accepts: no fixed sleep */
	for (int i = 0; i < 500; i++) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), st;

		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(fd);
			return pid;
		}
		if (fd >= 0)
			close(fd);
		if (waitpid(pid, &st, WNOHANG) == pid)
			return -1;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* test_daemon_start_conf without extra lines. */
__attribute__((unused))
static pid_t test_daemon_start(const char *backend, const char *tag, char *dir, size_t dirlen, char *sock,
			       size_t socklen, char *bin, size_t binlen)
{
	return test_daemon_start_conf(backend, tag, NULL, dir, dirlen, sock, socklen, bin, binlen);
}

/* Stops the daemon pid started with test_daemon_start_conf and removes
 * its config and directory dir. */
__attribute__((unused))
static void test_daemon_stop(pid_t pid, const char *dir)
{
	char path[256];

	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	snprintf(path, sizeof(path), "%s/kvqd.conf", dir);
	unlink(path);
	rmdir(dir);
}

/* kvqctl ARGS... ($KVQ_TEST_KVQCTL, else $top_builddir's) against the kvqd
 * of socket sock: its exit status, its output (stderr with it, the last
 * newlines cut) in out[len]. */
__attribute__((unused))
static int test_daemon_ctl(const char *sock, char *out, size_t len, const char *args)
{
	const char *top = getenv("top_builddir"), *env = getenv("KVQ_TEST_KVQCTL");
	char cmd[1024];
	size_t n = 0;
	FILE *f;
	int st;

	snprintf(cmd, sizeof cmd, "%s%s --socket %s %s 2>&1", env ? env : top ? top : ".", env ? "" : "/kvqctl/kvqctl",
		 sock, args);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	n = fread(out, 1, len - 1, f);
	while (n > 0 && out[n - 1] == '\n')
		n--;
	out[n] = 0;
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The resident set of process pid in KiB (VmRSS), or -1. */
__attribute__((unused))
static long test_rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

#ifdef KVQ_TEST_CUDA
#include <cuda_runtime_api.h>

/* The cuda variant of a daemon test (KVQ_TEST_CUDA): where no GPU is
 * usable, prints TAP's skip plan and returns true (the test then returns
 * 0); else fixes the KV splits at one (attention that does not depend on
 * the batch or the device's size) and returns false. */
static inline bool test_cuda_skip(void)
{
	int ndev = 0;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		printf("1..0 # SKIP no usable GPU\n");
		return true;
	}
	setenv("KVQ_CUDA_SPLITS", "1", 1);
	return false;
}
#endif

#endif
