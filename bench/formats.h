/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: the types its files share: the run's configuration and
 * geometries (bench/formats.c), the thread team and its timing loop
 * (bench/team.c), the memory passes (bench/memory.c), the decode workload
 * (bench/workload.c) and the report (bench/report.c).
 */
#ifndef KVQ_BENCH_FORMATS_H
#define KVQ_BENCH_FORMATS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu.h"
#include "layout.h"

#define BLOCK_TOKENS 32u
#define MIN_RUNS 3u

struct cfg {
	int json, quick;
	int rot;                   /* --rot: each format again with "+rot" */
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

/* The rows of geoms[] (bench/formats.c). */
#define NGEOMS 2u
extern const struct geom geoms[NGEOMS];

/* Per-geometry workload shape, the same for every format so that every
 * format decodes exactly the same tokens. */
struct plan {
	uint32_t n, nseq;
	double max_step_bytes;
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

/* bench/team.c: the team, and the median rate of a job over timed runs */
double share_of(const struct share *sh);
int team_start(struct team *t, unsigned n);
void team_stop(struct team *t);
double measure(struct team *t, unsigned nthr, job_fn fn, void *arg, double bytes, const struct cfg *c,
	       int warm, struct share *sh);

/* bench/memory.c: the read-only, memcpy and FMA passes */
int cpu_has_avx2(void);
int measure_memory(struct team *t, const struct cfg *c, double bytes, struct membw *m);

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

/* bench/report.c: the table, and the JSON line after it */
void print_table(const struct cfg *c, const struct membw *m, const struct plan *pl,
		 const struct result *res, unsigned nres, char notes[][160], unsigned nnotes);
void print_json(const struct cfg *c, const struct membw *m, const struct result *res, unsigned nres);

#endif
