/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench: measurements of the kvq formats and kernels, and of kvqd's
 * control path.
 *
 *   kvq-bench formats [--json] [--quick] [--isa portable|avx2] [--format LIST]
 *   kvq-bench control [--socket PATH] [--pool NAME] [--seconds N] [--json]
 *
 * "formats" compares the storage formats at two model geometries: bytes per
 * token of a sealed block (every scale and zero included), the ratio to f16,
 * and the CPU decode-attention throughput in bytes of KV read per second,
 * judged against a read-only pass over memory measured in the same run
 * (DESIGN.md, "Kernels": decode is memory-bound, so the fraction of the read
 * bandwidth it reaches is its figure of merit).
 *
 * The workload is the production layout for all L layers, but only one
 * layer's decode is timed: the pool is mapped MAP_NORESERVE and only the timed
 * layer's region is touched, so a 30 GiB virtual pool costs about 1 GiB.
 *
 * "control" is in bench/control.c.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

#include "bench.h"
#include "cpu/cpu.h"
#include "format.h"
#include "layout.h"

#define BLOCK_TOKENS 32u
#define DEFAULT_LLC (32ull << 20)
/* Distinct sealed blocks quantized per format; the rest of the timed layer is
 * filled with copies, since decode speed does not depend on the values and
 * the scalar quantizer would take minutes for a gigabyte of blocks. */
#define TEMPLATE_BLOCKS 32u
#define MAX_RUNS 16u
#define MIN_RUNS 3u
#define PAGE 4096u

struct cfg {
	int json, quick;
	uint32_t fmt_mask;         /* formats to measure (f16 always: the reference) */
	unsigned threads;
	uint64_t llc, llc_sysconf, llc_sysfs;
	const char *llc_src;
	double ws_target;          /* bytes read per decode step, at least */
	uint32_t blocks_per_seq;   /* n = blocks_per_seq * B + B / 2 for every format */
	unsigned runs;       /* at most; at least MIN_RUNS once budget_s is spent */
	double min_run_s;
	double budget_s;     /* per figure, so slow formats keep the command short */
	int read_avx2;
};

struct geom {
	const char *name;
	uint32_t layers, q_heads, kv_heads, head_dim;
};

static const struct geom geoms[] = {
	{ "llama3-8b", 32, 32, 8, 128 },
	{ "smollm2-135m", 30, 9, 3, 64 },
};
#define NGEOMS (sizeof geoms / sizeof geoms[0])

/* Per-geometry workload shape, the same for every format so that every
 * format decodes exactly the same tokens. */
struct plan {
	uint32_t n, nseq;
	double max_step_bytes;
};

struct result {
	const struct geom *g;
	int fmt;
	double bpt, bpt_layer, ratio_f16;
	double step_bytes;
	uint32_t nseq, n;
	double dec1, decn;   /* GB/s of KV read */
	double cpu_share;
};

struct membw {
	double read1, readn, copy1, copyn;   /* GB/s */
	double fma1, fman;                   /* G vector (8-lane) FMAs per second; 0 without AVX2 */
	double bytes;
	double cpu_share;
};

/* CPU time this process got during timed runs against what its running
 * threads could have used: well below 1 means other processes took the
 * CPUs (the machine may be shared) and the figures are low. */
struct share {
	double cpu, avail;
};

/* ------------------------------------------------------------------ utils */

static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double share_of(const struct share *sh)
{
	return sh->avail > 0.0 ? sh->cpu / sh->avail : 0.0;
}

/* ------------------------------------------------------------ cache size */

