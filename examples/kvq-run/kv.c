/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: one KV policy's pool and sequence in kvqd, the model run over
 * tokens in it (feed), and the two readings of the logits it gives.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "codebook.h"
#include "layout.h"
#include "run.h"

/* Whether codebook file f holds the codebooks policy pol needs (maybe more:
 * K's where pol keeps V's only, or the reverse). */
static bool codebooks_cover(const struct kvq_cb_file *f, const struct kvq_policy *pol)
{
	for (uint32_t l = 0; l < pol->n_layers; l++)
		for (int is_v = 0; is_v < 2; is_v++) {
			unsigned want = kvq_policy_subdim(pol, l, is_v);
			if (want && want != (is_v ? f->v_subdim[l] : f->k_subdim[l]))
				return false;
		}
	return true;
}

/* The codebooks of pol taken from f (which covers it) as a file of their
 * own, in a memfd: its path (/proc/self/fd/N, kept open for the run). */
static const char *codebooks_subset(const struct kvq_cb_file *f, const struct kvq_policy *pol, uint32_t H,
				    uint32_t D, const char *from)
{
	static char path[64];
	uint64_t part = kvq_codebook_part(H, D), bytes = kvq_codebook_bytes(pol, H, D), in = 0, out = 0;
	uint8_t *data = malloc(bytes);
	int fd = memfd_create("kvq-run-codebooks", 0), r;

	if (!data || fd < 0)
		die("codebooks from %s: %s", from, strerror(data ? errno : ENOMEM));
	for (uint32_t l = 0; l < pol->n_layers; l++)
		for (int is_v = 0; is_v < 2; is_v++) {
			if (kvq_policy_subdim(pol, l, is_v)) {
				memcpy(data + out, f->data + in, part);
				out += part;
			}
			in += (is_v ? f->v_subdim[l] : f->k_subdim[l]) ? part : 0;
		}
	r = kvq_codebook_write(fd, pol, H, D, f->transforms, (const uint16_t *)data, bytes);
	if (r < 0)
		die("codebooks from %s: %s", from, strerror(-r));
	free(data);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return path;
}

/* Parses --kv's policy s for this model into *pol; with --rotate, every
 * quantized part (not F16/BF16) of every layer gets "+rot" (libkvq then
 * rotates K, V and q and undoes it in attention's output, policy.h). */
void kv_policy(const char *s, struct kvq_policy *pol)
{
	char err[256];

	if (kvq_policy_parse(s, model_cfg(md)->layers, pol, err, sizeof(err)) < 0)
		die("--kv %s: %s", s, err);
	for (uint32_t l = 0; o.rotate && l < pol->n_layers; l++) {
		if (pol->k[l] != KVQ_FMT_F16 && pol->k[l] != KVQ_FMT_BF16)
			pol->rot[l] |= KVQ_ROT_K;
		if (pol->v[l] != KVQ_FMT_F16 && pol->v[l] != KVQ_FMT_BF16)
			pol->rot[l] |= KVQ_ROT_V;
	}
}

/* The codebooks for policy pol from the first --codebooks file that covers
 * it in the same basis (kvq-codebook(5), kvq_codebook_basis): its path (or, when the file holds more, a file of
 * just pol's), and their data's hash into *hash; NULL when pol has no
 * codebook format.  A file calibrated with other transforms than this
 * run's is refused. */
static const char *codebooks_for(const struct kvq_policy *pol, const char *policy, uint64_t *hash)
{
	const struct model_cfg *c = model_cfg(md);
	uint32_t transforms = k_center ? KVQ_CB_K_CENTER : 0u;
	struct kvq_cb_file *f = malloc(sizeof(*f));
	char err[256] = "";

	if (!f)
		die("%s", strerror(ENOMEM));
	if (!kvq_codebook_bytes(pol, c->kv_heads, c->head_dim)) {
		free(f);
		return NULL;
	}
	for (unsigned i = 0; i < o.n_codebooks; i++) {
		const char *path = o.codebooks[i];
		size_t len;
		char *img = read_file(path, &len);

		if (kvq_codebook_parse(img, len, NULL, 0, 0, f, err, sizeof(err)) < 0)
			die("--codebooks %s: %s", path, err);
		if (f->layers != c->layers || f->kv_heads != c->kv_heads || f->head_dim != c->head_dim ||
		    !codebooks_cover(f, pol) || kvq_codebook_basis(f->policy, f->layers, pol, NULL, 0) < 0) {
			free(img);
			continue;
		}
		if (f->transforms & KVQ_CB_ROTATE)
			die("--codebooks %s: calibrated on K/V that an earlier kvq-run rotated itself; --rotate is "
			    "the policy's +rot now: calibrate again", path);
		if (f->transforms != transforms)
			die("--codebooks %s was calibrated %s--k-center; this run is %s", path,
			    f->transforms & KVQ_CB_K_CENTER ? "with " : "without ", k_center ? "with it" : "without");
		if (f->data_bytes != kvq_codebook_bytes(pol, c->kv_heads, c->head_dim))
			path = codebooks_subset(f, pol, c->kv_heads, c->head_dim, path);
		for (uint64_t j = 0; j < f->data_bytes; j++)
			*hash = (*hash ^ f->data[j]) * 0x100000001b3ull;
		free(img);
		free(f);
		return path;
	}
	die("--kv %s uses a codebook format: give --codebooks FILE with its codebooks (kvq-run calibrate --kv %s "
	    "--out FILE TEXT)", policy, policy);
}

