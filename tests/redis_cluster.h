/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A real Redis Cluster on loopback for the integration tests (test_rcluster,
 * test_remote): six redis-server processes (three masters, three replicas)
 * with a password for the default user (PASS) and a Redis ACL user
 * (ACL_USER, ACL_PASS), made with redis-cli --cluster create in a temporary
 * folder; each node in a process group of its own, dying with the test
 * (PR_SET_PDEATHSIG) and killed at exit (cleanup, on_signal).  A test that
 * cannot start the cluster fails.  Blocking admin commands through
 * hiredis's synchronous API (admin, admin_ok), the masters and their
 * slots as a running node sees them; kvqd's secrets for it (secrets_write).  Include after tap.h (cluster_up, a
 * TAP test's start), or after a diag() of the includer's own (kvq-bench
 * remote: cluster_handlers, cluster_folder, pick_ports, cluster_start).
 */
#ifndef KVQ_TEST_REDIS_CLUSTER_H
#define KVQ_TEST_REDIS_CLUSTER_H

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis.h>

#define NODES 6
#define PASS "kvq-test-pass"
#define ACL_USER "kvqd"
#define ACL_PASS "kvq-acl-pass"

__attribute__((unused))
static char dir[] = "/tmp/kvq-rcluster-XXXXXX";
__attribute__((unused))
static bool have_dir;
__attribute__((unused))
static int ports[NODES];
__attribute__((unused))
static pid_t pids[NODES];

/* --- redis-server processes --- */

__attribute__((unused))
static void kill_all(void)
{
	for (int i = 0; i < NODES; i++) {
		if (pids[i] <= 0)
			continue;
		kill(-pids[i], SIGKILL);
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, 0);
		pids[i] = 0;
	}
}

/* Removes the files the nodes and redis-cli write (known names: no
 * readdir, so that a signal handler may call it). */
__attribute__((unused))
static void cleanup(void)
{
	static const char *const per_node[] = { "redis-%d.conf", "redis-%d.log", "stdout-%d.log", "nodes-%d.conf",
						 "dump-%d.rdb" };
	char p[512];
	int n;

	kill_all();
	if (!have_dir || getenv("KVQ_TEST_KEEP"))
		return;
	for (int i = 0; i < NODES; i++)
		for (size_t j = 0; j < sizeof(per_node) / sizeof(per_node[0]); j++) {
			n = snprintf(p, sizeof(p), "%s/", dir);
			snprintf(p + n, sizeof(p) - (size_t)n, per_node[j], ports[i]);
			unlink(p);
		}
	snprintf(p, sizeof(p), "%s/cluster-create.log", dir);
	unlink(p);
	if (rmdir(dir) < 0)
		fprintf(stderr, "%s: not removed: %s\n", dir, strerror(errno));
	have_dir = false;
}

__attribute__((unused))
static void on_signal(int sig)
{
	cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

__attribute__((unused))
static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

__attribute__((unused))
static bool port_free(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;

	if (fd >= 0)
		close(fd);
	return ok;
}

/* Six free ports whose cluster bus ports (+10000) are free too. */
__attribute__((unused))
static bool pick_ports(void)
{
	srand((unsigned)getpid() ^ (unsigned)time(NULL));
	for (int tries = 0; tries < 50; tries++) {
		int p0 = 20000 + rand() % 25000;
		bool ok = true;

		for (int i = 0; i < NODES && ok; i++)
			ok = port_free(p0 + i) && port_free(p0 + i + 10000);
		if (!ok)
			continue;
		for (int i = 0; i < NODES; i++)
			ports[i] = p0 + i;
		return true;
	}
	return false;
}

__attribute__((unused))
static bool write_conf(int i)
{
	char p[512];
	FILE *f;

	snprintf(p, sizeof(p), "%s/redis-%d.conf", dir, ports[i]);
	f = fopen(p, "w");
	if (!f)
		return false;
	fprintf(f, "port %d\nbind 127.0.0.1\ndir %s\ncluster-enabled yes\ncluster-config-file nodes-%d.conf\n"
		   "cluster-node-timeout 2000\nappendonly no\nsave \"\"\ndaemonize no\nlogfile redis-%d.log\n"
		   "requirepass %s\nmasterauth %s\nuser %s on >%s ~* &* +@all\n"
		   /* a replica has its first copy at once: one without any cannot take over */
		   "repl-diskless-sync-delay 0\ndbfilename dump-%d.rdb\n",
		ports[i], dir, ports[i], ports[i], PASS, PASS, ACL_USER, ACL_PASS, ports[i]);
	return fclose(f) == 0;
}

__attribute__((unused))
static pid_t spawn(char *const argv[], const char *log)
{
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);

		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	return pid;
}

