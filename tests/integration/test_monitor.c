/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration test of what kvqd shows about what quantized KV buys: a real
 * kvqd (metrics on, attention timing on), forked libkvq clients that hold
 * sequences with and without a shared prefix and run attention, and
 *   - the resident figures (kvqctl stats --json, the metrics) against what
 *     the clients hold by their own account (their block tables): live
 *     sequences, sealed tokens logical and distinct, open tokens, bytes,
 *     the f16 bytes from the geometry, batch gain, sharing factor; and in
 *     a pool whose window is 4 blocks, live sequences between kvqctl's
 *     bounds (exact only at a window of one block);
 *   - the attention histograms against the calls the clients made;
 *   - forged attention reports (a raw protocol client): out-of-range
 *     figures clamped, foreign pairs and bad bins dropped, never an error;
 *     a pool without timing told so at attach and its reports dropped;
 *   - request errors by request and status;
 *   - the Grafana dashboard (docs/kvqd-grafana.json): every kvq_* name in
 *     its queries is served by /metrics.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "../metrics.h"
#include "conn.h"
#include "kvq.h"
#include "layout.h"
#include "timing_buckets.h"

#define L_ 2
#define H_ 2
#define D_ 32
#define B_ 16
#define POOL "mon"
#define MODEL "test/mon@1"
#define MAX_SEQ 4
#define MAX_BLOCKS 16
#define BODY_MAX (1 << 20)
/* f16 K and V of one token over all layers: the baseline, from the geometry */
#define F16_TOKEN_BYTES ((uint64_t)L_ * H_ * D_ * 2 * 2)

static char sock_path[108], tmpdir[64], daemon_bin[512], ctl_bin[512];
static int port;
/* The pool the next forked worker attaches (created with this window, 0:
 * the policy's default). */
static const char *worker_pool = POOL;
static uint32_t worker_window;

/* ---------------------------------------------------------------- workers */

/* A sequence a worker makes: tokens base * 1000 + i, from position split on
 * 900000 + i (another question after a shared prefix); forked when fork. */
struct seqspec {
	uint32_t base, n, split;
	int fork;
};

/* What a worker holds and did, by its own account. */
struct report {
	int ok;
	uint32_t nseq;
	uint32_t n_sealed[MAX_SEQ], n_open[MAX_SEQ];
	int32_t ids[MAX_SEQ][MAX_BLOCKS];
	uint64_t decode, prefill, kv_bytes;
	uint64_t sealed_block_bytes, open_block_bytes;
	uint64_t region;     /* a layer's sealed and open slots: the most one call may read */
	char err[200];
};

struct worker {
	pid_t pid;
	int rd, go;          /* its report; closing go lets it finish */
};

static void tokens_of(const struct seqspec *sp, uint32_t *t)
{
	for (uint32_t i = 0; i < sp->n; i++)
		t[i] = i < sp->split ? sp->base * 1000 + i : 900000 + i;
}

static int fill_seq(kvq_seq *s, const struct seqspec *sp)
{
	static uint16_t k[256 * H_ * D_], v[256 * H_ * D_];
	uint32_t t[256], hit = 0, m;
	int r;

	tokens_of(sp, t);
	if ((r = kvq_seq_from_prompt(s, t, sp->n, &hit)) < 0)
		return r;
	m = sp->n - hit;
	for (size_t i = 0; i < (size_t)m * H_ * D_; i++) {
		k[i] = kvq_f16_from_f32((float)((i * 7 + sp->base) % 19) / 19.0f - 0.5f);
		v[i] = kvq_f16_from_f32((float)((i * 5 + sp->base) % 23) / 23.0f - 0.5f);
	}
	if ((r = kvq_seq_begin(s, t + hit, m)) < 0)
		return r;
	for (uint32_t l = 0; l < L_; l++)
		if ((r = kvq_seq_write(s, l, k, v)) < 0)
			return r;
	return kvq_seq_commit(s);
}

/* Attention of n_q rows on every layer of s, counted in rep. */
static int attend(kvq_client *c, kvq_seq *s, uint32_t n_q, struct report *rep)
{
	static float q[8 * H_ * D_], out[8 * H_ * D_];
	const struct kvq_layout *L = kvq_client_layout(c);
	uint32_t ns, no;
	int r;

	kvq_seq_blocks(s, NULL, &ns, NULL, &no);
	for (size_t i = 0; i < sizeof(q) / sizeof(q[0]); i++)
		q[i] = (float)(i % 11) / 11.0f;
	for (uint32_t l = 0; l < L_; l++) {
		if ((r = kvq_seq_attention(s, l, H_, n_q, 0.0f, q, out)) < 0)
			return r;
		*(n_q == 1 ? &rep->decode : &rep->prefill) += 1;
		rep->kv_bytes += (uint64_t)ns * L->layer[l].sealed_slice + (uint64_t)no * L->layer[l].open_slice;
	}
	return 0;
}

