/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench remote, part (d): kvq-run (examples/kvq-run: a real model on
 * the CPU path, or with cuda pools its GPU path (--gpu);
 * SmolLM2-135M-Instruct by default) answers a question after
 * a long system prompt (the Artistic License text, as tools/model-demo.sh)
 * on three kvqd nodes whose pools are configured alike for the model's
 * geometry:
 *   node A, with the remote (remote_write = through), runs it cold: its
 *     sealed blocks are written to the cluster;
 *   node B, the same remote and namespace, whose pool never saw the
 *     prompt: its prefix lookup fetches them from the remote;
 *   node C, no remote: cold, the prefix computed again.
 * Each run's prefix lookup and prefill are kvq-run's own figures; what
 * node B's worker saves is node C's lookup and prefill less its own.
 *
 * kvq-run names its pool after the model, the policy and the pool's size
 * (examples/kvq-run/kv.c), which a short prompt shares with the long one:
 * a probe run on a node that creates pools on attach gives the pool's name,
 * model id and geometry, which the three nodes' [pool] sections then
 * configure.
 */
#include "config.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "kvq.h"
#include "remote_model.h"

#include "../tests/daemon.h"

#define RM_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"   /* tools/fetch-model.sh's */
#define RM_QUESTION "Who may charge a fee under this license?"
#define RM_NAMESPACE "bench-model"
#define RM_WAIT_MS 60000

struct rm_node {
	const char *tag;
	pid_t pid;
	char dir[64], sock[108], bin[256];
};

/* What the runs share: the programs, the files, the pool. */
struct rm_ctx {
	char run[256], tmp[64], pool[80], threads[16];
	const char *policy;
	uint64_t capacity;
	struct rmodel *r;
};

__attribute__((format(printf, 3, 4)))
static void rm_why(struct rmodel *r, enum rmodel_state state, const char *fmt, ...)
{
	va_list ap;

	r->state = state;
	va_start(ap, fmt);
	vsnprintf(r->why, sizeof r->why, fmt, ap);
	va_end(ap);
}

/* r->file: path, else $KVQ_MODEL, else tools/fetch-model.sh's cache; false
 * (skipped) when it is not readable. */
static bool rm_find_model(const char *path, struct rmodel *r)
{
	const char *dir = getenv("KVQ_MODEL_DIR"), *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");

	if (!path)
		path = getenv("KVQ_MODEL");
	if (path)
		snprintf(r->file, sizeof r->file, "%s", path);
	else if (dir)
		snprintf(r->file, sizeof r->file, "%s/" RM_FILE, dir);
	else if (cache)
		snprintf(r->file, sizeof r->file, "%s/kvqd/models/" RM_FILE, cache);
	else
		snprintf(r->file, sizeof r->file, "%s/.cache/kvqd/models/" RM_FILE, home ? home : "");
	if (access(r->file, R_OK) == 0)
		return true;
	rm_why(r, RMODEL_SKIPPED, "no model at %s (give --model PATH or $KVQ_MODEL, or fetch it with "
	       "tools/fetch-model.sh)", r->file);
	return false;
}

/* kvq-run ($KVQ_RUN, else $top_builddir's) and the system prompt
 * ($KVQ_TEXTS/Artistic, else Debian's); false (skipped) without them. */
static bool rm_find_programs(struct rm_ctx *x)
{
	const char *run = getenv("KVQ_RUN"), *top = getenv("top_builddir"), *texts = getenv("KVQ_TEXTS");
	struct rmodel *r = x->r;

	if (run)
		snprintf(x->run, sizeof x->run, "%s", run);
	else
		snprintf(x->run, sizeof x->run, "%s/examples/kvq-run/kvq-run", top ? top : ".");
	if (access(x->run, X_OK) < 0) {
		rm_why(r, RMODEL_SKIPPED, "no kvq-run at %s (build it, or set $KVQ_RUN)", x->run);
		return false;
	}
	if (texts)
		snprintf(r->system, sizeof r->system, "%s/Artistic", texts);
	else
		snprintf(r->system, sizeof r->system, "/usr/share/common-licenses/Artistic");
	if (access(r->system, R_OK) < 0) {
		rm_why(r, RMODEL_SKIPPED, "no system prompt at %s (set $KVQ_TEXTS to a folder holding Artistic)",
		       r->system);
		return false;
	}
	return true;
}

