/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool layout (kernels/layout.h): field sizes and offsets of a sealed
 * head slice against values worked out by hand from kvq_format.h's
 * description of the slice; slice, region and pool sizes; bytes per value
 * against FP16; a byte map of whole pools (every field of every slot, layer
 * and head claims its bytes once, inside the pool, aligned); the split of a
 * sequence into sealed and open tokens; rejected geometries; pools beyond
 * 4 GiB, and pools beyond 2^64 bytes.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "policy.h"
#include "layout.h"
#include "../tap.h"

/* ------------------------------------------------------------- helpers */

static void policy(const char *s, uint32_t layers, struct kvq_policy *p)
{
	char err[256];

	if (kvq_policy_parse(s, layers, p, err, sizeof err) != 0) {
		/* a bad policy string is a bug of this test, not of the layout */
		fprintf(stderr, "test policy '%s': %s\n", s, err);
		abort();
	}
}

static struct kvq_layout_params params(const struct kvq_policy *p, uint32_t H, uint32_t D, uint32_t B,
				       uint32_t n_sealed, uint32_t n_open)
{
	struct kvq_layout_params lp = {
		.layers = p->n_layers, .kv_heads = H, .head_dim = D, .block_tokens = B,
		.window = 0, .n_sealed = n_sealed, .n_open = n_open, .act = KVQ_DT_F16, .policy = p,
	};
	return lp;
}

static uint64_t up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* ---------------------------------------------------- hand-worked sizes */

struct hand {
	const char *policy;
	uint32_t B, D;
	uint32_t size[KVQ_NFIELDS];   /* K codes, K params, V codes, V params */
	uint32_t off[KVQ_NFIELDS];
	uint32_t head;
};

/*
 * Sizes from the slice description (kvq_format.h): codes are B*D*bits/8
 * bytes; parameters are per token one fp16 (2 bytes x B), per group
 * {s, z} (4 bytes x B x D/group), per channel {s, z} (4 bytes x D); KIVI's V
 * uses groups of 32.  Each array starts 16-byte aligned, so an offset is the
 * previous offset plus the previous size rounded up to 16.
 */
static const struct hand hands[] = {
	/* B=32, D=128 */
	/* int8: K codes 32*128 = 4096, K scales 32*2 = 64, same for V: 8320 */
	{ "int8", 32, 128, { 4096, 64, 4096, 64 }, { 0, 4096, 4160, 8256 }, 8320 },
	/* fp8 and fp8e5m2: one byte per code, one fp16 scale per token, as int8 */
	{ "fp8", 32, 128, { 4096, 64, 4096, 64 }, { 0, 4096, 4160, 8256 }, 8320 },
	{ "fp8e5m2", 32, 128, { 4096, 64, 4096, 64 }, { 0, 4096, 4160, 8256 }, 8320 },
	/* kivi4: K codes 4096/2 = 2048, K 128 channels x {s,z} fp16 = 512,
	 * V codes 2048, V 4 groups x 32 tokens x {s,z} = 512: 5120 */
	{ "kivi4", 32, 128, { 2048, 512, 2048, 512 }, { 0, 2048, 2560, 4608 }, 5120 },
	/* kivi2: codes 4096/4 = 1024, params as kivi4: 3072 */
	{ "kivi2", 32, 128, { 1024, 512, 1024, 512 }, { 0, 1024, 1536, 2560 }, 3072 },
	/* int4g32: codes 2048, 32 tokens x 4 groups x 4 bytes = 512: 5120 */
	{ "int4g32", 32, 128, { 2048, 512, 2048, 512 }, { 0, 2048, 2560, 4608 }, 5120 },
	/* int4g64: codes 2048, 32 x 2 groups x 4 = 256: 4608 */
	{ "int4g64", 32, 128, { 2048, 256, 2048, 256 }, { 0, 2048, 2304, 4352 }, 4608 },
	/* int4g128: codes 2048, 32 x 1 group x 4 = 128: 4352 */
	{ "int4g128", 32, 128, { 2048, 128, 2048, 128 }, { 0, 2048, 2176, 4224 }, 4352 },
	/* f16, bf16: 32*128*2 = 8192 bytes of codes, no parameters */
	{ "f16", 32, 128, { 8192, 0, 8192, 0 }, { 0, 8192, 8192, 16384 }, 16384 },
	{ "bf16", 32, 128, { 8192, 0, 8192, 0 }, { 0, 8192, 8192, 16384 }, 16384 },
	/* K int8 (4096 + 64), V kivi2 (1024 + 512): 5696 */
	{ "k=int8,v=kivi2", 32, 128, { 4096, 64, 1024, 512 }, { 0, 4096, 4160, 5184 }, 5696 },
	/* K kivi2 per channel (1024 + 512), V int8 (4096 + 64): 5696 */
	{ "k=kivi2,v=int8", 32, 128, { 1024, 512, 4096, 64 }, { 0, 1024, 1536, 5632 }, 5696 },
	/* K f16 (8192, no params), V int4g64 (2048 + 256) */
	{ "k=f16,v=int4g64", 32, 128, { 8192, 0, 2048, 256 }, { 0, 8192, 8192, 10240 }, 10496 },

	/* B=32, D=64 */
	/* int8: 2048 + 64 + 2048 + 64 = 4224 */
	{ "int8", 32, 64, { 2048, 64, 2048, 64 }, { 0, 2048, 2112, 4160 }, 4224 },
	/* kivi4: 1024 + 64 channels x 4 = 256 + 1024 + 2 groups x 32 x 4 = 256 */
	{ "kivi4", 32, 64, { 1024, 256, 1024, 256 }, { 0, 1024, 1280, 2304 }, 2560 },
	/* kivi2: 512 + 256 + 512 + 256 */
	{ "kivi2", 32, 64, { 512, 256, 512, 256 }, { 0, 512, 768, 1280 }, 1536 },
	/* int4g64: 1024 + 32 x 1 x 4 = 128, twice */
	{ "int4g64", 32, 64, { 1024, 128, 1024, 128 }, { 0, 1024, 1152, 2176 }, 2304 },
	/* f16: 32*64*2 = 4096 twice */
	{ "f16", 32, 64, { 4096, 0, 4096, 0 }, { 0, 4096, 4096, 8192 }, 8192 },

	/* B=16, D=32: the smallest geometry */
	/* kivi2: K codes 16*32/4 = 128, K 32 channels x 4 = 128, V codes 128,
	 * V 16 tokens x 1 group x 4 = 64: 448 */
	{ "kivi2", 16, 32, { 128, 128, 128, 64 }, { 0, 128, 256, 384 }, 448 },
	/* int8: 512 + 16*2 = 32, twice: 1088 */
	{ "int8", 16, 32, { 512, 32, 512, 32 }, { 0, 512, 544, 1056 }, 1088 },
	/* int4g32: 256 + 16 x 1 x 4 = 64, twice: 640 */
	{ "int4g32", 16, 32, { 256, 64, 256, 64 }, { 0, 256, 320, 576 }, 640 },

	/* B=64, D=256 */
	/* int4g128: 64*256/2 = 8192, 64 x 2 groups x 4 = 512, twice: 17408 */
	{ "int4g128", 64, 256, { 8192, 512, 8192, 512 }, { 0, 8192, 8704, 16896 }, 17408 },
	/* kivi2: 4096, 256 channels x 4 = 1024, 4096, 64 x 8 groups x 4 = 2048 */
	{ "kivi2", 64, 256, { 4096, 1024, 4096, 2048 }, { 0, 4096, 5120, 9216 }, 11264 },

	/* B=256, D=256 f16: the largest head slice, 256*256*2 = 131072 twice */
	{ "f16", 256, 256, { 131072, 0, 131072, 0 }, { 0, 131072, 131072, 262144 }, 262144 },
};

