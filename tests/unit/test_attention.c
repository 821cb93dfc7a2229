/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq_cpu_attention, the paged attention over KV as stored.
 *
 * Each case fills a pool through kvq_cpu_write: several sequences with
 * shuffled, non-contiguous sealed and open slot ids, written in chunks (so
 * blocks are sealed both straight from the input and out of the open
 * window), random K/V with a few outlier tokens 50-100x larger.  The test
 * then decodes every stored value itself (tests/ref.h: sealed slices by the
 * format definitions, the open window as FP16/BF16) and computes causal GQA
 * attention in float64.  Both CPU paths (portable, avx2) must match that
 * within 1e-5 of max|ref| plus the rounding of the output dtype, and each
 * other; the only further allowance is the float32 conditioning of the
 * softmax itself, which matters only where outlier tokens with scores of a
 * few hundred compete (ref_attend).  Outputs are poisoned with NaN first, so
 * an element left unwritten fails.  Attention over the unquantized inputs is
 * computed too: its distance to the kernel's output is the cost of the
 * format, reported as a figure (with a loose sanity bound on data without
 * outliers).  A rotated layer ("+rot") stores K and V in the rotated basis:
 * the reference rotates q (K rotated; kvq_rotate, rounded to q's dtype,
 * or to the activation dtype for a float q, as cpu.h says) and its output
 * back (V rotated, in float64), the stored values as decoded; f16 and bf16
 * with rotation must also stay within the output's rounding of attention
 * over the inputs.
 * Bad inputs must return -EINVAL and leave the output untouched.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"
#include "../tap.h"
#include "../ref.h"

#define MAXSEQ 8
#define MAXLAYERS 2
#define TOL 1e-5

/* One case: a policy, a geometry and the dtypes of the call. */
struct tcase {
	const char *policy;
	uint32_t layers, H, g, D, B, rblocks;   /* g = q_heads / kv_heads, R = rblocks * B */
	int act, qdt, odt;
	int outliers;
	int figure;   /* same data for every format: the errors vs unquantized compare */
	int sink;     /* a pool with sink blocks: every sequence's block 0 in a sink slot */
};

struct seq {
	uint32_t n, n_q;
	int32_t *sealed;                        /* sealed id of block b < S(n)/B */
	int32_t *open;                          /* open id of every block b < ceil(n/B) */
	int32_t sink;                           /* sink id of block 0, or -1 (no sinks) */
	uint32_t *chunk, nchunk;                /* sizes of the successive writes */
	uint16_t *k[MAXLAYERS], *v[MAXLAYERS];  /* input [n][H][D], activation dtype */
	double *ks[MAXLAYERS], *vs[MAXLAYERS];  /* values as stored [H][n][D] */
	double *ki[MAXLAYERS], *vi[MAXLAYERS];  /* input values [H][n][D] */
};

static const char *const isas[2] = { "portable", "avx2" };
static int have_avx2;
static uint64_t figure_state;   /* rng state every figure case starts from */
static int pool_written;        /* cases where attention changed the pool */
static int write_failed;
static int sink_inexact;        /* values of a sink block not stored exactly */

/* Figures gathered for the summary at the end. */
struct figure {
	char name[80];
	double max_out, rms_out, max_in, rms_in;   /* with and without outlier tokens */
};
static struct figure figures[16];
static int nfigures;

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p) {
		diag("out of memory");
		abort();
	}
	return p;
}

static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(tap_rand() % n);
}

static void shuffle(int32_t *a, uint32_t n)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = rnd(i);
		int32_t t = a[i - 1];
		a[i - 1] = a[j];
		a[j] = t;
	}
}

static const char *dt_name(int dt)
{
	return dt == KVQ_DT_F32 ? "f32" : dt == KVQ_DT_BF16 ? "bf16" : "f16";
}

static void put_act(int dt, void *p, size_t i, float x)
{
	switch (dt) {
	case KVQ_DT_F16: ((uint16_t *)p)[i] = kvq_f16_from_f32(x); break;
	case KVQ_DT_BF16: ((uint16_t *)p)[i] = kvq_bf16_from_f32(x); break;
	default: ((float *)p)[i] = x; break;
	}
}

/* Half an ulp, relative, of the output dtype, and the absolute rounding
 * error of its subnormals: what storing the kernel's float result may add. */
static double out_unit(int dt)
{
	return dt == KVQ_DT_F16 ? ldexp(1, -11) : dt == KVQ_DT_BF16 ? ldexp(1, -8) : 0.0;
}

static double out_floor(int dt)
{
	return dt == KVQ_DT_F16 ? ldexp(1, -25) : dt == KVQ_DT_BF16 ? ldexp(1, -134) : 0.0;
}

/* Sequences of one case, chosen relative to the window R so every case
 * has: a long decode with a partly filled window, a prefill chunk whose
 * queries span sealed blocks and the window (more than 16 query rows, so
 * the kernel's row tiles are crossed), a sequence shorter than the window
 * (nothing sealed), a single token, a full window after sealed blocks, a
 * window at its minimum R - B + 1, a prefill from position 0, and exactly
 * R tokens (a full window, nothing sealed). */