static int read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return -1;
	ok = fgets(buf, (int)len, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* Size of the highest-level data or unified cache of cpu0, from sysfs. */
static uint64_t sysfs_llc(void)
{
	uint64_t best = 0;
	unsigned best_level = 0;

	for (int i = 0; i < 16; i++) {
		char path[96], buf[64], *end;
		unsigned level;
		unsigned long long size;

		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
		if (read_line(path, buf, sizeof buf) < 0)
			break;
		level = (unsigned)strtoul(buf, NULL, 10);
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
		if (read_line(path, buf, sizeof buf) == 0 && !strcmp(buf, "Instruction"))
			continue;
		snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		if (read_line(path, buf, sizeof buf) < 0)
			continue;
		size = strtoull(buf, &end, 10);
		if (*end == 'K')
			size <<= 10;
		else if (*end == 'M')
			size <<= 20;
		else if (*end == 'G')
			size <<= 30;
		if (level > best_level || (level == best_level && size > best)) {
			best_level = level;
			best = size;
		}
	}
	return best;
}

/*
 * sysfs first: it gives the L3 a core actually shares, while glibc's sysconf
 * reports the whole package's L3 on some AMD parts (256 MiB for 8 CCDs of
 * 32 MiB on EPYC), which would inflate the working set eightfold for nothing.
 */
static void detect_llc(struct cfg *c)
{
	long sc = -1;

#ifdef _SC_LEVEL3_CACHE_SIZE
	sc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
	c->llc_sysconf = sc > 0 ? (uint64_t)sc : 0;
	c->llc_sysfs = sysfs_llc();
	if (c->llc_sysfs) {
		c->llc = c->llc_sysfs;
		c->llc_src = "sysfs";
	} else if (c->llc_sysconf) {
		c->llc = c->llc_sysconf;
		c->llc_src = "sysconf";
	} else {
		c->llc = DEFAULT_LLC;
		c->llc_src = "default";
	}
}

/* ------------------------------------------------------------ thread team */

typedef void (*job_fn)(void *arg, unsigned idx, unsigned n);

/* Persistent workers released by a barrier, so a timed step costs two
 * barrier waits rather than thread creation.  The caller is thread 0. */
struct team {
	unsigned n;
	pthread_t *tid;
	unsigned *idx;
	pthread_barrier_t go, done;
	job_fn fn;
	void *arg;
	int quit;
};

static struct team *team_g;

static void *team_worker(void *p)
{
	unsigned idx = *(unsigned *)p;
	struct team *t = team_g;

	for (;;) {
		pthread_barrier_wait(&t->go);
		if (t->quit)
			return NULL;
		t->fn(t->arg, idx, t->n);
		pthread_barrier_wait(&t->done);
	}
}

static int team_start(struct team *t, unsigned n)
{
	memset(t, 0, sizeof *t);
	t->n = n;
	team_g = t;
	if (n < 2)
		return 0;
	t->tid = calloc(n, sizeof *t->tid);
	t->idx = calloc(n, sizeof *t->idx);
	if (!t->tid || !t->idx)
		return -ENOMEM;
	pthread_barrier_init(&t->go, NULL, n);
	pthread_barrier_init(&t->done, NULL, n);
	for (unsigned i = 1; i < n; i++) {
		t->idx[i] = i;
		if (pthread_create(&t->tid[i], NULL, team_worker, &t->idx[i])) {
			fprintf(stderr, PROG ": cannot start thread %u\n", i);
			exit(1);
		}
	}
	return 0;
}

static void team_stop(struct team *t)
{
	if (t->n >= 2) {
		t->quit = 1;
		pthread_barrier_wait(&t->go);
		for (unsigned i = 1; i < t->n; i++)
			pthread_join(t->tid[i], NULL);
		pthread_barrier_destroy(&t->go);
		pthread_barrier_destroy(&t->done);
	}
	free(t->tid);
	free(t->idx);
}

/* One step of fn on nthr threads (1, or the whole team). */
static void team_step(struct team *t, unsigned nthr, job_fn fn, void *arg)
{
	if (nthr < 2) {
		fn(arg, 0, 1);
		return;
	}
	t->fn = fn;
	t->arg = arg;
	pthread_barrier_wait(&t->go);
	fn(arg, 0, t->n);
	pthread_barrier_wait(&t->done);
}

/*
 * Median of bytes per second (in GB/s) over c->runs runs, or fewer (not
 * under MIN_RUNS) once c->budget_s is spent: the slowest formats take about a
 * second per step.  A run repeats steps until it lasts c->min_run_s, so short
 * steps are not dominated by clock and barrier overhead.  warm says the job
 * has just run (caches, TLB and clocks settled); otherwise one untimed step
 * comes first.
 */
static double measure(struct team *t, unsigned nthr, job_fn fn, void *arg, double bytes, const struct cfg *c,
		      int warm, struct share *sh)
{
	double rates[MAX_RUNS], start;
	unsigned r = 0;

	if (!warm)
		team_step(t, nthr, fn, arg);
	start = now_s();
	while (r < c->runs) {
		unsigned steps = 0;
		double t0 = now_s(), c0 = cpu_s(), el;

		do {
			team_step(t, nthr, fn, arg);
			steps++;
			el = now_s() - t0;
		} while (el < c->min_run_s);
		sh->cpu += cpu_s() - c0;
		sh->avail += nthr * el;
		rates[r++] = bytes * steps / el;
		if (r >= MIN_RUNS && now_s() - start > c->budget_s)
			break;
	}
	return median(rates, r) / 1e9;
}

/* --------------------------------------------------------- memory passes */

static uint64_t sink;

static int cpu_has_avx2(void)
{
#ifdef BENCH_X86
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
#else
	return 0;
#endif
}

#ifdef BENCH_X86
/* Eight independent 256-bit accumulators keep enough loads in flight that
 * the sum is limited by memory, not by the add chain. */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t len)
{
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
	uint64_t lane[4];

	for (size_t i = 0; i < len; i += 256) {
		const __m256i *v = (const __m256i *)(p + i);
		a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + 0));
		a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
		a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
		a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
		a4 = _mm256_add_epi64(a4, _mm256_load_si256(v + 4));
		a5 = _mm256_add_epi64(a5, _mm256_load_si256(v + 5));
		a6 = _mm256_add_epi64(a6, _mm256_load_si256(v + 6));
		a7 = _mm256_add_epi64(a7, _mm256_load_si256(v + 7));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	a4 = _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7));
	_mm256_storeu_si256((__m256i *)lane, _mm256_add_epi64(a0, a4));
	return lane[0] + lane[1] + lane[2] + lane[3];
}
#endif

