/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd under a service manager of the test's own (tests/sdmgr.h), as under
 * kvqd.service and kvqd.socket, and daemon/sd.c's descriptor calls:
 *  - without a manager: nothing passed, no fd store, names checked by
 *    systemd's rule;
 *  - this program started by the manager ("api" and "two"), with memfds
 *    and sockets in the store: kvq_sd_fds_get() has each by name, at 3, 4,
 *    ..., close-on-exec, the environment unset; kvq_sd_fds_take() gives
 *    the last of a name, once; kvq_sd_fds_listen_socket() the socket
 *    unit's socket and not a stored kvq.* one, -E2BIG for two, -ENOENT
 *    once taken; kvq_sd_fdstore_add() and _remove() reach the store (a
 *    descriptor it holds is not stored twice); kvq_sd_fds_free() closes
 *    what nobody took.  The child reports its checks in a file;
 *  - kvqd, its --socket (as kvqd.service passes it) giving way to the
 *    passed socket: READY=1, a client's Hello through that socket, a
 *    stored descriptor it does not know closed and logged without
 *    breaking the start; SIGTERM ends it cleanly (STOPPING=1, exit 0)
 *    and leaves the store and the socket as they were; a second start,
 *    one after kill -9 and one with an empty store serve again;
 *  - the manager itself: a stored socket whose peer closed is dropped as
 *    systemd drops it, and nothing leaks a descriptor.
 * Skipped when kvqd is built without libsystemd.
 */
#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../sdmgr.h"
#include "kvq.h"
#include "sd.h"

#define WAIT_MS 10000
#define UNKNOWN_LOG "descriptor other.unknown from the service manager not used: closed"

/* the checks of a child the manager started, one "1 what" or "0 what" a line */
static FILE *child_out;

__attribute__((format(printf, 2, 3)))
static void check(bool cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(child_out, "%d ", cond);
	va_start(ap, fmt);
	vfprintf(child_out, fmt, ap);
	va_end(ap);
	fputc('\n', child_out);
}

static int memfd_with(const char *name, const char *text)
{
	int fd = memfd_create(name, MFD_CLOEXEC);

	if (fd >= 0 && write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Whether memfd fd holds text. */
static bool memfd_is(int fd, const char *text)
{
	char buf[64];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n < 0)
		return false;
	buf[n] = '\0';
	return !strcmp(buf, text);
}

static bool fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static bool bound_at(int fd, const char *path)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);

	return getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && !strcmp(sa.sun_path, path);
}

