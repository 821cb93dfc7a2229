/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block references (kernels/blockref.h) and each encoding derived from
 * them: the daemon's block ids and the kernels' addressing (layout.h), the
 * wire (proto/wire_block.h, through packed and unpacked messages) and
 * libkvq's public ids (client/blockid.h).  Round trips for every class,
 * out-of-range indexes refused, and the wire table checked against
 * kvq.proto's messages.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockid.h"
#include "kvq.pb-c.h"
#include "layout.h"
#include "policy.h"
#include "wire_block.h"
#include "../tap.h"

#define N_ELEM(a) (sizeof(a) / sizeof((a)[0]))

static struct kvq_layout *make_layout(struct kvq_policy *pol, uint32_t n_sealed, uint32_t n_open, uint32_t n_sink)
{
	struct kvq_layout_params lp = {
		.layers = 2, .kv_heads = 2, .head_dim = 64, .block_tokens = 16, .window = 0,
		.n_sealed = n_sealed, .n_open = n_open, .sink_blocks = n_sink ? 1 : 0, .n_sink = n_sink,
		.act = KVQ_DT_F16, .policy = pol,
	};
	struct kvq_layout *L = NULL;
	char err[256];

	if (kvq_policy_parse("int8", 2, pol, err, sizeof err) != 0 || kvq_layout_new(&lp, &L, err, sizeof err) != 0) {
		fprintf(stderr, "test layout: %s\n", err);
		abort();
	}
	return L;
}

static int ref_eq(struct kvq_block_ref a, struct kvq_block_ref b)
{
	return a.cls == b.cls && a.index == b.index;
}

/* ------------------------------------------------------------ classes */

static void test_classes(void)
{
	int distinct = 1;

	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		for (uint32_t d = 0; d < c; d++)
			distinct &= strcmp(kvq_block_class_name(c), kvq_block_class_name(d)) != 0;
	ok(distinct && !strcmp(kvq_block_class_name(KVQ_BLOCK_SEALED), "sealed") &&
		   !strcmp(kvq_block_class_name(KVQ_BLOCK_SINK), "sink") &&
		   !strcmp(kvq_block_class_name(KVQ_BLOCK_NCLASS), "unknown"),
	   "every class has its own name (sealed, sink); no class is \"unknown\"");
}

/* -------------------------------------------- the layout's addressing */

