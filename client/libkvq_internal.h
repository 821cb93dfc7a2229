/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside libkvq: a client's and a sequence's state, shared by the library's
 * files, and the table of operations a pool's backend gives the sequence
 * (as kernels/cpu/ops.h gives one per instruction set):
 *
 *   client.c       the connection, attach and the block requests (RPC)
 *   batched.c      the batched requests, written together (one round trip)
 *   attach_params.c  what of the caller's struct kvq_attach_params is read
 *   seq.c          kvq_seq: the backend-neutral block table, one sequence's
 *                  part of a step
 *   batch.c        kvq_batch: a step over many sequences, and the one path
 *                  kvq_seq's own begin, write, attention and commit take
 *   timing.c       attention timings, binned and reported with a Seal
 *   host.c         the host backend: mmap, the CPU kernels
 *   team.c         the host backend's threads: a batch's sequences in parallel
 *   seq_cuda.c     the cuda backend: the CUDA half of the sequence
 *   gpu_timer.c    event pairs that time the cuda backend's attention calls
 *   cuda_import.c  a cuda pool's import (the driver: kernels/cuda/driver.h)
 *   cuda_none.c    the cuda backend of a build without CUDA
 *
 * Only seq_cuda.c, gpu_timer.c and cuda_import.c see CUDA's headers; they
 * are built when CUDA is configured, cuda_none.c when it is not.
 */
#ifndef KVQ_LIBKVQ_INTERNAL_H
#define KVQ_LIBKVQ_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "cpu/cpu.h"
#include "kvq.h"
#include "layout.h"
#include "timing_buckets.h"

struct client_backend;
struct team;
struct client_cuda;        /* a cuda pool's import (cuda_import.c) */
struct tables_cuda;        /* a table set's device copy (seq_cuda.c) */

/*
 * Attention timing (kvq.proto, "Attention timings"), when the attach reply
 * asks for it: each timed call goes to the bin of its phase and (K, V)
 * formats; the bins go with the next Seal once report_ms has passed, then
 * start again.  The cuda backend times with events it reads later without
 * waiting (gpu: its own state); the host backend with the CPU clock.
 */
struct client_timing_bin {
	int phase, kfmt, vfmt;
	uint64_t bucket[KVQ_TIMING_BUCKETS + 1];
	double seconds;
	uint64_t kv_bytes;
};

struct client_timing {
	uint32_t report_ms;             /* 0: not timing */
	int64_t last_ms;                /* CLOCK_MONOTONIC of the attach or the last report */
	uint32_t n;                     /* bins in use (one per phase and format pair seen) */
	bool any;                       /* a call is binned since the last report */
	struct client_timing_bin bin[KVQ_PROTO_MAX_TIMING_BINS];
	void *gpu;                      /* the cuda backend's events in flight */
};

struct kvq_client {
	struct kvq_conn conn;           /* its msg: kvq_client_error; its pool_fd: the attach reply's until mapped */
	struct kvq_policy pol;
	struct kvq_layout *L;
	const struct client_backend *be;  /* the attached pool's backend; NULL before attach */
	void *base;                     /* host: mmap address; cuda: device address */
	size_t map_bytes;
	void *stream;                   /* a cudaStream_t: where libkvq's CUDA work runs (NULL: legacy default) */
	struct client_cuda *cuda;       /* a cuda pool's import, or NULL */
	struct team *team;              /* a host pool's threads for a batch (team.h), or NULL */
	int device;                     /* a cuda pool's device ordinal in this process, else -1 */
	kvq_trace_fn trace;             /* kvq_client_set_trace, or NULL */
	void *trace_ctx;
	char backend[8];
	char pool[KVQ_PROTO_MAX_NAME + 1];
	struct client_timing timing;
	char group[KVQ_PROTO_MAX_NAME + 1];   /* kvq_client_set_group: "" for none */
	uint32_t rank, world_size;
	uint32_t sink_blocks, n_sink;         /* kvq_client_set_sinks */
	/* a lost connection replaced (client_recover): what kvq_client_attach
	 * was asked, to attach again; this connection's holder and the
	 * memory mapped (AttachReply); the epoch, bumped at each replacement,
	 * that makes the sequences of an older connection stale */
	struct client_attach *again;
	uint64_t holder, memory_id;
	uint32_t epoch;
	char name[KVQ_PROTO_MAX_NAME + 1];    /* said at Hello */
};

