/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-demo: two worker processes share a prompt prefix through kvqd.
 *
 * Both workers get the same "system prompt" (synthetic token ids) and a
 * different question.  Their K/V are SYNTHETIC: a pseudo-random function of
 * (token id, position, layer, head, dim), standing in for a model's
 * projections, so both workers compute the same K/V for the same tokens.
 * Worker 1 runs cold and publishes its sealed blocks; worker 2 finds them
 * with a prefix lookup, skips computing and writing them, and only appends
 * its question.  Both then run decode attention of their last token over
 * the pool (quantized prefix + full-precision window) on the CPU kernels.
 * While both are attached it runs kvqctl stats: the pool's resident
 * sequences, effective batch gain against f16 and sharing factor.
 *
 * Usage: kvq-demo [--socket PATH] [--system-tokens N]
 * The socket defaults to $KVQ_SOCKET, else kvqd's default path.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvq.h"
#include "layout.h"

/* A small Llama-like geometry (16 layers, 8 KV heads of 64, GQA 4). */
#define LAYERS 16
#define KV_HEADS 8
#define Q_HEADS 32
#define HEAD_DIM 64
#define BLOCK 16
#define POLICY "int8"
#define POOL "demo"
#define MODEL "synthetic/llama-like-1b@demo"
#define N_SEALED 384
#define N_OPEN 32
#define MAX_PROMPT 8192

struct report {
	uint32_t prompt, hit, computed, sealed, open;
	double prepare_ms, attn_ms;
	float out[LAYERS][Q_HEADS * HEAD_DIM];
	int verify;              /* worker 2: warm output equals a cold recompute */
	char err[256];
	int ok;
};

static const char *sock;
static uint32_t sys_tokens = 1536;

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Synthetic activation in [-2, 2): the same for the same (token, position). */
static float act(uint32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t d, int is_v)
{
	uint64_t x = mix(((uint64_t)tok << 32) ^ ((uint64_t)pos << 16) ^ ((uint64_t)layer << 9) ^ (h << 7) ^ d) ^
		     (is_v ? 0x9e3779b97f4a7c15ull : 0);

	return (float)((double)(mix(x) >> 11) / (double)(1ull << 53) * 4.0 - 2.0);
}

static void make_prompt(int worker, uint32_t *tok, uint32_t *ret_n)
{
	uint32_t n = 0, q = worker == 1 ? 40 : 35;

	for (uint32_t i = 0; i < sys_tokens; i++)
		tok[n++] = 1 + (uint32_t)(mix(i) % 128000);
	for (uint32_t i = 0; i < q; i++)
		tok[n++] = 1 + (uint32_t)(mix(((uint64_t)worker << 40) + i) % 128000);
	*ret_n = n;
}

