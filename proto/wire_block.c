/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "wire_block.h"

/* Each class's fields in kvq.proto, one row per class: a new class is a row
 * here and its fields in the messages that carry it. */
static const struct {
	const char *ids;      /* KVQ_WIRE_IDS, KVQ_WIRE_CHAIN */
	const char *block;    /* KVQ_WIRE_BLOCK */
	const char *parent;   /* KVQ_WIRE_PARENT */
} wire_fields[KVQ_BLOCK_NCLASS] = {
	[KVQ_BLOCK_SEALED] = { "sealed_ids", "sealed_id", "parent_id" },
	[KVQ_BLOCK_SINK] = { "sink_ids", "sink_id", "parent_sink_id" },
};

const char *kvq_wire_block_field(enum kvq_wire_group g, uint32_t cls)
{
	const char *name = NULL;

	if (cls >= KVQ_BLOCK_NCLASS)
		return "?";
	switch (g) {
	case KVQ_WIRE_IDS:
	case KVQ_WIRE_CHAIN: name = wire_fields[cls].ids; break;
	case KVQ_WIRE_BLOCK: name = wire_fields[cls].block; break;
	case KVQ_WIRE_PARENT: name = wire_fields[cls].parent; break;
	case KVQ_WIRE_NGROUPS: break;
	}
	return name ? name : "?";
}

static bool is_list(enum kvq_wire_group g)
{
	return g == KVQ_WIRE_IDS || g == KVQ_WIRE_CHAIN;
}

/* The k-th class a group is read in: a chain's sink first. */
static uint32_t class_at(enum kvq_wire_group g, uint32_t k)
{
	if (g != KVQ_WIRE_CHAIN)
		return k;
	return k == 0 ? KVQ_BLOCK_SINK : k <= KVQ_BLOCK_SINK ? k - 1 : k;
}

/* m's field of class cls in group g, or NULL when m has none of that shape
 * (a repeated uint32 for a list, a uint32 in a oneof otherwise). */
static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessage *m, enum kvq_wire_group g, uint32_t cls)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(m->descriptor, kvq_wire_block_field(g, cls));

	if (!f || f->type != PROTOBUF_C_TYPE_UINT32)
		return NULL;
	if (is_list(g) ? f->label != PROTOBUF_C_LABEL_REPEATED : !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
		return NULL;
	return f;
}

/* Indexes of f in m: *ret_ids, and their count. */
static size_t field_ids(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, const uint32_t **ret_ids)
{
	const char *base = (const char *)m;
	uint32_t set;

	if (f->label == PROTOBUF_C_LABEL_REPEATED) {
		memcpy(ret_ids, base + f->offset, sizeof(*ret_ids));
		return *(const size_t *)(base + f->quantifier_offset);
	}
	memcpy(&set, base + f->quantifier_offset, sizeof(set));   /* the oneof's case: the field's number */
	*ret_ids = (const uint32_t *)(base + f->offset);
	return set == f->id;
}

int kvq_wire_blocks_get(const ProtobufCMessage *m, enum kvq_wire_group g, struct kvq_block_ref *ret, size_t max,
			size_t *ret_n)
{
	const ProtobufCFieldDescriptor *f[KVQ_BLOCK_NCLASS];
	size_t total = 0, k = 0;

	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++) {
		const uint32_t *ids;

		f[c] = field_of(m, g, c);
		total += f[c] ? field_ids(m, f[c], &ids) : 0;
	}
	*ret_n = total;
	if (!ret)
		return 0;
	if (total > max)
		return -EMSGSIZE;
	for (uint32_t j = 0; j < KVQ_BLOCK_NCLASS; j++) {
		const uint32_t c = class_at(g, j);
		const uint32_t *ids;
		size_t n = f[c] ? field_ids(m, f[c], &ids) : 0;

		for (size_t i = 0; i < n; i++)
			ret[k++] = (struct kvq_block_ref){ .cls = c, .index = ids[i] };
	}
	return 0;
}

int kvq_wire_blocks_put(ProtobufCMessage *m, enum kvq_wire_group g, const struct kvq_block_ref *refs, size_t n,
			uint32_t *buf)
{
	const ProtobufCFieldDescriptor *f[KVQ_BLOCK_NCLASS];
	size_t count[KVQ_BLOCK_NCLASS] = { 0 }, at[KVQ_BLOCK_NCLASS];
	char *base = (char *)m;

	if ((!is_list(g) && n > 1) || (is_list(g) && n && !buf))
		return -EINVAL;
	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		f[c] = field_of(m, g, c);
	for (size_t i = 0; i < n; i++) {
		if (refs[i].cls >= KVQ_BLOCK_NCLASS || !f[refs[i].cls])
			return -EINVAL;
		count[refs[i].cls]++;
	}
	if (!is_list(g)) {
		if (n) {
			const ProtobufCFieldDescriptor *x = f[refs[0].cls];

			memcpy(base + x->quantifier_offset, &x->id, sizeof(x->id));
			memcpy(base + x->offset, &refs[0].index, sizeof(refs[0].index));
		}
		return 0;
	}
	for (uint32_t c = 0, j = 0; c < KVQ_BLOCK_NCLASS; c++) {
		uint32_t *ids = count[c] ? buf + j : NULL;

		at[c] = j;
		j += count[c];
		if (!f[c])
			continue;
		memcpy(base + f[c]->offset, &ids, sizeof(ids));
		memcpy(base + f[c]->quantifier_offset, &count[c], sizeof(count[c]));
	}
	for (size_t i = 0; i < n; i++)
		buf[at[refs[i].cls]++] = refs[i].index;
	return 0;
}
