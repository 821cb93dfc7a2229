/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration test of libkvq: the real kvqd (host backend, a temporary
 * socket) and forked worker processes that use only the public client API
 * and the sequence helper.  Workers report into shared memory; the parent
 * prints the TAP lines.
 *
 * KVQ_TEST_KVQD names the kvqd binary (default $top_builddir/daemon/kvqd).
 */
#include <config.h>

#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

#define L_ 2
#define H_ 2
#define QH_ 4              /* query heads: GQA group of 2 */
#define D_ 32
#define B_ 16
#define NTOK 50            /* S(50) = 48 with R = 16: 3 sealed blocks + 2 open tokens */
#define NSB 3
#define N_SEALED 32
#define N_OPEN 8
#define POOL "ctest"
#define MODEL "test/model@1"
#define SLICE_MAX 4096

static char sock_path[108];
static char tmpdir[64];
static char daemon_bin[512];

struct shared {
	uint32_t a_ids[NSB];
	float a_out[L_][QH_ * D_];
	uint8_t a_bytes[NSB][L_][SLICE_MAX];
	int a_ok, a_cold, a_attn_ok, b_hit, b_ids_ok, b_bytes_ok, b_attn_ok, b_fork_ok, c_hit;
	int race_ready;
	uint32_t race_ids[2][NSB];
	int race_ok[2];
	int e_nospc, e_seq_nospc, e_msg;
	int d_ok, d_bytes_ok, d_attn_ok;
};

static struct shared *sh;

/* Synthetic K/V (synth.h): every worker computes the same values for the
 * same prompt. */
static uint16_t kv_val(uint32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t d, int is_v)
{
	return kvq_f16_from_f32((float)synth_kv(tok, pos, layer, h, d, is_v));
}

static void make_kv(const uint32_t *tok, uint32_t pos0, uint32_t m, uint32_t layer, uint16_t *k, uint16_t *v)
{
	for (uint32_t t = 0; t < m; t++)
		for (uint32_t h = 0; h < H_; h++)
			for (uint32_t d = 0; d < D_; d++) {
				k[((size_t)t * H_ + h) * D_ + d] = kv_val(tok[t], pos0 + t, layer, h, d, 0);
				v[((size_t)t * H_ + h) * D_ + d] = kv_val(tok[t], pos0 + t, layer, h, d, 1);
			}
}

static void make_q(uint32_t layer, float *q)
{
	for (uint32_t i = 0; i < QH_ * D_; i++)
		q[i] = kvq_f16_to_f32(kv_val(7, i, layer, 0, 0, 0));
}

static uint32_t prompt[NTOK], prompt2[NTOK], prompt3[NTOK];

static void make_prompts(void)
{
	for (uint32_t t = 0; t < NTOK; t++) {
		prompt[t] = 1000 + t * 7;
		prompt2[t] = 5000 + t * 3;
		prompt3[t] = 9000 + t;
	}
}

