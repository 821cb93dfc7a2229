/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: a real model (a Llama-architecture GGUF, SmolLM2-135M-Instruct
 * by default) whose KV cache lives in a kvqd pool.
 *
 *   kvq-run generate --prompt TEXT [--kv POLICY] [--max-tokens N] [--raw]
 *                    [--system TEXT | --system-file FILE] [--no-prefix-cache] [--stats]
 *     (chat template; the prompt's cached sealed prefix is taken from kvqd's
 *     prefix cache unless --no-prefix-cache)
 *   kvq-run perplexity [--kv POLICY] [--ctx N] FILE [--json]
 *   kvq-run ab --kv POLICY [--kv POLICY...] [--ctx N] FILE [--json]
 *   kvq-run tokenize [--special] [--decode] TEXT   (ids, or their bytes again)
 *   kvq-run calibrate [--ctx N] [--rotate] --out PATH FILE
 *     (K's per-channel mean over FILE, for --k-center)
 *
 * Common: --model PATH ($KVQ_MODEL), --socket PATH ($KVQ_SOCKET), --window N
 * (open window in tokens, 0: the pool's default), --batch N (prefill chunk),
 * --threads N, --limit N (use the first N tokens of FILE), --rotate (K, V
 * and q per head through a Hadamard transform, model.h), --gpu [--device N]
 * (the layers on a GPU with the KV in cuda pools, model_gpu.h), --k-center
 * PATH (K centered by calibrate's means, model.h).
 *
 * The model is loaded in load.c, a policy's pool and sequence is kv.c, text
 * and tokens are text.c.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mm.h"
#include "run.h"

#define RUN_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

struct opts o = { .block = 16, .batch = 128, .max_tokens = 128, .threads = 1, .gen = 64, .gen_prompts = 4 };

__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvq-run: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* ---------------------------------------------------------------- generate */

static void print_token(uint32_t id)
{
	char buf[256];

	tok_decode(tk, id, buf, sizeof(buf));
	fputs(buf, stdout);
	fflush(stdout);
}

/* Greedy continuation of g tokens after the logits in last; stops early at
 * stop (>= 0).  Returns the count written to out. */
static uint32_t greedy(struct kv *k, float *last, uint32_t g, int stop, uint32_t *out, bool print)
{
	uint32_t n = 0, V = model_cfg(md)->vocab;

	while (n < g) {
		uint32_t t = argmax(last, V);

		if ((int)t == stop || t == tok_eos(tk))
			break;
		out[n++] = t;
		if (print)
			print_token(t);
		if (n < g)
			feed(k, &t, 1, NULL, last);
	}
	return n;
}

static void print_stats(struct kv *k)
{
	struct kvq_stats st;
	int r = kvq_client_stats(k->c, NULL, &st);

	if (r < 0) {
		fprintf(stderr, "kvq-run: stats: %s\n", kvq_strerror(r));
		return;
	}
	fprintf(stderr, "kvq-run: pool %s (%s, %.1f MiB): %u client(s); sealed slots %u: %u cached (%u referenced), "
		"%u held, %u reserved, %u free; open slots %u: %u used; lookups asked %llu tokens, hit %llu\n",
		st.name, st.backend, st.total_bytes / 1048576.0, st.clients, st.n_sealed, st.cached, st.referenced,
		st.sealed_held, st.sealed_reserved, st.sealed_free, st.n_open, st.open_used,
		(unsigned long long)st.lookup_tokens, (unsigned long long)st.hit_tokens);
}

static int cmd_generate(void)
{
	const struct model_cfg *c;
	struct kv k = { 0 };
	char *text, *sys = NULL, nocache[64];
	size_t n, len, sys_len = 0;
	uint32_t *ids, *out, g, hit = 0;
	float *last;
	int end, r;
	double t0, t1, t2;

	if (!o.prompt)
		die("generate needs --prompt TEXT");
	load();
	c = model_cfg(md);
	if (o.system_file)
		sys = read_file(o.system_file, &sys_len);
	len = strlen(o.prompt) + sys_len + strlen(RUN_SYSTEM) + 128;
	text = malloc(len);
	if (!text)
		die("%s", strerror(ENOMEM));
	if (o.raw)
		snprintf(text, len, "%s", o.prompt);
	else
		snprintf(text, len, "<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
			 sys ? sys : o.system ? o.system : RUN_SYSTEM, o.prompt);
	free(sys);
	ids = encode(text, strlen(text), !o.raw, &n);
	free(text);
	if (n == 0 || n + o.max_tokens > c->ctx)
		die("prompt empty or beyond the context");
	end = tok_find(tk, "<|im_end|>");
	/* pools sized by class, so workers with different prompts share one */
	kv_open(&k, o.kv[0] ? o.kv[0] : "f16", n + o.max_tokens <= 2048 ? 2048 : c->ctx);
	if (o.no_cache) {
		/* a salt of our own: nothing found, nothing shared */
		snprintf(nocache, sizeof(nocache), "no-prefix-cache-%ld-%.0f", (long)getpid(), now_s() * 1e6);
		o.salt = nocache;
	}
	kv_reset(&k);
	last = malloc(sizeof(float) * c->vocab);
	out = malloc(sizeof(uint32_t) * (o.max_tokens + 1));
	if (!last || !out)
		die("%s", strerror(ENOMEM));
	t0 = now_s();
	if (!o.no_cache) {
		r = kvq_seq_from_prompt(k.s, ids, (uint32_t)n, &hit);
		if (r < 0)
			die("prefix lookup: %s (%s)", kvq_strerror(r), kvq_client_error(k.c));
	}
	feed(&k, ids + hit, (uint32_t)n - hit, NULL, last);
	t1 = now_s();
	g = greedy(&k, last, o.max_tokens, end, out, true);
	t2 = now_s();
	printf("\n");
	fflush(stdout);
	fprintf(stderr, "kvq-run: kv %s (window %u, %.2f bits/value sealed); prompt %zu tokens: %u from the prefix "
		"cache%s, %zu computed; prefill %.2f s; %u tokens generated in %.2f s (%.1f tok/s); matmul path %s, "
		"%u thread(s)\n",
		k.canon, k.window, k.bits, n, hit, o.no_cache ? " (disabled)" : "", n - hit, t1 - t0, g, t2 - t1,
		g > 1 ? (g - 1) / (t2 - t1) : 0.0, o.gpu ? "cuBLAS (GPU)" : mm_path(), o.threads);
	if (o.stats)
		print_stats(&k);
	free(last);
	free(out);
	free(ids);
	kv_close(&k);
	return 0;
}

/* ---------------------------------------------------------------- perplexity */

static int cmd_perplexity(void)
{
	uint32_t V, ctx, *ids;
	struct kv k = { 0 };
	size_t n;
	double nll = 0, t0;
	uint64_t scored = 0;
	unsigned windows = 0;
	float *logits;
	FILE *dump = NULL;

	load();
	V = model_cfg(md)->vocab;
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > model_cfg(md)->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	kv_open(&k, o.kv[0] ? o.kv[0] : "f16", ctx);
	logits = malloc(sizeof(float) * V * ctx);
	double *lp = malloc(sizeof(double) * V);
	if (!logits || !lp)
		die("%s", strerror(ENOMEM));
	if (o.dump && !(dump = fopen(o.dump, "wb")))
		die("%s: %s", o.dump, strerror(errno));
	t0 = now_s();
	/* non-overlapping windows of ctx tokens, each a fresh sequence; every
	 * token after a window's first is scored */
	for (size_t a = 0; a + 1 < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		if (w < 2)
			break;
		kv_reset(&k);
		feed(&k, ids + a, w, logits, NULL);
		/* for tools/model-check.py: per window, the count, the ids and
		 * the logits (uint32, uint32[w], float[w][vocab], little-endian) */
		if (dump && (fwrite(&w, 4, 1, dump) != 1 || fwrite(ids + a, 4, w, dump) != w ||
			     fwrite(logits, sizeof(float) * V, w, dump) != w))
			die("%s: %s", o.dump, strerror(errno));
		for (uint32_t i = 0; i + 1 < w; i++) {
			log_softmax(logits + (size_t)i * V, V, lp);
			nll -= lp[ids[a + i + 1]];
			scored++;
		}
		windows++;
	}
	double secs = now_s() - t0, ppl = exp(nll / scored);
	if (o.json)
		printf("{\"file\":\"%s\",\"kv\":\"%s\",\"window\":%u,\"bits_per_value\":%.4f,\"ctx\":%u,"
		       "\"tokens\":%zu,\"windows\":%u,\"scored\":%llu,\"nll\":%.6f,\"ppl\":%.6f,\"seconds\":%.1f,"
		       "\"rotate\":%s,\"k_center\":%s,\"path\":\"%s\"}\n",
		       o.file, k.canon, k.window, k.bits, ctx, n, windows, (unsigned long long)scored, nll / scored, ppl,
		       secs, o.rotate ? "true" : "false", k_center ? "true" : "false", o.gpu ? "gpu" : "cpu");
	else
		printf("%s: kv %s (window %u, %.2f bits/value), ctx %u: %zu tokens, %u window(s), %llu scored: "
		       "perplexity %.4f (%.1f s)\n",
		       o.file, k.canon, k.window, k.bits, ctx, n, windows, (unsigned long long)scored, ppl, secs);
	if (dump && fclose(dump) != 0)
		die("%s: %s", o.dump, strerror(errno));
	free(lp);
	free(logits);
	free(ids);
	kv_close(&k);
	return 0;
}

/* ---------------------------------------------------------------- ab */

struct ab_stat {
	double nll, kl;
	uint64_t top1;
	/* greedy continuations */
	uint64_t ngrams, repeats, gen, match;
};

/* Repeated 4-grams of x[0..n): those equal to an earlier one. */
static void rep4(const uint32_t *x, uint32_t n, struct ab_stat *st)
{
	for (uint32_t i = 3; i < n; i++) {
		bool rep = false;

		for (uint32_t j = 3; j < i && !rep; j++)
			rep = !memcmp(x + i - 3, x + j - 3, 4 * sizeof(*x));
		st->ngrams++;
		st->repeats += rep;
	}
}

static int cmd_ab(void)
{
	uint32_t V, ctx, *ids, nk = o.n_kv + 1, gp = o.gen ? o.gen_prompts : 0;
	struct kv k[RUN_MAX_KV + 1] = { { 0 } };
	struct ab_stat st[RUN_MAX_KV + 1] = { { 0 } };
	uint64_t scored = 0;
	size_t n;
	double t0, *lr, *lq, *pref;
	float **logits;
	uint32_t *cont[RUN_MAX_KV + 1];

	if (o.n_kv == 0)
		die("ab needs --kv POLICY");
	load();
	V = model_cfg(md)->vocab;
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx + o.gen > model_cfg(md)->ctx)
		die("--ctx between 2 and the model's context less --gen");
	ids = file_tokens(&n);
	logits = calloc(nk, sizeof(*logits));
	lr = malloc(sizeof(double) * V);
	lq = malloc(sizeof(double) * V);
	pref = malloc(sizeof(double) * V);
	if (!logits || !lr || !lq || !pref)
		die("%s", strerror(ENOMEM));
	for (uint32_t j = 0; j < nk; j++) {
		kv_open(&k[j], j == 0 ? "f16" : o.kv[j - 1], ctx + o.gen);
		logits[j] = malloc(sizeof(float) * V * (size_t)o.batch);
		cont[j] = malloc(sizeof(uint32_t) * (o.gen + 1));
		if (!logits[j] || !cont[j])
			die("%s", strerror(ENOMEM));
	}
	t0 = now_s();
	for (size_t a = 0; a + 1 < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		if (w < 2)
			break;
		for (uint32_t j = 0; j < nk; j++)
			kv_reset(&k[j]);
		/* chunk by chunk, every policy in step, so logits need not be kept */
		for (uint32_t c0 = 0; c0 < w; c0 += o.batch) {
			uint32_t m = w - c0 < o.batch ? w - c0 : o.batch;

			for (uint32_t j = 0; j < nk; j++)
				feed(&k[j], ids + a + c0, m, logits[j], NULL);
			for (uint32_t i = 0; i < m && c0 + i + 1 < w; i++) {
				uint32_t tgt = ids[a + c0 + i + 1];
				const float *ref = logits[0] + (size_t)i * V;
				uint32_t top_ref = argmax(ref, V);

				log_softmax(ref, V, lr);
				for (uint32_t v = 0; v < V; v++)
					pref[v] = exp(lr[v]);
				st[0].nll -= lr[tgt];
				for (uint32_t j = 1; j < nk; j++) {
					const float *q = logits[j] + (size_t)i * V;
					double kl = 0;

					log_softmax(q, V, lq);
					st[j].nll -= lq[tgt];
					for (uint32_t v = 0; v < V; v++)
						kl += pref[v] * (lr[v] - lq[v]);
					st[j].kl += kl;
					st[j].top1 += argmax(q, V) == top_ref;
				}
				scored++;
			}
		}
	}
	/* greedy continuations from gp prompts spread over the text (each the
	 * 256 tokens before its point) */
	for (uint32_t p = 0; p < gp; p++) {
		size_t end = 256 + (n > 512 ? (n - 256) * (p + 1) / (gp + 1) : 0);
		uint32_t plen = (uint32_t)(end < n ? 256 : n - (n > 256 ? n - 256 : 0)), g[RUN_MAX_KV + 1];
		const uint32_t *pr = ids + (end < n ? end : n) - plen;

		for (uint32_t j = 0; j < nk; j++) {
			kv_reset(&k[j]);
			feed(&k[j], pr, plen, NULL, logits[j]);
			g[j] = greedy(&k[j], logits[j], o.gen, -1, cont[j], false);
			rep4(cont[j], g[j], &st[j]);
			st[j].gen += g[j];
			for (uint32_t i = 0; i < g[j] && i < g[0] && cont[j][i] == cont[0][i]; i++)
				st[j].match++;
		}
	}
	double secs = now_s() - t0, ppl_ref = exp(st[0].nll / scored);
	if (o.json)
		printf("{\"file\":\"%s\",\"ctx\":%u,\"tokens\":%zu,\"scored\":%llu,\"seconds\":%.1f,\"gen\":%u,"
		       "\"gen_prompts\":%u,\"rotate\":%s,\"k_center\":%s,\"path\":\"%s\",\"ref\":{\"kv\":\"f16\","
		       "\"window\":%u,\"bits_per_value\":%.4f,\"ppl\":%.6f,\"rep4\":%.4f},\"results\":[",
		       o.file, ctx, n, (unsigned long long)scored, secs, o.gen, gp, o.rotate ? "true" : "false",
		       k_center ? "true" : "false", o.gpu ? "gpu" : "cpu", k[0].window, k[0].bits, ppl_ref,
		       st[0].ngrams ? (double)st[0].repeats / st[0].ngrams : 0.0);
	else
		printf("%s: ctx %u, %zu tokens, %llu scored; f16 KV perplexity %.4f (%.1f s)\n", o.file, ctx, n,
		       (unsigned long long)scored, ppl_ref, secs);
	for (uint32_t j = 1; j < nk; j++) {
		double ppl = exp(st[j].nll / scored), d = 100.0 * (ppl - ppl_ref) / ppl_ref;
		double kl = st[j].kl / scored, top1 = (double)st[j].top1 / scored;
		double r4 = st[j].ngrams ? (double)st[j].repeats / st[j].ngrams : 0.0, r4ref =
			st[0].ngrams ? (double)st[0].repeats / st[0].ngrams : 0.0;
		double match = st[0].gen ? (double)st[j].match / st[0].gen : 0.0;

		if (o.json)
			printf("%s{\"kv\":\"%s\",\"window\":%u,\"bits_per_value\":%.4f,\"ppl\":%.6f,\"dppl_pct\":%.4f,"
			       "\"kl\":%.6f,\"top1\":%.6f,\"rep4\":%.4f,\"cont_match\":%.4f}",
			       j > 1 ? "," : "", k[j].canon, k[j].window, k[j].bits, ppl, d, kl, top1, r4, match);
		else
			printf("  kv %-32s window %3u  %5.2f bits/value  ppl %.4f (%+.3f%%)  KL %.5f  top-1 %.2f%%  "
			       "repeated 4-grams %.1f%% (f16 %.1f%%)  continuation = f16 for %.1f%% of tokens\n",
			       k[j].canon, k[j].window, k[j].bits, ppl, d, kl, 100 * top1, 100 * r4, 100 * r4ref,
			       100 * match);
	}
	if (o.json)
		printf("]}\n");
	for (uint32_t j = 0; j < nk; j++) {
		free(logits[j]);
		free(cont[j]);
		kv_close(&k[j]);
	}
	free(logits);
	free(lr);
	free(lq);
	free(pref);
	free(ids);
	return 0;
}

/* ---------------------------------------------------------------- calibrate */

/* K's mean per layer, head and channel over FILE (FP16 KV, windows of
 * --ctx tokens), written to --out for --k-center. */
static int cmd_calibrate(void)
{
	const struct model_cfg *c;
	struct kc_head h = { .magic = KC_MAGIC };
	struct kv k = { 0 };
	uint32_t ctx, *ids;
	size_t n, nk;
	FILE *f;

	if (!o.out)
		die("calibrate needs --out PATH");
	if (o.gpu || o.k_center)
		die("calibrate runs on the CPU path, without --k-center");
	want_k_sum = true;
	load();
	c = model_cfg(md);
	ctx = o.ctx ? o.ctx : 2048;
	if (ctx < 2 || ctx > c->ctx)
		die("--ctx between 2 and the model's context");
	ids = file_tokens(&n);
	kv_open(&k, "f16", ctx);
	for (size_t a = 0; a < n; a += ctx) {
		uint32_t w = n - a < ctx ? (uint32_t)(n - a) : ctx;

		kv_reset(&k);
		feed(&k, ids + a, w, NULL, NULL);
	}
	nk = (size_t)c->layers * c->kv_heads * c->head_dim;
	h.layers = c->layers;
	h.kv_heads = c->kv_heads;
	h.head_dim = c->head_dim;
	h.rotate = o.rotate;
	h.tokens = n;
	h.model_fp = model_fp;
	float *mean = malloc(nk * sizeof(float));
	if (!mean)
		die("%s", strerror(ENOMEM));
	for (size_t i = 0; i < nk; i++)
		mean[i] = (float)(k_sum[i] / (double)n);
	if (!(f = fopen(o.out, "wb")) || fwrite(&h, sizeof(h), 1, f) != 1 || fwrite(mean, sizeof(float), nk, f) != nk ||
	    fclose(f) != 0)
		die("%s: %s", o.out, strerror(errno));
	printf("%s: K means of %u layers x %u heads x %u channels over %zu tokens of %s%s\n", o.out, c->layers,
	       c->kv_heads, c->head_dim, n, o.file, o.rotate ? " (rotated)" : "");
	free(mean);
	free(ids);
	kv_close(&k);
	return 0;
}

/* ---------------------------------------------------------------- tokenize */

static int cmd_tokenize(void)
{
	size_t n;
	uint32_t *ids;

	if (!o.prompt)
		die("tokenize needs TEXT");
	load();
	ids = encode(o.prompt, strlen(o.prompt), o.special, &n);
	for (size_t i = 0; i < n; i++) {
		if (o.decode) {
			char buf[256];
			int len = tok_decode(tk, ids[i], buf, sizeof(buf));

			fwrite(buf, 1, len < (int)sizeof(buf) ? (size_t)len : sizeof(buf) - 1, stdout);
		} else {
			printf("%s%u", i ? " " : "", ids[i]);
		}
	}
	if (!o.decode)
		printf("\n");
	free(ids);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvq-run generate --prompt TEXT [--kv POLICY] [--max-tokens N] [--raw]\n"
		   "                [--system TEXT | --system-file FILE] [--no-prefix-cache] [--stats]\n"
		   "       kvq-run perplexity [--kv POLICY] [--ctx N] [--json] [--dump PATH] FILE\n"
		   "       kvq-run ab --kv POLICY [--kv POLICY...] [--ctx N] [--gen N] [--json] FILE\n"
		   "       kvq-run tokenize [--special] [--decode] TEXT   (ids, or the ids decoded back)\n"
		   "       kvq-run calibrate [--ctx N] [--rotate] --out PATH FILE   (K means for --k-center)\n"
		   "options: --model PATH ($KVQ_MODEL)  --socket PATH ($KVQ_SOCKET)  --window N (open window,\n"
		   "         tokens)  --batch N (prefill chunk, default 128)  --threads N  --limit N (first N\n"
		   "         tokens of FILE)  --gen N (ab: greedy tokens per continuation, default 64, 0 none)\n"
		   "         --gen-prompts N (ab: continuations, default 4)  --kv POLICY@W: open window W\n"
		   "         --block N (tokens per KV block, default 16)  --rotate (Hadamard-rotated K, V, q)\n"
		   "         --gpu [--device N] (layers on the GPU, KV in cuda pools)  --k-center PATH (K minus\n"
		   "         calibrate's means)\n");
}

uint32_t num(const char *s, const char *opt)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || v > (1ul << 30))
		die("%s: bad number '%s'", opt, s);
	return (uint32_t)v;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "model", 1, NULL, 'm' }, { "socket", 1, NULL, 's' },
		{ "prompt", 1, NULL, 'p' }, { "kv", 1, NULL, 'k' }, { "window", 1, NULL, 'w' },
		{ "batch", 1, NULL, 'b' }, { "ctx", 1, NULL, 'c' }, { "max-tokens", 1, NULL, 'n' },
		{ "threads", 1, NULL, 't' }, { "limit", 1, NULL, 'l' }, { "gen", 1, NULL, 'g' },
		{ "json", 0, NULL, 'j' }, { "raw", 0, NULL, 'r' }, { "special", 0, NULL, 'S' },
		{ "decode", 0, NULL, 'D' }, { "system", 1, NULL, 'y' }, { "system-file", 1, NULL, 'Y' },
		{ "no-prefix-cache", 0, NULL, 'N' }, { "stats", 0, NULL, 'T' }, { "dump", 1, NULL, 'd' },
		{ "gen-prompts", 1, NULL, 'G' }, { "block", 1, NULL, 'B' }, { "rotate", 0, NULL, 'R' },
		{ "gpu", 0, NULL, 'U' }, { "device", 1, NULL, 'V' }, { "out", 1, NULL, 'o' },
		{ "k-center", 1, NULL, 'K' }, { "help", 0, NULL, 'h' }, { NULL, 0, NULL, 0 } };
	const char *cmd;
	int ch;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	cmd = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'm': o.model = optarg; break;
		case 's': o.socket = optarg; break;
		case 'p': o.prompt = optarg; break;
		case 'k':
			if (o.n_kv == RUN_MAX_KV)
				die("at most %d policies", RUN_MAX_KV);
			o.kv[o.n_kv++] = optarg;
			break;
		case 'w': o.window = num(optarg, "--window"); break;
		case 'b': o.batch = num(optarg, "--batch"); break;
		case 'c': o.ctx = num(optarg, "--ctx"); break;
		case 'n': o.max_tokens = num(optarg, "--max-tokens"); break;
		case 't': o.threads = num(optarg, "--threads"); break;
		case 'l': o.limit = num(optarg, "--limit"); break;
		case 'g': o.gen = num(optarg, "--gen"); break;
		case 'd': o.dump = optarg; break;
		case 'D': o.decode = true; break;
		case 'y': o.system = optarg; break;
		case 'Y': o.system_file = optarg; break;
		case 'N': o.no_cache = true; break;
		case 'T': o.stats = true; break;
		case 'B': o.block = num(optarg, "--block"); break;
		case 'G': o.gen_prompts = num(optarg, "--gen-prompts"); break;
		case 'R': o.rotate = true; break;
		case 'o': o.out = optarg; break;
		case 'K': o.k_center = optarg; break;
		case 'U': o.gpu = true; break;
		case 'V': o.device = (int)num(optarg, "--device"); break;
		case 'j': o.json = true; break;
		case 'r': o.raw = true; break;
		case 'S': o.special = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.batch < 1 || o.batch > 4096)
		die("--batch between 1 and 4096");
	if (optind < argc) {
		if (!strcmp(cmd, "tokenize"))
			o.prompt = argv[optind];
		else
			o.file = argv[optind];
	}
	if (!strcmp(cmd, "generate"))
		return cmd_generate();
	if (!strcmp(cmd, "tokenize"))
		return cmd_tokenize();
	if (!o.file)
		die("%s needs FILE", cmd);
	if (!strcmp(cmd, "perplexity"))
		return cmd_perplexity();
	if (!strcmp(cmd, "ab"))
		return cmd_ab();
	if (!strcmp(cmd, "calibrate"))
		return cmd_calibrate();
	usage(stderr);
	return 2;
}