static uint32_t plan_seqs(uint32_t B, uint32_t R, struct seq *s)
{
	const uint32_t n[] = { 2 * R + 3 * B + 5, R + 2 * B + 9, R - 3, 1, R + B, R + 1, R + 21, R };
	const uint32_t nq[] = { 1, R + 24, 5, 1, 3, 1, R + 21, 2 };
	uint32_t ns = sizeof n / sizeof n[0];

	memset(s, 0, sizeof(*s) * MAXSEQ);
	for (uint32_t i = 0; i < ns; i++) {
		s[i].n = n[i];
		s[i].n_q = nq[i] < n[i] ? nq[i] : n[i];
	}
	return ns;
}

/* Random K and V of one layer: normal values, and a few outlier tokens
 * (attention sinks, special tokens) 50-100x larger in K and V. */
static void gen_kv(const struct tcase *tc, struct seq *s, uint32_t layer, int act)
{
	size_t per = (size_t)tc->H * tc->D;

	s->k[layer] = xcalloc((size_t)s->n * per, 2);
	s->v[layer] = xcalloc((size_t)s->n * per, 2);
	for (uint32_t p = 0; p < s->n; p++) {
		float fk = 1.0f, fv = 1.0f;
		if (tc->outliers && rnd(23) == 0) {
			fk = (float)(75.0 + 25.0 * tap_uniform());
			fv = (float)(75.0 + 25.0 * tap_uniform());
		}
		for (size_t i = 0; i < per; i++) {
			put_act(act, s->k[layer], p * per + i, (float)tap_normal() * fk);
			put_act(act, s->v[layer], p * per + i, (float)tap_normal() * fv);
		}
	}
}

/* Write sizes: even sequences in one prefill (full blocks go straight to
 * sealed slots), odd ones as a prefill then appends of up to B + 5 tokens
 * (blocks are sealed out of the open window as it fills). */
static void plan_chunks(struct seq *s, uint32_t idx, uint32_t B)
{
	uint32_t done;

	s->chunk = xcalloc(s->n, sizeof *s->chunk);
	s->nchunk = 0;
	if (idx % 2 == 0) {
		s->chunk[s->nchunk++] = s->n;
		return;
	}
	done = 1 + rnd(s->n);
	s->chunk[s->nchunk++] = done;
	while (done < s->n) {
		uint32_t m = 1 + rnd(B + 5);
		if (m > s->n - done)
			m = s->n - done;
		s->chunk[s->nchunk++] = m;
		done += m;
	}
}

static int write_seq(const struct kvq_layout *L, void *base, uint32_t layer, const struct seq *s)
{
	size_t row = (size_t)L->kv_heads * L->head_dim;
	uint32_t done = 0;

	for (uint32_t c = 0; c < s->nchunk; c++) {
		struct kvq_seq_table w = {
			.n = done,
			.m = s->chunk[c],
			.sink = (uint32_t)(s->sink + 1),
			.sealed = s->sealed,
			.open = s->open + kvq_layout_split(L, done) / L->block_tokens,
		};
		int rc = kvq_cpu_write(L, base, layer, &w, s->k[layer] + done * row, s->v[layer] + done * row);
		if (rc < 0)
			return rc;
		done += s->chunk[c];
	}
	return 0;
}

/* Value of K or V (head h, position p, dim d) as the pool stores it,
 * decoded by the test's own code. */
static double stored_value(const struct kvq_layout *L, const uint8_t *base, uint32_t layer,
			   const struct seq *s, int is_v, uint32_t h, uint32_t p, uint32_t d)
{
	uint32_t B = L->block_tokens, blk = p / B;
	const uint8_t *x;

	if (blk == 0 && s->sink >= 0) {
		x = base + kvq_layout_off(L, KVQ_SINK, (uint32_t)s->sink, layer, h, is_v ? KVQ_V_CODES : KVQ_K_CODES);
		return ref_act(L->act, x, (size_t)p * L->head_dim + d);
	}
	if (p < kvq_layout_split(L, s->n)) {
		x = base + kvq_layout_off(L, KVQ_SEALED, (uint32_t)s->sealed[blk], layer, h, KVQ_K_CODES) -
		    L->layer[layer].off[KVQ_K_CODES];
		return ref_sealed_value(L, layer, x, is_v, p % B, d);
	}
	x = base + kvq_layout_off(L, KVQ_OPEN, (uint32_t)s->open[blk], layer, h, is_v ? KVQ_V_CODES : KVQ_K_CODES);
	return ref_act(L->act, x, (size_t)(p % B) * L->head_dim + d);
}

static void decode_seq(const struct kvq_layout *L, const uint8_t *base, uint32_t layer, struct seq *s)
{
	uint32_t H = L->kv_heads, D = L->head_dim;
	size_t sz = (size_t)H * s->n * D;

	s->ks[layer] = xcalloc(sz, sizeof(double));
	s->vs[layer] = xcalloc(sz, sizeof(double));
	s->ki[layer] = xcalloc(sz, sizeof(double));
	s->vi[layer] = xcalloc(sz, sizeof(double));
	for (uint32_t h = 0; h < H; h++)
		for (uint32_t p = 0; p < s->n; p++)
			for (uint32_t d = 0; d < D; d++) {
				size_t i = ((size_t)h * s->n + p) * D + d, j = ((size_t)p * H + h) * D + d;
				s->ks[layer][i] = stored_value(L, base, layer, s, 0, h, p, d);
				s->vs[layer][i] = stored_value(L, base, layer, s, 1, h, p, d);
				s->ki[layer][i] = ref_act(L->act, s->k[layer], j);
				s->vi[layer][i] = ref_act(L->act, s->v[layer], j);
				/* a sink block holds its tokens exactly (as rotated) */
				if (s->sink >= 0 && p < L->block_tokens && !L->layer[layer].rot &&
				    (s->ks[layer][i] != s->ki[layer][i] || s->vs[layer][i] != s->vi[layer][i]))
					sink_inexact++;
			}
}

