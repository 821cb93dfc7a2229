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
 * In a build with CUDA, the same blocks of a cuda pool (the daemon's own
 * backend, daemon/backend.h) go through the host tier's channel as kvqd's
 * copy thread sends them: every slice of a job's blocks as one async copy
 * to or from the pinned tier memory, one wait; demotion then seals each
 * record (header and checksum, kvq_blockrec_seal), promotion checks each
 * (kvq_blockrec_check) before the copy.  Against one cudaMemcpy of the
 * same total bytes between device memory and the same pinned memory, in
 * the same run; the DMA alone is printed beside the whole.
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
#ifdef KVQ_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend.h"
#endif

#define REPS 3

struct tier_figures {
	double memcpy_gbs, pack_gbs, unpack_gbs;
	uint64_t record_bytes;
	int gpu;                       /* the device figures are set */
	double d2h_gbs, h2d_gbs;       /* one cudaMemcpy each way */
	double dma_out_gbs, demote_gbs;   /* the channel's copies alone; with the records sealed */
	double dma_in_gbs, promote_gbs;   /* the channel's copies alone; with the records checked */
};

#ifdef KVQ_WITH_CUDA
static double best(double a, double b)
{
	return a > b ? a : b;
}

/* The device half of tier_one: n blocks of a cuda pool of L through the
 * channel into the records at rec (total bytes). */