static void test_hand_sizes(void)
{
	int bad = 0;

	for (size_t i = 0; i < sizeof hands / sizeof hands[0]; i++) {
		const struct hand *h = &hands[i];
		struct kvq_policy p;
		struct kvq_layout *L = NULL;
		struct kvq_layout_params lp;
		const uint32_t H = 3, ns = 2, no = 1;
		char err[256] = "";
		int e = 0, rc;

		policy(h->policy, 2, &p);
		lp = params(&p, H, h->D, h->B, ns, no);
		rc = kvq_layout_new(&lp, &L, err, sizeof err);
		if (rc != 0) {
			diag("%s B=%u D=%u: %s", h->policy, h->B, h->D, err);
			bad++;
			continue;
		}
		for (uint32_t l = 0; l < 2; l++) {
			const struct kvq_layer_layout *ll = &L->layer[l];
			for (int f = 0; f < KVQ_NFIELDS; f++)
				e += ll->size[f] != h->size[f] || ll->off[f] != h->off[f];
			e += ll->sealed_head != h->head;
			/* open head slice: B rows of K, B rows of V, fp16 */
			e += ll->open_head != 2 * h->B * h->D * 2;
			e += ll->sealed_slice != (uint64_t)H * h->head;
			e += ll->open_slice != (uint64_t)H * 2 * h->B * h->D * 2;
			e += ll->kfmt != p.k[l] || ll->vfmt != p.v[l];
		}
		/* layer 1 starts after layer 0's 2 sealed and 1 open slices,
		 * rounded up to 256; the pool ends likewise after layer 1 */
		e += L->layer[0].region != 0;
		e += L->layer[1].region != up(ns * (uint64_t)H * h->head + no * (uint64_t)H * 4 * h->B * h->D, 256);
		e += L->total_bytes != 2 * L->layer[1].region;
		e += L->sealed_block_bytes != 2ull * H * h->head;
		e += L->open_block_bytes != 2ull * H * 4 * h->B * h->D;
		if (e) {
			diag("%s B=%u D=%u: %d mismatches; got sizes %u %u %u %u offsets %u %u %u %u head %u",
			     h->policy, h->B, h->D, e, L->layer[0].size[0], L->layer[0].size[1],
			     L->layer[0].size[2], L->layer[0].size[3], L->layer[0].off[0], L->layer[0].off[1],
			     L->layer[0].off[2], L->layer[0].off[3], L->layer[0].sealed_head);
			bad++;
		}
		kvq_layout_free(L);
	}
	ok(bad == 0, "field sizes, offsets, head, slice and region sizes of %zu geometries match the "
	   "hand-worked values (%d wrong)", sizeof hands / sizeof hands[0], bad);
}