/*
 * Causal GQA attention of one sequence in float64: q [n_q][QH][D] -> o;
 * query i sits at position n - n_q + i, q head hq reads KV head hq / g.
 *
 * cond (may be NULL) gets, per output element, how far any float32 kernel
 * can be off because of the conditioning of the softmax alone: a score s_t
 * computed in float32 is off by up to u ((D + 2) scale sum_d |q_d k_td| +
 * |s_t - max| + 4) (dot product, subtraction of the max, exp), and an error
 * ds_t in s_t moves o_d by p_t (v_td - o_d) ds_t.  With ordinary values this
 * is far below TOL * max|ref|; where two outlier tokens with scores of a few
 * hundred compete it is not, and no float32 kernel does better there.
 */
static void ref_attend(const double *K, const double *V, uint32_t n, uint32_t n_q, uint32_t H,
		       uint32_t QH, uint32_t D, double scale, const double *q, double *o, double *cond,
		       double *w, double *ds)
{
	const double u = ldexp(1, -24);
	uint32_t g = QH / H;

	for (uint32_t i = 0; i < n_q; i++) {
		uint32_t pos = n - n_q + i;
		for (uint32_t hq = 0; hq < QH; hq++) {
			const double *qv = q + ((size_t)i * QH + hq) * D;
			const double *Kh = K + (size_t)(hq / g) * n * D, *Vh = V + (size_t)(hq / g) * n * D;
			double *ov = o + ((size_t)i * QH + hq) * D, *cv;
			double m = -INFINITY, sum = 0.0;

			for (uint32_t t = 0; t <= pos; t++) {
				double dot = 0.0, mag = 0.0;
				for (uint32_t d = 0; d < D; d++) {
					dot += qv[d] * Kh[(size_t)t * D + d];
					mag += fabs(qv[d] * Kh[(size_t)t * D + d]);
				}
				w[t] = scale * dot;
				ds[t] = (D + 2) * scale * mag;
				m = fmax(m, w[t]);
			}
			for (uint32_t d = 0; d < D; d++)
				ov[d] = 0.0;
			for (uint32_t t = 0; t <= pos; t++) {
				ds[t] = u * (ds[t] + fabs(w[t] - m) + 4.0);
				w[t] = exp(w[t] - m);
				sum += w[t];
				for (uint32_t d = 0; d < D; d++)
					ov[d] += w[t] * Vh[(size_t)t * D + d];
			}
			for (uint32_t d = 0; d < D; d++)
				ov[d] /= sum;
			if (!cond)
				continue;
			cv = cond + ((size_t)i * QH + hq) * D;
			for (uint32_t d = 0; d < D; d++)
				cv[d] = 0.0;
			for (uint32_t t = 0; t <= pos; t++)
				for (uint32_t d = 0; d < D; d++)
					cv[d] += w[t] * ds[t] * fabs(Vh[(size_t)t * D + d] - ov[d]);
			for (uint32_t d = 0; d < D; d++)
				cv[d] /= sum;
		}
	}
}

static double max_abs(const double *x, size_t n)
{
	double m = 0.0;

	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs(x[i]));
	return m;
}

/* Elements of out that miss ref by more than TOL * M, plus the softmax's
 * conditioning in float32 (cond), plus what rounding to the output dtype
 * may add (NaN, i.e. unwritten poison, always misses).  *ret_rel gets
 * max |out - ref| / M, *ret_plain how many elements miss the plain
 * TOL * M (+ rounding) bound, i.e. needed the conditioning allowance. */
static size_t check_out(int odt, const void *out, const double *ref, const double *cond, size_t count,
			double M, double *ret_rel, size_t *ret_plain)
{
	double u = out_unit(odt), fl = out_floor(odt), worst = 0.0;
	size_t bad = 0, plain = 0;

	for (size_t i = 0; i < count; i++) {
		double o = ref_act(odt, out, i), e = fabs(o - ref[i]);
		double b = TOL * M * (1.0 + u) + u * fabs(ref[i]) + fl;
		if (!(e <= b + cond[i] * (1.0 + u)))
			bad++;
		if (!(e <= b))
			plain++;
		worst = isnan(e) ? INFINITY : fmax(worst, e);
	}
	*ret_rel = worst / M;
	*ret_plain = plain;
	return bad;
}

/* Elements where the two paths differ by more than TOL * M plus two output
 * roundings (each path may round its own float result either way) plus the
 * conditioning allowance of each. */
static size_t check_agree(int odt, const void *a, const void *b, const double *ref, const double *cond,
			  size_t count, double M, double *ret_rel)
{
	double u = out_unit(odt), fl = out_floor(odt), worst = 0.0;
	size_t bad = 0;

	for (size_t i = 0; i < count; i++) {
		double e = fabs(ref_act(odt, a, i) - ref_act(odt, b, i));
		if (!(e <= TOL * M + 2.0 * u * (fabs(ref[i]) + TOL * M + cond[i]) + 2.0 * fl + 2.0 * cond[i]))
			bad++;
		worst = isnan(e) ? INFINITY : fmax(worst, e);
	}
	*ret_rel = worst / M;
	return bad;
}