/* Attaches k to the pool of spec: a policy, optionally followed by @W, its
 * pool's open window in tokens (else --window), sized for seqs sequences
 * of max_tokens at once (kvq-run ab --prompts forks one). */
void kv_open(struct kv *k, const char *spec, uint32_t max_tokens, uint32_t seqs)
{
	const struct model_cfg *c = model_cfg(md);
	struct kvq_policy pol;
	char pool[65], model_id[128], policy[512];
	const char *at = strchr(spec, '@');
	uint32_t window = at ? num(at + 1, "--kv POLICY@WINDOW") : o.window;
	uint64_t h = 0xcbf29ce484222325ull;
	uint32_t n_sealed, n_open, win;
	const struct kvq_layout *L;
	const char *cb;
	int r;

	snprintf(policy, sizeof(policy), "%.*s", at ? (int)(at - spec) : (int)strlen(spec), spec);
	k->policy = spec;
	kv_policy(policy, &pol);
	if (kvq_policy_format(&pol, k->canon, sizeof(k->canon)) < 0)
		die("--kv %s: too long", policy);
	/* a write of o.batch tokens holds the window's open slots and its own
	 * until commit, and every open slot reserves a sealed one */
	win = window ? window : kvq_layout_default_window(&pol, o.block);
	n_open = seqs * ((win + o.batch) / o.block + 2);
	n_sealed = seqs * ((max_tokens + o.block - 1) / o.block) + n_open + 2;
	/* one pool per (model, policy, window, capacity): pools compare the
	 * first three at attach, and a pool made for a short run cannot hold a
	 * long one */
	/* centered K is another model's: never shared with plain K (rotation
	 * is the policy's, compared at attach) */
	snprintf(model_id, sizeof(model_id), "%s@%016llx", model_name, (unsigned long long)model_fp);
	if (k_center)
		snprintf(model_id + strlen(model_id), sizeof(model_id) - strlen(model_id), "+kc%08x", k_center_hash);
	for (const char *p = model_id; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	for (const char *p = k->canon; *p; p++)
		h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
	h = (h ^ window) * 0x100000001b3ull;
	cb = codebooks_for(&pol, policy, &h);   /* other codebooks, another pool */
	if (o.block != 16)   /* (pool names of the default stay as they were) */
		h = (h ^ (o.block << 20)) * 0x100000001b3ull;
	h = (h ^ n_sealed) * 0x100000001b3ull;
	if (seqs != 1)
		h = (h ^ (seqs << 8)) * 0x100000001b3ull;
	if (o.gpu)   /* a cuda pool is another pool than the host one */
		h = (h ^ (0x100u + (unsigned)o.device)) * 0x100000001b3ull;
	if (o.sink)   /* sink_blocks is compared at attach */
		h = (h ^ 0x51c0000u) * 0x100000001b3ull;
	if (o.host_tier_mib)   /* a pool with a host tier is another pool */
		h = (h ^ ((uint64_t)o.host_tier_mib << 32)) * 0x100000001b3ull;
	snprintf(pool, sizeof(pool), "kvq-run-%016llx", (unsigned long long)h);
	struct kvq_attach_params p = { .pool = pool, .model_id = model_id, .layers = c->layers,
		.kv_heads = c->kv_heads, .head_dim = c->head_dim, .block_tokens = o.block, .policy = k->canon,
		.window = window, .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = n_sealed, .n_open = n_open,
		.backend = o.gpu ? "cuda" : "host", .device = o.gpu ? o.device : -1, .codebooks = cb,
		.host_capacity = (uint64_t)o.host_tier_mib << 20 };
	r = kvq_client_connect(o.socket, "kvq-run", &k->c);
	if (r < 0)
		die("connect to kvqd: %s (is kvqd running? --socket or KVQ_SOCKET)", kvq_strerror(r));
	r = kvq_client_set_sinks(k->c, o.sink ? 1 : 0, 0);
	if (r == 0)
		r = kvq_client_attach(k->c, &p);
	if (r < 0)
		die("attach: %s (%s)%s", kvq_strerror(r), kvq_client_error(k->c),
		    o.gpu && r == -ENODEV ? "; --gpu needs kvqd to offer cuda pools" : "");
	if (strcmp(kvq_client_backend(k->c), o.gpu ? "cuda" : "host"))
		die("attach: pool %s is a %s pool; %s needs a %s one", pool, kvq_client_backend(k->c),
		    o.gpu ? "--gpu" : "the CPU path", o.gpu ? "cuda" : "host");
	/* libkvq's kernels on the model's stream: no wait between streams */
	if (md && model_stream(md) && (r = kvq_client_set_stream(k->c, model_stream(md))) < 0)
		die("attach: %s (%s)", kvq_strerror(r), kvq_client_error(k->c));
	if ((r = kvq_batch_new(k->c, &k->b)) < 0)
		die("batch: %s", kvq_strerror(r));
	L = kvq_client_layout(k->c);
	k->window = L->window;
	k->bits = 8.0 * kvq_codebook_amortised(L->sealed_block_bytes, L->codebook_bytes, KVQ_CB_POOL_BYTES) /
		  ((double)L->block_tokens * L->layers * L->kv_heads * L->head_dim * 2);
	{
		/* 2048 tokens: S/B blocks (the first a sink with sink blocks), then the window */
		const uint32_t n = 2048, S = kvq_layout_split(L, n), B = L->block_tokens;
		const double per_block = (double)B * L->layers * L->kv_heads * L->head_dim * 2;
		const uint32_t sealed = S / B - (L->n_sink && S ? 1 : 0);
		const double sink = L->n_sink ? 8.0 * L->open_block_bytes : 0.0;
		const double open = 8.0 * (double)((n - S + B - 1) / B - (L->n_sink && !S ? 1 : 0)) * L->open_block_bytes;

		k->seq_bits = (k->bits * per_block * sealed + sink + open) / ((double)n * per_block / B);
	}
}

kvq_seq *kv_seq_new(struct kv *k)
{
	kvq_seq *s;
	int r = kvq_seq_new(k->c, o.salt, o.salt ? strlen(o.salt) : 0, &s);

	if (r < 0)
		die("sequence: %s", kvq_strerror(r));
	return s;
}

void kv_reset(struct kv *k)
{
	kvq_seq_free(k->s);
	k->s = kv_seq_new(k);
}

void kv_close(struct kv *k)
{
	kvq_batch_free(k->b);
	kvq_seq_free(k->s);
	kvq_client_free(k->c);
}

uint32_t chunk_len(uint32_t pos, uint32_t left)
{
	/* chunks end at multiples of o.batch in the sequence: the sealed/open
	 * split a query sees depends on its chunk's end, so a run that starts
	 * from a cached prefix, or runs in a batch, computes what a cold run
	 * alone computed */
	uint32_t m = o.batch - pos % o.batch;

	return m < left ? m : left;
}

/* Runs n tokens through k's sequence in chunks (chunk_len), each a step of
 * a batch of one; logits (if not NULL) gets every token's next-token
 * logits, else only the last one's go to last (if not NULL). */
void feed(struct kv *k, const uint32_t *ids, uint32_t n, float *logits, float *last)
{
	uint32_t V = model_cfg(md)->vocab, pos = kvq_seq_tokens(k->s);

	for (uint32_t a = 0, m; a < n; a += m) {
		int r;

		m = chunk_len(pos + a, n - a);
		struct model_seq q = { k->s, ids + a, m, logits ? m : (a + m == n && last ? 1 : 0) };

		r = model_step(md, k->b, &q, 1, logits ? logits + (size_t)a * V : last);
		if (r < 0)
			die("forward (kv %s): %s", k->policy, model_error(md) ? model_error(md) : kvq_client_error(k->c));
	}
}

uint32_t argmax(const float *x, uint32_t n)
{
	uint32_t b = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

bool stops(uint32_t t, int stop)
{
	return (int)t == stop || t == tok_eos(tk);
}

bool pick(const float *logits, int stop, uint32_t *ret)
{
	uint32_t t = argmax(logits, model_cfg(md)->vocab);

	if (stops(t, stop))
		return false;
	*ret = t;
	return true;
}

/* out = log softmax(x) (double sums). */
void log_softmax(const float *x, uint32_t n, double *out)
{
	double mx = x[argmax(x, n)], s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += exp((double)x[i] - mx);
	s = log(s) + mx;
	for (uint32_t i = 0; i < n; i++)
		out[i] = (double)x[i] - s;
}
