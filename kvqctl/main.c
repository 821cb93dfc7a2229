/* SPDX-License-Identifier: Apache-2.0 */
/* kvqctl's command line: the global options, the command table, --help. */
#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "frame.h"
#include "kvqctl.h"
#include "kvq_wire.h"

int die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* ---------------------------------------------------------------- command line */

/*
 * The options every command takes, before the command or anywhere after it
 * (kvqctl --json stats, kvqctl stats --json); a command's own options come
 * after the command (pool create NAME --model ID ...).  "--" ends the
 * options: every word after it is an argument.
 */
#define GLOBAL_SHORT "s:jhV"
static const struct option global_opts[] = {
	{ "socket", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
	{ "help", no_argument, NULL, 'h' },         { "version", no_argument, NULL, 'V' },
};
_Static_assert(sizeof(global_opts) / sizeof(global_opts[0]) == CTL_N_GLOBAL, "CTL_N_GLOBAL counts global_opts");

static void usage(FILE *f);
static void command_help(FILE *f, const struct command *c);

/* A command's words ("stats", "pool create") into buf; returns buf. */
#define CMD_WORDS 64
static const char *cmd_words(const struct command *c, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s", c->name, c->sub ? " " : "", c->sub ? c->sub : "");
	return buf;
}

int cmd_next(struct cmdline *cl)
{
	char w[CMD_WORDS];

	for (;;) {
		int ch = getopt_long(cl->argc, cl->argv, cl->cmd ? GLOBAL_SHORT : "+" GLOBAL_SHORT, cl->lo, NULL);

		switch (ch) {
		case -1:
			cl->argc -= optind;
			cl->argv += optind;
			return CL_END;
		case 's':
			cl->socket = optarg;
			continue;
		case 'j':
			cl->json = true;
			continue;
		case 'h':
			if (cl->cmd)
				command_help(stdout, cl->cmd);
			else
				usage(stdout);
			cl->status = 0;
			return CL_EXIT;
		case 'V':
			printf("kvqctl %s (protocol %u)\n", PACKAGE_VERSION, KVQ_PROTOCOL_VERSION);
			cl->status = 0;
			return CL_EXIT;
		case '?':   /* getopt said which option */
			if (cl->cmd)
				fprintf(stderr, "Try 'kvqctl %s --help'.\n", cmd_words(cl->cmd, w, sizeof(w)));
			else
				fprintf(stderr, "Try 'kvqctl --help'.\n");
			cl->status = 2;
			return CL_EXIT;
		default:
			return ch;
		}
	}
}

int cmd_usage(const struct cmdline *cl)
{
	const struct command *c = cl->cmd;

	char w[CMD_WORDS];

	cmd_words(c, w, sizeof(w));
	return die("usage: kvqctl %s%s%s (kvqctl %s --help)", w, *c->args ? " " : "", c->args, w), 2;
}

int cmd_args(struct cmdline *cl, int min, int max)
{
	if (cmd_next(cl) == CL_EXIT)
		return cl->status;
	if (cl->argc < min || cl->argc > max)
		return cmd_usage(cl);
	return -1;
}

int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-' || *s == '+')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

const char *opt_name(const struct option *lo, int ch)
{
	for (size_t i = 0; lo[i].name; i++)
		if (lo[i].val == ch)
			return lo[i].name;
	return "?";
}

int parse_size(const char *s, double *ret)
{
	static const struct { const char *u; double m; } units[] = {
		{ "", 1 }, { "B", 1 }, { "K", 0x1p10 }, { "KiB", 0x1p10 }, { "M", 0x1p20 }, { "MiB", 0x1p20 },
		{ "G", 0x1p30 }, { "GiB", 0x1p30 }, { "T", 0x1p40 }, { "TiB", 0x1p40 }, { "KB", 1e3 },
		{ "MB", 1e6 }, { "GB", 1e9 }, { "TB", 1e12 },
	};
	char *end;
	double v;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || !isfinite(v))
		return -EINVAL;
	while (*end == ' ')
		end++;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcasecmp(end, units[i].u)) {
			if (v * units[i].m >= 0x1p64)
				return -ERANGE;
			*ret = v * units[i].m;
			return 0;
		}
	return -EINVAL;
}

