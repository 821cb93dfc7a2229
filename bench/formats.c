/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench formats: its options, the machine's shape (threads, last-level
 * cache, available memory), the working set's size, and the run over
 * geometries and formats.
 *
 * "formats" compares the storage formats at two model geometries: bytes per
 * token of a sealed block (every scale and zero included), the ratio to f16,
 * and the CPU decode-attention throughput in bytes of KV read per second,
 * judged against a read-only pass over memory measured in the same run
 * (decode is memory-bound, so the fraction of the read bandwidth it
 * reaches is its figure of merit: docs/DESIGN.md, section 7).
 *
 * The workload (bench/workload.c) is the production layout for all L
 * layers, one layer's decode timed; the read pass and FMA rate it is judged
 * against come from bench/memory.c, the timing loop from bench/team.c, the
 * table and JSON from bench/report.c.
 */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "codebook.h"
#include "format.h"
#include "formats.h"
#include "memory.h"
#include "team.h"

#define DEFAULT_LLC (32ull << 20)

const struct geom geoms[] = {
	{ "llama3-8b", 32, 32, 8, 128 },
	{ "smollm2-135m", 30, 9, 3, 64 },
};
_Static_assert(sizeof(geoms) / sizeof(geoms[0]) == NGEOMS, "NGEOMS counts the rows of geoms[]");

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

/*
 * What the run may touch: the kernel's MemAvailable (what can be allocated
 * without swapping), or free pages where /proc has no such line.  A
 * working set that does not fit is not a slower measurement but the OOM
 * killer's (it was: 24 GiB asked of a 24 GiB machine, no output).
 */
static void detect_mem(struct cfg *c)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	long pages = -1, page = sysconf(_SC_PAGESIZE);

	c->mem_avail = 0;
	c->mem_src = "unknown";
	while (f && fgets(line, sizeof line, f)) {
		unsigned long long kb;

		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
			c->mem_avail = (uint64_t)kb << 10;
			c->mem_src = "MemAvailable";
			break;
		}
	}
	if (f)
		fclose(f);
	if (c->mem_avail)
		return;
#ifdef _SC_AVPHYS_PAGES
	pages = sysconf(_SC_AVPHYS_PAGES);
#endif
	if (pages > 0 && page > 0) {
		c->mem_avail = (uint64_t)pages * (uint64_t)page;
		c->mem_src = "free pages";
	}
}

#define WS_LLC_AIM 8.0   /* a full run's smallest step, in LLCs */
/* The least that still measures memory: a cyclic pass over 3 LLCs finds at
 * most a third of it in cache whatever the replacement policy (none under
 * LRU), and the formats whose decode nears the read pass (f16 to int8) read
 * 8 to 16 times the smallest step. */
#define WS_LLC_MIN 3.0
/* The share of available memory the run touches at its peak: the rest for
 * the page cache, the kernel and whatever else starts meanwhile. */
#define MEM_USE 0.75
/* The process besides the workload and the read pass: queries, outputs,
 * id tables, the quantizer's input, the threads' stacks. */
#define MEM_SLACK (64.0 * (1 << 20))
#define GIB (1024.0 * 1024.0 * 1024.0)

/* Peak memory of a run with these plans: the read pass's buffer, then (freed)
 * the largest workload, twice with --rot (the plain one kept for +rot). */
static double peak_bytes(const struct cfg *c, const struct plan *pl)
{
	double step = c->ws_target, work = 0.0;

	for (unsigned gi = 0; gi < NGEOMS; gi++) {
		if (pl[gi].max_step_bytes > step)
			step = pl[gi].max_step_bytes;
		if (pl[gi].max_resident_bytes > work)
			work = pl[gi].max_resident_bytes;
	}
	work *= c->rot ? 2.0 : 1.0;
	return (work > step ? work : step) + MEM_SLACK;
}

/*
 * The working set: the aim (c->ws_target on entry), cut until the run's
 * peak fits the memory it may use; refused when that leaves a full run's
 * smallest step under WS_LLC_MIN LLCs, since its figures would then time
 * the cache.  Plans pl for the chosen size; c->ws_why says what and why.
 */