static kvq_client *open_pool(char *err, size_t len)
{
	struct kvq_attach_params p = { .pool = POOL, .model_id = MODEL, .layers = LAYERS, .kv_heads = KV_HEADS,
		.head_dim = HEAD_DIM, .block_tokens = BLOCK, .policy = POLICY, .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = N_SEALED, .n_open = N_OPEN, .backend = "host", .device = -1 };
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock, "kvq-demo", &c);

	if (r < 0) {
		snprintf(err, len, "connect %s: %s", sock ? sock : "(default socket)", kvq_strerror(r));
		return NULL;
	}
	r = kvq_client_attach(c, &p);
	if (r < 0) {
		snprintf(err, len, "attach %s: %s (%s)", POOL, kvq_strerror(r), kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Looks up the prompt, appends the rest (K/V computed only for it), commits,
 * and runs attention of the last token on every layer. */
static int run_sequence(kvq_client *c, const uint32_t *tok, uint32_t n, const char *salt, struct report *rep,
			kvq_seq **keep)
{
	static uint16_t k[MAX_PROMPT * KV_HEADS * HEAD_DIM], v[MAX_PROMPT * KV_HEADS * HEAD_DIM];
	static float q[Q_HEADS * HEAD_DIM];
	kvq_seq *s = NULL;
	uint32_t hit = 0, m;
	double t0;
	int r;

	r = kvq_seq_new(c, salt, salt ? strlen(salt) : 0, &s);
	if (r < 0)
		return r;
	t0 = now_ms();
	r = kvq_seq_from_prompt(s, tok, n, &hit);
	if (r < 0)
		goto out;
	m = n - hit;
	r = kvq_seq_begin(s, tok + hit, m);
	if (r < 0)
		goto out;
	for (uint32_t l = 0; l < LAYERS; l++) {
		/* the model's K/V projections would run here, for new tokens only */
		for (uint32_t t = 0; t < m; t++)
			for (uint32_t h = 0; h < KV_HEADS; h++)
				for (uint32_t d = 0; d < HEAD_DIM; d++) {
					size_t i = ((size_t)t * KV_HEADS + h) * HEAD_DIM + d;
					k[i] = kvq_f16_from_f32(act(tok[hit + t], hit + t, l, h, d, 0));
					v[i] = kvq_f16_from_f32(act(tok[hit + t], hit + t, l, h, d, 1));
				}
		r = kvq_seq_write(s, l, k, v);
		if (r < 0)
			goto out;
	}
	r = kvq_seq_commit(s);
	if (r < 0)
		goto out;
	rep->prepare_ms = now_ms() - t0;
	rep->prompt = n;
	rep->hit = hit;
	rep->computed = m;
	kvq_seq_blocks(s, NULL, &rep->sealed, NULL, &rep->open);
	t0 = now_ms();
	for (uint32_t l = 0; l < LAYERS; l++) {
		for (uint32_t i = 0; i < Q_HEADS * HEAD_DIM; i++)
			q[i] = act(tok[n - 1], n - 1, l, i / HEAD_DIM, i % HEAD_DIM, 2);
		r = kvq_seq_attention(s, l, Q_HEADS, 1, 0.0f, q, rep->out[l]);
		if (r < 0)
			goto out;
	}
	rep->attn_ms = now_ms() - t0;
out:
	if (r < 0)
		snprintf(rep->err, sizeof(rep->err), "%s (%s)", kvq_strerror(r), kvq_client_error(c));
	/* released after the last attention that reads the blocks returned */
	if (r == 0 && keep)
		*keep = s;
	else
		kvq_seq_free(s);
	return r;
}

static int worker(int id, struct report *rep, int wait_fd)
{
	static uint32_t tok[MAX_PROMPT];
	static struct report cold;
	kvq_client *c = open_pool(rep->err, sizeof(rep->err));
	kvq_seq *s = NULL;
	uint32_t n;
	char x;

	if (!c)
		return 1;
	make_prompt(id, tok, &n);
	if (run_sequence(c, tok, n, NULL, rep, &s) < 0)
		return 2;
	if (id == 2) {
		/* the same prompt again from scratch (another salt: no hits) */
		if (run_sequence(c, tok, n, "verify-cold", &cold, NULL) < 0) {
			snprintf(rep->err, sizeof(rep->err), "cold recompute: %.200s", cold.err);
			return 3;
		}
		rep->verify = !memcmp(cold.out, rep->out, sizeof(rep->out));
	}
	rep->ok = 1;
	/* stay attached until told, so the pool's stats show both workers */
	if (wait_fd >= 0 && read(wait_fd, &x, 1) < 0)
		return 4;
	kvq_seq_free(s);
	kvq_client_free(c);
	return 0;
}

static double checksum(const struct report *r)
{
	double s = 0;

	for (int l = 0; l < LAYERS; l++)
		for (int i = 0; i < Q_HEADS * HEAD_DIM; i++)
			s += r->out[l][i] * (double)((i % 7) + 1);
	return s;
}

static void print_stats(const char *when)
{
	struct kvq_stats st;
	kvq_client *c = NULL;
	int r = kvq_client_connect(sock, "kvq-demo-stats", &c);

	if (r == 0)
		r = kvq_client_stats(c, POOL, &st);
	if (r < 0) {
		printf("stats (%s): %s\n", when, kvq_strerror(r));
		kvq_client_free(c);
		return;
	}
	printf("pool '%s' (%s) %s: %u clients; sealed slots %u: %u cached (%u referenced), %u held, "
	       "%u reserved, %u free; open slots %u: %u used; lookups asked %" PRIu64 " tokens, hit %" PRIu64
	       "; evictions %" PRIu64 ", failed allocations %" PRIu64 "; %.1f MiB\n",
	       st.name, st.backend, when, st.clients, st.n_sealed, st.cached, st.referenced, st.sealed_held,
	       st.sealed_reserved, st.sealed_free, st.n_open, st.open_used, st.lookup_tokens, st.hit_tokens,
	       st.evictions, st.alloc_failures, st.total_bytes / 1048576.0);
	kvq_client_free(c);
}

/*
 * What the operator sees meanwhile: kvqctl stats of the pool (its resident
 * sequences, effective batch gain against f16, sharing factor).  kvqctl is
 * $KVQCTL, else the build tree's beside this program
 * (examples/../kvqctl/kvqctl), else kvqctl on PATH.
 */
static void run_kvqctl(void)
{
	char self[4096], path[4200];
	const char *bin = getenv("KVQCTL");
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	pid_t pid;
	int st;

	if (!bin && n > 0) {
		char *slash;

		self[n] = 0;
		slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			/* a libtool build runs the program from examples/.libs */
			n = (ssize_t)strlen(self);
			if (n > 6 && !strcmp(self + n - 6, "/.libs"))
				self[n - 6] = 0;
			snprintf(path, sizeof(path), "%s/../kvqctl/kvqctl", self);
			if (access(path, X_OK) == 0)
				bin = path;
		}
	}
	if (!bin)
		bin = "kvqctl";
	printf("$ kvqctl stats %s\n", POOL);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		if (sock)
			execlp(bin, bin, "--socket", sock, "stats", POOL, (char *)NULL);
		else
			execlp(bin, bin, "stats", POOL, (char *)NULL);
		fprintf(stderr, "kvq-demo: cannot run %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		printf("(kvqctl stats did not run)\n");
	printf("\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "socket", required_argument, NULL, 's' },
		{ "system-tokens", required_argument, NULL, 'n' }, { NULL, 0, NULL, 0 } };
	struct report *rep;
	int ch, p1[2], p2[2], st1, st2;
	pid_t w1, w2;

	while ((ch = getopt_long(argc, argv, "s:n:", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': sock = optarg; break;
		case 'n': sys_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: kvq-demo [--socket PATH] [--system-tokens N]\n");
			return 2;
		}
	}
	if (sys_tokens < BLOCK || sys_tokens > MAX_PROMPT - 64) {
		fprintf(stderr, "kvq-demo: --system-tokens between %u and %u\n", BLOCK, MAX_PROMPT - 64);
		return 2;
	}
	rep = mmap(NULL, 2 * sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (rep == MAP_FAILED || pipe2(p1, O_CLOEXEC) < 0 || pipe2(p2, O_CLOEXEC) < 0) {
		perror("kvq-demo");
		return 1;
	}
	memset(rep, 0, 2 * sizeof(*rep));
	printf("kvq-demo: K/V are SYNTHETIC activations (pseudo-random from token id and position), not a model.\n"
	       "geometry: %u layers, %u KV heads (%u query heads), head dim %u, %u tokens per block, policy %s\n"
	       "both workers: the same %u-token system prompt, then a different question\n\n",
	       LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, BLOCK, POLICY, sys_tokens);
	fflush(stdout);

	w1 = fork();
	if (w1 == 0) {
		/* no write end may stay open in a worker, or a read never ends */
		close(p1[1]);
		close(p2[1]);
		_exit(worker(1, &rep[0], p1[0]));
	}
	close(p1[0]);
	/* worker 2 starts once worker 1 has published (worker 1 stays attached) */
	while (!rep[0].ok && waitpid(w1, &st1, WNOHANG) == 0)
		usleep(1000);
	w2 = fork();
	if (w2 == 0) {
		close(p1[1]);
		close(p2[1]);
		_exit(worker(2, &rep[1], p2[0]));
	}
	close(p2[0]);
	while (!rep[1].ok && waitpid(w2, &st2, WNOHANG) == 0)
		usleep(1000);
	for (int i = 0; i < 2; i++) {
		const struct report *r = &rep[i];

		if (!r->ok) {
			printf("worker %d failed: %s\n", i + 1, r->err);
			continue;
		}
		printf("worker %d (%s): prompt %u tokens, prefix cache hit %u tokens (%u blocks); K/V computed and "
		       "written for %u tokens; prefix prepared in %.1f ms; now %u sealed + %u open blocks; decode "
		       "attention of the last token, all layers: %.2f ms, checksum %.6f\n",
		       i + 1, i ? "warm" : "cold", r->prompt, r->hit, r->hit / BLOCK, r->computed, r->prepare_ms,
		       r->sealed, r->open, r->attn_ms, checksum(r));
	}
	if (rep[0].ok && rep[1].ok) {
		printf("\nprefix preparation: cold %.1f ms, warm %.1f ms (%.1fx); worker 2 skipped %u of %u tokens\n",
		       rep[0].prepare_ms, rep[1].prepare_ms, rep[1].prepare_ms > 0 ? rep[0].prepare_ms / rep[1].prepare_ms : 0,
		       rep[1].hit, rep[1].prompt);
		printf("(cold time = synthetic K/V generation + quantize-on-write into the pool; a real model's prefill\n"
		       " compute, which the cache also skips, would come on top)\n");
		printf("worker 2's attention over the shared quantized prefix equals a cold recompute bit for bit: %s\n"
		       "(the recompute used another salt, so its %u sealed blocks are cached separately)\n\n",
		       rep[1].verify ? "yes" : "NO", rep[1].sealed);
	}
	print_stats("with both workers attached");
	run_kvqctl();
	close(p1[1]);
	close(p2[1]);
	waitpid(w1, &st1, 0);
	waitpid(w2, &st2, 0);
	print_stats("after both workers left (published blocks stay cached)");
	return rep[0].ok && rep[1].ok && rep[1].verify && rep[1].hit > 0 ? 0 : 1;
}