/* Region offsets, pool and block sizes of whole pools, worked out by hand. */
static void test_hand_regions(void)
{
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	int rc;

	/*
	 * int8, B=32, D=128, H=3, 1 sealed + 1 open slot, 2 layers.
	 * sealed slice 3 x 8320 = 24960; open slice 3 x 2 x 32 x 128 x 2 = 49152;
	 * layer 0 ends at 74112 = 289.5 x 256, so layer 1 starts at 74240 and
	 * ends at 148352, rounded up: 148480.
	 */
	policy("int8", 2, &p);
	lp = params(&p, 3, 128, 32, 1, 1);
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->layer[0].region == 0 && L->layer[1].region == 74240 && L->total_bytes == 148480 &&
	   L->sealed_block_bytes == 49920 && L->open_block_bytes == 98304,
	   "int8 B=32 D=128 H=3 1+1 slots x 2 layers: regions 0, 74240; 148480 bytes; blocks 49920 and 98304");
	ok(rc == 0 && L->version == KVQ_LAYOUT_VERSION && L->layers == 2 && L->kv_heads == 3 &&
	   L->head_dim == 128 && L->block_tokens == 32 && L->n_sealed == 1 && L->n_open == 1 &&
	   L->act == KVQ_DT_F16 && L->window == 32, "the layout records its version, geometry and window B");
	if (rc == 0)
		kvq_layout_free(L);

	/*
	 * 0:kivi2;1:f16, B=16, D=32, H=1, 1 sealed + 1 open slot.
	 * layer 0: sealed 448 + open 2 x 16 x 32 x 2 = 2048 -> 2496, rounded
	 * up to 2560; layer 1: f16 head 1024 + 1024 = 2048, + open 2048 = 4096,
	 * ends at 6656 = 26 x 256.  Blocks: 448 + 2048 = 2496 sealed, 4096 open.
	 */
	policy("0:kivi2;1:f16", 2, &p);
	lp = params(&p, 1, 32, 16, 1, 1);
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->layer[1].region == 2560 && L->total_bytes == 6656 && L->sealed_block_bytes == 2496 &&
	   L->open_block_bytes == 4096 && L->layer[0].sealed_head == 448 && L->layer[1].sealed_head == 2048,
	   "0:kivi2;1:f16 B=16 D=32 H=1 1+1 slots: layer 1 at 2560, 6656 bytes, blocks 2496 and 4096");
	ok(rc == 0 && L->window == 64, "... and the default window is 4B = 64 (kivi used)");
	if (rc == 0)
		kvq_layout_free(L);

	/*
	 * Codebook formats: 0:k=pq2,v=int8;1:pq1, B=16, D=32, H=1, 1 + 1 slots.
	 * layer 0: K pq2 16 x 32/4 = 128 bytes of codes, no parameters; V int8
	 * 512 + 32: head 672, + open 2048 = 2720 -> layer 1 at 2816.  layer 1:
	 * pq1 16 x 32/8 = 64 each: head 128, + 2048 ends at 4992 -> codebook
	 * region at 5120: layer 0 K, layer 1 K, layer 1 V, 256 x 32 x 2 =
	 * 16384 bytes each, 49152 in all -> 54272 bytes.
	 */
	policy("0:k=pq2,v=int8;1:pq1", 2, &p);
	lp = params(&p, 1, 32, 16, 1, 1);
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->layer[0].sealed_head == 672 && L->layer[1].region == 2816 && L->layer[1].sealed_head == 128 &&
	   L->codebook_off == 5120 && L->codebook_bytes == 49152 && L->total_bytes == 54272 &&
	   L->layer[0].codebook[0] == 5120 && L->layer[0].codebook[1] == UINT64_MAX &&
	   L->layer[1].codebook[0] == 21504 && L->layer[1].codebook[1] == 37888,
	   "0:k=pq2,v=int8;1:pq1 B=16 D=32 H=1 1+1 slots: codebooks at 5120, 21504, 37888; 54272 bytes");
	if (rc == 0)
		kvq_layout_free(L);

	/*
	 * The byte-map pool: 0:int8;1:k=kivi4,v=int4g32;2:fp8, B=32, D=64,
	 * H=3, 5 sealed + 3 open slots, bf16 window.
	 * layer 0 (int8, head 4224): 5 x 3 x 4224 = 63360 sealed, 3 x 3 x 8192 =
	 * 73728 open, ends at 137088 = 535.5 x 256 -> layer 1 at 137216.
	 * layer 1 (K kivi4 1024 + 256, V int4g32 1024 + 32 x 2 x 4 = 256: head
	 * 2560): 5 x 3 x 2560 = 38400 + 73728 = 112128, ends at 249344 = 974 x
	 * 256 -> layer 2 at 249344.  layer 2 (fp8, as int8): ends at 386432 =
	 * 1509.5 x 256 -> 386560 bytes.
	 */
	policy("0:int8;1:k=kivi4,v=int4g32;2:fp8", 3, &p);
	lp = params(&p, 3, 64, 32, 5, 3);
	lp.act = KVQ_DT_BF16;
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->layer[1].region == 137216 && L->layer[2].region == 249344 && L->total_bytes == 386560 &&
	   L->layer[1].sealed_head == 2560 && L->layer[1].open_head == 8192,
	   "mixed 3-layer pool: layers at 0, 137216, 249344; 386560 bytes");
	if (rc == 0)
		kvq_layout_free(L);
}

/* Every valid (B, D, format) against the slice rules, and the bytes per
 * value the format reports against the layout. */
