/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq: the client library of kvqd.
 *
 * Functions return 0 (or a non-negative value) on success and a negative
 * errno-style code on failure (kvq_wire.h: the project's codes);
 * kvq_strerror() names it.
 */
#ifndef KVQ_H
#define KVQ_H

#include <stddef.h>
#include <stdint.h>

/* The project's error codes (KVQ_E*), kvq_strerror() and
 * kvq_default_socket(). */
#include "kvq_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version string of the library ("0.1.0"). */
const char *kvq_version(void);

/* The protocol version this libkvq speaks to kvqd (checked at Hello; a
 * daemon speaking another one refuses the connection). */
unsigned kvq_protocol_version(void);

/* ---------------------------------------------------------------- client */

/*
 * A connection to kvqd, serving at most one pool (kvq.proto: one Attach per
 * connection).  Requests are synchronous: each call sends one request and
 * reads its reply.  Not thread-safe: one thread per kvq_client at a time.
 * Calls that fail with a code from the daemon or from a local check leave a
 * one-line reason in kvq_client_error().
 */
typedef struct kvq_client kvq_client;
struct kvq_layout;

/* Dtype of the open window (enum kvq_dtype's values). */
enum { KVQ_ACT_F16 = 0, KVQ_ACT_BF16 = 1 };

/* Everything Attach sends.  policy is any form kvq_policy_parse accepts;
 * window 0 accepts the pool's (or the default for a new pool).  create:
 * nonzero lets the daemon create the pool with n_sealed / n_open slots
 * (both 0: sized by the daemon's configuration) on backend ("host", "cuda",
 * NULL or "" for the daemon's default) and device (-1 any).  codebooks:
 * the path of a codebook file (kvq-codebook(5), at most 1 GiB) or NULL;
 * libkvq copies it into a sealed memfd sent with the Attach.  A pool whose
 * policy uses a codebook format (pq2, pq1) is created only with it; joining
 * a pool, codebooks sent must be the pool's (KVQ_ELAYOUT otherwise) and
 * NULL takes the pool's.
 *
 * Interface 7: the struct grows at its end without a new soname.
 * kvq_client_attach (a macro) passes the size of the caller's struct, and
 * the library reads only that much (fields past it count as zero); a
 * larger struct than the library knows is accepted when the bytes it does
 * not know are zero, refused with -E2BIG otherwise (the program sets a
 * field this libkvq does not have).  Zero-initialise the fields a program
 * does not set (a designated initialiser does). */
struct kvq_attach_params {
	const char *pool;
	const char *model_id;
	uint32_t layers, kv_heads, head_dim, block_tokens;
	const char *policy;
	uint32_t window;
	int act;
	int create;
	uint32_t n_sealed, n_open;
	const char *backend;
	int device;
	const char *codebooks;          /* interface 3 */
	uint64_t host_capacity;         /* interface 9: bytes of a created pool's host tier (0: none) */
};

/* One pool as Stats reports it (kvq.proto PoolStats).  Frozen with
 * struct kvq_sink_stats (their size is the ABI): a figure added since is
 * reached by name (kvq_client_pool_stat). */
struct kvq_stats {
	char name[65];
	char model_id[257];
	char backend[8];
	int device;
	uint32_t layers, kv_heads, head_dim, block_tokens, window;
	uint64_t total_bytes;
	uint32_t n_sealed, n_open;
	uint32_t sealed_free, sealed_reserved, sealed_held, cached, referenced, open_used;
	uint64_t lookup_tokens, hit_tokens, evictions, alloc_failures;
	uint32_t clients;
};

/* A pool's sink blocks as Stats reports them (kvq.proto PoolStats 40-46;
 * interface 6): sink_blocks 0 or 1, its sink slots (n_sink) free, held
 * (allocated, not published), cached and cached with a reference; the
 * live sequences (with sink blocks: the references on sink blocks, exact)
 * and the tokens of referenced sink blocks (at most). */
struct kvq_sink_stats {
	uint32_t sink_blocks, n_sink, sink_free, sink_held, sink_cached, sink_referenced;
	uint32_t sequences;
	uint64_t sink_tokens;
};

/* Connects to path (NULL: kvq_default_socket) and says Hello with name
 * (printable ASCII without blanks, at most 64 bytes; NULL: "libkvq").
 * Connecting and every call after are bounded: 30 s for the connection to
 * be taken, and 30 s for each request and its reply.  Returns 0 and
 * *ret_client, or -EINVAL, -ENOMEM, a connect error (-ENOENT,
 * -ECONNREFUSED, -EACCES), -ETIMEDOUT (kvqd took no connection or gave no
 * reply in time), -EUSERS (kvqd refused: at its connection limit or the
 * uid's), -EMFILE (kvqd is out of file descriptors), -EPROTONOSUPPORT (the
 * daemon speaks another protocol version) or a transport error.  On
 * failure there is no client to ask for the reason.
 *
 * A connection lost once attached (kvqd restarted: libkvq(3), WHEN KVQD
 * RESTARTS) makes every sequence of the client stale (-ESTALE from each
 * call on it but kvq_seq_free); the next request connects to path again,
 * attaches to the same pool (the mapping kept when it is the same memory)
 * and releases what a restart held for the lost connection. */
int kvq_client_connect(const char *path, const char *name, kvq_client **ret_client);

/* Unmaps the pool and closes the connection; the daemon then drops the
 * lease (every slot and reference this connection held).  On the host
 * backend no kernel work is outstanding when a call returns, so nothing is
 * waited for; on a cuda pool the client's stream is drained first.  NULL
 * is fine. */
void kvq_client_free(kvq_client *c);

/* Reason for the last failure on c (the daemon's message or a local one);
 * "" when none.  Valid until the next call on c. */
const char *kvq_client_error(const kvq_client *c);

/* The daemon's name for this connection (HelloReply client_id). */
uint64_t kvq_client_id(const kvq_client *c);

/*
 * Joins (and maybe creates) a pool and maps its memory.  The reply's
 * geometry is rebuilt with kvq_layout_new on this side and must give the
 * daemon's byte count.  Returns 0; for p->codebooks, the file's open(2) or
 * read(2) error, or -EFBIG (over 1 GiB); the daemon's codes (KVQ_ELAYOUT
 * (also: codebooks other than the pool's), KVQ_EPOLICY, -EINVAL (also:
 * codebooks missing for a codebook policy, sent for another, or a file
 * that does not parse or fit the pool), -ENOENT (no pool the caller may
 * see), -EACCES (may not create one), -EEXIST, -EISCONN, -ENOSPC, ...);
 * KVQ_EPROTOCOL
 * when the reply is inconsistent (no descriptor, sizes that disagree);
 * for a pool on the cuda backend: -ENOTSUP when this libkvq was built
 * without CUDA, -ENODEV (with a message) where no usable driver or the
 * pool's device (matched by uuid) is not visible, or the driver's error
 * from the import (cuMemImportFromShareableHandle, cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess); or an mmap error (host).  A cuda pool is mapped
 * through the device's primary context, which this call makes current on
 * the calling thread; kvq_seq runs the CUDA kernels (kernels/cuda) on it,
 * the CPU kernels on a host pool.
 */
int kvq_client_attach(kvq_client *c, const struct kvq_attach_params *p);

/*
 * Interface 7: kvq_client_attach reading the first size bytes of *p, at
 * least KVQ_ATTACH_PARAMS_MIN (the struct of interfaces 3 to 6).  Returns
 * what kvq_client_attach returns; -EINVAL for a smaller size, -E2BIG (with
 * a message) when bytes past the struct this libkvq knows are not zero.
 * kvq_client_attach calls it with sizeof *p; binaries built against
 * interfaces 3 to 6 call the function of that name, which reads
 * KVQ_ATTACH_PARAMS_MIN bytes.
 */
int kvq_client_attach_sized(kvq_client *c, const struct kvq_attach_params *p, size_t size);
#define KVQ_ATTACH_PARAMS_MIN (offsetof(struct kvq_attach_params, codebooks) + sizeof(const char *))
#define kvq_client_attach(c, p) kvq_client_attach_sized((c), (p), sizeof *(p))

/*
 * Interface 4: makes the next kvq_client_attach join tensor-parallel group
 * `group` (1-64 bytes) as rank `rank` of `world_size` (2-64): the attach's
 * pool is this rank's member pool (created as any pool is), kv_heads the
 * model's KV heads over all ranks; the pool holds this rank's shard
 * (kv_heads / world_size heads, or one when world_size is a multiple of
 * kv_heads: the layout shows it), and its lookups need a request id that
 * every rank of a request gives (kvq_seq_set_request): all ranks get the
 * same hit, and a block is found only once every rank has published it
 * (kvqd.conf(5), TENSOR-PARALLEL GROUPS).  Returns 0, -EINVAL or -EISCONN.
 */
int kvq_client_set_group(kvq_client *c, const char *group, uint32_t rank, uint32_t world_size);

/*
 * Interface 5: makes the next kvq_client_attach ask for a pool with
 * sink_blocks (0 or 1; kvq.proto "Sink blocks"): with 1 every sequence's
 * first block is kept exact, in the open window's dtype, in a sink slot,
 * and kvq_seq does the rest.  The attach must give the pool's value
 * (KVQ_ELAYOUT otherwise; the default 0 joins only pools without sinks).
 * n_sink: sink slots of a pool the attach creates with given slot counts
 * (0: as many as open slots).  Set before the attach; returns 0, -EINVAL
 * or -EISCONN.
 */
int kvq_client_set_sinks(kvq_client *c, uint32_t sink_blocks, uint32_t n_sink);

/* The attached pool's layout (struct kvq_layout of kernels/layout.h), or
 * NULL before a successful attach. */
const struct kvq_layout *kvq_client_layout(const kvq_client *c);

/* Base address of the mapped pool (offsets from kvq_layout_off apply to
 * it), or NULL before a successful attach.  On a cuda pool it is a DEVICE
 * address (a CUdeviceptr in the primary context of the pool's device):
 * usable by kernels and cudaMemcpy, never dereferenced by the CPU. */
void *kvq_client_base(const kvq_client *c);

/* The CUDA stream (a cudaStream_t) on which libkvq queues its kernels and
 * copies for a cuda pool; NULL (the default) is the legacy default stream.
 * Returns 0, or -ENOTSUP for a non-NULL stream in a libkvq built without
 * CUDA. */
int kvq_client_set_stream(kvq_client *c, void *stream);

/* Backend of the attached pool ("host" or "cuda"), or NULL before attach. */
const char *kvq_client_backend(const kvq_client *c);

/* The CUDA device of an attached cuda pool, as this process numbers devices
 * (the ordinal cudaSetDevice and torch.device("cuda", N) take, after
 * CUDA_VISIBLE_DEVICES), or -1 for a host pool or before attach. */
int kvq_client_device(const kvq_client *c);

/*
 * A debug hook: fn(ctx, t) is called on the calling thread right before each
 * kernel of a sequence on c (kvq_seq_write, kvq_seq_attention,
 * kvq_seq_attention_device) with the addresses that kernel gets: the
 * caller's own arrays, or libkvq's staging buffers where it copied them
 * (host arrays on a cuda pool).  A binding's test compares them with its
 * tensors' addresses to show that nothing was copied.  fn NULL turns it
 * off.  Returns 0, or -EINVAL for a NULL c.
 */
enum { KVQ_TRACE_WRITE = 0, KVQ_TRACE_ATTENTION = 1 };
struct kvq_trace {
	int op;                  /* KVQ_TRACE_WRITE or KVQ_TRACE_ATTENTION */
	uint32_t layer;
	int device;              /* 1: device addresses (a cuda pool's kernels), 0: host (the CPU kernels) */
	const void *k, *v;       /* a write's K and V; NULL for attention */
	const void *q;           /* attention's q and out; NULL for a write */
	void *out;
};
typedef void (*kvq_trace_fn)(void *ctx, const struct kvq_trace *t);
int kvq_client_set_trace(kvq_client *c, kvq_trace_fn fn, void *ctx);

/*
 * Block operations, one request each (kvq.proto documents them).  Ids are
 * the layout's slot ids; every one a call returns is held by this
 * connection until released (or the connection closes).  Batches are
 * all-or-nothing: on failure nothing changed and ret_* are untouched.
 * Interface 5: where a call takes or returns sealed ids, a sink block (a
 * pool with sink blocks) is named KVQ_SINK_ID(sink id): sealed ids are
 * below 2^30 (KVQ_MAX_SLOTS), a sink's carries KVQ_SINK_FLAG.  Release
 * takes one in either list.
 */
#define KVQ_SINK_FLAG (1u << 30)
#define KVQ_SINK_ID(id) ((uint32_t)(id) | KVQ_SINK_FLAG)

/* n_open open slots, each with a reserved sealed slot, and n_sealed sealed
 * slots.  ret_open / ret_reserved get n_open ids, ret_sealed n_sealed (NULL
 * allowed for a count of 0).  Returns 0, -ENOSPC (the pool cannot hold
 * them, even after evicting unreferenced cached blocks), -EDQUOT or
 * another daemon code. */
int kvq_client_alloc(kvq_client *c, uint32_t n_open, uint32_t n_sealed, uint32_t *ret_open,
		     uint32_t *ret_reserved, uint32_t *ret_sealed);

/* Interface 5: n sink slots of a pool with sink blocks, each a held,
 * unpublished block (ret_ids[n]: KVQ_SINK_ID()s), evicting cached chains
 * when none is free.  Returns 0, -EINVAL (no sink blocks), -ENOSPC,
 * -EDQUOT or another daemon code. */
int kvq_client_alloc_sinks(kvq_client *c, uint32_t n, uint32_t *ret_ids);

/* Tells the daemon open_ids[i] now lives in its reserved slot sealed_ids[i]
 * (send after the seal's data is written).  Returns 0 or a daemon code. */
int kvq_client_seal(kvq_client *c, uint32_t n, const uint32_t *open_ids, const uint32_t *sealed_ids);

/* Publishes a chain of n sealed blocks: block i holds tokens
 * [i*B, (i+1)*B) of tokens, its parent is block i-1, block 0's parent is
 * parent (a cached block held by the caller, or -1 for a sequence's first
 * block; in a pool with sink blocks a chain starts with a sink block,
 * sealed_ids[0] = KVQ_SINK_ID(), and only there).  salt (salt_len <= 64 bytes, NULL for none) separates cache hits.
 * Publish only after every layer of each block is written.  ret_ids[i]
 * (n entries) is the id to use from now on: sealed_ids[i], or the cached
 * block's id when the same key was cached already (the duplicate is freed
 * and the hold moves).  Returns 0 or a daemon code. */
int kvq_client_publish(kvq_client *c, uint32_t n, const uint32_t *sealed_ids, int64_t parent,
		       const uint32_t *tokens, const void *salt, size_t salt_len, uint32_t *ret_ids);

/* Longest cached chain for tokens[0..n_tokens), at most max_tokens tokens
 * (S(n) of a prompt, kvq_layout_split).  ret_ids needs max_tokens / B
 * entries; *ret_n gets the number of blocks found (matched tokens =
 * *ret_n * B), each now referenced by the caller; in a pool with sink
 * blocks ret_ids[0] is a KVQ_SINK_ID().  Returns 0 or a daemon
 * code. */
int kvq_client_lookup(kvq_client *c, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t *ret_n);

/* Drops holds with multiplicity: one reference per sealed id occurrence,
 * each open id with its reservation.  Send only after the last kernel
 * reading the blocks has completed.  Returns 0 or a daemon code. */
int kvq_client_release(kvq_client *c, uint32_t n_sealed, const uint32_t *sealed_ids, uint32_t n_open,
		       const uint32_t *open_ids);

/* One more reference on each sealed id (held by the caller).  Returns 0 or
 * a daemon code. */
int kvq_client_fork(kvq_client *c, uint32_t n, const uint32_t *sealed_ids);

/* Stats of one pool: pool NULL means the attached one.  Allowed without
 * attach.  Returns 0 and *ret_stats, -ENOENT when the daemon does not
 * report that pool to this caller, or a daemon code. */
int kvq_client_stats(kvq_client *c, const char *pool, struct kvq_stats *ret_stats);

/* The same pool's sink blocks (struct kvq_sink_stats), by one more Stats
 * request; the same returns. */
int kvq_client_sink_stats(kvq_client *c, const char *pool, struct kvq_sink_stats *ret_stats);

/*
 * A pool's figures by name (interface 7): every figure kvqd reports of a
 * pool, struct kvq_stats' and struct kvq_sink_stats' and the ones added
 * since, each a name (frozen once shipped; libkvq(3), FIGURES) and a
 * uint64_t value.  A program can list them without knowing them, and ask
 * for one a newer kvqd has.
 */
typedef struct kvq_pool_figures kvq_pool_figures;

/* The figure called name of a pool (NULL: the attached one), by one Stats
 * request.  Returns 0 and *ret_value, -EINVAL, -ENOENT when the daemon
 * does not report that pool to this caller or has no such figure (the
 * reason in kvq_client_error), or a daemon code. */
int kvq_client_pool_stat(kvq_client *c, const char *pool, const char *name, uint64_t *ret_value);

/* All figures of a pool (NULL: the attached one) as one Stats request saw
 * them, to read with kvq_pool_figures_at or _get and free with
 * kvq_pool_figures_free.  Returns 0 and *ret_figures, -EINVAL, -ENOMEM,
 * -ENOENT (no such pool for this caller) or a daemon code. */
int kvq_client_pool_figures(kvq_client *c, const char *pool, kvq_pool_figures **ret_figures);

/* How many figures f holds (0 for NULL). */
size_t kvq_pool_figures_count(const kvq_pool_figures *f);

/* Figure i (< kvq_pool_figures_count) of f, in kvqd's order: returns 0,
 * *ret_name (valid until f is freed) and *ret_value; -ENOENT past the
 * last; -EINVAL. */
int kvq_pool_figures_at(const kvq_pool_figures *f, size_t i, const char **ret_name, uint64_t *ret_value);

/* The figure of f called name: returns 0 and *ret_value, -ENOENT (none of
 * that name) or -EINVAL. */
int kvq_pool_figures_get(const kvq_pool_figures *f, const char *name, uint64_t *ret_value);

/* Frees f; NULL is fine. */
void kvq_pool_figures_free(kvq_pool_figures *f);

/* ---------------------------------------------------------------- sequence */

/*
 * A sequence's block table on an attached client: its token ids, the
 * sealed ids of its first S(n) tokens and the open ids (with their reserved
 * sealed slots) of the rest, as kernels/layout.h splits n tokens.
 *
 * Adding m tokens is three steps, so a model can compute layer l+1 from
 * layer l's attention:
 *   kvq_seq_begin(tokens, m)      allocates the slots the m tokens need
 *   kvq_seq_write(layer, k, v)    once per layer, in any order; then
 *                                 kvq_seq_attention(layer, ...) may run
 *   kvq_seq_commit()              seals blocks that left the open window
 *                                 and publishes every new sealed block
 * Order rules: a block is published only after all its layers are written
 * and sealed (commit refuses before every layer was written).  On host
 * pools the CPU kernels have finished when they return.  On cuda pools the
 * CUDA kernels (kernels/cuda) run on the client's stream
 * (kvq_client_set_stream), the block tables they read in device memory;
 * commit waits for that stream before it tells kvqd a block is sealed or
 * published, and kvq_seq_free waits before it releases slots, so no other
 * process sees a block before its bytes or loses one under a running kernel.
 */
typedef struct kvq_seq kvq_seq;

/* An empty sequence on c (attached); salt (<= 64 bytes, NULL for none)
 * goes with each lookup and publish.  Returns 0 and *ret_seq, -EINVAL (not
 * attached, salt too long) or -ENOMEM. */
int kvq_seq_new(kvq_client *c, const void *salt, size_t salt_len, kvq_seq **ret_seq);

/* Releases every slot and reference the sequence holds (one Release) and
 * frees it.  NULL is fine. */
void kvq_seq_free(kvq_seq *s);

/* The client the sequence was made on. */
kvq_client *kvq_seq_client(const kvq_seq *s);

/* Tokens stored (after the last commit, or the prefix from_prompt found). */
uint32_t kvq_seq_tokens(const kvq_seq *s);

/*
 * Starts an empty sequence from the cache: looks up the longest cached
 * chain of tokens[0..n) up to S(n) and takes it as the sequence's sealed
 * prefix.  *ret_hit gets the tokens covered (a multiple of B, < n); the
 * caller appends tokens[*ret_hit..n) next, in one begin (the prefix stays
 * sealed only if the first append reaches S(n+m) >= *ret_hit).  Returns 0,
 * -EBUSY (the sequence is not empty) or a daemon code.
 */
int kvq_seq_from_prompt(kvq_seq *s, const uint32_t *tokens, uint32_t n, uint32_t *ret_hit);

/* Interface 4: the request id (1-64 bytes; 0: none) the next
 * kvq_seq_from_prompt sends, which a tensor-parallel group's member pool
 * needs: every rank of one request gives the same id and prompt and gets
 * the same hit (kvq_client_set_group).  Ignored by a pool of no group.
 * Returns 0 or -EINVAL. */
int kvq_seq_set_request(kvq_seq *s, const void *id, size_t len);

/* Reserves the slots for m new tokens (copied) and starts a write.
 * Returns 0, -EBUSY (a write is in progress), -EINVAL (m 0, or an append
 * after from_prompt that would unseal the found prefix), -ENOSPC /
 * -EDQUOT (nothing allocated) or another daemon code. */
int kvq_seq_begin(kvq_seq *s, const uint32_t *tokens, uint32_t m);

/* Writes one layer's K and V of the m tokens of the current begin: k and
 * v are [m][kv_heads][head_dim] in the pool's activation dtype (f16 or
 * bf16 bits); on a cuda pool they may be in device memory (read in place)
 * or host memory (copied first), and the write is queued on the client's
 * stream.  Returns 0, -EINVAL (no write in progress, bad layer), -EIO (a
 * CUDA error, named by kvq_client_error). */
int kvq_seq_write(kvq_seq *s, uint32_t layer, const void *k, const void *v);

/* Seals blocks that left the open window and publishes all new sealed
 * blocks (parent chain, the sequence's salt); a published duplicate takes
 * the cached block's id.  Returns 0, -EINVAL (no write in progress, or a
 * layer not written) or a daemon code (the sequence then keeps what
 * succeeded; kvq_seq_free releases it). */
int kvq_seq_commit(kvq_seq *s);

/* Attention of the last n_q stored tokens of one layer: q and out are
 * [n_q][q_heads][head_dim] floats, q_heads a multiple of kv_heads; scale 0
 * means 1/sqrt(head_dim).  Between begin and commit it sees the new tokens
 * (after kvq_seq_write() of that layer).  Reads KV as stored: sealed blocks
 * quantized, the open window in full precision.  q and out are host
 * memory; on a cuda pool q goes to the device in the activation dtype, the
 * CUDA kernel runs on the client's stream, and the call returns once out is
 * written.  Returns 0, -EINVAL (bad counts, no stored tokens, or a layer not
 * yet written in the current write), -EIO (a CUDA error) or -ENOTSUP (no
 * CUDA kernel for the layer's formats). */
int kvq_seq_attention(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale,
		      const float *q, float *out);

/* The same with q and out in device memory, for a worker whose activations
 * are on the GPU (cuda pools only): q in the pool's activation dtype, out
 * floats when out_f32 is nonzero, else the activation dtype.  Queued on the
 * client's stream; returns without waiting.  Returns 0, -EINVAL, -EIO,
 * -ENOTSUP (a host pool, a build without CUDA, or no kernel for the
 * layer's formats). */
int kvq_seq_attention_device(kvq_seq *s, uint32_t layer, uint32_t q_heads, uint32_t n_q, float scale,
			     const void *q, void *out, int out_f32);

/* A copy sharing the sealed blocks by reference (Fork) with its own copy
 * of the open window (new open slots, bytes copied for every layer; on a
 * cuda pool copied on the client's stream).  Returns 0 and *ret_seq, -EBUSY
 * (a write in progress), -ENOMEM or a daemon code. */
int kvq_seq_fork(kvq_seq *s, kvq_seq **ret_seq);

/* The sequence's block table: *ret_sealed / *ret_n_sealed and *ret_open /
 * *ret_n_open (pointers valid until the next call on s).  Between begin and
 * commit this is the table before the write.  In a pool with sink blocks
 * block 0 is its sink, KVQ_SINK_ID(), in the open list while it is in the
 * window (its reservation has none) and in the sealed list after.
 * Returns 0. */
int kvq_seq_blocks(const kvq_seq *s, const int32_t **ret_sealed, uint32_t *ret_n_sealed,
		   const int32_t **ret_open, uint32_t *ret_n_open);

/* ---------------------------------------------------------------- batch */

/*
 * Interface 8: a step over a set of one client's sequences, as a serving
 * engine runs one: every sequence gets its own number of new tokens (1 for
 * decode, more for a prefill chunk, mixed in one step), and each phase is
 * one call for all of them:
 *
 *   kvq_batch_add(s, tokens, m, flags)  for each sequence of the step
 *   kvq_batch_begin()                   the step's prefix lookups in one
 *                                       Lookup, then its slots in one Alloc
 *   kvq_batch_write(layer, k, v)        once per layer: one kernel launch
 *                                       (cuda) or one pass (host) for all
 *   kvq_batch_attention(layer, ...)     once per layer, after its write
 *   kvq_batch_commit()                  Seal and Publish for the whole
 *                                       step, sent together
 *
 * K, V, q and out are packed ragged rows: sequence i's rows are indptr[i]
 * .. indptr[i + 1] - 1 (kvq_batch_indptr, as FlashInfer's paged-KV append
 * and batch attention take them), in the order the sequences were added.
 * On a cuda pool the sequences' block tables go to the device once per
 * step and the attention plan (kernel, KV splits, workspace) is made once
 * per step and shape; every layer reuses them.  A sequence's own calls
 * (kvq_seq_begin, _write, _attention, _commit) run through this same code
 * as a batch of one.
 *
 * All or nothing: a begin that fails changes no sequence and holds nothing
 * (a lookup's references are given back); a bad sequence refuses the call.
 * A batch holds sequences of its client only, each at most once per step.
 * A step is sent in the fewest requests the protocol's limits allow
 * (KVQ_PROTO_MAX_IDS ids and KVQ_PROTO_MAX_TOKENS tokens a request, the
 * frame bound); kvq_batch_requests says how many, and how many times the
 * caller waited for kvqd.  Not thread-safe, as its client.  A sequence
 * in a batch is freed only after kvq_batch_clear or kvq_batch_free.
 */
typedef struct kvq_batch kvq_batch;

/* An empty batch on c (attached).  Returns 0 and *ret_batch, -EINVAL or
 * -ENOMEM. */
int kvq_batch_new(kvq_client *c, kvq_batch **ret_batch);

/* Frees b; a step begun and not committed is abandoned first
 * (kvq_batch_abort).  The sequences stay.  NULL is fine. */
void kvq_batch_free(kvq_batch *b);

/* Flags of kvq_batch_add. */
enum {
	/* s is empty: look tokens up in the prefix cache first, in the
	 * step's one Lookup (kvq_seq_from_prompt's rules: at most S(m)
	 * tokens, the hit taken as s's sealed prefix); the step then appends
	 * the rest.  The sequence's request id (kvq_seq_set_request) goes
	 * with it. */
	KVQ_BATCH_LOOKUP = 1,
};

/* Adds s with m new tokens (tokens[0..m), copied; m >= 1) to the next
 * step.  Returns the sequence's index in the batch, or -EINVAL (another
 * client's sequence, m 0, unknown flags, KVQ_BATCH_LOOKUP on a sequence
 * that is not empty), -EBUSY (a step is begun, or s has a write in
 * progress), -EEXIST (s is in the batch already) or -ENOMEM. */
int kvq_batch_add(kvq_batch *b, kvq_seq *s, const uint32_t *tokens, uint32_t m, unsigned flags);

/* Empties the batch for the next step (the sequences stay as they are).
 * Returns 0, or -EBUSY while a step is begun. */
int kvq_batch_clear(kvq_batch *b);

/* Sequences in the batch. */
uint32_t kvq_batch_size(const kvq_batch *b);

/*
 * Begins the step: one Lookup for every KVQ_BATCH_LOOKUP sequence, then
 * one Alloc for every slot the step needs (none: no request).  Returns 0;
 * -ENOSPC or -EDQUOT with *ret_short (may be NULL) the slots the pool was
 * short of (0 for a quota): nothing was allocated and no sequence changed,
 * and the caller decides which sequences to drop or preempt; -EINVAL (an
 * append that would unseal a found prefix), -E2BIG, -ENOMEM or another
 * daemon code, with nothing held either.
 */
int kvq_batch_begin(kvq_batch *b, uint32_t *ret_short);

/* The step's row index: indptr[0] = 0, sequence i's new rows indptr[i] ..
 * indptr[i + 1] - 1 (its m less a lookup's hit); *ret_nseq (may be NULL)
 * gets the count.  NULL before kvq_batch_begin. */
const uint32_t *kvq_batch_indptr(const kvq_batch *b, uint32_t *ret_nseq);

/* The tokens a KVQ_BATCH_LOOKUP sequence i found cached (0 for others). */
uint32_t kvq_batch_hit(const kvq_batch *b, uint32_t i);

/* Writes one layer of every sequence's new rows: k and v are [rows]
 * [kv_heads][head_dim] in the activation dtype, rows as kvq_batch_indptr
 * says; on a cuda pool in device memory (read in place) or host memory
 * (copied first).  Returns 0, -EINVAL (no step begun, bad layer) or -EIO. */
int kvq_batch_write(kvq_batch *b, uint32_t layer, const void *k, const void *v);

/* Attention of every sequence's new rows over its stored tokens, one
 * layer, after that layer's write: q and out are float host arrays of
 * [rows][q_heads][head_dim] (kvq_seq_attention's rules; on a cuda pool
 * returns once out is written). */
int kvq_batch_attention(kvq_batch *b, uint32_t layer, uint32_t q_heads, float scale, const float *q,
			float *out);

/* The same with q (activation dtype) and out (floats when out_f32, else
 * the activation dtype) in device memory, cuda pools only; queued on the
 * client's stream (kvq_seq_attention_device's rules). */
int kvq_batch_attention_device(kvq_batch *b, uint32_t layer, uint32_t q_heads, float scale, const void *q,
			       void *out, int out_f32);

/* Ends the step: seals every block that left a window and publishes every
 * new sealed block of every sequence, in requests sent together (one wait
 * for kvqd when they fit one request each).  Returns 0, -EINVAL (no step,
 * or a layer not written) or a daemon code; then each sequence keeps what
 * succeeded (kvq_seq_commit's rule) and the step is over. */
int kvq_batch_commit(kvq_batch *b);

/* Gives back the slots a begun step allocated (one Release) and ends it;
 * the sequences are as before the begin except for a lookup's prefix. */
void kvq_batch_abort(kvq_batch *b);

/* What the last kvq_batch_begin (KVQ_BATCH_BEGIN) or kvq_batch_commit
 * (KVQ_BATCH_COMMIT) sent: *ret_requests the requests, *ret_waits the times
 * the caller waited for replies (round trips).  Returns 0 or -EINVAL. */
enum { KVQ_BATCH_BEGIN = 0, KVQ_BATCH_COMMIT = 1 };
int kvq_batch_requests(const kvq_batch *b, int phase, uint32_t *ret_requests, uint32_t *ret_waits);

#ifdef __cplusplus
}
#endif

#endif
