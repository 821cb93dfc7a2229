/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration test of the operator's view: a real kvqd with metrics on a
 * loopback port, libkvq clients that publish and look up blocks, and the
 * kvqctl binary run as a new user would run it.  Each figure kvqctl and the
 * metrics report is compared with what the clients did.
 *
 * KVQ_TEST_KVQD names the kvqd binary, KVQ_TEST_KVQCTL the kvqctl binary
 * (defaults: $top_builddir/daemon/kvqd, $top_builddir/kvqctl/kvqctl).
 */
#include <config.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../metrics.h"
#include "kvq.h"
#include "layout.h"

#define L_ 2
#define H_ 2
#define D_ 32
#define B_ 16
#define NB 3                       /* blocks published */
#define POOL "ctl"
#define MODEL "test/ctl@1"
#define OUT_MAX (1 << 20)

static char sock_path[108], tmpdir[64], daemon_bin[512], ctl_bin[512];
/* kvqctl copied where any uid may run it, for the runs as another user:
 * the build tree may sit in a home only its owner enters */
static char other_dir[64], other_bin[128];

struct run {
	int status;                  /* exit code, or -1 */
	char out[OUT_MAX], err[4096];
};

static struct run R;

/* Runs kvqctl with args (NULL-terminated) as uid (or the caller: -1);
 * fills R.  Returns the exit code. */
static int kvqctl_as(int uid, const char *const *args)
{
	const char *argv[32];
	int po[2], pe[2], st = 0, n = 0;
	size_t lo = 0, le = 0;
	pid_t pid;

	argv[n++] = ctl_bin;
	for (; *args && n < 31; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	memset(&R, 0, sizeof(R));
	R.status = -1;
	if (pipe(po) < 0 || pipe(pe) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(pe[0]);
		if (uid >= 0 && (setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid((uid_t)uid) < 0))
			_exit(120);
		if (uid >= 0)
			argv[0] = other_bin;
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	for (;;) {
		struct pollfd p[2] = { { .fd = po[0], .events = POLLIN }, { .fd = pe[0], .events = POLLIN } };
		ssize_t k;

		if (p[0].fd < 0 && p[1].fd < 0)
			break;
		if (poll(p, 2, 10000) <= 0)
			break;
		if (p[0].revents) {
			k = read(po[0], R.out + lo, sizeof(R.out) - 1 - lo);
			if (k <= 0) {
				close(po[0]);
				po[0] = -1;
			} else
				lo += (size_t)k;
		}
		if (p[1].revents) {
			k = read(pe[0], R.err + le, sizeof(R.err) - 1 - le);
			if (k <= 0) {
				close(pe[0]);
				pe[0] = -1;
			} else
				le += (size_t)k;
		}
		if (po[0] < 0 && pe[0] < 0)
			break;
	}
	if (po[0] >= 0)
		close(po[0]);
	if (pe[0] >= 0)
		close(pe[0]);
	waitpid(pid, &st, 0);
	R.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	return R.status;
}

/* Copies from to to (mode 0755).  0 or -1. */
static int copy_file(const char *from, const char *to)
{
	char buf[65536];
	FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
	size_t k;
	int r = in && out ? 0 : -1;

	while (r == 0 && (k = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, k, out) != k)
			r = -1;
	if (in && ferror(in))
		r = -1;
	if (out && fclose(out) != 0)
		r = -1;
	if (in)
		fclose(in);
	return r == 0 ? chmod(to, 0755) : -1;
}

/*
 * The kvqctl binary copied into a new directory of mode 0755 (other_dir,
 * other_bin).  kvqctl links no library of the tree (the protocol and
 * layout code are built into it), so the copy runs on its own.  0 or -1.
 */
static int other_copy(void)
{
	snprintf(other_dir, sizeof(other_dir), "/tmp/kvqctl-other.XXXXXX");
	if (!mkdtemp(other_dir) || chmod(other_dir, 0755) < 0)
		return -1;
	snprintf(other_bin, sizeof(other_bin), "%s/kvqctl", other_dir);
	return copy_file(ctl_bin, other_bin);
}

static void other_remove(void)
{
	DIR *d = other_dir[0] ? opendir(other_dir) : NULL;
	struct dirent *e;
	char path[512];

	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", other_dir, e->d_name);
			unlink(path);
		}
	if (d) {
		closedir(d);
		rmdir(other_dir);
	}
}

#define KVQCTL(...) kvqctl_as(-1, (const char *const[]){ "--socket", sock_path, __VA_ARGS__, NULL })
#define KVQCTL_NOBODY(...) kvqctl_as(65534, (const char *const[]){ "--socket", sock_path, __VA_ARGS__, NULL })

/* One JSON document: balanced brackets outside strings, ending in a newline,
 * nothing after it. */
static bool json_shape(const char *s)
{
	int depth = 0;
	bool in_str = false;
	size_t n = strlen(s);

	if (n < 3 || s[0] != '{' || s[n - 1] != '\n')
		return false;
	for (size_t i = 0; i + 1 < n; i++) {
		char c = s[i];

		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
			continue;
		}
		if (c == '"')
			in_str = true;
		else if (c == '{' || c == '[')
			depth++;
		else if (c == '}' || c == ']') {
			if (--depth < 0)
				return false;
			if (depth == 0 && i + 2 != n)
				return false;
		}
	}
	return depth == 0 && !in_str;
}