static uint64_t sum_portable(const uint8_t *p, size_t len)
{
	uint64_t a[8] = { 0 };

	for (size_t i = 0; i < len; i += 64)
		for (unsigned k = 0; k < 8; k++) {
			uint64_t w;
			memcpy(&w, p + i + 8 * k, 8);
			a[k] += w;
		}
	return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

struct memjob {
	uint8_t *buf;
	size_t len;   /* read: buf[0, len); copy: first half to second half */
	int avx2;
};

/* Page-aligned share of thread idx of n over len bytes. */
static void share(size_t len, unsigned idx, unsigned n, size_t *a, size_t *b)
{
	size_t chunk = len / n / PAGE * PAGE;

	*a = chunk * idx;
	*b = idx + 1 == n ? len : *a + chunk;
}

static void read_job(void *arg, unsigned idx, unsigned n)
{
	struct memjob *j = arg;
	size_t a, b;
	uint64_t s;

	share(j->len, idx, n, &a, &b);
#ifdef BENCH_X86
	if (j->avx2)
		s = sum_avx2(j->buf + a, b - a);
	else
#endif
		s = sum_portable(j->buf + a, b - a);
	__atomic_fetch_add(&sink, s, __ATOMIC_RELAXED);
}

static void copy_job(void *arg, unsigned idx, unsigned n)
{
	struct memjob *j = arg;
	size_t half = j->len / 2, a, b;

	share(half, idx, n, &a, &b);
	memcpy(j->buf + half + a, j->buf + a, b - a);
}

#ifdef BENCH_X86
#define FMA_STEPS (1u << 21)   /* loop turns of one FMA job: 12 FMAs each */

/* Twelve independent FMA chains per thread: the machine's FMA rate, which
 * bounds decode's floating-point work the way the read pass bounds its
 * memory traffic. */
__attribute__((target("avx2,fma"))) static void fma_job(void *arg, unsigned idx, unsigned n)
{
	__m256 a[12], x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f), sum = _mm256_setzero_ps();
	float lane[8];

	(void)arg;
	(void)n;
	/* distinct starting values: equal chains would be merged into one */
	for (unsigned k = 0; k < 12; k++)
		a[k] = _mm256_set1_ps(0.01f * (float)idx + 0.001f * (float)k);
	for (unsigned i = 0; i < FMA_STEPS; i++) {
#pragma GCC unroll 12
		for (unsigned k = 0; k < 12; k++)
			a[k] = _mm256_fmadd_ps(a[k], x, y);
	}
	for (unsigned k = 0; k < 12; k++)
		sum = _mm256_add_ps(sum, a[k]);
	_mm256_storeu_ps(lane, sum);
	__atomic_fetch_add(&sink, (uint64_t)lane[0], __ATOMIC_RELAXED);
}
#endif

static int measure_memory(struct team *t, const struct cfg *c, double bytes, struct membw *m)
{
	size_t len = ((size_t)bytes + 2 * PAGE * c->threads - 1) / (2 * PAGE * c->threads) * (2 * PAGE * c->threads);
	struct memjob j = { .len = len, .avx2 = c->read_avx2 };
	struct share sh = { 0 };

	m->fma1 = m->fman = 0.0;
	j.buf = map_anon(len);
	if (!j.buf) {
		fprintf(stderr, PROG ": cannot map %zu bytes for the read pass\n", len);
		return -1;
	}
	/* written, not just mapped: untouched anonymous pages all map the one
	 * zero page, which reads from cache */
	memset(j.buf, 1, len);
	fprintf(stderr, PROG ": read-only and memcpy passes over %.0f MiB\n", (double)len / (1 << 20));
	m->bytes = (double)len;
	m->read1 = measure(t, 1, read_job, &j, (double)len, c, 0, &sh);
	m->readn = c->threads > 1 ? measure(t, c->threads, read_job, &j, (double)len, c, 0, &sh) : m->read1;
	m->copy1 = measure(t, 1, copy_job, &j, (double)len, c, 0, &sh);
	m->copyn = c->threads > 1 ? measure(t, c->threads, copy_job, &j, (double)len, c, 0, &sh) : m->copy1;
#ifdef BENCH_X86
	if (c->read_avx2) {
		double per = 12.0 * FMA_STEPS;
		m->fma1 = measure(t, 1, fma_job, NULL, per, c, 0, &sh);
		m->fman = c->threads > 1 ? measure(t, c->threads, fma_job, NULL, per * c->threads, c, 0, &sh) : m->fma1;
	}
#endif
	m->cpu_share = share_of(&sh);
	munmap(j.buf, len);
	return 0;
}

/* ---------------------------------------------------------------- decode */

static int fmt_fits(int fmt, uint32_t D)
{
	unsigned gk = kvq_fmt_group(fmt, 0), gv = kvq_fmt_group(fmt, 1);

	return (!gk || D % gk == 0) && (!gv || D % gv == 0);
}

static int make_layout(const struct geom *g, int fmt, uint32_t n_sealed, uint32_t n_open, struct kvq_layout **ret)
{
	struct kvq_policy pol;
	struct kvq_layout_params p = {
		.layers = g->layers, .kv_heads = g->kv_heads, .head_dim = g->head_dim,
		.block_tokens = BLOCK_TOKENS, .window = 0, .n_sealed = n_sealed, .n_open = n_open,
		.act = KVQ_DT_F16, .policy = &pol,
	};
	char err[256];
	int rc;

	memset(&pol, 0, sizeof pol);
	pol.n_layers = g->layers;
	memset(pol.k, fmt, g->layers);
	memset(pol.v, fmt, g->layers);
	rc = kvq_layout_new(&p, ret, err, sizeof err);
	if (rc < 0)
		fprintf(stderr, PROG ": layout for %s %s: %s\n", g->name, kvq_fmt_name(fmt), err);
	return rc;
}

/* Bytes of KV one decode step reads from one layer for one sequence of n
 * tokens: its sealed slices whole, and K and V rows of its open tokens. */