static void test_layout_ids(void)
{
	struct kvq_policy pol;
	struct kvq_layout *L = make_layout(&pol, 5, 3, 4), *N = make_layout(&pol, 5, 3, 0);
	const uint32_t nb = L->n_sealed + L->n_sink;
	uint8_t seen[16] = { 0 };
	int round = 1, dense = 1, sink_after = 1, range = 1, untouched = 1;

	/* every reference of every class, to its block id and back */
	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		for (uint32_t i = 0; i < kvq_layout_blocks(L, c); i++) {
			const struct kvq_block_ref r = { c, i };
			uint32_t b = UINT32_MAX;

			round &= kvq_layout_block_id(L, r, &b) == 0 && b < nb && ref_eq(kvq_layout_block_ref(L, b), r);
			if (b < nb)
				seen[b]++;
			sink_after &= c != KVQ_BLOCK_SINK || b == L->n_sealed + i;
		}
	for (uint32_t b = 0; b < nb; b++)
		dense &= seen[b] == 1;
	ok(round, "every class's every index: block id and back");
	ok(dense && kvq_layout_blocks(L, KVQ_BLOCK_SEALED) == 5 && kvq_layout_blocks(L, KVQ_BLOCK_SINK) == 4,
	   "block ids 0 .. n_sealed + n_sink - 1, each once");
	ok(sink_after && kvq_layout_block_first(L, KVQ_BLOCK_SINK) == L->n_sealed &&
		   kvq_layout_block_first(L, KVQ_BLOCK_SEALED) == 0,
	   "sink s is block id n_sealed + s (daemon/pool.h)");

	/* a peer's index is never trusted */
	const struct kvq_block_ref bad[] = {
		{ KVQ_BLOCK_SEALED, 5 }, { KVQ_BLOCK_SINK, 4 }, { KVQ_BLOCK_SEALED, UINT32_MAX },
		{ KVQ_BLOCK_SINK, UINT32_MAX }, { KVQ_BLOCK_SINK, KVQ_SINK_FLAG }, { KVQ_BLOCK_NCLASS, 0 },
		{ UINT32_MAX, 0 },
	};
	for (size_t i = 0; i < N_ELEM(bad); i++) {
		uint32_t b = 0xabcd;

		range &= kvq_layout_block_id(L, bad[i], &b) == -ERANGE;
		untouched &= b == 0xabcd;
	}
	ok(range && untouched, "past a class's slots, or no class: -ERANGE, nothing set (%zu cases)", N_ELEM(bad));
	{
		uint32_t b = 0xabcd;

		ok(kvq_layout_block_id(N, (struct kvq_block_ref){ KVQ_BLOCK_SINK, 0 }, &b) == -ERANGE && b == 0xabcd &&
			   kvq_layout_block_id(N, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, 4 }, &b) == 0 && b == 4,
		   "a pool without sink blocks: sink 0 refused, sealed 4 is block 4");
	}

	/* the kernels' addressing: a sink slice is an open slice past the open ones */
	int open_ok = 1, table_ok = 1;
	for (uint32_t s = 0; s < L->n_sink; s++) {
		const struct kvq_block_ref r = { KVQ_BLOCK_SINK, s };
		const uint32_t t = kvq_seq_table_sink(r);

		open_ok &= kvq_sink_open_id(L->n_open, s) == L->n_open + s;
		for (uint32_t l = 0; l < L->layers; l++)
			for (uint32_t h = 0; h < L->kv_heads; h++)
				open_ok &= kvq_layout_off(L, KVQ_SINK, s, l, h, KVQ_V_CODES) ==
					   kvq_layout_off(L, KVQ_OPEN, kvq_sink_open_id(L->n_open, s), l, h, KVQ_V_CODES);
		table_ok &= t == s + 1 && kvq_table_sink_open_id(L->n_open, t) == kvq_sink_open_id(L->n_open, s);
	}
	ok(open_ok, "sink s is open id n_open + s, the same bytes (kvq_layout_off)");
	ok(table_ok && kvq_seq_table_sink((struct kvq_block_ref){ KVQ_BLOCK_SEALED, 3 }) == 0,
	   "kvq_seq_table.sink: 1 + the sink id, and back to its open id; 0 for a sealed block 0");
	ok(kvq_layout_block_bytes(L, KVQ_BLOCK_SEALED) == L->sealed_block_bytes &&
		   kvq_layout_block_bytes(L, KVQ_BLOCK_SINK) == L->open_block_bytes,
	   "a sink block's bytes are an open block's");
	kvq_layout_free(L);
	kvq_layout_free(N);
}

/* ------------------------------------------------------------ the wire */

/* Packs m and unpacks it again (what the peer reads). */
static ProtobufCMessage *repack(const ProtobufCMessage *m)
{
	uint8_t buf[4096];
	size_t n = protobuf_c_message_pack(m, buf);

	return protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
}

static const struct kvq_block_ref mixed[] = {
	{ KVQ_BLOCK_SEALED, 3 }, { KVQ_BLOCK_SINK, 1 }, { KVQ_BLOCK_SEALED, 0 }, { KVQ_BLOCK_SINK, 0 },
	{ KVQ_BLOCK_SEALED, UINT32_MAX }, { KVQ_BLOCK_SEALED, (1u << 30) - 1 },
};

/* What a list of mixed reads as: class by class, each in its order (a
 * chain: the sinks first). */
