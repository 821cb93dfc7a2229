/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Client processes' pidfds in the fd store (daemon/procs.h), with a real
 * kvqd under the test's own service manager (tests/sdmgr.h):
 *  - the store holds one pidfd per client process that attached (two
 *    connections of one process: one pidfd), named kvq.pidfd.PID.START;
 *    it stays while any connection of the process is attached and leaves
 *    when the last closes (the process alive), or when the process exits
 *    (seen before it is reaped: kvqd removes it, not the manager's poll);
 *  - a worker alive across a kill -9 keeps its slots, its pidfd stays
 *    stored, and when it exits its slots are free within 300 ms (the
 *    exit seen through the pidfd: a zombie's /proc entry would fool the
 *    once-a-second look), three times; its pidfd then leaves the store;
 *  - a stored pidfd no books hold for is dropped at start;
 *  - a manager that does not read (its queue full): attaches of 24
 *    processes are each answered within a bound, Stats too, and once it
 *    reads again every pidfd reaches the store; 72 processes: 64 pidfd
 *    messages wait in kvqd and arrive, the rest are dropped with a log
 *    line, every attach answered within the bound.
 */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../sdmgr.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

#define L_ 2
#define H_ 2
#define QH_ 4
#define D_ 32
#define B_ 16
#define NTOK 40
#define NQ 2
#define MODEL "test/pidfd@1"
#define WAIT_MS 10000
#define PROMPT_MS 300           /* a hold ends this soon after its process exits */
#define N_STALL 24              /* processes attaching while the manager does not read */
#define ATTACH_MS 2000          /* the bound on each of their attaches */
#define FDQ_MAX 64              /* pidfd messages kvqd keeps waiting (daemon/fdq.h) */
#define N_OVER (FDQ_MAX + 8)

typedef float att_t[L_][NQ * QH_ * D_];

#include "../prompts.h"

static struct sdmgr m;
static char bin[256], conf[128], logp[128], unused[128];

static bool start(const char *what)
{
	char *argv[] = { bin, "--config", conf, "--socket", unused, "--backend", "host", "--foreground", NULL };
	pid_t pid = sdmgr_start(&m, bin, argv, logp);
	int r = pid > 0 ? sdmgr_wait_ready(&m, WAIT_MS) : (int)pid;

	if (r < 0)
		diag("%s: kvqd did not start: %d (wait status %#x)", what, r, m.wstatus);
	return r == 0;
}

static kvq_client *open_warm(void)
{
	struct kvq_attach_params a = { .pool = "warm", .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(m.sock_path, "pidfd", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &a) < 0) {
		diag("attach: %s", kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

static uint64_t held_now(void)
{
	kvq_client *c = open_warm();
	uint64_t v = UINT64_MAX;

	if (c && kvq_client_pool_stat(c, "warm", "restart_held", &v) < 0)
		v = UINT64_MAX;
	kvq_client_free(c);
	return v;
}

/*
 * A client process driven over a pipe: it attaches n_conns connections
 * (the first keeps prompt p's sequence: slots held), says 'y' on up, then
 * for each byte on down: 'c' closes its last connection, anything else
 * (or EOF) exits.
 */
struct client {
	pid_t pid;
	int up, down;
	char name[SDMGR_NAME_MAX + 1];   /* its pidfd's in the store */
};

static void client_main(int up, int down, uint32_t p, int n_conns)
{
	kvq_client *c[2] = { NULL, NULL };
	uint32_t tok[NTOK], hit;
	kvq_seq *s = NULL;
	att_t out;
	char byte = 'y';

	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 5000 + 7919 * p + 13 * i;
	for (int i = 0; i < n_conns; i++)
		if (!(c[i] = open_warm()))
			byte = 'n';
	if (byte == 'y' && prompt_run(c[0], tok, &hit, out, &s) < 0)
		byte = 'n';
	if (write(up, &byte, 1) != 1)
		_exit(3);
	while (read(down, &byte, 1) == 1 && byte == 'c' && n_conns > 0) {
		if (n_conns == 1)
			kvq_seq_free(s);
		kvq_client_free(c[--n_conns]);
		byte = 'y';
		if (write(up, &byte, 1) != 1)
			_exit(3);
	}
	_exit(0);
}

static bool client_start(struct client *w, uint32_t p, int n_conns)
{
	int up[2], down[2];
	char byte = 0;

	if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0)
		return false;
	fflush(NULL);
	w->pid = fork();
	if (w->pid == 0) {
		close(up[0]);
		close(down[1]);
		client_main(up[1], down[0], p, n_conns);
	}
	close(up[1]);
	close(down[0]);
	w->up = up[0];
	w->down = down[1];
	if (w->pid < 0 || read(w->up, &byte, 1) != 1 || byte != 'y')
		return false;
	sdmgr_pidfd_name(w->name, sizeof w->name, w->pid);
	return true;
}

/* Its last connection closed, the process alive. */
static bool client_close_one(struct client *w)
{
	char byte = 'c';

	return write(w->down, &byte, 1) == 1 && read(w->up, &byte, 1) == 1 && byte == 'y';
}

/* Killed; reaped only when reap. */
static void client_kill(struct client *w, bool reap)
{
	kill(w->pid, SIGKILL);
	if (reap)
		waitpid(w->pid, NULL, 0);
	close(w->up);
	close(w->down);
}

static bool stored(const struct sdmgr *mg, const void *name)
{
	return sdmgr_count_name(mg, name) == 1;
}

static bool not_stored(const struct sdmgr *mg, const void *name)
{
	return sdmgr_count_name(mg, name) == 0;
}

static bool n_pidfds(const struct sdmgr *mg, const void *n)
{
	return sdmgr_count_prefix(mg, "kvq.pidfd.") == *(const size_t *)n;
}

/* kvqd's log lines that contain what, as diagnostics. */
static void diag_log(const char *what)
{
	char line[1024];
	FILE *f = fopen(logp, "r");

	while (f && fgets(line, sizeof line, f))
		if (strstr(line, what))
			diag("log: %s", line);
	if (f)
		fclose(f);
}

/* Reads what kvqd sends for ms. */
static void pump_for(int ms)
{
	long until = sdmgr_now_ms() + ms;

	while (sdmgr_now_ms() < until) {
		sdmgr_pump(&m);
		usleep(20000);
	}
}

/* Pumps for ms, then whether name is stored as often as want. */
static bool still(const char *name, size_t want, int ms)
{
	pump_for(ms);
	return sdmgr_count_name(&m, name) == want;
}

static void test_stored(void)
{
	struct client a, b;
	size_t two = 2;

	if (!ok(client_start(&a, 1, 2) && client_start(&b, 2, 1),
		"two client processes attach, the first with two connections, and hold a sequence each"))
		return;
	ok(sdmgr_pump_until(&m, WAIT_MS, stored, a.name) == 0 && sdmgr_pump_until(&m, WAIT_MS, stored, b.name) == 0,
	   "the store holds %s and %s", a.name, b.name);
	ok(still(a.name, 1, 200) && n_pidfds(&m, &two), "one pidfd per process, not per connection (%zu stored)",
	   sdmgr_count_prefix(&m, "kvq.pidfd."));
	ok(client_close_one(&a) && still(a.name, 1, 300), "the first closes one connection: its pidfd stays");
	ok(client_close_one(&a) && sdmgr_pump_until(&m, WAIT_MS, not_stored, a.name) == 0,
	   "it closes its last one, alive: its pidfd leaves the store");
	/* not reaped: the manager's own watch (POLLHUP once reaped) is not what removes it */
	client_kill(&b, false);
	ok(sdmgr_pump_until(&m, WAIT_MS, not_stored, b.name) == 0,
	   "the second is killed (not reaped yet): kvqd removes its pidfd");
	waitpid(b.pid, NULL, 0);
	client_kill(&a, true);
	ok(sdmgr_count_prefix(&m, "kvq.pidfd.") == 0, "no pidfd left in the store");
}

/* A worker alive across a kill -9 whose exit frees its slots at once. */
static void test_exit_prompt(int round)
{
	struct client w;
	long t0, t = -1;
	uint64_t held;

	if (!ok(client_start(&w, 10 + (uint32_t)round, 1) && sdmgr_pump_until(&m, WAIT_MS, stored, w.name) == 0,
		"round %d: a worker holds a sequence, its pidfd stored", round))
		return;
	sdmgr_kill9(&m, WAIT_MS);
	if (!ok(start("kill -9"), "round %d: kvqd killed and started again while it lives", round))
		return;
	held = held_now();
	ok(held > 0 && held != UINT64_MAX && still(w.name, 1, 100),
	   "round %d: its slots are held (restart_held %llu), its pidfd still stored", round,
	   (unsigned long long)held);
	t0 = sdmgr_now_ms();
	client_kill(&w, false);
	while (sdmgr_now_ms() - t0 < 2 * PROMPT_MS) {
		if (held_now() == 0) {
			t = sdmgr_now_ms() - t0;
			break;
		}
		usleep(10000);
	}
	ok(t >= 0 && t < PROMPT_MS, "round %d: once it exited (not reaped), its slots are free within %d ms (%ld ms)",
	   round, PROMPT_MS, t);
	ok(sdmgr_pump_until(&m, WAIT_MS, not_stored, w.name) == 0, "round %d: and its pidfd left the store", round);
	waitpid(w.pid, NULL, 0);
}

/* A stored pidfd no books name (another start time): dropped at start. */
static void test_unmatched(void)
{
	char name[SDMGR_NAME_MAX + 1];
	pid_t child = fork();
	int fd;

	if (child == 0) {
		pause();
		_exit(0);
	}
	snprintf(name, sizeof name, "kvq.pidfd.%d.1", (int)child);
	fd = (int)syscall(SYS_pidfd_open, child, 0);
	sdmgr_stop(&m, WAIT_MS);
	ok(sdmgr_store_add(&m, name, fd) == 0, "a pidfd stored under a name no books hold for");
	ok(start("unmatched") && sdmgr_pump_until(&m, WAIT_MS, not_stored, name) == 0 &&
	   sdmgr_log_lines(logp, "no pool holds for that process: dropped") == 1,
	   "kvqd starts, closes it and removes it from the store, and says so");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
}

/* A child that attaches, says so on up (a byte), exits 0 when that took
 * less than ATTACH_MS, and waits on down until EOF. */
static pid_t stall_child(const int down[2], int up)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		long t0 = sdmgr_now_ms();
		kvq_client *c = open_warm();
		char byte;
		bool fast = c && sdmgr_now_ms() - t0 < ATTACH_MS;

		/* the test's end closed is EOF for every child */
		close(down[1]);
		byte = fast ? 'y' : 'n';
		if (write(up, &byte, 1) != 1 || read(down[0], &byte, 1) < 0)
			_exit(3);
		kvq_client_free(c);
		_exit(fast ? 0 : 1);
	}
	return pid;
}

/* The children told to exit (EOF on down) and reaped, the pipes closed:
 * how many attached within ATTACH_MS. */
static int stall_end(const pid_t *pid, int n, int down[2], int up[2])
{
	int n_fast = 0;

	close(down[1]);
	for (int i = 0; i < n; i++) {
		int st = -1;

		if (waitpid(pid[i], &st, 0) == pid[i] && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			n_fast++;
	}
	close(down[0]);
	close(up[0]);
	close(up[1]);
	return n_fast;
}

/* n bytes from up, within WAIT_MS each. */
static int read_ups(int up, int n)
{
	char byte;
	int k = 0;

	for (struct pollfd p = { .fd = up, .events = POLLIN }; k < n && poll(&p, 1, WAIT_MS) == 1; k++)
		if (read(up, &byte, 1) != 1)
			break;
	return k;
}

static void test_stalled_manager(void)
{
	int down[2], up[2], n_fast, queued;
	pid_t pid[N_STALL];
	size_t want = N_STALL;
	kvq_client *c;
	uint64_t v;
	long t0;

	if (pipe2(down, O_CLOEXEC) < 0 || pipe2(up, O_CLOEXEC) < 0)
		return;
	queued = sdmgr_stall(&m);
	ok(queued > 0, "the manager stops reading: its queue is full (%d datagrams)", queued);
	t0 = sdmgr_now_ms();
	for (int i = 0; i < N_STALL; i++) {
		pid[i] = stall_child(down, up[1]);
		/* one at a time: each attach meets the full queue */
		usleep(20000);
	}
	read_ups(up[0], N_STALL);
	c = open_warm();
	ok(c && kvq_client_pool_stat(c, "warm", "cached", &v) == 0 && sdmgr_now_ms() - t0 < 2 * ATTACH_MS + 20 * N_STALL,
	   "a Stats after %d attaches is answered at once (%ld ms since the first)", N_STALL, sdmgr_now_ms() - t0);
	kvq_client_free(c);
	n_fast = stall_end(pid, N_STALL, down, up);
	ok(n_fast == N_STALL, "every one of %d processes attached within %d ms while the manager did not read (%d)",
	   N_STALL, ATTACH_MS, n_fast);
	want = 0;
	ok(sdmgr_pump_until(&m, WAIT_MS, n_pidfds, &want) == 0 && sdmgr_count_prefix(&m, "kvq.") == 2,
	   "once it reads again, what waited is sent: their pidfds came and went, the pool's two stay");
	ok(sdmgr_log_lines(logp, "<3>") == 0, "kvqd logged no error");
}

/* More processes than kvqd keeps pidfd messages waiting for: the rest are
 * dropped (logged), attaches still answered, the first KVQ_FDQ_MAX arrive. */
static void test_overflow(void)
{
	int down[2], up[2], n_fast, n_up;
	pid_t pid[N_OVER];
	size_t want = FDQ_MAX;

	if (pipe2(down, O_CLOEXEC) < 0 || pipe2(up, O_CLOEXEC) < 0)
		return;
	ok(sdmgr_stall(&m) > 0, "the manager stops reading once more");
	for (int i = 0; i < N_OVER; i++)
		pid[i] = stall_child(down, up[1]);
	/* all attached before the manager reads: each store met a full queue */
	n_up = read_ups(up[0], N_OVER);
	ok(n_up == N_OVER, "%d processes attach while it does not read (%d)", N_OVER, n_up);
	if (sdmgr_pump_until(&m, WAIT_MS, n_pidfds, &want) == 0)
		pump_for(300);   /* nothing more comes */
	if (!ok(n_pidfds(&m, &want),
		"once it reads, the %d pidfd messages kvqd kept arrive, the rest were dropped (%zu)", FDQ_MAX,
		sdmgr_count_prefix(&m, "kvq.pidfd.")))
		diag_log("fd store");
	ok(sdmgr_log_lines(logp, "the service manager reads late") >= 1, "the log says what was dropped, and why");
	n_fast = stall_end(pid, N_OVER, down, up);
	ok(n_fast == N_OVER, "every attach was answered within %d ms (%d)", ATTACH_MS, n_fast);
	want = 0;
	ok(sdmgr_pump_until(&m, WAIT_MS, n_pidfds, &want) == 0, "once they exit, no pidfd is left in the store");
}

/* While the manager reads late, pidfds stored wait in kvqd and all arrive. */
static void test_late_arrival(void)
{
	struct client w[4];
	size_t want = 4;
	bool up = true;

	ok(sdmgr_stall(&m) > 0, "the manager stops reading again");
	for (int i = 0; i < 4; i++)
		up = client_start(&w[i], 20 + (uint32_t)i, 1) && up;
	ok(up, "four workers attach meanwhile");
	ok(sdmgr_pump_until(&m, WAIT_MS, n_pidfds, &want) == 0,
	   "once it reads, the four pidfds kvqd kept waiting are in the store");
	/* not reaped before kvqd removed them: the manager's own watch would
	 * drop them first, and kvqd's removals could still be on their way */
	for (int i = 0; i < 4; i++)
		client_kill(&w[i], false);
	want = 0;
	ok(sdmgr_pump_until(&m, WAIT_MS, n_pidfds, &want) == 0, "and gone when the workers are");
	for (int i = 0; i < 4; i++)
		waitpid(w[i].pid, NULL, 0);
}

int main(void)
{
	char extra[512];
	int st;

#ifndef HAVE_SYSTEMD
	printf("1..0 # SKIP kvqd is built without libsystemd\n");
	return 0;
#endif
	if (!ok(sdmgr_init(&m, "pidfd") == 0, "a service manager for the test"))
		return done_testing();
	test_daemon_bin(bin, sizeof bin);
	snprintf(conf, sizeof conf, "%s/kvqd.conf", m.dir);
	snprintf(logp, sizeof logp, "%s/kvqd.log", m.dir);
	snprintf(unused, sizeof unused, "%s/unused.sock", m.dir);
	snprintf(extra, sizeof extra,
		 "[pool warm]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\nblock_tokens = 16\n"
		 "policy = int8\ncapacity = 256K\n");
	if (!ok(test_daemon_conf(conf, "host", "info", extra) == 0 && start("first"), "kvqd starts under it"))
		return done_testing();
	test_stored();
	for (int round = 0; round < 3; round++)
		test_exit_prompt(round);
	test_unmatched();
	test_stalled_manager();
	test_late_arrival();
	test_overflow();
	st = sdmgr_stop(&m, WAIT_MS);
	ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: kvqd exits 0 (%#x)", st);
	ok(sdmgr_log_lines(logp, "<3>") == 0, "kvqd logged no error");
	sdmgr_fini(&m);
	return done_testing();
}