__attribute__((unused))
static bool node_start(int i)
{
	char conf[512], log[512];
	char *argv[] = { "redis-server", conf, NULL };

	snprintf(conf, sizeof(conf), "%s/redis-%d.conf", dir, ports[i]);
	snprintf(log, sizeof(log), "%s/stdout-%d.log", dir, ports[i]);
	pids[i] = spawn(argv, log);
	return pids[i] > 0;
}

/* --- the cluster, through hiredis's blocking API --- */

/* A connection to port, authenticated, or NULL. */
__attribute__((unused))
static redisContext *admin_conn(int port)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *auth;

	if (!c || c->err || redisSetTimeout(c, tv) != REDIS_OK)
		goto fail;
	auth = redisCommand(c, "AUTH %s", PASS);
	if (auth && auth->type == REDIS_REPLY_STATUS) {
		freeReplyObject(auth);
		return c;
	}
	freeReplyObject(auth);
fail:
	redisFree(c);
	return NULL;
}

__attribute__((format(printf, 2, 0)))
__attribute__((unused))
static redisReply *admin_v(int port, const char *fmt, va_list ap)
{
	redisContext *c = admin_conn(port);
	redisReply *r = c ? redisvCommand(c, fmt, ap) : NULL;

	if (c && !r)
		diag("port %d: %s: %s", port, fmt, c->errstr);
	redisFree(c);
	return r;
}

/* fmt's reply from port (hiredis's blocking API), or NULL. */
__attribute__((format(printf, 2, 3)))
__attribute__((unused))
static redisReply *admin(int port, const char *fmt, ...)
{
	redisReply *r;
	va_list ap;

	va_start(ap, fmt);
	r = admin_v(port, fmt, ap);
	va_end(ap);
	return r;
}

/* admin() for commands that answer +OK. */
__attribute__((format(printf, 2, 3)))
__attribute__((unused))
static bool admin_ok(int port, const char *fmt, ...)
{
	redisReply *r;
	bool ok;
	va_list ap;

	va_start(ap, fmt);
	r = admin_v(port, fmt, ap);
	va_end(ap);
	ok = r && r->type == REDIS_REPLY_STATUS;
	if (!ok && r)
		diag("port %d: %s: %s", port, fmt, r->str);
	freeReplyObject(r);
	return ok;
}

__attribute__((unused))
static bool cluster_ok(int port)
{
	redisReply *r = admin(port, "CLUSTER INFO");
	bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");

	freeReplyObject(r);
	return ok;
}

__attribute__((unused))
static bool replica_linked(int port)
{
	redisReply *r = admin(port, "INFO replication");
	bool ok = r && r->type == REDIS_REPLY_STRING &&
		  (strstr(r->str, "role:master") || strstr(r->str, "master_link_status:up"));

	freeReplyObject(r);
	return ok;
}

/* Every running node is ok and every replica has its master's copy. */
__attribute__((unused))
static bool wait_cluster_ok(int ms)
{
	double end = now_ms() + ms;

	while (now_ms() < end) {
		bool all = true;

		for (int i = 0; i < NODES && all; i++)
			all = pids[i] <= 0 || (cluster_ok(ports[i]) && replica_linked(ports[i]));
		if (all)
			return true;
		usleep(100 * 1000);
	}
	return false;
}

__attribute__((unused))
static int live_port(void)
{
	for (int i = 0; i < NODES; i++)
		if (pids[i] > 0)
			return ports[i];
	return 0;
}

/* The port of slot's master, as a running node sees it; 0 if none. */
__attribute__((unused))
static int master_of(unsigned slot)
{
	redisReply *r = admin(live_port(), "CLUSTER SLOTS");
	int port = 0;

	for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		redisReply *e = r->element[i];

		if ((long long)slot >= e->element[0]->integer && (long long)slot <= e->element[1]->integer)
			port = (int)e->element[2]->element[1]->integer;
	}
	freeReplyObject(r);
	return port;
}

/* The masters' ports (n at most); returns how many. */
__attribute__((unused))
static int masters(int *out, int n)
{
	redisReply *r = admin(live_port(), "CLUSTER SLOTS");
	int m = 0;

	for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		int port = (int)r->element[i]->element[2]->element[1]->integer;
		bool seen = false;

		for (int j = 0; j < m; j++)
			seen |= out[j] == port;
		if (!seen && m < n)
			out[m++] = port;
	}
	freeReplyObject(r);
	return m;
}