/* ---------------------------------------------------------------- the command table */

static const struct command commands[] = {
	{ "stats", NULL, "[POOL]", "daemon and pools: blocks, resident batch against f16, bytes per token, hits, evictions, clients", NULL, NULL,
	  cmd_stats },
	{ "pools", NULL, "", "one line per pool", NULL, NULL, cmd_pools },
	{ "clients", NULL, "[POOL]", "connections and the blocks they hold", NULL, NULL, cmd_clients },
	{ "evict", NULL, "POOL [N]", "evict up to N unreferenced cached blocks (admin)", NULL, NULL, cmd_evict },
	{ "flush", NULL, "POOL", "evict every unreferenced cached block (admin)", NULL, NULL, cmd_evict },
	{ "demote", NULL, "POOL [N]", "copy up to N (default all) unreferenced cached blocks to the pool's host tier "
	  "and free their slots (admin)", NULL, NULL, cmd_evict },
	{ "pool", "create", "NAME --model ID --layers L --kv-heads H --head-dim D --policy P\n"
	  "       [--block-tokens B] [--window R] [--window-dtype f16|bf16] [--capacity SIZE]\n"
	  "       [--sealed N --open N] [--sink-blocks 0|1] [--sinks N] [--backend host|cuda]\n"
	  "       [--device N] [--acl-uids LIST] [--acl-gids LIST] [--codebooks FILE]\n"
	  "       [--host-capacity SIZE]",
	  "create a pool (admin)",
	  "  --block-tokens B     tokens per block (default 32)\n"
	  "  --window R           the open window in tokens (default: the policy's)\n"
	  "  --window-dtype T     f16 or bf16: the open window's values\n"
	  "  --capacity SIZE      bytes (K, M, G, T: powers of 1024; default create_capacity)\n"
	  "  --sealed N --open N  slot counts instead of --capacity (both or neither)\n"
	  "  --host-capacity SIZE bytes of the pool's host tier (default none)\n"
	  "  --sink-blocks 0|1    1: each sequence's first block kept exact (kvqd.conf(5))\n"
	  "  --sinks N            sink slots with --sealed and --open (default: as many as open)\n"
	  "  --backend B          host or cuda;  --device N  the GPU\n"
	  "  --acl-uids LIST      users who may attach (names or numbers, comma-separated)\n"
	  "  --acl-gids LIST      groups who may attach (default: the caller, root and kvqd)\n"
	  "  --codebooks FILE     the pool's codebooks (kvq-codebook(5)): needed by a policy with\n"
	  "                       pq2 or pq1, sent to kvqd as a sealed memfd\n",
	  pool_create_opts, cmd_pool_create },
	{ "pool", "drop", "NAME", "free a pool nobody is attached to (admin)", NULL, NULL, cmd_pool_drop },
	{ "plan", NULL, "[--model Llama-3-8B|Llama-3-70B|SmolLM2-135M] [--layers L] [--kv-heads H]\n"
	  "       [--head-dim D] [--params N] [--weight-bits BITS] [--gpu-memory SIZE]\n"
	  "       [--gpus N] [--utilization U] [--context TOKENS] [--block-tokens B]\n"
	  "       [--sink-blocks 0|1] [--policy P]...",
	  "memory for weights and KV; sequences per KV policy (no daemon needed)",
	  "  --model M            a preset, or --layers, --kv-heads, --head-dim and --params\n"
	  "                       (these also override a preset's values; --params 8e9, 8B, 135M)\n"
	  "  --weight-bits BITS   bits per weight (default 16)\n"
	  "  --gpu-memory SIZE    per GPU (KB, MB, GB: powers of 1000; default 80GB)\n"
	  "  --gpus N             GPUs (default 1)\n"
	  "  --utilization U      share of GPU memory to plan with: 0.9 or 90% (default)\n"
	  "  --context TOKENS     tokens per sequence (default 8192)\n"
	  "  --block-tokens B     tokens per block (default 32)\n"
	  "  --sink-blocks 0|1    1: each sequence's first block kept exact (kvqd.conf(5))\n"
	  "  --policy P           a KV policy as in kvqd.conf(5), beside every format (repeatable)\n",
	  plan_opts, cmd_plan },
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char global_help[] =
	"  -s, --socket PATH   kvqd's socket (default $KVQ_SOCKET, " KVQ_ROOT_SOCKET " for root,\n"
	"                      $XDG_RUNTIME_DIR/kvqd.sock otherwise)\n"
	"  -j, --json          one JSON document on standard output\n"
	"  -h, --help          this text\n"
	"  -V, --version       the version\n"
	"  --                  the end of the options: the words after it are arguments\n";

static void synopsis(FILE *f, const struct command *c)
{
	char w[CMD_WORDS];

	fprintf(f, "%s%s%s", cmd_words(c, w, sizeof(w)), *c->args ? " " : "", c->args);
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvqctl [OPTION]... COMMAND [ARG]... [OPTION]...\n"
		   "Report on and manage the KV-cache pools of kvqd.\n\n"
		   "Options (before the command or after it):\n%s\n"
		   "Commands (kvqctl COMMAND --help: one command and its options):\n", global_help);
	for (size_t i = 0; i < N_COMMANDS; i++) {
		fputs("  ", f);
		synopsis(f, &commands[i]);
		fprintf(f, "\n        %s\n", commands[i].summary);
	}
}