static int worker_run(const struct seqspec *spec, uint32_t n, int wr, int go)
{
	struct kvq_attach_params p = { .pool = worker_pool, .model_id = MODEL, .layers = L_, .kv_heads = H_,
		.head_dim = D_, .block_tokens = B_, .policy = "int8", .window = worker_window, .create = 1,
		.n_sealed = 64, .n_open = 16, .device = -1 };
	static struct report rep;
	kvq_seq *seqs[MAX_SEQ] = { 0 };
	kvq_client *c = NULL;
	char x;
	int r;

	r = kvq_client_connect(sock_path, "mon-worker", &c);
	if (r == 0)
		r = kvq_client_attach(c, &p);
	for (uint32_t i = 0; r == 0 && i < n; i++) {
		if ((r = kvq_seq_new(c, NULL, 0, &seqs[rep.nseq])) < 0 || (r = fill_seq(seqs[rep.nseq], &spec[i])) < 0)
			break;
		rep.nseq++;
		if (spec[i].fork && (r = kvq_seq_fork(seqs[rep.nseq - 1], &seqs[rep.nseq])) == 0)
			rep.nseq++;
	}
	for (uint32_t i = 0; r == 0 && i < rep.nseq; i++) {
		const int32_t *ids;

		kvq_seq_blocks(seqs[i], &ids, &rep.n_sealed[i], NULL, &rep.n_open[i]);
		memcpy(rep.ids[i], ids, rep.n_sealed[i] * sizeof(*ids));
		if ((r = attend(c, seqs[i], 1, &rep)) < 0)
			break;
	}
	/* one prefill-shaped call: four query rows */
	if (r == 0 && rep.nseq)
		r = attend(c, seqs[0], 4, &rep);
	if (r == 0) {
		rep.sealed_block_bytes = kvq_client_layout(c)->sealed_block_bytes;
		rep.open_block_bytes = kvq_client_layout(c)->open_block_bytes;
		rep.region = (uint64_t)p.n_sealed * kvq_client_layout(c)->layer[0].sealed_slice +
			     (uint64_t)p.n_open * kvq_client_layout(c)->layer[0].open_slice;
	}
	rep.ok = r == 0;
	if (r < 0)
		snprintf(rep.err, sizeof(rep.err), "%s (%s)", kvq_strerror(r), c ? kvq_client_error(c) : "");
	if (write(wr, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		return 1;
	/* attached until the parent has looked */
	while (read(go, &x, 1) > 0)
		;
	for (uint32_t i = 0; i < rep.nseq; i++)
		kvq_seq_free(seqs[i]);
	kvq_client_free(c);    /* reports what was timed */
	return rep.ok ? 0 : 2;
}

/* Forks a worker making spec[n]; its report in *rep.  0 or -1. */
static int worker_start(struct worker *w, const struct seqspec *spec, uint32_t n, struct report *rep)
{
	int a[2], b[2];
	size_t got = 0;

	if (pipe(a) < 0 || pipe(b) < 0)
		return -1;
	w->pid = fork();
	if (w->pid == 0) {
		close(a[0]);
		close(b[1]);
		_exit(worker_run(spec, n, a[1], b[0]));
	}
	close(a[1]);
	close(b[0]);
	w->rd = a[0];
	w->go = b[1];
	while (got < sizeof(*rep)) {
		ssize_t k = read(w->rd, (char *)rep + got, sizeof(*rep) - got);

		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return rep->ok ? 0 : -1;
}

/* Lets a worker free everything (and report its timings); its exit status. */
static int worker_finish(struct worker *w)
{
	int st = 0;

	close(w->go);
	close(w->rd);
	waitpid(w->pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---------------------------------------------------------------- expected figures */

struct expect {
	uint64_t seqs, open_blocks, logical_blocks, distinct_blocks;
	uint64_t bytes, f16_bytes;
};

/* From the workers' own block tables: every sequence holds its sealed ids
 * once each (logical), the pool stores each id once (distinct). */
static void expect_of(const struct report *reps, int n, struct expect *e)
{
	int32_t seen[64];
	uint32_t nseen = 0;

	memset(e, 0, sizeof(*e));
	for (int w = 0; w < n; w++)
		for (uint32_t i = 0; i < reps[w].nseq; i++) {
			e->seqs++;
			e->open_blocks += reps[w].n_open[i];
			e->logical_blocks += reps[w].n_sealed[i];
			for (uint32_t j = 0; j < reps[w].n_sealed[i]; j++) {
				bool dup = false;

				for (uint32_t k = 0; k < nseen; k++)
					dup |= seen[k] == reps[w].ids[i][j];
				if (!dup && nseen < 64)
					seen[nseen++] = reps[w].ids[i][j];
			}
		}
	e->distinct_blocks = nseen;
	e->bytes = nseen * reps[0].sealed_block_bytes +
		   e->open_blocks * (reps[0].open_block_bytes + reps[0].sealed_block_bytes);
	e->f16_bytes = (nseen + e->open_blocks) * B_ * F16_TOKEN_BYTES;
}

/* ---------------------------------------------------------------- kvqctl, metrics */

static char ctl_out[BODY_MAX], body[BODY_MAX];

/* kvqctl --json stats POOL into ctl_out; its exit status. */
static int ctl_stats(const char *pool)
{
	return ctl_stats_json(ctl_bin, sock_path, pool, ctl_out, sizeof(ctl_out));
}

/* The exposition's text (after the headers), or NULL. */
static const char *scrape(void)
{
	const char *t;

	if (http_get(port, "/metrics", body, sizeof(body)) <= 0 || !strstr(body, " 200 "))
		return NULL;
	t = strstr(body, "\r\n\r\n");
	return t ? t + 4 : NULL;
}

static double m_pool(const char *text, const char *name, const char *extra)
{
	char prefix[256];

	snprintf(prefix, sizeof(prefix), "%s{pool=\"%s\"%s%s} ", name, POOL, extra ? "," : "", extra ? extra : "");
	return metric(text, prefix);
}

/* The sum of every sample of name (any labels), and their count. */
static double m_sum(const char *text, const char *name, int *ret_n)
{
	size_t len = strlen(name);
	double sum = 0.0;

	*ret_n = 0;
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, name, len) && l[len] == '{') {
			const char *v = strchr(l, ' ');
			if (v) {
				sum += strtod(v + 1, NULL);
				(*ret_n)++;
			}
		}
	return sum;
}

/* The host's per-device totals (kvq_device_*) are the sums of its pools'. */
static void check_devices(const char *text)
{
	int pools = 0, n = 0;
	double cap = text ? m_sum(text, "kvq_pool_capacity_bytes", &pools) : 0.0;
	double used = text ? m_sum(text, "kvq_pool_bytes", &n) : 0.0;

#define HOST "{backend=\"host\",device=\"-1\"} "
	ok(text && pools > 0 && metric(text, "kvq_device_pools" HOST) == pools &&
	   metric(text, "kvq_device_capacity_bytes" HOST) == cap && metric(text, "kvq_device_used_bytes" HOST) == used &&
	   metric(text, "kvq_device_memory_bytes" HOST) == metric(text, "kvq_pool_device_memory_bytes{pool=\"" POOL "\"} "),
	   "per-device totals: the host's %d pools, their capacity (%.0f bytes) and bytes in use (%.0f) are the "
	   "pools' sums", pools, cap, used);
#undef HOST
}

static void check_resident(const char *what, const struct report *reps, int n)
{
	struct expect e;
	const char *text;

	expect_of(reps, n, &e);
	ok(ctl_stats(POOL) == 0, "%s: kvqctl --json stats runs", what);
	ok(jnum(ctl_out, "\"resident\"", "sequences") == e.seqs &&
	   jnum(ctl_out, "\"resident\"", "sequences_max") == e.open_blocks,
	   "%s: %llu live sequences (kvqctl: %g, at most %g)", what, (unsigned long long)e.seqs,
	   jnum(ctl_out, "\"resident\"", "sequences"), jnum(ctl_out, "\"resident\"", "sequences_max"));
	ok(jnum(ctl_out, "\"resident\"", "sealed_tokens") == e.logical_blocks * B_ &&
	   jnum(ctl_out, "\"resident\"", "sealed_distinct_tokens") == e.distinct_blocks * B_ &&
	   jnum(ctl_out, "\"resident\"", "open_tokens_max") == e.open_blocks * B_,
	   "%s: sealed tokens %llu logical, %llu distinct, open at most %llu (kvqctl %g, %g, %g)", what,
	   (unsigned long long)e.logical_blocks * B_, (unsigned long long)e.distinct_blocks * B_,
	   (unsigned long long)e.open_blocks * B_, jnum(ctl_out, "\"resident\"", "sealed_tokens"),
	   jnum(ctl_out, "\"resident\"", "sealed_distinct_tokens"), jnum(ctl_out, "\"resident\"", "open_tokens_max"));
	ok(jnum(ctl_out, "\"resident\"", "bytes") == e.bytes && jnum(ctl_out, "\"resident\"", "f16_bytes") == e.f16_bytes,
	   "%s: %llu bytes resident, %llu in f16 (kvqctl %g, %g)", what, (unsigned long long)e.bytes,
	   (unsigned long long)e.f16_bytes, jnum(ctl_out, "\"resident\"", "bytes"),
	   jnum(ctl_out, "\"resident\"", "f16_bytes"));
	ok(fabs(jnum(ctl_out, "\"resident\"", "effective_batch_gain") - (double)e.f16_bytes / e.bytes) < 1e-9 &&
	   fabs(jnum(ctl_out, "\"resident\"", "sharing_factor") - (double)e.logical_blocks / e.distinct_blocks) < 1e-9,
	   "%s: batch gain %.4f, sharing factor %.4f", what, (double)e.f16_bytes / e.bytes,
	   (double)e.logical_blocks / e.distinct_blocks);
	text = scrape();
	ok(text && m_pool(text, "kvq_resident_sequences", NULL) == e.seqs &&
	   m_pool(text, "kvq_resident_tokens", "kind=\"sealed\"") == e.logical_blocks * B_ &&
	   m_pool(text, "kvq_resident_tokens", "kind=\"sealed_distinct\"") == e.distinct_blocks * B_ &&
	   m_pool(text, "kvq_resident_tokens", "kind=\"open_max\"") == e.open_blocks * B_ &&
	   m_pool(text, "kvq_resident_bytes", NULL) == e.bytes && m_pool(text, "kvq_resident_f16_bytes", NULL) == e.f16_bytes,
	   "%s: the metrics' resident gauges say the same", what);
}

/* ---------------------------------------------------------------- forged reports */

/* A raw protocol client attached to pool (created as the workers create
 * theirs); *ret_ms the attach reply's attention_report_ms.  0 or -1. */
static int raw_attach(struct kvq_conn *c, const char *pool, uint32_t *ret_ms)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	int r;

	kvq_conn_init(c, 10000);
	if (kvq_conn_open(c, sock_path, "mon-raw") < 0)
		return -1;
	a.pool = (char *)pool;
	a.model_id = MODEL;
	a.layers = L_;
	a.kv_heads = H_;
	a.head_dim = D_;
	a.block_tokens = B_;
	a.policy = "int8";
	a.layout_version = KVQ_LAYOUT_VERSION;
	pc.n_sealed = 64;
	pc.n_open = 16;
	pc.backend = "";
	pc.device = -1;
	a.create = &pc;
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = kvq_conn_call(c, &e, KVQ__ENVELOPE__BODY_ATTACH_REPLY, &rep);
	if (r == 0)
		*ret_ms = rep->attach_reply->attention_report_ms;
	kvq_frame_envelope_free(rep);
	return r;
}

/* An empty Seal carrying bins[n]; the reply's status. */
static int raw_report(struct kvq_conn *c, Kvq__AttentionBin *bins, size_t n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Seal s = KVQ__SEAL__INIT;
	Kvq__AttentionReport rep = KVQ__ATTENTION_REPORT__INIT;
	Kvq__AttentionBin *ptrs[KVQ_PROTO_MAX_TIMING_BINS + 8];

	for (size_t i = 0; i < n; i++)
		ptrs[i] = &bins[i];
	rep.n_bins = n;
	rep.bins = ptrs;
	s.attention = &rep;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &s;
	return kvq_conn_call(c, &e, KVQ__ENVELOPE__BODY_SEAL_REPLY, NULL);
}

static uint64_t fb[KVQ_PROTO_MAX_TIMING_BINS + 8][KVQ_TIMING_BUCKETS + 1];

/* A well-formed decode bin of int8/int8 with count calls in bucket b. */
static void bin_init(Kvq__AttentionBin *x, size_t slot, unsigned b, uint64_t count, double seconds, uint64_t bytes)
{
	kvq__attention_bin__init(x);
	memset(fb[slot], 0, sizeof(fb[slot]));
	fb[slot][b] = count;
	x->phase = 0;
	x->k_format = "int8";
	x->v_format = "int8";
	x->n_buckets = KVQ_TIMING_BUCKETS + 1;
	x->buckets = fb[slot];
	x->seconds = seconds;
	x->kv_bytes = bytes;
}

#define DEC "phase=\"decode\",k=\"int8\",v=\"int8\""

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void test_forged(uint64_t region)
{
	Kvq__AttentionBin bins[KVQ_PROTO_MAX_TIMING_BINS + 1];
	struct kvq_conn c, q;
	double n0, s0, b0, cl0, dr0, tk0, n1, t0, t1;
	const char *text;
	uint32_t ms = 0, qms = 1;
	int st[6];

	st[0] = raw_attach(&c, POOL, &ms);
	ok(st[0] == 0 && ms == 100, "a raw client attaches; told to report every %u ms", ms);
	text = scrape();
	n0 = m_pool(text, "kvq_attention_seconds_count", DEC);
	s0 = m_pool(text, "kvq_attention_seconds_sum", DEC);
	b0 = m_pool(text, "kvq_attention_kv_bytes_total", DEC);
	tk0 = m_pool(text, "kvq_attention_bins_total", "result=\"taken\"");
	cl0 = m_pool(text, "kvq_attention_bins_total", "result=\"clamped\"");
	dr0 = m_pool(text, "kvq_attention_bins_total", "result=\"dropped\"");
	usleep(300 * 1000);   /* room for 300000 calls at KVQ_TIMING_MAX_CALLS_PER_S */
	/* 10 calls of at most 1 us claiming 1e9 s: the sum is cut to 10 us; bytes of a whole layer's
	 * region per call at most */
	bin_init(&bins[0], 0, 0, 10, 1e9, UINT64_MAX);
	st[0] = raw_report(&c, bins, 1);
	/* a pair the pool lacks, an unknown format, a bad phase, a short bucket list: dropped */
	bin_init(&bins[0], 0, 3, 5, 1e-5, 0);
	bins[0].k_format = "f16";
	bins[0].v_format = "f16";
	bin_init(&bins[1], 1, 3, 5, 1e-5, 0);
	bins[1].k_format = "nope";
	bin_init(&bins[2], 2, 3, 5, 1e-5, 0);
	bins[2].phase = 7;
	bin_init(&bins[3], 3, 3, 5, 1e-5, 0);
	bins[3].n_buckets = 3;
	st[1] = raw_report(&c, bins, 4);
	/* more bins than a report may hold: all dropped */
	for (size_t i = 0; i <= KVQ_PROTO_MAX_TIMING_BINS; i++)
		bin_init(&bins[i], i, 3, 1, 2.5e-6, 0);
	st[2] = raw_report(&c, bins, KVQ_PROTO_MAX_TIMING_BINS + 1);
	/* NaN seconds: the least the counts allow (5 calls in (2, 3] us: 10 us) */
	usleep(20 * 1000);
	bin_init(&bins[0], 0, 3, 5, NAN, 1000);
	t0 = now_ms();
	st[3] = raw_report(&c, bins, 1);
	ok(st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0, "every forged report is answered 0 (%d %d %d %d)",
	   st[0], st[1], st[2], st[3]);
	text = scrape();
	n1 = m_pool(text, "kvq_attention_seconds_count", DEC);
	ok(n1 - n0 == 15, "15 calls taken (10 + 5, none of the dropped bins): %g", n1 - n0);
	/* the exposition prints 9 significant digits: the sum before is read to that precision too */
	ok(fabs(m_pool(text, "kvq_attention_seconds_sum", DEC) - s0 - (10 * 1e-6 + 5 * 2e-6)) <
		   1e-12 + 2e-9 * fabs(m_pool(text, "kvq_attention_seconds_sum", DEC)),
	   "seconds clamped to the buckets' bounds: 1e9 s to 10 us, NaN to 10 us (sum grew %.9g)",
	   m_pool(text, "kvq_attention_seconds_sum", DEC) - s0);
	ok(m_pool(text, "kvq_attention_kv_bytes_total", DEC) - b0 == 10.0 * (double)region + 1000,
	   "bytes clamped to 10 calls of a layer's whole region (%llu bytes each), then 1000 as sent",
	   (unsigned long long)region);
	ok(m_pool(text, "kvq_attention_bins_total", "result=\"dropped\"") - dr0 == 4 + KVQ_PROTO_MAX_TIMING_BINS + 1 &&
	   m_pool(text, "kvq_attention_bins_total", "result=\"clamped\"") - cl0 == 2 &&
	   m_pool(text, "kvq_attention_bins_total", "result=\"taken\"") - tk0 == 0,
	   "bins: %d dropped, 2 clamped", 4 + KVQ_PROTO_MAX_TIMING_BINS + 1);
	/* soon after: a million calls, of which only KVQ_TIMING_MAX_CALLS_PER_S per second since the last */
	bin_init(&bins[0], 0, 3, 1000000, 3.0, 0);
	st[4] = raw_report(&c, bins, 1);
	t1 = now_ms();
	text = scrape();
	ok(st[4] == 0 && m_pool(text, "kvq_attention_seconds_count", DEC) - n1 <= (t1 - t0 + 2) * 1000 &&
	   m_pool(text, "kvq_attention_bins_total", "result=\"clamped\"") - cl0 == 3,
	   "a million calls claimed at most %.1f ms after the last report: %g believed", t1 - t0,
	   m_pool(text, "kvq_attention_seconds_count", DEC) - n1);
	kvq_conn_close(&c);

	/* a pool whose section says attention_timing = no */
	st[5] = raw_attach(&q, "quiet", &qms);
	ok(st[5] == 0 && qms == 0, "pool quiet: attach says not to time (attention_report_ms %u)", qms);
	text = scrape();
	dr0 = metric(text, "kvq_attention_bins_total{pool=\"quiet\",result=\"dropped\"} ");
	usleep(50 * 1000);
	bin_init(&bins[0], 0, 3, 5, 1e-5, 0);
	st[5] = raw_report(&q, bins, 1);
	text = scrape();
	ok(st[5] == 0 && metric(text, "kvq_attention_bins_total{pool=\"quiet\",result=\"dropped\"} ") - dr0 == 1 &&
	   !strstr(text, "kvq_attention_seconds_count{pool=\"quiet\""),
	   "pool quiet: a report is answered 0 and dropped; no attention series for it");
	kvq_conn_close(&q);
}

/* ---------------------------------------------------------------- request errors */

static void test_errors(void)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	struct kvq_conn c;
	const char *text;
	double before;
	int r;

	text = scrape();
	before = metric(text, "kvq_request_errors_total{request=\"alloc\",code=\"EPROTO\"} ");
	kvq_conn_init(&c, 10000);
	r = kvq_conn_open(&c, sock_path, "mon-err");
	a.n_open = 1;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	if (r == 0)
		r = kvq_conn_call(&c, &e, KVQ__ENVELOPE__BODY_ALLOC_REPLY, NULL);
	kvq_conn_close(&c);
	text = scrape();
	ok(r == -EPROTO && metric(text, "kvq_request_errors_total{request=\"alloc\",code=\"EPROTO\"} ") -
				   (isnan(before) ? 0 : before) == 1,
	   "an Alloc before Attach (%d) is counted: kvq_request_errors_total{request=\"alloc\",code=\"EPROTO\"}", r);
}

/* ---------------------------------------------------------------- the dashboard */

/* Whether the exposition has a sample named name. */
static bool served(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; (p = strstr(p, name)); p += n)
		if ((p == text || p[-1] == '\n') && (p[n] == '{' || p[n] == ' '))
			return true;
	return false;
}

