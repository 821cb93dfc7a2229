/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool's memory layout, shared by the daemon, libkvq and the kernels.
 *
 * Layer-major: one region per layer; each region holds the layer's sealed
 * slices (ids 0 .. n_sealed-1), then its open slices (ids 0 .. n_open-1),
 * then its sink slices (ids 0 .. n_sink-1; none unless the pool keeps
 * attention-sink blocks, sink_blocks = 1).  A sink slice has the open
 * slice's format and size, so the kernels address sink id s as open id
 * n_open + s (kvq_sink_open_id): a sequence's first block lives there,
 * exact, from its first token on (struct kvq_seq_table).  A block (a sealed
 * or a sink slot) is named by a struct kvq_block_ref (blockref.h); the
 * addressing derived from one is at the end of this file.
 * A slice is one block of B tokens of one layer, all KV heads: H head slices
 * one after another.  A sealed head slice holds K codes, K parameters, V codes
 * (transposed) and V parameters in the order kvq_format.h describes; an open
 * head slice holds B rows of K then B rows of V in the activation dtype
 * ([token][dim]).  Every array starts 16-byte aligned, each region 256-byte
 * aligned; there is no per-token padding.  All offsets are 64-bit and come
 * from kvq_layout_off().  After the last layer's region, when the policy
 * uses a codebook format, comes the codebook region: the pool's codebooks
 * in codebook.h's order, written once when the pool is created.
 */
#ifndef KVQ_LAYOUT_H
#define KVQ_LAYOUT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "blockref.h"
#include "policy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_MAX_HEADS 256u
#define KVQ_MAX_HEAD_DIM 256u
#define KVQ_MAX_BLOCK_TOKENS 256u
#define KVQ_MAX_SLOTS (1u << 30)

enum kvq_slot_class { KVQ_SEALED = 0, KVQ_OPEN = 1, KVQ_SINK = 2 };

/* Fields of a head slice.  Open slices have only KVQ_K_CODES (K rows) and
 * KVQ_V_CODES (V rows). */
enum kvq_field { KVQ_K_CODES = 0, KVQ_K_PARAMS, KVQ_V_CODES, KVQ_V_PARAMS, KVQ_NFIELDS };

struct kvq_layout_params {
	uint32_t layers, kv_heads, head_dim, block_tokens;
	uint32_t window;        /* open window R in tokens; 0 chooses the default */
	uint32_t n_sealed, n_open;
	uint32_t sink_blocks;   /* 0, or 1: every sequence's first block in a sink slot */
	uint32_t n_sink;        /* sink slots: >= 1 with sink_blocks, else 0 */
	int act;                /* dtype of the open window: KVQ_DT_F16 or KVQ_DT_BF16 */
	const struct kvq_policy *policy;
};

/* One layer: all a kernel needs, host and device alike (the CUDA kernels
 * take it by value). */
struct kvq_layer_layout {
	uint64_t region;               /* byte offset of the layer's region */
	uint64_t sealed_slice;         /* bytes of one sealed slice (all heads) */
	uint64_t open_slice;           /* bytes of one open slice */
	uint64_t open_base;            /* byte offset of its open slices: region + n_sealed * sealed_slice;
	                                * its sink slices follow them (open ids n_open ..) */
	uint32_t sealed_head;          /* bytes of one sealed head slice */
	uint32_t open_head;            /* bytes of one open head slice */
	uint32_t off[KVQ_NFIELDS];     /* field offsets inside a sealed head slice */
	uint32_t size[KVQ_NFIELDS];    /* field sizes (unpadded) */
	/* byte offsets of the layer's K (0) and V (1) codebooks in the pool's
	 * codebook region (codebook.h's order), or UINT64_MAX where that format
	 * is not a codebook format */
	uint64_t codebook[2];
	/* the pool's geometry (struct kvq_layout), repeated here */
	uint32_t B, D, H, window, n_sealed, n_open, n_sink;
	int kfmt, vfmt, act;
	/* KVQ_ROT_K, KVQ_ROT_V (policy.h): K, V stored rotated, in blocks of
	 * kvq_rot_block(D, 0 or 1) elements of the head dim */
	uint32_t rot;
};

struct kvq_layout {
	uint32_t version;              /* KVQ_LAYOUT_VERSION */
	uint32_t layers, kv_heads, head_dim, block_tokens, window;
	uint32_t n_sealed, n_open;
	uint32_t sink_blocks, n_sink;  /* struct kvq_layout_params */
	int act;
	uint64_t total_bytes;          /* bytes of the whole pool */
	uint64_t sealed_block_bytes;   /* one sealed block, all layers */
	uint64_t open_block_bytes;     /* one open block, all layers (and one sink block) */
	uint64_t codebook_off;         /* the codebook region: after the last layer's, 256-byte */
	uint64_t codebook_bytes;       /* aligned; kvq_codebook_bytes() bytes, 0 when no codebook format */
	struct kvq_layer_layout layer[];
};