static void mixed_order(int chain, struct kvq_block_ref *ret)
{
	size_t k = 0;

	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < N_ELEM(mixed); i++)
			if ((mixed[i].cls == KVQ_BLOCK_SINK) == (chain ? pass == 0 : pass == 1))
				ret[k++] = mixed[i];
}

/* mixed through m's list fields (group g): put, pack, unpack, get.  m's
 * lists point into buf, so buf is the caller's and outlives the call. */
static int list_round_trip(ProtobufCMessage *m, enum kvq_wire_group g, uint32_t *buf)
{
	struct kvq_block_ref want[N_ELEM(mixed)], got[N_ELEM(mixed)];
	ProtobufCMessage *u;
	size_t n = 0;
	int same = 1;

	if (kvq_wire_blocks_put(m, g, mixed, N_ELEM(mixed), buf) != 0 || !(u = repack(m)))
		return 0;
	mixed_order(g == KVQ_WIRE_CHAIN, want);
	same = kvq_wire_blocks_get(u, g, got, N_ELEM(got), &n) == 0 && n == N_ELEM(mixed);
	for (size_t i = 0; same && i < n; i++)
		same &= ref_eq(got[i], want[i]);
	protobuf_c_message_free_unpacked(u, NULL);
	return same;
}

static void test_wire_lists(void)
{
	Kvq__Release rl = KVQ__RELEASE__INIT;
	Kvq__Fork fk = KVQ__FORK__INIT;
	Kvq__AllocReply ar = KVQ__ALLOC_REPLY__INIT;
	Kvq__LookupReply lr = KVQ__LOOKUP_REPLY__INIT;
	struct kvq_block_ref got[N_ELEM(mixed)];
	uint32_t buf[N_ELEM(mixed)], rl_buf[N_ELEM(mixed)];
	size_t n = 0;

	ok(list_round_trip(&rl.base, KVQ_WIRE_IDS, rl_buf), "Release: mixed classes through the wire, class by class");
	ok(rl.n_sealed_ids == 4 && rl.n_sink_ids == 2 && rl.sealed_ids[0] == 3 && rl.sealed_ids[1] == 0 &&
		   rl.sealed_ids[2] == UINT32_MAX && rl.sink_ids[0] == 1 && rl.sink_ids[1] == 0 && rl.n_open_ids == 0,
	   "Release: sealed_ids 3 0 .., sink_ids 1 0, indexes as they are, open_ids untouched");
	ok(list_round_trip(&fk.base, KVQ_WIRE_IDS, buf), "Fork: mixed classes through the wire");
	ok(list_round_trip(&ar.base, KVQ_WIRE_IDS, buf), "AllocReply: mixed classes through the wire");
	ok(list_round_trip(&lr.base, KVQ_WIRE_CHAIN, buf), "LookupReply: a chain reads its sink first");

	/* one class only: the other field is an empty list */
	const struct kvq_block_ref one[] = { { KVQ_BLOCK_SEALED, 9 }, { KVQ_BLOCK_SEALED, 8 } };
	Kvq__Fork f2 = KVQ__FORK__INIT;
	ok(kvq_wire_blocks_put(&f2.base, KVQ_WIRE_IDS, one, 2, buf) == 0 && f2.n_sealed_ids == 2 &&
		   f2.n_sink_ids == 0 && f2.sink_ids == NULL && f2.sealed_ids[1] == 8,
	   "Fork of sealed blocks only: no sink_ids");
	Kvq__Release empty = KVQ__RELEASE__INIT;
	ok(kvq_wire_blocks_put(&empty.base, KVQ_WIRE_IDS, NULL, 0, NULL) == 0 &&
		   kvq_wire_blocks_get(&empty.base, KVQ_WIRE_IDS, got, 0, &n) == 0 && n == 0,
	   "an empty list both ways");

	/* too many for the caller's room: counted, nothing written */
	got[0] = (struct kvq_block_ref){ 7, 7 };
	ok(kvq_wire_blocks_get(&rl.base, KVQ_WIRE_IDS, got, 5, &n) == -EMSGSIZE && n == 6 && got[0].cls == 7 &&
		   kvq_wire_blocks_get(&rl.base, KVQ_WIRE_IDS, NULL, 0, &n) == 0 && n == 6,
	   "get: more than max is -EMSGSIZE with the count, ret untouched; ret NULL counts");

	/* a message without a class's field: none read, none written */
	Kvq__Seal se = KVQ__SEAL__INIT;
	const struct kvq_block_ref sk = { KVQ_BLOCK_SINK, 2 }, bad = { KVQ_BLOCK_NCLASS, 0 };
	ok(kvq_wire_blocks_put(&se.base, KVQ_WIRE_IDS, &sk, 1, buf) == -EINVAL && se.n_sealed_ids == 0 &&
		   kvq_wire_blocks_put(&rl.base, KVQ_WIRE_IDS, &bad, 1, buf) == -EINVAL && rl.n_sink_ids == 2,
	   "put: a class with no field in the message (Seal's sinks), or no class: -EINVAL, untouched");
}