static double seq_bytes(const struct kvq_layout *L, uint32_t layer, uint32_t n)
{
	uint32_t S = kvq_layout_split(L, n);

	return (double)(S / L->block_tokens) * (double)L->layer[layer].sealed_slice +
	       (double)(n - S) * L->kv_heads * L->head_dim * kvq_dtype_bytes(L->act) * 2.0;
}

/* Sequence count such that the format with the fewest bytes per token still
 * reads at least the target per step; more sequences rather than longer ones,
 * so the context length stays realistic. */
static int plan_geometry(const struct geom *g, const struct cfg *c, struct plan *pl)
{
	double min_b = 0.0;

	pl->n = c->blocks_per_seq * BLOCK_TOKENS + BLOCK_TOKENS / 2;
	pl->max_step_bytes = 0.0;
	for (int f = 0; f < KVQ_FMT_COUNT; f++) {
		struct kvq_layout *L;
		double b;

		if (!fmt_fits(f, g->head_dim))
			continue;
		if (make_layout(g, f, 1, 1, &L) < 0)
			return -1;
		b = seq_bytes(L, 0, pl->n);
		kvq_layout_free(L);
		if (min_b == 0.0 || b < min_b)
			min_b = b;
		if (b > pl->max_step_bytes)
			pl->max_step_bytes = b;
	}
	pl->nseq = (uint32_t)ceil(c->ws_target / min_b);
	pl->nseq = (pl->nseq + c->threads - 1) / c->threads * c->threads;
	pl->max_step_bytes *= pl->nseq;
	return 0;
}

struct workload {
	const struct geom *g;
	struct kvq_layout *L;
	uint8_t *base;
	size_t map_len;
	uint32_t layer, nseq, n, nsb, nob;
	int32_t *sealed_ids, *open_ids;
	struct kvq_attn_seq *seqs;
	float *q, *out;
	struct kvq_attn attn;
	double step_bytes;
	int err;
};

static void decode_job(void *arg, unsigned idx, unsigned n)
{
	struct workload *w = arg;
	uint32_t a = (uint32_t)((uint64_t)w->nseq * idx / n), b = (uint32_t)((uint64_t)w->nseq * (idx + 1) / n);
	size_t row = (size_t)w->g->q_heads * w->g->head_dim;   /* n_q = 1 */
	int rc = kvq_cpu_attention(&w->attn, w->seqs + a, b - a, w->q + a * row, w->out + a * row);

	if (rc)
		__atomic_store_n(&w->err, rc, __ATOMIC_RELAXED);
}

/* K and V input of the template sequence, [m][kv_heads][head_dim] f16:
 * normal values; K gets a few outlier channels (as real K caches have) and
 * every 61st token, the first included (an attention sink), is 8x larger,
 * so per-channel KIVI scales see the outliers they would in serving. */
static void fill_input(uint16_t *k, uint16_t *v, uint32_t m, uint32_t H, uint32_t D, uint64_t *s)
{
	for (uint32_t t = 0; t < m; t++) {
		float amp = t % 61 == 0 ? 8.0f : 1.0f;
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t d = 0; d < D; d++) {
				size_t i = ((size_t)t * H + h) * D + d;
				float kb = d % 16 == 3 ? 4.0f : 0.0f;
				k[i] = kvq_f16_from_f32(amp * rng_normal(s) + kb);
				v[i] = kvq_f16_from_f32(amp * rng_normal(s));
			}
	}
}

static void workload_free(struct workload *w)
{
	if (w->base)
		munmap(w->base, w->map_len);
	free(w->sealed_ids);
	free(w->open_ids);
	free(w->seqs);
	free(w->q);
	free(w->out);
	kvq_layout_free(w->L);
	memset(w, 0, sizeof *w);
}

