/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq's public block id (kvq.h: a sealed id as it is, a sink's with
 * KVQ_SINK_FLAG, KVQ_SINK_ID) to and from a struct kvq_block_ref
 * (kernels/blockref.h): the one place libkvq translates.  The public
 * encoding is ABI and stays; a class without one (a later tier) gets its
 * encoding here first.
 */
#ifndef KVQ_CLIENT_BLOCKID_H
#define KVQ_CLIENT_BLOCKID_H

#include <stdint.h>

#include "blockref.h"
#include "kvq.h"

_Static_assert(KVQ_BLOCK_NCLASS == 2, "a new block class needs its public id (kvq.h) here");

/* The reference a public id names.  Bits above KVQ_SINK_FLAG stay in the
 * index, for the daemon to refuse as out of range. */
static inline struct kvq_block_ref client_block_ref(uint32_t id)
{
	struct kvq_block_ref r = { KVQ_BLOCK_SEALED, id };

	if (id & KVQ_SINK_FLAG) {
		r.cls = KVQ_BLOCK_SINK;
		r.index = id & ~KVQ_SINK_FLAG;
	}
	return r;
}

/* The public id of r. */
static inline uint32_t client_block_id(struct kvq_block_ref r)
{
	return r.cls == KVQ_BLOCK_SINK ? KVQ_SINK_ID(r.index) : r.index;
}

/* Whether a sequence table's entry (kvq_seq_blocks: -1 for none) names a
 * sink block. */
static inline int client_entry_is_sink(int32_t entry)
{
	return entry >= 0 && client_block_ref((uint32_t)entry).cls == KVQ_BLOCK_SINK;
}

#endif
