/* SPDX-License-Identifier: Apache-2.0 */
/* kvqd: serves a shared pool of quantized, paged KV-cache blocks over a Unix socket. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <event2/event.h>

#include "conf.h"
#include "conf_parse.h"
#include "conf_schema.h"
#include "fdq.h"
#include "frame.h"
#include "kvq_wire.h"
#include "log.h"
#include "metrics.h"
#include "restart.h"
#include "sd.h"
#include "server.h"

#define DEFAULT_CONFIG "/etc/kvqd/kvqd.conf"

struct opts {
	const char *config;
	const char *socket;
	const char *backend;
	int device;
	int log_level;
};

struct daemon {
	struct event_base *base;
	struct kvq_config *cfg;
	const char *config_path;    /* NULL: built-in defaults */
	kvq_server *srv;
	kvq_metrics *metrics;
	struct event *watchdog;
	struct timeval watchdog_tv;
	/* what the service manager passed: the control socket and the fd
	 * store's descriptors, each taken by whoever uses it, the rest closed
	 * once the server is set up */
	struct kvq_sd_fds sd_fds;
	/* the fd store's messages, never waiting on the manager */
	kvq_fdq *fdq;
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvqd [OPTION]...\n"
		   "Serve a shared pool of quantized, paged KV-cache blocks over a Unix socket.\n\n"
		   "  -c, --config FILE      configuration (default " DEFAULT_CONFIG " when it exists)\n"
		   "  -s, --socket PATH      control socket (default " KVQ_ROOT_SOCKET " for root,\n"
		   "                         $XDG_RUNTIME_DIR/kvqd.sock otherwise)\n"
		   "  -b, --backend NAME     auto, host or cuda (default: the config's, auto)\n"
		   "  -d, --device N         default CUDA device\n"
		   "  -f, --foreground       stay in the foreground (kvqd never forks: systemd\n"
		   "                         Type=notify supervises it); accepted for scripts\n"
		   "  -l, --log-level LEVEL  emerg .. debug or 0-7\n"
		   "  -h, --help             this text\n"
		   "  -V, --version          the version\n");
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' }, { "socket", required_argument, NULL, 's' },
		{ "backend", required_argument, NULL, 'b' }, { "device", required_argument, NULL, 'd' },
		{ "foreground", no_argument, NULL, 'f' },     { "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },           { "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "c:s:b:d:fl:hV", longopts, NULL)) != -1) {
		char *end;
		long v;

		switch (ch) {
		case 'c':
			o->config = optarg;
			break;
		case 's':
			o->socket = optarg;
			break;
		case 'b':
			if (strcmp(optarg, "auto") && strcmp(optarg, "host") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "kvqd: --backend takes auto, host or cuda\n");
				return 2;
			}
			o->backend = optarg;
			break;
		case 'd':
			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || v < 0 || v > KVQ_CONFIG_MAX_DEVICE) {
				fprintf(stderr, "kvqd: bad --device %s\n", optarg);
				return 2;
			}
			o->device = (int)v;
			break;
		case 'f':
			break;
		case 'l':
			o->log_level = kvq_log_level_from_name(optarg);
			if (o->log_level < 0) {
				fprintf(stderr, "kvqd: bad --log-level %s\n", optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 1;
		case 'V':
			printf("kvqd %s (protocol %u)\n", PACKAGE_VERSION, KVQ_PROTOCOL_VERSION);
			return 1;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvqd: unexpected argument %s\n", argv[optind]);
		return 2;
	}
	return 0;
}

static int load_config(const char *path, struct kvq_config **ret)
{
	char err[KVQ_CONFIG_MSG_MAX];
	int r;

	if (!path)
		return kvq_config_new(ret);
	r = kvq_config_parse_file(path, ret, err, sizeof(err));
	if (r < 0)
		kvq_log(LOG_ERR, "%s", err);
	return r;
}

static void on_stop(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;

	kvq_log(LOG_INFO, "signal %d: stopping", (int)sig);
	kvq_sd_stopping();
	event_base_loopexit(d->base, NULL);
}

/* A key that a reload does not apply (its row in daemon/conf_keys.h). */
static void on_reload_kept(void *arg, const char *word, const char *name, const char *key)
{
	(void)arg;
	if (name)
		kvq_log(LOG_NOTICE, "SIGHUP: [%s %s] %s changes at the next start", word, name, key);
	else
		kvq_log(LOG_NOTICE, "SIGHUP: %s changes at the next start", key);
}