__attribute__((unused))
static int node_index(int port)
{
	for (int i = 0; i < NODES; i++)
		if (ports[i] == port)
			return i;
	return -1;
}

__attribute__((unused))
static bool node_id(int port, char *id, size_t len)
{
	redisReply *r = admin(port, "CLUSTER MYID");
	bool ok = r && r->type == REDIS_REPLY_STRING;

	if (ok)
		snprintf(id, len, "%s", r->str);
	freeReplyObject(r);
	return ok;
}

__attribute__((unused))
static bool cluster_start(void)
{
	char *argv[4 + NODES + 8];
	char addr[NODES][32], log[512];
	int argc = 0, status;
	pid_t pid;
	double end;

	for (int i = 0; i < NODES; i++)
		if (!write_conf(i) || !node_start(i))
			return false;
	end = now_ms() + 10000;
	for (int i = 0; i < NODES; i++) {
		redisReply *r = NULL;

		while (now_ms() < end && !(r = admin(ports[i], "PING"))) {
			if (waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
				pids[i] = 0;
				diag("redis-server for port %d exited (installed? tools/dev.sh deps installs it)", ports[i]);
				return false;
			}
			usleep(50 * 1000);
		}
		if (!r) {
			diag("redis-server on port %d did not answer (see %s/redis-%d.log)", ports[i], dir, ports[i]);
			return false;
		}
		freeReplyObject(r);
	}
	argv[argc++] = "redis-cli";
	argv[argc++] = "-a";
	argv[argc++] = PASS;
	argv[argc++] = "--no-auth-warning";
	argv[argc++] = "--cluster";
	argv[argc++] = "create";
	for (int i = 0; i < NODES; i++) {
		snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", ports[i]);
		argv[argc++] = addr[i];
	}
	argv[argc++] = "--cluster-replicas";
	argv[argc++] = "1";
	argv[argc++] = "--cluster-yes";
	argv[argc] = NULL;
	snprintf(log, sizeof(log), "%s/cluster-create.log", dir);
	pid = spawn(argv, log);
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		diag("redis-cli --cluster create failed (see %s)", log);
		return false;
	}
	return wait_cluster_ok(20000);
}

/* Cleanup at exit and on signals. */
__attribute__((unused))
static void cluster_handlers(void)
{
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGHUP, on_signal);
	atexit(cleanup);
}

/* The nodes' temporary folder. */
__attribute__((unused))
static bool cluster_folder(void)
{
	if (!mkdtemp(dir))
		return false;
	have_dir = true;
	return true;
}

/* kvqd's [remote] secrets for this cluster, in a folder of their own:
 * password (ACL_USER's) and hmac, each mode 0600. */
__attribute__((unused))
static char secrets[] = "/tmp/kvq-remote-secrets.XXXXXX";

__attribute__((unused))
static bool secret_write(const char *name, const char *content)
{
	char p[128];
	FILE *f;

	snprintf(p, sizeof p, "%s/%s", secrets, name);
	f = fopen(p, "w");
	if (!f)
		return false;
	fputs(content, f);
	return fclose(f) == 0 && chmod(p, 0600) == 0;
}

/* The folder, the password and hmac_key. */
__attribute__((unused))
static bool secrets_write(const char *hmac_key)
{
	return mkdtemp(secrets) && secret_write("password", ACL_PASS "\n") && secret_write("hmac", hmac_key);
}

__attribute__((unused))
static void secrets_remove(void)
{
	char p[128];

	snprintf(p, sizeof p, "%s/password", secrets);
	unlink(p);
	snprintf(p, sizeof p, "%s/hmac", secrets);
	unlink(p);
	rmdir(secrets);
}

#ifdef KVQ_TAP_H
/* The test's start: cleanup at exit and on signals, a folder, free ports
 * and the cluster, each an ok() line.  Returns false (the test failed)
 * when any did not come. */
__attribute__((unused))
static bool cluster_up(void)
{
	cluster_handlers();
	tap_seed();
	return ok(cluster_folder(), "a temporary folder") && ok(pick_ports(), "%d free ports", NODES) &&
	       ok(cluster_start(), "a cluster of 3 masters and 3 replicas on ports %d..%d (%s)", ports[0],
		  ports[NODES - 1], dir);
}
#endif

#endif
