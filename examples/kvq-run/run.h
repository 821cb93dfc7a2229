/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-run: what its files share: the options (main.c), the loaded model and
 * its K centers (load.c), a policy's pool and sequence (kv.c), text and
 * tokens (text.c), greedy generation (generate.c; a batch of sequences:
 * gen.h), the prompts file (prompts.c), and each command.
 */
#ifndef KVQ_RUN_H
#define KVQ_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kvq.h"
#include "policy.h"
#include "model.h"
#include "tokenizer.h"

#define RUN_MAX_KV 24
#define RUN_MAX_SEQS 1024      /* generate --seqs */
#define RUN_MAX_STEP 65536     /* generate --step-tokens: rows of one step */

struct opts {
	const char *model, *socket, *prompt, *prompts, *file, *dump, *system, *system_file, *salt, *out, *k_center;
	const char *kv[RUN_MAX_KV];
	unsigned n_kv;
	const char *codebooks[RUN_MAX_KV];   /* --codebooks, for the policies with pq2/pq1 */
	unsigned n_codebooks;
	uint32_t window, batch, ctx, max_tokens, limit, gen, gen_prompts, block, show, score_from;
	uint32_t seqs, step_tokens;   /* generate: sequences in the batch, rows of a step */
	uint32_t host_tier_mib;       /* --host-tier: the pool's host tier, MiB (0: none) */
	unsigned threads;
	int device;
	bool json, raw, special, decode, no_cache, stats, rotate, gpu, sink, ignore_eos;
	bool tf32, no_graphs, fp16;   /* --gpu's products in TF32; no CUDA graphs; FP16 weights and products */
};

/* One policy's pool, a sequence and the client's batch (model_step's). */
struct kv {
	const char *policy;
	char canon[KVQ_POLICY_MAX_LEN + 1];
	kvq_client *c;
	kvq_seq *s;
	kvq_batch *b;
	double bits;         /* stored bits per value of a sealed block, scales included, and codebooks
	                      * amortised over a 1 GiB pool (kvq_codebook_amortised) */
	double seq_bits;     /* bits per value of everything a sequence of 2048 tokens holds: its
	                      * sealed blocks as bits counts them, its sink and its open slices */
	uint32_t window;
};

/* K centers (kvq-run calibrate, --k-center): "KVQKC001", then u32 layers,
 * kv_heads, head_dim, rotate (0; 1 in files of an earlier kvq-run that
 * rotated K itself, refused); u64 tokens averaged, model fingerprint; then
 * float means [layers][kv_heads][head_dim]; all little-endian. */
#define KC_MAGIC "KVQKC001"
struct kc_head {
	char magic[8];
	uint32_t layers, kv_heads, head_dim, rotate;
	uint64_t tokens, model_fp;
};

/* main.c: the command line */
extern struct opts o;
/* Prints "kvq-run: " and the message to stderr and exits with status 1. */
__attribute__((format(printf, 1, 2), noreturn)) void die(const char *fmt, ...);
/* s as a number up to 2^30, or die() naming opt. */
uint32_t num(const char *s, const char *opt);

/* The clock of the seconds and tokens per second the commands print. */
static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* load.c: the model of --model or $KVQ_MODEL, loaded by load() */
extern tok *tk;
extern model *md;
extern uint64_t model_fp;
extern char model_name[96];   /* general.name, blanks as '-' (the pool's model id) */
extern float *k_center;       /* --k-center */
extern uint32_t k_center_hash;
extern double *k_sum;         /* calibrate */
extern bool want_k_sum;
/* calibrate --kv: K/V as stored, layer by layer (struct model_opts) */
extern void (*kv_tap)(void *arg, uint32_t layer, uint32_t n, const uint16_t *k, const uint16_t *v);
extern void *kv_tap_arg;
void load(void);

/* kv.c; kv_policy: --kv's policy s for this model, with +rot on its
 * quantized parts under --rotate */
void kv_policy(const char *s, struct kvq_policy *pol);
void kv_open(struct kv *k, const char *spec, uint32_t max_tokens, uint32_t seqs);
void kv_reset(struct kv *k);
/* A new empty sequence on k's client (the run's salt). */
kvq_seq *kv_seq_new(struct kv *k);
void kv_close(struct kv *k);
/* The next prefill chunk of a sequence at pos with left tokens to go
 * (--batch's multiples, kv.c). */
uint32_t chunk_len(uint32_t pos, uint32_t left);
void feed(struct kv *k, const uint32_t *ids, uint32_t n, float *logits, float *last);
uint32_t argmax(const float *x, uint32_t n);
/* Whether token t ends a continuation: stop (>= 0) or end-of-sequence. */
bool stops(uint32_t t, int stop);
/* The greedy choice of logits into *ret; false (*ret untouched) when it
 * stops. */
bool pick(const float *logits, int stop, uint32_t *ret);
void log_softmax(const float *x, uint32_t n, double *out);

/* text.c */
char *read_file(const char *path, size_t *ret_len);
uint32_t *encode(const char *text, size_t len, int special, size_t *ret_n);
/* The ids of prompt in SmolLM2's chat template, with system (NULL: the
 * default system prompt), control tokens as their ids; with --raw the
 * prompt alone, as plain text. */
uint32_t *chat_tokens(const char *prompt, const char *system, size_t *ret_n);
/* The token that ends the assistant's turn (<|im_end|>), or -ENOENT. */
int chat_stop(void);
uint32_t *file_tokens(size_t *ret_n);

/* prompts.c: kvq-run ab --prompts FILE and generate --prompts FILE */
struct prompt {
	char *text;
	char *system;    /* NULL: --system, --system-file or the default */
	unsigned line;   /* in FILE, from 1 */
};
/* FILE's prompts (*ret_n >= 1), or die() naming the file and line. */
struct prompt *prompts_read(const char *path, size_t *ret_n);
void prompts_free(struct prompt *p, size_t n);

/* generate.c */
uint32_t greedy(struct kv *k, float *last, uint32_t g, int stop, uint32_t *out, float *trace);

/* The commands; each returns the exit status. */
int cmd_generate(void);     /* generate.c */
int cmd_perplexity(void);   /* perplexity.c */
int cmd_ab(void);           /* ab.c; with --prompts ab_prompts.c (ab.h) */
int cmd_calibrate(void);    /* calibrate.c */
int cmd_tokenize(void);     /* text.c */

#endif
