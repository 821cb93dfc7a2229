/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqctl plan: memory for a model's weights and its KV cache, and how many
 * sequences each KV policy holds, from the pool layout code (no daemon).
 */
#include <config.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "policy.h"
#include "json.h"
#include "kvqctl.h"
#include "layout.h"

#define MAX_POLICIES 16

struct model {
	const char *name;
	uint32_t layers, kv_heads, head_dim;
	double params;
};

/* Geometry from each model's published configuration. */
static const struct model presets[] = {
	{ "Llama-3-8B", 32, 8, 128, 8.03e9 },
	{ "Llama-3-70B", 80, 8, 128, 70.55e9 },
	{ "SmolLM2-135M", 30, 3, 64, 134.5e6 },
};

struct plan_row {
	char policy[KVQ_POLICY_MAX_LEN + 1];
	double bytes_per_value;      /* K and V averaged over layers (kvq_fmt_bytes_per_value) */
	double bytes_per_token;      /* sealed, all layers (layout) */
	double codebook_bytes;       /* the pool's codebooks (pq2, pq1), once per pool, out of the budget */
	double seq_bytes;            /* one sequence of the context length, as the pool counts it */
	double tokens;               /* sealed tokens the KV budget holds */
	uint64_t sequences;
};

/*
 * One policy's figures from the pool layout: a sequence of n tokens holds
 * S(n)/B sealed blocks and its open window in open blocks, each open block
 * with the sealed slot reserved for its seal (what kvqd allocates and what
 * quotas count); with sink blocks its first block is a sink slot (an open
 * block's bytes, no reservation) instead.
 */
static int plan_policy(const struct model *m, uint32_t B, const char *policy, uint32_t n, bool sink,
		       double budget, struct plan_row *row)
{
	struct kvq_policy pol;
	struct kvq_layout_params lp = { .layers = m->layers, .kv_heads = m->kv_heads, .head_dim = m->head_dim,
		.block_tokens = B, .n_sealed = 1, .n_open = 1, .act = KVQ_DT_F16, .policy = &pol };
	struct kvq_layout *L = NULL;
	char err[256];
	uint32_t S;
	double bpv = 0;

	if (kvq_policy_parse(policy, m->layers, &pol, err, sizeof(err)) < 0)
		return die("plan: policy %s: %s", policy, err);
	if (kvq_layout_new(&lp, &L, err, sizeof(err)) < 0)
		return die("plan: policy %s: %s", policy, err);
	kvq_policy_format(&pol, row->policy, sizeof(row->policy));
	for (uint32_t l = 0; l < m->layers; l++)
		bpv += kvq_fmt_bytes_per_value(pol.k[l], 0, B, m->head_dim) +
		       kvq_fmt_bytes_per_value(pol.v[l], 1, B, m->head_dim);
	row->bytes_per_value = bpv / (2.0 * m->layers);
	row->bytes_per_token = (double)L->sealed_block_bytes / B;
	row->codebook_bytes = (double)L->codebook_bytes;
	S = kvq_layout_split(L, n);
	row->seq_bytes = (double)(S / B) * (double)L->sealed_block_bytes +
			 (double)((n - S + B - 1) / B) * (double)(L->open_block_bytes + L->sealed_block_bytes);
	if (sink)   /* block 0: a sink slot for a sealed block, or for an open one and its reservation */
		row->seq_bytes += (double)L->open_block_bytes -
				  (double)(S ? L->sealed_block_bytes : L->open_block_bytes + L->sealed_block_bytes);
	budget -= row->codebook_bytes;
	row->tokens = budget > 0 ? budget / row->bytes_per_token : 0;
	row->sequences = budget > 0 ? (uint64_t)floor(budget / row->seq_bytes) : 0;
	kvq_layout_free(L);
	return 0;
}

const struct option plan_opts[] = {
	{ "model", required_argument, NULL, 'm' },       { "layers", required_argument, NULL, 'L' },
	{ "kv-heads", required_argument, NULL, 'H' },    { "head-dim", required_argument, NULL, 'D' },
	{ "params", required_argument, NULL, 'P' },      { "weight-bits", required_argument, NULL, 'w' },
	{ "gpu-memory", required_argument, NULL, 'g' },  { "gpus", required_argument, NULL, 'n' },
	{ "utilization", required_argument, NULL, 'u' }, { "context", required_argument, NULL, 'c' },
	{ "block-tokens", required_argument, NULL, 'B' }, { "policy", required_argument, NULL, 'p' },
	{ "sink-blocks", required_argument, NULL, 'k' },
	{ NULL, 0, NULL, 0 },
};
CTL_OPTS_FIT(plan_opts);

/* Every format of the table alone (as a policy, its name), before the
 * policies --policy adds. */
#define N_UNIFORM ((size_t)KVQ_FMT_COUNT)

