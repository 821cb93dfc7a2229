/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block references (kernels/blockref.h) on the wire.  kvq.proto carries
 * each class in a field of its own: a list as <class>_ids (sealed_ids,
 * sink_ids), PublishBlock's block and parent as a oneof of one field per
 * class.  These two functions are the only translation between the wire
 * and struct kvq_block_ref; the one table of field names is in
 * wire_block.c.  Indexes are passed as they are: the daemon checks each
 * against its pool (kvq_layout_block_id) before using it.
 */
#ifndef KVQ_WIRE_BLOCK_H
#define KVQ_WIRE_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "blockref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The groups of block fields a message may carry, one field per class. */
enum kvq_wire_group {
	KVQ_WIRE_IDS,     /* repeated <class>_ids: AllocReply, Release, Fork; read class by class */
	KVQ_WIRE_CHAIN,   /* the same fields holding one chain (LookupReply): read sink first, a
	                   * chain's block 0 (kvq.proto, "Sink blocks"), then class by class */
	KVQ_WIRE_BLOCK,   /* PublishBlock's oneof block: sealed_id, sink_id */
	KVQ_WIRE_PARENT,  /* PublishBlock's oneof parent: parent_id, parent_sink_id */
	KVQ_WIRE_NGROUPS
};

/* The name of class cls's field in group g ("sink_ids", "parent_id"), for
 * messages; "?" for none. */
const char *kvq_wire_block_field(enum kvq_wire_group g, uint32_t cls);

/* m's references in group g: their count in *ret_n and, unless ret is
 * NULL, the references in ret[max], in the group's order (a oneof gives 0
 * or 1).  A class whose field m lacks has none.  Returns 0, or -EMSGSIZE
 * when ret is given and m has more than max (*ret_n set, ret untouched). */
int kvq_wire_blocks_get(const ProtobufCMessage *m, enum kvq_wire_group g, struct kvq_block_ref *ret, size_t max,
			size_t *ret_n);

/* Sets m's fields of group g to refs[n].  A list is split by class, each
 * class's indexes in refs' order, into buf[n] (m's arrays point into it:
 * keep it while m is in use; a class with none gets an empty list); a oneof
 * takes n <= 1 and no buf (n = 0 leaves m as it is).  Returns 0, or
 * -EINVAL (m untouched) when a reference's class has no field in m or a
 * oneof is given more than one. */
int kvq_wire_blocks_put(ProtobufCMessage *m, enum kvq_wire_group g, const struct kvq_block_ref *refs, size_t n,
			uint32_t *buf);

#ifdef __cplusplus
}
#endif

#endif