/* The file path whole, NUL-terminated, or NULL. */
static char *rm_slurp(const char *path)
{
	FILE *f = fopen(path, "re");
	char *s = NULL;
	long n;

	if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (s = malloc((size_t)n + 1))) {
		s[fread(s, 1, (size_t)n, f)] = '\0';
	}
	if (f)
		fclose(f);
	return s;
}

/* The number after key in s, or -1. */
static double rm_num(const char *s, const char *key)
{
	const char *p = strstr(s, key);

	return p ? strtod(p + strlen(key), NULL) : -1;
}

/* kvq-run generate on node n, with the system prompt when system, then
 * prompt: its figures into *ret and its pool's name into x->pool; false
 * (failed) when it did not run to the end. */
static bool rm_run(struct rm_ctx *x, const struct rm_node *n, bool system, const char *prompt,
		   struct rmodel_run *ret)
{
	char out[96], err[96], *so = NULL, *se = NULL;
	const char *p;
	pid_t pid;
	int st = -1;
	bool ok = false;

	snprintf(out, sizeof out, "%s/%s.out", x->tmp, n->tag);
	snprintf(err, sizeof err, "%s/%s.err", x->tmp, n->tag);
	pid = fork();
	if (pid == 0) {
		int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		if (fo < 0 || fe < 0 || dup2(fo, STDOUT_FILENO) < 0 || dup2(fe, STDERR_FILENO) < 0)
			_exit(126);
		const char *argv[24] = { x->run, "generate", "--model", x->r->file, "--socket", n->sock, "--kv",
					 x->policy, "--prompt", prompt, "--max-tokens", "4", "--threads", x->threads,
					 "--json", "--stats" };
		int i = 16;

		if (x->r->gpu)
			argv[i++] = "--gpu";
		if (system) {
			argv[i++] = "--system-file";
			argv[i++] = x->r->system;
		}
		execv(x->run, (char *const *)argv);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, &st, 0);
	so = rm_slurp(out);
	se = rm_slurp(err);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !so || !se) {
		p = se ? strstr(se, "kvq-run: ") : NULL;
		rm_why(x->r, RMODEL_FAILED, "kvq-run on %s: %.*s", n->tag, p ? (int)strcspn(p, "\n") : 16,
		       p ? p : "did not run");
		goto out;
	}
	*ret = (struct rmodel_run){ rm_num(so, "\"lookup_seconds\":"), rm_num(so, "\"prefill_seconds\":"),
				    (uint32_t)rm_num(so, "\"prompt_tokens\":"), (uint32_t)rm_num(so, "\"hit_tokens\":") };
	p = strstr(se, "kvq-run: pool ");
	if (ret->lookup_s < 0 || ret->prefill_s < 0 || !p) {
		rm_why(x->r, RMODEL_FAILED, "kvq-run on %s: no figures in its report", n->tag);
		goto out;
	}
	p += strlen("kvq-run: pool ");
	snprintf(x->pool, sizeof x->pool, "%.*s", (int)strcspn(p, " "), p);
	ok = true;
out:
	unlink(out);
	unlink(err);
	free(so);
	free(se);
	return ok;
}

/* Figure name of pool on node n (no attach), or 0. */
static uint64_t rm_figure(const struct rm_node *n, const char *pool, const char *name)
{
	kvq_client *c = NULL;
	uint64_t v = 0;

	if (kvq_client_connect(n->sock, "remote-bench", &c) == 0 && kvq_client_pool_stat(c, pool, name, &v) < 0)
		v = 0;
	kvq_client_free(c);
	return v;
}

/* Starts node n with extra lines for its kvqd.conf; false (failed) when it
 * did not start. */
static bool rm_up(struct rm_ctx *x, struct rm_node *n, const char *extra)
{
	n->pid = test_daemon_start_conf(x->r->gpu ? "cuda" : "host", n->tag, extra, n->dir, sizeof n->dir, n->sock, sizeof n->sock,
					n->bin, sizeof n->bin);
	if (n->pid <= 0)
		rm_why(x->r, RMODEL_FAILED, "%s: kvqd did not start", n->tag);
	return n->pid > 0;
}

static void rm_down(struct rm_node *n)
{
	if (n->pid > 0)
		test_daemon_stop(n->pid, n->dir);
	n->pid = 0;
}