static int workload_init(struct workload *w, const struct geom *g, int fmt, const struct plan *pl)
{
	uint32_t B = BLOCK_TOKENS, H = g->kv_heads, D = g->head_dim;
	uint32_t n_sealed, n_open, nt, m, S;
	uint64_t seed = 0x6b7671ull + (uint64_t)fmt;
	struct kvq_layout *L1;
	const struct kvq_layer_layout *ll;
	struct kvq_seq_write wr;
	int32_t *topen = NULL;
	uint16_t *kin = NULL, *vin = NULL;
	size_t qlen;
	int rc;

	memset(w, 0, sizeof *w);
	w->g = g;
	w->n = pl->n;
	w->nseq = pl->nseq;
	/* the split depends on the window, which depends on the format (KIVI
	 * keeps 4 blocks open), so ask a throw-away layout */
	if (make_layout(g, fmt, 1, 1, &L1) < 0)
		return -1;
	S = kvq_layout_split(L1, w->n);
	kvq_layout_free(L1);
	w->nsb = S / B;
	w->nob = (w->n - S + B - 1) / B;
	n_sealed = w->nseq * w->nsb;
	n_open = w->nseq * w->nob;
	if (make_layout(g, fmt, n_sealed, n_open, &w->L) < 0)
		return -1;
	w->layer = g->layers / 2;   /* a middle layer: its region starts far into the pool */
	ll = &w->L->layer[w->layer];
	w->map_len = (size_t)w->L->total_bytes;
	w->base = map_anon(w->map_len);
	if (!w->base) {
		fprintf(stderr, PROG ": cannot map a pool of %.1f GiB: %s\n", (double)w->map_len / (1 << 30),
			strerror(errno));
		w->map_len = 0;
		goto fail;
	}

	/* paging: every sequence gets shuffled, scattered block ids */
	w->sealed_ids = malloc((size_t)n_sealed * sizeof *w->sealed_ids);
	w->open_ids = malloc((size_t)n_open * sizeof *w->open_ids);
	w->seqs = calloc(w->nseq, sizeof *w->seqs);
	qlen = (size_t)w->nseq * g->q_heads * D;
	w->q = malloc(qlen * sizeof *w->q);
	w->out = malloc(qlen * sizeof *w->out);
	if (!w->sealed_ids || !w->open_ids || !w->seqs || !w->q || !w->out)
		goto nomem;
	shuffle_ids(w->sealed_ids, n_sealed, &seed);
	shuffle_ids(w->open_ids, n_open, &seed);
	for (uint32_t i = 0; i < w->nseq; i++) {
		w->seqs[i].n = w->n;
		w->seqs[i].n_q = 1;
		w->seqs[i].sealed = w->sealed_ids + (size_t)i * w->nsb;
		w->seqs[i].open = w->open_ids + (size_t)i * w->nob;
	}
	for (size_t i = 0; i < qlen; i++)
		w->q[i] = rng_normal(&seed);

	/* template: the first nt sealed blocks of sequence 0 and its open
	 * window, written by the kernel from random input */
	nt = w->nsb < TEMPLATE_BLOCKS ? w->nsb : TEMPLATE_BLOCKS;
	m = nt * B + (w->n - S);
	kin = malloc((size_t)m * H * D * sizeof *kin);
	vin = malloc((size_t)m * H * D * sizeof *vin);
	topen = malloc((size_t)(nt + w->nob) * sizeof *topen);
	if (!kin || !vin || !topen)
		goto nomem;
	fill_input(kin, vin, m, H, D, &seed);
	for (uint32_t b = 0; b < nt; b++)
		topen[b] = -1;   /* straight from the input into its sealed slot */
	memcpy(topen + nt, w->open_ids, w->nob * sizeof *topen);
	wr = (struct kvq_seq_write){ .n = 0, .m = m, .sealed = w->sealed_ids, .open = topen };
	rc = kvq_cpu_write(w->L, w->base, w->layer, &wr, kin, vin);
	if (rc < 0) {
		fprintf(stderr, PROG ": kvq_cpu_write: %s\n", strerror(-rc));
		goto fail;
	}

	/* the rest of the timed layer: copies of the template slices (K codes
	 * are first in a slice, so the K_CODES offset of head 0 is its start) */
	for (uint32_t j = nt; j < n_sealed; j++)
		memcpy(w->base + kvq_layout_off(w->L, KVQ_SEALED, (uint32_t)w->sealed_ids[j], w->layer, 0,
						KVQ_K_CODES) - ll->off[KVQ_K_CODES],
		       w->base + kvq_layout_off(w->L, KVQ_SEALED, (uint32_t)w->sealed_ids[j % nt], w->layer, 0,
						KVQ_K_CODES) - ll->off[KVQ_K_CODES],
		       ll->sealed_slice);
	for (uint32_t j = w->nob; j < n_open; j++)
		memcpy(w->base + kvq_layout_off(w->L, KVQ_OPEN, (uint32_t)w->open_ids[j], w->layer, 0, KVQ_K_CODES),
		       w->base + kvq_layout_off(w->L, KVQ_OPEN, (uint32_t)w->open_ids[j % w->nob], w->layer, 0,
						KVQ_K_CODES),
		       ll->open_slice);

	w->attn = (struct kvq_attn){
		.L = w->L, .base = w->base, .layer = w->layer, .q_heads = g->q_heads,
		.scale = 1.0f / sqrtf((float)D), .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32,
	};
	w->step_bytes = seq_bytes(w->L, w->layer, w->n) * w->nseq;
	free(kin);
	free(vin);
	free(topen);
	return 0;

nomem:
	fprintf(stderr, PROG ": out of memory\n");
fail:
	free(kin);
	free(vin);
	free(topen);
	workload_free(w);
	return -1;
}

/* One untimed step that must succeed and give finite outputs: a benchmark
 * of a kernel that rejects its input would time nothing. */
static int workload_check(struct workload *w)
{
	size_t qlen = (size_t)w->nseq * w->g->q_heads * w->g->head_dim;

	decode_job(w, 0, 1);
	if (w->err) {
		fprintf(stderr, PROG ": kvq_cpu_attention: %s\n", strerror(-w->err));
		return -1;
	}
	for (size_t i = 0; i < qlen; i++)
		if (!isfinite(w->out[i])) {
			fprintf(stderr, PROG ": kvq_cpu_attention gave a non-finite output\n");
			return -1;
		}
	return 0;
}

/* ---------------------------------------------------------------- report */

/* Size targets of the issue: the bound on ratio_to_f16, or 0 for none. */
static double size_target(int fmt, uint32_t D)
{
	switch (fmt) {
	case KVQ_FMT_INT8: case KVQ_FMT_FP8: return D >= 128 ? 0.51 : 0.52;
	case KVQ_FMT_KIVI4: return 0.32;
	case KVQ_FMT_KIVI2: return 0.19;
	default: return 0.0;
	}
}

#define BW_TARGET 0.5   /* int8 decode, all threads, against the read pass */

/*
 * Decode's floating-point work is g FMAs per KV element (each of the g
 * query rows of a KV head multiplies every K and every V element once), so
 * fma vector FMAs per second bound it at fma * 8 / g elements per second;
 * returned in GB/s of the format's bytes.  0 when the FMA rate is unknown.
 */