static int size_working_set(struct cfg *c, struct plan *pl)
{
	const double aim = c->ws_target, llc = (double)c->llc;
	const double usable = MEM_USE * (double)c->mem_avail;
	double peak;
	char mem[128];

	if (c->mem_avail)
		snprintf(mem, sizeof mem, "%.1f GiB usable (%.0f%% of %s %.1f GiB)", usable / GIB, 100.0 * MEM_USE,
			 c->mem_src, (double)c->mem_avail / GIB);
	else
		snprintf(mem, sizeof mem, "available memory unknown, not bounded");
	for (unsigned it = 0;; it++) {
		for (unsigned gi = 0; gi < NGEOMS; gi++)
			if (plan_geometry(&geoms[gi], c, &pl[gi]) < 0)
				return -1;
		peak = peak_bytes(c, pl);
		if (!c->mem_avail || peak <= usable)
			break;
		if (it == 8 || usable <= MEM_SLACK) {
			fprintf(stderr, PROG " formats: cannot run here: the run needs %.1f GiB at its peak with %u "
				"sequences of %s, and there is %s\n", peak / GIB, pl[0].nseq, geoms[0].name, mem);
			return -1;
		}
		/* the plan is linear in the target but for the rounding of nseq */
		c->ws_target *= 0.98 * (usable - MEM_SLACK) / (peak - MEM_SLACK);
	}
	if (!c->quick && c->ws_target < WS_LLC_MIN * llc) {
		fprintf(stderr, PROG " formats: cannot measure honestly here: a decode step must read at least "
			"%.0f x the last-level cache (%.0f MiB; LLC %.0f MiB from %s), but within %s the smallest "
			"format's step can read only %.0f MiB (%.1f x the LLC): free memory, or run --quick for a "
			"smoke test whose figures are not a measurement\n", WS_LLC_MIN, WS_LLC_MIN * llc / (1 << 20),
			llc / (1 << 20), c->llc_src, mem, c->ws_target / (1 << 20), c->ws_target / llc);
		return -1;
	}
	snprintf(c->ws_why, sizeof c->ws_why,
		 "decode working set >= %.0f MiB per step: %.1f x the LLC%s; peak memory %.1f GiB, %s",
		 c->ws_target / (1 << 20), c->ws_target / llc,
		 c->ws_target >= aim ? (c->quick ? " (--quick)" : ", the aim") : ", cut from the aim to fit memory",
		 peak / GIB, mem);
	return 0;
}

/* Rounds of the plain and the "+rot" workload measured one after the other
 * (drift and other processes hit both alike; their ratio's median is the
 * rotation's cost). */
#define ROT_ROUNDS 5u

/* The rotated workload wr against the plain one wp of the same geometry
 * and format, alternately: GB/s of wr over wp's. */
static double rot_ratio(struct team *team, const struct cfg *c, struct workload *wp, struct workload *wr)
{
	struct cfg quick = *c;
	struct share sh = { 0 };
	double ratio[ROT_ROUNDS];

	quick.runs.n = MIN_RUNS;
	quick.runs.budget_s = 0.0;
	for (unsigned i = 0; i < ROT_ROUNDS; i++) {
		double p = measure(team, c->threads, decode_job, wp, wp->step_bytes, &quick.runs, 1, &sh);
		double r = measure(team, c->threads, decode_job, wr, wr->step_bytes, &quick.runs, 1, &sh);
		ratio[i] = r / p;
	}
	return median(ratio, ROT_ROUNDS);
}