static void test_all_formats(void)
{
	static const uint32_t Bs[] = { 16, 32, 48, 64, 128, 256 };
	static const uint32_t Ds[] = { 32, 64, 96, 128, 192, 256 };
	int bad = 0, bad_bpv = 0, padded = 0, n = 0;

	for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++)
		for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
			for (int kf = 0; kf < KVQ_FMT_COUNT; kf++)
				for (int vf = 0; vf < KVQ_FMT_COUNT; vf++) {
					uint32_t B = Bs[bi], D = Ds[di];
					struct kvq_policy p = { .n_layers = 1 };
					struct kvq_layout *L = NULL;
					struct kvq_layout_params lp;
					const struct kvq_layer_layout *ll;
					int rc, valid = 1, e = 0;
					uint32_t o = 0;
					double bpv_k, bpv_v;

					p.k[0] = (uint8_t)kf;
					p.v[0] = (uint8_t)vf;
					/* a group must divide the head dim */
					if ((kvq_fmt_group(kf, 0) && D % kvq_fmt_group(kf, 0)) ||
					    (kvq_fmt_group(vf, 1) && D % kvq_fmt_group(vf, 1)))
						valid = 0;
					lp = params(&p, 2, D, B, 1, 1);
					rc = kvq_layout_new(&lp, &L, NULL, 0);
					if (!valid) {
						if (rc != -EINVAL)
							bad++;
						if (rc == 0)
							kvq_layout_free(L);
						continue;
					}
					if (rc != 0) {
						bad++;
						continue;
					}
					n++;
					ll = &L->layer[0];
					for (int f = 0; f < KVQ_NFIELDS; f++) {
						int is_v = f >= KVQ_V_CODES, fm = is_v ? vf : kf;
						int kind = kvq_fmt_param_kind(fm, is_v);
						uint32_t want = f == KVQ_K_CODES || f == KVQ_V_CODES ?
							B * (D / kvq_fmt_subdim(fm)) * kvq_fmt_bits(fm) / 8 :
							kvq_param_count(kind, kvq_fmt_group(fm, is_v), B, D) *
							kvq_param_entry_bytes(kind);
						e += ll->size[f] != want || ll->off[f] != o || ll->off[f] % 16;
						padded += want % 16 != 0;
						o += (uint32_t)up(want, 16);
					}
					e += ll->sealed_head != o;
					if (e) {
						if (bad < 5)
							diag("B=%u D=%u k=%s v=%s: %d mismatches", B, D, kvq_fmt_name(kf),
							     kvq_fmt_name(vf), e);
						bad++;
					}
					/* bytes per value of K (of V) times B*D is the K (V) part of
					 * the head; the quotient is rounded, so compare within 1e-9 */
					bpv_k = kvq_fmt_bytes_per_value(kf, 0, B, D) * B * D;
					bpv_v = kvq_fmt_bytes_per_value(vf, 1, B, D) * B * D;
					if (fabs(bpv_k - ll->off[KVQ_V_CODES]) > 1e-9 * bpv_k ||
					    fabs(bpv_v - (ll->sealed_head - ll->off[KVQ_V_CODES])) > 1e-9 * bpv_v) {
						if (bad_bpv < 5)
							diag("B=%u D=%u k=%s v=%s: %.17g + %.17g vs %u", B, D, kvq_fmt_name(kf),
							     kvq_fmt_name(vf), bpv_k, bpv_v, ll->sealed_head);
						bad_bpv++;
					}
					kvq_layout_free(L);
				}
	ok(bad == 0, "%d valid (B, D, k, v) combinations follow the slice rules, invalid groups are "
	   "rejected (%d wrong)", n, bad);
	ok(bad_bpv == 0, "kvq_fmt_bytes_per_value agrees with the layout's head slice (%d wrong)", bad_bpv);
	/* B a multiple of 16 and D of 32 make every array a multiple of 16
	 * bytes: no padding arises today (the rule is checked above anyway) */
	diag("%d arrays needed padding to 16 bytes", padded);
}

static double ratio(const char *pol, uint32_t B, uint32_t D)
{
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	double r, k, v;

	policy(pol, 1, &p);
	lp = params(&p, 1, D, B, 1, 1);
	if (kvq_layout_new(&lp, &L, NULL, 0) != 0)
		return -1;
	/* the layout's sealed head against an FP16 head (the open head) */
	r = (double)L->layer[0].sealed_head / L->layer[0].open_head;
	k = kvq_fmt_bytes_per_value(p.k[0], 0, B, D) / 2;
	v = kvq_fmt_bytes_per_value(p.v[0], 1, B, D) / 2;
	kvq_layout_free(L);
	/* both ways must agree; return the larger so a mismatch cannot pass */
	if (k != v || k != r)
		return 99;
	return r;
}

static void test_ratios(void)
{
	double r;

	/* int8 D=128: (4096 + 64) / 8192 = 0.5078 */
	r = ratio("int8", 32, 128);
	ok(r > 0 && r <= 0.51, "int8 B=32 D=128 stores %.4f of f16's bytes (<= 0.51)", r);
	/* int8 D=64: (2048 + 64) / 4096 = 0.5156 */
	r = ratio("int8", 32, 64);
	ok(r > 0 && r <= 0.52, "int8 B=32 D=64 stores %.4f of f16's bytes (<= 0.52)", r);
	/* kivi4 D=128: (2048 + 512) / 8192 = 0.3125; D=64: (1024 + 256) / 4096 */
	r = ratio("kivi4", 32, 128);
	ok(r > 0 && r <= 0.32, "kivi4 B=32 D=128 stores %.4f of f16's bytes (<= 0.32)", r);
	r = ratio("kivi4", 32, 64);
	ok(r > 0 && r <= 0.32, "kivi4 B=32 D=64 stores %.4f of f16's bytes (<= 0.32)", r);
	/* kivi2 D=128: (1024 + 512) / 8192 = 0.1875 */
	r = ratio("kivi2", 32, 128);
	ok(r > 0 && r <= 0.19, "kivi2 B=32 D=128 stores %.4f of f16's bytes (<= 0.19)", r);
	r = ratio("kivi2", 32, 64);
	ok(r > 0 && r <= 0.19, "kivi2 B=32 D=64 stores %.4f of f16's bytes (<= 0.19)", r);
	r = ratio("f16", 32, 128);
	ok(r == 1.0, "f16 stores exactly f16's bytes (%.4f)", r);
}

/* ------------------------------------------------------------- byte map */

struct mapstats {
	uint64_t twice, outside, misaligned, bad_region, claimed, want_claimed, tail_bad;
};

static void claim(uint8_t *map, uint64_t total, uint64_t off, uint64_t size, struct mapstats *st)
{
	if (off % 16)
		st->misaligned++;
	if (off > total || size > total - off) {
		st->outside++;
		return;
	}
	for (uint64_t i = off; i < off + size; i++) {
		if (map[i])
			st->twice++;
		map[i] = 1;
	}
	st->claimed += size;
}

/* Marks every field of every slot, layer and head of L, then checks that
 * the only unclaimed bytes are the padding the rules allow: arrays rounded
 * up to 16 inside a head slice, regions rounded up to 256. */