static void on_reload(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;
	struct kvq_config *c = NULL;

	char status[128];

	if (!d->config_path) {
		kvq_log(LOG_NOTICE, "SIGHUP: no configuration file to reload");
		return;
	}
	kvq_sd_reloading();
	if (load_config(d->config_path, &c) < 0) {
		kvq_log(LOG_ERR, "SIGHUP: %s not reloaded; the old settings stay", d->config_path);
	} else {
		kvq_config_keep_running(d->cfg, c, on_reload_kept, NULL);
		kvq_server_set_config(d->srv, c);
		kvq_config_free(d->cfg);
		d->cfg = c;
		kvq_log(LOG_INFO, "SIGHUP: ACLs, quotas and limits reloaded from %s", d->config_path);
	}
	kvq_server_status(d->srv, status, sizeof(status));
	kvq_sd_ready(status);
}

/* Pings at half the interval systemd expects, with the status line. */
static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	struct daemon *d = arg;
	char status[128];

	kvq_sd_watchdog();
	kvq_server_status(d->srv, status, sizeof(status));
	kvq_sd_status(status);
}

/* Each connection costs two descriptors (socket, pidfd): the soft limit
 * (systemd's default is 1024) goes up to the hard one (LimitNOFILE=). */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		kvq_log(LOG_WARNING, "cannot raise the file descriptor limit to %llu: %s",
			(unsigned long long)rl.rlim_max, strerror(errno));
}

/* Closes the passed descriptors nobody took: stored by another version, or
 * for a pool that is gone.  The manager keeps its copies until the unit
 * stops or the daemon removes them. */
static void sd_fds_close_unused(struct kvq_sd_fds *s)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->fd[i] >= 0)
			kvq_log(LOG_INFO, "descriptor %s from the service manager not used: closed", s->name[i]);
	kvq_sd_fds_free(s);
}

/* The service manager as daemon/restart.h sees it (arg: the daemon): the
 * descriptors passed at start and the fd store. */
static int keep_take(void *arg, const char *name)
{
	struct daemon *d = arg;

	return kvq_sd_fds_take(&d->sd_fds, name);
}

static const char *keep_name_at(void *arg, size_t i)
{
	const struct daemon *d = arg;

	return i < d->sd_fds.n ? d->sd_fds.name[i] : NULL;
}

static int keep_store(void *arg, const char *name, int fd, bool may_drop)
{
	struct daemon *d = arg;

	return kvq_fdq_store(d->fdq, name, fd, may_drop);
}

static int keep_remove(void *arg, const char *name, bool may_drop)
{
	struct daemon *d = arg;

	return kvq_fdq_remove(d->fdq, name, may_drop);
}

/* The socket path: --socket, else a socket the config file names, else the
 * default for root or the user's runtime directory. */
static int socket_path(const struct opts *o, const struct kvq_config *c, bool from_file, char *buf, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");

	if (o->socket)
		return snprintf(buf, len, "%s", o->socket) < (int)len ? 0 : -ENAMETOOLONG;
	if (geteuid() == 0 || (from_file && strcmp(c->socket, KVQ_ROOT_SOCKET)))
		return snprintf(buf, len, "%s", c->socket) < (int)len ? 0 : -ENAMETOOLONG;
	if (!xdg || xdg[0] != '/')
		return -ENOENT;
	return snprintf(buf, len, "%s/kvqd.sock", xdg) < (int)len ? 0 : -ENAMETOOLONG;
}

