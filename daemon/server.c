/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd's server: the listening socket; accepting a connection (the peer's
 * identity and pidfd, a transport for its bytes, daemon/peer.h); each frame
 * through the request table (daemon/request.h) and its reply back; and the
 * end of a connection, whose lease goes now or once its exiting peer has
 * gone (daemon/state.h).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "peer.h"
#include "request.h"
#include "server.h"
#include "state.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59    /* Linux 4.13; older C libraries lack the name */
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

struct kvq_server {
	struct kvq_state st;
	struct event_base *base;
	int listen_fd;
	struct event *lev;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];   /* unlinked at exit when set */
	struct kvq_hist *latency;                                  /* one per row of kvq_requests[] */
};

static void conn_on_frame(kvq_peer *peer, const uint8_t *payload, size_t len, void *arg);
static void conn_on_closed(kvq_peer *peer, const char *why, void *arg);
static void conn_on_pidfd(evutil_socket_t fd, short what, void *arg);
static void srv_on_accept(evutil_socket_t fd, short what, void *arg);

static const struct kvq_peer_cb conn_cb = { conn_on_frame, conn_on_closed };

static kvq_server *server_of(const struct kvq_conn *c)
{
	return (kvq_server *)((char *)c->st - offsetof(kvq_server, st));
}

/* ---------------------------------------------------------------- connections */

static void conn_free(struct kvq_conn *c)
{
	if (c->pev)
		event_free(c->pev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	kvq_state_conn_free(c);
}

/*
 * Whether the peer is exiting or gone.  The pidfd turns readable once the
 * process has exited; before that, PF_EXITING in /proc/PID/stat says the
 * exit has begun (a killed process closes its files first).  The pid cannot
 * be reused meanwhile: an unreadable pidfd means it has not been reaped.
 */
static bool peer_dying(const struct kvq_conn *c)
{
	struct pollfd pfd = { .fd = c->pidfd, .events = POLLIN };
	char path[64], buf[1024], *p;
	unsigned long flags = 0;
	char state = 0;
	ssize_t n;
	int fd;

	if (poll(&pfd, 1, 0) > 0)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)c->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = 0;
	/* comm may hold blanks and ')': fields resume after the last ')' */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2)
		return false;
	return state == 'Z' || state == 'X' || (flags & 0x4 /* PF_EXITING */);
}

/* Ends a connection: the socket closes now; the lease goes now or when the
 * dying peer has exited. */
static void conn_close(struct kvq_conn *c, const char *why)
{
	kvq_log(LOG_DEBUG, "client %llu (pid %d): closed: %s", (unsigned long long)c->id, (int)c->pid, why);
	kvq_peer_free(c->peer);
	c->peer = NULL;
	if (c->lease && c->pidfd >= 0 && (kvq_lease_n_sealed(c->lease) || kvq_lease_n_open(c->lease)) &&
	    peer_dying(c)) {
		c->pev = event_new(server_of(c)->base, c->pidfd, EV_READ, conn_on_pidfd, c);
		if (c->pev && event_add(c->pev, NULL) == 0) {
			kvq_log(LOG_INFO, "client %llu: peer %d is exiting, lease kept until it has exited",
				(unsigned long long)c->id, (int)c->pid);
			kvq_state_conn_exiting(c);
			return;
		}
		kvq_log(LOG_WARNING, "client %llu: cannot watch pidfd, dropping the lease now",
			(unsigned long long)c->id);
	}
	conn_free(c);
}

static void conn_on_closed(kvq_peer *peer, const char *why, void *arg)
{
	conn_close(arg, why);
}

static void conn_on_pidfd(evutil_socket_t fd, short what, void *arg)
{
	struct kvq_conn *c = arg;

	kvq_log(LOG_INFO, "client %llu: peer %d exited, lease dropped", (unsigned long long)c->id, (int)c->pid);
	conn_free(c);
}

