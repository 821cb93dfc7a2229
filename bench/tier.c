/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench tier: what the host tier's copy engine costs on the host.  For
 * Llama-3-8B's geometry (32 layers, 8 KV heads, D = 128, B = 32) in each
 * format, N sealed blocks of a pool in host memory are packed into block
 * records (kernels/blockrec.h: what demotion does on kvqd's copy thread)
 * and unpacked back into other slots (promotion), one thread, against one
 * memcpy of the same total bytes in the same run.  Each figure is the best
 * of a few repetitions; the pool and the records are touched before.
 *
 *   kvq-bench tier [--blocks N] [--format LIST] [--json]
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"
#include "blockrec.h"
#include "layout.h"
#include "policy.h"

#define REPS 3

struct tier_figures {
	double memcpy_gbs, pack_gbs, unpack_gbs;
	uint64_t record_bytes;
};

static int tier_one(const char *fmt, uint32_t n, struct tier_figures *f)
{
	struct kvq_layout_params q = { .layers = 32, .kv_heads = 8, .head_dim = 128, .block_tokens = 32,
		.n_sealed = 2 * n, .n_open = 1, .act = KVQ_DT_F16 };
	struct kvq_policy pol;
	struct kvq_layout *L = NULL;
	uint8_t key[KVQ_BLOCKREC_KEY_LEN] = { 1 }, *base, *rec, *src, *dst;
	char err[256];
	uint64_t rs, total;
	int r = 0;

	if (kvq_policy_parse(fmt, q.layers, &pol, err, sizeof err) < 0 ||
	    (q.policy = &pol, kvq_layout_new(&q, &L, err, sizeof err)) < 0) {
		fprintf(stderr, "tier: %s: %s\n", fmt, err);
		return -1;
	}
	rs = kvq_blockrec_size(L, KVQ_BLOCK_SEALED);
	total = (uint64_t)n * rs;
	base = map_anon(L->total_bytes);
	rec = map_anon(total);
	src = map_anon(total);
	dst = map_anon(total);
	if (!base || !rec || !src || !dst) {
		fprintf(stderr, "tier: no memory for %u blocks of %s\n", n, fmt);
		kvq_layout_free(L);
		return -1;
	}
	memset(base, 0x5a, L->total_bytes);
	memset(rec, 0, total);
	memset(src, 0x3c, total);
	memset(dst, 0, total);
	f->record_bytes = rs;
	f->memcpy_gbs = f->pack_gbs = f->unpack_gbs = 0;
	for (int k = 0; k < REPS && r == 0; k++) {
		double t0 = now_s(), t1, t2, t3;

		memcpy(dst, src, total);
		t1 = now_s();
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = kvq_blockrec_pack(L, base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, i }, key, NULL, NULL,
					      rec + (uint64_t)i * rs, rs, err, sizeof err);
		t2 = now_s();
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = kvq_blockrec_unpack(L, base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, n + i },
						rec + (uint64_t)i * rs, rs, NULL, err, sizeof err);
		t3 = now_s();
		if (total / (t1 - t0) / 1e9 > f->memcpy_gbs)
			f->memcpy_gbs = (double)total / (t1 - t0) / 1e9;
		if (total / (t2 - t1) / 1e9 > f->pack_gbs)
			f->pack_gbs = (double)total / (t2 - t1) / 1e9;
		if (total / (t3 - t2) / 1e9 > f->unpack_gbs)
			f->unpack_gbs = (double)total / (t3 - t2) / 1e9;
	}
	if (r < 0)
		fprintf(stderr, "tier: %s: %s\n", fmt, err);
	munmap(base, L->total_bytes);
	munmap(rec, total);
	munmap(src, total);
	munmap(dst, total);
	kvq_layout_free(L);
	return r;
}

int cmd_tier(int argc, char **argv)
{
	static const struct option lo[] = { { "blocks", required_argument, NULL, 'n' },
		{ "format", required_argument, NULL, 'f' }, { "json", no_argument, NULL, 'j' }, { NULL, 0, NULL, 0 } };
	char formats[256] = "int8,int4g32", *save = NULL;
	uint32_t n = 256;
	int json = 0, ch, first = 1;

	while ((ch = getopt_long(argc, argv, "", lo, NULL)) >= 0) {
		if (ch == 'n')
			n = (uint32_t)strtoul(optarg, NULL, 10);
		else if (ch == 'f')
			snprintf(formats, sizeof formats, "%s", optarg);
		else if (ch == 'j')
			json = 1;
		else
			return 2;
	}
	if (n < 1 || n > 100000) {
		fprintf(stderr, "tier: --blocks 1..100000\n");
		return 2;
	}
	if (json)
		printf("{\"blocks\":%u,\"geometry\":\"32 layers, 8 KV heads, D 128, B 32\",\"formats\":[", n);
	else
		printf("host tier, %u blocks of Llama-3-8B geometry (32 layers, 8 KV heads, D 128, B 32), one thread\n"
		       "%-10s %12s %12s %12s %12s %8s %8s\n", n, "format", "record B", "memcpy GB/s", "pack GB/s",
		       "unpack GB/s", "pack/mc", "unpk/mc");
	for (char *fmt = strtok_r(formats, ",", &save); fmt; fmt = strtok_r(NULL, ",", &save)) {
		struct tier_figures f;

		if (tier_one(fmt, n, &f) < 0)
			return 1;
		if (json)
			printf("%s{\"format\":\"%s\",\"record_bytes\":%llu,\"memcpy_gbs\":%.2f,\"pack_gbs\":%.2f,"
			       "\"unpack_gbs\":%.2f}", first ? "" : ",", fmt, (unsigned long long)f.record_bytes,
			       f.memcpy_gbs, f.pack_gbs, f.unpack_gbs);
		else
			printf("%-10s %12llu %12.2f %12.2f %12.2f %8.2f %8.2f\n", fmt, (unsigned long long)f.record_bytes,
			       f.memcpy_gbs, f.pack_gbs, f.unpack_gbs, f.pack_gbs / f.memcpy_gbs,
			       f.unpack_gbs / f.memcpy_gbs);
		first = 0;
	}
	if (json)
		printf("]}\n");
	return 0;
}