int main(int argc, char **argv)
{
	struct opts o = { .device = -1, .log_level = -1 };
	struct daemon d = { 0 };
	struct event *ev_term = NULL, *ev_int = NULL, *ev_hup = NULL;
	struct kvq_keep keep = { &d, keep_take, keep_name_at, keep_store, keep_remove, NULL };
	char err[512], path[108], status[128];
	uint64_t wd_usec;
	int r, ret = EXIT_FAILURE;

	r = parse_args(argc, argv, &o);
	if (r)
		return r == 1 ? EXIT_SUCCESS : 2;
	if (o.log_level >= 0)
		kvq_log_set_level(o.log_level);
	d.config_path = o.config;
	if (!d.config_path && access(DEFAULT_CONFIG, F_OK) == 0)
		d.config_path = DEFAULT_CONFIG;
	if (load_config(d.config_path, &d.cfg) < 0)
		goto out;
	if (o.log_level < 0)
		kvq_log_set_level(d.cfg->log_level);
	signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
	/* the remote tier's fetched values (a block's record each, 100 KiB to
	 * a few MiB) come and go a Lookup's 64 at a time: from a heap that
	 * stays mapped, not from fresh pages each time (glibc trims its heap
	 * above 128 KiB free, so every Lookup's values faulted their pages in
	 * again on the loop) */
	mallopt(M_MMAP_THRESHOLD, 16 << 20);
	mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
	raise_nofile();
	r = kvq_sd_fds_get(&d.sd_fds);
	if (r < 0) {
		kvq_log(LOG_ERR, "descriptors from the service manager: %s", strerror(-r));
		goto out;
	}

	d.base = event_base_new();
	if (!d.base) {
		kvq_log(LOG_ERR, "cannot create the event loop");
		goto out;
	}
	if (kvq_sd_fdstore_available()) {
		r = kvq_fdq_new(d.base, &d.fdq);
		if (r < 0)
			kvq_log(LOG_WARNING, "fd store: no socket to the service manager (%s): a restart starts cold",
				strerror(-r));
	}
	r = kvq_server_new(d.base, d.cfg, o.backend ? o.backend : d.cfg->backend,
			   o.device >= 0 ? o.device : d.cfg->device, d.fdq ? &keep : NULL, &d.srv, err, sizeof(err));
	if (r < 0) {
		kvq_log(LOG_ERR, "%s", err);
		goto out;
	}
	/* a socket unit's socket wins over --socket, which the unit passes too */
	r = kvq_sd_fds_listen_socket(&d.sd_fds);
	if (r < 0 && r != -ENOENT) {
		kvq_log(LOG_ERR, "socket activation: %s", r == -E2BIG ? "more than one listening socket passed" :
			strerror(-r));
		goto out;
	}
	if (r >= 0) {
		snprintf(path, sizeof(path), "fd %d from systemd", r);
		r = kvq_server_listen_fd(d.srv, r, err, sizeof(err));
	} else {
		r = socket_path(&o, d.cfg, d.config_path != NULL, path, sizeof(path));
		if (r < 0) {
			kvq_log(LOG_ERR, "no socket path: give --socket (XDG_RUNTIME_DIR is not set)");
			goto out;
		}
		if (!strcmp(path, KVQ_ROOT_SOCKET))
			mkdir("/run/kvqd", 0755);
		r = kvq_server_listen_path(d.srv, path, err, sizeof(err));
	}
	if (r < 0) {
		kvq_log(LOG_ERR, "%s", err);
		goto out;
	}
	ev_term = evsignal_new(d.base, SIGTERM, on_stop, &d);
	ev_int = evsignal_new(d.base, SIGINT, on_stop, &d);
	ev_hup = evsignal_new(d.base, SIGHUP, on_reload, &d);
	if (!ev_term || !ev_int || !ev_hup || event_add(ev_term, NULL) < 0 || event_add(ev_int, NULL) < 0 ||
	    event_add(ev_hup, NULL) < 0) {
		kvq_log(LOG_ERR, "cannot watch signals");
		goto out;
	}
	wd_usec = kvq_sd_watchdog_usec();
	if (wd_usec) {
		d.watchdog_tv.tv_sec = (time_t)(wd_usec / 2 / 1000000);
		d.watchdog_tv.tv_usec = (suseconds_t)(wd_usec / 2 % 1000000);
		d.watchdog = event_new(d.base, -1, EV_PERSIST, on_watchdog, &d);
		if (!d.watchdog || event_add(d.watchdog, &d.watchdog_tv) < 0) {
			kvq_log(LOG_ERR, "cannot arm the watchdog timer");
			goto out;
		}
	}
	if (d.cfg->metrics_listen[0]) {
		r = kvq_metrics_new(d.base, d.srv, d.cfg->metrics_listen, &d.metrics, err, sizeof(err));
		if (r < 0) {
			kvq_log(LOG_ERR, "%s", err);
			goto out;
		}
		kvq_log(LOG_INFO, "metrics at http://%s/metrics", d.cfg->metrics_listen);
	}
	sd_fds_close_unused(&d.sd_fds);
	kvq_log(LOG_NOTICE, "kvqd %s listening on %s", PACKAGE_VERSION, path);
	if (kvq_server_max_connections(d.srv) < d.cfg->max_connections)
		kvq_log(LOG_WARNING, "at most %u connections, not max_connections %llu: the file descriptor limit "
			"allows no more (LimitNOFILE=)", kvq_server_max_connections(d.srv),
			(unsigned long long)d.cfg->max_connections);
	kvq_server_status(d.srv, status, sizeof(status));
	kvq_sd_ready(status);
	if (event_base_dispatch(d.base) < 0) {
		kvq_log(LOG_ERR, "event loop failed");
		goto out;
	}
	ret = EXIT_SUCCESS;
	/* before the connections go: what they hold stays held at the next start */
	kvq_server_keep(d.srv);
	kvq_log(LOG_INFO, "stopped");
out:
	if (d.watchdog)
		event_free(d.watchdog);
	if (ev_hup)
		event_free(ev_hup);
	if (ev_int)
		event_free(ev_int);
	if (ev_term)
		event_free(ev_term);
	kvq_metrics_free(d.metrics);
	kvq_server_free(d.srv);
	/* what waits (a pool made just before the stop) before the manager
	 * sees the process go; never longer than a second */
	kvq_fdq_drain(d.fdq, 1000);
	kvq_fdq_free(d.fdq);
	if (d.base)
		event_base_free(d.base);
	kvq_config_free(d.cfg);
	kvq_sd_fds_free(&d.sd_fds);
	return ret;
}