static void test_dashboard(void)
{
	const char *top = getenv("top_srcdir"), *text;
	static char doc[1 << 18];
	char path[1024], missing[1024] = "", name[128];
	int names = 0, queries = 0, absent = 0;
	size_t got;
	FILE *f;

	snprintf(path, sizeof(path), "%s/docs/kvqd-grafana.json", top ? top : ".");
	f = fopen(path, "r");
	got = f ? fread(doc, 1, sizeof(doc) - 1, f) : 0;
	if (f)
		fclose(f);
	doc[got] = 0;
	text = scrape();
	if (!ok(got > 0 && text, "the dashboard %s is read, /metrics scraped", path))
		return;
	/* every query: a panel's target (expr) and the pool variable's (definition) */
	for (int k = 0; k < 2; k++) {
		const char *key = k ? "\"definition\":" : "\"expr\":";

		for (const char *p = doc; (p = strstr(p, key)); ) {
			const char *v = p + strlen(key);

			v += strspn(v, " ");
			p = v;
			if (*v != '"')
				continue;
			queries++;
			for (v++; *v && *v != '"'; v++) {
				size_t n;

				if (*v == '\\') {
					v++;
					continue;
				}
				if (strncmp(v, "kvq_", 4) || isalnum((unsigned char)v[-1]) || v[-1] == '_')
					continue;
				n = strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789_");
				snprintf(name, sizeof(name), "%.*s", (int)n, v);
				names++;
				if (!served(text, name)) {
					absent++;
					snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), " %s", name);
				}
				v += n - 1;
			}
			p = v;
		}
	}
	ok(queries >= 10 && names >= queries, "the dashboard's %d queries name %d kvq_* metrics", queries, names);
	ok(absent == 0, "every one is served by /metrics%s%s", absent ? "; missing:" : "", missing);
	ok(!served(text, "kvq_no_such_metric") && served(text, "kvq_attention_seconds_bucket"),
	   "the check itself tells a served name from one that is not");
}