static void test_wire_oneofs(void)
{
	int round = 1, none = 1;

	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		for (uint32_t pc = 0; pc <= KVQ_BLOCK_NCLASS; pc++) {   /* pc = NCLASS: no parent */
			Kvq__PublishBlock b = KVQ__PUBLISH_BLOCK__INIT;
			const struct kvq_block_ref self = { c, 11 + c }, par = { pc, 40 + pc };
			struct kvq_block_ref g1 = { 0 }, g2 = { 0 };
			size_t n1 = 9, n2 = 9;
			ProtobufCMessage *u;

			if (kvq_wire_blocks_put(&b.base, KVQ_WIRE_BLOCK, &self, 1, NULL) != 0 ||
			    kvq_wire_blocks_put(&b.base, KVQ_WIRE_PARENT, &par, pc < KVQ_BLOCK_NCLASS, NULL) != 0 ||
			    !(u = repack(&b.base))) {
				round = 0;
				continue;
			}
			round &= kvq_wire_blocks_get(u, KVQ_WIRE_BLOCK, &g1, 1, &n1) == 0 && n1 == 1 && ref_eq(g1, self);
			round &= kvq_wire_blocks_get(u, KVQ_WIRE_PARENT, &g2, 1, &n2) == 0 &&
				 n2 == (pc < KVQ_BLOCK_NCLASS) && (!n2 || ref_eq(g2, par));
			none &= pc < KVQ_BLOCK_NCLASS || ((Kvq__PublishBlock *)u)->parent_case ==
							       KVQ__PUBLISH_BLOCK__PARENT__NOT_SET;
			protobuf_c_message_free_unpacked(u, NULL);
		}
	ok(round, "PublishBlock: every class as block and as parent (or none) through the wire");
	ok(none, "no parent: the oneof stays unset");

	Kvq__PublishBlock b = KVQ__PUBLISH_BLOCK__INIT;
	const struct kvq_block_ref two[] = { { KVQ_BLOCK_SINK, 1 }, { KVQ_BLOCK_SEALED, 2 } };
	ok(kvq_wire_blocks_put(&b.base, KVQ_WIRE_BLOCK, &two[0], 1, NULL) == 0 &&
		   b.block_case == KVQ__PUBLISH_BLOCK__BLOCK_SINK_ID && b.sink_id == 1 &&
		   kvq_wire_blocks_put(&b.base, KVQ_WIRE_PARENT, &two[1], 1, NULL) == 0 &&
		   b.parent_case == KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID && b.parent_id == 2,
	   "a sink block is sink_id, a sealed parent parent_id");
	ok(kvq_wire_blocks_put(&b.base, KVQ_WIRE_BLOCK, two, 2, NULL) == -EINVAL && b.sink_id == 1,
	   "a oneof takes one reference");
}

/* Every name of the wire table is a field of the right shape in each
 * message that carries its group (kvq.proto). */
