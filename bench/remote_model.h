/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench remote, part (d) (bench/remote_model.c): what a node B worker
 * running a real model saves against recomputing the same prefix.
 */
#ifndef KVQ_BENCH_REMOTE_MODEL_H
#define KVQ_BENCH_REMOTE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

/* One kvq-run generate, its own figures (--json). */
struct rmodel_run {
	double lookup_s, prefill_s;   /* the prefix lookup (a remote's fetch in it), the prefill after it */
	uint32_t prompt, hit;         /* the prompt's tokens, those taken from the prefix cache */
};

enum rmodel_state { RMODEL_RAN, RMODEL_SKIPPED, RMODEL_FAILED };

struct rmodel {
	enum rmodel_state state;
	char why[384];                /* skipped or failed: why */
	char file[256];               /* the model's file */
	char system[256];             /* the system prompt's file */
	char model_id[257];           /* as kvq-run names it to kvqd */
	uint32_t layers, kv_heads, head_dim, block_tokens, threads;
	bool gpu;                     /* cuda pools on every node, kvq-run --gpu */
	struct rmodel_run a, b, c;    /* node A cold (writing through), node B, node C cold (no remote) */
	uint64_t written, fetched, bytes_in;   /* A's remote_written, B's remote_fetched and remote_bytes_in */
};

/* Part (d) on the cluster of remote (the lines of a [remote shared]
 * section for kvqd.conf) with KV policy policy: the model of path, else
 * $KVQ_MODEL, else where tools/fetch-model.sh keeps it; on cuda pools
 * with kvq-run's GPU path when gpu.  Fills *r; its
 * state says whether it ran. */
void rmodel_run(const char *path, const char *remote, const char *policy, bool gpu, struct rmodel *r);
/* *r as lines of text, or as the members of a JSON object's "model" key
 * (a leading comma, no closing brace). */
void rmodel_print(const struct rmodel *r, const char *policy, bool json);

#endif
