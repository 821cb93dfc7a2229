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
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame_io.h"
#include "log.h"
#include "peer.h"
#include "procs.h"
#include "request.h"
#include "server.h"
#include "seterr.h"
#include "state.h"
#include "tiering.h"

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
	struct kvq_server_errors *errors;                          /* one per row of kvq_requests[] */
	struct kvq_peer_limits plim;                               /* the config's, for every peer */
	uint32_t fd_conns;                                         /* connections the fds allow */
	int spare_fd;                                              /* closed to refuse at EMFILE */
	struct event *resume;                                      /* ends a pause of accept */
	bool paused;
	uint64_t counters[KVQ_SERVER_N_COUNTERS];
	struct event *holds;                                       /* while restored holds last */
	struct kvq_keep keep;                                      /* the manager's, with procs */
	kvq_procs *procs;                                          /* NULL without a manager */
};

static void conn_on_frame(kvq_peer *peer, const uint8_t *payload, size_t len, int fd, void *arg);
static void wait_drop(struct kvq_conn *c);
static void conn_on_closed(kvq_peer *peer, const char *why, void *arg);
static void conn_on_pidfd(evutil_socket_t fd, short what, void *arg);
static void srv_on_accept(evutil_socket_t fd, short what, void *arg);
static void conn_on_timer(evutil_socket_t fd, short what, void *arg);
static void conn_arm(struct kvq_conn *c);
static void srv_resume(kvq_server *s);

static const struct kvq_peer_cb conn_cb = { conn_on_frame, conn_on_closed };

/* Error replies of one row by status: the codes seen first, the rest in the
 * last slot (KVQ_SERVER_ERR_OTHER). */
struct kvq_server_errors {
	int code[KVQ_SERVER_ERR_CODES];
	uint64_t n[KVQ_SERVER_ERR_CODES];
};

static void count_error(struct kvq_server_errors *e, int status)
{
	size_t i;

	for (i = 0; i + 1 < KVQ_SERVER_ERR_CODES; i++)
		if (e->code[i] == status || e->code[i] == 0)
			break;
	e->code[i] = i + 1 < KVQ_SERVER_ERR_CODES ? status : KVQ_SERVER_ERR_OTHER;
	e->n[i]++;
}