static void byte_map(const struct kvq_layout *L, struct mapstats *st)
{
	uint8_t *map = calloc(L->total_bytes ? L->total_bytes : 1, 1);
	uint64_t rows = (uint64_t)L->block_tokens * L->head_dim * kvq_dtype_bytes(L->act);

	if (!map)
		abort();
	for (uint32_t l = 0; l < L->layers; l++) {
		const struct kvq_layer_layout *ll = &L->layer[l];
		uint64_t end;

		if (ll->region % 256)
			st->bad_region++;
		for (uint32_t s = 0; s < L->n_sealed; s++)
			for (uint32_t h = 0; h < L->kv_heads; h++)
				for (int f = 0; f < KVQ_NFIELDS; f++) {
					claim(map, L->total_bytes, kvq_layout_off(L, KVQ_SEALED, s, l, h, f), ll->size[f], st);
					st->want_claimed += ll->size[f];
				}
		for (uint32_t s = 0; s < L->n_open; s++)
			for (uint32_t h = 0; h < L->kv_heads; h++) {
				claim(map, L->total_bytes, kvq_layout_off(L, KVQ_OPEN, s, l, h, KVQ_K_CODES), rows, st);
				claim(map, L->total_bytes, kvq_layout_off(L, KVQ_OPEN, s, l, h, KVQ_V_CODES), rows, st);
				st->want_claimed += 2 * rows;
			}
		/* sink slices: open slices after the open ones */
		for (uint32_t s = 0; s < L->n_sink; s++)
			for (uint32_t h = 0; h < L->kv_heads; h++) {
				claim(map, L->total_bytes, kvq_layout_off(L, KVQ_SINK, s, l, h, KVQ_K_CODES), rows, st);
				claim(map, L->total_bytes, kvq_layout_off(L, KVQ_SINK, s, l, h, KVQ_V_CODES), rows, st);
				st->want_claimed += 2 * rows;
				st->tail_bad += kvq_layout_off(L, KVQ_SINK, s, l, h, KVQ_K_CODES) !=
						kvq_layout_off(L, KVQ_OPEN, L->n_open + s, l, h, KVQ_K_CODES);
			}
		/* this layer's codebooks: 256 centroids of D FP16 values per head */
		for (int is_v = 0; is_v < 2; is_v++)
			if (ll->codebook[is_v] != UINT64_MAX) {
				uint64_t n = 256ull * L->kv_heads * L->head_dim * 2;
				claim(map, L->total_bytes, ll->codebook[is_v], n, st);
				st->want_claimed += n;
				st->tail_bad += ll->codebook[is_v] < L->codebook_off ||
						ll->codebook[is_v] + n > L->codebook_off + L->codebook_bytes;
			}
		/* between the layer's last slice and the next region (or the
		 * codebook region) only the rounding to 256 may be left, and
		 * nothing of it claimed */
		end = ll->region + (uint64_t)L->n_sealed * ll->sealed_slice +
		      ((uint64_t)L->n_open + L->n_sink) * ll->open_slice;
		{
			uint64_t next = l + 1 < L->layers ? L->layer[l + 1].region : L->codebook_off;
			if (next < end || next - end >= 256 || next != up(end, 256))
				st->tail_bad++;
			for (uint64_t i = end; i < next && i < L->total_bytes; i++)
				st->tail_bad += map[i];
		}
	}
	/* the codebook region ends the pool, rounded to 256 */
	st->tail_bad += L->codebook_off % 256 != 0 || L->total_bytes != up(L->codebook_off + L->codebook_bytes, 256);
	free(map);
}

static int map_ok(const struct mapstats *st)
{
	return !st->twice && !st->outside && !st->misaligned && !st->bad_region && !st->tail_bad &&
	       st->claimed == st->want_claimed;
}

static void test_byte_map(void)
{
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	struct mapstats st;
	int rc, bad = 0, n = 0;

	/* the mixed pool worked out by hand above */
	policy("0:int8;1:k=kivi4,v=int4g32;2:fp8", 3, &p);
	lp = params(&p, 3, 64, 32, 5, 3);
	lp.act = KVQ_DT_BF16;
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	if (rc != 0)
		abort();
	memset(&st, 0, sizeof st);
	byte_map(L, &st);
	ok(map_ok(&st), "mixed 3-layer pool, H=3, 5 sealed + 3 open: %llu bytes claimed once each "
	   "(twice %llu, outside %llu, misaligned %llu, regions %llu, tails %llu)",
	   (unsigned long long)st.claimed, (unsigned long long)st.twice, (unsigned long long)st.outside,
	   (unsigned long long)st.misaligned, (unsigned long long)st.bad_region, (unsigned long long)st.tail_bad);
	/* open V rows follow the K rows of the same head */
	ok(kvq_layout_off(L, KVQ_OPEN, 2, 1, 2, KVQ_V_CODES) ==
	   kvq_layout_off(L, KVQ_OPEN, 2, 1, 2, KVQ_K_CODES) + 32 * 64 * 2 &&
	   kvq_layout_off(L, KVQ_OPEN, 0, 1, 0, KVQ_K_CODES) == 137216 + 5 * 3 * 2560ull,
	   "open slot 0 of layer 1 starts after its 5 sealed slices; V rows follow K rows");
	kvq_layout_free(L);

	/* random pools: geometry, per-layer formats, slot counts, dtype */
	for (int i = 0; i < 300; i++) {
		static const uint32_t Bs[] = { 16, 32, 48, 64 };
		static const uint32_t Ds[] = { 32, 64, 96, 128 };
		uint32_t B = Bs[tap_rand() % 4], D = Ds[tap_rand() % 4];
		uint32_t layers = 1 + (uint32_t)(tap_rand() % 6);

		memset(&p, 0, sizeof p);
		p.n_layers = layers;
		for (uint32_t l = 0; l < layers; l++) {
			int f;
			for (int is_v = 0; is_v < 2; is_v++) {
				do
					f = (int)(tap_rand() % KVQ_FMT_COUNT);
				while (kvq_fmt_group(f, is_v) && D % kvq_fmt_group(f, is_v));
				if (is_v)
					p.v[l] = (uint8_t)f;
				else
					p.k[l] = (uint8_t)f;
			}
		}
		lp = params(&p, 1 + (uint32_t)(tap_rand() % 4), D, B, (uint32_t)(tap_rand() % 6),
			    (uint32_t)(tap_rand() % 4));
		lp.act = tap_rand() % 2 ? KVQ_DT_BF16 : KVQ_DT_F16;
		/* a third of them keep sink blocks */
		lp.sink_blocks = i % 3 == 0;
		lp.n_sink = lp.sink_blocks ? 1 + (uint32_t)(tap_rand() % 3) : 0;
		rc = kvq_layout_new(&lp, &L, NULL, 0);
		if (rc != 0) {
			bad++;
			continue;
		}
		memset(&st, 0, sizeof st);
		byte_map(L, &st);
		if (!map_ok(&st)) {
			if (bad < 5)
				diag("B=%u D=%u L=%u H=%u %u+%u slots: twice %llu outside %llu misaligned %llu", B, D,
				     layers, lp.kv_heads, lp.n_sealed, lp.n_open, (unsigned long long)st.twice,
				     (unsigned long long)st.outside, (unsigned long long)st.misaligned);
			bad++;
		}
		n++;
		kvq_layout_free(L);
	}
	ok(bad == 0, "byte maps of %d random pools (mixed formats, 0-5 sealed, 0-3 open, a third 1-3 sink slots): every "
	   "byte claimed at most once, inside the pool, 16/256-aligned (%d wrong)", n, bad);
}