/* A listening Unix stream socket at path, or -1. */
static int listener(const char *path)
{
	int fd = sdmgr_socket(SOCK_STREAM, path);

	if (fd >= 0 && listen(fd, 4) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The "api" child: the store holds kvq.a twice ("first", "last"), kvq.b
 * and kvq.sock, a listening socket. */
static int child_api(const char *sock_path)
{
	static const char *const names[] = { SDMGR_SOCKET_NAME, "kvq.a", "kvq.a", "kvq.b", "kvq.sock" };
	struct kvq_sd_fds s;
	bool order, cloexec;
	int n, fd, a, c;

	n = kvq_sd_fds_get(&s);
	check(n == 5, "kvq_sd_fds_get: the 5 descriptors passed (%d)", n);
	check(!getenv("LISTEN_FDS") && !getenv("LISTEN_PID") && !getenv("LISTEN_FDNAMES"),
	      "kvq_sd_fds_get unsets LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES");
	order = cloexec = n == 5;
	for (int i = 0; i < n && i < 5; i++) {
		order = order && s.fd[i] == 3 + i && !strcmp(s.name[i], names[i]);
		cloexec = cloexec && (fcntl(s.fd[i], F_GETFD) & FD_CLOEXEC);
	}
	check(order, "at 3, 4, ... with their names, in the order passed");
	check(cloexec, "each close-on-exec");
	fd = kvq_sd_fds_listen_socket(&s);
	check(fd == 3 && bound_at(fd, sock_path), "kvq_sd_fds_listen_socket: the socket unit's (%d)", fd);
	check(kvq_sd_fds_take(&s, SDMGR_SOCKET_NAME) == -1, "taken: its slot is empty");
	n = kvq_sd_fds_listen_socket(&s);
	check(n == -ENOENT, "then -ENOENT: a listening socket named kvq.* is not the control socket (%d)", n);
	a = kvq_sd_fds_take(&s, "kvq.a");
	check(a == 5 && memfd_is(a, "last"), "kvq_sd_fds_take: the last descriptor of a name passed twice (%d)", a);
	check(kvq_sd_fds_take(&s, "kvq.a") == -1 && kvq_sd_fds_take(&s, "kvq.none") == -1,
	      "kvq_sd_fds_take: a name once; -1 for one not passed");
	check(kvq_sd_fdstore_available(), "kvq_sd_fdstore_available under a manager");
	c = memfd_with("kvq.c", "c");
	check(kvq_sd_fdstore_add("kvq.c", c) == 0 && fd_open(c), "kvq_sd_fdstore_add: 0, the descriptor still ours");
	check(kvq_sd_fdstore_add("kvq.a", a) == 0, "kvq_sd_fdstore_add of a descriptor the store holds: 0");
	check(kvq_sd_fdstore_remove("kvq.b") == 0, "kvq_sd_fdstore_remove: 0");
	check(kvq_sd_fdstore_add("kvq:c", c) == -EINVAL && kvq_sd_fdstore_remove("") == -EINVAL,
	      "kvq_sd_fdstore_add, _remove: -EINVAL for a bad name under a manager too");
	kvq_sd_fds_free(&s);
	check(s.n == 0 && !fd_open(4) && !fd_open(6) && !fd_open(7), "kvq_sd_fds_free closes what nobody took");
	check(fd_open(3) && fd_open(a), "kvq_sd_fds_free leaves what was taken");
	check(kvq_sd_fds_get(&s) == 0 && s.n == 0, "kvq_sd_fds_get again: nothing");
	close(3);
	close(a);
	close(c);
	kvq_sd_ready("api checked");
	return 0;
}

/* The "two" child: besides kvqd.socket, a listening socket other.socket. */
static int child_two(void)
{
	struct kvq_sd_fds s;
	int r, fd;

	check(kvq_sd_fds_get(&s) >= 2, "kvq_sd_fds_get");
	r = kvq_sd_fds_listen_socket(&s);
	check(r == -E2BIG && s.fd[0] == 3 && s.fd[s.n - 1] >= 0,
	      "kvq_sd_fds_listen_socket: -E2BIG for two sockets, nothing taken (%d)", r);
	fd = kvq_sd_fds_take(&s, "other.socket");
	r = kvq_sd_fds_listen_socket(&s);
	check(fd >= 0 && r == 3, "the other taken by name: the socket unit's is the one (%d)", r);
	kvq_sd_fds_free(&s);
	close(fd);
	close(r);
	kvq_sd_ready("two checked");
	return 0;
}

static int child(int argc, char **argv)
{
	int r;

	child_out = fopen(argv[2], "w");
	if (!child_out)
		return 1;
	if (!strcmp(argv[1], "api"))
		r = argc == 4 ? child_api(argv[3]) : 1;
	else
		r = child_two();
	return fclose(child_out) || r ? 1 : 0;
}

/* Reports a child's checks as this test's; returns their number. */
static int child_results(const char *path)
{
	char line[512];
	FILE *f = fopen(path, "r");
	int n = 0;

	for (; f && fgets(line, sizeof(line), f); n++) {
		line[strcspn(line, "\n")] = '\0';
		ok(line[0] == '1', "%s", line + 2);
	}
	if (f)
		fclose(f);
	unlink(path);
	return n;
}

/* Whether process pid holds a memfd of that name. */
static bool holds_memfd(pid_t pid, const char *name)
{
	char dir[64], path[64 + sizeof(((struct dirent *)0)->d_name)], link[256], want[128];
	struct dirent *e;
	bool found = false;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "/memfd:%s ", name);
	d = opendir(dir);
	while (d && (e = readdir(d))) {
		ssize_t n;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		found = found || !strncmp(link, want, strlen(want));
	}
	if (d)
		closedir(d);
	return found;
}

static bool exited_0(int st)
{
	return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_no_manager(void)
{
	struct kvq_sd_fds s;
	char name[300];

	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDNAMES");
	unsetenv("NOTIFY_SOCKET");
	ok(kvq_sd_fds_get(&s) == 0 && s.n == 0, "no manager: kvq_sd_fds_get finds nothing");
	ok(kvq_sd_fds_listen_socket(&s) == -ENOENT && kvq_sd_fds_take(&s, "kvq.a") == -1,
	   "no manager: no socket, no descriptor of a name");
	kvq_sd_fds_free(&s);
	ok(!kvq_sd_fdstore_available(), "no manager: no fd store");
	ok(kvq_sd_fdstore_add("kvq.pool.a-1 b_2", 0) == -ENOTCONN && kvq_sd_fdstore_remove("kvq.books") == -ENOTCONN,
	   "no manager: kvq_sd_fdstore_add, _remove: -ENOTCONN");
	memset(name, 'x', 255);
	name[255] = '\0';
	ok(kvq_sd_fdstore_add(name, 0) == -ENOTCONN, "255 characters are a name");
	name[255] = 'x';
	name[256] = '\0';
	ok(kvq_sd_fdstore_add(name, 0) == -EINVAL, "256 are not");
	ok(kvq_sd_fdstore_add("", 0) == -EINVAL, "nor the empty name");
	ok(kvq_sd_fdstore_add("kvq:a", 0) == -EINVAL, "nor one with ':'");
	ok(kvq_sd_fdstore_add("kvq.a\n", 0) == -EINVAL && kvq_sd_fdstore_add("kvq.\t", 0) == -EINVAL &&
	   kvq_sd_fdstore_add("kvq.\x7f", 0) == -EINVAL, "nor one with a control character");
	ok(kvq_sd_fdstore_add("kvq.\xc3\xa9", 0) == -EINVAL, "nor one beyond ASCII");
	ok(kvq_sd_fdstore_remove("a:b") == -EINVAL, "kvq_sd_fdstore_remove checks the name too");
}

/* Starts this program as the manager's service in mode, then reports
 * its checks. */
static void run_child(struct sdmgr *m, const char *mode, int n_checks)
{
	char exe[PATH_MAX], results[128];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *argv[] = { exe, (char *)mode, results, m->sock_path, NULL };
	int st;

	exe[n > 0 ? n : 0] = '\0';
	snprintf(results, sizeof(results), "%s/%s.checks", m->dir, mode);
	ok(sdmgr_start(m, exe, argv, NULL) > 0, "%s: started with %zu stored descriptors", mode, sdmgr_count(m));
	ok(sdmgr_wait_ready(m, WAIT_MS) == 0, "%s: READY=1 (STATUS=%s)", mode, m->status);
	st = sdmgr_wait(m, WAIT_MS);
	ok(exited_0(st), "%s: exited 0 (%#x)", mode, st);
	ok(child_results(results) == n_checks, "%s: its %d checks ran", mode, n_checks);
}

static void test_api(struct sdmgr *m)
{
	char path[128];
	int sp[2];

	snprintf(path, sizeof(path), "%s/own.sock", m->dir);
	ok(sdmgr_store_add(m, "kvq.a", memfd_with("kvq.a", "first")) == 0 &&
	   sdmgr_store_add(m, "kvq.a", memfd_with("kvq.a", "last")) == 0 &&
	   sdmgr_store_add(m, "kvq.b", memfd_with("kvq.b", "b")) == 0 && sdmgr_store_add(m, "kvq.sock", listener(path)) == 0,
	   "store: kvq.a twice, kvq.b, kvq.sock");
	run_child(m, "api", 17);
	ok(sdmgr_count(m) == 4 && sdmgr_count_name(m, "kvq.b") == 0 && sdmgr_count_name(m, "kvq.a") == 2,
	   "store: kvq.b removed, kvq.a not stored twice (%zu stored)", sdmgr_count(m));
	ok(sdmgr_find(m, "kvq.c") >= 0 && memfd_is(sdmgr_find(m, "kvq.c"), "c"), "store: kvq.c as the child wrote it");
	ok(sdmgr_find(m, "kvq.a") >= 0 && memfd_is(sdmgr_find(m, "kvq.a"), "last"), "store: kvq.a's last still last");

	snprintf(path, sizeof(path), "%s/other.sock", m->dir);
	ok(sdmgr_store_add(m, "other.socket", listener(path)) == 0, "store: a second listening socket");
	run_child(m, "two", 3);

	ok(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0 && sdmgr_store_add(m, "kvq.peer", sp[0]) == 0,
	   "store: a connected socket");
	close(sp[1]);
	ok(sdmgr_pump(m) >= 0 && sdmgr_count_name(m, "kvq.peer") == 0, "manager: dropped once its peer closed");
	sdmgr_flush(m);
	ok(sdmgr_count(m) == 0, "manager: flushed");
}

/* One start of kvqd: READY=1, a client served through the passed socket,
 * the unknown stored descriptor closed. */
static bool kvqd_start(struct sdmgr *m, const char *bin, char **argv, const char *log, const char *what)
{
	kvq_client *c = NULL;
	pid_t pid = sdmgr_start(m, bin, argv, log);
	int r;

	if (!ok(pid > 0, "%s: kvqd started (%d)", what, (int)pid))
		return false;
	r = sdmgr_wait_ready(m, WAIT_MS);
	if (!ok(r == 0, "%s: READY=1 (%d), STATUS=%s", what, r, m->status))
		return false;
	r = kvq_client_connect(m->sock_path, "sd", &c);
	ok(r == 0, "%s: a client's Hello through the passed socket (%d)", what, r);
	kvq_client_free(c);
	ok(!holds_memfd(pid, "other.unknown"), "%s: the stored other.unknown closed before READY=1", what);
	return true;
}

static void test_kvqd(struct sdmgr *m)
{
	char bin[256], conf[128], log[128], unused[128];
	char *argv[] = { bin, "--config", conf, "--socket", unused, "--backend", "host", "--foreground", NULL };
	int st;

	test_daemon_bin(bin, sizeof(bin));
	snprintf(conf, sizeof(conf), "%s/kvqd.conf", m->dir);
	snprintf(log, sizeof(log), "%s/kvqd.log", m->dir);
	snprintf(unused, sizeof(unused), "%s/unused.sock", m->dir);
	ok(test_daemon_conf(conf, "host", "info", NULL) == 0, "kvqd.conf written");
	ok(sdmgr_store_add(m, "other.unknown", memfd_with("other.unknown", "?")) == 0, "store: other.unknown");

	for (int i = 1; i <= 2; i++) {
		char what[32];

		snprintf(what, sizeof(what), "start %d", i);
		if (!kvqd_start(m, bin, argv, log, what))
			return;
		ok(access(unused, F_OK) < 0, "%s: --socket gave way to the passed socket", what);
		st = sdmgr_stop(m, WAIT_MS);
		ok(exited_0(st) && m->stopping, "%s: SIGTERM: STOPPING=1, exit 0 (%#x)", what, st);
		ok(sdmgr_count(m) == 1 && sdmgr_find(m, "other.unknown") >= 0,
		   "%s: the store as it was (%zu stored)", what, sdmgr_count(m));
		ok(access(m->sock_path, F_OK) == 0, "%s: the socket unit's socket file stays", what);
	}
	ok(sdmgr_log_lines(log, UNKNOWN_LOG) == 2, "kvqd logged \"" UNKNOWN_LOG "\" at each start");

	if (!kvqd_start(m, bin, argv, log, "start 3"))
		return;
	st = sdmgr_kill9(m, WAIT_MS);
	ok(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "start 3: kill -9 (%#x)", st);
	ok(sdmgr_count(m) == 1, "start 3: the store as it was");
	if (!kvqd_start(m, bin, argv, log, "start 4, after kill -9"))
		return;
	ok(exited_0(sdmgr_stop(m, WAIT_MS)), "start 4: exit 0");

	sdmgr_flush(m);
	if (!kvqd_start(m, bin, argv, log, "start 5, the store empty"))
		return;
	ok(exited_0(sdmgr_stop(m, WAIT_MS)) && sdmgr_count(m) == 0, "start 5: exit 0, nothing stored");
	ok(sdmgr_log_lines(log, "<3>") == 0, "kvqd logged no error");
}

int main(int argc, char **argv)
{
	struct sdmgr m;
	int fds0, r;

	if (argc >= 3 && (!strcmp(argv[1], "api") || !strcmp(argv[1], "two")))
		return child(argc, argv);
#ifndef HAVE_SYSTEMD
	printf("1..0 # SKIP kvqd is built without libsystemd\n");
	return 0;
#endif
	fds0 = sdmgr_count_fds("/proc/self/fd");
	test_no_manager();
	r = sdmgr_init(&m, "sd");
	if (!ok(r == 0, "manager: notify socket, listening socket (%d)", r))
		return done_testing();
	test_api(&m);
	test_kvqd(&m);
	sdmgr_fini(&m);
	r = sdmgr_count_fds("/proc/self/fd");
	ok(r == fds0, "no descriptor leaked (%d open, %d at start)", r, fds0);
	return done_testing();
}