static kvq_server *server_of(const struct kvq_conn *c)
{
	return (kvq_server *)((char *)c->st - offsetof(kvq_server, st));
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A frame that says why kvqd ends a connection: id 0 (no request's), a
 * status and a message (kvq.proto, "Refusals"). */
static void notice_init(Kvq__Envelope *e, int status, char *msg)
{
	kvq__envelope__init(e);
	e->status = status;
	e->message = msg;
}

/* ---------------------------------------------------------------- connections */

static void conn_free(struct kvq_conn *c)
{
	kvq_server *s = server_of(c);

	if (c->pev)
		event_free(c->pev);
	if (c->tev)
		event_free(c->tev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	kvq_state_conn_free(c);
	srv_resume(s);
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
	wait_drop(c);
	kvq_peer_free(c->peer);
	c->peer = NULL;
	if (c->tev) {
		event_free(c->tev);
		c->tev = NULL;
	}
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

/* ---------------------------------------------------------------- waiting replies */

/* Sends c's reply (queued on its peer), counting its error. */
static void reply_send(struct kvq_conn *c, struct kvq_reply *r, size_t row)
{
	kvq_server *s = server_of(c);

	if (r->e.status < 0)
		count_error(&s->errors[row], r->e.status);
	if (kvq_peer_queue(c->peer, &r->e, r->fd) < 0) {
		kvq_log(LOG_ERR, "client %llu: reply to request %llu cannot be encoded", (unsigned long long)c->id,
			(unsigned long long)r->e.id);
		r->close_after = true;
	}
	if (r->close_after)
		kvq_peer_close_after(c->peer);
}

/* c's waiting reply finished (its work done, or its bound passed) and
 * sent; the connection reads again. */
static void wait_end(struct kvq_conn *c, bool timed_out)
{
	struct kvq_reply *r = c->waiting;

	c->waiting = NULL;
	if (c->wev)
		event_del(c->wev);
	kvq_dispatch_finish(c, r, timed_out);
	reply_send(c, r, c->wait_row);
	kvq_reply_fini(r);
	free(r);
	kvq_peer_hold(c->peer, false);
}

static void wait_on_resume(struct kvq_conn *c)
{
	if (c->waiting && c->peer)
		wait_end(c, false);
}

static void wait_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct kvq_conn *c = arg;

	(void)fd;
	(void)what;
	if (c->waiting && c->peer)
		wait_end(c, true);
}

/* The connection goes with a reply waiting: no reply, what it held let go. */
static void wait_drop(struct kvq_conn *c)
{
	if (c->wev) {
		event_free(c->wev);
		c->wev = NULL;
	}
	if (!c->waiting)
		return;
	kvq_dispatch_finish(NULL, c->waiting, false);
	kvq_reply_fini(c->waiting);
	free(c->waiting);
	c->waiting = NULL;
}

/* r waits: kept, the connection held, the bound armed.  0, or -ENOMEM (r
 * finished now, as at its bound). */
static int wait_start(struct kvq_conn *c, struct kvq_reply *r, size_t row)
{
	uint64_t ms = c->st->cfg->host_tier_wait_ms;
	struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000 * 1000) };

	c->waiting = malloc(sizeof(*r));
	if (!c->wev)
		c->wev = evtimer_new(server_of(c)->base, wait_on_timer, c);
	if (!c->waiting || !c->wev) {
		free(c->waiting);
		c->waiting = NULL;
		kvq_dispatch_finish(c, r, true);
		return -ENOMEM;
	}
	*c->waiting = *r;
	c->wait_row = row;
	c->resume = wait_on_resume;
	evtimer_add(c->wev, &tv);
	kvq_peer_hold(c->peer, true);
	return 0;
}

/* After a request on a pool with a host tier: its reserve of free slots. */
static void tier_tick(struct kvq_conn *c)
{
	const struct kvq_config *cfg = c->st->cfg;

	if (c->pool && c->pool->tiering)
		kvq_tiering_demote(c->pool->tiering, cfg->host_tier_reserve, cfg->host_tier_inflight);
}

/* One frame of c, with the descriptor that came with it (-1: none; the
 * peer closes it after): the request's reply is queued, its time counted. */
static void conn_on_frame(kvq_peer *peer, const uint8_t *payload, size_t len, int fd, void *arg)
{
	struct kvq_conn *c = arg;
	kvq_server *s = server_of(c);
	struct timespec t0, t1;
	struct kvq_reply r;
	size_t row = 0;
	bool had_hello = c->hello;
	int parsed;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	c->active_ms = (int64_t)t0.tv_sec * 1000 + t0.tv_nsec / 1000000;
	parsed = kvq_dispatch_frame(kvq_requests, kvq_requests_n, c, payload, len, fd, &r, &row) == 0;
	if (r.wait && wait_start(c, &r, row) == 0) {
		tier_tick(c);
		return;
	}
	/* an envelope that does not parse has no row: "other"'s */
	reply_send(c, &r, parsed ? row : kvq_requests_n - 1);
	tier_tick(c);
	/* from the Hello's deadline to the idle time's */
	if (c->hello != had_hello)
		conn_arm(c);
	if (parsed) {
		clock_gettime(CLOCK_MONOTONIC, &t1);
		kvq_hist_observe(&s->latency[row],
				 (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	}
	kvq_reply_fini(&r);
}

/* Arms c's timer for its next deadline: the Hello's, or, for a connection
 * attached to no pool, the end of its idle time; an attached one has none. */
static void conn_arm(struct kvq_conn *c)
{
	const struct kvq_config *lim = c->st->cfg;
	int64_t at;
	struct timeval tv;

	if (!c->peer || !c->tev)
		return;
	if (!c->hello)
		at = c->accepted_ms + (int64_t)lim->handshake_timeout_ms;
	else if (!c->pool && lim->idle_timeout_ms)
		at = c->active_ms + (int64_t)lim->idle_timeout_ms;
	else {
		event_del(c->tev);
		return;
	}
	at -= now_ms();
	if (at < 0)
		at = 0;
	tv.tv_sec = (time_t)(at / 1000);
	tv.tv_usec = (suseconds_t)(at % 1000 * 1000);
	evtimer_add(c->tev, &tv);
}

static void conn_on_timer(evutil_socket_t fd, short what, void *arg)
{
	static struct kvq_log_limit rl;
	struct kvq_conn *c = arg;
	kvq_server *s = server_of(c);
	const struct kvq_config *lim = s->st.cfg;
	int64_t now = now_ms();
	char msg[128];
	Kvq__Envelope e;
	int which;

	if (!c->hello && now - c->accepted_ms >= (int64_t)lim->handshake_timeout_ms) {
		which = KVQ_SERVER_TIMEOUT_HANDSHAKE;
		snprintf(msg, sizeof(msg), "no Hello within %llu ms (kvqd.conf handshake_timeout_ms)",
			 (unsigned long long)lim->handshake_timeout_ms);
	} else if (c->hello && !c->pool && lim->idle_timeout_ms &&
		   now - c->active_ms >= (int64_t)lim->idle_timeout_ms) {
		which = KVQ_SERVER_TIMEOUT_IDLE;
		snprintf(msg, sizeof(msg), "idle for %llu ms attached to no pool (kvqd.conf idle_timeout_ms)",
			 (unsigned long long)lim->idle_timeout_ms);
	} else {
		conn_arm(c);    /* early (the limit changed, or a request came) */
		return;
	}
	s->counters[which]++;
	kvq_log_limited(&rl, LOG_NOTICE, "client %llu (pid %d, uid %u): closed: %s", (unsigned long long)c->id,
			(int)c->pid, (unsigned)c->uid, msg);
	notice_init(&e, -ETIMEDOUT, msg);
	kvq_peer_send_last(c->peer, &e);
	conn_close(c, msg);
}

/* Stops accepting for accept_pause_ms, or until a connection ends. */
static void srv_pause(kvq_server *s)
{
	uint64_t ms = s->st.cfg->accept_pause_ms;
	struct timeval tv = { .tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000 * 1000) };

	if (s->paused || !s->lev)
		return;
	event_del(s->lev);
	evtimer_add(s->resume, &tv);
	s->paused = true;
	s->counters[KVQ_SERVER_ACCEPT_PAUSES]++;
}

static void srv_resume(kvq_server *s)
{
	if (s->spare_fd < 0)
		s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (!s->paused)
		return;
	event_del(s->resume);
	event_add(s->lev, NULL);
	s->paused = false;
}

static void srv_on_resume(evutil_socket_t fd, short what, void *arg)
{
	srv_resume(arg);
}

/* Tells the client on fd why it is refused, without waiting, and closes fd. */
__attribute__((format(printf, 4, 5)))
static void srv_refuse(kvq_server *s, int fd, int which, const char *fmt, ...)
{
	static struct kvq_log_limit rl;
	char msg[160];
	uint8_t buf[256];
	Kvq__Envelope e;
	va_list ap;
	int n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	notice_init(&e, which == KVQ_SERVER_REFUSED_FDS ? -EMFILE : -EUSERS, msg);
	n = kvq_frame_encode(&e, buf, sizeof(buf));
	if (n > 0)
		kvq_frame_send(fd, buf, (size_t)n, -1);
	close(fd);
	s->counters[which]++;
	kvq_log_limited(&rl, LOG_WARNING, "refusing a connection: %s", msg);
}

static uint32_t uid_conns(const kvq_server *s, uid_t uid)
{
	uint32_t n = 0;

	for (const struct kvq_conn *c = s->st.conns; c; c = c->next)
		n += c->uid == uid;
	return n;
}

/* A connection for fd, from cred's peer. */
static void srv_conn_new(kvq_server *s, int fd, const struct ucred *cred)
{
	gid_t g[KVQ_CONN_MAX_GROUPS];
	socklen_t glen = sizeof(g);
	struct kvq_conn *c;
	char label[32];

	if (kvq_state_conn_new(&s->st, &c) < 0) {
		close(fd);
		return;
	}
	c->uid = cred->uid;
	c->pid = cred->pid;
	c->groups[0] = cred->gid;
	c->n_groups = 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &glen) == 0)
		for (size_t i = 0; i < glen / sizeof(gid_t) && c->n_groups <= KVQ_CONN_MAX_GROUPS; i++)
			c->groups[c->n_groups++] = g[i];
	c->pidfd = (int)syscall(SYS_pidfd_open, cred->pid, 0);
	if (c->pidfd < 0)
		kvq_log(LOG_DEBUG, "client %llu: no pidfd for pid %d (%s): its lease goes at disconnect",
			(unsigned long long)c->id, (int)cred->pid, strerror(errno));
	c->accepted_ms = c->active_ms = now_ms();
	snprintf(label, sizeof(label), "client %llu", (unsigned long long)c->id);
	c->tev = evtimer_new(s->base, conn_on_timer, c);
	if (!c->tev || kvq_peer_new(s->base, fd, label, &conn_cb, c, &s->plim, &c->peer) < 0) {
		if (!c->tev)
			close(fd);
		conn_close(c, "out of memory");
		return;
	}
	conn_arm(c);
	kvq_log(LOG_DEBUG, "client %llu: connected (pid %d, uid %u, gid %u)", (unsigned long long)c->id,
		(int)cred->pid, (unsigned)cred->uid, (unsigned)cred->gid);
}