/* ---------------------------------------------------------------- split */

/* S(n) from its definition: the fewest whole blocks whose sealing leaves
 * at most R tokens open (integer division, then one more block if a
 * remainder is left). */
static uint32_t split_def(uint32_t n, uint32_t B, uint32_t R)
{
	uint32_t k;

	if (n <= R)
		return 0;
	k = (n - R) / B;
	if (k * B < n - R)
		k++;
	return k * B;
}

static void test_split(void)
{
	static const uint32_t Bs[] = { 16, 32, 48, 256 };
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	int bad = 0, bad_open = 0, bad_mono = 0, bad_def = 0, n = 0;

	policy("int8", 1, &p);
	for (size_t bi = 0; bi < sizeof Bs / sizeof Bs[0]; bi++) {
		uint32_t B = Bs[bi];
		uint32_t Rs[] = { B, 4 * B, 64 * B };

		for (size_t ri = 0; ri < sizeof Rs / sizeof Rs[0]; ri++) {
			uint32_t R = Rs[ri], prev = 0;
			uint64_t dense = R + 20ull * B;

			lp = params(&p, 1, 64, B, 1, 1);
			lp.window = R;
			if (kvq_layout_new(&lp, &L, NULL, 0) != 0 || L->window != R) {
				bad++;
				continue;
			}
			for (uint64_t k = 0; k < dense + 100000; k++) {
				/* every n up to R + 20 blocks; then random n, half of
				 * them near 2^32 where n - R + B - 1 could wrap */
				uint32_t nt = k <= dense ? (uint32_t)k :
					      k % 2 ? UINT32_MAX - (uint32_t)(tap_rand() % 1000) : (uint32_t)tap_rand();
				uint32_t s = kvq_layout_split(L, nt);
				/* B * max(0, ceil((n - R) / B)) in double: exact for
				 * 32-bit integers */
				double want = nt <= R ? 0 : B * ceil(((double)nt - R) / B);

				n++;
				if ((double)s != want) {
					if (bad < 5)
						diag("B=%u R=%u n=%u: S=%u, want %.0f", B, R, nt, s, want);
					bad++;
				}
				/* the definition: whole blocks, at most R open, and one block
				 * fewer would leave more than R open */
				if (s % B || s > nt || nt - s > R || (s >= B && nt - (s - B) <= R) ||
				    split_def(nt, B, R) != s)
					bad_def++;
				/* once n > R, between R - B + 1 and R tokens stay open */
				if (nt > R && (nt - s < R - B + 1 || nt - s > R))
					bad_open++;
				if (k <= dense) {
					bad_mono += s < prev;
					prev = s;
				}
			}
			kvq_layout_free(L);
		}
	}
	ok(bad == 0, "S(n) = B*max(0, ceil((n-R)/B)) for %d (n, B, R) with R = B, 4B, 64B (%d wrong)", n, bad);
	ok(bad_def == 0, "S(n) is the fewest whole blocks leaving at most R tokens open (%d wrong)", bad_def);
	ok(bad_open == 0, "once n > R, n - S(n) lies in [R-B+1, R] (%d wrong)", bad_open);
	ok(bad_mono == 0, "S(n) never decreases as n grows (%d wrong)", bad_mono);
}

/* The default window: 4B when any layer uses KIVI for K or V, else B. */
static void test_window(void)
{
	static const struct {
		const char *pol;
		uint32_t layers, mult;
	} cases[] = {
		{ "int8", 4, 1 },
		{ "0-1:int8;2-:int4g32", 4, 1 },
		{ "f16", 1, 1 },
		{ "k=fp8,v=fp8e5m2", 2, 1 },
		{ "kivi4", 4, 4 },
		{ "kivi2", 1, 4 },
		{ "0-2:int8;3:kivi2", 4, 4 },
		{ "0:k=kivi4,v=int8;1-:int8", 4, 4 },
		{ "0-2:int8;3:k=f16,v=kivi2", 4, 4 },
	};
	int bad = 0;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		for (uint32_t B = 16; B <= 64; B += 16) {
			struct kvq_policy p;
			struct kvq_layout *L = NULL;
			struct kvq_layout_params lp;

			policy(cases[i].pol, cases[i].layers, &p);
			lp = params(&p, 2, 64, B, 1, 1);
			if (kvq_layout_new(&lp, &L, NULL, 0) != 0) {
				bad++;
				continue;
			}
			if (L->window != cases[i].mult * B || kvq_layout_default_window(&p, B) != cases[i].mult * B ||
			    kvq_layout_split(L, cases[i].mult * B) != 0 ||
			    kvq_layout_split(L, cases[i].mult * B + 1) != B) {
				if (bad < 5)
					diag("%s B=%u: window %u", cases[i].pol, B, L->window);
				bad++;
			}
			kvq_layout_free(L);
		}
	}
	ok(bad == 0, "default window is 4B when any layer's K or V uses kivi, else B (%d wrong)", bad);
}