/* Loose bound on the distance to attention over unquantized inputs: the
 * sanity of the figure, by the coarser of the layer's K and V formats. */
static double quality_bound(int f)
{
	switch (f) {
	case KVQ_FMT_F16: case KVQ_FMT_BF16: return 0.01;
	case KVQ_FMT_INT8: return 0.05;
	case KVQ_FMT_FP8: return 0.1;        /* 3 mantissa bits */
	case KVQ_FMT_FP8E5M2: return 0.2;    /* 2 mantissa bits */
	case KVQ_FMT_KIVI2: return 1.0;      /* 2 bits: up to about 0.6 seen */
	default: return 0.25;                /* 4-bit */
	}
}

static void note_figure(const struct tcase *tc, uint32_t layer, const char *fmtname, double mx, double rms)
{
	char name[80];
	struct figure *f = NULL;

	snprintf(name, sizeof name, "%s%s", fmtname, tc->layers > 1 ? (layer ? " (layer 1)" : " (layer 0)") : "");
	for (int i = 0; i < nfigures; i++)
		if (!strcmp(figures[i].name, name))
			f = &figures[i];
	if (!f) {
		if (nfigures == (int)(sizeof figures / sizeof figures[0]))
			return;
		f = &figures[nfigures++];
		memset(f, 0, sizeof *f);
		snprintf(f->name, sizeof f->name, "%s", name);
	}
	if (tc->outliers) {
		f->max_out = mx;
		f->rms_out = rms;
	} else {
		f->max_in = mx;
		f->rms_in = rms;
	}
}

