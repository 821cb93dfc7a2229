/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The service manager's side of systemd's protocols, so that a test runs a
 * real kvqd as kvqd.service and kvqd.socket would (Type=notify,
 * NotifyAccess=main, FileDescriptorStoreMax=) and the daemon's code takes
 * the same paths as under systemd:
 *  - a notify socket (NOTIFY_SOCKET) that reads READY=1, STOPPING=1 and
 *    STATUS=, and keeps the descriptors sent with FDSTORE=1 under their
 *    FDNAME= ("stored" without one) until FDSTOREREMOVE=1 drops that name
 *    or sdmgr_flush() empties the store (what `systemctl stop` does);
 *  - a listening socket at DIR/kvqd.sock, passed to every start as
 *    "kvqd.socket" ahead of the stored descriptors (LISTEN_FDS, LISTEN_PID,
 *    LISTEN_FDNAMES), the order systemd passes them in;
 *  - what systemd 252 does besides: messages count only from the main
 *    process, a descriptor already in the store (the same open file) is
 *    not stored twice, a stored descriptor that reports POLLHUP or POLLERR
 *    (a socket whose peer closed, the pidfd of a reaped process) is
 *    dropped unless it came with FDPOLL=0, and the store is bounded;
 *  - a manager that reads late (sdmgr_stall: its queue full), and reads
 *    again (sdmgr_pump_until) while the daemon sends what waited.
 * Every wait is a poll with a timeout; failures are returned as negative
 * errno, never aborted on.  Not for threaded tests: the child of fork()
 * calls setenv().
 */
#ifndef KVQ_TEST_SDMGR_H
#define KVQ_TEST_SDMGR_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SDMGR_STORE_MAX 4096              /* kvqd.service's FileDescriptorStoreMax= */
#define SDMGR_NAME_MAX 255                /* systemd's FDNAME_MAX */
#define SDMGR_MSG_MAX 4096                /* systemd's NOTIFY_BUFFER_MAX */
#define SDMGR_MSG_FDS 253                 /* SCM_MAX_FD: the most one message carries */
#define SDMGR_SOCKET_NAME "kvqd.socket"   /* kvqd.socket's FileDescriptorName= */

struct sdmgr_fd {
	int fd;
	bool poll;                        /* false: sent with FDPOLL=0 */
	char name[SDMGR_NAME_MAX + 1];
};

struct sdmgr {
	char dir[64];                     /* a private temp directory */
	char notify_path[108];
	char sock_path[108];              /* DIR/kvqd.sock */
	int notify_fd, listen_fd;
	pid_t pid;                        /* the last main process started */
	int pidfd;                        /* its pidfd while not reaped, else -1 */
	int wstatus;                      /* how it exited, once reaped */
	bool ready, stopping;             /* seen from it */
	char status[256];                 /* its last STATUS= */
	size_t n, cap;
	struct sdmgr_fd *store;
};

/* Whether a and b are the same open file: systemd's same_fd(), kcmp() and,
 * where that is refused, the inode and the file status flags (a device's
 * descriptors always differ). */
__attribute__((unused))
static bool sdmgr_same_fd(int a, int b)
{
	pid_t self = getpid();
	struct stat sa, sb;
	long r = syscall(SYS_kcmp, self, self, KCMP_FILE, a, b);

	if (r >= 0)
		return r == 0;
	if (fstat(a, &sa) < 0 || fstat(b, &sb) < 0)
		return false;
	if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino || ((sa.st_mode ^ sb.st_mode) & S_IFMT))
		return false;
	if (S_ISCHR(sa.st_mode) || S_ISBLK(sa.st_mode))
		return false;
	return fcntl(a, F_GETFL) == fcntl(b, F_GETFL);
}

/* systemd's fdname_is_valid(): the empty name is one. */
__attribute__((unused))
static bool sdmgr_name_valid(const char *name)
{
	size_t len = strlen(name);

	for (const char *p = name; *p; p++)
		if (*p < ' ' || *p > '~' || *p == ':')
			return false;
	return len <= SDMGR_NAME_MAX;
}

/* Stores fd under name, taking it; as systemd, a duplicate is closed and
 * counts as stored.  Returns 0, -EXFULL (fd closed) or -ENOMEM. */