/* -------------------------------------------------------------- rejects */

static void reject(const struct kvq_layout_params *lp, const char *what, const char *w1, const char *w2)
{
	struct kvq_layout *L = (struct kvq_layout *)(uintptr_t)0x1234;
	char err[256];
	int rc;

	memset(err, 0, sizeof err);
	rc = kvq_layout_new(lp, &L, err, sizeof err);
	ok(rc == -EINVAL && strstr(err, w1) && (!w2 || strstr(err, w2)) && L == (struct kvq_layout *)(uintptr_t)0x1234,
	   "rejects %s: rc %d, message '%s' names '%s'%s%s, *ret untouched", what, rc, err, w1, w2 ? " and " : "",
	   w2 ? w2 : "");
	if (rc == 0 && L != (struct kvq_layout *)(uintptr_t)0x1234)
		kvq_layout_free(L);
}

static void test_reject(void)
{
	struct kvq_policy p3, p_g128, p_vg128, p_kivi, p_bad;
	struct kvq_layout_params base, lp;
	struct kvq_layout *L = NULL;
	int rc;

	policy("int8", 3, &p3);
	policy("int4g128", 3, &p_g128);
	policy("0-1:int8;2:k=int8,v=int4g128", 3, &p_vg128);
	policy("kivi2", 3, &p_kivi);
	base = params(&p3, 4, 128, 32, 8, 4);

	lp = base;
	ok(kvq_layout_new(&lp, &L, NULL, 0) == 0, "the base geometry is accepted");
	if (L)
		kvq_layout_free(L);

	lp = base; lp.head_dim = 48;
	reject(&lp, "head dim 48", "head dim 48", NULL);
	lp = base; lp.head_dim = 16;
	reject(&lp, "head dim 16", "head dim 16", NULL);
	lp = base; lp.head_dim = 0;
	reject(&lp, "head dim 0", "head dim 0", NULL);
	lp = base; lp.head_dim = 288;
	reject(&lp, "head dim 288 (> 256)", "head dim 288", NULL);
	lp = base; lp.head_dim = 100;
	reject(&lp, "head dim 100", "head dim 100", NULL);
	lp = base; lp.block_tokens = 24;
	reject(&lp, "24 tokens per block", "24", "multiple of 16");
	lp = base; lp.block_tokens = 8;
	reject(&lp, "8 tokens per block", "8", "multiple of 16");
	lp = base; lp.block_tokens = 0;
	reject(&lp, "0 tokens per block", "0", "multiple of 16");
	lp = base; lp.block_tokens = 272;
	reject(&lp, "272 tokens per block (> 256)", "272", NULL);
	lp = base; lp.policy = &p_g128; lp.head_dim = 64;
	reject(&lp, "int4g128 with D=64", "int4g128", "64");
	lp = base; lp.policy = &p_vg128; lp.head_dim = 64;
	reject(&lp, "int4g128 for V of layer 2 with D=64", "layer 2", "int4g128");
	lp = base; lp.window = 48;
	reject(&lp, "window 48 with B=32", "window 48", NULL);
	lp = base; lp.window = 16;
	reject(&lp, "window 16 with B=32", "window 16", NULL);
	lp = base; lp.window = 65 * 32;
	reject(&lp, "a window of 65 blocks", "2080", NULL);
	lp = base; lp.window = 64 * 32;
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->window == 64 * 32, "a window of 64 blocks is accepted");
	if (rc == 0)
		kvq_layout_free(L);
	lp = base; lp.layers = 4;
	reject(&lp, "4 layers for a 3-layer policy", "layers 4", "policy's 3");
	lp = base; lp.layers = 2;
	reject(&lp, "2 layers for a 3-layer policy", "layers 2", "policy's 3");
	lp = base; lp.layers = 0;
	reject(&lp, "0 layers", "layers 0", NULL);
	lp = base; lp.kv_heads = 0;
	reject(&lp, "0 KV heads", "heads 0", NULL);
	lp = base; lp.kv_heads = KVQ_MAX_HEADS + 1;
	reject(&lp, "257 KV heads", "heads 257", NULL);
	lp = base; lp.act = KVQ_DT_F32;
	reject(&lp, "an f32 window", "dtype", NULL);
	lp = base; lp.act = 7;
	reject(&lp, "an unknown window dtype", "dtype", NULL);
	lp = base; lp.n_sealed = KVQ_MAX_SLOTS + 1;
	reject(&lp, "n_sealed > KVQ_MAX_SLOTS", "slot counts", "1073741825");
	lp = base; lp.n_open = KVQ_MAX_SLOTS + 1;
	reject(&lp, "n_open > KVQ_MAX_SLOTS", "slot counts", "1073741825");
	lp = base; lp.n_sealed = UINT32_MAX;
	reject(&lp, "n_sealed 2^32 - 1", "slot counts", NULL);
	lp = base; lp.sink_blocks = 1;
	reject(&lp, "sink blocks without sink slots", "sink_blocks 1", "0 sink slots");
	lp = base; lp.n_sink = 2;
	reject(&lp, "sink slots without sink blocks", "sink_blocks 0", "2 sink slots");
	lp = base; lp.sink_blocks = 2; lp.n_sink = 2;
	reject(&lp, "sink_blocks 2", "sink_blocks 2", NULL);
	lp = base; lp.policy = NULL;
	reject(&lp, "no policy", "policy", NULL);
	p_bad = p3;
	p_bad.v[1] = KVQ_FMT_COUNT;
	lp = base; lp.policy = &p_bad;
	reject(&lp, "a format value out of range in layer 1", "layer 1", "invalid format");

	/* the window default 4B with kivi is a multiple of B and accepted */
	lp = base; lp.policy = &p_kivi;
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc == 0 && L->window == 128, "kivi2 with window 0 gets 4B = 128");
	if (rc == 0)
		kvq_layout_free(L);
	/* err may be NULL */
	lp = base; lp.head_dim = 48;
	ok(kvq_layout_new(&lp, &L, NULL, 0) == -EINVAL, "a rejection with err NULL returns -EINVAL");
}