/*
 * Accepts what waits, up to a batch.  At a limit the client is told why
 * and closed; out of file descriptors the spare one makes room to do so.
 * Either way accept then pauses (srv_pause) instead of finding the same
 * socket readable again at once.
 */
static void srv_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	static struct kvq_log_limit rl_accept, rl_cred;
	kvq_server *s = arg;
	const struct kvq_config *lim = s->st.cfg;
	bool pause = false;

	for (unsigned i = 0; i < KVQ_SERVER_ACCEPT_BATCH; i++) {
		struct ucred cred;
		socklen_t clen = sizeof(cred);
		bool no_fds = false;
		uint32_t max = kvq_server_max_connections(s), n;
		int fd;

		fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0 && (errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
			close(s->spare_fd);
			s->spare_fd = -1;
			no_fds = true;
			fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
			if (fd < 0) {
				int e = errno;

				s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
				errno = e;
			}
		}
		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			kvq_log_limited(&rl_accept, LOG_WARNING, "accept: %s; pausing %llu ms", strerror(errno),
					(unsigned long long)lim->accept_pause_ms);
			pause = true;
			break;
		}
		if (no_fds) {
			srv_refuse(s, fd, KVQ_SERVER_REFUSED_FDS,
				   "kvqd is out of file descriptors (%u connections); try again later", s->st.n_conns);
			s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			pause = true;
			continue;
		}
		if (s->st.n_conns >= max) {
			srv_refuse(s, fd, KVQ_SERVER_REFUSED_MAX,
				   "kvqd has %u connections, its limit (kvqd.conf max_connections)", s->st.n_conns);
			pause = true;
			continue;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
			kvq_log_limited(&rl_cred, LOG_WARNING, "SO_PEERCRED: %s", strerror(errno));
			close(fd);
			continue;
		}
		n = uid_conns(s, cred.uid);
		if (n >= lim->max_connections_per_uid) {
			srv_refuse(s, fd, KVQ_SERVER_REFUSED_UID,
				   "uid %u has %u connections, its limit (kvqd.conf max_connections_per_uid)",
				   (unsigned)cred.uid, n);
			continue;
		}
		srv_conn_new(s, fd, &cred);
	}
	if (pause)
		srv_pause(s);
}