__attribute__((unused))
static int sdmgr_store_fd(struct sdmgr *m, const char *name, int fd, bool do_poll)
{
	for (size_t i = 0; i < m->n; i++)
		if (sdmgr_same_fd(m->store[i].fd, fd)) {
			close(fd);
			return 0;
		}
	if (m->n == SDMGR_STORE_MAX) {
		close(fd);
		return -EXFULL;
	}
	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		struct sdmgr_fd *s = realloc(m->store, cap * sizeof(*s));

		if (!s) {
			close(fd);
			return -ENOMEM;
		}
		m->store = s;
		m->cap = cap;
	}
	m->store[m->n].fd = fd;
	m->store[m->n].poll = do_poll;
	snprintf(m->store[m->n].name, sizeof(m->store[m->n].name), "%s", name);
	m->n++;
	return 0;
}

/* Closes and drops store entry i, keeping the order of the others. */
__attribute__((unused))
static void sdmgr_drop(struct sdmgr *m, size_t i)
{
	close(m->store[i].fd);
	memmove(&m->store[i], &m->store[i + 1], (m->n - i - 1) * sizeof(m->store[0]));
	m->n--;
}

/* Preloads the store as an earlier start would have, taking fd; a name
 * outside systemd's rule is -EINVAL (fd closed), no fd -EBADF.  Returns
 * as sdmgr_store_fd(). */
__attribute__((unused))
static int sdmgr_store_add(struct sdmgr *m, const char *name, int fd)
{
	if (fd < 0)
		return -EBADF;
	if (!sdmgr_name_valid(name)) {
		close(fd);
		return -EINVAL;
	}
	return sdmgr_store_fd(m, name, fd, true);
}

/* The number of stored descriptors. */
__attribute__((unused))
static size_t sdmgr_count(const struct sdmgr *m)
{
	return m->n;
}

/* The number stored under name. */
__attribute__((unused))
static size_t sdmgr_count_name(const struct sdmgr *m, const char *name)
{
	size_t k = 0;

	for (size_t i = 0; i < m->n; i++)
		k += !strcmp(m->store[i].name, name);
	return k;
}

/* The last descriptor stored under name (still the store's), or -1. */
__attribute__((unused))
static int sdmgr_find(const struct sdmgr *m, const char *name)
{
	for (size_t i = m->n; i-- > 0;)
		if (!strcmp(m->store[i].name, name))
			return m->store[i].fd;
	return -1;
}

/* Closes every stored descriptor, as `systemctl stop` does. */
__attribute__((unused))
static void sdmgr_flush(struct sdmgr *m)
{
	while (m->n)
		sdmgr_drop(m, m->n - 1);
}

/* Drops what hung up, as systemd's watch on each stored descriptor does
 * (it runs at once there, here at every pump). */
__attribute__((unused))
static int sdmgr_poll_store(struct sdmgr *m)
{
	struct pollfd *p;
	size_t k = 0;

	if (!m->n)
		return 0;
	p = calloc(m->n, sizeof(*p));
	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++)
		p[i].fd = m->store[i].poll ? m->store[i].fd : -1;
	if (poll(p, m->n, 0) < 0) {
		free(p);
		return -errno;
	}
	for (size_t i = 0; i < m->n; i++)
		if (!(p[i].revents & (POLLHUP | POLLERR)))
			m->store[k++] = m->store[i];
		else
			close(m->store[i].fd);
	m->n = k;
	free(p);
	return 0;
}

/* Acts on one message of the main process: its assignments, one a line;
 * takes the descriptors it stores (their slots in fds become -1). */
__attribute__((unused))
static void sdmgr_parse(struct sdmgr *m, char *msg, int *fds, size_t n_fds)
{
	const char *name = NULL;
	bool store = false, remove = false, do_poll = true;
	char *save = NULL;

	for (char *l = strtok_r(msg, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		if (!strcmp(l, "READY=1"))
			m->ready = true;
		else if (!strcmp(l, "STOPPING=1"))
			m->stopping = true;
		else if (!strncmp(l, "STATUS=", 7))
			snprintf(m->status, sizeof(m->status), "%s", l + 7);
		else if (!strcmp(l, "FDSTORE=1"))
			store = true;
		else if (!strcmp(l, "FDSTOREREMOVE=1"))
			remove = true;
		else if (!strcmp(l, "FDPOLL=0"))
			do_poll = false;
		else if (!name && !strncmp(l, "FDNAME=", 7))
			name = l + 7;
	}
	/* systemd ignores a bad name: removes nothing, stores as "stored" */
	if (name && !sdmgr_name_valid(name))
		name = NULL;
	if (remove) {
		for (size_t i = m->n; name && i-- > 0;)
			if (!strcmp(m->store[i].name, name))
				sdmgr_drop(m, i);
		return;
	}
	for (size_t i = 0; store && i < n_fds; i++) {
		sdmgr_store_fd(m, name ? name : "stored", fds[i], do_poll);
		fds[i] = -1;
	}
}

/* Reads one queued message.  Returns 1, 0 when none is queued, or a
 * negative errno.  One that is not the main process's, carries no
 * credentials or was truncated is dropped, as are descriptors that come
 * with a message that does not store them. */
__attribute__((unused))
static int sdmgr_recv(struct sdmgr *m)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * SDMGR_MSG_FDS)];
	} ctl;
	char buf[SDMGR_MSG_MAX + 1];
	struct iovec iov = { buf, SDMGR_MSG_MAX };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof(ctl) };
	struct ucred cred = { 0 };
	int fds[SDMGR_MSG_FDS];
	bool have_cred = false;
	size_t n_fds = 0;
	ssize_t len;

	len = recvmsg(m->notify_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (len < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_RIGHTS) {
			n_fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			memcpy(fds, CMSG_DATA(c), n_fds * sizeof(int));
		} else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(cred))) {
			memcpy(&cred, CMSG_DATA(c), sizeof(cred));
			have_cred = true;
		}
	}
	if (have_cred && cred.pid == m->pid && m->pid > 0 && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		buf[len] = '\0';
		sdmgr_parse(m, buf, fds, n_fds);
	}
	for (size_t i = 0; i < n_fds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return 1;
}

