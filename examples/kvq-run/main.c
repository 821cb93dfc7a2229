/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: a real model (a Llama-architecture GGUF, SmolLM2-135M-Instruct
 * by default) whose KV cache lives in a kvqd pool.
 *
 *   kvq-run generate --prompt TEXT [--kv POLICY] [--max-tokens N] [--raw]
 *                    [--system TEXT | --system-file FILE] [--no-prefix-cache] [--stats]
 *     (chat template; the prompt's cached sealed prefix is taken from kvqd's
 *     prefix cache unless --no-prefix-cache)
 *   kvq-run generate --prompts FILE | --ctx N FILE  [--seqs N] [--step-tokens N] [--ignore-eos] [--json] ...
 *     (batched: --seqs sequences, each a prompt of FILE or N tokens of
 *     FILE from a point of its own, run as one batch: gen.h)
 *   kvq-run perplexity [--kv POLICY] [--ctx N] FILE [--json]
 *   kvq-run ab --kv POLICY [--kv POLICY...] [--ctx N] FILE [--json]
 *   kvq-run ab --prompts FILE [--kv POLICY...] [--gen N] [--raw] [--show N] [--json]
 *     (each prompt's continuation with f16, bf16 and each policy, ab.h)
 *   kvq-run tokenize [--special] [--decode] TEXT   (ids, or their bytes again)
 *   kvq-run calibrate [--ctx N] --out PATH FILE
 *     (K's per-channel mean over FILE, for --k-center)
 *   kvq-run calibrate --kv POLICY [--ctx N] [--rotate] [--k-center PATH] --out PATH FILE
 *     (k-means codebooks for POLICY's pq2/pq1 layers over FILE, for --codebooks)
 *
 * Common: --model PATH ($KVQ_MODEL), --socket PATH ($KVQ_SOCKET), --window N
 * (open window in tokens, 0: the pool's default), --batch N (prefill chunk),
 * --threads N, --limit N (use the first N tokens of FILE), --rotate ("+rot"
 * on every quantized part of each --kv policy: libkvq stores K and V
 * through a Hadamard transform, kv.c), --gpu [--device N]
 * (the layers on a GPU with the KV in cuda pools, model_gpu.h), --k-center
 * PATH (K centered by calibrate's means, model.h), --codebooks PATH (the
 * codebooks of policies with pq2/pq1, kv.c).
 *
 * This file: the options, the usage text and the choice of command.  The
 * model is loaded in load.c, a policy's pool and sequence is kv.c, text and
 * tokens are text.c; the commands are generate.c, perplexity.c, ab.c,
 * calibrate.c and text.c (tokenize).
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

struct opts o = { .block = 32, .batch = 128, .max_tokens = 128, .threads = 1, .gen = 64, .gen_prompts = 4, .show = 3 };

__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvq-run: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvq-run generate --prompt TEXT [--kv POLICY] [--max-tokens N] [--raw]\n"
		   "                [--system TEXT | --system-file FILE] [--no-prefix-cache] [--stats]\n"
		   "       kvq-run generate --prompts FILE | --ctx N TEXTFILE  [--seqs N] [--step-tokens N] [--ignore-eos]\n"
		   "                [--json] [--kv POLICY] [--max-tokens N] ...   (greedy generation of --seqs sequences\n"
		   "                (1-%d) as one batch: prompt i of FILE, one a line, for sequence i (round\n"
		   "                again when fewer; default: one sequence each), or N tokens of TEXTFILE from\n"
		   "                a point of each sequence's own (a continuation; default 1 sequence); prompt\n"
		   "                chunks of some and decode tokens of others share a step; --step-tokens:\n"
		   "                rows a step holds (default --seqs x --batch, at most 8192); --ignore-eos:\n"
		   "                exactly --max-tokens each, for measurements)\n"
		   "       kvq-run perplexity [--kv POLICY] [--ctx N] [--json] [--dump PATH] FILE\n"
		   "       kvq-run ab --kv POLICY [--kv POLICY...] [--ctx N] [--gen N] [--score-from N] [--json] FILE\n"
		   "                (--score-from N: score only the predictions from position N of each window on)\n"
		   "       kvq-run ab --prompts FILE [--kv POLICY...] [--gen N] [--ctx N] [--raw] [--system TEXT |\n"
		   "                --system-file FILE] [--show N] [--limit N] [--json]   (continuations of FILE's\n"
		   "                prompts, one a line or JSON lines {\"prompt\", \"system\"}: f16, bf16, each POLICY)\n"
		   "       kvq-run tokenize [--special] [--decode] TEXT   (ids, or the ids decoded back)\n"
		   "       kvq-run calibrate [--ctx N] --out PATH FILE   (K means for --k-center)\n"
		   "       kvq-run calibrate --kv POLICY [--ctx N] [--limit N] [--rotate] [--k-center PATH] --out PATH\n"
		   "                FILE   (k-means codebooks of POLICY's pq2/pq1 layers, for --codebooks)\n"
		   "options: --model PATH ($KVQ_MODEL)  --socket PATH ($KVQ_SOCKET)  --window N (open window,\n"
		   "         tokens)  --batch N (prefill chunk, default 128)  --threads N  --limit N (first N\n"
		   "         tokens of FILE)  --gen N (ab: greedy tokens per continuation, default 64, 0 none)\n"
		   "         --gen-prompts N (ab: continuations, default 4)  --kv POLICY@W: open window W\n"
		   "         --block N (tokens per KV block, default 32)  --rotate (+rot on every quantized part)\n"
		   "         --sink (pools with sink blocks: each sequence's first block kept exact)\n"
		   "         --gpu [--device N] (layers on the GPU, KV in cuda pools; --tf32: its products on\n"
		   "         tensor cores in TF32, inputs rounded to 10 mantissa bits; --fp16: weights and the\n"
		   "         products' inputs in FP16, products on tensor cores with FP32 sums; --no-graphs:\n"
		   "         each kernel launched, no CUDA graphs)  --k-center PATH (K minus\n"
		   "         calibrate's means)  --show N (ab --prompts: the N prompts that differ most per\n"
		   "         policy, default 3)  --limit N (ab --prompts: the first N prompts)  --codebooks PATH\n"
		   "         (codebooks for policies with pq2/pq1; repeat it: each policy takes the file that fits)\n"
		   "         --host-tier MIB (the pool kvqd creates gets a host tier of MIB MiB: evicted blocks\n"
		   "         kept there quantized, promoted back by lookups; kvqctl demote sends them there)\n",
		RUN_MAX_SEQS);
}

uint32_t num(const char *s, const char *opt)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || v > (1ul << 30))
		die("%s: bad number '%s'", opt, s);
	return (uint32_t)v;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "model", 1, NULL, 'm' }, { "socket", 1, NULL, 's' },
		{ "prompt", 1, NULL, 'p' }, { "kv", 1, NULL, 'k' }, { "window", 1, NULL, 'w' },
		{ "batch", 1, NULL, 'b' }, { "ctx", 1, NULL, 'c' }, { "max-tokens", 1, NULL, 'n' },
		{ "threads", 1, NULL, 't' }, { "limit", 1, NULL, 'l' }, { "gen", 1, NULL, 'g' },
		{ "json", 0, NULL, 'j' }, { "raw", 0, NULL, 'r' }, { "special", 0, NULL, 'S' },
		{ "decode", 0, NULL, 'D' }, { "system", 1, NULL, 'y' }, { "system-file", 1, NULL, 'Y' },
		{ "no-prefix-cache", 0, NULL, 'N' }, { "stats", 0, NULL, 'T' }, { "dump", 1, NULL, 'd' },
		{ "gen-prompts", 1, NULL, 'G' }, { "block", 1, NULL, 'B' }, { "rotate", 0, NULL, 'R' }, { "sink", 0, NULL, 'I' },
		{ "gpu", 0, NULL, 'U' }, { "device", 1, NULL, 'V' }, { "out", 1, NULL, 'o' },
		{ "k-center", 1, NULL, 'K' }, { "prompts", 1, NULL, 'P' }, { "show", 1, NULL, 'W' },
		{ "score-from", 1, NULL, 'F' }, { "codebooks", 1, NULL, 'C' }, { "seqs", 1, NULL, 'Q' },
		{ "step-tokens", 1, NULL, 'X' }, { "ignore-eos", 0, NULL, 'E' }, { "host-tier", 1, NULL, 'H' },
		{ "tf32", 0, NULL, '3' }, { "no-graphs", 0, NULL, 'Z' }, { "fp16", 0, NULL, '6' },
		{ "help", 0, NULL, 'h' },
		{ NULL, 0, NULL, 0 } };
	const char *cmd;
	int ch;

	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	cmd = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'm': o.model = optarg; break;
		case 's': o.socket = optarg; break;
		case 'p': o.prompt = optarg; break;
		case 'k':
			if (o.n_kv == RUN_MAX_KV)
				die("at most %d policies", RUN_MAX_KV);
			o.kv[o.n_kv++] = optarg;
			break;
		case 'w': o.window = num(optarg, "--window"); break;
		case 'b': o.batch = num(optarg, "--batch"); break;
		case 'c': o.ctx = num(optarg, "--ctx"); break;
		case 'n': o.max_tokens = num(optarg, "--max-tokens"); break;
		case 't': o.threads = num(optarg, "--threads"); break;
		case 'l': o.limit = num(optarg, "--limit"); break;
		case 'g': o.gen = num(optarg, "--gen"); break;
		case 'd': o.dump = optarg; break;
		case 'D': o.decode = true; break;
		case 'y': o.system = optarg; break;
		case 'Y': o.system_file = optarg; break;
		case 'N': o.no_cache = true; break;
		case 'H': o.host_tier_mib = num(optarg, "--host-tier"); break;
		case 'T': o.stats = true; break;
		case 'B': o.block = num(optarg, "--block"); break;
		case 'G': o.gen_prompts = num(optarg, "--gen-prompts"); break;
		case 'R': o.rotate = true; break;
		case 'I': o.sink = true; break;
		case 'o': o.out = optarg; break;
		case 'K': o.k_center = optarg; break;
		case 'C':
			if (o.n_codebooks == RUN_MAX_KV)
				die("at most %d codebook files", RUN_MAX_KV);
			o.codebooks[o.n_codebooks++] = optarg;
			break;
		case 'P': o.prompts = optarg; break;
		case 'W': o.show = num(optarg, "--show"); break;
		case 'F': o.score_from = num(optarg, "--score-from"); break;
		case 'Q':
			o.seqs = num(optarg, "--seqs");
			if (o.seqs < 1 || o.seqs > RUN_MAX_SEQS)
				die("--seqs between 1 and %d", RUN_MAX_SEQS);
			break;
		case 'X':
			o.step_tokens = num(optarg, "--step-tokens");
			if (o.step_tokens < 1 || o.step_tokens > RUN_MAX_STEP)
				die("--step-tokens between 1 and %d", RUN_MAX_STEP);
			break;
		case 'E': o.ignore_eos = true; break;
		case 'U': o.gpu = true; break;
		case '3': o.tf32 = true; break;
		case '6': o.fp16 = true; break;
		case 'Z': o.no_graphs = true; break;
		case 'V': o.device = (int)num(optarg, "--device"); break;
		case 'j': o.json = true; break;
		case 'r': o.raw = true; break;
		case 'S': o.special = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if ((o.tf32 || o.no_graphs || o.fp16) && !o.gpu)
		die("--tf32, --fp16 and --no-graphs are for --gpu");
	if (o.batch < 1 || o.batch > 4096)
		die("--batch between 1 and 4096");
	if (optind < argc) {
		if (!strcmp(cmd, "tokenize"))
			o.prompt = argv[optind];
		else
			o.file = argv[optind];
	}
	if (o.prompts && strcmp(cmd, "ab") && strcmp(cmd, "generate"))
		die("--prompts is for ab and generate");
	if ((o.seqs || o.step_tokens || o.ignore_eos) && strcmp(cmd, "generate"))
		die("--seqs, --step-tokens and --ignore-eos are for generate");
	if (o.score_from && (strcmp(cmd, "ab") || o.prompts))
		die("--score-from is for ab over a FILE");
	if (!strcmp(cmd, "generate"))
		return cmd_generate();
	if (!strcmp(cmd, "tokenize"))
		return cmd_tokenize();
	if (o.prompts && o.file)
		die("ab --prompts FILE takes no other FILE ('%s')", o.file);
	if (!strcmp(cmd, "ab") && o.prompts)
		return cmd_ab();
	if (!o.file)
		die("%s needs FILE", cmd);
	if (!strcmp(cmd, "perplexity"))
		return cmd_perplexity();
	if (!strcmp(cmd, "ab"))
		return cmd_ab();
	if (!strcmp(cmd, "calibrate"))
		return cmd_calibrate();
	usage(stderr);
	return 2;
}