static double fma_bound(const struct result *r, double fma)
{
	double g = (double)r->g->q_heads / r->g->kv_heads;
	double bytes_per_elem = r->bpt_layer / (2.0 * r->g->kv_heads * r->g->head_dim);

	return fma * 8.0 / g * bytes_per_elem;
}

static const char *size_check(const struct result *r)
{
	double t = size_target(r->fmt, r->g->head_dim);

	return t == 0.0 ? NULL : r->ratio_f16 <= t ? "PASS" : "MISS";
}

static const char *bw_check(const struct result *r, const struct membw *m)
{
	if (r->fmt != KVQ_FMT_INT8)
		return NULL;
	return r->decn / m->readn >= BW_TARGET ? "PASS" : "MISS";
}

static void print_table(const struct cfg *c, const struct membw *m, const struct plan *pl,
			const struct result *res, unsigned nres, char notes[][160], unsigned nnotes)
{
	printf("kvq-bench formats: CPU kernels %s, read pass %s, %u threads, B=%u tokens per block%s\n",
	       kvq_cpu_isa(), c->read_avx2 ? "avx2" : "portable", c->threads, BLOCK_TOKENS,
	       c->quick ? " (--quick: small working set, figures not meaningful)" : "");
	printf("last-level cache %.0f MiB (%s; sysconf %.0f MiB, sysfs %.0f MiB); decode working set >= %.0f MiB\n",
	       (double)c->llc / (1 << 20), c->llc_src, (double)c->llc_sysconf / (1 << 20),
	       (double)c->llc_sysfs / (1 << 20), c->ws_target / (1 << 20));
	printf("memory (%.0f MiB): read-only %.2f GB/s 1 thread, %.2f GB/s %u threads; "
	       "memcpy (read+written) %.2f GB/s 1 thread, %.2f GB/s %u threads; CPU share %.0f%%\n",
	       m->bytes / (1 << 20), m->read1, m->readn, c->threads, m->copy1, m->copyn, c->threads,
	       100.0 * m->cpu_share);
	if (m->fman > 0.0)
		printf("FMA (AVX2, 12 independent chains): %.2f G vector FMAs/s 1 thread, %.2f %u threads\n", m->fma1,
		       m->fman, c->threads);
	for (unsigned gi = 0; gi < NGEOMS; gi++)
		printf("workload %-13s L=%u, %u query / %u KV heads, D=%u: %u sequences x %u tokens, n_q=1, "
		       "f32 q/out, layer %u timed\n",
		       geoms[gi].name, geoms[gi].layers, geoms[gi].q_heads, geoms[gi].kv_heads, geoms[gi].head_dim,
		       pl[gi].nseq, pl[gi].n, geoms[gi].layers / 2);
	printf("\nGB/s = 1e9 bytes of KV read per second.  \"decode\" and \"/read\": all %u threads "
	       "(JSON cpu_decode_gbps, ratio_to_read_bw);\n\"1t\": one thread.  \"/read\" = decode / "
	       "read-only pass of the same thread count.\n\"/fma\" = decode / (FMA rate x 8 / g): decode does g FMAs per KV element (g query heads per KV\nhead), so the FMA rate of the same thread count bounds it as the read pass does (all threads).\n\"cpu\": CPU time the timed runs got / what their "
	       "threads could use; well under 100%%, other processes\nshared the CPUs and the row's figures are low.\n\n",
	       c->threads);
	printf("%-13s %-9s %9s %9s %7s %9s %9s %7s %7s %7s %7s %5s %5s %5s\n", "geometry", "format", "B/token",
	       "B/tok/lyr", "/f16", "KV MiB", "decode", "/read", "/fma", "1t", "/read1t", "cpu", "size", "bw");
	for (unsigned i = 0; i < nres; i++) {
		const struct result *r = &res[i];
		const char *sc = size_check(r), *bc = bw_check(r, m);
		char fr[16] = "-";

		if (m->fman > 0.0)
			snprintf(fr, sizeof fr, "%.3f", r->decn / fma_bound(r, m->fman));
		printf("%-13s %-9s %9.0f %9.2f %7.4f %9.1f %9.2f %7.3f %7s %7.2f %7.3f %4.0f%% %5s %5s\n",
		       r->g->name, kvq_fmt_name(r->fmt), r->bpt, r->bpt_layer, r->ratio_f16, r->step_bytes / (1 << 20),
		       r->decn, r->decn / m->readn, fr, r->dec1, r->dec1 / m->read1, 100.0 * r->cpu_share,
		       sc ? sc : "-", bc ? bc : "-");
	}
	for (unsigned i = 0; i < nnotes; i++)
		printf("note: %s\n", notes[i]);
	printf("targets: size: /f16 <= 0.51 for int8 and fp8 at D=128 (0.52 at D=64), <= 0.32 kivi4, "
	       "<= 0.19 kivi2; bw: int8 decode >= %.1f x read-only pass (all threads)\n", BW_TARGET);
}

