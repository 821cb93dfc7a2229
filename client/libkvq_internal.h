/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside libkvq: a client's and a sequence's state, shared by the library's
 * files, and the table of operations a pool's backend gives the sequence
 * (as kernels/cpu/ops.h gives one per instruction set):
 *
 *   client.c       the connection, attach and the block requests (RPC)
 *   attach_params.c  what of the caller's struct kvq_attach_params is read
 *   seq.c          kvq_seq: the backend-neutral block table
 *   timing.c       attention timings, binned and reported with a Seal
 *   host.c         the host backend: mmap, the CPU kernels
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
struct client_cuda;        /* a cuda pool's import (cuda_import.c) */
struct seq_cuda;           /* a sequence's device buffers (seq_cuda.c) */

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
	int device;                     /* a cuda pool's device ordinal in this process, else -1 */
	kvq_trace_fn trace;             /* kvq_client_set_trace, or NULL */
	void *trace_ctx;
	char backend[8];
	char pool[KVQ_PROTO_MAX_NAME + 1];
	struct client_timing timing;
	char group[KVQ_PROTO_MAX_NAME + 1];   /* kvq_client_set_group: "" for none */
	uint32_t rank, world_size;
	uint32_t sink_blocks, n_sink;         /* kvq_client_set_sinks */
};

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
	struct seq_cuda *cuda;          /* cuda pools: made by the first kernel call, or NULL */
};

/*
 * What a pool's backend does for libkvq.  Every operation of a compiled
 * backend is set; each returns 0 or a negative code with the reason in
 * kvq_client_error.  ns and no count the sealed and open ids of the table
 * a write or an attention reads.
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
	/* one layer of kvq_seq_write() */
	int (*write)(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *w, uint32_t ns, uint32_t no,
		     const void *k, const void *v);
	/* kvq_seq_attention: q and out float host arrays; out written on return */
	int (*attention)(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *as, uint32_t ns, uint32_t no,
			 uint32_t q_heads, float scale, const float *q, float *out);
	/* kvq_seq_attention_device; NULL: the backend has no device memory */
	int (*attention_device)(kvq_seq *s, uint32_t layer, const struct kvq_seq_table *as, uint32_t ns, uint32_t no,
				uint32_t q_heads, float scale, const void *q, void *out, bool out_f32);
	/* copies n bytes inside the pool, before any work queued later */
	int (*copy)(kvq_client *c, void *to, const void *from, size_t n);
	/* returns once the work queued on the pool is done: before kvqd is
	 * told a block is sealed or published */
	int (*drain)(kvq_client *c);
	/* before a sequence's slots are released: waits for the work that may
	 * read them and frees s->cuda */
	void (*seq_free)(kvq_seq *s);
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
uint64_t timing_kv_bytes(const kvq_client *c, uint32_t layer, const struct kvq_seq_table *t, uint32_t ns,
			 uint32_t no);
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
 * its first part is read.  Returns 0 or the first failure; each chain's
 * published says whether it was. */
int client_commit(kvq_client *c, uint32_t n_seal, const uint32_t *open_ids, const uint32_t *sealed_ids,
		  struct client_chain *chains, uint32_t n_chains, struct client_count *cnt);

#endif