static void run_case(const struct tcase *tc)
{
	char name[200], err[200], pname[64];
	struct kvq_policy pol;
	struct kvq_layout *L = NULL;
	struct seq seqs[MAXSEQ];
	struct kvq_seq_table aseq[MAXSEQ];
	uint32_t B = tc->B, D = tc->D, H = tc->H, R = tc->rblocks * B, QH = H * tc->g;
	uint32_t ns, nsealed = 0, nopen = 0, nq = 0, maxn = 0;
	int32_t *sids, *oids;
	uint8_t *base, *snap;
	void *q, *out[2];
	double *qd, *qrot, *ref_st, *ref_in, *cond, *w, *ds;
	size_t nout, obytes;
	uint64_t saved = tap_rng_state;
	float scale = 1.0f / sqrtf((float)D);
	int rc;

	if (tc->figure)
		tap_rng_state = figure_state;   /* identical data for every format */
	snprintf(name, sizeof name, "%s%s%s H=%u g=%u D=%u B=%u R=%u act=%s q=%s out=%s", tc->policy,
		 tc->outliers ? "" : " (no outliers)", tc->sink ? " sink" : "", H, tc->g, D, B, R, dt_name(tc->act), dt_name(tc->qdt),
		 dt_name(tc->odt));
	if (kvq_policy_parse(tc->policy, tc->layers, &pol, err, sizeof err) < 0) {
		ok(0, "%s: policy parses (%s)", name, err);
		return;
	}
	ns = plan_seqs(B, R, seqs);
	for (uint32_t i = 0; i < ns; i++) {
		nsealed += seqs[i].n <= R ? 0 : (seqs[i].n - R + B - 1) / B;
		nopen += (seqs[i].n + B - 1) / B;
		nq += seqs[i].n_q;
		maxn = seqs[i].n > maxn ? seqs[i].n : maxn;
	}
	/* spare slots, so the ids in use are a sparse, shuffled subset */
	nsealed += 5;
	nopen += 5;
	{
		struct kvq_layout_params lp = {
			.layers = tc->layers, .kv_heads = H, .head_dim = D, .block_tokens = B,
			.window = R, .n_sealed = nsealed, .n_open = nopen, .act = tc->act, .policy = &pol,
			.sink_blocks = tc->sink ? 1 : 0, .n_sink = tc->sink ? ns + 3 : 0,
		};
		rc = kvq_layout_new(&lp, &L, err, sizeof err);
	}
	if (rc < 0) {
		ok(0, "%s: layout (%s)", name, err);
		return;
	}
	/* calloc'd like a fresh pool, then junk: a read of a slot or a row the
	 * sequence does not own (or past its last token) must change the result */
	base = xcalloc(1, L->total_bytes);
	memset(base, 0x47, L->total_bytes);

	sids = xcalloc(nsealed, sizeof *sids);
	oids = xcalloc(nopen, sizeof *oids);
	for (uint32_t i = 0; i < nsealed; i++)
		sids[i] = (int32_t)i;
	for (uint32_t i = 0; i < nopen; i++)
		oids[i] = (int32_t)i;
	shuffle(sids, nsealed);
	shuffle(oids, nopen);
	{
		uint32_t si = 0, oi = 0;
		for (uint32_t i = 0; i < ns; i++) {
			struct seq *s = &seqs[i];
			uint32_t nb = (s->n + B - 1) / B, nsb = kvq_layout_split(L, s->n) / B;
			s->sealed = xcalloc(nb, sizeof *s->sealed);
			s->open = xcalloc(nb, sizeof *s->open);
			for (uint32_t b = 0; b < nb; b++) {
				s->sealed[b] = b < nsb ? sids[si++] : -1;
				s->open[b] = oids[oi++];
			}
			/* block 0's entries are never read with a sink: -1 fails if they were */
			s->sink = tc->sink ? (int32_t)(L->n_sink - 1 - i) : -1;
			if (tc->sink)
				s->sealed[0] = s->open[0] = -1;
			plan_chunks(s, i, B);
		}
	}
	for (uint32_t l = 0; l < tc->layers; l++)
		for (uint32_t i = 0; i < ns; i++) {
			gen_kv(tc, &seqs[i], l, tc->act);
			if (write_seq(L, base, l, &seqs[i]) < 0) {
				diag("%s: kvq_cpu_write failed for sequence %u layer %u", name, i, l);
				write_failed++;
			}
			decode_seq(L, base, l, &seqs[i]);
		}

	nout = (size_t)nq * QH * D;
	obytes = nout * kvq_dtype_bytes(tc->odt);
	q = xcalloc(nout, kvq_dtype_bytes(tc->qdt));
	qd = xcalloc(nout, sizeof *qd);
	qrot = xcalloc(nout, sizeof *qrot);
	for (size_t i = 0; i < nout; i++) {
		put_act(tc->qdt, q, i, (float)tap_normal());
		qd[i] = ref_act(tc->qdt, q, i);
	}
	out[0] = xcalloc(1, obytes);
	out[1] = xcalloc(1, obytes);
	ref_st = xcalloc(nout, sizeof *ref_st);
	ref_in = xcalloc(nout, sizeof *ref_in);
	cond = xcalloc(nout, sizeof *cond);
	w = xcalloc(maxn, sizeof *w);
	ds = xcalloc(maxn, sizeof *ds);
	snap = xcalloc(1, L->total_bytes);
	memcpy(snap, base, L->total_bytes);

	for (uint32_t i = 0, row = 0; i < ns; row += seqs[i].n_q, i++) {
		aseq[i] = (struct kvq_seq_table){ .n = seqs[i].n, .m = seqs[i].n_q, .row0 = row,
						  .sink = (uint32_t)(seqs[i].sink + 1) };
		/* nothing sealed: an empty list may be NULL */
		aseq[i].sealed = kvq_layout_split(L, seqs[i].n) ? seqs[i].sealed : NULL;
		aseq[i].open = seqs[i].open + kvq_layout_split(L, seqs[i].n) / B;
	}

	for (uint32_t l = 0; l < tc->layers; l++) {
		struct kvq_attn a = {
			.L = L, .base = base, .layer = l, .q_heads = QH, .scale = scale,
			.q_dtype = tc->qdt, .out_dtype = tc->odt,
		};
		int kf = L->layer[l].kfmt, vf = L->layer[l].vfmt;
		double M, Min, rel[2] = { 0, 0 }, agree, qmax = 0.0, qsq = 0.0, rsq = 0.0, qb;
		size_t bad[2] = { 0, 0 }, plain[2] = { 0, 0 }, off = 0, nbad;
		int rcs[2] = { 0, 0 }, ran[2] = { 0, 0 };

		/* stored values are in the rotated basis of a rotated part; q
		 * rotated (kvq_rotate, checked against float64 by test_write),
		 * then rounded as cpu.h says */
		memcpy(qrot, qd, nout * sizeof *qd);
		if (L->layer[l].rot & KVQ_ROT_K)
			for (size_t r = 0; r < nout / D; r++) {
				float x[KVQ_MAX_HEAD_DIM];
				for (uint32_t d = 0; d < D; d++)
					x[d] = (float)qd[r * D + d];
				kvq_rotate(x, D, kvq_rot_block(D, 0));
				const int rd = tc->qdt == KVQ_DT_F32 ? tc->act : tc->qdt;
				for (uint32_t d = 0; d < D; d++)
					qrot[r * D + d] = rd == KVQ_DT_BF16 ? kvq_bf16_to_f32(kvq_bf16_from_f32(x[d]))
									    : kvq_f16_to_f32(kvq_f16_from_f32(x[d]));
			}
		for (uint32_t i = 0; i < ns; i++) {
			ref_attend(seqs[i].ks[l], seqs[i].vs[l], seqs[i].n, seqs[i].n_q, H, QH, D, scale,
				   qrot + off, ref_st + off, cond + off, w, ds);
			ref_attend(seqs[i].ki[l], seqs[i].vi[l], seqs[i].n, seqs[i].n_q, H, QH, D, scale,
				   qd + off, ref_in + off, NULL, w, ds);
			off += (size_t)seqs[i].n_q * QH * D;
		}
		if (L->layer[l].rot & KVQ_ROT_V)
			ref_rotate(ref_st, nout / D, D, kvq_rot_block(D, 1));
		M = max_abs(ref_st, nout);
		Min = max_abs(ref_in, nout);

		for (int p = 0; p < 2; p++) {
			if (p == 1 && !have_avx2)
				continue;
			kvq_cpu_set_isa(isas[p]);
			memset(out[p], 0xff, obytes);   /* NaN in every dtype */
			rcs[p] = kvq_cpu_attention(&a, aseq, ns, q, out[p]);
			bad[p] = check_out(tc->odt, out[p], ref_st, cond, nout, M, &rel[p], &plain[p]);
			ran[p] = 1;
			/* without outlier tokens the plain bound of the issue holds:
			 * ||o - ref||inf <= 1e-5 ||ref||inf (+ output rounding) */
			ok(rcs[p] == 0 && bad[p] == 0 && (tc->outliers || plain[p] == 0),
			   "%s layer %u [%s]: rc %d, %zu of %zu outputs off (%zu beyond the plain bound); "
			   "max|o-ref|/max|ref| = %.2e", name, l, isas[p], rcs[p], bad[p], nout, plain[p], rel[p]);
			if (plain[p])
				diag("  %zu outputs beyond %g max|ref| but within the float32 conditioning of "
				     "their softmax (competing outlier tokens)", plain[p], TOL);
		}
		if (ran[1]) {
			nbad = check_agree(tc->odt, out[0], out[1], ref_st, cond, nout, M, &agree);
			ok(nbad == 0, "%s layer %u: avx2 and portable agree (%zu off; max diff/max|ref| = %.2e)",
			   name, l, nbad, agree);
		}

		/* cost of the format: the kernel's output against attention over
		 * the unquantized inputs (portable path) */
		for (size_t i = 0; i < nout; i++) {
			double e = ref_act(tc->odt, out[0], i) - ref_in[i];
			qmax = isnan(e) ? INFINITY : fmax(qmax, fabs(e));
			qsq += e * e;
			rsq += ref_in[i] * ref_in[i];
		}
		qb = fmax(quality_bound(kf), quality_bound(vf));
		const uint32_t rot = L->layer[l].rot;
		snprintf(pname, sizeof pname, "k=%s%s,v=%s%s", kvq_fmt_name(kf), rot & KVQ_ROT_K ? "+rot" : "",
			 kvq_fmt_name(vf), rot & KVQ_ROT_V ? "+rot" : "");
		/* with outlier tokens the scores reach a few hundred and the
		 * softmax can flip between two outliers: a figure, no bound */
		if (tc->outliers)
			diag("%s layer %u: vs unquantized input (%s): max %.3e, rms %.3e", name, l, pname,
			     qmax / Min, sqrt(qsq / rsq));
		else
			ok(qmax / Min < qb, "%s layer %u: vs unquantized input (%s): max %.3e, rms %.3e (sanity bound %g)",
			   name, l, pname, qmax / Min, sqrt(qsq / rsq), qb);
		if (tc->figure)
			note_figure(tc, l, kf == vf && !rot ? kvq_fmt_name(kf) : pname, qmax / Min, sqrt(qsq / rsq));
	}
	if (memcmp(snap, base, L->total_bytes)) {
		diag("%s: attention changed the pool", name);
		pool_written++;
	}

	for (uint32_t i = 0; i < ns; i++) {
		free(seqs[i].sealed);
		free(seqs[i].open);
		free(seqs[i].chunk);
		for (uint32_t l = 0; l < tc->layers; l++) {
			free(seqs[i].k[l]);
			free(seqs[i].v[l]);
			free(seqs[i].ks[l]);
			free(seqs[i].vs[l]);
			free(seqs[i].ki[l]);
			free(seqs[i].vi[l]);
		}
	}
	free(sids);
	free(oids);
	free(q);
	free(qd);
	free(qrot);
	free(out[0]);
	free(out[1]);
	free(ref_st);
	free(ref_in);
	free(cond);
	free(w);
	free(ds);
	free(snap);
	free(base);
	kvq_layout_free(L);
	if (tc->figure)
		tap_rng_state = saved;
}