/* The probe: kvq-run's pool for this model and policy, created on a node
 * of its own by a short prompt; its name, model id, geometry and size. */
static bool rm_probe(struct rm_ctx *x)
{
	struct rm_node p = { .tag = "rbenchP" };
	struct rmodel_run run;
	struct kvq_stats st;
	kvq_client *c = NULL;
	bool ok = false;

	if (!rm_up(x, &p, "memory_budget = 2G\ncreate_capacity = 1G\n") || !rm_run(x, &p, false, RM_QUESTION, &run))
		goto out;
	if (kvq_client_connect(p.sock, "remote-bench", &c) < 0 || kvq_client_stats(c, x->pool, &st) < 0) {
		rm_why(x->r, RMODEL_FAILED, "the probe's pool %s: no stats", x->pool);
		goto out;
	}
	snprintf(x->r->model_id, sizeof x->r->model_id, "%s", st.model_id);
	x->r->layers = st.layers;
	x->r->kv_heads = st.kv_heads;
	x->r->head_dim = st.head_dim;
	x->r->block_tokens = st.block_tokens;
	x->capacity = st.total_bytes;
	ok = true;
out:
	kvq_client_free(c);
	rm_down(&p);
	return ok;
}

/* Node n's kvqd.conf lines: the probe's pool, with the remote when remote. */
static void rm_conf(const struct rm_ctx *x, const char *remote, char *buf, size_t len)
{
	const struct rmodel *r = x->r;

	snprintf(buf, len,
		 "memory_budget = %llu\n%s[pool %s]\nmodel = %s\nlayers = %u\nkv_heads = %u\nhead_dim = %u\n"
		 "block_tokens = %u\npolicy = %s\ncapacity = %llu\n%s",
		 (unsigned long long)(2 * x->capacity + (256ull << 20)), remote ? remote : "", x->pool, r->model_id,
		 r->layers, r->kv_heads, r->head_dim, r->block_tokens, x->policy, (unsigned long long)x->capacity,
		 remote ? "remote = shared\nremote_namespace = " RM_NAMESPACE "\nremote_write = through\n" : "");
}

/* Until node n's pool has written its blocks (its queue empty, at least
 * one written): their count, or 0 after RM_WAIT_MS. */
static uint64_t rm_written(const struct rm_ctx *x, const struct rm_node *n)
{
	double end = now_s() + RM_WAIT_MS / 1e3;

	while (now_s() < end) {
		uint64_t w = rm_figure(n, x->pool, "remote_written");

		if (w && !rm_figure(n, x->pool, "remote_queue"))
			return w;
		usleep(10000);
	}
	return 0;
}

void rmodel_run(const char *path, const char *remote, const char *policy, bool gpu, struct rmodel *r)
{
	struct rm_ctx x = { .policy = policy, .r = r };
	struct rm_node A = { .tag = "rbenchMA" }, B = { .tag = "rbenchMB" }, C = { .tag = "rbenchMC" };
	char conf[4096];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t f0, b0;

	memset(r, 0, sizeof *r);
	r->gpu = gpu;
	r->threads = cpus > 0 ? (uint32_t)cpus : 1;
	snprintf(x.threads, sizeof x.threads, "%u", r->threads);
	snprintf(x.tmp, sizeof x.tmp, "/tmp/kvq-bench-model.XXXXXX");
	if (!rm_find_model(path, r) || !rm_find_programs(&x))
		return;
	if (!mkdtemp(x.tmp)) {
		rm_why(r, RMODEL_FAILED, "no folder %s", x.tmp);
		return;
	}
	if (!rm_probe(&x))
		goto out;
	rm_conf(&x, remote, conf, sizeof conf);
	if (!rm_up(&x, &A, conf) || !rm_up(&x, &B, conf))
		goto out;
	rm_conf(&x, NULL, conf, sizeof conf);
	if (!rm_up(&x, &C, conf) || !rm_run(&x, &A, true, RM_QUESTION, &r->a))
		goto out;
	if (!(r->written = rm_written(&x, &A))) {
		rm_why(r, RMODEL_FAILED, "node A wrote nothing through to the remote in %d s", RM_WAIT_MS / 1000);
		goto out;
	}
	f0 = rm_figure(&B, x.pool, "remote_fetched");
	b0 = rm_figure(&B, x.pool, "remote_bytes_in");
	if (!rm_run(&x, &B, true, RM_QUESTION, &r->b) || !rm_run(&x, &C, true, RM_QUESTION, &r->c))
		goto out;
	r->fetched = rm_figure(&B, x.pool, "remote_fetched") - f0;
	r->bytes_in = rm_figure(&B, x.pool, "remote_bytes_in") - b0;
	if (!r->b.hit || r->c.hit || r->a.hit)
		rm_why(r, RMODEL_FAILED, "tokens hit: node A %u, node B %u, node C %u (0, more, 0 expected)", r->a.hit,
		       r->b.hit, r->c.hit);
	else
		r->state = RMODEL_RAN;
out:
	rm_down(&A);
	rm_down(&B);
	rm_down(&C);
	rmdir(x.tmp);
}

