/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a block is: one typed reference, its class and its index in that
 * class's id space, for the daemon, libkvq and the kernels alike.  A class
 * is a row of KVQ_BLOCK_CLASSES; each other encoding of a reference is
 * derived from this one in one place:
 *   the wire (a field per class):            proto/blockref.h
 *   libkvq's public id (kvq.h, KVQ_SINK_ID): client/blockid.h
 *   the daemon's block id (daemon/pool.h: one id space of every class) and
 *   the kernels' addressing (a sink as an open id, kvq_seq_table.sink):
 *                                            layout.h
 * docs/DESIGN.md, "Block references".
 */
#ifndef KVQ_BLOCKREF_H
#define KVQ_BLOCKREF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, "name"): the classes, in the order of the daemon's id space
 * (layout.h) and of a block list read from the wire (proto/blockref.h). */
#define KVQ_BLOCK_CLASSES(X)                                                          \
	X(SEALED, "sealed") /* a sealed slot: a block quantized in the policy's formats */ \
	X(SINK, "sink")     /* a sink slot: a sequence's first block, exact (layout.h) */

enum kvq_block_class {
#define KVQ_BLOCK_CLASS_ENUM(c, name) KVQ_BLOCK_##c,
	KVQ_BLOCK_CLASSES(KVQ_BLOCK_CLASS_ENUM)
#undef KVQ_BLOCK_CLASS_ENUM
	KVQ_BLOCK_NCLASS
};

struct kvq_block_ref {
	uint32_t cls;     /* enum kvq_block_class */
	uint32_t index;   /* 0 .. the class's slot count - 1 once checked (layout.h) */
};

/* The class's name ("sealed", "sink"), or "unknown" for none. */
static inline const char *kvq_block_class_name(uint32_t cls)
{
	static const char *const names[] = {
#define KVQ_BLOCK_CLASS_NAME(c, name) name,
		KVQ_BLOCK_CLASSES(KVQ_BLOCK_CLASS_NAME)
#undef KVQ_BLOCK_CLASS_NAME
	};

	return cls < KVQ_BLOCK_NCLASS ? names[cls] : "unknown";
}

#ifdef __cplusplus
}
#endif

#endif