/* Bad input must fail as a whole before anything is written: the bad
 * sequence comes second, after a good one. */
static void expect_einval(const char *what, const struct kvq_attn *a, const struct kvq_seq_table *seqs,
			  uint32_t nseq, const void *q, uint8_t *out, size_t obytes)
{
	size_t touched = 0;
	int rc;

	memset(out, 0xff, obytes);
	rc = kvq_cpu_attention(a, seqs, nseq, q, out);
	for (size_t i = 0; i < obytes; i++)
		touched += out[i] != 0xff;
	ok(rc == -EINVAL && touched == 0, "bad input (%s): -EINVAL (got %d), output untouched (%zu bytes changed)",
	   what, rc, touched);
}

static void test_bad_input(void)
{
	enum { H = 2, D = 64, B = 16, NS = 4, NO = 4, N = 40 };
	struct kvq_policy pol;
	struct kvq_layout *L;
	struct kvq_layout_params lp = {
		.layers = 1, .kv_heads = H, .head_dim = D, .block_tokens = B, .window = B,
		.n_sealed = NS, .n_open = NO, .act = KVQ_DT_F16, .policy = &pol,
	};
	/* N = 40 with R = B: blocks 0, 1 sealed, block 2 open */
	int32_t sealed[2] = { 3, 1 }, open[3] = { 2, 0, 3 }, bad_ids[2];
	uint16_t *k, *v;
	float *q;
	uint8_t *base, *out;
	size_t qrows = 2 * 8, obytes = qrows * (2 * H + 1) * D * sizeof(float), touched = 0;
	struct kvq_seq_table wr = { .n = 0, .m = N, .sealed = sealed, .open = open };
	struct kvq_seq_table seqs[2] = {
		{ .n = N, .m = 4, .row0 = 0, .sealed = sealed, .open = open + 2 },
		{ .n = N, .m = 4, .row0 = 4, .sealed = sealed, .open = open + 2 },
	};
	struct kvq_attn a;
	char err[200];
	int rc;

	if (kvq_policy_parse("int8", 1, &pol, err, sizeof err) < 0 || kvq_layout_new(&lp, &L, err, sizeof err) < 0) {
		ok(0, "bad input: setup (%s)", err);
		return;
	}
	base = xcalloc(1, L->total_bytes);
	k = xcalloc((size_t)N * H * D, 2);
	v = xcalloc((size_t)N * H * D, 2);
	q = xcalloc(qrows * (2 * H + 1) * D, sizeof *q);
	out = xcalloc(1, obytes);
	for (size_t i = 0; i < (size_t)N * H * D; i++) {
		k[i] = kvq_f16_from_f32((float)tap_normal());
		v[i] = kvq_f16_from_f32((float)tap_normal());
	}
	for (size_t i = 0; i < qrows * (2 * H + 1) * D; i++)
		q[i] = (float)tap_normal();
	rc = kvq_cpu_write(L, base, 0, &wr, k, v);

	a = (struct kvq_attn){ .L = L, .base = base, .layer = 0, .q_heads = 2 * H, .scale = 0.125f,
			       .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	/* control: the same call with good input writes every output */
	memset(out, 0xff, obytes);
	rc = rc < 0 ? rc : kvq_cpu_attention(&a, seqs, 2, q, out);
	for (size_t i = 0; i < 2 * 4 * 2 * H * D; i++) {
		float x;
		memcpy(&x, out + i * sizeof x, sizeof x);
		touched += !isnan(x);
	}
	ok(rc == 0 && touched == 2 * 4 * 2 * H * D,
	   "bad input control: good input returns 0 (got %d) and writes every output (%zu of %d)", rc, touched,
	   2 * 4 * 2 * H * D);

	a.q_heads = 2 * H + 1;
	expect_einval("q_heads 5 not a multiple of kv_heads 2", &a, seqs, 2, q, out, obytes);
	a.q_heads = 0;
	expect_einval("q_heads 0", &a, seqs, 2, q, out, obytes);
	a.q_heads = 2 * H;
	a.layer = 1;
	expect_einval("layer 1 of 1", &a, seqs, 2, q, out, obytes);
	a.layer = 0;
	a.q_dtype = KVQ_DT_F32 + 1;
	expect_einval("q dtype out of range", &a, seqs, 2, q, out, obytes);
	a.q_dtype = KVQ_DT_F32;
	a.out_dtype = -1;
	expect_einval("out dtype out of range", &a, seqs, 2, q, out, obytes);
	a.out_dtype = KVQ_DT_F32;

	seqs[1] = (struct kvq_seq_table){ .n = 5, .m = 6, .sealed = NULL, .open = open };
	expect_einval("n_q 6 > n 5", &a, seqs, 2, q, out, obytes);
	seqs[1] = (struct kvq_seq_table){ .n = 0, .m = 0, .sealed = NULL, .open = open };
	expect_einval("n 0, n_q 0", &a, seqs, 2, q, out, obytes);
	seqs[1] = (struct kvq_seq_table){ .n = 0, .m = 1, .sealed = NULL, .open = open };
	expect_einval("n 0, n_q 1", &a, seqs, 2, q, out, obytes);

	seqs[1] = (struct kvq_seq_table){ .n = N, .m = 1, .sealed = bad_ids, .open = open + 2 };
	bad_ids[0] = 3;
	bad_ids[1] = NS;
	expect_einval("sealed id = n_sealed", &a, seqs, 2, q, out, obytes);
	bad_ids[0] = -1;
	bad_ids[1] = 1;
	expect_einval("sealed id -1", &a, seqs, 2, q, out, obytes);
	seqs[1] = (struct kvq_seq_table){ .n = N, .m = 1, .sealed = sealed, .open = bad_ids };
	bad_ids[0] = NO;
	expect_einval("open id = n_open", &a, seqs, 2, q, out, obytes);
	bad_ids[0] = -1;
	expect_einval("open id -1", &a, seqs, 2, q, out, obytes);
	/* a sequence within one window: its only open id is checked too */
	seqs[1] = (struct kvq_seq_table){ .n = 7, .m = 7, .sealed = NULL, .open = bad_ids };
	bad_ids[0] = NO + 100;
	expect_einval("open id out of range, nothing sealed", &a, seqs, 2, q, out, obytes);

	free(k);
	free(v);
	free(q);
	free(out);
	free(base);
	kvq_layout_free(L);
}

#define F16 KVQ_DT_F16
#define BF16 KVQ_DT_BF16
#define F32 KVQ_DT_F32

int main(void)
{
	/* every format and policy on one geometry with the same data (so the
	 * figures compare), with and without outlier tokens */
	static const char *const sweep[] = {
		"f16", "bf16", "int8", "fp8", "fp8e5m2", "int4g32", "int4g64", "int4g128",
		"kivi4", "kivi2", "k=int8,v=int4g32", "0:int8;1:kivi2", "int4g32+rot", "kivi2+rot",
	};
	/* geometries, GQA ratios, windows and dtypes: every (q, out) dtype
	 * pair, g in {1, 3, 4, 8}, D in {64, 128}, B in {16, 32}, R in {B, 4B} */
	static const struct tcase geo[] = {
		{ "int8",             1, 2, 1, 64,  16, 1, F16,  F32,  F32,  1, 0, 0 },
		{ "fp8",              1, 2, 3, 128, 16, 1, BF16, F16,  F32,  0, 0, 0 },
		{ "int4g32",          1, 2, 4, 64,  32, 1, F16,  BF16, F16,  1, 0, 0 },
		{ "kivi4",            1, 1, 8, 128, 16, 4, F16,  F32,  BF16, 1, 0, 0 },
		{ "kivi2",            1, 2, 3, 64,  32, 4, BF16, F32,  F16,  0, 0, 0 },
		{ "int4g64",          1, 3, 4, 128, 32, 1, BF16, F16,  F16,  1, 0, 0 },
		{ "fp8e5m2",          1, 2, 8, 64,  16, 4, F16,  BF16, BF16, 1, 0, 0 },
		{ "bf16",             1, 4, 1, 128, 16, 4, BF16, F32,  BF16, 1, 0, 0 },
		{ "int4g128",         1, 1, 3, 128, 16, 1, F16,  F16,  BF16, 0, 0, 0 },
		{ "f16",              1, 2, 4, 64,  16, 4, BF16, BF16, F32,  1, 0, 0 },
		{ "k=int8,v=int4g32", 1, 2, 8, 128, 32, 1, BF16, F16,  F32,  1, 0, 0 },
		{ "0:int8;1:kivi2",   2, 1, 4, 64,  16, 4, F16,  F32,  F16,  1, 0, 0 },
		{ "k=kivi2,v=int8",   1, 2, 1, 128, 32, 4, F16,  F32,  F32,  1, 0, 0 },
		/* g = 3 with B = 32: the vector path's three-row K and V loops */
		{ "int8",             1, 3, 3, 64,  32, 1, F16,  F32,  F32,  1, 0, 0 },
		{ "fp8",              1, 2, 3, 128, 32, 4, BF16, F16,  BF16, 1, 0, 0 },
		{ "k=bf16,v=fp8e5m2", 1, 1, 3, 64,  32, 1, BF16, BF16, F32,  0, 0, 0 },
		{ "k=int8,v=f16",     1, 2, 3, 128, 32, 1, F16,  F32,  F16,  1, 0, 0 },
		/* rotation: f16 and bf16 to rounding, K or V alone, per layer,
		 * V's 64-element blocks at D = 128 */
		{ "f16+rot",          1, 2, 4, 128, 16, 1, F16,  F32,  F32,  0, 0, 0 },
		{ "bf16+rot",         1, 2, 3, 64,  32, 4, BF16, BF16, F32,  0, 0, 0 },
		{ "k=int8+rot,v=kivi2", 1, 2, 3, 64, 32, 4, BF16, F32, F16,  1, 0, 0 },
		{ "0:k=kivi4+rot,v=kivi4;1:k=int8,v=int4g32+rot", 2, 2, 8, 128, 32, 4, F16, F16, F32, 1, 0, 0 },
		/* sink blocks: block 0 exact in a sink slot, read as an open block
		 * wherever the split puts it, with each window, rotation, bf16 */
		{ "int4g32",          1, 2, 4, 64,  16, 1, F16,  F32,  F32,  1, 0, 1 },
		{ "kivi2",            1, 2, 3, 128, 32, 4, BF16, F16,  F32,  1, 0, 1 },
		{ "int4g64+rot",      1, 2, 8, 128, 16, 1, F16,  BF16, F16,  1, 0, 1 },
		{ "0:int8;1:kivi4",   2, 1, 4, 64,  16, 4, F16,  F32,  F32,  1, 0, 1 },
	};
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	tap_seed();
	figure_state = tap_rand() | 1;

	have_avx2 = kvq_cpu_set_isa("avx2") == 0;
	if (have_avx2)
		ok(!strcmp(kvq_cpu_isa(), "avx2"), "kvq_cpu_set_isa(\"avx2\") selects the avx2 path (%s)", kvq_cpu_isa());
	else
		diag("avx2 path not available (-ENOTSUP): only the portable path is tested");
	ok(kvq_cpu_set_isa("portable") == 0 && !strcmp(kvq_cpu_isa(), "portable"),
	   "kvq_cpu_set_isa(\"portable\") selects the portable path");

	for (int outl = 1; outl >= 0; outl--)
		for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++) {
			struct tcase tc = { sweep[i], strchr(sweep[i], ':') ? 2 : 1, 2, 4, 128, 16, 1,
					    F16, F32, F32, outl, 1, 0 };
			run_case(&tc);
		}
	for (size_t i = 0; i < sizeof geo / sizeof geo[0]; i++)
		run_case(&geo[i]);
	ok(write_failed == 0, "kvq_cpu_write accepted every write that fills the pools (%d failed)", write_failed);
	ok(pool_written == 0, "attention never changes the pool (%d cases did)", pool_written);
	ok(sink_inexact == 0, "sink blocks hold their tokens exactly (%d values differ)", sink_inexact);

	test_bad_input();
	kvq_cpu_set_isa("auto");

	diag("error vs attention over unquantized inputs (H=2 g=4 D=128 B=16 R=B, q/out f32), max|o-ref_in|/max|ref_in| and rms:");
	for (int i = 0; i < nfigures; i++)
		diag("  %-22s  outliers: max %.2e rms %.2e   no outliers: max %.2e rms %.2e", figures[i].name,
		     figures[i].max_out, figures[i].rms_out, figures[i].max_in, figures[i].rms_in);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	diag("run time %.2f s", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	return done_testing();
}