int cmd_formats(int argc, char **argv)
{
	struct cfg c;
	struct team team;
	struct plan pl[NGEOMS];
	struct membw mem;
	struct result res[NGEOMS * KVQ_FMT_COUNT * 2];
	char notes[NGEOMS * KVQ_FMT_COUNT * 2][160];
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
		} else if (!strcmp(argv[i], "--rot")) {
			c.rot = 1;
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
	detect_mem(&c);
	if (c.quick) {
		c.ws_target = (double)c.llc;
		c.blocks_per_seq = 64;
		c.runs.n = MIN_RUNS;
		c.runs.min_run_s = 0.02;
		c.runs.budget_s = 0.0;
	} else {
		c.ws_target = WS_LLC_AIM * (double)c.llc;
		c.blocks_per_seq = 256;   /* 8208 tokens: a common context length */
		c.runs.n = 5;
		c.runs.min_run_s = 0.2;
		c.runs.budget_s = 2.5;
	}

	if (size_working_set(&c, pl) < 0)
		return 1;
	for (unsigned gi = 0; gi < NGEOMS; gi++)
		if (pl[gi].max_step_bytes > max_step)
			max_step = pl[gi].max_step_bytes;
	if (team_start(&team, c.threads) < 0) {
		fprintf(stderr, PROG ": out of memory\n");
		return 1;
	}
	fprintf(stderr, PROG ": CPU kernels %s, %u threads, LLC %.0f MiB (%s)\n", kvq_cpu_isa(), c.threads,
		(double)c.llc / (1 << 20), c.llc_src);
	fprintf(stderr, PROG ": %s\n", c.ws_why);
	/* the read pass covers at least the largest decode working set */
	if (measure_memory(&team, c.threads, c.read_avx2, &c.runs, max_step > c.ws_target ? max_step : c.ws_target, &mem) < 0)
		goto fail;

	for (unsigned gi = 0; gi < NGEOMS; gi++) {
		const struct geom *g = &geoms[gi];
		double f16_bpt = 0.0;
		/* with --rot, a format's plain workload stays for its +rot row */
		struct workload plain = { 0 };
		bool have_plain = false;

		for (int fr = 0; fr < KVQ_FMT_COUNT * 2; fr++) {
			const int f = fr / 2, rot = fr % 2;
			struct workload w;
			struct result *r;
			struct share sh = { 0 };
			double t0;

			if ((c.fmt_mask && !(c.fmt_mask & (1u << f)) && f != KVQ_FMT_F16) || (rot && !c.rot))
				continue;
			if (!fmt_fits(f, g->head_dim)) {
				if (rot)
					continue;
				snprintf(notes[nnotes++], sizeof notes[0],
					 "%s skipped for %s: its groups do not divide head dim %u", kvq_fmt_name(f),
					 g->name, g->head_dim);
				continue;
			}
			t0 = now_s();
			fprintf(stderr, PROG ": %s %s%s: preparing ...", g->name, kvq_fmt_name(f), rot ? "+rot" : "");
			if (workload_init(&w, g, f, rot, &pl[gi]) < 0 || workload_check(&w) < 0) {
				workload_free(&w);
				if (have_plain)
					workload_free(&plain);
				goto fail;
			}
			r = &res[nres++];
			r->g = g;
			r->fmt = f;
			r->rot = rot;
			r->bpt = (double)w.L->sealed_block_bytes / BLOCK_TOKENS;
			r->bpt_layer = (double)w.L->layer[w.layer].sealed_slice / BLOCK_TOKENS;
			r->codebook_bytes = (double)w.L->codebook_bytes;
			if (w.L->codebook_bytes && !rot)
				snprintf(notes[nnotes++], sizeof notes[0],
					 "%s at %s: the pool's codebooks, %.1f MiB, are not in its bytes per token "
					 "(a 1 GiB pool: %.1f bytes per token with them)", kvq_fmt_name(f), g->name,
					 (double)w.L->codebook_bytes / (1 << 20),
					 kvq_codebook_amortised(w.L->sealed_block_bytes, w.L->codebook_bytes,
								KVQ_CB_POOL_BYTES) / BLOCK_TOKENS);
			if (f == KVQ_FMT_F16 && !rot)
				f16_bpt = r->bpt;
			r->ratio_f16 = r->bpt / f16_bpt;
			r->step_bytes = w.step_bytes;
			r->nseq = w.nseq;
			r->n = w.n;
			fprintf(stderr, " %.0f MiB, 1 thread ...", w.step_bytes / (1 << 20));
			/* workload_check's step was the warm-up */
			r->dec1 = measure(&team, 1, decode_job, &w, w.step_bytes, &c.runs, 1, &sh);
			fprintf(stderr, " %.2f GB/s", r->dec1);
			if (c.threads > 1) {
				fprintf(stderr, ", %u threads ...", c.threads);
				r->decn = measure(&team, c.threads, decode_job, &w, w.step_bytes, &c.runs, 1, &sh);
				fprintf(stderr, " %.2f GB/s", r->decn);
			} else {
				r->decn = r->dec1;
			}
			r->cpu_share = share_of(&sh);
			if (rot && have_plain) {
				fprintf(stderr, " ... against the plain format in turn ...");
				r->rot_ratio = rot_ratio(&team, &c, &plain, &w);
				fprintf(stderr, " %.3f x", r->rot_ratio);
			}
			if (rot && have_plain) {
				workload_free(&plain);
				have_plain = false;
			}
			fprintf(stderr, " (%.1f s, CPU share %.0f%%)\n", now_s() - t0, 100.0 * r->cpu_share);
			if (w.err) {
				fprintf(stderr, PROG ": kvq_cpu_attention: %s\n", strerror(-w.err));
				workload_free(&w);
				if (have_plain)
					workload_free(&plain);
				goto fail;
			}
			if (c.rot && !rot) {
				plain = w;
				have_plain = true;
			} else {
				workload_free(&w);
			}
		}
		if (have_plain)
			workload_free(&plain);
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