/* --------------------------------------------------------- large pools */

static void test_large(void)
{
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	uint64_t end_s, end_o;
	int rc;

	/*
	 * 80 layers, H=8, D=128, B=32, int8, 2^20 sealed + 4096 open slots.
	 * sealed slice 8 x 8320 = 66560, x 2^20 = 69793218560; open slice
	 * 8 x 16384 = 131072, x 4096 = 536870912; a layer 70330089472 (a
	 * multiple of 256); the pool 80 x that = 5626407157760 bytes (5240 GiB).
	 */
	policy("int8", 80, &p);
	lp = params(&p, 8, 128, 32, 1u << 20, 4096);
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	if (rc != 0) {
		ok(0, "a 5240 GiB pool is accepted (rc %d)", rc);
		return;
	}
	ok(L->total_bytes == 5626407157760ull && L->layer[79].region == 79ull * 70330089472ull &&
	   L->sealed_block_bytes == 80ull * 66560,
	   "80 layers x 2^20 sealed slots: %llu bytes (want 5626407157760), layer 79 at %llu",
	   (unsigned long long)L->total_bytes, (unsigned long long)L->layer[79].region);
	/* the last sealed and open fields end inside the pool, far beyond 4 GiB */
	end_s = kvq_layout_off(L, KVQ_SEALED, (1u << 20) - 1, 79, 7, KVQ_V_PARAMS) + L->layer[79].size[KVQ_V_PARAMS];
	end_o = kvq_layout_off(L, KVQ_OPEN, 4095, 79, 7, KVQ_V_CODES) + 32 * 128 * 2;
	ok(end_s == 79ull * 70330089472ull + 69793218560ull && end_o == L->total_bytes && end_s > (1ull << 32),
	   "offsets of the last slots are 64-bit: sealed ends at %llu, open at %llu",
	   (unsigned long long)end_s, (unsigned long long)end_o);
	kvq_layout_free(L);
}

/*
 * A pool whose size does not fit in 64 bits must be refused, not wrapped:
 * 256 layers, H=256, D=256, B=256, f16, 2^30 sealed slots (all limits).
 * Head slice 2 x 256 x 256 x 2 = 2^18, slice 2^26, a layer's sealed part
 * 2^56, the pool 2^64 plus the open slots.  With one open slot (2^26 per
 * layer) the sum wraps to 256 x 2^26 = 2^34 = 16 GiB: a pool that could be
 * allocated, with offsets up to 2^64 beyond it.
 */
static void test_overflow(void)
{
	struct kvq_policy p;
	struct kvq_layout *L = NULL;
	struct kvq_layout_params lp;
	char err[256] = "";
	int rc;

	policy("f16", KVQ_MAX_LAYERS, &p);
	lp = params(&p, KVQ_MAX_HEADS, KVQ_MAX_HEAD_DIM, KVQ_MAX_BLOCK_TOKENS, KVQ_MAX_SLOTS, 1);
	rc = kvq_layout_new(&lp, &L, err, sizeof err);
	if (rc == 0) {
		uint64_t last = kvq_layout_off(L, KVQ_OPEN, 0, KVQ_MAX_LAYERS - 1, 0, KVQ_V_CODES);
		diag("accepted: total_bytes %llu, last layer's open V rows at %llu",
		     (unsigned long long)L->total_bytes, (unsigned long long)last);
		kvq_layout_free(L);
	}
	ok(rc < 0 && err[0], "a pool of 2^64 + 2^34 bytes is rejected, not wrapped (rc %d, '%s')", rc, err);

	/* 2^30 sealed + 2^29 open slots: 1.5 x 2^64, would wrap to 2^63 */
	lp.n_open = KVQ_MAX_SLOTS / 2;
	L = NULL;
	err[0] = '\0';
	rc = kvq_layout_new(&lp, &L, err, sizeof err);
	if (rc == 0)
		kvq_layout_free(L);
	ok(rc < 0 && err[0], "a pool of 1.5 x 2^64 bytes is rejected (rc %d, '%s')", rc, err);

	/* just below: 255 layers of 2^56 + 2^26 bytes fit in 64 bits */
	policy("f16", KVQ_MAX_LAYERS - 1, &p);
	lp = params(&p, KVQ_MAX_HEADS, KVQ_MAX_HEAD_DIM, KVQ_MAX_BLOCK_TOKENS, KVQ_MAX_SLOTS, 1);
	L = NULL;
	rc = kvq_layout_new(&lp, &L, NULL, 0);
	ok(rc != 0 || L->total_bytes == 255ull * ((1ull << 56) + (1ull << 26)),
	   "a pool of 255 x (2^56 + 2^26) bytes is refused or sized exactly");
	if (rc == 0)
		kvq_layout_free(L);
}

int main(void)
{
	tap_seed();
	test_hand_sizes();
	test_hand_regions();
	test_all_formats();
	test_ratios();
	test_byte_map();
	test_split();
	test_window();
	test_reject();
	test_large();
	test_overflow();
	return done_testing();
}
