/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What fuzz_request and the seed writer (seeds.c) share, so that a seed
 * replays as it was written: the daemon state's configuration (inproc.h's,
 * with a small configured pool: a host pool's memory is allocated up front,
 * and a fresh state per input must stay cheap) and the four connections'
 * uids (root, two uids without rights, kvqd's own).
 */
#ifndef KVQ_TEST_FUZZ_STATE_H
#define KVQ_TEST_FUZZ_STATE_H

#include "../inproc.h"
#include "fuzz.h"

#define FUZZ_SLOTS 4

static const char fuzz_conf[] =
	"[kvqd]\nbackend = host\nmemory_budget = 64M\ncreate_on_attach = yes\ncreate_capacity = 256K\n"
	"[pool " INPROC_POOL "]\nmodel = " INPROC_MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\n"
	"block_tokens = 16\npolicy = int8\ncapacity = 128K\nattention_timing = yes\n"
	"[pool " INPROC_POOL "-sink]\nmodel = " INPROC_MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\n"
	"block_tokens = 16\npolicy = int4g32\ncapacity = 128K\nsink_blocks = 1\n";

__attribute__((unused))
static void fuzz_slot_uids(uid_t uids[FUZZ_SLOTS])
{
	uids[0] = 0;
	uids[1] = inproc_other_uid();
	uids[2] = uids[1] + 10;
	uids[3] = geteuid();
}

#endif
