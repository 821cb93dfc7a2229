/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A restart that keeps the warm cache (daemon/restart.h), with a real kvqd
 * under a service manager of the test's own (tests/sdmgr.h: the fd store
 * and socket activation as systemd 252 does them) and host pools: a pool of
 * kvqd.conf with a host tier and one an Attach created.
 *  - SIGTERM, then a start: every prompt published before is a whole hit
 *    again, from the pool or its host tier, and attention over it equals
 *    the cold reference bit for bit; the attach-created pool is back before
 *    anyone attaches;
 *  - kill -9 at random points while a worker publishes, evicts, demotes
 *    and promotes, 50 times: after each start every lookup is a hit of
 *    whole blocks whose attention equals the reference (never a wrong
 *    block), and hits there are;
 *  - two workers alive across a kill -9 keep their slots: what each holds
 *    is not handed out while it lives (its attention over them is
 *    unchanged after another worker filled the pool), and is released when
 *    it exits, the other's still held;
 *  - a worker's own clients alive across a kill -9 (libkvq reconnecting):
 *    each client's first request fails, its sequences are stale from then
 *    on (-ESTALE: no write, no attention), the next request connects again
 *    with the same mapping and releases what the restart held for that
 *    client only, the other client's still held until it reconnects too;
 *    the new sequences hit what was published;
 *  - books corrupted (a flipped byte, truncated, another version) and
 *    kvqd.conf's policy changed: the pool starts cold, the reason logged;
 *    a client alive across a cold start connects again and maps the new
 *    memory (another client reads what it wrote there);
 *  - no descriptor left behind: the store holds three per pool, kvqd's
 *    own descriptors are as many after the kills as at the second start.
 * Built again as tests/gpu/test_cuda_restart (KVQ_TEST_CUDA): the same with
 * cuda pools, whose memory a restart imports from the stored descriptor
 * (D = 64, one KV split: attention over the same bytes is the same bits).
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../sdmgr.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

#ifdef KVQ_TEST_CUDA
#include <cuda_runtime_api.h>
#define D_ 64
#define DS "64"
#define CAP "512K"
#define BACKEND "cuda"
#else
#define D_ 32
#define DS "32"
#define CAP "256K"
#define BACKEND "host"
#endif

#define L_ 2
#define H_ 2
#define QH_ 4
#define B_ 16
#define NTOK 83                 /* 5 sealed blocks (a whole hit is 80 tokens) and 3 more */
#define WHOLE ((NTOK / B_) * B_)
#define NQ 2
#define NP 40                   /* prompts */
#define MODEL "test/restart@1"
#define WAIT_MS 10000
#define ROUNDS 50

typedef float att_t[L_][NQ * QH_ * D_];

#include "../prompts.h"

static struct sdmgr m;
static char bin[256], conf[128], logp[128], unused[128];
static att_t ref[NP];

static void prompt_tokens(uint32_t p, uint32_t *tok)
{
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 3000 + 7919 * p + 13 * i;
}

static int write_conf(const char *policy)
{
	char extra[1024];

	snprintf(extra, sizeof extra,
		 "host_tier_reserve = 20\n"
		 "[pool warm]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = " DS "\nblock_tokens = 16\n"
		 "policy = %s\ncapacity = " CAP "\nhost_capacity = 1M\n", policy);
	return test_daemon_conf(conf, BACKEND, "info", extra);
}

static bool start(const char *what)
{
	char *argv[] = { bin, "--config", conf, "--socket", unused, "--backend", BACKEND, "--foreground", NULL };
	pid_t pid = sdmgr_start(&m, bin, argv, logp);
	int r = pid > 0 ? sdmgr_wait_ready(&m, WAIT_MS) : (int)pid;

	if (r < 0) {
		char line[1024];
		FILE *f = fopen(logp, "r");

		diag("%s: kvqd did not start: %d (wait status %#x); its log:", what, r, m.wstatus);
		while (f && fgets(line, sizeof line, f))
			diag("  %s", line);
		if (f)
			fclose(f);
	}
	return r == 0;
}

/* Attaches to pool (created with create: "made", 48 sealed slots and a
 * host tier; "ref", room for every prompt). */