/* Reads every queued message, then drops what hung up.  Returns the
 * number read or a negative errno. */
__attribute__((unused))
static int sdmgr_pump(struct sdmgr *m)
{
	int r, k = 0;

	while ((r = sdmgr_recv(m)) > 0)
		k++;
	if (r < 0)
		return r;
	r = sdmgr_poll_store(m);
	return r < 0 ? r : k;
}

/* Reaps the main process after its pidfd said it exited. */
__attribute__((unused))
static int sdmgr_reap(struct sdmgr *m)
{
	int r = waitpid(m->pid, &m->wstatus, 0) == m->pid ? 0 : -errno;

	close(m->pidfd);
	m->pidfd = -1;
	return r;
}

__attribute__((unused))
static long sdmgr_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* Pumps messages until READY=1 came (ready) or the main process exited,
 * within timeout_ms.  Messages it sent before it exited are read before
 * this returns.  Returns 0, -ECHILD when it exited (before READY=1 if
 * ready), -ETIMEDOUT, or a negative errno. */
__attribute__((unused))
static int sdmgr_wait_for(struct sdmgr *m, int timeout_ms, bool ready)
{
	long deadline = sdmgr_now_ms() + timeout_ms;

	for (;;) {
		struct pollfd p[2] = { { .fd = m->notify_fd, .events = POLLIN }, { .fd = m->pidfd, .events = POLLIN } };
		long left = deadline - sdmgr_now_ms();
		int r = sdmgr_pump(m);

		if (r < 0)
			return r;
		if (ready && m->ready)
			return 0;
		if (m->pidfd < 0)
			return ready ? -ECHILD : 0;
		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(p, 2, (int)left) < 0 && errno != EINTR)
			return -errno;
		if (p[1].revents) {
			/* its last datagrams are queued by now: the loop reads them */
			r = sdmgr_reap(m);
			if (r < 0)
				return r;
		}
	}
}

/* Waits up to timeout_ms for READY=1 from the process last started.
 * Returns 0, -ECHILD (it exited first: wstatus says how), -ETIMEDOUT, or
 * a negative errno. */
__attribute__((unused))
static int sdmgr_wait_ready(struct sdmgr *m, int timeout_ms)
{
	return sdmgr_wait_for(m, timeout_ms, true);
}

/* Waits up to timeout_ms for the main process to exit, reading its
 * messages.  Returns its wait status, -ETIMEDOUT or a negative errno. */
__attribute__((unused))
static int sdmgr_wait(struct sdmgr *m, int timeout_ms)
{
	int r = sdmgr_wait_for(m, timeout_ms, false);

	return r < 0 ? r : m->wstatus;
}

/* Sends sig to the main process and waits for its exit; after timeout_ms
 * SIGKILL, as TimeoutStopSec= does.  Returns as sdmgr_wait(). */
__attribute__((unused))
static int sdmgr_signal(struct sdmgr *m, int sig, int timeout_ms)
{
	int r;

	if (m->pidfd < 0)
		return -ECHILD;
	if (kill(m->pid, sig) < 0)
		return -errno;
	r = sdmgr_wait(m, timeout_ms);
	if (r != -ETIMEDOUT || sig == SIGKILL)
		return r;
	kill(m->pid, SIGKILL);
	return sdmgr_wait(m, timeout_ms);
}

/* SIGTERM, as `systemctl stop` and `restart` send, then its exit and its
 * last messages.  Returns as sdmgr_wait(). */