static int tier_cuda(const struct kvq_layout *L, uint32_t n, uint8_t *rec, uint64_t rs, struct tier_figures *f)
{
	struct kvq_backend_mem mem = { .fd = -1 };
	struct kvq_backend_chan *ch = NULL;
	struct kvq_backend_run *runs = malloc(((size_t)n * L->layers + 1) * sizeof(*runs));
	uint64_t total = (uint64_t)n * rs;
	uint8_t key[KVQ_BLOCKREC_KEY_LEN] = { 2 };
	void *dbuf = NULL;
	char err[KVQ_BACKEND_MSG_MAX];
	int r;

	if (!runs || cudaMalloc(&dbuf, total) != cudaSuccess) {
		free(runs);
		return -1;
	}
	r = kvq_backend_mem_create(&kvq_backend_cuda, L->total_bytes, 0, "kvq-bench", &mem, err, sizeof err);
	if (r == 0)
		r = kvq_backend_cuda.chan_open(&mem, rec, total, &ch, err, sizeof err);
	for (int k = 0; k < REPS && r == 0; k++) {
		double t0, t1, t2, t3, t4, t5, t6;

		for (uint32_t i = 0; i < n; i++)
			for (uint32_t l = 0; l < L->layers; l++) {
				struct kvq_block_ref b = { KVQ_BLOCK_SEALED, i };

				runs[(size_t)i * L->layers + l] = (struct kvq_backend_run){
					.pool_off = kvq_layout_slice_off(L, b, l),
					.host = rec + (uint64_t)i * rs + kvq_blockrec_slice_at(L, KVQ_BLOCK_SEALED, l),
					.len = kvq_layout_slice_bytes(L, KVQ_BLOCK_SEALED, l) };
			}
		t0 = now_s();
		cudaMemcpy(rec, dbuf, total, cudaMemcpyDeviceToHost);
		t1 = now_s();
		cudaMemcpy(dbuf, rec, total, cudaMemcpyHostToDevice);
		t2 = now_s();
		r = kvq_backend_cuda.chan_copy(ch, 1, runs, n * L->layers, err, sizeof err);
		t3 = now_s();
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = kvq_blockrec_seal(L, KVQ_BLOCK_SEALED, key, NULL, NULL, 0, rec + (uint64_t)i * rs, rs);
		t4 = now_s();
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = kvq_blockrec_check(L, rec + (uint64_t)i * rs, rs, NULL, err, sizeof err);
		t5 = now_s();
		/* promotion into the other half of the pool's slots */
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t l = 0; l < L->layers; l++)
				runs[(size_t)i * L->layers + l].pool_off =
					kvq_layout_slice_off(L, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, n + i }, l);
		if (r == 0)
			r = kvq_backend_cuda.chan_copy(ch, 0, runs, n * L->layers, err, sizeof err);
		t6 = now_s();
		f->d2h_gbs = best(f->d2h_gbs, (double)total / (t1 - t0) / 1e9);
		f->h2d_gbs = best(f->h2d_gbs, (double)total / (t2 - t1) / 1e9);
		f->dma_out_gbs = best(f->dma_out_gbs, (double)total / (t3 - t2) / 1e9);
		f->demote_gbs = best(f->demote_gbs, (double)total / (t4 - t2) / 1e9);
		f->dma_in_gbs = best(f->dma_in_gbs, (double)total / (t6 - t5) / 1e9);
		f->promote_gbs = best(f->promote_gbs, (double)total / (t6 - t4) / 1e9);
	}
	if (r < 0)
		fprintf(stderr, "tier: cuda: %s\n", err);
	if (ch)
		kvq_backend_cuda.chan_close(ch);
	kvq_backend_mem_destroy(&mem);
	cudaFree(dbuf);
	free(runs);
	f->gpu = r == 0;
	return r;
}
#endif

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
	memset(f, 0, sizeof *f);
	f->record_bytes = rs;
	for (int k = 0; k < REPS && r == 0; k++) {
		double t0 = now_s(), t1, t2, t3;

		memcpy(dst, src, total);
		t1 = now_s();
		for (uint32_t i = 0; i < n && r == 0; i++)
			r = kvq_blockrec_pack(L, base, (struct kvq_block_ref){ KVQ_BLOCK_SEALED, i }, key, NULL, NULL, 0,
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
	f->gpu = 0;
#ifdef KVQ_WITH_CUDA
	{
		int ndev = 0;

		if (r == 0 && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 && tier_cuda(L, n, rec, rs, f) < 0)
			fprintf(stderr, "tier: %s: the device part failed\n", fmt);
	}
#endif
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
		if (json) {
			printf("%s{\"format\":\"%s\",\"record_bytes\":%llu,\"memcpy_gbs\":%.2f,\"pack_gbs\":%.2f,"
			       "\"unpack_gbs\":%.2f", first ? "" : ",", fmt, (unsigned long long)f.record_bytes,
			       f.memcpy_gbs, f.pack_gbs, f.unpack_gbs);
			if (f.gpu)
				printf(",\"d2h_gbs\":%.2f,\"h2d_gbs\":%.2f,\"dma_out_gbs\":%.2f,\"demote_gbs\":%.2f,"
				       "\"dma_in_gbs\":%.2f,\"promote_gbs\":%.2f", f.d2h_gbs, f.h2d_gbs, f.dma_out_gbs,
				       f.demote_gbs, f.dma_in_gbs, f.promote_gbs);
			printf("}");
		} else {
			printf("%-10s %12llu %12.2f %12.2f %12.2f %8.2f %8.2f\n", fmt, (unsigned long long)f.record_bytes,
			       f.memcpy_gbs, f.pack_gbs, f.unpack_gbs, f.pack_gbs / f.memcpy_gbs,
			       f.unpack_gbs / f.memcpy_gbs);
			if (f.gpu)
				printf("  cuda pool: D2H %.2f GB/s, demotion %.2f (DMA alone %.2f) = %.2f of D2H; "
				       "H2D %.2f, promotion %.2f (DMA alone %.2f) = %.2f of H2D\n", f.d2h_gbs,
				       f.demote_gbs, f.dma_out_gbs, f.demote_gbs / f.d2h_gbs, f.h2d_gbs, f.promote_gbs,
				       f.dma_in_gbs, f.promote_gbs / f.h2d_gbs);
		}
		first = 0;
	}
	if (json)
		printf("]}\n");
	return 0;
}