static kvq_client *open_pool(const char *pool)
{
	struct kvq_attach_params a = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
	kvq_client *c = NULL;

	if (strcmp(pool, "warm")) {
		a.create = 1;
		a.n_sealed = strcmp(pool, "ref") ? 48 : NP * (NTOK / B_) + 8;
		a.n_open = 8;
		a.backend = BACKEND;
		a.host_capacity = strcmp(pool, "ref") ? 1u << 20 : 0;
	}
	if (kvq_client_connect(m.sock_path, "restart", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &a) < 0) {
		diag("attach %s: %s", pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Prompt p from its lookup on: its hit, its attention; the sequence freed
 * (its blocks published) unless ret_seq takes it. */
static int run_prompt(kvq_client *c, uint32_t p, uint32_t *ret_hit, att_t out, kvq_seq **ret_seq)
{
	uint32_t tok[NTOK];

	prompt_tokens(p, tok);
	return prompt_run(c, tok, ret_hit, out, ret_seq);
}

/* A wrong hit's evidence, for whoever reads the log: prompt p looked up
 * again in pool and in the reference pool, each block the two hit compared
 * slice by slice (host pools: the client's mapping), and the tail of
 * kvqd's log. */
static void diag_wrong_hit(const char *pool, uint32_t p)
{
	kvq_client *c[2] = { open_pool(pool), open_pool("ref") };
	kvq_seq *s[2] = { NULL, NULL };
	const int32_t *sealed[2] = { NULL, NULL }, *open;
	uint32_t tok[NTOK], hit[2] = { 0, 0 }, ns[2] = { 0, 0 }, no;
	char line[512];
	FILE *f;

	prompt_tokens(p, tok);
	for (int i = 0; i < 2; i++)
		if (!c[i] || kvq_seq_new(c[i], NULL, 0, &s[i]) < 0 || kvq_seq_from_prompt(s[i], tok, NTOK, &hit[i]) < 0 ||
		    kvq_seq_blocks(s[i], &sealed[i], &ns[i], &open, &no) < 0)
			ns[i] = 0;
	diag("%s: prompt %u again: hit %u in %s (blocks %u), %u in ref (blocks %u)", pool, p, hit[0], pool, ns[0],
	     hit[1], ns[1]);
#ifndef KVQ_TEST_CUDA
	for (uint32_t b = 0; b < ns[0] && b < ns[1]; b++) {
		const struct kvq_layout *L = kvq_client_layout(c[0]);
		const uint8_t *base[2] = { kvq_client_base(c[0]), kvq_client_base(c[1]) };

		for (uint32_t l = 0; L && l < L->layers; l++) {
			const uint8_t *x = base[0] + kvq_layout_off(L, KVQ_SEALED, (uint32_t)sealed[0][b], l, 0, KVQ_K_CODES);
			const uint8_t *y = base[1] + kvq_layout_off(kvq_client_layout(c[1]), KVQ_SEALED,
								    (uint32_t)sealed[1][b], l, 0, KVQ_K_CODES);

			if (memcmp(x, y, L->layer[l].sealed_slice))
				diag("  block %u (id %d in %s, %d in ref), layer %u: bytes differ", b, sealed[0][b], pool,
				     sealed[1][b], l);
		}
	}
#endif
	for (int i = 0; i < 2; i++) {
		kvq_seq_free(s[i]);
		kvq_client_free(c[i]);
	}
	f = fopen(logp, "r");
	if (f && fseek(f, -4096, SEEK_END) < 0)
		rewind(f);
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		diag("  log: %s", line);
	}
	if (f)
		fclose(f);
}

/* Every prompt in pool: whole hits (want_whole) or hits of whole blocks,
 * each attending as the reference.  Returns the tokens hit, or -1 on a
 * mismatch or error (diagnosed). */
static long check_prompts(const char *pool, uint32_t from, uint32_t to, bool want_whole)
{
	kvq_client *c = open_pool(pool);
	long hits = 0;
	att_t out;

	if (!c)
		return -1;
	for (uint32_t p = from; p < to; p++) {
		uint32_t hit = 0;

		if (run_prompt(c, p, &hit, out, NULL) < 0 || hit % B_ || (want_whole && hit != WHOLE) ||
		    memcmp(out, ref[p], sizeof out)) {
			diag("%s: prompt %u: hit %u, attention %s (%s)", pool, p, hit,
			     memcmp(out, ref[p], sizeof out) ? "differs" : "equal", kvq_client_error(c));
			kvq_client_free(c);
			if (memcmp(out, ref[p], sizeof out))
				diag_wrong_hit(pool, p);
			return -1;
		}
		hits += hit;
	}
	kvq_client_free(c);
	return hits;
}

/* The pools' stored descriptors (clients' pidfds not counted:
 * test_restart_pidfd) */
static size_t stored_kvq(void)
{
	size_t n = 0;

	for (size_t i = 0; i < m.n; i++)
		n += !strncmp(m.store[i].name, "kvq.", 4) && strncmp(m.store[i].name, "kvq.pidfd.", 10);
	return n;
}

/* The store's books of pool: its entry, or -1. */
static long books_of(const char *pool)
{
	for (size_t i = 0; i < m.n; i++) {
		char name[65] = "";   /* KVQ_PROTO_MAX_NAME + 1 */

		if (strncmp(m.store[i].name, "kvq.books.", 10))
			continue;
		/* the identity starts at byte 512 with the pool's name (daemon/books.c) */
		if (pread(m.store[i].fd, name, sizeof name - 1, 512) > 0 && !strcmp(name, pool))
			return (long)i;
	}
	return -1;
}

static uint64_t figure(kvq_client *c, const char *pool, const char *name)
{
	uint64_t v = 0;

	return kvq_client_pool_stat(c, pool, name, &v) < 0 ? UINT64_MAX : v;
}

static void test_clean_restart(void)
{
	uint64_t before[4], after[4];
	kvq_client *c;
	att_t out;
	long hits;
	uint32_t hit;
	int r = 0;

	/* references, cold, in a pool that holds them all */
	c = open_pool("ref");
	for (uint32_t p = 0; c && r == 0 && p < NP; p++)
		r = run_prompt(c, p, &hit, ref[p], NULL);
	ok(c && r == 0, "%u prompts written cold for their references", NP);
	kvq_client_free(c);
	/* 16 prompts (80 blocks) through 48 sealed slots: the first ones go to the host tier */
	for (const char *pool = "warm"; pool; pool = strcmp(pool, "warm") ? NULL : "made") {
		c = open_pool(pool);
		for (uint32_t p = 0; c && r == 0 && p < 16; p++) {
			r = run_prompt(c, p, &hit, out, NULL);
			usleep(3000);
		}
		ok(c && r == 0, "%s: 16 prompts published", pool);
		kvq_client_free(c);
	}
	c = open_pool("warm");
	before[0] = c ? figure(c, "warm", "cached") : 0;
	before[1] = c ? figure(c, "warm", "tier_records") : 0;
	before[2] = c ? figure(c, "made", "cached") : 0;
	before[3] = c ? figure(c, "made", "tier_records") : 0;
	kvq_client_free(c);
	r = sdmgr_stop(&m, WAIT_MS);
	ok(r >= 0 && WIFEXITED(r) && WEXITSTATUS(r) == 0, "SIGTERM: kvqd exits 0");
	ok(stored_kvq() == 8, "the store holds books, memory and tier of warm and made, books and memory of ref (%zu)",
	   stored_kvq());
	if (!ok(start("clean"), "kvqd starts again"))
		return;
	ok(sdmgr_log_lines(logp, "pool warm taken back") == 1 && sdmgr_log_lines(logp, "pool made taken back") == 1,
	   "the log says both pools were taken back");
	c = open_pool("warm");
	after[0] = c ? figure(c, "warm", "cached") : 1;
	after[1] = c ? figure(c, "warm", "tier_records") : 1;
	after[2] = c ? figure(c, "made", "cached") : 1;
	after[3] = c ? figure(c, "made", "tier_records") : 1;
	kvq_client_free(c);
	c = open_pool("warm");
	ok(c && figure(c, "warm", "restart_blocks") == before[0] && figure(c, "warm", "restart_records") == before[1] &&
	   figure(c, "made", "restart_blocks") == before[2] && figure(c, "warm", "restart_cold") == 0 &&
	   figure(c, "warm", "restart_us") > 0,
	   "Stats: restart_blocks and restart_records say as much, restart_us %llu",
	   c ? (unsigned long long)figure(c, "warm", "restart_us") : 0ull);
	kvq_client_free(c);
	ok(!memcmp(before, after, sizeof before) && before[1] > 0 && before[3] > 0,
	   "as many cached blocks and host-tier records as before the stop (warm %llu + %llu, made %llu + %llu)",
	   (unsigned long long)after[0], (unsigned long long)after[1], (unsigned long long)after[2],
	   (unsigned long long)after[3]);
	/* what copies left behind before the stop is not there; all else is */
	hits = check_prompts("warm", 0, 16, false);
	ok(hits >= (long)(before[0] + before[1]) / 2 * B_,
	   "warm: the prompts hit again (%ld tokens), whole blocks attending as the cold reference", hits);
	hits = check_prompts("warm", 15, 16, true);
	ok(hits == WHOLE, "warm: the newest prompt is a whole hit (%ld)", hits);
	hits = check_prompts("made", 0, 16, false);
	ok(hits >= (long)(before[2] + before[3]) / 2 * B_, "made, which an Attach created: the same (%ld)", hits);
}

/* The test's children are this program again (exec, not only fork: a
 * CUDA process's fork cannot use CUDA), told what to be in argv:
 * "--child worker SOCKET SEED" or "--child holder SOCKET PROMPT UP DOWN". */
static pid_t spawn_child(const char *kind, uint32_t n, int up, int down, int close_up, int close_down)
{
	char a[16], u[16], d[16];
	char *argv[] = { "test_restart", "--child", (char *)kind, m.sock_path, a, u, d, NULL };
	pid_t pid;

	snprintf(a, sizeof a, "%u", n);
	snprintf(u, sizeof u, "%d", up);
	snprintf(d, sizeof d, "%d", down);
	pid = fork();
	if (pid == 0) {
		/* the ends the parent keeps closed here: a parent that dies is EOF */
		if (close_up >= 0)
			close(close_up);
		if (close_down >= 0)
			close(close_down);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	return pid;
}

/* A worker: prompts at random, forever (until the daemon or the test
 * kills it). */
static int worker(unsigned seed)
{
	kvq_client *c = open_pool("warm");
	att_t out;
	uint32_t hit;

	srand(seed);
	while (c && run_prompt(c, (uint32_t)rand() % NP, &hit, out, NULL) == 0)
		;
	return 0;
}

/* Waits (up to WAIT_MS) until kvqd lists no client of this process
 * (`kvqctl clients`): the connections it closed are closed for kvqd too,
 * so that a kill -9 next finds none of them to hold for it. */
static void settle(void)
{
	const char *top = getenv("top_builddir"), *env = getenv("KVQ_TEST_KVQCTL");
	char cmd[512], line[1024];

	snprintf(cmd, sizeof cmd, "%s%s --socket %s clients 2>&1", env ? env : top ? top : ".",
		 env ? "" : "/kvqctl/kvqctl", m.sock_path);
	for (int i = 0; i < WAIT_MS / 10; i++) {
		FILE *f = popen(cmd, "r");
		int own = 0;

		while (f && fgets(line, sizeof line, f)) {
			unsigned long id, pid;
			char name[64];

			own += sscanf(line, "%lu %63s %lu", &id, name, &pid) == 3 && pid == (unsigned long)getpid();
		}
		if (f)
			pclose(f);
		if (!own)
			return;
		usleep(10000);
	}
}

static void test_kill9(void)
{
	long total = 0, bad = 0;
	int started = 0;

	srand(12345);
	for (int round = 0; round < ROUNDS; round++) {
		pid_t w;
		long hits;

		settle();
		w = spawn_child("worker", (uint32_t)round + 1, -1, -1, -1, -1);
		usleep(5000 + (useconds_t)(rand() % 40000));
		sdmgr_kill9(&m, WAIT_MS);
		kill(w, SIGKILL);
		waitpid(w, NULL, 0);
		if (!start("kill -9")) {
			bad++;
			break;
		}
		started++;
		hits = check_prompts("warm", (uint32_t)(round % 5) * 8, (uint32_t)(round % 5) * 8 + 8, false);
		if (hits < 0)
			bad++;
		else
			total += hits;
	}
	ok(started == ROUNDS && bad == 0,
	   "%d kill -9 at random points of a worker's publishes, evictions, demotions and promotions: every start "
	   "serves, every hit is whole blocks attending as the reference (%ld bad)", started, bad);
	ok(total > 0, "and there were hits after the restarts (%ld tokens)", total);
}

/* A worker that keeps prompt p's sequence across a kill -9: it reports
 * on up ('y': it holds it), waits on down, attends again over its own
 * slots and sends its attention before and after; the test compares them
 * with each other and with the reference. */
struct holder {
	pid_t pid;
	uint32_t p;
	int up, down;
};

static int holder(uint32_t p, int up, int down)
{
	kvq_client *c = open_pool("warm");
	kvq_seq *s = NULL;
	att_t att[2];
	uint32_t hit;
	int r = c ? run_prompt(c, p, &hit, att[0], &s) : -1;
	char byte = r == 0 ? 'y' : 'n';

	if (write(up, &byte, 1) != 1 || read(down, &byte, 1) != 1)
		return 3;
	r = attend(s, att[1]);
	return r == 0 && write(up, att, sizeof att) == (ssize_t)sizeof att ? 0 : 1;
}

static bool holder_start(struct holder *w, uint32_t p)
{
	int up[2], down[2];
	char byte = 0;

	if (pipe(up) < 0 || pipe(down) < 0)
		return false;
	w->p = p;
	w->pid = spawn_child("holder", p, up[1], down[0], up[0], down[1]);
	/* the ends this side does not use closed: a worker that dies is EOF */
	close(up[1]);
	close(down[0]);
	w->up = up[0];
	w->down = down[1];
	return w->pid > 0 && read(w->up, &byte, 1) == 1 && byte == 'y';
}

/* Tells the worker to attend again: 0 when it exited 0 and its attention
 * after is as before and as the reference, else its wait status (or -1). */
static int holder_end(struct holder *w)
{
	char byte = 'x';
	att_t att[2];
	size_t got = 0;
	ssize_t n = 0;
	int st = -1;

	if (write(w->down, &byte, 1) != 1)
		kill(w->pid, SIGKILL);
	while (got < sizeof att && (n = read(w->up, (char *)att + got, sizeof att - got)) > 0)
		got += (size_t)n;
	waitpid(w->pid, &st, 0);
	close(w->up);
	close(w->down);
	if (st == 0 && (got != sizeof att || memcmp(att[0], att[1], sizeof att[0]) ||
			memcmp(att[0], ref[w->p], sizeof att[0])))
		st = -1;
	return st;
}

static uint64_t held_now(void)
{
	kvq_client *c = open_pool("warm");
	uint64_t v = c ? figure(c, "warm", "restart_held") : UINT64_MAX;

	kvq_client_free(c);
	return v;
}

/* Two workers keep a sequence each across a kill -9: each one's slots are
 * held for it, not handed out while it lives, and released when it exits,
 * the other's still held. */
static void test_holds(void)
{
	struct holder a, b;
	uint64_t both, one;
	char what[96];
	long hits;
	int st;

	settle();
	ok(holder_start(&a, 30) && holder_start(&b, 31), "two workers hold prompts 30 and 31's sequences");
	sdmgr_kill9(&m, WAIT_MS);
	if (!ok(start("holds"), "kvqd killed and started again while they live"))
		return;
	ok(sdmgr_log_lines(logp, "for 2 processes still alive") >= 1, "the log says what is held for them");
	/* another worker fills the pool: were the held slots handed out, its
	 * prompts would overwrite them */
	hits = check_prompts("warm", 0, NP, false);
	ok(hits >= 0, "another worker runs all %u prompts through the pool meanwhile (%ld tokens hit)", NP, hits);
	both = held_now();
	st = holder_end(&a);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "the first's attention over the slots it held is as before, and as the reference (%#x)", st);
	snprintf(what, sizeof what, "held since the restart for pid %d released", (int)a.pid);
	for (int i = 0; i < 50 && sdmgr_log_lines(logp, what) == 0; i++)
		usleep(100000);
	one = held_now();
	ok(sdmgr_log_lines(logp, what) == 1 && both > one && one > 0,
	   "once it exited, its slots were released, the other's not (restart_held %llu, then %llu)",
	   (unsigned long long)both, (unsigned long long)one);
	hits = check_prompts("warm", 0, NP, false);
	st = holder_end(&b);
	ok(hits >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "after another round of all prompts, the second's attention is still as before (%#x)", st);
	for (int i = 0; i < 50 && sdmgr_log_lines(logp, "every slot held since the restart released") == 0; i++)
		usleep(100000);
	ok(sdmgr_log_lines(logp, "every slot held since the restart released") == 1 && held_now() == 0,
	   "once it exited too, nothing is held");
	settle();   /* the next test's kill -9 holds only its own clients */
}

/* The process's own two clients across a kill -9: libkvq connects again. */
static void test_reconnect(void)
{
	kvq_client *c1 = open_pool("warm"), *c2 = open_pool("warm");
	uint64_t both, one, released;
	kvq_seq *s1 = NULL, *s2 = NULL;
	void *base = c1 ? kvq_client_base(c1) : NULL;
	uint32_t tok[NTOK], hit = 0;
	uint16_t kv[H_ * D_] = { 0 };
	att_t out;
	int r;

	if (!ok(c1 && c2 && run_prompt(c1, 34, &hit, out, &s1) == 0 && run_prompt(c2, 35, &hit, out, &s2) == 0,
		"two clients of this process hold prompts 34 and 35's sequences")) {
		kvq_client_free(c1);
		kvq_client_free(c2);
		return;
	}
	sdmgr_kill9(&m, WAIT_MS);
	if (!ok(start("reconnect"), "kvqd killed and started again"))
		goto out;
	both = held_now();
	prompt_tokens(34, tok);
	r = kvq_seq_begin(s1, tok, 2 * B_);   /* new blocks: an Alloc */
	ok(r < 0 && r != -ESTALE, "the first client's next request fails: its connection is gone (%d: %s)", r,
	   kvq_client_error(c1));
	r = kvq_seq_write(s1, 0, kv, kv);
	ok(r == -ESTALE, "its sequence is stale from then on: no write into its slots (%d: %s)", r,
	   kvq_client_error(c1));
	ok(kvq_seq_attention(s1, 0, QH_, NQ, 0, (const float *)out, (float *)out) == -ESTALE,
	   "nor attention over them");
	/* the next request connects again, the holds of the lost connection released */
	ok(kvq_client_pool_stat(c1, "warm", "restart_held", &released) == 0,
	   "its next request succeeds on a new connection (%s)", kvq_client_error(c1));
	ok(kvq_client_base(c1) == base, "with the same mapping: the restart kept the memory");
	one = held_now();
	ok(both > one && one > 0,
	   "what the restart held for the first client only was released (restart_held %llu, then %llu)",
	   (unsigned long long)both, (unsigned long long)one);
	ok(kvq_seq_attention(s1, 0, QH_, NQ, 0, (const float *)out, (float *)out) == -ESTALE,
	   "the old sequence stays stale on the new connection");
	kvq_seq_free(s1);
	s1 = NULL;
	ok(run_prompt(c1, 34, &hit, out, NULL) == 0 && hit == WHOLE && !memcmp(out, ref[34], sizeof out),
	   "a new sequence of the first client hits the whole prompt, attention as the reference (hit %u)", hit);
	/* the second client's slots are held until it, too, connects again */
	ok(attend(s2, out) == 0 && !memcmp(out, ref[35], sizeof out),
	   "the second client's sequence, not yet told, still reads its slots as they were");
	r = kvq_client_pool_stat(c2, "warm", "restart_held", &released);
	ok(r < 0, "its first request finds its connection lost (%d)", r);
	ok(kvq_client_pool_stat(c2, "warm", "restart_held", &released) == 0 && held_now() == 0,
	   "its next one connects again, and nothing is held any more (%s)", kvq_client_error(c2));
	ok(kvq_seq_begin(s2, tok, 2 * B_) == -ESTALE, "and its old sequence is stale too");
out:
	kvq_seq_free(s1);
	kvq_seq_free(s2);
	kvq_client_free(c1);
	kvq_client_free(c2);
}

static void diag_lines(const char *what)
{
	char line[1024];
	FILE *f = fopen(logp, "r");

	while (f && fgets(line, sizeof line, f))
		if (strstr(line, what))
			diag("%s", line);
	if (f)
		fclose(f);
}

static int other_policy(void);

/* How many lines of `kvqctl stats` contain what. */
static int kvqctl_says(const char *what)
{
	const char *top = getenv("top_builddir"), *env = getenv("KVQ_TEST_KVQCTL");
	char cmd[512], line[1024];
	int n = 0;
	FILE *f;

	snprintf(cmd, sizeof cmd, "%s%s --socket %s stats 2>&1", env ? env : top ? top : ".",
		 env ? "" : "/kvqctl/kvqctl", m.sock_path);
	f = popen(cmd, "r");
	while (f && fgets(line, sizeof line, f))
		n += strstr(line, what) != NULL;
	if (f)
		pclose(f);
	return n;
}

/* Stops kvqd, lets corrupt() change the store, starts it: warm must
 * start cold with a log line containing why. */
static void cold_case(const char *what, int (*corrupt)(void), const char *why)
{
	int lines = sdmgr_log_lines(logp, why);
	long hits;

	sdmgr_stop(&m, WAIT_MS);
	if (!ok(corrupt() == 0, "%s: done to the store", what) || !ok(start(what), "%s: kvqd starts", what))
		return;
	if (!ok(sdmgr_log_lines(logp, why) == lines + 1, "%s: warm starts cold, the log says \"%s\"", what, why))
		diag_lines("starts cold");
	if (!ok(kvqctl_says("started cold: ") == 1, "%s: kvqctl stats says warm started cold, and why", what))
		diag_lines("starts cold");
	if (corrupt == other_policy)
		return;   /* the test's clients ask for int8 */
	hits = check_prompts("warm", 0, 8, false);
	ok(hits == 0, "%s: warm has no hit (%ld)", what, hits);
	/* something to take back next time */
	check_prompts("warm", 0, 8, false);
}

/* A byte of the body (its last kilobyte: the table of attached
 * processes, zeros now) flipped. */
static int flip_byte(void)
{
	long i = books_of("warm");
	off_t at;
	uint8_t b;

	if (i < 0 || (at = lseek(m.store[i].fd, 0, SEEK_END)) < 4096 || pread(m.store[i].fd, &b, 1, at - 1000) != 1)
		return -1;
	b ^= 0x10;
	return pwrite(m.store[i].fd, &b, 1, at - 1000) == 1 ? 0 : -1;
}

static int truncate_books(void)
{
	long i = books_of("warm");
	static uint8_t buf[1 << 20];
	ssize_t n;
	int fd;

	if (i < 0 || (n = pread(m.store[i].fd, buf, sizeof buf, 0)) <= 4096)
		return -1;
	fd = memfd_create("kvq-books-short", MFD_CLOEXEC);
	if (fd < 0 || write(fd, buf, (size_t)n / 2) != n / 2)
		return -1;
	{
		char name[SDMGR_NAME_MAX + 1];

		snprintf(name, sizeof name, "%s", m.store[i].name);
		sdmgr_drop(&m, (size_t)i);
		return sdmgr_store_add(&m, name, fd);
	}
}

static int other_version(void)
{
	long i = books_of("warm");
	uint32_t v = 99;

	return i >= 0 && pwrite(m.store[i].fd, &v, sizeof v, 8) == sizeof v ? 0 : -1;
}

static int other_policy(void)
{
	return write_conf("int4g32");
}

/* kvqd's descriptors once a client that just left is gone from them
 * (its socket and pidfd close when kvqd has seen it go). */
static int kvqd_fds(int want)
{
	char dir[64];
	int n = -1, last;

	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)m.pid);
	for (int i = 0; i < 40; i++) {
		last = n;
		n = sdmgr_count_fds(dir);
		if (n == want || (want < 0 && n == last))
			break;
		usleep(50000);
	}
	return n;
}