/* A connection that was lost (conn.broken) replaced by a new one to the
 * same socket, attached to the same pool again (the mapping kept when
 * kvqd says it is the same memory, else mapped anew) and naming the lost
 * connection's holder, so that what a restart held for it is released:
 * after the client's work on the device is done and with the epoch bumped
 * first, so no sequence of before writes or reads again.  0 when the
 * connection was not lost; -ENOTCONN when the client never attached;
 * otherwise the new connection's or attach's error (the connection stays
 * lost: the next request tries again). */
int client_recover(kvq_client *c);

/* 0, or -ESTALE (with the reason in kvq_client_error) for a sequence of a
 * connection that is lost or was replaced (client_recover). */
int seq_live(const kvq_seq *s);

/*
 * The block tables of one kernel call over nseq sequences, a write's or an
 * attention's (struct kvq_seq_table, their ids in the sequences' arrays):
 * sequence i's rows of k, v, q and out are t[i].row0 .. t[i].row0 +
 * t[i].m - 1, rows in all.  ns[i] and no[i] count t[i]'s sealed and open
 * ids.  The backend's device copy (dev) is made on first use after the
 * tables change (dirty) and reused by every call until then: a step's
 * tables go to the GPU once, not once per layer.
 */
struct client_tables {
	struct kvq_seq_table *t;
	uint32_t *ns, *no;
	uint32_t nseq, cap;
	uint32_t rows, max_m, max_n;
	bool dirty;
	struct tables_cuda *dev;        /* the cuda backend's, or NULL */
};

/* Room for nseq tables (kept between steps); returns 0 or -ENOMEM. */
int client_tables_reserve(struct client_tables *t, uint32_t nseq);

/* Table i set to tab with its counts; rows, max_m and max_n follow (call
 * for i = 0, 1, .. in order after client_tables_reserve). */
void client_tables_set(struct client_tables *t, uint32_t i, const struct kvq_seq_table *tab, uint32_t ns,
		       uint32_t no);

/* Frees t's memory, the backend's copy too (after its work: c's drain). */
void client_tables_free(kvq_client *c, struct client_tables *t);

/*
 * State: n tokens; sealed[0..n_sealed) hold the first n_sealed*B tokens,
 * open[0..n_open) (with resv[]) the rest.  Normally n_sealed*B = S(n);
 * right after from_prompt it is n (all sealed).  Writes are given to
 * kvq_cpu_write shifted by n_sealed blocks (its n is n - n_sealed*B), which
 * covers both: the kernel's split of the shifted sequence equals the real
 * one whenever the sealed prefix stays sealed.
 */
struct kvq_seq {
	kvq_client *c;
	uint32_t epoch;                 /* c's when made (seq_live) */
	uint8_t salt[KVQ_PROTO_MAX_SALT];
	size_t salt_len;
	uint8_t rid[KVQ_PROTO_MAX_REQUEST_ID];   /* kvq_seq_set_request */
	size_t rid_len;
	uint32_t *tokens;
	uint32_t n, cap;
	/* with sink blocks, block 0's entry is its sink (KVQ_SINK_ID): in open
	 * (resv -1) while in the window, in sealed after, never sealed itself */
	int32_t *sealed;
	uint32_t n_sealed, n_pub;       /* sealed[0..n_pub) are published */
	int32_t *open, *resv;
	uint32_t n_open;
	/* write in progress (begin .. commit) */
	bool busy;
	uint32_t m;
	int32_t *p_sealed, *p_open, *p_resv;
	uint32_t p_n_sealed, p_n_open;
	uint8_t *written;               /* per layer */
	/* the tables a commit adopts, made before kvqd is asked (seq_commit_prepare) */
	int32_t *c_sealed, *c_open, *c_resv;
	struct client_tables *tabs;     /* the sequence's own calls' (a batch of one), or NULL */
};