/* Builds the layout; returns 0 and *ret (free with kvq_layout_free), or
 * -EINVAL with a message in err naming the bad input. */
int kvq_layout_new(const struct kvq_layout_params *p, struct kvq_layout **ret, char *err, size_t errlen);

void kvq_layout_free(struct kvq_layout *L);

/* Centroids of a codebook format's codebook (one per subspace). */
#define KVQ_CB_CENTROIDS 256u

/* Bytes of one (layer, K or V)'s codebooks: 256 centroids of D FP16 values
 * per KV head, whatever the subspace dim. */
static inline uint64_t kvq_codebook_part(uint32_t H, uint32_t D)
{
	return (uint64_t)KVQ_CB_CENTROIDS * H * D * 2u;
}

/* Bytes of the codebook data of a policy at H KV heads and head dim D
 * (codebook.h's order): 0 when no layer uses a codebook format. */
uint64_t kvq_codebook_bytes(const struct kvq_policy *p, uint32_t H, uint32_t D);

/* Byte offset, inside the codebook data, of (layer, K or V)'s codebooks,
 * or UINT64_MAX when that format is not a codebook format. */
uint64_t kvq_codebook_off(const struct kvq_policy *p, uint32_t H, uint32_t D, uint32_t layer, int is_v);

/* Default open window: 4B when any layer uses KIVI, else B. */
uint32_t kvq_layout_default_window(const struct kvq_policy *p, uint32_t block_tokens);

/*
 * One sequence's block table, as every kernel takes it: the CPU and the
 * CUDA kernels, write and attention (for the CUDA ones the table and its
 * ids are in device memory).  Blocks are numbered from the sequence's
 * start (block b holds positions b*B .. b*B+B-1).
 *  write:     n tokens stored before it, m new ones, input rows row0 ..
 *             row0 + m - 1 of k and v.  sealed: ids of blocks 0 ..
 *             S(n+m)/B - 1 (only blocks S(n)/B .. are written); open: open[j]
 *             is the open id of block S(n)/B + j, for every block up to the
 *             last one holding a token (ceil((n+m)/B) - S(n)/B entries), -1
 *             where a block goes straight from the input to its sealed slot.
 *             After it the sequence's open ids start at open + (S(n+m) -
 *             S(n))/B; the open slots before that were sealed.
 *  attention: n tokens stored, the last m of them queries (query i at
 *             position n - m + i sees positions <= its own), rows row0 ..
 *             row0 + m - 1 of q and out.  sealed: S(n)/B ids; open:
 *             ceil((n - S(n))/B) ids.
 *  sink:      in a pool with sink blocks (n_sink > 0), 1 + the sink id
 *             holding block 0 of the table (kvq_seq_table_sink), for its
 *             whole life: written
 *             there as an open block, never sealed, read through the open
 *             path wherever S(n) puts it; the sealed and open entries of
 *             block 0 are not read.  0: block 0 of the table is an ordinary
 *             block (always so without sinks; a write whose table starts
 *             past the sequence's first block passes 0).
 */
struct kvq_seq_table {
	uint32_t n, m, row0, sink;
	const int32_t *sealed;
	const int32_t *open;
};

/* The layout's arithmetic, for the host and the CUDA kernels alike (which
 * pass a layer's fields as the arguments).  Byte offset of head h of slot
 * id, for slots of `slice` bytes from `first` with heads of `head` bytes
 * (sealed: region, sealed_slice, sealed_head; open: open_base, open_slice,
 * open_head). */
KVQ_HD uint64_t kvq_head_off(uint64_t first, uint64_t slice, uint32_t head, uint32_t id, uint32_t h)
{
	return first + (uint64_t)id * slice + (uint64_t)h * head;
}

/* Tokens of a sequence of n tokens that are sealed, with open window R and
 * blocks of B tokens: S(n) = B * max(0, ceil((n - R) / B)).  The one split
 * rule: append, prefill, attention and the prefix lookup all take it. */
KVQ_HD uint32_t kvq_split(uint32_t n, uint32_t R, uint32_t B)
{
	return n <= R ? 0 : B * ((n - R + B - 1) / B);
}

/* The open id of sink id s: a sink slice is an open slice past the n_open
 * open ones. */
KVQ_HD uint32_t kvq_sink_open_id(uint32_t n_open, uint32_t s)
{
	return n_open + s;
}

/* The open id of a table's sink block, from its nonzero kvq_seq_table.sink
 * (1 + the sink id): for the kernels, which check sink <= n_sink first. */
KVQ_HD uint32_t kvq_table_sink_open_id(uint32_t n_open, uint32_t sink)
{
	return n_open + sink - 1;
}