__attribute__((unused))
static int sdmgr_stop(struct sdmgr *m, int timeout_ms)
{
	return sdmgr_signal(m, SIGTERM, timeout_ms);
}

/* SIGKILL, a crash: its exit and the messages it sent before. */
__attribute__((unused))
static int sdmgr_kill9(struct sdmgr *m, int timeout_ms)
{
	return sdmgr_signal(m, SIGKILL, timeout_ms);
}

/* The child of sdmgr_start(): the listening socket and the store at 3, 4,
 * ... and nothing else above stderr, the environment systemd sets, exec. */
__attribute__((noreturn, unused))
static void sdmgr_child(struct sdmgr *m, pid_t parent, const char *bin, char *const argv[], int log,
			const char *names)
{
	unsigned n = (unsigned)m->n + 1;
	char num[24];

	/* a test that dies takes its daemon with it */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(125);
	if (log >= 0 && dup2(log, STDERR_FILENO) < 0)
		_exit(126);
	/* first above every target, so that no dup2() below overwrites a
	 * source still to be moved; dup2() leaves its targets without
	 * FD_CLOEXEC */
	m->listen_fd = fcntl(m->listen_fd, F_DUPFD_CLOEXEC, 3 + n);
	for (size_t i = 0; i < m->n; i++)
		m->store[i].fd = fcntl(m->store[i].fd, F_DUPFD_CLOEXEC, 3 + n);
	if (m->listen_fd < 0 || dup2(m->listen_fd, 3) < 0)
		_exit(126);
	for (size_t i = 0; i < m->n; i++)
		if (m->store[i].fd < 0 || dup2(m->store[i].fd, 3 + (int)i + 1) < 0)
			_exit(126);
	close_range(3 + n, ~0U, 0);
	snprintf(num, sizeof(num), "%u", n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", names, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
	setenv("NOTIFY_SOCKET", m->notify_path, 1);
	unsetenv("WATCHDOG_PID");
	unsetenv("WATCHDOG_USEC");
	execv(bin, argv);
	fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
	_exit(127);
}

/* Starts bin with argv (argv[0] included, NULL-terminated) as the service's
 * main process, its stderr appended to log_path (NULL: the test's).
 * Returns its pid, -EBUSY while one runs, or a negative errno. */
__attribute__((unused))
static pid_t sdmgr_start(struct sdmgr *m, const char *bin, char *const argv[], const char *log_path)
{
	pid_t parent = getpid(), pid;
	int r, log = -1;
	char *names;
	size_t len;

	if (m->pidfd >= 0)
		return -EBUSY;
	/* what hung up since is gone before systemd would pass it */
	r = sdmgr_pump(m);
	if (r < 0)
		return r;
	len = sizeof(SDMGR_SOCKET_NAME);
	for (size_t i = 0; i < m->n; i++)
		len += strlen(m->store[i].name) + 1;
	names = malloc(len);
	if (!names)
		return -ENOMEM;
	len = (size_t)sprintf(names, "%s", SDMGR_SOCKET_NAME);
	for (size_t i = 0; i < m->n; i++)
		len += (size_t)sprintf(names + len, ":%s", m->store[i].name);
	if (log_path && (log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) < 0) {
		r = -errno;
		free(names);
		return r;
	}
	m->ready = m->stopping = false;
	m->status[0] = '\0';
	fflush(NULL);
	pid = fork();
	if (pid == 0)
		sdmgr_child(m, parent, bin, argv, log, names);
	r = pid < 0 ? -errno : 0;
	free(names);
	if (log >= 0)
		close(log);
	if (r < 0)
		return r;
	m->pid = pid;
	m->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (m->pidfd < 0) {
		r = -errno;
		kill(pid, SIGKILL);
		waitpid(pid, &m->wstatus, 0);
		return r;
	}
	return pid;
}

/* Kills a main process still running, empties the store, closes the
 * sockets and removes the directory with what the test left in it. */
__attribute__((unused))
static void sdmgr_fini(struct sdmgr *m)
{
	DIR *d;

	if (m->pidfd >= 0)
		sdmgr_kill9(m, 5000);
	sdmgr_flush(m);
	free(m->store);
	m->store = NULL;
	m->cap = 0;
	if (m->notify_fd >= 0)
		close(m->notify_fd);
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	m->notify_fd = m->listen_fd = -1;
	if (!m->dir[0])
		return;
	d = opendir(m->dir);
	for (struct dirent *e; d && (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlinkat(dirfd(d), e->d_name, 0);
	if (d)
		closedir(d);
	rmdir(m->dir);
	m->dir[0] = '\0';
}

/* A Unix socket of type bound at path (unlinked first), close-on-exec.
 * Returns it or a negative errno. */
__attribute__((unused))
static int sdmgr_socket(int type, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

/* A manager with an empty store in a new temp directory named after tag:
 * the notify socket (SO_PASSCRED, a large receive buffer as systemd's)
 * and the listening socket kvqd.socket would hold.  Returns 0 or a
 * negative errno (nothing left behind). */
__attribute__((unused))
static int sdmgr_init(struct sdmgr *m, const char *tag)
{
	int one = 1, rcvbuf = 8 << 20, r;

	*m = (struct sdmgr){ .notify_fd = -1, .listen_fd = -1, .pidfd = -1 };
	snprintf(m->dir, sizeof(m->dir), "/tmp/kvqd-%s.XXXXXX", tag);   /* mkdtemp's template */
	if (!mkdtemp(m->dir)) {
		m->dir[0] = '\0';
		return -errno;
	}
	snprintf(m->notify_path, sizeof(m->notify_path), "%s/notify", m->dir);
	snprintf(m->sock_path, sizeof(m->sock_path), "%s/kvqd.sock", m->dir);
	m->notify_fd = sdmgr_socket(SOCK_DGRAM | SOCK_NONBLOCK, m->notify_path);
	r = m->notify_fd;
	if (r >= 0 && (setsockopt(m->notify_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0 ||
		       setsockopt(m->notify_fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) < 0))
		r = -errno;
	if (r >= 0)
		r = m->listen_fd = sdmgr_socket(SOCK_STREAM, m->sock_path);
	if (r >= 0 && listen(m->listen_fd, SOMAXCONN) < 0)
		r = -errno;
	if (r < 0) {
		sdmgr_fini(m);
		return r;
	}
	return 0;
}

/* Descriptors open in the /proc/PID/fd directory dir. */
__attribute__((unused))
static int sdmgr_count_fds(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;

	for (struct dirent *e; d && (e = readdir(d));)
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

/* A process's start time (field 22 of /proc/PID/stat), 0 when gone: with
 * the pid, the name kvqd stores its pidfd under (sdmgr_pidfd_name). */
__attribute__((unused))
static unsigned long long sdmgr_start_time(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	/* past the command: fields 3.. ; the start time is the 20th of them */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
			 &start) != 1)
		return 0;
	return start;
}

/* The name of process pid's stored pidfd (daemon/procs.h) into buf. */
__attribute__((unused))
static void sdmgr_pidfd_name(char *buf, size_t len, pid_t pid)
{
	snprintf(buf, len, "kvq.pidfd.%d.%llu", (int)pid, sdmgr_start_time(pid));
}

/* The number stored under names that begin with prefix. */
__attribute__((unused))
static size_t sdmgr_count_prefix(const struct sdmgr *m, const char *prefix)
{
	size_t k = 0;

	for (size_t i = 0; i < m->n; i++)
		k += !strncmp(m->store[i].name, prefix, strlen(prefix));
	return k;
}

/* Pumps (the daemon sends what waited once there is room) until done(m,
 * arg) holds or timeout_ms passed.  Returns 0, -ETIMEDOUT, or a negative
 * errno. */
__attribute__((unused))
static int sdmgr_pump_until(struct sdmgr *m, int timeout_ms, bool (*done)(const struct sdmgr *, const void *),
			    const void *arg)
{
	long deadline = sdmgr_now_ms() + timeout_ms;

	for (;;) {
		struct pollfd p = { .fd = m->notify_fd, .events = POLLIN };
		int r = sdmgr_pump(m);

		if (r < 0)
			return r;
		if (done(m, arg))
			return 0;
		if (sdmgr_now_ms() >= deadline)
			return -ETIMEDOUT;
		if (poll(&p, 1, 20) < 0 && errno != EINTR)
			return -errno;
	}
}

/* A manager that reads late: fills the notify socket's receive queue with
 * datagrams of the test's own (the next pump reads and drops them: they
 * are not the main process's), so that the daemon's next message finds no
 * room.  Returns how many were queued, or a negative errno. */
__attribute__((unused))
static int sdmgr_stall(struct sdmgr *m)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), n = 0, r = 0;

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", m->notify_path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		r = -errno;
	while (r == 0 && n < 1000000) {
		if (send(fd, "STATUS=stalled", 14, MSG_DONTWAIT) < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				r = -errno;
			break;
		}
		n++;
	}
	close(fd);
	return r < 0 ? r : n;
}

/* How many lines of the log at path contain what. */
__attribute__((unused))
static int sdmgr_log_lines(const char *path, const char *what)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	int n = 0;

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return n;
}

#endif