static void print_json(const struct cfg *c, const struct membw *m, const struct result *res, unsigned nres)
{
	printf("{\"formats\":[");
	for (unsigned i = 0; i < nres; i++) {
		const struct result *r = &res[i];
		const char *sc = size_check(r), *bc = bw_check(r, m);

		printf("%s{\"format\":\"%s\",\"geometry\":\"%s\",\"bytes_per_token\":%.10g,\"ratio_to_f16\":%.6f,"
		       "\"cpu_decode_gbps\":%.4f,\"ratio_to_read_bw\":%.4f,\"bytes_per_token_layer\":%.10g,"
		       "\"cpu_decode_gbps_1t\":%.4f,\"ratio_to_read_bw_1t\":%.4f,\"threads\":%u,"
		       "\"read_gbps\":%.4f,\"read_gbps_1t\":%.4f,\"memcpy_gbps\":%.4f,\"memcpy_gbps_1t\":%.4f,"
		       "\"kv_bytes_per_step\":%.0f,\"sequences\":%u,\"tokens_per_seq\":%u,\"isa\":\"%s\","
		       "\"cpu_share\":%.3f",
		       i ? "," : "", kvq_fmt_name(r->fmt), r->g->name, r->bpt, r->ratio_f16, r->decn,
		       r->decn / m->readn, r->bpt_layer, r->dec1, r->dec1 / m->read1, c->threads, m->readn,
		       m->read1, m->copyn, m->copy1, r->step_bytes, r->nseq, r->n, kvq_cpu_isa(), r->cpu_share);
		if (m->fman > 0.0) {
			double fb = fma_bound(r, m->fman);
			printf(",\"fma_gvec_per_s\":%.4f,\"fma_bound_gbps\":%.4f,\"ratio_to_fma_bound\":%.4f", m->fman,
			       fb, r->decn / fb);
		}
		if (sc)
			printf(",\"size_check\":\"%s\"", sc);
		if (bc)
			printf(",\"bw_check\":\"%s\"", bc);
		printf("}");
	}
	printf("]}\n");
}

/* -------------------------------------------------------------- commands */

void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " COMMAND [OPTIONS]\n"
		"commands:\n"
		"  formats   bytes per token and CPU decode throughput of every storage format\n"
		"  control   block operations/s, round-trip and attach latency of a running kvqd\n"
		"  decode    GPU decode attention per format and shape: ms, GB/s, share of read bandwidth\n"
		"  prefill   GPU attention of a 2048-token chunk over a cached 8192-token prefix\n"
		"  append    GPU write (append + seal) of a 64 x 2048-token prefill against copy bandwidth\n"
		"            (kvq-bench decode|prefill|append --help for their options)\n"
		"options of formats:\n"
		"  --json          print the results as one JSON object on the last line of stdout\n"
		"  --quick         small working set and few runs (a smoke test, not a measurement)\n"
		"  --isa NAME      vector path of the CPU kernels: portable or avx2 (default: best)\n"
		"  --format LIST   only these formats, comma-separated (f16 always runs: the reference)\n"
		"  --help          this text\n"
		"options of control:\n"
		"  --socket PATH   kvqd's socket (default: kvqd's, /run/kvqd/kvqd.sock for root,\n"
		"                  $XDG_RUNTIME_DIR/kvqd.sock otherwise)\n"
		"  --pool NAME     pool to attach to, created when it does not exist (default kvq-bench;\n"
		"                  an existing pool must have model kvq-bench, L=2 H=2 D=64 B=16, int8)\n"
		"  --seconds N     length of the block-operation run (default 3)\n"
		"  --json          only the figures, as one JSON object on the last line of stdout:\n"
		"                  {\"ops_per_s\":...,\"rtt_p50_us\":...,\"rtt_p99_us\":...,\"attach_ms\":...}\n"
		"  a block operation is one block through one of Alloc, Seal, Publish, Release (batches of 64);\n"
		"  targets: >= 300000 block operations/s from one client, round-trip p99 < 100 us (idle machine)\n"
		"  exit status 1 on any error (kvqd not running, a request refused), with a one-line message\n");
}