/* A plan: what the command line asked for, and one row per policy (a row
 * whose policy is "" does not apply to the model). */
struct plan {
	struct model m;
	double wbits, gpu_mem, util, weights, usable, budget;
	uint32_t gpus, context, B, sink;
	size_t n_pol;
	const char *policies[N_UNIFORM + MAX_POLICIES];
	struct plan_row rows[N_UNIFORM + MAX_POLICIES];
};

/* The options into p: -1 to go on, else the exit status. */
static int plan_args(struct cmdline *cl, struct plan *p)
{
	const struct option *lo = plan_opts;
	struct model *m = &p->m;
	size_t n_extra = 0;
	double params = 0;
	uint32_t L = 0, H = 0, D = 0;
	bool preset = false;
	int ch, r;

	*m = (struct model){ .name = "custom" };
	p->wbits = 16;
	p->gpu_mem = 80e9;
	p->util = 0.9;
	p->gpus = 1;
	p->context = 8192;
	p->B = 32;
	while ((ch = cmd_next(cl)) >= 0) {
		char *end;

		r = 0;
		switch (ch) {
		case 'm':
			for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
				if (!strcasecmp(optarg, presets[i].name)) {
					*m = presets[i];
					preset = true;
				}
			if (!preset)
				return die("plan: unknown model '%s' (presets: Llama-3-8B, Llama-3-70B, SmolLM2-135M; "
					   "or give --layers, --kv-heads, --head-dim and --params)", optarg), 2;
			break;
		case 'L': r = parse_u32(optarg, 1, KVQ_MAX_LAYERS, &L); break;
		case 'H': r = parse_u32(optarg, 1, KVQ_MAX_HEADS, &H); break;
		case 'D': r = parse_u32(optarg, 1, KVQ_MAX_HEAD_DIM, &D); break;
		case 'P':
			/* 8e9, 8B, 135M: a parameter count, not bytes */
			errno = 0;
			params = strtod(optarg, &end);
			if (!strcasecmp(end, "B"))
				params *= 1e9;
			else if (!strcasecmp(end, "M"))
				params *= 1e6;
			else if (*end)
				r = -EINVAL;
			if (errno || !(params > 0) || params > 1e15)
				r = -EINVAL;
			break;
		case 'w':
			errno = 0;
			p->wbits = strtod(optarg, &end);
			if (errno || *end || !(p->wbits >= 1 && p->wbits <= 32))
				r = -EINVAL;
			break;
		case 'g':
			r = parse_size(optarg, &p->gpu_mem);
			if (r == 0 && !(p->gpu_mem > 0))
				r = -EINVAL;
			break;
		case 'n': r = parse_u32(optarg, 1, 1024, &p->gpus); break;
		case 'u':
			errno = 0;
			p->util = strtod(optarg, &end);
			if (*end == '%') {
				p->util /= 100;
				end++;
			}
			if (errno || *end || !(p->util > 0 && p->util <= 1))
				r = -EINVAL;
			break;
		case 'c': r = parse_u32(optarg, 1, 1u << 24, &p->context); break;
		case 'B':
			r = parse_u32(optarg, 16, KVQ_MAX_BLOCK_TOKENS, &p->B);
			if (r == 0 && p->B % 16)
				r = -EINVAL;
			break;
		case 'k': r = parse_u32(optarg, 0, 1, &p->sink); break;
		case 'p':
			if (n_extra >= MAX_POLICIES)
				return die("plan: at most %d --policy options", MAX_POLICIES), 2;
			p->policies[N_UNIFORM + n_extra++] = optarg;
			break;
		}
		if (r < 0)
			return die("plan: bad value '%s' for --%s", optarg, opt_name(lo, ch)), 2;
	}
	if (ch == CL_EXIT)
		return cl->status;
	if (cl->argc)
		return die("plan: unexpected argument %s", cl->argv[0]), 2;
	if (L)
		m->layers = L;
	if (H)
		m->kv_heads = H;
	if (D)
		m->head_dim = D;
	if (params > 0)
		m->params = params;
	if (!m->layers || !m->kv_heads || !m->head_dim || !(m->params > 0))
		return die("plan: give --model PRESET, or --layers, --kv-heads, --head-dim and --params"), 2;
	if (preset && (L || H || D || params > 0))
		m->name = "custom (from a preset)";
	for (size_t i = 0; i < N_UNIFORM; i++)
		p->policies[i] = kvq_fmt_name((int)i);
	p->n_pol = N_UNIFORM + n_extra;
	return -1;
}

