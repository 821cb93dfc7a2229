/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench: measurements of the kvq formats and kernels, and of kvqd's
 * control path.
 *
 *   kvq-bench formats [--json] [--quick] [--isa portable|avx2] [--format LIST] [--rot]
 *   kvq-bench control [--socket PATH] [--pool NAME] [--seconds N] [--json]
 *   kvq-bench rotation [--json]
 *   kvq-bench decode|prefill|append [OPTIONS]
 *   kvq-bench timing [OPTIONS]
 *   kvq-bench batch [--socket PATH] [--format LIST]
 *   kvq-bench tier [--blocks N] [--format LIST] [--json]
 *   kvq-bench restart [--backend host|cuda] [--pool-gib G] [--blocks N] [--tier-gib T] [--demote N] [--json]
 *   kvq-bench remote [--backend host|cuda] [--blocks N] [--samples M] [--prompts P] [--layers L]
 *                    [--kv-heads H] [--head-dim D] [--block-tokens B] [--policy NAME] [--model PATH] [--json]
 *
 * This file: the command table and the usage text of every command.
 * formats: bench/formats.c (with workload.c, memory.c, team.c, report.c);
 * control: bench/control.c; rotation: bench/rotation.c; decode, prefill, append: bench/decode.cu;
 * timing: bench/timing.cu; batch: bench/batch.c; tier: bench/tier.c;
 * restart: bench/restart.c; remote: bench/remote.c.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "kvq_wire.h"