/*
 * What a pool's backend does for libkvq.  Every operation of a compiled
 * backend is set; each returns 0 or a negative code with the reason in
 * kvq_client_error.
 */
struct client_backend {
	const char *name;               /* as the attach reply names it */
	bool compiled;                  /* false: this libkvq was built without it (no operations) */
	bool sinks;                     /* its kernels read sink blocks (kernels/layout.h) */
	/* maps the pool from the attach reply's descriptor (kept by the caller)
	 * and sets c->base and c->map_bytes; nothing is left mapped on failure */
	int (*map)(kvq_client *c, int fd, uint64_t map_bytes, int device, const uint8_t *uuid, size_t uuid_len);
	/* waits for the work queued on the pool, then unmaps it */
	void (*unmap)(kvq_client *c);
	/* one layer's write over the tables w (kvq_batch_write, kvq_seq_write) */
	int (*write)(kvq_client *c, struct client_tables *w, uint32_t layer, const void *k, const void *v);
	/* attention over the tables a: q and out float host arrays; out written on return */
	int (*attention)(kvq_client *c, struct client_tables *a, uint32_t layer, uint32_t q_heads, float scale,
			 const float *q, float *out);
	/* attention with q and out in device memory; NULL: the backend has no device memory */
	int (*attention_device)(kvq_client *c, struct client_tables *a, uint32_t layer, uint32_t q_heads,
				float scale, const void *q, void *out, bool out_f32);
	/* copies n bytes inside the pool, before any work queued later */
	int (*copy)(kvq_client *c, void *to, const void *from, size_t n);
	/* returns once the work queued on the pool is done: before kvqd is
	 * told a block is sealed or published, and before slots are released */
	int (*drain)(kvq_client *c);
	/* frees a table set's device copy (NULL: the backend makes none) */
	void (*tables_free)(kvq_client *c, struct tables_cuda *dev);
	/* bins the timed calls that have completed, without waiting (NULL:
	 * the backend times calls as they return) */
	void (*timing_poll)(kvq_client *c);
};

extern const struct client_backend client_host;
extern const struct client_backend client_cuda;

/* Reports one kernel call to the client's trace hook, if any (kvq.h
 * struct kvq_trace: the addresses the kernel gets). */
void client_trace(kvq_client *c, int op, uint32_t layer, bool device, const void *k, const void *v, const void *q,
		  void *out);

/* timing.c: the phase of an attention call of n_q query rows, the KV bytes
 * one of layer reads over table t with ns sealed and no open entries (a sink
 * block, an open slice, among the sealed ones), and the CLOCK_MONOTONIC
 * seconds; a call of seconds into its bin; whether a report is due (the
 * backend's completed calls binned first); the report into rep, with
 * bins[] and ptrs[] of the caller's (KVQ_PROTO_MAX_TIMING_BINS each,
 * pointing into c until timing_sent); once it was sent, the bins emptied. */
int timing_phase(uint32_t n_q);
uint64_t timing_kv_bytes(const kvq_client *c, uint32_t layer, const struct client_tables *t);
double timing_now(void);
void timing_add(kvq_client *c, uint32_t layer, int phase, uint64_t kv_bytes, double seconds);
bool timing_due(kvq_client *c);
void timing_report(kvq_client *c, Kvq__AttentionReport *rep, Kvq__AttentionBin *bins, Kvq__AttentionBin **ptrs);
void timing_sent(kvq_client *c);

/* Leaves the reason in kvq_client_error; returns r. */
__attribute__((format(printf, 3, 4)))
int client_fail(kvq_client *c, int r, const char *fmt, ...);