/* A window of 4 blocks: live sequences are only bounded, from below by
 * the open slots in use / (R/B) (a sequence longer than R holds R/B, a
 * shorter one fewer), from above by the open slots in use (each holds one). */
static void test_wide_window(void)
{
	static const struct seqspec spec[] = { { 7, 150, 150, 0 }, { 8, 10, 10, 0 }, { 9, 10, 10, 0 } };
	struct report rep;
	struct worker w = { 0 };
	uint64_t open = 0, sealed = 0;

	memset(&rep, 0, sizeof(rep));
	worker_pool = "wide";
	worker_window = 4 * B_;
	if (!ok(worker_start(&w, spec, 3, &rep) == 0 && rep.nseq == 3,
		"worker C: 150, 10 and 10 tokens in a pool of window 4B (%s)", rep.err)) {
		if (w.pid > 0)
			worker_finish(&w);
		worker_pool = POOL;
		worker_window = 0;
		return;
	}
	for (uint32_t i = 0; i < rep.nseq; i++) {
		open += rep.n_open[i];
		sealed += rep.n_sealed[i];
	}
	/* S(150) = 16 ceil(86 / 16) = 96: 6 sealed, 54 open tokens in 4 blocks; 10 tokens: 1 block each */
	ok(open == 6 && sealed == 6, "worker C holds 6 open and 6 sealed blocks (%llu, %llu)", (unsigned long long)open,
	   (unsigned long long)sealed);
	ok(ctl_stats("wide") == 0, "window 4B: kvqctl --json stats runs");
	ok(jnum(ctl_out, "\"resident\"", "sequences") == (double)((open + 3) / 4) &&
	   jnum(ctl_out, "\"resident\"", "sequences") < rep.nseq &&
	   jnum(ctl_out, "\"resident\"", "sequences_max") == (double)open && open >= rep.nseq,
	   "window 4B: %u live sequences between kvqctl's bounds %g (open slots / 4, rounded up) and %g (open slots)",
	   rep.nseq, jnum(ctl_out, "\"resident\"", "sequences"), jnum(ctl_out, "\"resident\"", "sequences_max"));
	ok(jnum(ctl_out, "\"resident\"", "sealed_tokens") == (double)(sealed * B_) &&
	   jnum(ctl_out, "\"resident\"", "open_tokens_max") == (double)(open * B_),
	   "window 4B: sealed tokens exact (%g), open tokens at most %g", jnum(ctl_out, "\"resident\"", "sealed_tokens"),
	   jnum(ctl_out, "\"resident\"", "open_tokens_max"));
	ok(worker_finish(&w) == 0, "worker C frees its sequences and exits");
	worker_pool = POOL;
	worker_window = 0;
}