void rmodel_print(const struct rmodel *r, const char *policy, bool json)
{
	const char *base = strrchr(r->file, '/') ? strrchr(r->file, '/') + 1 : r->file;
	double cold = r->c.lookup_s + r->c.prefill_s, hit = r->b.lookup_s + r->b.prefill_s;

	if (json && r->state != RMODEL_RAN) {
		printf(", \"model\": {\"%s\": \"", r->state == RMODEL_SKIPPED ? "skipped" : "failed");
		for (const char *p = r->why; *p; p++)
			printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
		printf("\"}");
		return;
	}
	if (json) {
		printf(", \"model\": {\"file\": \"%s\", \"model_id\": \"%s\", \"policy\": \"%s\", \"path\": \"%s\", \"threads\": %u, "
		       "\"prompt_tokens\": %u, \"a_cold\": {\"lookup_s\": %.4f, \"prefill_s\": %.4f, \"hit\": %u, "
		       "\"written\": %llu}, \"b_remote\": {\"lookup_s\": %.4f, \"prefill_s\": %.4f, \"hit\": %u, "
		       "\"fetched\": %llu, \"bytes_in\": %llu}, \"c_cold\": {\"lookup_s\": %.4f, \"prefill_s\": %.4f, "
		       "\"hit\": %u}, \"saved_s\": %.4f}",
		       base, r->model_id, policy, r->gpu ? "gpu" : "cpu", r->threads, r->b.prompt, r->a.lookup_s, r->a.prefill_s, r->a.hit,
		       (unsigned long long)r->written, r->b.lookup_s, r->b.prefill_s, r->b.hit,
		       (unsigned long long)r->fetched, (unsigned long long)r->bytes_in, r->c.lookup_s, r->c.prefill_s,
		       r->c.hit, cold - hit);
		return;
	}
	if (r->state != RMODEL_RAN) {
		printf("(d) kvq-run on a real model: %s: %s\n", r->state == RMODEL_SKIPPED ? "skipped" : "FAILED",
		       r->why);
		return;
	}
	printf("(d) kvq-run (%s path, %u threads), %s (%s), KV %s, %u layers x %u KV heads x D %u, B %u: the "
	       "system prompt %s and a question, %u tokens (kvq-run's own figures):\n", r->gpu ? "GPU" : "CPU", r->threads, r->model_id,
	       base, policy, r->layers, r->kv_heads, r->head_dim, r->block_tokens, r->system, r->b.prompt);
	printf("    node A (the remote, write-through), cold: lookup %.3f s, prefill %.3f s, %u tokens hit; "
	       "%llu blocks written through\n", r->a.lookup_s, r->a.prefill_s, r->a.hit,
	       (unsigned long long)r->written);
	printf("    node B (the same remote and namespace, its pool never saw the prompt): lookup %.3f s (%llu blocks, "
	       "%llu bytes fetched from the remote), prefill %.3f s, %u tokens hit\n", r->b.lookup_s,
	       (unsigned long long)r->fetched, (unsigned long long)r->bytes_in, r->b.prefill_s, r->b.hit);
	printf("    node C (no remote), cold, the prefix recomputed: lookup %.3f s, prefill %.3f s, %u tokens hit\n",
	       r->c.lookup_s, r->c.prefill_s, r->c.hit);
	printf("    a node B worker saves %.3f s against recomputing the prefix (node C's lookup and prefill, %.3f s, "
	       "less node B's, %.3f s): %.1fx faster to its first token\n", cold - hit, cold, hit,
	       hit > 0 ? cold / hit : 0);
}