/* A client alive across a start that is cold (its books of another
 * version): libkvq connects again and maps the new memory, where what it
 * writes is what other clients read. */
static void test_reconnect_cold(void)
{
	kvq_client *c = open_pool("warm");
	uint32_t tok[NTOK], hit = 0;
	kvq_seq *s = NULL;
	uint64_t cold = 0;
	att_t out;
	int r;

	if (!ok(c && run_prompt(c, 36, &hit, out, &s) == 0, "a client holds prompt 36's sequence")) {
		kvq_client_free(c);
		return;
	}
	cold_case("a client alive across it", other_version, "books version 99");
	r = kvq_client_pool_stat(c, "warm", "restart_cold", &cold);
	ok(r < 0, "the client's first request finds its connection lost (%d)", r);
	prompt_tokens(36, tok);
	ok(kvq_seq_begin(s, tok, 2 * B_) == -ESTALE, "its sequence is stale (%s)", kvq_client_error(c));
	ok(kvq_client_pool_stat(c, "warm", "restart_cold", &cold) == 0 && cold == 1,
	   "its next request connects again to the pool started cold (%s)", kvq_client_error(c));
	kvq_seq_free(s);
	ok(run_prompt(c, 36, &hit, out, NULL) == 0 && !memcmp(out, ref[36], sizeof out),
	   "a new sequence runs prompt 36 on the new memory, attention as the reference (hit %u)", hit);
	ok(check_prompts("warm", 36, 37, true) == WHOLE,
	   "another client's lookup hits it whole and reads what it wrote: the client mapped the new memory");
	kvq_client_free(c);
}

