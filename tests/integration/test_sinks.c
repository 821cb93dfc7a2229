/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sink blocks through the real kvqd (host backend) and libkvq: a pool with
 * sink_blocks = 1 keeps every sequence's first block exact in a sink slot.
 *
 *  - a sequence written in chunks (block 0 enters the window, fills, leaves
 *    it in the middle of a chunk): its table names block 0 as a sink
 *    (KVQ_SINK_ID) in the open list and then the sealed one, the sink slice
 *    holds the input rows bit for bit, and attention after every commit
 *    matches float64 attention over the values as stored (sink exact,
 *    sealed blocks decoded by the test's own code, the window exact);
 *  - the prefix cache: a second sequence finds the chain from its sink on,
 *    shares the sink and the sealed blocks, and computes the same outputs;
 *    kvqctl and kvq_client_sink_stats count the live sequences (one of them
 *    still in its first block, which holds no open slot), and kvqctl
 *    leaves the sinks out of the sealed tokens;
 *  - fork while block 0 is in the window copies the sink (a new slot, the
 *    same bytes), and the copies then diverge without touching each other;
 *  - a pool with 2 sink slots: a third sequence's sink evicts the least
 *    recently used chain (whose lookup then misses, the other's hits), and
 *    with every sink referenced an allocation is refused (-ENOSPC);
 *  - refusals: attaching a sink pool without sinks (KVQ_ELAYOUT), sink slots
 *    of a pool without (-EINVAL), a chain that does not start with its sink
 *    (-EINVAL), a sink past a chain's start (-EINVAL, libkvq's check).
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"
#include "../daemon.h"
#include "../metrics.h"
#include "../ref.h"
#include "../synth.h"
#include "kvq.h"
#include "layout.h"

#define L_ 2
#define H_ 2
#define QH_ 4
#define D_ 32
#define B_ 16
#define NTOK 83                /* S(83) = 80 with R = B: block 0 sink, 4 sealed, 3 open tokens */
#define NQ 2
#define MODEL "test/sinks@1"

static char sock_path[108], ctl_out[16384];

/* Synthetic K/V (synth.h), the first tokens large, as attention sinks are. */
static uint16_t kv_val(uint32_t tok, uint32_t pos, uint32_t layer, uint32_t h, uint32_t d, int is_v)
{
	double y = synth_kv(tok, pos, layer, h, d, is_v);

	return kvq_f16_from_f32((float)(pos < 3 ? 20.0 * y : y));
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
	for (uint32_t i = 0; i < NQ * QH_ * D_; i++)
		q[i] = kvq_f16_to_f32(kv_val(7, i, layer, 0, 0, 0));
}

static kvq_client *open_pool(const char *pool, uint32_t sinks, uint32_t n_sealed, uint32_t n_open,
			     uint32_t n_sink, int *ret)
{
	struct kvq_attach_params p = { .pool = pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int4g32", .act = KVQ_ACT_F16, .create = 1,
		.n_sealed = n_sealed, .n_open = n_open, .device = -1 };
	kvq_client *c = NULL;

	*ret = kvq_client_connect(sock_path, "sinks", &c);
	if (*ret < 0)
		return NULL;
	if ((*ret = kvq_client_set_sinks(c, sinks, n_sink)) < 0 || (*ret = kvq_client_attach(c, &p)) < 0) {
		diag("attach %s: %s", pool, kvq_client_error(c));
		kvq_client_free(c);
		return NULL;
	}
	return c;
}

/* Appends tok[from..to) in one write of every layer and commits. */
static int append(kvq_seq *s, const uint32_t *tok, uint32_t from, uint32_t to)
{
	static uint16_t k[NTOK * H_ * D_], v[NTOK * H_ * D_];
	int r = kvq_seq_begin(s, tok + from, to - from);

	for (uint32_t l = 0; r == 0 && l < L_; l++) {
		make_kv(tok + from, from, to - from, l, k, v);
		r = kvq_seq_write(s, l, k, v);
	}
	return r < 0 ? r : kvq_seq_commit(s);
}

/* Attention of the last NQ tokens, every layer. */
static int attend(kvq_seq *s, float (*out)[NQ * QH_ * D_])
{
	float q[NQ * QH_ * D_];

	for (uint32_t l = 0; l < L_; l++) {
		make_q(l, q);
		if (kvq_seq_attention(s, l, QH_, NQ, 0.0f, q, out[l]) < 0)
			return -1;
	}
	return 0;
}

/* Block 0's id in s's table (its sink, KVQ_SINK_ID) or -1. */
static int32_t block0(const kvq_seq *s)
{
	const int32_t *sl, *op;
	uint32_t ns, no;

	kvq_seq_blocks(s, &sl, &ns, &op, &no);
	return ns ? sl[0] : no ? op[0] : -1;
}

/*
 * Checks s (n tokens of tok, committed) against its inputs and float64
 * attention over its values as stored; counts problems into *bad_sink
 * (block 0 not stored exactly or not a sink) and returns the worst
 * |out - ref| / max|ref| of attention.
 */
static double check_seq(kvq_client *c, kvq_seq *s, const uint32_t *tok, uint32_t n, int *bad_sink)
{
	const struct kvq_layout *L = kvq_client_layout(c);
	const uint8_t *base = kvq_client_base(c);
	const int32_t *sl, *op;
	uint32_t ns, no, S = kvq_layout_split(L, n);
	static double K[H_][NTOK][D_], V[H_][NTOK][D_];
	static uint16_t kin[NTOK * H_ * D_], vin[NTOK * H_ * D_];
	float out[L_][NQ * QH_ * D_], q[NQ * QH_ * D_];
	double worst = 0.0;

	kvq_seq_blocks(s, &sl, &ns, &op, &no);
	if (block0(s) < 0 || !((uint32_t)block0(s) & KVQ_SINK_FLAG) || ns * B_ != S) {
		(*bad_sink)++;
		return INFINITY;
	}
	if (attend(s, out) < 0)
		return INFINITY;
	for (uint32_t l = 0; l < L_; l++) {
		make_kv(tok, 0, n, l, kin, vin);
		for (uint32_t h = 0; h < H_; h++)
			for (uint32_t p = 0; p < n; p++) {
				uint32_t b = p / B_, t = p % B_;
				const uint8_t *x;

				for (uint32_t d = 0; d < D_; d++) {
					size_t i = ((size_t)p * H_ + h) * D_ + d;

					if (b == 0) {
						uint32_t id = (uint32_t)block0(s) & ~KVQ_SINK_FLAG;
						const uint8_t *kp = base + kvq_layout_off(L, KVQ_SINK, id, l, h, KVQ_K_CODES);
						const uint8_t *vp = base + kvq_layout_off(L, KVQ_SINK, id, l, h, KVQ_V_CODES);
						uint16_t kk, vv;

						memcpy(&kk, kp + 2 * (t * D_ + d), 2);
						memcpy(&vv, vp + 2 * (t * D_ + d), 2);
						*bad_sink += kk != kin[i] || vv != vin[i];
						K[h][p][d] = ref_f16(kk);
						V[h][p][d] = ref_f16(vv);
					} else if (p < S) {
						x = base + kvq_layout_off(L, KVQ_SEALED, (uint32_t)sl[b], l, h, KVQ_K_CODES) -
						    L->layer[l].off[KVQ_K_CODES];
						K[h][p][d] = ref_sealed_value(L, l, x, 0, t, d);
						V[h][p][d] = ref_sealed_value(L, l, x, 1, t, d);
					} else {
						K[h][p][d] = ref_f16(kin[i]);
						V[h][p][d] = ref_f16(vin[i]);
					}
				}
			}
		make_q(l, q);
		/* causal GQA attention of the last NQ positions, float64 */
		for (uint32_t i = 0; i < NQ; i++)
			for (uint32_t hq = 0; hq < QH_; hq++) {
				uint32_t h = hq / (QH_ / H_), pos = n - NQ + i;
				double w[NTOK], mx = -INFINITY, sum = 0.0, o[D_] = { 0 }, M = 0.0;

				for (uint32_t p = 0; p <= pos; p++) {
					double dot = 0.0;
					for (uint32_t d = 0; d < D_; d++)
						dot += (double)q[(i * QH_ + hq) * D_ + d] * K[h][p][d];
					w[p] = dot / sqrt((double)D_);
					mx = w[p] > mx ? w[p] : mx;
				}
				for (uint32_t p = 0; p <= pos; p++) {
					w[p] = exp(w[p] - mx);
					sum += w[p];
				}
				for (uint32_t p = 0; p <= pos; p++)
					for (uint32_t d = 0; d < D_; d++)
						o[d] += w[p] / sum * V[h][p][d];
				for (uint32_t d = 0; d < D_; d++)
					M = fabs(o[d]) > M ? fabs(o[d]) : M;
				for (uint32_t d = 0; d < D_; d++) {
					double e = fabs(out[l][(i * QH_ + hq) * D_ + d] - o[d]) / (M > 0 ? M : 1.0);
					worst = e > worst ? e : worst;
				}
			}
	}
	return worst;
}

static void test_write_and_attend(kvq_client *c, const uint32_t *tok, float (*final)[NQ * QH_ * D_])
{
	const uint32_t cuts[] = { 0, 1, 9, 15, 21, 50, 66, NTOK };
	kvq_seq *s = NULL;
	int bad = 0, in_open = 0, in_sealed = 0, fails = 0;
	double worst = 0.0;

	if (kvq_seq_new(c, NULL, 0, &s) < 0) {
		ok(0, "a sequence");
		return;
	}
	for (size_t i = 1; i < sizeof cuts / sizeof cuts[0]; i++) {
		const int32_t *sl, *op;
		uint32_t ns, no;
		double e;

		if (append(s, tok, cuts[i - 1], cuts[i]) < 0) {
			diag("append %u..%u: %s", cuts[i - 1], cuts[i], kvq_client_error(c));
			fails++;
			continue;
		}
		kvq_seq_blocks(s, &sl, &ns, &op, &no);
		in_open += !ns && no && ((uint32_t)op[0] & KVQ_SINK_FLAG);
		in_sealed += ns && ((uint32_t)sl[0] & KVQ_SINK_FLAG);
		if (cuts[i] < NQ)
			continue;
		e = check_seq(c, s, tok, cuts[i], &bad);
		worst = e > worst ? e : worst;
	}
	ok(fails == 0, "a sequence of %u tokens written in 7 chunks (%d failed)", NTOK, fails);
	ok(in_open == 3 && in_sealed == 4,
	   "block 0 is a sink: in the open list while in the window (%d of 3 commits), then the sealed one (%d of 4)",
	   in_open, in_sealed);
	ok(bad == 0, "the sink slice holds block 0's input rows bit for bit (%d values differ)", bad);
	ok(worst < 1e-5, "attention after each commit matches float64 over the values as stored (worst %.2e)", worst);
	attend(s, final);
	kvq_seq_free(s);
}

/* kvqctl --json stats of pool into ctl_out; its exit status. */
static int ctl_stats(const char *pool)
{
	const char *top = getenv("top_builddir"), *env = getenv("KVQ_TEST_KVQCTL");
	char ctl[512];

	if (env)
		snprintf(ctl, sizeof(ctl), "%s", env);
	else
		snprintf(ctl, sizeof(ctl), "%s/kvqctl/kvqctl", top ? top : ".");
	return ctl_stats_json(ctl, sock_path, pool, ctl_out, sizeof(ctl_out));
}

static void test_prefix(kvq_client *c, const uint32_t *tok, float (*want)[NQ * QH_ * D_])
{
	kvq_seq *a = NULL, *b = NULL, *s3 = NULL;
	float out[L_][NQ * QH_ * D_];
	uint32_t hit = 0;
	int32_t s0;
	int r;

	/* a holds the chain (its blocks referenced) while b looks it up */
	r = kvq_seq_new(c, NULL, 0, &a);
	r = r < 0 ? r : append(a, tok, 0, NTOK);
	s0 = r < 0 ? -1 : block0(a);
	r = r < 0 ? r : kvq_seq_new(c, NULL, 0, &b);
	r = r < 0 ? r : kvq_seq_from_prompt(b, tok, NTOK, &hit);
	ok(r == 0 && hit == 80 && block0(b) == s0 && s0 >= 0 && ((uint32_t)s0 & KVQ_SINK_FLAG),
	   "a lookup finds 80 tokens and shares the chain from its sink on (hit %u)", hit);
	r = r < 0 ? r : append(b, tok, hit, NTOK);
	r = r < 0 ? r : attend(b, out);
	ok(r == 0 && memcmp(out, want, sizeof out) == 0,
	   "attention over the shared chain equals the cold sequence's, bit for bit");
	/* a third sequence in its first block: a sink slot, no open slot */
	r = r < 0 ? r : kvq_seq_new(c, NULL, 0, &s3);
	r = r < 0 ? r : append(s3, tok, 0, B_ / 2);
	r = r < 0 ? r : ctl_stats("sinks");
	ok(r == 0 && jnum(ctl_out, "\"resident\"", "sequences") == 3 &&
	   jnum(ctl_out, "\"resident\"", "sequences_max") == 3 &&
	   jnum(ctl_out, "\"resident\"", "sealed_tokens") == 2 * (NTOK / B_ - 1) * B_ &&
	   jnum(ctl_out, "\"resident\"", "sealed_distinct_tokens") == (NTOK / B_ - 1) * B_,
	   "kvqctl: 3 live sequences (the sink references), sealed tokens %d as seen, %d stored, sinks "
	   "apart (%g, %g, %g, %g)", 2 * (NTOK / B_ - 1) * B_, (NTOK / B_ - 1) * B_,
	   jnum(ctl_out, "\"resident\"", "sequences"), jnum(ctl_out, "\"resident\"", "sequences_max"),
	   jnum(ctl_out, "\"resident\"", "sealed_tokens"), jnum(ctl_out, "\"resident\"", "sealed_distinct_tokens"));
	{
		struct kvq_sink_stats ks = { 0 };

		r = r < 0 ? r : kvq_client_sink_stats(c, NULL, &ks);
		ok(r == 0 && ks.sink_blocks == 1 && ks.n_sink == 8 &&
		   ks.sequences == 3 && ks.sink_referenced == 1 && ks.sink_held == 1 &&
		   ks.sink_free + ks.sink_held + ks.sink_cached == ks.n_sink &&
		   ks.sink_tokens == (uint64_t)2 * B_ && jnum(ctl_out, "\"resident\"", "sink_tokens_max") == 2 * B_,
		   "kvq_client_sink_stats: 3 sequences, 1 cached sink shared, 1 held, %d sink tokens at most, "
		   "as kvqctl says (%u %u %u %u %llu)", 2 * B_, ks.sequences, ks.sink_referenced, ks.sink_held,
		   ks.n_sink, (unsigned long long)ks.sink_tokens);
	}
	kvq_seq_free(s3);
	kvq_seq_free(b);
	kvq_seq_free(a);
}

static void test_fork(kvq_client *c, const uint32_t *tok)
{
	const struct kvq_layout *L = kvq_client_layout(c);
	const uint8_t *base = kvq_client_base(c);
	uint32_t other[NTOK];
	kvq_seq *s = NULL, *f = NULL;
	float before[L_][NQ * QH_ * D_], after[L_][NQ * QH_ * D_];
	int32_t s0 = -1, f0 = -1;
	int r, same = 0;

	for (uint32_t i = 0; i < NTOK; i++)
		other[i] = tok[i] + 77;
	r = kvq_seq_new(c, NULL, 0, &s);
	r = r < 0 ? r : append(s, tok, 0, 10);
	r = r < 0 ? r : attend(s, before);
	r = r < 0 ? r : kvq_seq_fork(s, &f);
	if (r == 0) {
		s0 = block0(s);
		f0 = block0(f);
		same = 1;
		for (uint32_t l = 0; l < L_; l++)
			same &= memcmp(base + kvq_layout_off(L, KVQ_SINK, (uint32_t)s0 & ~KVQ_SINK_FLAG, l, 0, KVQ_K_CODES),
				       base + kvq_layout_off(L, KVQ_SINK, (uint32_t)f0 & ~KVQ_SINK_FLAG, l, 0, KVQ_K_CODES),
				       L->layer[l].open_slice) == 0;
	}
	ok(r == 0 && s0 != f0 && ((uint32_t)f0 & KVQ_SINK_FLAG) && same,
	   "a fork while block 0 is in the window copies its sink: another slot, the same bytes");
	/* the fork goes on with other tokens: through block 0's end and past it */
	{
		uint32_t mix[NTOK];

		memcpy(mix, tok, 10 * sizeof(*mix));
		memcpy(mix + 10, other + 10, (NTOK - 10) * sizeof(*mix));
		r = r < 0 ? r : append(f, mix, 10, 40);
	}
	r = r < 0 ? r : attend(s, after);
	ok(r == 0 && memcmp(before, after, sizeof before) == 0,
	   "the original's attention is unchanged after its fork wrote on (and sealed its own block 0)");
	kvq_seq_free(f);
	kvq_seq_free(s);
}

static void test_eviction(void)
{
	uint32_t t[3][40], ids[3], n = 0, hx = 99, hy = 99;
	kvq_client *c;
	kvq_seq *x = NULL, *y = NULL, *z = NULL, *w = NULL;
	int r;

	c = open_pool("sinks2", 1, 32, 4, 2, &r);
	if (!c) {
		ok(0, "a pool with 2 sink slots (%d)", r);
		return;
	}
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 40; j++)
			t[i][j] = (uint32_t)(100 * (i + 1) + j);
	/* x and y: cached chains, x released first */
	r = kvq_seq_new(c, NULL, 0, &x);
	r = r < 0 ? r : append(x, t[0], 0, 40);
	r = r < 0 ? r : kvq_seq_new(c, NULL, 0, &y);
	r = r < 0 ? r : append(y, t[1], 0, 40);
	kvq_seq_free(x);
	kvq_seq_free(y);
	/* z needs a sink: both are cached, x's chain is the older */
	r = r < 0 ? r : kvq_seq_new(c, NULL, 0, &z);
	r = r < 0 ? r : append(z, t[2], 0, 20);
	ok(r == 0, "a third sequence gets a sink in a pool of 2, both cached");
	if (kvq_client_lookup(c, t[0], 40, 32, NULL, 0, ids, &n) == 0) {
		hx = n;
		kvq_client_release(c, n, ids, 0, NULL);
	}
	if (kvq_client_lookup(c, t[1], 40, 32, NULL, 0, ids, &n) == 0) {
		hy = n;
		if (n)
			r = kvq_seq_new(c, NULL, 0, &w) == 0 && kvq_seq_from_prompt(w, t[1], 40, &n) == 0 ? r : -1;
		kvq_client_release(c, hy, ids, 0, NULL);
	}
	ok(hx == 0 && hy == 2, "the least recently used chain went whole (lookup: %u blocks), the other stays (%u)",
	   hx, hy);
	ok(r == 0 && kvq_client_alloc_sinks(c, 1, ids) == -ENOSPC,
	   "with both sinks referenced a third is refused: -ENOSPC (%s)", kvq_client_error(c));
	kvq_seq_free(w);
	kvq_seq_free(z);
	kvq_client_free(c);
}