int main(void)
{
	const char *top = getenv("top_builddir"), *env_ctl = getenv("KVQ_TEST_KVQCTL"), *text;
	static const struct seqspec a_spec[] = { { 1, 83, 83, 0 }, { 2, 39, 39, 0 } };
	static const struct seqspec b_spec[] = { { 1, 90, 64, 1 } };
	struct report reps[2];
	struct worker wa = { 0 }, wb = { 0 };
	char extra[1024];
	pid_t d;

	signal(SIGPIPE, SIG_IGN);
	snprintf(ctl_bin, sizeof(ctl_bin), "%s", env_ctl ? env_ctl : "");
	if (!env_ctl)
		snprintf(ctl_bin, sizeof(ctl_bin), "%s/kvqctl/kvqctl", top ? top : ".");
	port = free_port();
	snprintf(extra, sizeof(extra),
		 "metrics_listen = 127.0.0.1:%d\nattention_timing = yes\nattention_report_ms = 100\n"
		 "[pool quiet]\nmodel = %s\nlayers = %d\nkv_heads = %d\nhead_dim = %d\nblock_tokens = %d\n"
		 "policy = int8\ncapacity = 4M\nattention_timing = no\n", port, MODEL, L_, H_, D_, B_);
	d = test_daemon_start_conf("host", "mon", extra, tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path),
				   daemon_bin, sizeof(daemon_bin));
	if (!ok(d > 0 && port > 0, "kvqd starts with metrics on 127.0.0.1:%d and attention timing", port))
		return done_testing();

	/* one worker, two sequences with nothing in common */
	memset(reps, 0, sizeof(reps));
	if (!ok(worker_start(&wa, a_spec, 2, &reps[0]) == 0, "worker A: two sequences of 83 and 39 tokens (%s)",
		reps[0].err))
		goto out;
	/* S(n) = B ceil((n - R) / B) with R = B: 80 and 32 tokens sealed */
	ok(reps[0].n_sealed[0] == 5 && reps[0].n_sealed[1] == 2 && reps[0].n_open[0] == 1 && reps[0].n_open[1] == 1,
	   "worker A holds 5 + 2 sealed blocks and one open block per sequence");
	check_resident("no shared prefix", reps, 1);
	ok(jnum(ctl_out, "\"resident\"", "sharing_factor") == 1.0, "no shared prefix: sharing factor 1");

	/* another worker: A's first prompt's first 64 tokens, another question, and a fork */
	if (!ok(worker_start(&wb, b_spec, 1, &reps[1]) == 0, "worker B: a sequence sharing 64 tokens with A's, forked (%s)",
		reps[1].err))
		goto out;
	ok(reps[1].nseq == 2 && reps[1].n_sealed[0] == 5 && !memcmp(reps[1].ids[0], reps[0].ids[0], 4 * sizeof(int32_t)),
	   "worker B's sequence starts with A's 4 cached blocks; its fork shares all 5");
	check_resident("shared prefix and a fork", reps, 2);
	check_devices(scrape());
	ok(jnum(ctl_out, "\"resident\"", "sharing_factor") > 2.0, "shared prefix: sharing factor %g over 2",
	   jnum(ctl_out, "\"resident\"", "sharing_factor"));
	ok(jnum(ctl_out, "\"resident\"", "effective_batch_gain") > 1.0 &&
	   jnum(ctl_out, "\"resident\"", "effective_batch_gain") < 2.0,
	   "int8, short sequences, open window and reservations in f16: batch gain %g between 1 and 2", jnum(ctl_out, "\"resident\"", "effective_batch_gain"));

	/* both go; what they timed arrives with their last, empty, Seal */
	ok(worker_finish(&wb) == 0 && worker_finish(&wa) == 0, "both workers free their sequences and exit");
	wa.pid = wb.pid = 0;
	text = scrape();
	ok(text && m_pool(text, "kvq_resident_sequences", NULL) == 0 &&
	   m_pool(text, "kvq_resident_tokens", "kind=\"sealed\"") == 0, "nothing resident once they left");
	ok(text && m_pool(text, "kvq_attention_seconds_count", DEC) == reps[0].decode + reps[1].decode &&
	   m_pool(text, "kvq_attention_seconds_count", "phase=\"prefill\",k=\"int8\",v=\"int8\"") ==
		   reps[0].prefill + reps[1].prefill,
	   "attention histograms count the workers' %llu decode and %llu prefill calls",
	   (unsigned long long)(reps[0].decode + reps[1].decode), (unsigned long long)(reps[0].prefill + reps[1].prefill));
	ok(text && m_pool(text, "kvq_attention_kv_bytes_total", DEC) +
			   m_pool(text, "kvq_attention_kv_bytes_total", "phase=\"prefill\",k=\"int8\",v=\"int8\"") ==
		   reps[0].kv_bytes + reps[1].kv_bytes &&
	   m_pool(text, "kvq_attention_seconds_sum", DEC) > 0 &&
	   m_pool(text, "kvq_attention_seconds_bucket", DEC ",le=\"+Inf\"") == reps[0].decode + reps[1].decode,
	   "their KV bytes (%llu) and times arrived", (unsigned long long)(reps[0].kv_bytes + reps[1].kv_bytes));
	{
		int n = text ? parse_exposition(strcpy(ctl_out, text)) : 0;

		ok(n > 0, "the exposition parses, the new families included (%d%s)", n, n < 0 ? ": bad line" : " samples");
	}

	test_wide_window();
	test_forged(reps[0].region);
	test_errors();
	test_dashboard();
out:
	if (wa.pid > 0)
		worker_finish(&wa);
	if (wb.pid > 0)
		worker_finish(&wb);
	test_daemon_stop(d, tmpdir);
	return done_testing();
}