/* ---------------------------------------------------------------- server */

/* Connections the file descriptor limit leaves room for. */
static uint32_t fd_budget(void)
{
	struct rlimit rl;
	rlim_t n;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return UINT32_MAX;
	n = rl.rlim_cur > KVQ_SERVER_FD_RESERVE + 2 ? (rl.rlim_cur - KVQ_SERVER_FD_RESERVE) / 2 : 1;
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static void peer_limits(kvq_server *s)
{
	s->plim.max_output = (size_t)s->st.cfg->max_output;
	s->plim.frames_per_wakeup = (unsigned)s->st.cfg->frames_per_wakeup;
}

uint32_t kvq_server_max_connections(const kvq_server *s)
{
	uint64_t max = s->st.cfg->max_connections;

	return max < s->fd_conns ? (uint32_t)max : s->fd_conns;
}

int kvq_server_counter(const kvq_server *s, int i, uint64_t *ret_value, const char **ret_family,
		       const char **ret_label, const char **ret_help)
{
	static const struct {
		const char *family, *label, *help;
	} rows[] = {
#define KVQ_SERVER_COUNTER_ROW(id, family, label, help) { family, label, help },
		KVQ_SERVER_COUNTERS(KVQ_SERVER_COUNTER_ROW)
#undef KVQ_SERVER_COUNTER_ROW
	};

	if (i < 0 || i >= KVQ_SERVER_N_COUNTERS)
		return -ENOENT;
	*ret_value = i == KVQ_SERVER_BACKPRESSURE ? s->plim.n_backpressure : s->counters[i];
	*ret_family = rows[i].family;
	*ret_label = rows[i].label;
	*ret_help = rows[i].help;
	return 0;
}

/* The host tiers' copies from now on on a thread of their own, back on
 * the loop (the state began with a synchronous copier, idle). */
static int server_copier(kvq_server *s, char *err, size_t errlen)
{
	kvq_copier *cp;
	int r = kvq_copier_new(s->base, &cp);

	if (r < 0)
		return kvq_seterr(err, errlen, "copy thread: %s", strerror(-r)), r;
	kvq_copier_free(s->st.pools.copier);
	s->st.pools.copier = cp;
	return 0;
}

/* Holds a restart took back go once their processes have (restart.h):
 * looked at each second while any is left. */
static void srv_on_holds(evutil_socket_t fd, short what, void *arg)
{
	kvq_server *s = arg;

	if (kvq_pools_holds_check(&s->st.pools) == 0) {
		event_free(s->holds);
		s->holds = NULL;
	}
}

/* A process a restored pool held for exited: its holds go now. */
static void srv_on_proc_exit(void *arg, pid_t pid, uint64_t start)
{
	kvq_server *s = arg;

	if (kvq_pools_holds_exited(&s->st.pools, pid, start) == 0 && s->holds) {
		event_free(s->holds);
		s->holds = NULL;
	}
}

int kvq_server_new(struct event_base *base, const struct kvq_config *config, const char *backend, int device,
		   const struct kvq_keep *keep, kvq_server **ret, char *err, size_t errlen)
{
	kvq_server *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return -ENOMEM;
	s->base = base;
	s->listen_fd = -1;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->resume = evtimer_new(base, srv_on_resume, s);
	s->latency = calloc(kvq_requests_n, sizeof(*s->latency));
	s->errors = calloc(kvq_requests_n, sizeof(*s->errors));
	if (!s->latency || !s->errors || !s->resume) {
		kvq_server_free(s);
		return -ENOMEM;
	}
	if (keep) {
		s->keep = *keep;
		if (kvq_procs_new(base, &s->keep, srv_on_proc_exit, s, &s->procs) < 0) {
			kvq_server_free(s);
			return -ENOMEM;
		}
		s->keep.procs = s->procs;
	}
	r = kvq_state_init(&s->st, config, backend, device, keep ? &s->keep : NULL, err, errlen);
	if (r == 0)
		r = server_copier(s, err, errlen);
	if (r == 0)
		r = kvq_pools_remotes(&s->st.pools, base, config, err, errlen);
	if (r < 0) {
		s->st.cfg = NULL;
		kvq_server_free(s);
		return r;
	}
	if (kvq_pools_holds_check(&s->st.pools) > 0) {
		s->holds = event_new(base, -1, EV_PERSIST, srv_on_holds, s);
		if (!s->holds || event_add(s->holds, &(struct timeval){ 1, 0 }) < 0) {
			kvq_server_free(s);
			return kvq_seterr(err, errlen, "cannot watch the restored holds"), -ENOMEM;
		}
	}
	s->fd_conns = fd_budget();
	peer_limits(s);
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
	peer_limits(s);
	/* the timeouts as they now are */
	for (struct kvq_conn *c = s->st.conns; c; c = c->next)
		conn_arm(c);
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
	if (s->resume)
		event_free(s->resume);
	s->resume = NULL;
	if (s->holds)
		event_free(s->holds);
	s->paused = false;
	if (s->lev)
		event_free(s->lev);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->path[0])
		unlink(s->path);
	if (s->st.cfg)
		kvq_state_fini(&s->st);
	kvq_procs_free(s->procs);
	free(s->latency);
	free(s->errors);
	free(s);
}

void kvq_server_keep(kvq_server *s)
{
	kvq_pools_keep(&s->st.pools);
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

int kvq_server_request_errors(const kvq_server *s, size_t row, size_t i, const char **ret_request, int *ret_code,
			       uint64_t *ret_n)
{
	if (row >= kvq_requests_n || i >= KVQ_SERVER_ERR_CODES || !s->errors[row].code[i])
		return -ENOENT;
	*ret_request = kvq_requests[row].name;
	*ret_code = s->errors[row].code[i];
	*ret_n = s->errors[row].n[i];
	return 0;
}

const struct kvq_hist *kvq_server_latency(const kvq_server *s, size_t i, const char **ret_name)
{
	if (i >= kvq_requests_n)
		return NULL;
	if (ret_name)
		*ret_name = kvq_requests[i].name;
	return &s->latency[i];
}