/* The memory figures and every row: 0, or 1 after printing why. */
static int plan_rows(struct plan *p)
{
	const struct model *m = &p->m;

	p->weights = m->params * p->wbits / 8.0;
	p->usable = p->gpu_mem * p->gpus * p->util;
	p->budget = p->usable - p->weights;
	for (size_t i = 0; i < p->n_pol; i++) {
		/* some formats need head dims they divide (int4g128 on a 64-wide head) */
		char err[256];
		struct kvq_policy pol;

		if (i < N_UNIFORM &&
		    (kvq_policy_parse(p->policies[i], m->layers, &pol, err, sizeof(err)) < 0 ||
		     kvq_fmt_group(pol.k[0], 0) > m->head_dim || kvq_fmt_group(pol.v[0], 1) > m->head_dim ||
		     m->head_dim % (kvq_fmt_group(pol.k[0], 0) ? kvq_fmt_group(pol.k[0], 0) : 1) ||
		     m->head_dim % (kvq_fmt_group(pol.v[0], 1) ? kvq_fmt_group(pol.v[0], 1) : 1))) {
			p->rows[i].policy[0] = 0;
			continue;
		}
		if (plan_policy(m, p->B, p->policies[i], p->context, p->sink, p->budget, &p->rows[i]))
			return 1;
	}
	return 0;
}

static void plan_json(const struct plan *p)
{
	const struct plan_row *rows = p->rows;

	j_open(NULL, '{');
	j_open("model", '{');
	j_str("name", p->m.name);
	j_u64("layers", p->m.layers);
	j_u64("kv_heads", p->m.kv_heads);
	j_u64("head_dim", p->m.head_dim);
	j_num("params", p->m.params);
	j_close('}');
	j_num("weight_bits", p->wbits);
	j_num("weights_bytes", p->weights);
	j_num("gpu_memory_bytes", p->gpu_mem);
	j_u64("gpus", p->gpus);
	j_num("utilization", p->util);
	j_num("kv_budget_bytes", p->budget);
	j_bool("fits", p->budget > 0);
	j_u64("context_tokens", p->context);
	j_u64("sink_blocks", p->sink);
	j_u64("block_tokens", p->B);
	j_open("policies", '[');
	for (size_t i = 0; i < p->n_pol; i++) {
		if (!rows[i].policy[0])
			continue;
		j_open(NULL, '{');
		j_str("policy", rows[i].policy);
		j_num("bytes_per_value", rows[i].bytes_per_value);
		j_num("kv_bytes_per_token", rows[i].bytes_per_token);
		j_num("codebook_bytes", rows[i].codebook_bytes);
		j_num("ratio_to_f16", rows[i].bytes_per_token / rows[0].bytes_per_token);
		j_num("kv_bytes_per_sequence", rows[i].seq_bytes);
		j_num("tokens_in_budget", floor(rows[i].tokens));
		j_u64("sequences", rows[i].sequences);
		j_close('}');
	}
	j_close(']');
	j_close('}');
}

static void plan_print(const struct plan *p)
{
	const struct model *m = &p->m;
	const struct plan_row *rows = p->rows;

	printf("model     %s: %u layers, %u KV heads, head dim %u, %.4g B parameters\n", m->name, m->layers,
	       m->kv_heads, m->head_dim, m->params / 1e9);
	printf("weights   %.4g-bit: %.2f GB\n", p->wbits, p->weights / 1e9);
	printf("memory    %u x %.2f GB at %.0f%% = %.2f GB; KV budget %.2f GB\n", p->gpus, p->gpu_mem / 1e9,
	       p->util * 100, p->usable / 1e9, p->budget / 1e9);
	printf("context   %u tokens, blocks of %u tokens%s\n", p->context, p->B,
	       p->sink ? ", the first kept exact (sink blocks)" : "");
	if (p->budget <= 0)
		printf("the weights do not fit: no room for KV\n");
	printf("\n%-26s %9s %12s %7s %13s %10s %14s %10s\n", "POLICY", "B/VALUE", "KV/TOKEN", "VS F16",
	       "KV/SEQUENCE", "CODEBOOKS", "TOKENS", "SEQUENCES");
	for (size_t i = 0; i < p->n_pol; i++) {
		if (!rows[i].policy[0])
			continue;
		printf("%-26s %9.4f %10.0f B %6.2fx %10.2f MB %7.1f MB %14.0f %10llu\n", rows[i].policy,
		       rows[i].bytes_per_value, rows[i].bytes_per_token,
		       rows[0].bytes_per_token / rows[i].bytes_per_token, rows[i].seq_bytes / 1e6,
		       rows[i].codebook_bytes / 1e6, floor(rows[i].tokens), (unsigned long long)rows[i].sequences);
	}
}

int cmd_plan(struct cmdline *cl)
{
	struct plan p;
	int r = plan_args(cl, &p);

	if (r >= 0)
		return r;
	if (plan_rows(&p))
		return 1;
	if (cl->json)
		plan_json(&p);
	else
		plan_print(&p);
	return 0;
}
