/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq on a cuda pool, across processes: the real kvqd with --backend
 * cuda on a temporary socket; worker A attaches (libkvq imports the pool's
 * POSIX fd and maps it), writes a pattern into the pool through the device
 * address kvq_client_base() returns (cudaMemcpy of the statically linked
 * cudart) and holds allocated blocks; worker B attaches, reads the bytes
 * back and compares, sees A's blocks in Stats; A is killed with SIGKILL and
 * B's Stats show its blocks returned; kvqd exits 0 on SIGTERM.
 *
 * Prints "1..0 # SKIP" where no GPU is usable.  The parent never touches
 * CUDA (a forked child of a CUDA process cannot use CUDA): every CUDA call
 * runs in a child.  KVQ_TEST_KVQD names the kvqd binary (default
 * $top_builddir/daemon/kvqd).
 */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../tap.h"
#include "../daemon.h"
#include "kvq.h"
#include "layout.h"

#define POOL "gpool"
#define MODEL "test/model@1"
#define N_SEALED 64
#define N_OPEN 8
#define A_HOLD 5

static char sock_path[108], tmpdir[64], daemon_bin[512];

struct shared {
	int a_attach, a_base_nonnull, a_backend_cuda, a_copy, a_alloc;
	unsigned long long a_bytes;
	int b_attach, b_same, b_held_seen, b_back;
	unsigned long long b_mismatch_at;
	unsigned held_before, held_after, clients_after;
	char a_err[256], b_err[256], skip[256];
};
static struct shared *sh;

static struct kvq_attach_params params(void)
{
	return (struct kvq_attach_params){ .pool = POOL, .model_id = MODEL, .layers = 2, .kv_heads = 2,
		.head_dim = 64, .block_tokens = 16, .policy = "int8", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .backend = "cuda", .device = 0 };
}

static uint32_t pattern(size_t i)
{
	uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(x >> 29) ^ 0x5a5aa5a5u;
}

