/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run generate: a chat prompt (its sealed prefix from kvqd's prefix
 * cache unless --no-prefix-cache), greedy continuation printed as it comes,
 * the run's figures and the pool's statistics; the greedy continuation is
 * ab's too.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "mm.h"
#include "run.h"

static void print_token(uint32_t id)
{
	char buf[256];

	tok_decode(tk, id, buf, sizeof(buf));
	fputs(buf, stdout);
	fflush(stdout);
}

/* Greedy continuation of g tokens after the logits in last; stops early at
 * stop (>= 0) or the end-of-sequence token.  trace (if not NULL) gets the
 * logits of every choice made, the one of a stop included.  Returns the
 * count written to out. */
uint32_t greedy(struct kv *k, float *last, uint32_t g, int stop, uint32_t *out, bool print, float *trace)
{
	uint32_t n = 0, V = model_cfg(md)->vocab;

	while (n < g) {
		uint32_t t = argmax(last, V);

		if (trace)
			memcpy(trace + (size_t)n * V, last, sizeof(float) * V);

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

/* The prompt's cached prefix, as kvq_seq_from_prompt finds it, but no
 * longer than feed()'s first chunk can keep sealed: kvq_seq_begin keeps a
 * found prefix only if that chunk's end splits at or past it, and feed()
 * ends chunks at multiples of --batch.  A window wider than the way to the
 * next multiple (KIVI's 4 blocks) would not: then the lookup asks again
 * below that hit.  Returns the tokens found. */
static uint32_t lookup(struct kv *k, const uint32_t *ids, uint32_t n)
{
	const struct kvq_layout *L = kvq_client_layout(k->c);
	uint32_t look = n, hit;

	for (;;) {
		int r = kvq_seq_from_prompt(k->s, ids, look, &hit);
		if (r < 0)
			die("prefix lookup: %s (%s)", kvq_strerror(r), kvq_client_error(k->c));
		uint32_t end = hit - hit % o.batch + o.batch;
		if (!hit || kvq_layout_split(L, end < n ? end : n) >= hit)
			return hit;
		kv_reset(k);
		while (kvq_layout_split(L, look) >= hit)
			look--;
	}
}

int cmd_generate(void)
{
	const struct model_cfg *c;
	struct kv k = { 0 };
	char *sys = NULL, nocache[64];
	size_t n, sys_len = 0;
	uint32_t *ids, *out, g, hit = 0;
	float *last;
	int end;
	double t0, t1, t2;

	if (!o.prompt)
		die("generate needs --prompt TEXT");
	load();
	c = model_cfg(md);
	if (o.system_file)
		sys = read_file(o.system_file, &sys_len);
	ids = chat_tokens(o.prompt, sys ? sys : o.system, &n);
	free(sys);
	if (n == 0 || n + o.max_tokens > c->ctx)
		die("prompt empty or beyond the context");
	end = chat_stop();
	/* pools sized by class, so workers with different prompts share one */
	kv_open(&k, o.kv[0] ? o.kv[0] : "f16", n + o.max_tokens <= 2048 ? 2048 : c->ctx, 1);
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
	if (!o.no_cache)
		hit = lookup(&k, ids, (uint32_t)n);
	feed(&k, ids + hit, (uint32_t)n - hit, NULL, last);
	t1 = now_s();
	g = greedy(&k, last, o.max_tokens, end, out, true, NULL);
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