/* Byte offset of a field of (class, slot id, layer, head).  Arguments are not
 * checked: callers validate ids against n_sealed / n_open / n_sink first. */
static inline uint64_t kvq_layout_off(const struct kvq_layout *L, int cls, uint32_t id,
				      uint32_t layer, uint32_t head, int field)
{
	const struct kvq_layer_layout *ll = &L->layer[layer];

	if (cls == KVQ_SINK)
		id = kvq_sink_open_id(L->n_open, id);
	if (cls == KVQ_SEALED)
		return kvq_head_off(ll->region, ll->sealed_slice, ll->sealed_head, id, head) + ll->off[field];
	return kvq_head_off(ll->open_base, ll->open_slice, ll->open_head, id, head) +
	       (field == KVQ_V_CODES ? (uint64_t)L->block_tokens * L->head_dim * kvq_dtype_bytes(L->act) : 0);
}

/* S(n) of the layout (kvq_split). */
static inline uint32_t kvq_layout_split(const struct kvq_layout *L, uint32_t n)
{
	return kvq_split(n, L->window, L->block_tokens);
}

/*
 * The daemon's block id of a reference: one id space of every class's slots,
 * the classes in KVQ_BLOCK_CLASSES' order (sealed ids 0 .. n_sealed-1, then
 * sink s as n_sealed + s), which daemon/pool.h, lease.h and prefix.h index.
 */

/* Slots of class cls in L (n_sealed, n_sink), 0 for no class. */
static inline uint32_t kvq_layout_blocks(const struct kvq_layout *L, uint32_t cls)
{
	switch (cls) {
	case KVQ_BLOCK_SEALED: return L->n_sealed;
	case KVQ_BLOCK_SINK: return L->n_sink;
	default: return 0;
	}
}

/* Bytes of one block of class cls, all layers: a sink block is an open one. */
static inline uint64_t kvq_layout_block_bytes(const struct kvq_layout *L, uint32_t cls)
{
	return cls == KVQ_BLOCK_SINK ? L->open_block_bytes : L->sealed_block_bytes;
}

/* The first block id of class cls (< KVQ_BLOCK_NCLASS). */
static inline uint32_t kvq_layout_block_first(const struct kvq_layout *L, uint32_t cls)
{
	uint32_t first = 0;

	for (uint32_t c = 0; c < cls; c++)
		first += kvq_layout_blocks(L, c);
	return first;
}

/* The block id of r in *ret: 0, or -ERANGE (nothing set) when r names no
 * class or an index past its class's slots: a peer's index is checked here
 * before anything uses it. */
static inline int kvq_layout_block_id(const struct kvq_layout *L, struct kvq_block_ref r, uint32_t *ret)
{
	if (r.cls >= KVQ_BLOCK_NCLASS || r.index >= kvq_layout_blocks(L, r.cls))
		return -ERANGE;
	*ret = kvq_layout_block_first(L, r.cls) + r.index;
	return 0;
}

/* The reference of block id b, one kvq_layout_block_id made (b below the
 * sum of the classes' slots). */
static inline struct kvq_block_ref kvq_layout_block_ref(const struct kvq_layout *L, uint32_t b)
{
	struct kvq_block_ref r = { 0, b };

	while (r.cls + 1 < KVQ_BLOCK_NCLASS && r.index >= kvq_layout_blocks(L, r.cls))
		r.index -= kvq_layout_blocks(L, r.cls++);
	return r;
}

/* Bytes of one layer's slice of a block of class cls: a sink slice is an
 * open one. */
static inline uint64_t kvq_layout_slice_bytes(const struct kvq_layout *L, uint32_t cls, uint32_t layer)
{
	return cls == KVQ_BLOCK_SINK ? L->layer[layer].open_slice : L->layer[layer].sealed_slice;
}

/* Byte offset of block r's slice of one layer (its H head slices back to
 * back, kvq_layout_slice_bytes long), r checked first (kvq_layout_block_id). */
static inline uint64_t kvq_layout_slice_off(const struct kvq_layout *L, struct kvq_block_ref r, uint32_t layer)
{
	const struct kvq_layer_layout *ll = &L->layer[layer];

	if (r.cls == KVQ_BLOCK_SINK)
		return kvq_head_off(ll->open_base, ll->open_slice, ll->open_head, kvq_sink_open_id(L->n_open, r.index), 0);
	return kvq_head_off(ll->region, ll->sealed_slice, ll->sealed_head, r.index, 0);
}

/* kvq_seq_table.sink of a table whose block 0 is r: 1 + its sink id, 0 when
 * r is no sink block. */
static inline uint32_t kvq_seq_table_sink(struct kvq_block_ref r)
{
	return r.cls == KVQ_BLOCK_SINK ? r.index + 1 : 0;
}

#ifdef __cplusplus
}
#endif

#endif