int cmd_formats(int argc, char **argv)
{
	struct cfg c;
	struct team team;
	struct plan pl[NGEOMS];
	struct membw mem;
	struct result res[NGEOMS * KVQ_FMT_COUNT];
	char notes[NGEOMS * KVQ_FMT_COUNT][160];
	unsigned nres = 0, nnotes = 0;
	double max_step = 0.0, t_start = now_s();
	long np;

	memset(&c, 0, sizeof c);
	for (int i = 1; i < argc; i++) {
		const char *isa = NULL;

		if (!strcmp(argv[i], "--json")) {
			c.json = 1;
		} else if (!strcmp(argv[i], "--quick")) {
			c.quick = 1;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--format") || !strncmp(argv[i], "--format=", 9)) {
			const char *list = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
			if (!list || !*list) {
				fprintf(stderr, PROG " formats: --format needs a list of formats, e.g. int8,fp8\n");
				return 2;
			}
			for (const char *p = list; *p;) {
				size_t len = strcspn(p, ",");
				int f = kvq_fmt_from_name(p, len);
				if (f < 0) {
					fprintf(stderr, PROG " formats: unknown format '%.*s'\n", (int)len, p);
					return 2;
				}
				c.fmt_mask |= 1u << f;
				p += len + (p[len] == ',');
			}
		} else if (!strcmp(argv[i], "--isa")) {
			if (i + 1 >= argc) {
				fprintf(stderr, PROG " formats: --isa needs a value (portable or avx2)\n");
				return 2;
			}
			isa = argv[++i];
		} else if (!strncmp(argv[i], "--isa=", 6)) {
			isa = argv[i] + 6;
		} else {
			fprintf(stderr, PROG " formats: unknown option '%s' (see " PROG " --help)\n", argv[i]);
			return 2;
		}
		if (isa) {
			if (strcmp(isa, "portable") && strcmp(isa, "avx2")) {
				fprintf(stderr, PROG " formats: unknown ISA '%s' (portable or avx2)\n", isa);
				return 2;
			}
			if (kvq_cpu_set_isa(isa) < 0) {
				fprintf(stderr, PROG " formats: this CPU cannot run the %s path\n", isa);
				return 1;
			}
		}
	}

	np = sysconf(_SC_NPROCESSORS_ONLN);
	c.threads = np > 0 ? (unsigned)np : 1;
	detect_llc(&c);
	c.read_avx2 = cpu_has_avx2();
	if (c.quick) {
		c.ws_target = (double)c.llc;
		c.blocks_per_seq = 64;
		c.runs = MIN_RUNS;
		c.min_run_s = 0.02;
		c.budget_s = 0.0;
	} else {
		c.ws_target = 8.0 * (double)c.llc;
		c.blocks_per_seq = 256;   /* 8208 tokens: a common context length */
		c.runs = 5;
		c.min_run_s = 0.2;
		c.budget_s = 2.5;
	}

	for (unsigned gi = 0; gi < NGEOMS; gi++) {
		if (plan_geometry(&geoms[gi], &c, &pl[gi]) < 0)
			return 1;
		if (pl[gi].max_step_bytes > max_step)
			max_step = pl[gi].max_step_bytes;
	}
	if (team_start(&team, c.threads) < 0) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	fprintf(stderr, PROG ": CPU kernels %s, %u threads, LLC %.0f MiB (%s)\n", kvq_cpu_isa(), c.threads,
		(double)c.llc / (1 << 20), c.llc_src);
	/* the read pass covers at least the largest decode working set */
	if (measure_memory(&team, &c, max_step > c.ws_target ? max_step : c.ws_target, &mem) < 0)
		goto fail;

	for (unsigned gi = 0; gi < NGEOMS; gi++) {
		const struct geom *g = &geoms[gi];
		double f16_bpt = 0.0;

		for (int f = 0; f < KVQ_FMT_COUNT; f++) {
			struct workload w;
			struct result *r;
			struct share sh = { 0 };
			double t0;

			if (c.fmt_mask && !(c.fmt_mask & (1u << f)) && f != KVQ_FMT_F16)
				continue;
			if (!fmt_fits(f, g->head_dim)) {
				snprintf(notes[nnotes++], sizeof notes[0],
					 "%s skipped for %s: its groups do not divide head dim %u", kvq_fmt_name(f),
					 g->name, g->head_dim);
				continue;
			}
			t0 = now_s();
			fprintf(stderr, PROG ": %s %s: preparing ...", g->name, kvq_fmt_name(f));
			if (workload_init(&w, g, f, &pl[gi]) < 0 || workload_check(&w) < 0) {
				workload_free(&w);
				goto fail;
			}
			r = &res[nres++];
			r->g = g;
			r->fmt = f;
			r->bpt = (double)w.L->sealed_block_bytes / BLOCK_TOKENS;
			r->bpt_layer = (double)w.L->layer[w.layer].sealed_slice / BLOCK_TOKENS;
			if (f == KVQ_FMT_F16)
				f16_bpt = r->bpt;
			r->ratio_f16 = r->bpt / f16_bpt;
			r->step_bytes = w.step_bytes;
			r->nseq = w.nseq;
			r->n = w.n;
			fprintf(stderr, " %.0f MiB, 1 thread ...", w.step_bytes / (1 << 20));
			/* workload_check's step was the warm-up */
			r->dec1 = measure(&team, 1, decode_job, &w, w.step_bytes, &c, 1, &sh);
			fprintf(stderr, " %.2f GB/s", r->dec1);
			if (c.threads > 1) {
				fprintf(stderr, ", %u threads ...", c.threads);
				r->decn = measure(&team, c.threads, decode_job, &w, w.step_bytes, &c, 1, &sh);
				fprintf(stderr, " %.2f GB/s", r->decn);
			} else {
				r->decn = r->dec1;
			}
			r->cpu_share = share_of(&sh);
			fprintf(stderr, " (%.1f s, CPU share %.0f%%)\n", now_s() - t0, 100.0 * r->cpu_share);
			if (w.err) {
				fprintf(stderr, PROG ": kvq_cpu_attention: %s\n", strerror(-w.err));
				workload_free(&w);
				goto fail;
			}
			workload_free(&w);
		}
	}
	team_stop(&team);
	fprintf(stderr, PROG ": done in %.1f s\n", now_s() - t_start);

	print_table(&c, &mem, pl, res, nres, notes, nnotes);
	if (c.json)
		print_json(&c, &mem, res, nres);
	return 0;

fail:
	team_stop(&team);
	return 1;
}

#ifdef KVQ_WITH_CUDA
int bench_decode(int argc, char **argv);   /* bench/decode.cu */
#else
static int bench_decode(int argc, char **argv)
{
	(void)argc;
	fprintf(stderr, PROG " %s: this kvq-bench was built without CUDA\n", argv[0]);
	return 1;
}
#endif

struct command {
	const char *name;
	int (*run)(int argc, char **argv);
};

static const struct command commands[] = {
	{ "formats", cmd_formats },
	{ "control", cmd_control },
	{ "decode", bench_decode },
	{ "prefill", bench_decode },
	{ "append", bench_decode },
};

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, PROG ": unknown command '%s' (known:", argv[1]);
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(stderr, " %s", commands[i].name);
	fprintf(stderr, ")\n");
	return 2;
}
