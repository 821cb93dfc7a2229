/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the types its files share: the run's configuration and
 * geometries (bench/formats.c), the decode workload (bench/workload.c) and
 * the report (bench/report.c); the thread team and its timing loop have
 * bench/team.h, the memory passes bench/memory.h.
 */
#ifndef KVQ_BENCH_FORMATS_H
#define KVQ_BENCH_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu.h"
#include "layout.h"
#include "team.h"

#define BLOCK_TOKENS 32u

struct cfg {
	int json, quick;
	int rot;                   /* --rot: each format again with "+rot" */
	uint32_t fmt_mask;         /* formats to measure (f16 always: the reference) */
	unsigned threads;
	uint64_t llc, llc_sysconf, llc_sysfs;
	const char *llc_src;
	double ws_target;          /* bytes read per decode step, at least */
	uint64_t mem_avail;        /* bytes available at the start (0: unknown) */
	const char *mem_src;
	char ws_why[320];          /* the working set chosen and why, for the report */
	uint32_t blocks_per_seq;   /* n = blocks_per_seq * B + B / 2 for every format */
	struct runs runs;          /* how long each figure is timed */
	int read_avx2;
};

struct geom {
	const char *name;
	uint32_t layers, q_heads, kv_heads, head_dim;
};

/* The rows of geoms[] (bench/formats.c). */
#define NGEOMS 2u
extern const struct geom geoms[NGEOMS];

/* Per-geometry workload shape, the same for every format so that every
 * format decodes exactly the same tokens. */
struct plan {
	uint32_t n, nseq;
	double max_step_bytes;
	double max_resident_bytes;   /* memory the largest format's workload touches */
};

struct result {
	const struct geom *g;
	int fmt, rot;            /* rot: "+rot" on K and V of every layer */
	double bpt, bpt_layer, ratio_f16;
	double codebook_bytes;   /* the pool's codebooks (pq2, pq1): not in bpt */
	double step_bytes;
	uint32_t nseq, n;
	double dec1, decn;   /* GB/s of KV read */
	double cpu_share;
	double rot_ratio;    /* "+rot" rows: GB/s against the plain format's, measured in
			      * alternation (the median of ROT_ROUNDS pairs, all threads) */
};

/* bench/workload.c: one geometry and format's decode step, ready to time */
struct workload {
	const struct geom *g;
	struct kvq_layout *L;
	uint8_t *base;
	size_t map_len;
	uint32_t layer, nseq, n, nsb, nob;
	int32_t *sealed_ids, *open_ids;
	struct kvq_seq_table *seqs;
	float *q, *out;
	struct kvq_attn attn;
	double step_bytes;
	int err;
};

int fmt_fits(int fmt, uint32_t D);
int plan_geometry(const struct geom *g, const struct cfg *c, struct plan *pl);
/* rot: K and V stored rotated ("+rot" on every layer) */
int workload_init(struct workload *w, const struct geom *g, int fmt, int rot, const struct plan *pl);
int workload_check(struct workload *w);
void workload_free(struct workload *w);
void decode_job(void *arg, unsigned idx, unsigned n);

/* bench/report.c: the table, and the JSON line after it (m: memory.h) */
struct membw;
void print_table(const struct cfg *c, const struct membw *m, const struct plan *pl,
		 const struct result *res, unsigned nres, char notes[][160], unsigned nnotes);
void print_json(const struct cfg *c, const struct membw *m, const struct result *res, unsigned nres);

#endif
