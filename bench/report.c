/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the report: the table with its header lines and the
 * checks against the size and bandwidth targets, and the JSON line after it
 * (--json; its keys are what tools and earlier results compare).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>

#include "bench.h"
#include "format.h"
#include "formats.h"
#include "memory.h"

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

/* The unrotated result of r's geometry and format when r is a "+rot" one. */
static const struct result *plain_of(const struct result *res, unsigned nres, const struct result *r)
{
	for (unsigned i = 0; r->rot && i < nres; i++)
		if (!res[i].rot && res[i].g == r->g && res[i].fmt == r->fmt)
			return &res[i];
	return NULL;
}

void print_table(const struct cfg *c, const struct membw *m, const struct plan *pl,
			const struct result *res, unsigned nres, char notes[][160], unsigned nnotes)
{
	printf("kvq-bench formats: CPU kernels %s, read pass %s, %u threads, B=%u tokens per block%s\n",
	       kvq_cpu_isa(), c->read_avx2 ? "avx2" : "portable", c->threads, BLOCK_TOKENS,
	       c->quick ? " (--quick: small working set, figures not meaningful)" : "");
	printf("last-level cache %.0f MiB (%s; sysconf %.0f MiB, sysfs %.0f MiB); %s\n",
	       (double)c->llc / (1 << 20), c->llc_src, (double)c->llc_sysconf / (1 << 20),
	       (double)c->llc_sysfs / (1 << 20), c->ws_why);
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
	printf("%-13s %-13s %9s %9s %7s %9s %9s %7s %7s %7s %7s %5s %5s %5s\n", "geometry", "format", "B/token",
	       "B/tok/lyr", "/f16", "KV MiB", "decode", "/read", "/fma", "1t", "/read1t", "cpu", "size", "bw");
	for (unsigned i = 0; i < nres; i++) {
		const struct result *r = &res[i];
		const char *sc = size_check(r), *bc = bw_check(r, m);
		char fr[16] = "-";

		if (m->fman > 0.0)
			snprintf(fr, sizeof fr, "%.3f", r->decn / fma_bound(r, m->fman));
		char name[24];

		snprintf(name, sizeof name, "%s%s", kvq_fmt_name(r->fmt), r->rot ? "+rot" : "");
		printf("%-13s %-13s %9.0f %9.2f %7.4f %9.1f %9.2f %7.3f %7s %7.2f %7.3f %4.0f%% %5s %5s\n",
		       r->g->name, name, r->bpt, r->bpt_layer, r->ratio_f16, r->step_bytes / (1 << 20),
		       r->decn, r->decn / m->readn, fr, r->dec1, r->dec1 / m->read1, 100.0 * r->cpu_share,
		       sc ? sc : "-", bc ? bc : "-");
	}
	for (unsigned i = 0; i < nres; i++) {
		const struct result *r = &res[i], *p = plain_of(res, nres, r);

		if (p)
			printf("rotation: %s %s+rot decodes at %.3f x the plain format's GB/s measured in turn "
			       "(%+.1f %% time; the table's rows: %.3f x, %.3f x with one thread)\n", r->g->name,
			       kvq_fmt_name(r->fmt), r->rot_ratio, 100.0 * (1.0 / r->rot_ratio - 1.0),
			       r->decn / p->decn, r->dec1 / p->dec1);
	}
	for (unsigned i = 0; i < nnotes; i++)
		printf("note: %s\n", notes[i]);
	printf("targets: size: /f16 <= 0.51 for int8 and fp8 at D=128 (0.52 at D=64), <= 0.32 kivi4, "
	       "<= 0.19 kivi2; bw: int8 decode >= %.1f x read-only pass (all threads)\n", BW_TARGET);
}

void print_json(const struct cfg *c, const struct membw *m, const struct result *res, unsigned nres)
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
		       "\"cpu_share\":%.3f,\"codebook_bytes\":%.0f",
		       i ? "," : "", kvq_fmt_name(r->fmt), r->g->name, r->bpt, r->ratio_f16, r->decn,
		       r->decn / m->readn, r->bpt_layer, r->dec1, r->dec1 / m->read1, c->threads, m->readn,
		       m->read1, m->copyn, m->copy1, r->step_bytes, r->nseq, r->n, kvq_cpu_isa(), r->cpu_share,
		       r->codebook_bytes);
		if (m->fman > 0.0) {
			double fb = fma_bound(r, m->fman);
			printf(",\"fma_gvec_per_s\":%.4f,\"fma_bound_gbps\":%.4f,\"ratio_to_fma_bound\":%.4f", m->fman,
			       fb, r->decn / fb);
		}
		if (r->rot) {
			const struct result *p = plain_of(res, nres, r);
			printf(",\"rot\":true");
			if (p)
				printf(",\"ratio_to_plain\":%.4f", r->rot_ratio);
		}
		if (sc)
			printf(",\"size_check\":\"%s\"", sc);
		if (bc)
			printf(",\"bw_check\":\"%s\"", bc);
		printf("}");
	}
	printf("]}\n");
}