/* kvq_client_attach over a struct of this library's size (attach_params.c
 * makes one of the caller's). */
int client_attach(kvq_client *c, const struct kvq_attach_params *p);

/* kvq_client_alloc with n_sink sink slots too (ret_sink: KVQ_SINK_ID()s). */
int client_alloc(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t n_sink, uint32_t *ret_open,
		 uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink);

/* kvq_client_lookup with a request id (rid_len 0: none), for a group's
 * member pool (kvq_seq_set_request). */
int client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens, const void *salt,
		  size_t salt_len, const void *rid, size_t rid_len, uint32_t *ret_ids, uint32_t *ret_n);

/*
 * Batched requests (kvq_batch, batch.c).  Each sends the fewest requests
 * the protocol's limits allow, written together, and reads their replies
 * after: cnt (may be NULL) gets the requests sent and the waits for
 * replies (round trips).  All or nothing where the protocol is: on
 * failure nothing is held that was not held before.
 */
struct client_count {
	uint32_t requests, waits;
};

/* One prompt of a batched lookup: tokens[0..n_tokens), at most max_tokens
 * of them matched (S(n) capped at KVQ_PROTO_MAX_IDS blocks, as
 * kvq_seq_from_prompt caps it), the sequence's salt and request id;
 * ret_ids gets max_tokens / B ids (a sink first, as KVQ_SINK_ID), ret_n
 * the blocks found, each now referenced by the caller. */
struct client_prompt {
	const uint32_t *tokens;
	uint32_t n_tokens, max_tokens;
	const void *salt, *rid;
	size_t salt_len, rid_len;
	uint32_t *ret_ids;
	uint32_t ret_n;
};

/* Looks n prompts up (Lookup's prompts, protocol 8).  Returns 0, or a
 * daemon or transport code with no reference held. */
int client_lookup_many(kvq_client *c, struct client_prompt *p, uint32_t n, struct client_count *cnt);

/* client_alloc for counts of any size.  Returns 0; -ENOSPC with *ret_short
 * (may be NULL) the slots the pool was short of, as kvqd counted them;
 * -EDQUOT (*ret_short 0) or another code; nothing held on failure. */
int client_alloc_many(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t n_sink, uint32_t *ret_open,
		      uint32_t *ret_reserved, uint32_t *ret_sealed, uint32_t *ret_sink, uint32_t *ret_short,
		      struct client_count *cnt);

/* One chain to publish (kvq_client_publish's arguments): n blocks ids[]
 * (in a pool with sink blocks a chain may start with a KVQ_SINK_ID()),
 * parent (-1: none), n * B tokens, the sequence's salt; ret_ids[n] the ids
 * to use from now on; published set once its request succeeded. */
struct client_chain {
	const uint32_t *ids;
	uint32_t n;
	int64_t parent;
	const uint32_t *tokens;
	const void *salt;
	size_t salt_len;
	uint32_t *ret_ids;
	bool published;
};

/* Seals n_seal pairs (open_ids[i] into sealed_ids[i]) and publishes
 * n_chains chains: the Seal requests (carrying the attention timings when
 * a report is due; with no pair to seal, a Seal for the timings alone
 * whose failure is no error) and then the Publish requests, written
 * together; a chain too long for one request continues once the reply to
 * its first part is read.  Returns 0 or the first failure; *ret_sealed
 * says whether every pair was sealed, each chain's published whether it
 * was published. */
int client_commit(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
		  struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt);

/*
 * A step (batch.c), for kvq_batch and for a sequence's own calls (a batch
 * of one): e[0..n) its sequences, each with m new tokens.
 */
struct batch_entry {
	kvq_seq *s;
	const uint32_t *tokens;         /* m of them */
	uint32_t m;
	unsigned flags;                 /* KVQ_BATCH_LOOKUP */
	uint32_t hit;                   /* tokens a lookup found: the step appends tokens[hit..m) */
};