void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " COMMAND [OPTIONS]\n"
		"commands:\n"
		"  formats   bytes per token and CPU decode throughput of every storage format\n"
		"  control   block operations/s, round-trip and attach latency of a running kvqd; batched decode\n"
		"            steps through libkvq at batch 1, 16, 256: block operations/s, round trips per step\n"
		"  rotation  attention error at D = 128 per format and rotation block (+rot), synthetic K/V\n"
		"            with outlier channels (kvq-bench rotation [--json])\n"
		"  decode    GPU decode attention per format and shape: ms, GB/s, share of read bandwidth\n"
		"  prefill   GPU attention of prompt chunks over a cached prefix (2048 and 512 over 8192, a cold\n"
		"            8192, D = 64): ms, TFLOP/s, against SDPA\n"
		"  append    GPU write (append + seal) of a 64 x 2048-token prefill (D = 128 and 64) against copy bandwidth,\n"
		"            and a decode step's write\n"
		"            (kvq-bench decode|prefill|append --help for their options)\n"
		"  timing    what libkvq's attention timing costs a GPU worker: a 30-layer token of decode\n"
		"            calls untimed and with libkvq's event pairs (kvq-bench timing --help)\n"
		"  batch     libkvq's batch API on a cuda pool of a running kvqd (--socket PATH, --format LIST):\n"
		"            decode attention at 64 x 8192, 256 x 2048, 256 x 1024 and a 64 x 2048 write, ms per\n"
		"            layer against the kernels' own interface on the same tables\n"
		"  tier      the host tier's copies on the host: block records packed and unpacked (demotion,\n"
		"            promotion) against memcpy, Llama-3-8B geometry (kvq-bench tier [--blocks N] [--format\n"
		"            LIST] [--json])\n"
		"  restart   a kvqd under a service manager of its own: a pool of G GiB with N published blocks,\n"
		"            stopped (SIGTERM) and killed (kill -9), each start timed to READY and to its first\n"
		"            hit (kvq-bench restart [--backend host|cuda] [--pool-gib G] [--blocks N] [--tier-gib T]\n"
		"            [--demote N] [--layers L] [--kv-heads H] [--head-dim D] [--json])\n"
		"  remote    the remote tier of host or cuda pools: a Redis Cluster (3 masters, 3 replicas) started on\n"
		"            loopback and two kvqd nodes; node B's fetch of N blocks node A wrote through against\n"
		"            a pipelined hiredis GET loop of the same values, write-through latency (M samples),\n"
		"            a prompt's remote hit against its cold run, bytes per token against f16; kvq-run on\n"
		"            a real model (--model PATH, else $KVQ_MODEL or tools/fetch-model.sh's copy; skipped\n"
		"            without one): its prefill from the remote against recomputing the prefix (kvq-bench\n"
		"            remote [--backend host|cuda] [--blocks N] [--samples M] [--prompts P] [--layers L]\n"
		"            [--kv-heads H] [--head-dim D] [--block-tokens B] [--policy NAME] [--model PATH]\n"
		"            [--json])\n"
		"options of formats:\n"
		"  --json          print the results as one JSON object on the last line of stdout\n"
		"  --quick         small working set and few runs (a smoke test, not a measurement)\n"
		"  --rot           each format again with K and V rotated (+rot): decode's cost of the rotation\n"
		"  --isa NAME      vector path of the CPU kernels: portable or avx2 (default: best)\n"
		"  --format LIST   only these formats, comma-separated (f16 always runs: the reference)\n"
		"  --help          this text\n"
		"options of control:\n"
		"  --socket PATH   kvqd's socket (default $KVQ_SOCKET, " KVQ_ROOT_SOCKET " for root,\n"
		"                  $XDG_RUNTIME_DIR/kvqd.sock otherwise)\n"
		"  --pool NAME     pool to attach to, created when it does not exist (default kvq-bench;\n"
		"                  an existing pool must have model kvq-bench, L=2 H=2 D=64 B=16, int8); the\n"
		"                  batched cycle attaches to NAME-batch the same way (1024 open, 4096 sealed slots)\n"
		"  --seconds N     length of the block-operation run (default 3); the batched cycle runs a\n"
		"                  third of it at each batch size\n"
		"  --json          only the figures, as one JSON object on the last line of stdout:\n"
		"                  {\"ops_per_s\":...,\"rtt_p50_us\":...,\"rtt_p99_us\":...,\"attach_ms\":...,\n"
		"                  \"batch\":[{\"size\":1,\"ops_per_s\":...,\"steps_per_s\":...,\"trips_per_step\":...,\n"
		"                  \"requests_per_step\":...,\"releases_per_step\":...},...]}\n"
		"  a block operation is one block through one of Alloc, Seal, Publish, Release (batches of 64);\n"
		"  in the batched cycle (a step: kvq_batch_add of one token per sequence, begin, a write per\n"
		"  layer, commit) one block allocated by a begin, sealed or published by a commit, or released\n"
		"  when its sequence ends at 128 tokens; round trips and requests per step are what\n"
		"  kvq_batch_requests reports of begin and commit;\n"
		"  targets: >= 300000 block operations/s from one client, round-trip p99 < 100 us (idle machine)\n"
		"  exit status 1 on any error (kvqd not running, a request refused), with a one-line message\n");
}

#ifdef KVQ_WITH_CUDA
int bench_decode(int argc, char **argv);   /* bench/decode.cu */
int bench_timing(int argc, char **argv);   /* bench/timing.cu */
#else
static int bench_decode(int argc, char **argv)
{
	(void)argc;
	fprintf(stderr, PROG " %s: this kvq-bench was built without CUDA\n", argv[0]);
	return 1;
}
#define bench_timing bench_decode     /* the same refusal */
#define bench_batch bench_decode
#endif

struct command {
	const char *name;
	int (*run)(int argc, char **argv);
};

static const struct command commands[] = {
	{ "formats", cmd_formats },
	{ "control", cmd_control },
	{ "rotation", cmd_rotation },
	{ "decode", bench_decode },
	{ "prefill", bench_decode },
	{ "append", bench_decode },
	{ "timing", bench_timing },
	{ "batch", bench_batch },
	{ "tier", cmd_tier },
	{ "restart", cmd_restart },
	{ "remote", cmd_remote },
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