/* One frame of c: the request's reply is queued, its time counted. */
static void conn_on_frame(kvq_peer *peer, const uint8_t *payload, size_t len, void *arg)
{
	struct kvq_conn *c = arg;
	kvq_server *s = server_of(c);
	struct timespec t0, t1;
	struct kvq_reply r;
	uint8_t *buf = NULL;
	size_t n = 0, row = 0;
	int parsed;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	parsed = kvq_dispatch_frame(kvq_requests, kvq_requests_n, c, payload, len, &r, &row) == 0;
	if (kvq_frame_encode_alloc(&r.e, &buf, &n) < 0 || kvq_peer_queue(peer, buf, n, r.fd) < 0) {
		kvq_log(LOG_ERR, "client %llu: reply to request %llu cannot be encoded", (unsigned long long)c->id,
			(unsigned long long)r.e.id);
		r.close_after = true;
	}
	if (r.close_after)
		kvq_peer_close_after(peer);
	if (parsed) {
		clock_gettime(CLOCK_MONOTONIC, &t1);
		kvq_hist_observe(&s->latency[row],
				 (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	}
	kvq_reply_fini(&r);
}

static void srv_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	kvq_server *s = arg;
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	gid_t g[KVQ_CONN_MAX_GROUPS];
	socklen_t glen = sizeof(g);
	struct kvq_conn *c;
	char label[32];
	int fd;

	fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			kvq_log(LOG_WARNING, "accept: %s", strerror(errno));
		return;
	}
	if (s->st.n_conns >= KVQ_SERVER_MAX_CONNS) {
		kvq_log(LOG_WARNING, "refusing a connection: %u connections open", s->st.n_conns);
		close(fd);
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		kvq_log(LOG_WARNING, "SO_PEERCRED: %s", strerror(errno));
		close(fd);
		return;
	}
	if (kvq_state_conn_new(&s->st, &c) < 0) {
		close(fd);
		return;
	}
	c->uid = cred.uid;
	c->pid = cred.pid;
	c->groups[0] = cred.gid;
	c->n_groups = 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &glen) == 0)
		for (size_t i = 0; i < glen / sizeof(gid_t) && c->n_groups <= KVQ_CONN_MAX_GROUPS; i++)
			c->groups[c->n_groups++] = g[i];
	c->pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
	if (c->pidfd < 0)
		kvq_log(LOG_DEBUG, "client %llu: no pidfd for pid %d (%s): its lease goes at disconnect",
			(unsigned long long)c->id, (int)cred.pid, strerror(errno));
	snprintf(label, sizeof(label), "client %llu", (unsigned long long)c->id);
	if (kvq_peer_new(s->base, fd, label, &conn_cb, c, &c->peer) < 0) {
		conn_close(c, "out of memory");
		return;
	}
	kvq_log(LOG_DEBUG, "client %llu: connected (pid %d, uid %u, gid %u)", (unsigned long long)c->id,
		(int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
}

/* ---------------------------------------------------------------- server */

int kvq_server_new(struct event_base *base, const struct kvq_config *config, const char *backend, int device,
		   kvq_server **ret, char *err, size_t errlen)
{
	kvq_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->base = base;
	s->listen_fd = -1;
	s->latency = calloc(kvq_requests_n, sizeof(*s->latency));
	if (!s->latency) {
		free(s);
		return -ENOMEM;
	}
	r = kvq_state_init(&s->st, config, backend, device, err, errlen);
	if (r < 0) {
		free(s->latency);
		free(s);
		return r;
	}
	*ret = s;
	return 0;
}

static int srv_listen_event(kvq_server *s, char *err, size_t errlen)
{
	s->lev = event_new(s->base, s->listen_fd, EV_READ | EV_PERSIST, srv_on_accept, s);
	if (!s->lev || event_add(s->lev, NULL) < 0) {
		kvq_seterr(err, errlen, "cannot watch the listening socket");
		return -ENOMEM;
	}
	return 0;
}

int kvq_server_listen_path(kvq_server *s, const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(a.sun_path))
		return kvq_seterr(err, errlen, "socket path too long: %s", path), -ENAMETOOLONG;
	memcpy(a.sun_path, path, strlen(path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return r = -errno, kvq_seterr(err, errlen, "socket: %s", strerror(errno)), r;
	/* a socket file left by a daemon that died is replaced; anything else is not ours */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		kvq_seterr(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	/* the pool ACLs are the gate; the socket's group may connect */
	chmod(path, 0660);
	s->listen_fd = fd;
	snprintf(s->path, sizeof(s->path), "%s", path);
	return srv_listen_event(s, err, errlen);
}

int kvq_server_listen_fd(kvq_server *s, int fd, char *err, size_t errlen)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return kvq_seterr(err, errlen, "fd %d: %s", fd, strerror(errno)), -EBADF;
	s->listen_fd = fd;
	return srv_listen_event(s, err, errlen);
}

void kvq_server_set_config(kvq_server *s, const struct kvq_config *config)
{
	kvq_state_set_config(&s->st, config);
}

void kvq_server_status(const kvq_server *s, char *buf, size_t len)
{
	unsigned pools = 0;

	for (const struct kvq_pools_rec *p = s->st.pools.head; p; p = p->next)
		pools += p->allocated;
	snprintf(buf, len, "%u pools, %u connections, backend %s", pools, s->st.n_conns, s->st.pools.backend->name);
}

void kvq_server_free(kvq_server *s)
{
	if (!s)
		return;
	while (s->st.conns)
		conn_close(s->st.conns, "server stops");
	while (s->st.dying)
		conn_free(s->st.dying);
	if (s->lev)
		event_free(s->lev);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->path[0])
		unlink(s->path);
	kvq_state_fini(&s->st);
	free(s->latency);
	free(s);
}

int kvq_server_pool_info(const kvq_server *s, uint32_t i, struct kvq_pools_info *ret)
{
	for (const struct kvq_pools_rec *p = s->st.pools.head; p; p = p->next) {
		if (!p->allocated)
			continue;
		if (i-- == 0) {
			kvq_pools_info(p, ret);
			return 0;
		}
	}
	return -ENOENT;
}

void kvq_server_connections(const kvq_server *s, uint32_t *ret_live, uint32_t *ret_exiting)
{
	uint32_t dying = 0;

	for (const struct kvq_conn *c = s->st.dying; c; c = c->next)
		dying++;
	*ret_live = s->st.n_conns - dying;
	*ret_exiting = dying;
}

const struct kvq_hist *kvq_server_latency(const kvq_server *s, size_t i, const char **ret_name)
{
	if (i >= kvq_requests_n)
		return NULL;
	if (ret_name)
		*ret_name = kvq_requests[i].name;
	return &s->latency[i];
}