static kvq_client *open_pool(void)
{
	struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .device = -1 };
	kvq_client *c = NULL;

	if (kvq_client_connect(sock_path, "ctest", &c) < 0)
		return NULL;
	if (kvq_client_attach(c, &p) < 0) {
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Appends tok[from..n) (from = what the sequence holds) in one write, all
 * layers; out (may be NULL) gets each layer's attention of the last token. */
static int run_prompt(kvq_seq *s, const uint32_t *tok, uint32_t from, uint32_t n, float (*out)[QH_ * D_],
		      bool commit)
{
	static uint16_t k[NTOK * H_ * D_], v[NTOK * H_ * D_];
	float q[QH_ * D_];
	int r = kvq_seq_begin(s, tok + from, n - from);

	if (r < 0)
		return r;
	for (uint32_t l = 0; l < L_; l++) {
		make_kv(tok + from, from, n - from, l, k, v);
		r = kvq_seq_write(s, l, k, v);
		if (r < 0)
			return r;
		if (out) {
			make_q(l, q);
			r = kvq_seq_attention(s, l, QH_, 1, 0.0f, q, out[l]);
			if (r < 0)
				return r;
		}
	}
	return commit ? kvq_seq_commit(s) : 0;
}

static void copy_blocks(kvq_client *c, const uint32_t *ids, uint8_t (*dst)[L_][SLICE_MAX])
{
	const struct kvq_layout *L = kvq_client_layout(c);
	const uint8_t *base = kvq_client_base(c);

	for (int b = 0; b < NSB; b++)
		for (uint32_t l = 0; l < L_; l++)
			memcpy(dst[b][l], base + kvq_layout_off(L, KVQ_SEALED, ids[b], l, 0, KVQ_K_CODES),
			       L->layer[l].sealed_slice);
}

/* A: cold run of the prompt, publishes its sealed blocks. */
static int client_a(void)
{
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;
	const int32_t *sl;
	uint32_t hit = 99, ns;

	if (!c || kvq_client_layout(c)->layer[0].sealed_slice > SLICE_MAX || kvq_seq_new(c, NULL, 0, &s) < 0)
		return 1;
	sh->a_cold = kvq_seq_from_prompt(s, prompt, NTOK, &hit) == 0 && hit == 0;
	if (run_prompt(s, prompt, 0, NTOK, sh->a_out, true) < 0)
		return 2;
	sh->a_attn_ok = 1;
	kvq_seq_blocks(s, &sl, &ns, NULL, NULL);
	if (ns != NSB || kvq_seq_tokens(s) != NTOK)
		return 3;
	for (int i = 0; i < NSB; i++)
		sh->a_ids[i] = (uint32_t)sl[i];
	copy_blocks(c, sh->a_ids, sh->a_bytes);
	sh->a_ok = 1;
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

/* B: warm run of the same prompt, then a fork. */
static int client_b(void)
{
	static uint8_t bytes[NSB][L_][SLICE_MAX];
	float out[L_][QH_ * D_], fout[QH_ * D_], q[QH_ * D_];
	kvq_client *c = open_pool();
	kvq_seq *s = NULL, *f = NULL;
	const int32_t *sl;
	uint32_t hit = 0, ns, ids[NSB];

	if (!c || kvq_seq_new(c, NULL, 0, &s) < 0 || kvq_seq_from_prompt(s, prompt, NTOK, &hit) < 0)
		return 1;
	sh->b_hit = (int)hit;
	kvq_seq_blocks(s, &sl, &ns, NULL, NULL);
	if (ns != NSB)
		return 2;
	for (int i = 0; i < NSB; i++)
		ids[i] = (uint32_t)sl[i];
	sh->b_ids_ok = !memcmp(ids, sh->a_ids, sizeof(ids));
	copy_blocks(c, ids, bytes);
	sh->b_bytes_ok = 1;
	for (int b = 0; b < NSB; b++)
		for (int l = 0; l < L_; l++)
			if (memcmp(bytes[b][l], sh->a_bytes[b][l], kvq_client_layout(c)->layer[l].sealed_slice))
				sh->b_bytes_ok = 0;
	if (run_prompt(s, prompt, hit, NTOK, out, true) < 0)
		return 3;
	sh->b_attn_ok = !memcmp(out, sh->a_out, sizeof(out));
	if (kvq_seq_fork(s, &f) < 0)
		return 4;
	make_q(1, q);
	sh->b_fork_ok = kvq_seq_tokens(f) == NTOK && kvq_seq_attention(f, 1, QH_, 1, 0.0f, q, fout) == 0 &&
			!memcmp(fout, out[1], sizeof(fout));
	kvq_seq_free(f);
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

/* C: the same prompt with another salt. */
static int client_c(void)
{
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;
	uint32_t hit = 99;

	if (!c || kvq_seq_new(c, "tenant-c", 8, &s) < 0 || kvq_seq_from_prompt(s, prompt, NTOK, &hit) < 0)
		return 1;
	sh->c_hit = (int)hit;
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

/* D: the prompt one token at a time (open blocks sealed through Seal on
 * the way), under its own salt so it keeps its own blocks. */
static int client_d(void)
{
	static uint8_t bytes[NSB][L_][SLICE_MAX];
	float out[L_][QH_ * D_];
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;
	const int32_t *sl;
	uint32_t ns, no, ids[NSB];
	int r;

	if (!c || kvq_seq_new(c, "tenant-d", 8, &s) < 0)
		return 1;
	for (uint32_t n = 1; n <= NTOK; n++) {
		r = run_prompt(s, prompt, n - 1, n, n == NTOK ? out : NULL, true);
		if (r < 0)
			return 2;
		kvq_seq_blocks(s, NULL, &ns, NULL, &no);
		if (ns * B_ != kvq_layout_split(kvq_client_layout(c), n) || (ns + no) * B_ < n)
			return 3;
	}
	kvq_seq_blocks(s, &sl, &ns, NULL, NULL);
	for (int i = 0; i < NSB; i++)
		ids[i] = (uint32_t)sl[i];
	copy_blocks(c, ids, bytes);
	sh->d_bytes_ok = 1;
	for (int b = 0; b < NSB; b++)
		for (int l = 0; l < L_; l++)
			if (memcmp(bytes[b][l], sh->a_bytes[b][l], kvq_client_layout(c)->layer[l].sealed_slice))
				sh->d_bytes_ok = 0;
	sh->d_attn_ok = !memcmp(out, sh->a_out, sizeof(out));
	sh->d_ok = 1;
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

/* Two of these write prompt2 and commit at the same moment. */
static int client_race(int who)
{
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;
	const int32_t *sl;
	uint32_t ns;

	if (!c || kvq_seq_new(c, NULL, 0, &s) < 0 || run_prompt(s, prompt2, 0, NTOK, NULL, false) < 0)
		return 1;
	__atomic_add_fetch(&sh->race_ready, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 1000 && __atomic_load_n(&sh->race_ready, __ATOMIC_SEQ_CST) < 2; i++)
		usleep(1000);
	if (kvq_seq_commit(s) < 0)
		return 2;
	kvq_seq_blocks(s, &sl, &ns, NULL, NULL);
	for (uint32_t i = 0; i < ns && i < NSB; i++)
		sh->race_ids[who][i] = (uint32_t)sl[i];
	sh->race_ok[who] = ns == NSB;
	/* stay until both committed, so neither copy is released early */
	__atomic_add_fetch(&sh->race_ready, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 1000 && __atomic_load_n(&sh->race_ready, __ATOMIC_SEQ_CST) < 4; i++)
		usleep(1000);
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

static int client_race0(void)
{
	return client_race(0);
}

static int client_race1(void)
{
	return client_race(1);
}

/* E: asks for more than the pool holds. */
static int client_e(void)
{
	static uint32_t big[40 * B_];
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;
	uint32_t o[1], r[1], sl[N_SEALED + 1];

	if (!c || kvq_seq_new(c, NULL, 0, &s) < 0)
		return 1;
	sh->e_nospc = kvq_client_alloc(c, 0, N_SEALED + 1, o, r, sl) == -ENOSPC;
	sh->e_msg = kvq_client_error(c)[0] != 0;
	for (uint32_t i = 0; i < 40 * B_; i++)
		big[i] = 20000 + i;
	sh->e_seq_nospc = kvq_seq_begin(s, big, 40 * B_) == -ENOSPC && kvq_seq_tokens(s) == 0;
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

/* K: holds a sequence's slots, tells the parent, waits to be killed. */
static int client_k(int wfd)
{
	kvq_client *c = open_pool();
	kvq_seq *s = NULL;

	if (!c || kvq_seq_new(c, NULL, 0, &s) < 0 || run_prompt(s, prompt3, 0, NTOK, NULL, false) < 0)
		return 1;
	if (write(wfd, "x", 1) != 1)
		return 2;
	for (;;)
		pause();
}

static pid_t spawn(int (*fn)(void))
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(fn());
	return pid;
}

static int reap(pid_t pid)
{
	int st;

	if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static int run_child(int (*fn)(void))
{
	return reap(spawn(fn));
}

static pid_t start_daemon(void)
{
	return test_daemon_start("host", "ctest", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				 sizeof(daemon_bin));
}

/*
 * The per-uid quota seen through libkvq: a kvqd whose pools allow each uid
 * 24 KiB of pool bytes (reservations included).  A sequence that needs more
 * fails in kvq_seq_begin with -EDQUOT and holds nothing; one that fits
 * works; a second client of the same uid shares the quota.
 */
static void test_quota_libkvq(void)
{
	char dir[64], sock[108], bin[512], conf[128];
	static uint32_t tok[400];
	pid_t d = test_daemon_start_conf("host", "cquota", "quota_per_uid = 24K\n", dir, sizeof(dir), sock,
					 sizeof(sock), bin, sizeof(bin));
	struct kvq_attach_params p = { .pool = "quota", .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .device = -1 };
	kvq_client *c = NULL, *c2 = NULL;
	kvq_seq *s = NULL, *s2 = NULL;
	struct kvq_stats st;
	int r, st_ok;

	if (!ok(d > 0, "quota: kvqd with quota_per_uid = 24K starts"))
		return;
	for (uint32_t i = 0; i < 400; i++)
		tok[i] = 500 + i;
	r = kvq_client_connect(sock, "quota", &c);
	if (r == 0)
		r = kvq_client_attach(c, &p);
	if (r == 0)
		r = kvq_seq_new(c, NULL, 0, &s);
	if (!ok(r == 0, "quota: attach and a sequence (%d)", r))
		goto out;
	const struct kvq_layout *L = kvq_client_layout(c);
	/* 400 tokens: 24 sealed blocks and a window, far over 24 KiB */
	r = kvq_seq_begin(s, tok, 400);
	char msg[256];
	snprintf(msg, sizeof(msg), "%s", kvq_client_error(c));
	st_ok = kvq_client_stats(c, "quota", &st) == 0 && st.sealed_held == 0 && st.open_used == 0;
	ok(r == -EDQUOT && msg[0] && st_ok,
	   "quota: kvq_seq_begin of 400 tokens (%llu bytes per sealed block) fails with -EDQUOT, a message, nothing held (%d: %s)",
	   (unsigned long long)L->sealed_block_bytes, r, msg);
	r = kvq_seq_begin(s, tok, 40);
	ok(r == 0, "quota: 40 tokens fit (%d %s)", r, kvq_client_error(c));
	if (r == 0)
		kvq_seq_free(s);   /* releases the begin's slots */
	s = NULL;
	/* a second connection of the same uid counts against the same quota */
	r = kvq_client_connect(sock, "quota-2", &c2);
	if (r == 0)
		r = kvq_client_attach(c2, &p);
	if (r == 0)
		r = kvq_seq_new(c, NULL, 0, &s);
	if (r == 0)
		r = kvq_seq_new(c2, NULL, 0, &s2);
	if (r == 0)
		r = kvq_seq_begin(s, tok, 30);
	int r2 = r == 0 ? kvq_seq_begin(s2, tok + 100, 30) : r;
	ok(r == 0 && r2 == -EDQUOT, "quota: counted per uid across connections (30 tokens each, 16,896 bytes: %d, then %d)", r,
	   r2);
out:
	kvq_seq_free(s);
	kvq_seq_free(s2);
	kvq_client_free(c);
	kvq_client_free(c2);
	kill(d, SIGTERM);
	waitpid(d, NULL, 0);
	snprintf(conf, sizeof(conf), "%s/kvqd.conf", dir);
	unlink(conf);
	rmdir(dir);
}

/*
 * A client running as another user (nobody) does not see a pool that root
 * created (attach: -ENOENT, as for a missing one), nor may it create one: the create ACL defaults to root and kvqd's
 * user, a created pool's ACL to its creator, root and kvqd's user.  Needs
 * root to switch users; the socket and its directory are opened up first so
 * the refusal comes from kvqd, not from the file system.
 */
static void test_other_uid(void)
{
	int st = 0;
	pid_t pid;

	if (geteuid() != 0) {
		ok(1, "a client as another uid is refused # SKIP not running as root");
		return;
	}
	if (chmod(tmpdir, 0755) < 0 || chmod(sock_path, 0666) < 0) {
		ok(0, "open the socket to other users: %s", strerror(errno));
		return;
	}
	pid = fork();
	if (pid == 0) {
		struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = L_, .kv_heads = H_,
			.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .device = -1 };
		kvq_client *c = NULL;
		int r1, r2;

		if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		if (kvq_client_connect(sock_path, "nobody", &c) < 0)
			_exit(11);
		r1 = kvq_client_attach(c, &p);           /* root's pool */
		kvq_client_free(c);
		if (kvq_client_connect(sock_path, "nobody", &c) < 0)
			_exit(12);
		p.pool = "nobodys";
		p.create = 1;
		p.n_sealed = 8;
		p.n_open = 2;
		r2 = kvq_client_attach(c, &p);           /* a new pool */
		kvq_client_free(c);
		_exit(r1 == -ENOENT && r2 == -EACCES ? 0 : 13);
	}
	waitpid(pid, &st, 0);
	ok(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "a client as uid 65534: root's pool is hidden (attach: -ENOENT), creating a pool -EACCES (exit %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	chmod(sock_path, 0660);
	chmod(tmpdir, 0700);
}

static void test_kill9(kvq_client *mon)
{
	struct kvq_stats base, held, now;
	int pfd[2];
	pid_t pid;
	char x;
	bool back = false;

	if (kvq_client_stats(mon, POOL, &base) < 0 || pipe(pfd) < 0) {
		ok(0, "kill -9: setup");
		return;
	}
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		_exit(client_k(pfd[1]));
	}
	close(pfd[1]);
	if (read(pfd[0], &x, 1) != 1) {
		ok(0, "kill -9: the client did not write its sequence");
		close(pfd[0]);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return;
	}
	close(pfd[0]);
	ok(kvq_client_stats(mon, POOL, &held) == 0 && held.sealed_held == base.sealed_held + NSB &&
	   held.open_used == base.open_used + 1,
	   "kill -9: the client holds %d sealed + 1 open slots mid-write", NSB);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	for (int i = 0; i < 300 && !back; i++) {
		if (kvq_client_stats(mon, POOL, &now) == 0 && now.sealed_held == base.sealed_held &&
		    now.open_used == base.open_used && now.sealed_free == base.sealed_free &&
		    now.sealed_reserved == base.sealed_reserved)
			back = true;
		else
			usleep(10000);
	}
	ok(back, "kill -9: its slots returned to the pool (Stats)");
}

/* kvq_default_socket without $KVQ_SOCKET: root's socket for root; for a
 * user $XDG_RUNTIME_DIR/kvqd.sock when that is absolute (as kvqd takes it),
 * else none (checked in a child as uid 65534 when running as root). */
static int default_socket_user(void)
{
	char p[108];

	setenv("XDG_RUNTIME_DIR", "/run/user/65534", 1);
	if (kvq_default_socket(p, sizeof(p)) != 0 || strcmp(p, "/run/user/65534/kvqd.sock"))
		return 1;
	setenv("XDG_RUNTIME_DIR", "run/user", 1);
	if (kvq_default_socket(p, sizeof(p)) != -ENOENT)
		return 2;
	unsetenv("XDG_RUNTIME_DIR");
	return kvq_default_socket(p, sizeof(p)) == -ENOENT ? 0 : 3;
}

static void test_default_socket(void)
{
	char p[108];
	int st = 0;
	pid_t pid;

	unsetenv("KVQ_SOCKET");
	if (geteuid() != 0) {
		ok(default_socket_user() == 0, "default socket for a user: $XDG_RUNTIME_DIR/kvqd.sock if absolute");
		return;
	}
	ok(kvq_default_socket(p, sizeof(p)) == 0 && !strcmp(p, KVQ_ROOT_SOCKET), "default socket for root: %s", p);
	pid = fork();
	if (pid == 0)
		_exit(setgid(65534) < 0 || setuid(65534) < 0 ? 9 : default_socket_user());
	waitpid(pid, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	   "default socket for uid 65534: $XDG_RUNTIME_DIR/kvqd.sock if absolute, else none (exit %d)",
	   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* The size contract of struct kvq_attach_params (interface 7): a caller
 * built against interfaces 3 to 6 passes a struct that ends at codebooks,
 * here right before an unmapped page, so a read past it would fault; a
 * larger struct attaches when its unknown bytes are zero and is refused
 * when one is set. */
static int attach_sized(const struct kvq_attach_params *p, size_t size, bool legacy, char *msg, size_t len)
{
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock_path, "ctest-size", &c);

	if (r < 0)
		return r;
	r = legacy ? (kvq_client_attach)(c, p) : kvq_client_attach_sized(c, p, size);
	snprintf(msg, len, "%s", kvq_client_error(c));
	kvq_client_free(c);
	return r;
}

static void test_attach_size(void)
{
	const struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .device = -1 };
	struct {
		struct kvq_attach_params p;
		unsigned char more[16];
	} big = { .p = p };
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	unsigned char *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct kvq_attach_params *old;
	char msg[256];
	int r;

	if (!ok(m != MAP_FAILED && mprotect(m + pg, pg, PROT_NONE) == 0, "a page with an unmapped one after it"))
		return;
	old = (struct kvq_attach_params *)(m + pg - KVQ_ATTACH_PARAMS_MIN);
	memcpy(old, &p, KVQ_ATTACH_PARAMS_MIN);
	r = attach_sized(old, 0, true, msg, sizeof(msg));
	ok(r == 0, "the kvq_client_attach symbol reads an interface 3-6 struct (%zu bytes) and no further (%d %s)",
	   (size_t)KVQ_ATTACH_PARAMS_MIN, r, msg);
	r = attach_sized(old, KVQ_ATTACH_PARAMS_MIN, false, msg, sizeof(msg));
	ok(r == 0, "kvq_client_attach_sized with the interface 3-6 size attaches (%d %s)", r, msg);
	r = attach_sized(&p, KVQ_ATTACH_PARAMS_MIN - 1, false, msg, sizeof(msg));
	ok(r == -EINVAL, "a size under the interface 3-6 struct: -EINVAL (%d)", r);
	r = attach_sized(&big.p, sizeof(big), false, msg, sizeof(msg));
	ok(r == 0, "a larger struct whose bytes unknown to libkvq are zero attaches (%d %s)", r, msg);
	big.more[5] = 1;
	r = attach_sized(&big.p, sizeof(big), false, msg, sizeof(msg));
	ok(r == -E2BIG && strstr(msg, "kvq_attach_params"),
	   "a larger struct with an unknown byte set: -E2BIG with a message (%d '%s')", r, msg);
	munmap(m, 2 * pg);
}

int main(void)
{
	struct kvq_stats st0, st1, st2, st3;
	kvq_client *mon = NULL;
	char path[128];
	pid_t d, p0, p1;
	int r, s;
	struct stat sb;

	make_prompts();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 99;
	memset(sh, 0, sizeof(*sh));
	d = start_daemon();
	if (!ok(d > 0, "kvqd starts and listens on %s", sock_path))
		return done_testing();

	test_default_socket();
	setenv("KVQ_SOCKET", sock_path, 1);
	ok(kvq_default_socket(path, sizeof(path)) == 0 && !strcmp(path, sock_path), "default socket: $KVQ_SOCKET");
	ok(kvq_client_connect(NULL, "monitor", &mon) == 0, "connect to the default socket, hello");
	ok(kvq_client_stats(mon, POOL, &st0) == -ENOENT && kvq_client_error(mon)[0],
	   "stats of a pool not yet created: -ENOENT with a message");

	r = run_child(client_a);
	ok(r == 0 && sh->a_ok, "A: attach (create), append %d tokens layer by layer, seal, publish (exit %d)", NTOK,
	   r);
	ok(sh->a_cold, "A: cold lookup finds nothing");
	ok(sh->a_attn_ok, "A: attention computed on every layer");

	r = run_child(client_b);
	ok(r == 0, "B ran (exit %d)", r);
	ok(sh->b_hit == NSB * B_, "B: from_prompt hits S(n) = %d tokens (%d)", NSB * B_, sh->b_hit);
	ok(sh->b_ids_ok, "B: gets A's sealed ids");
	ok(sh->b_bytes_ok, "B: the cached blocks' bytes equal what A wrote");
	ok(sh->b_attn_ok, "B: attention over the cached prefix equals A's exactly");
	ok(sh->b_fork_ok, "B: a fork shares the prefix, copies the window, attends the same");

	r = run_child(client_c);
	ok(r == 0 && sh->c_hit == 0, "C: another salt gets no hit (%d tokens)", sh->c_hit);

	r = run_child(client_d);
	ok(r == 0 && sh->d_ok, "D: the prompt token by token, sealing open blocks on the way (exit %d)", r);
	ok(sh->d_bytes_ok, "D: its sealed blocks equal A's prefill bytes");
	ok(sh->d_attn_ok, "D: its attention equals A's exactly");

	r = kvq_client_stats(mon, POOL, &st1);
	ok(r == 0 && st1.cached == 2 * NSB && st1.sealed_held == 0 && st1.open_used == 0 && st1.referenced == 0,
	   "stats: %d cached blocks (A's, D's), nothing held after the workers left", 2 * NSB);

	p0 = spawn(client_race0);
	p1 = spawn(client_race1);
	r = reap(p0);
	s = reap(p1);
	ok(r == 0 && s == 0 && sh->race_ok[0] && sh->race_ok[1], "two workers commit the same prompt at once (%d, %d)",
	   r, s);
	ok(!memcmp(sh->race_ids[0], sh->race_ids[1], sizeof(sh->race_ids[0])), "both end with the same block ids");
	r = kvq_client_stats(mon, POOL, &st2);
	ok(r == 0 && st2.cached == st1.cached + NSB && st2.sealed_held == 0 &&
	   st2.sealed_free + st2.cached == N_SEALED,
	   "stats: one copy cached (%u -> %u), the duplicate freed", st1.cached, st2.cached);

	r = run_child(client_e);
	ok(r == 0 && sh->e_nospc && sh->e_msg, "E: an allocation beyond the pool: -ENOSPC with a message");
	ok(sh->e_seq_nospc, "E: a sequence too long for the pool: -ENOSPC, nothing appended");
	r = kvq_client_stats(mon, POOL, &st3);
	ok(r == 0 && st3.cached == st2.cached && st3.sealed_held == 0 && st3.open_used == 0 &&
	   st3.alloc_failures >= st2.alloc_failures + 2,
	   "E: nothing allocated, cached blocks kept, failures counted");

	test_other_uid();
	test_kill9(mon);
	test_quota_libkvq();
	test_attach_size();

	kvq_client_free(mon);
	kill(d, SIGTERM);
	r = waitpid(d, &s, 0);
	ok(r == d && WIFEXITED(s) && WEXITSTATUS(s) == 0, "SIGTERM: kvqd exits with status 0");
	ok(stat(sock_path, &sb) < 0, "socket removed");
	{
		char conf[128];

		snprintf(conf, sizeof(conf), "%s/kvqd.conf", tmpdir);
		unlink(conf);
		rmdir(tmpdir);
	}
	return done_testing();
}