int main(int argc, char **argv)
{
	int fds2 = -1, fds;

	if (argc == 7 && !strcmp(argv[1], "--child")) {
		snprintf(m.sock_path, sizeof m.sock_path, "%s", argv[3]);
		/* _exit: what a child holds is held until it exits, on purpose */
		_exit(!strcmp(argv[2], "worker") ? worker((unsigned)atoi(argv[4]))
						 : holder((uint32_t)atoi(argv[4]), atoi(argv[5]), atoi(argv[6])));
	}

#ifndef HAVE_SYSTEMD
	printf("1..0 # SKIP kvqd is built without libsystemd\n");
	return 0;
#endif
#ifdef KVQ_TEST_CUDA
	if (test_cuda_skip())
		return 0;
#endif
	if (!ok(sdmgr_init(&m, "restart") == 0, "a service manager for the test"))
		return done_testing();
	test_daemon_bin(bin, sizeof bin);
	snprintf(conf, sizeof conf, "%s/kvqd.conf", m.dir);
	snprintf(logp, sizeof logp, "%s/kvqd.log", m.dir);
	snprintf(unused, sizeof unused, "%s/unused.sock", m.dir);
	if (!ok(write_conf("int8") == 0 && start("first"), "kvqd starts under it"))
		return done_testing();
	test_clean_restart();
	fds2 = kvqd_fds(-1);
	test_kill9();
	fds = kvqd_fds(fds2);
	ok(fds == fds2, "kvqd holds as many descriptors after the kills as at the second start (%d, %d)", fds, fds2);
	test_holds();
	test_reconnect();
	cold_case("a flipped byte", flip_byte, "the snapshot's checksum does not match");
	cold_case("books truncated", truncate_books, "recorded");
	cold_case("another version", other_version, "books version 99");
	test_reconnect_cold();
	cold_case("kvqd.conf's policy changed", other_policy, "policy int4g32, the books' int8");
	ok(stored_kvq() == 8, "the store holds what the pools left, nothing more (%zu)", stored_kvq());
	ok(sdmgr_stop(&m, WAIT_MS) >= 0, "kvqd stops");
	ok(sdmgr_log_lines(logp, "<3>") == 0, "kvqd logged no error");
	sdmgr_fini(&m);
	return done_testing();
}