/* What a commit seals besides its pairs: nothing (a publish), a Seal for
 * the attention report when one is due and there is no pair (client_commit,
 * the Seal's failure no error), or a Seal whatever (kvq_client_seal);
 * client_commit sealing as mode says. */
enum client_seal { CLIENT_SEAL_NONE, CLIENT_SEAL_DUE, CLIENT_SEAL_ALWAYS };
int client_commit_run(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
		      struct client_chain *chains, uint32_t n_chains, bool *ret_sealed, struct client_count *cnt,
		      enum client_seal mode);

/* Releases ns sealed and no open ids in as few requests as the limits
 * allow (one, up to KVQ_PROTO_MAX_IDS ids); returns 0 or the first failure. */
int client_release_many(kvq_client *c, const uint32_t *sealed, uint32_t ns, const uint32_t *open, uint32_t no);

/* kvq_batch_begin and kvq_batch_commit over e[0..n). */
int batch_step_begin(kvq_client *c, struct batch_entry *e, uint32_t n, uint32_t *ret_short, struct client_count *cnt);
int batch_step_commit(kvq_client *c, struct batch_entry *e, uint32_t n, struct client_count *cnt);

/* seq.c: one sequence's part of a step.  What m more tokens need
 * (checked: -EBUSY, -EINVAL, -E2BIG), with room for the step's table made;
 * the table filled from the ids granted (advancing the pointers); the
 * step dropped (nothing released); the ids the step allocated (room for
 * p_n_sealed and p_n_open); the most tokens a lookup of an n-token prompt
 * may match (S(n), at most KVQ_PROTO_MAX_IDS blocks); a lookup's hit of got blocks ids taken
 * as the prefix of an empty sequence, and undone. */
struct seq_need {
	uint32_t open, sealed, sink;
};
int seq_step_plan(kvq_seq *s, uint32_t m, struct seq_need *need);
void seq_step_take(kvq_seq *s, const uint32_t *tokens, uint32_t m, const uint32_t **ao, const uint32_t **ar,
		   const uint32_t **as, const uint32_t **ak);
void seq_step_drop(kvq_seq *s);
void seq_step_new_ids(const kvq_seq *s, uint32_t *sealed, uint32_t *ns, uint32_t *open, uint32_t *no);
uint32_t seq_lookup_max(const struct kvq_layout *L, uint32_t n);
int seq_take_hit(kvq_seq *s, const uint32_t *tokens, const uint32_t *ids, uint32_t got);
void seq_untake_hit(kvq_seq *s);

/* The table a write of the step reads (shifted past the committed sealed
 * prefix); the table attention of the last n_q stored tokens reads (-EINVAL
 * for bad counts, or before the rest of a prompt is appended). */
void seq_write_table(const kvq_seq *s, struct kvq_seq_table *w, uint32_t *ns, uint32_t *no);
int seq_attn_table(kvq_seq *s, uint32_t q_heads, uint32_t n_q, struct kvq_seq_table *t, uint32_t *ns,
		   uint32_t *no);

/* A commit's parts: -EINVAL unless a step is begun and every layer was
 * written; the tables to adopt made (-ENOMEM); the seal pairs (so, ss:
 * room for n_open entries; returns the count); the new sealed blocks to
 * publish as a chain (ids: room for them); the new tables adopted once the
 * seal succeeded, and a chain's published ids taken. */
int seq_commit_check(kvq_seq *s);
int seq_commit_prepare(kvq_seq *s);
uint32_t seq_seal_pairs(const kvq_seq *s, uint32_t *so, uint32_t *ss);
uint32_t seq_publish_count(const kvq_seq *s);
void seq_chain(kvq_seq *s, struct client_chain *ch, uint32_t *ids, uint32_t *ret_ids);
void seq_commit_adopt(kvq_seq *s);
void seq_commit_published(kvq_seq *s, const struct client_chain *ch);

/* The softmax scale attention uses: scale, or 1/sqrt(head_dim) for 0. */
float seq_scale(const kvq_client *c, float scale);

#endif