static void command_help(FILE *f, const struct command *c)
{
	fputs("Usage: kvqctl [OPTION]... ", f);
	synopsis(f, c);
	fprintf(f, "\n%c%s.\n", toupper((unsigned char)c->summary[0]), c->summary + 1);
	if (c->details)
		fprintf(f, "\n%s", c->details);
	fprintf(f, "\nOptions of every command, here or before the command:\n%s", global_help);
}

int main(int argc, char **argv)
{
	struct cmdline cl = { .argc = argc, .argv = argv };
	const struct command *c = NULL;
	bool has_sub = false;
	size_t n = 0;
	int words;

	memcpy(cl.lo, global_opts, sizeof(global_opts));

	/* the options before the command ("+": stop at the command) */
	if (cmd_next(&cl) == CL_EXIT)
		return cl.status;
	if (cl.argc < 1) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < N_COMMANDS && !c; i++) {
		if (strcmp(cl.argv[0], commands[i].name))
			continue;
		has_sub |= commands[i].sub != NULL;
		if (!commands[i].sub || (cl.argc > 1 && !strcmp(cl.argv[1], commands[i].sub)))
			c = &commands[i];
	}
	if (!c && has_sub && cl.argc > 1 && (!strcmp(cl.argv[1], "--help") || !strcmp(cl.argv[1], "-h"))) {
		/* kvqctl pool --help: each of its commands */
		for (size_t i = 0; i < N_COMMANDS; i++)
			if (!strcmp(cl.argv[0], commands[i].name))
				command_help(stdout, &commands[i]);
		return 0;
	}
	if (!c) {
		die("unknown command '%s%s%s' (kvqctl --help lists them)", cl.argv[0], has_sub && cl.argc > 1 ? " " : "",
		    has_sub && cl.argc > 1 ? cl.argv[1] : "");
		return 2;
	}
	/* the command's own options beside the global ones; getopt_long
	 * reads from argv[1], so the slot of the command's last word holds
	 * the program's name (getopt's messages start with it) */
	words = c->sub ? 2 : 1;
	for (; c->opts && c->opts[n].name; n++)
		cl.lo[CTL_N_GLOBAL + n] = c->opts[n];
	cl.cmd = c;
	cl.argc -= words - 1;
	cl.argv += words - 1;
	cl.argv[0] = (char *)PROG;
	optind = 0;   /* 0: GNU getopt starts over */
	return c->run(&cl);
}