/* ---------------------------------------------------------------- limits */

#define HANDSHAKE_MS 300

/* kvqd's connection limit: 1024, or half of RLIMIT_NOFILE less 96 (kvqd
 * raises its soft limit to the hard one it inherits from here). */
static double expected_max_connections(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_max == RLIM_INFINITY || (rl.rlim_max - 96) / 2 >= 1024)
		return 1024;
	return (double)((rl.rlim_max - 96) / 2);
}

/* Connects and says nothing: 1 when kvqd closes it, telling why
 * (-ETIMEDOUT), after about handshake_timeout_ms. */
static int silent_connection(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), closed = 0;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint8_t buf[512];
	ssize_t n = 0, got = 0;

	memcpy(a.sun_path, sock_path, strlen(sock_path));
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		return 0;
	/* the notice, then the end of the stream */
	while (poll(&p, 1, HANDSHAKE_MS + 2000) == 1 && (n = read(fd, buf + got, sizeof(buf) - (size_t)got)) > 0)
		got += n;
	closed = n == 0 && got > 4 && memmem(buf, (size_t)got, "handshake_timeout_ms", 20) != NULL;
	close(fd);
	return closed;
}

/* ---------------------------------------------------------------- the test */

static uint32_t tokens[NB * B_ + 1];

static kvq_client *open_pool(const char *name)
{
	struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = L_, .kv_heads = H_, .head_dim = D_,
		.block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1, .n_sealed = 16, .n_open = 4,
		.device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(sock_path, name, &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &p) < 0) {
		diag("attach: %s", kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Waits until the daemon reports no referenced blocks (a closed client's
 * lease goes when the daemon reads the end of stream). */
static bool wait_unreferenced(kvq_client *mon)
{
	struct kvq_stats st;

	for (int i = 0; i < 500; i++) {
		if (kvq_client_stats(mon, POOL, &st) == 0 && st.referenced == 0)
			return true;
		usleep(10000);
	}
	return false;
}

static void test_plan(void)
{
	double w16, w4, f16, i8, tf16, ti8;

	ok(KVQCTL("--json", "plan", "--model", "Llama-3-70B", "--weight-bits", "16") == 0 && json_shape(R.out),
	   "plan --json: one JSON document (exit %d)", R.status);
	w16 = jnum(R.out, NULL, "weights_bytes");
	ok(w16 > 139e9 && w16 < 142e9, "plan: 70B at 16-bit weights needs about 140 GB (%.2f GB)", w16 / 1e9);
	f16 = jnum(R.out, "\"policy\":\"f16\"", "kv_bytes_per_token");
	i8 = jnum(R.out, "\"policy\":\"int8\"", "kv_bytes_per_token");
	/* 2 (K and V) x 80 layers x 8 KV heads x 128 dims x 2 bytes */
	ok(f16 == 2.0 * 80 * 8 * 128 * 2, "plan: f16 KV per token of 70B = 2*L*H*D*2 = 327680 bytes (%.0f)", f16);
	/* int8: one code per value plus a 2-byte scale per token per head */
	ok(i8 == 2.0 * 80 * 8 * (128 + 2), "plan: int8 KV per token = 2*L*H*(D+2) = 166400 bytes (%.0f)", i8);
	ok(KVQCTL("--json", "plan", "--model", "Llama-3-70B", "--weight-bits", "4", "--gpu-memory", "80GB") == 0,
	   "plan at 4-bit weights (exit %d)", R.status);
	w4 = jnum(R.out, NULL, "weights_bytes");
	ok(w4 > 34e9 && w4 < 36e9, "plan: 70B at 4-bit weights needs about 35 GB (%.2f GB)", w4 / 1e9);
	tf16 = jnum(R.out, "\"policy\":\"f16\"", "tokens_in_budget");
	ti8 = jnum(R.out, "\"policy\":\"int8\"", "tokens_in_budget");
	ok(ti8 / tf16 > 1.9 && ti8 / tf16 < 2.0, "plan: int8 KV holds about twice the tokens of f16 (%.0f vs %.0f)",
	   ti8, tf16);
	ok(jnum(R.out, NULL, "kv_budget_bytes") == 80e9 * 0.9 - w4, "plan: KV budget = memory x 0.9 - weights");
	ok(KVQCTL("plan", "--model", "SmolLM2-135M") == 0 && strstr(R.out, "SmolLM2-135M") &&
	   strstr(R.out, "kivi2") && !strstr(R.out, "int4g128"),
	   "plan table for SmolLM2-135M: every policy its head dim (64) allows");
	ok(KVQCTL("plan", "--layers", "4", "--kv-heads", "2", "--head-dim", "32", "--params", "1M", "--policy",
		  "0-1:int8;2-:kivi2") == 0 && strstr(R.out, "0-1:int8;2-3:kivi2"),
	   "plan with explicit geometry and a mixed policy (canonical form in the table)");
	ok(KVQCTL("plan", "--model", "GPT-9") == 2 && strstr(R.err, "unknown model") && !strchr(strchr(R.err, '\n') + 1, '\n'),
	   "plan with an unknown model: exit 2, one line");
	{
		/* sink blocks: block 0 of a sequence is an open slice (f16) in place of an int8 block */
		double plain, sink;

		KVQCTL("--json", "plan", "--model", "Llama-3-70B", "--context", "8192");
		plain = jnum(R.out, "\"policy\":\"int8\"", "kv_bytes_per_sequence");
		KVQCTL("--json", "plan", "--model", "Llama-3-70B", "--context", "8192", "--sink-blocks", "1");
		sink = jnum(R.out, "\"policy\":\"int8\"", "kv_bytes_per_sequence");
		ok(sink - plain == 32.0 * 80 * 8 * 128 * 2 * 2 - 32.0 * 80 * 8 * (128 + 2) * 2 &&
		   jnum(R.out, NULL, "sink_blocks") == 1,
		   "plan --sink-blocks 1: a sequence holds an f16 block in place of an int8 one (+%.0f bytes)",
		   sink - plain);
	}
}

int main(void)
{
	const char *top = getenv("top_builddir"), *env_ctl = getenv("KVQ_TEST_KVQCTL");
	static char body[1 << 20], extra[128];
	struct kvq_stats st;
	kvq_client *a = NULL, *b = NULL;
	uint32_t ids[NB], got[NB], hit = 0, n = 0, bpt;
	int port, samples, silent;
	pid_t d;

	if (env_ctl)
		snprintf(ctl_bin, sizeof(ctl_bin), "%s", env_ctl);
	else
		snprintf(ctl_bin, sizeof(ctl_bin), "%s/kvqctl/kvqctl", top ? top : ".");
	for (uint32_t i = 0; i < NB * B_ + 1; i++)
		tokens[i] = 500 + i * 3;
	port = free_port();
	snprintf(extra, sizeof(extra), "metrics_listen = 127.0.0.1:%d\nhandshake_timeout_ms = %d\n", port,
		 HANDSHAKE_MS);
	d = test_daemon_start_conf("host", "ctl", extra, tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path),
				   daemon_bin, sizeof(daemon_bin));
	if (!ok(d > 0 && port > 0, "kvqd starts with metrics on 127.0.0.1:%d", port))
		return done_testing();

	test_plan();

	/* errors a new user meets first */
	ok(kvqctl_as(-1, (const char *const[]){ "--socket", "/nonexistent/kvqd.sock", "stats", NULL }) == 1 &&
	   strstr(R.err, "not running") && !R.out[0], "no daemon: exit 1, 'kvqd is not running' on stderr");
	/* the global options anywhere, each command its own --help, "--" */
	ok(kvqctl_as(-1, (const char *const[]){ "stats", "--socket", "/nonexistent/kvqd.sock", "--help", NULL }) == 0 &&
	   strstr(R.out, "Usage: kvqctl [OPTION]... stats [POOL]") && strstr(R.out, "--json") && !R.err[0],
	   "stats --help: the command's usage, exit 0, no daemon asked");
	ok(kvqctl_as(-1, (const char *const[]){ "pool", "create", "-h", NULL }) == 0 &&
	   strstr(R.out, "pool create NAME --model ID") && strstr(R.out, "--acl-gids"),
	   "pool create -h: its options");
	ok(kvqctl_as(-1, (const char *const[]){ "pool", "--help", NULL }) == 0 && strstr(R.out, "pool create") &&
	   strstr(R.out, "pool drop NAME"), "pool --help: both pool commands");
	ok(kvqctl_as(-1, (const char *const[]){ "plan", "--model", "SmolLM2-135M", "--json", NULL }) == 0 &&
	   json_shape(R.out), "plan --model M --json: JSON (a global option after a command's own)");
	ok(kvqctl_as(-1, (const char *const[]){ "stats", "--frob", NULL }) == 2 && strstr(R.err, "--frob") &&
	   strstr(R.err, "kvqctl stats --help"), "stats --frob: exit 2, the option named, the command's help pointed to");
	ok(kvqctl_as(-1, (const char *const[]){ "pools", "extra", NULL }) == 2 && strstr(R.err, "usage: kvqctl pools"),
	   "pools with an argument: exit 2, its usage");
	ok(kvqctl_as(-1, (const char *const[]){ "pool", "frob", NULL }) == 2 && strstr(R.err, "unknown command 'pool frob'"),
	   "pool frob: unknown command, exit 2");
	KVQCTL("stats", "--", "--json");
	ok(R.status == 1 && strstr(R.err, "unknown pool") && strstr(R.err, "--json"),
	   "stats -- --json: after --, --json is a pool name (exit %d)", R.status);
	KVQCTL("stats", "nope");
	ok(R.status == 1 && strstr(R.err, "unknown pool"), "unknown pool: exit 1, '%.*s'", (int)strcspn(R.err, "\n"),
	   R.err);
	ok(KVQCTL("frobnicate") == 2 && strstr(R.err, "unknown command"), "unknown command: exit 2");

	/* A publishes NB blocks and keeps them; B finds them and misses once */
	a = open_pool("worker-a");
	b = open_pool("worker-b");
	ok(a && b, "two libkvq clients attach (the first creates the pool)");
	if (!a || !b)
		goto out;
	ok(kvq_client_alloc(a, 0, NB, NULL, NULL, ids) == 0 &&
	   kvq_client_publish(a, NB, ids, -1, tokens, NULL, 0, got) == 0, "A allocates and publishes %d blocks", NB);
	n = (uint32_t)kvq_client_lookup(b, tokens, NB * B_ + 1, NB * B_, NULL, 0, ids, &hit);
	ok(n == 0 && hit == NB, "B's lookup of %d tokens hits %u blocks", NB * B_, hit);
	tokens[0]++;
	ok(kvq_client_lookup(b, tokens, NB * B_ + 1, 2 * B_, NULL, 0, got, &n) == 0 && n == 0,
	   "B's lookup of another prompt (%d tokens) misses", 2 * B_);
	tokens[0]--;
	bpt = (uint32_t)(kvq_client_layout(a)->sealed_block_bytes / B_);

	ok(KVQCTL("--json", "stats", POOL) == 0 && json_shape(R.out), "--json stats: one JSON document");
	ok(kvqctl_as(-1, (const char *const[]){ "stats", "--json", POOL, "--socket", sock_path, NULL }) == 0 &&
	   json_shape(R.out) && jnum(R.out, NULL, "bytes_per_token") > 0,
	   "stats --json POOL --socket PATH: the same document");
	ok(jnum(R.out, NULL, "lookup_tokens") == NB * B_ + 2 * B_ && jnum(R.out, NULL, "hit_tokens") == NB * B_,
	   "stats: %d of %d tokens looked up hit", NB * B_, NB * B_ + 2 * B_);
	ok(jnum(R.out, NULL, "hit_rate") == (double)(NB * B_) / (NB * B_ + 2 * B_), "stats: hit rate %g",
	   jnum(R.out, NULL, "hit_rate"));
	ok(jnum(R.out, NULL, "cached") == NB && jnum(R.out, NULL, "referenced") == NB,
	   "stats: %d blocks cached, all referenced", NB);
	ok(jnum(R.out, NULL, "bytes_per_token") == bpt, "stats: bytes per token %u as the layout computes", bpt);
	ok(fabs(jnum(R.out, NULL, "ratio_to_f16") - 0.5) < 0.05, "stats: int8 is about half of f16 (%g)",
	   jnum(R.out, NULL, "ratio_to_f16"));
	ok(jnum(R.out, NULL, "capacity_bytes") == kvq_client_layout(a)->total_bytes &&
	   jnum(R.out, NULL, "device_memory_bytes") > jnum(R.out, NULL, "capacity_bytes") &&
	   jnum(R.out, NULL, "capacity_share_of_device") > 0,
	   "stats: capacity, device memory and the share the pool takes");
	ok(jnum(R.out, NULL, "clients_attached") == 2, "stats: 2 clients attached");
	ok(jnum(R.out, "\"devices\"", "pools") == 1 &&
	   jnum(R.out, "\"devices\"", "capacity_bytes") == kvq_client_layout(a)->total_bytes &&
	   jnum(R.out, "\"devices\"", "used_bytes") == jnum(R.out, "\"pools\"", "used_bytes"),
	   "stats: per-device totals of the pools listed (one pool: its capacity and bytes in use)");
	{
		char id[64];

		snprintf(id, sizeof(id), "\"id\":%llu,", (unsigned long long)kvq_client_id(a));
		ok(jnum(R.out, id, "sealed_blocks") == NB && jnum(R.out, id, "bytes") == NB * (double)bpt * B_,
		   "stats: per-client blocks: A holds %d sealed blocks", NB);
	}
	ok(KVQCTL("stats") == 0 && strstr(R.out, "pool ctl") && strstr(R.out, "hit rate 60.0%") &&
	   strstr(R.out, "worker-a") && strstr(R.out, "backend host"), "stats as a table: pool, hit rate, clients");
	ok(KVQCTL("pools") == 0 && strstr(R.out, "ctl ") && strstr(R.out, "int8"), "pools: one line per pool");
	ok(KVQCTL("clients", POOL) == 0 && strstr(R.out, "worker-a") && strstr(R.out, "worker-b"),
	   "clients: both workers listed");
	ok(KVQCTL("--json", "flush", POOL) == 0 && jnum(R.out, NULL, "evicted") == 0,
	   "flush while every block is referenced evicts nothing");

	/* A goes, B releases: the blocks stay cached with no reference */
	kvq_client_free(a);
	a = NULL;
	ok(kvq_client_release(b, hit, ids, 0, NULL) == 0 && wait_unreferenced(b), "A leaves, B releases its hits");

	if (geteuid() == 0 && chmod(tmpdir, 0755) == 0 && chmod(sock_path, 0666) == 0) {
		ok(other_copy() == 0, "kvqctl copied to %s for uid 65534", other_dir);
		ok(KVQCTL_NOBODY("--version") == 0 && strstr(R.out, "kvqctl "),
		   "kvqctl runs as uid 65534 (--version: exit %d)", R.status);
		KVQCTL_NOBODY("flush", POOL);
		ok(R.status == 1 && strstr(R.err, "permission denied"), "flush as uid 65534: exit 1, '%.*s'",
		   (int)strcspn(R.err, "\n"), R.err);
		ok(KVQCTL_NOBODY("pool", "drop", POOL) == 1 && strstr(R.err, "permission denied"),
		   "pool drop as uid 65534: refused");
		ok(kvq_client_stats(b, POOL, &st) == 0 && st.cached == NB, "nothing was evicted by the refused calls");
		chmod(sock_path, 0660);
		chmod(tmpdir, 0700);
		other_remove();
	} else {
		ok(1, "admin operations refused for other users # SKIP not running as root");
	}

	ok(KVQCTL("--json", "evict", POOL, "1") == 0 && jnum(R.out, NULL, "evicted") == 1, "evict 1: one block goes");
	ok(KVQCTL("flush", POOL) == 0 && strstr(R.out, "2 cached blocks evicted"), "flush: the other 2 go");
	ok(kvq_client_stats(b, POOL, &st) == 0 && st.cached == 0 && st.evictions == NB,
	   "the pool has no cached block left, %d evictions counted", NB);

	ok(KVQCTL("pool", "drop", POOL) == 1 && strstr(R.err, "clients attached"), "pool drop refused while attached");
	ok(KVQCTL("pool", "create", "extra", "--model", "m@2", "--layers", "4", "--kv-heads", "2", "--head-dim", "64",
		  "--policy", "k=int8,v=int4g64", "--capacity", "2M") == 0 && strstr(R.out, "pool extra created"),
	   "pool create at run time");
	ok(KVQCTL("pool", "create", "extra", "--model", "m@2", "--layers", "4", "--kv-heads", "2", "--head-dim", "64",
		  "--policy", "int8") == 1 && strstr(R.err, "exists"), "creating it twice: exit 1, exists");
	ok(KVQCTL("--json", "pools") == 0 && strstr(R.out, "\"name\":\"extra\"") &&
	   jnum(R.out, "\"name\":\"extra\"", "capacity_bytes") <= 2 << 20, "the new pool is listed, within its capacity");
	ok(KVQCTL("pool", "create", "sinky", "--model", "m@3", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		  "--policy", "int4g32", "--sealed", "32", "--open", "4", "--sink-blocks", "1", "--sinks", "3") == 0 &&
	   strstr(R.out, "+ 3 sink slots"), "pool create --sink-blocks 1 --sinks 3");
	ok(KVQCTL("--json", "pools") == 0 && jnum(R.out, "\"name\":\"sinky\"", "sink_blocks") == 1 &&
	   jnum(R.out, "\"name\":\"sinky\"", "sink_slots") == 3 && jnum(R.out, "\"name\":\"sinky\"", "sink_free") == 3,
	   "stats --json: the pool's sink blocks, 3 sink slots, all free");
	ok(KVQCTL("pools") == 0 && strstr(R.out, "0/3"), "pools: sink slots in use of all (0/3)");
	ok(KVQCTL("pool", "create", "sinkless", "--model", "m@3", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
		  "--policy", "int8", "--sealed", "32", "--open", "4", "--sinks", "3") == 2 && strstr(R.err, "--sink-blocks 1"),
	   "pool create --sinks without --sink-blocks 1: exit 2");

	/* metrics */
	silent = silent_connection();
	ok(silent, "a connection that sends no Hello is closed after handshake_timeout_ms");
	ok(http_get(port, "/metrics", body, sizeof(body)) > 0 && strstr(body, " 200 ") &&
	   strstr(body, "text/plain; version=0.0.4"), "GET /metrics: 200, text format 0.0.4");
	{
		char *text = strstr(body, "\r\n\r\n"), copy[sizeof(body)];

		text = text ? text + 4 : body;
		snprintf(copy, sizeof(copy), "%s", text);
		samples = parse_exposition(copy);
		ok(samples > 50, "every line of the exposition parses (%d samples%s)", samples,
		   samples < 0 ? ": bad line" : "");
		ok(metric(text, "kvq_prefix_hit_tokens_total{pool=\"ctl\"} ") == NB * B_ &&
		   metric(text, "kvq_prefix_lookup_tokens_total{pool=\"ctl\"} ") == NB * B_ + 2 * B_,
		   "metrics: hit and lookup tokens of pool ctl");
		ok(metric(text, "kvq_evictions_total{pool=\"ctl\"} ") == NB, "metrics: %d evictions", NB);
		ok(metric(text, "kvq_blocks{pool=\"ctl\",state=\"cached\"} ") == 0 &&
		   metric(text, "kvq_blocks{pool=\"ctl\",state=\"free\"} ") == 16,
		   "metrics: blocks by state (16 free, 0 cached)");
		ok(metric(text, "kvq_pool_clients{pool=\"ctl\"} ") == 1 && metric(text, "kvq_pool_clients{pool=\"extra\"} ") == 0,
		   "metrics: clients per pool");
		ok(metric(text, "kvq_pool_sealed_bytes_per_token{pool=\"ctl\"} ") == bpt, "metrics: bytes per token");
		ok(metric(text, "kvq_pool_sink_slots{pool=\"sinky\"} ") == 3 &&
		   metric(text, "kvq_blocks{pool=\"sinky\",state=\"sink_free\"} ") == 3 &&
		   metric(text, "kvq_pool_sink_slots{pool=\"ctl\"} ") == 0, "metrics: sink slots (3 free; 0 without)");
		ok(metric(text, "kvq_connections_max ") == expected_max_connections(),
		   "metrics: the connection limit (%g: max_connections, or what the fd limit allows)",
		   metric(text, "kvq_connections_max "));
		ok(metric(text, "kvq_connection_timeouts_total{timeout=\"handshake\"} ") == silent &&
		   metric(text, "kvq_connection_timeouts_total{timeout=\"idle\"} ") == 0 &&
		   metric(text, "kvq_connections_refused_total{limit=\"max_connections\"} ") == 0 &&
		   metric(text, "kvq_connections_refused_total{limit=\"max_connections_per_uid\"} ") == 0 &&
		   metric(text, "kvq_connections_refused_total{limit=\"file_descriptors\"} ") == 0 &&
		   metric(text, "kvq_backpressure_total ") == 0 && metric(text, "kvq_accept_pauses_total ") == 0,
		   "metrics: the silent connection's timeout counted; no refusal, no back-pressure");
		ok(metric(text, "kvq_request_duration_seconds_count{request=\"lookup\"} ") == 2 &&
		   metric(text, "kvq_request_duration_seconds_bucket{request=\"lookup\",le=\"+Inf\"} ") == 2,
		   "metrics: latency histogram counts B's 2 lookups");
	}
	ok(http_get(port, "/other", body, sizeof(body)) > 0 && strstr(body, " 404 "), "GET /other: 404");

	ok(KVQCTL("pool", "drop", "extra") == 0 && KVQCTL("--json", "pools") == 0 && !strstr(R.out, "\"extra\""),
	   "pool drop frees a pool nobody attached to");
	ok(KVQCTL("pool", "drop", "sinky") == 0, "pool drop of the pool with sink blocks");
out:
	kvq_client_free(a);
	kvq_client_free(b);
	test_daemon_stop(d, tmpdir);
	return done_testing();
}