static void test_refusals(void)
{
	uint32_t tok[B_], sealed, sink, got[2], ids[2];
	kvq_client *c;
	int r;

	for (int i = 0; i < B_; i++)
		tok[i] = (uint32_t)(7 * i + 1);
	c = open_pool("sinks", 0, 0, 0, 0, &r);
	ok(!c && r == KVQ_ELAYOUT, "attaching a sink pool without sink blocks: KVQ_ELAYOUT (%d)", r);
	kvq_client_free(c);
	c = open_pool("plain", 0, 16, 4, 0, &r);
	ok(c && kvq_client_alloc_sinks(c, 1, &sink) == -EINVAL, "sink slots of a pool without: -EINVAL");
	kvq_client_free(c);
	c = open_pool("sinks", 1, 0, 0, 0, &r);
	if (!c) {
		ok(0, "attach the sink pool again (%d)", r);
		return;
	}
	r = kvq_client_alloc(c, 0, 1, NULL, NULL, &sealed);
	ok(r == 0 && kvq_client_publish(c, 1, &sealed, -1, tok, NULL, 0, got) == -EINVAL,
	   "a chain that starts with a sealed block: -EINVAL (%s)", kvq_client_error(c));
	r = kvq_client_alloc_sinks(c, 1, &sink);
	ids[0] = sealed;
	ids[1] = sink;
	ok(r == 0 && kvq_client_publish(c, 2, ids, -1, tok, NULL, 0, got) == -EINVAL,
	   "a sink past a chain's start: -EINVAL");
	kvq_client_free(c);
}

int main(void)
{
	char dir[64], bin[512];
	uint32_t tok[NTOK];
	float final[L_][NQ * QH_ * D_];
	kvq_client *c;
	pid_t pid;
	int r;

	pid = test_daemon_start("host", "sinks", dir, sizeof dir, sock_path, sizeof sock_path, bin, sizeof bin);
	if (pid < 0) {
		ok(0, "kvqd starts (%s)", bin);
		return done_testing();
	}
	for (uint32_t i = 0; i < NTOK; i++)
		tok[i] = 3000 + 11 * i;
	c = open_pool("sinks", 1, 64, 8, 0, &r);
	ok(c != NULL, "attach creates a pool with sink blocks (%d)", r);
	if (c) {
		test_write_and_attend(c, tok, final);
		test_prefix(c, tok, final);
		test_fork(c, tok);
		kvq_client_free(c);
	}
	test_eviction();
	test_refusals();
	test_daemon_stop(pid, dir);
	return done_testing();
}