/* 0: a GPU is usable (checked in a child, so the parent stays CUDA-free) */
static int gpu_usable(void)
{
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		int n = 0;
		cudaError_t e = cudaGetDeviceCount(&n);

		if (e != cudaSuccess)
			snprintf(sh->skip, sizeof(sh->skip), "no usable GPU: %s", cudaGetErrorString(e));
		else if (n < 1)
			snprintf(sh->skip, sizeof(sh->skip), "no CUDA device");
		_exit(e == cudaSuccess && n > 0 ? 0 : 1);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static pid_t start_daemon(void)
{
	return test_daemon_start("cuda", "gtest", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				 sizeof(daemon_bin));
}

/* Worker A: attach, write the pattern, hold A_HOLD blocks, report, wait to die. */
static void worker_a(int ready_fd)
{
	struct kvq_attach_params p = params();
	kvq_client *c = NULL;
	uint32_t ids[A_HOLD];
	uint32_t *buf;
	size_t n;
	int r;

	if (kvq_client_connect(sock_path, "gtest-a", &c) < 0)
		goto out;
	r = kvq_client_attach(c, &p);
	if (r < 0) {
		snprintf(sh->a_err, sizeof(sh->a_err), "attach: %d %s", r, kvq_client_error(c));
		goto out;
	}
	sh->a_attach = 1;
	sh->a_base_nonnull = kvq_client_base(c) != NULL;
	sh->a_backend_cuda = kvq_client_backend(c) && !strcmp(kvq_client_backend(c), "cuda");
	sh->a_bytes = kvq_client_layout(c) ? kvq_client_layout(c)->total_bytes : 0;
	n = (size_t)sh->a_bytes / 4;
	buf = malloc(n * 4);
	if (!buf)
		goto out;
	for (size_t i = 0; i < n; i++)
		buf[i] = pattern(i);
	{
		cudaError_t e = cudaMemcpy(kvq_client_base(c), buf, n * 4, cudaMemcpyHostToDevice);

		if (e == cudaSuccess)
			e = cudaDeviceSynchronize();
		if (e != cudaSuccess)
			snprintf(sh->a_err, sizeof(sh->a_err), "cudaMemcpy H2D: %s", cudaGetErrorString(e));
		sh->a_copy = e == cudaSuccess;
	}
	free(buf);
	r = kvq_client_alloc(c, 0, A_HOLD, NULL, NULL, ids);
	if (r < 0)
		snprintf(sh->a_err, sizeof(sh->a_err), "alloc: %d %s", r, kvq_client_error(c));
	sh->a_alloc = r == 0;
out:
	if (write(ready_fd, "x", 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

/* Worker B: attach, read back and compare, Stats; then, after go, Stats until A's blocks are back. */
static void worker_b(int ready_fd, int go_fd)
{
	struct kvq_attach_params p = params();
	struct kvq_stats st;
	kvq_client *c = NULL;
	uint32_t *buf = NULL;
	size_t n;
	char x;
	int r;

	sh->b_mismatch_at = ~0ull;
	if (kvq_client_connect(sock_path, "gtest-b", &c) < 0)
		goto out;
	r = kvq_client_attach(c, &p);
	if (r < 0) {
		snprintf(sh->b_err, sizeof(sh->b_err), "attach: %d %s", r, kvq_client_error(c));
		goto out;
	}
	sh->b_attach = 1;
	n = (size_t)kvq_client_layout(c)->total_bytes / 4;
	buf = calloc(n, 4);
	if (!buf)
		goto out;
	{
		cudaError_t e = cudaMemcpy(buf, kvq_client_base(c), n * 4, cudaMemcpyDeviceToHost);

		if (e != cudaSuccess) {
			snprintf(sh->b_err, sizeof(sh->b_err), "cudaMemcpy D2H: %s", cudaGetErrorString(e));
			goto out;
		}
	}
	sh->b_same = 1;
	for (size_t i = 0; i < n; i++)
		if (buf[i] != pattern(i)) {
			sh->b_same = 0;
			sh->b_mismatch_at = i * 4;
			break;
		}
	if (kvq_client_stats(c, POOL, &st) == 0) {
		sh->held_before = st.sealed_held;
		sh->b_held_seen = st.sealed_held == A_HOLD;
	}
out:
	if (write(ready_fd, "x", 1) != 1 || read(go_fd, &x, 1) != 1)
		_exit(1);
	for (int i = 0; c && sh->b_attach && i < 500; i++) {
		if (kvq_client_stats(c, POOL, &st) == 0) {
			sh->held_after = st.sealed_held;
			sh->clients_after = st.clients;
			if (st.sealed_held == 0) {
				sh->b_back = 1;
				break;
			}
		}
		usleep(10000);
	}
	free(buf);
	kvq_client_free(c);
	_exit(0);
}

int main(void)
{
	int a_ready[2], b_ready[2], b_go[2], st;
	pid_t d, a, b;
	char x;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		printf("1..0 # SKIP mmap failed\n");
		return 0;
	}
	if (gpu_usable() < 0) {
		printf("1..0 # SKIP %s\n", sh->skip[0] ? sh->skip : "no usable GPU");
		return 0;
	}
	if (pipe(a_ready) < 0 || pipe(b_ready) < 0 || pipe(b_go) < 0)
		return 1;
	d = start_daemon();
	if (!ok(d > 0, "kvqd --backend cuda starts and listens on %s", sock_path))
		return done_testing();

	a = fork();
	if (a == 0)
		worker_a(a_ready[1]);
	if (read(a_ready[0], &x, 1) != 1)
		x = 0;
	ok(sh->a_attach, "A attaches to the cuda pool %s", sh->a_err);
	ok(sh->a_base_nonnull && sh->a_backend_cuda, "A: kvq_client_base is a device address on backend cuda");
	ok(sh->a_copy, "A writes %llu bytes of pattern through the device address %s", sh->a_bytes, sh->a_err);
	ok(sh->a_alloc, "A holds %d sealed blocks %s", A_HOLD, sh->a_err);

	b = fork();
	if (b == 0)
		worker_b(b_ready[1], b_go[0]);
	if (read(b_ready[0], &x, 1) != 1)
		x = 0;
	ok(sh->b_attach, "B attaches to the same pool (another process) %s", sh->b_err);
	ok(sh->b_same, "B reads back A's bytes through its own mapping (first mismatch at %lld)",
	   (long long)sh->b_mismatch_at);
	ok(sh->b_held_seen, "B's Stats show A's %d held blocks (sealed_held %u)", A_HOLD, sh->held_before);

	kill(a, SIGKILL);
	waitpid(a, &st, 0);
	ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "A is killed with SIGKILL while holding blocks");
	if (write(b_go[1], "x", 1) != 1)
		x = 0;
	waitpid(b, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "B exits cleanly (unmaps on kvq_client_free)");
	ok(sh->b_back, "B's Stats show A's blocks returned (sealed_held %u, clients %u)", sh->held_after,
	   sh->clients_after);

	kill(d, SIGTERM);
	waitpid(d, &st, 0);
	ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvqd exits 0 on SIGTERM (status %#x)", st);
	{
		char path[128];

		snprintf(path, sizeof(path), "%s/kvqd.conf", tmpdir);
		unlink(path);
		rmdir(tmpdir);
	}
	return done_testing();
}