static void test_wire_table(void)
{
	static const struct {
		const ProtobufCMessageDescriptor *d;
		enum kvq_wire_group g;
	} carriers[] = {
		{ &kvq__alloc_reply__descriptor, KVQ_WIRE_IDS },  { &kvq__release__descriptor, KVQ_WIRE_IDS },
		{ &kvq__fork__descriptor, KVQ_WIRE_IDS },         { &kvq__lookup_reply__descriptor, KVQ_WIRE_CHAIN },
		{ &kvq__publish_block__descriptor, KVQ_WIRE_BLOCK }, { &kvq__publish_block__descriptor, KVQ_WIRE_PARENT },
	};
	int all = 1;

	for (size_t i = 0; i < N_ELEM(carriers); i++)
		for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++) {
			const char *name = kvq_wire_block_field(carriers[i].g, c);
			const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(carriers[i].d, name);
			const int list = carriers[i].g == KVQ_WIRE_IDS || carriers[i].g == KVQ_WIRE_CHAIN;

			if (!f || f->type != PROTOBUF_C_TYPE_UINT32 ||
			    (list ? f->label != PROTOBUF_C_LABEL_REPEATED : !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))) {
				diag("%s: no field %s of class %s", carriers[i].d->name, name, kvq_block_class_name(c));
				all = 0;
			}
		}
	ok(all, "the wire table names a field of every class in each message that carries block references");
	ok(!strcmp(kvq_wire_block_field(KVQ_WIRE_IDS, KVQ_BLOCK_SINK), "sink_ids") &&
		   !strcmp(kvq_wire_block_field(KVQ_WIRE_PARENT, KVQ_BLOCK_SEALED), "parent_id") &&
		   !strcmp(kvq_wire_block_field(KVQ_WIRE_BLOCK, KVQ_BLOCK_NCLASS), "?"),
	   "field names for messages: sink_ids, parent_id; \"?\" for no class");
}

/* -------------------------------------------- libkvq's public block ids */

static void test_public_ids(void)
{
	const uint32_t idx[] = { 0, 1, 77, KVQ_MAX_SLOTS - 1 };
	int round = 1;

	for (uint32_t c = 0; c < KVQ_BLOCK_NCLASS; c++)
		for (size_t i = 0; i < N_ELEM(idx); i++) {
			const struct kvq_block_ref r = { c, idx[i] };
			const uint32_t id = client_block_id(r);

			round &= ref_eq(client_block_ref(id), r) &&
				 id == (c == KVQ_BLOCK_SINK ? KVQ_SINK_ID(idx[i]) : idx[i]);
		}
	ok(round, "every class at indexes 0 .. 2^30 - 1: public id and back; a sealed id is its index, a "
		  "sink's KVQ_SINK_ID(index)");

	/* bits above the flag stay in the index: the daemon refuses it */
	struct kvq_policy pol;
	struct kvq_layout *L = make_layout(&pol, 5, 3, 4);
	const struct kvq_block_ref hi = client_block_ref(0x80000002u), hs = client_block_ref(0xc0000001u);
	uint32_t b = 0xabcd;
	ok(hi.cls == KVQ_BLOCK_SEALED && hi.index == 0x80000002u && hs.cls == KVQ_BLOCK_SINK &&
		   hs.index == 0x80000001u && kvq_layout_block_id(L, hi, &b) == -ERANGE &&
		   kvq_layout_block_id(L, hs, &b) == -ERANGE && b == 0xabcd,
	   "a public id with bit 31: its index kept, out of range at the daemon");
	kvq_layout_free(L);

	ok(!client_entry_is_sink(-1) && !client_entry_is_sink(5) && client_entry_is_sink((int32_t)KVQ_SINK_ID(2)),
	   "sequence table entries: -1 and sealed ids are no sink, KVQ_SINK_ID(2) is");
}

int main(void)
{
	test_classes();
	test_layout_ids();
	test_wire_lists();
	test_wire_oneofs();
	test_wire_table();
	test_public_ids();
	return done_testing();
}
