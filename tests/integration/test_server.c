/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Integration test: the real kvqd (host backend, a temporary socket) and
 * forked client processes speaking the protocol through proto/frame.h.
 * Clients report into shared memory; the parent prints the TAP lines.
 *
 * KVQ_TEST_KVQD names the kvqd binary (default $top_builddir/daemon/kvqd).
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "cpu/cpu.h"
#include "figure.h"
#include "frame.h"
#include "frame_io.h"
#include "kvq.h"
#include "layout.h"

#define L_ 2
#define H_ 2
#define D_ 32
#define B_ 16
#define NTOK 48            /* 2 sealed blocks + the open window */
#define N_SEALED 16
#define N_OPEN 4
#define POOL "itest"
#define MODEL "test/model@1"
#define TIMEOUT_MS 5000

static char sock_path[108];
static char tmpdir[64];
static char daemon_bin[512];

/* What the clients report back. */
struct shared {
	uint32_t a_ids[2];
	uint32_t a_open;
	float a_out[H_ * D_];
	uint8_t a_bytes[L_][2][4096];
	size_t slice_bytes;
	int a_fd_ok, a_layout_ok, a_publish_ok, a_attn_done;
	int b_lookup_ok, b_bytes_ok, b_attn_ok, b_salt_ok, b_fork_ok;
	int c_dedup_ok, c_stats_ok, c_release_ok;
	int d_errors, d_unchanged, d_order_ok;
	int e_nospc, e_unchanged, e_still_cached;
};

static struct shared *sh;

struct cli {
	int fd;
	int pool_fd;
	struct kvq_frame_decoder dec;
	uint64_t next_id;
	struct kvq_layout *L;
	struct kvq_policy pol;
	void *base;
	size_t map_bytes;
};

static uint16_t kbuf[NTOK][H_][D_], vbuf[NTOK][H_][D_];
static float qbuf[H_][D_];
static uint32_t tokens[NTOK];

static void make_data(void)
{
	for (int t = 0; t < NTOK; t++) {
		tokens[t] = 1000 + (uint32_t)t * 7;
		for (int h = 0; h < H_; h++)
			for (int d = 0; d < D_; d++) {
				kbuf[t][h][d] = kvq_f16_from_f32((float)tap_normal());
				vbuf[t][h][d] = kvq_f16_from_f32((float)tap_normal());
			}
	}
	for (int h = 0; h < H_; h++)
		for (int d = 0; d < D_; d++)
			qbuf[h][d] = (float)tap_normal();
}

static int cli_connect(struct cli *c)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	memset(c, 0, sizeof(*c));
	c->pool_fd = -1;
	kvq_frame_decoder_init(&c->dec);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	memcpy(a.sun_path, sock_path, strlen(sock_path));
	if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int r = -errno;
		close(c->fd);
		c->fd = -1;
		return r;
	}
	return 0;
}

static void cli_close(struct cli *c)
{
	if (c->base)
		munmap(c->base, c->map_bytes);
	if (c->pool_fd >= 0)
		close(c->pool_fd);
	if (c->fd >= 0)
		close(c->fd);
	kvq_layout_free(c->L);
	kvq_frame_decoder_fini(&c->dec);
	memset(c, 0, sizeof(*c));
	c->fd = c->pool_fd = -1;
}

/* One request, one reply: returns the reply's status (or a transport error
 * below -2000) and *ret (free it) when ret is not NULL. */
static int rpc(struct cli *c, Kvq__Envelope *req, Kvq__Envelope **ret)
{
	Kvq__Envelope *rep = NULL;
	int r, st;

	req->id = ++c->next_id;
	r = kvq_frame_send_envelope(c->fd, req, -1, TIMEOUT_MS);
	if (r < 0)
		return r - 2000;
	r = kvq_frame_recv_envelope(c->fd, &c->dec, &c->pool_fd, TIMEOUT_MS, &rep);
	if (r < 0)
		return r - 2000;
	if (rep->id != req->id) {
		kvq_frame_envelope_free(rep);
		return -3000;
	}
	st = rep->status;
	if (ret)
		*ret = rep;
	else
		kvq_frame_envelope_free(rep);
	return st;
}

static int hello(struct cli *c, uint32_t version)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Hello h = KVQ__HELLO__INIT;

	h.protocol_version = version;
	h.client_name = "itest";
	e.body_case = KVQ__ENVELOPE__BODY_HELLO;
	e.hello = &h;
	return rpc(c, &e, NULL);
}

/* Attaches (with create: creating the pool when needed) and maps the pool. */
static int attach_ex(struct cli *c, const char *pool, const char *model, uint32_t head_dim, const char *policy,
		     uint32_t layout_version, bool create)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	struct kvq_layout_params p;
	const Kvq__AttachReply *ar;
	int r;

	a.pool = (char *)pool;
	a.model_id = (char *)model;
	a.layers = L_;
	a.kv_heads = H_;
	a.head_dim = head_dim;
	a.block_tokens = B_;
	a.policy = (char *)policy;
	a.act = KVQ__DTYPE__DTYPE_F16;
	a.layout_version = layout_version;
	pc.n_sealed = N_SEALED;
	pc.n_open = N_OPEN;
	pc.backend = "";
	pc.device = -1;
	a.create = create ? &pc : NULL;
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = rpc(c, &e, &rep);
	if (r)
		goto out;
	ar = rep->attach_reply;
	if (!ar || c->pool_fd < 0 || ar->map_bytes < ar->total_bytes) {
		r = -4000;
		goto out;
	}
	if (kvq_policy_parse(ar->policy, ar->layers, &c->pol, NULL, 0) < 0) {
		r = -4001;
		goto out;
	}
	p = (struct kvq_layout_params){ .layers = ar->layers, .kv_heads = ar->kv_heads, .head_dim = ar->head_dim,
		.block_tokens = ar->block_tokens, .window = ar->window, .n_sealed = ar->n_sealed,
		.n_open = ar->n_open, .act = (int)ar->act, .policy = &c->pol };
	if (kvq_layout_new(&p, &c->L, NULL, 0) < 0 || c->L->total_bytes != ar->total_bytes) {
		r = -4002;
		goto out;
	}
	c->map_bytes = ar->map_bytes;
	c->base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->pool_fd, 0);
	if (c->base == MAP_FAILED) {
		c->base = NULL;
		r = -4003;
	}
out:
	kvq_frame_envelope_free(rep);
	return r;
}

static int attach(struct cli *c)
{
	return attach_ex(c, POOL, MODEL, D_, "int8", KVQ_LAYOUT_VERSION, true);
}

/* Each mismatch on its own connection (a failed attach leaves it usable,
 * but one per connection keeps the cases apart). */
static int attach_mismatch(const char *pool, const char *model, uint32_t head_dim, const char *policy,
			   uint32_t layout_version, bool create)
{
	struct cli c;
	int r = -9999;

	if (cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0)
		r = attach_ex(&c, pool, model, head_dim, policy, layout_version, create);
	cli_close(&c);
	return r;
}

static void test_attach_errors(void)
{
	int r;

	r = attach_mismatch(POOL, "other/model@2", D_, "int8", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_ELAYOUT, "attach: another model id: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch(POOL, MODEL, 64, "int8", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_ELAYOUT, "attach: another head dim: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "fp8", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_ELAYOUT, "attach: another policy: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "0:int8;1:int8", KVQ_LAYOUT_VERSION, true);
	ok(r == 0, "attach: the same policy in another form is accepted (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "int8+rot", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_ELAYOUT, "attach: the same formats rotated (+rot) are another policy: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "k=int8,v=int8+rot", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_ELAYOUT, "attach: V alone rotated is another policy too: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "int8+rat", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_EPOLICY, "attach: a suffix other than +rot: KVQ_EPOLICY (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "int7", KVQ_LAYOUT_VERSION, true);
	ok(r == KVQ_EPOLICY, "attach: a policy that does not parse: KVQ_EPOLICY (%d)", r);
	r = attach_mismatch(POOL, MODEL, D_, "int8", KVQ_LAYOUT_VERSION + 1, true);
	ok(r == KVQ_ELAYOUT, "attach: another layout version: KVQ_ELAYOUT (%d)", r);
	r = attach_mismatch("nosuchpool", MODEL, D_, "int8", KVQ_LAYOUT_VERSION, false);
	ok(r == -ENOENT, "attach: an unknown pool without create: -ENOENT (%d)", r);
}

static int alloc(struct cli *c, uint32_t n_open, uint32_t n_sealed, uint32_t *open, uint32_t *resv, uint32_t *sealed)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	int r;

	a.n_open = n_open;
	a.n_sealed = n_sealed;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	r = rpc(c, &e, &rep);
	if (r == 0) {
		for (uint32_t i = 0; i < n_open; i++) {
			open[i] = rep->alloc_reply->open_ids[i];
			resv[i] = rep->alloc_reply->reserved_ids[i];
		}
		for (uint32_t i = 0; i < n_sealed; i++)
			sealed[i] = rep->alloc_reply->sealed_ids[i];
	}
	kvq_frame_envelope_free(rep);
	return r;
}

static int seal(struct cli *c, uint32_t n, uint32_t *open, uint32_t *sealed)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Seal s = KVQ__SEAL__INIT;

	s.n_open_ids = s.n_sealed_ids = n;
	s.open_ids = open;
	s.sealed_ids = sealed;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &s;
	return rpc(c, &e, NULL);
}

/* Publishes ids[0..n) as a chain over tokens from the start. */
static int publish(struct cli *c, uint32_t n, const uint32_t *ids, uint32_t *ret_ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Publish p = KVQ__PUBLISH__INIT;
	Kvq__PublishBlock b[4], *bp[4];
	int r;

	for (uint32_t i = 0; i < n; i++) {
		kvq__publish_block__init(&b[i]);
		b[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
		b[i].sealed_id = ids[i];
		if (i) {
			b[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			b[i].parent_id = ids[i - 1];
		}
		b[i].n_tokens = B_;
		b[i].tokens = tokens + i * B_;
		bp[i] = &b[i];
	}
	p.n_blocks = n;
	p.blocks = bp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &p;
	r = rpc(c, &e, &rep);
	if (r == 0)
		for (uint32_t i = 0; i < n; i++)
			ret_ids[i] = rep->publish_reply->ids[i];
	kvq_frame_envelope_free(rep);
	return r;
}

static int lookup(struct cli *c, const char *salt, uint32_t *ret_ids, uint32_t *ret_n)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Lookup l = KVQ__LOOKUP__INIT;
	int r;

	l.n_tokens = NTOK;
	l.tokens = tokens;
	l.max_tokens = 32;   /* S(48) with R = 16 */
	if (salt) {
		l.salt.data = (uint8_t *)salt;
		l.salt.len = strlen(salt);
	}
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &l;
	r = rpc(c, &e, &rep);
	if (r == 0) {
		*ret_n = (uint32_t)rep->lookup_reply->n_sealed_ids;
		for (size_t i = 0; i < rep->lookup_reply->n_sealed_ids && i < 4; i++)
			ret_ids[i] = rep->lookup_reply->sealed_ids[i];
	}
	kvq_frame_envelope_free(rep);
	return r;
}

static int release(struct cli *c, uint32_t ns, uint32_t *sealed, uint32_t no, uint32_t *open)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Release rl = KVQ__RELEASE__INIT;

	rl.n_sealed_ids = ns;
	rl.sealed_ids = sealed;
	rl.n_open_ids = no;
	rl.open_ids = open;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &rl;
	return rpc(c, &e, NULL);
}

static int fork_ids(struct cli *c, uint32_t n, uint32_t *ids)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	Kvq__Fork f = KVQ__FORK__INIT;

	f.n_sealed_ids = n;
	f.sealed_ids = ids;
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &f;
	return rpc(c, &e, NULL);
}

/* Counters of the test pool (the fields compared for "nothing changed"). */
struct pstat {
	uint32_t sealed_free, sealed_reserved, sealed_held, cached, referenced, open_used, clients;
	uint64_t alloc_failures, evictions;
};

static int stats(struct cli *c, struct pstat *ps)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	int r;

	s.pool = POOL;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = rpc(c, &e, &rep);
	if (r == 0) {
		const Kvq__PoolStats *p;

		if (rep->stats_reply->n_pools != 1) {
			kvq_frame_envelope_free(rep);
			return -5000;
		}
		p = rep->stats_reply->pools[0];
		/* the pool's figures by name (kvq.proto PoolStats.figures) */
#define FIG(name) (uint32_t)kvq_figure_or_0(p, #name)
		*ps = (struct pstat){ FIG(sealed_free), FIG(sealed_reserved), FIG(sealed_held), FIG(cached),
				      FIG(referenced), FIG(open_used), FIG(clients),
				      kvq_figure_or_0(p, "alloc_failures"), kvq_figure_or_0(p, "evictions") };
#undef FIG
	}
	kvq_frame_envelope_free(rep);
	return r;
}

static bool pstat_same(const struct pstat *a, const struct pstat *b, bool but_failures)
{
	return a->sealed_free == b->sealed_free && a->sealed_reserved == b->sealed_reserved &&
	       a->sealed_held == b->sealed_held && a->cached == b->cached && a->referenced == b->referenced &&
	       a->open_used == b->open_used && a->evictions == b->evictions &&
	       (but_failures || a->alloc_failures == b->alloc_failures);
}

static int open_session(struct cli *c)
{
	if (cli_connect(c) < 0 || hello(c, KVQ_PROTOCOL_VERSION) != 0 || attach(c) != 0)
		return -1;
	return 0;
}

static int write_layers(struct cli *c, const struct kvq_seq_table *w, int first_token)
{
	for (uint32_t l = 0; l < L_; l++)
		if (kvq_cpu_write(c->L, c->base, l, w, kbuf[first_token], vbuf[first_token]) < 0)
			return -1;
	return 0;
}

static int attend(struct cli *c, const int32_t *sealed, const int32_t *open, float *out)
{
	struct kvq_attn a = { .L = c->L, .base = c->base, .layer = 1, .q_heads = H_, .scale = 0.17677669f,
			      .q_dtype = KVQ_DT_F32, .out_dtype = KVQ_DT_F32 };
	struct kvq_seq_table s = { .n = NTOK, .m = 1, .sealed = sealed, .open = open };

	return kvq_cpu_attention(&a, &s, 1, qbuf, out);
}

static const uint8_t *slice(const struct cli *c, uint32_t layer, uint32_t id)
{
	const struct kvq_layer_layout *ll = &c->L->layer[layer];

	return (const uint8_t *)c->base + ll->region + (uint64_t)id * ll->sealed_slice;
}

/* ---------------------------------------------------------------- clients */

static int client_a(void)
{
	struct cli c;
	uint32_t o[3], r[3], got[2];
	int32_t sealed[2], open[3];
	struct kvq_seq_table w;
	struct pstat ps;

	if (cli_connect(&c) < 0 || hello(&c, KVQ_PROTOCOL_VERSION) != 0)
		return 1;
	if (attach(&c) != 0)
		return 2;
	sh->a_fd_ok = c.pool_fd >= 0;
	sh->a_layout_ok = c.L->n_sealed == N_SEALED && c.L->n_open == N_OPEN && c.L->window == B_;
	if (alloc(&c, 3, 0, o, r, NULL) != 0)
		return 3;
	sealed[0] = (int32_t)r[0];
	sealed[1] = (int32_t)r[1];
	open[0] = open[1] = -1;
	open[2] = (int32_t)o[2];
	w = (struct kvq_seq_table){ .n = 0, .m = NTOK, .sealed = sealed, .open = open };
	if (write_layers(&c, &w, 0) < 0)
		return 4;
	if (seal(&c, 2, o, r) != 0)
		return 5;
	if (publish(&c, 2, r, got) != 0)
		return 6;
	sh->a_publish_ok = got[0] == r[0] && got[1] == r[1] && stats(&c, &ps) == 0 && ps.cached == 2;
	sh->a_ids[0] = r[0];
	sh->a_ids[1] = r[1];
	if (attend(&c, sealed, open + 2, sh->a_out) < 0)
		return 7;
	sh->a_attn_done = 1;
	sh->slice_bytes = c.L->layer[0].sealed_slice;
	if (sh->slice_bytes > sizeof(sh->a_bytes[0][0]))
		return 8;
	for (uint32_t l = 0; l < L_; l++)
		for (int i = 0; i < 2; i++)
			memcpy(sh->a_bytes[l][i], slice(&c, l, r[i]), sh->slice_bytes);
	cli_close(&c);
	return 0;
}

static int client_b(void)
{
	struct cli c;
	uint32_t ids[4] = { 0 }, n = 0, o, resv;
	int32_t sealed[2], open[1];
	struct kvq_seq_table w;
	float out[H_ * D_];

	if (open_session(&c) < 0)
		return 1;
	if (lookup(&c, NULL, ids, &n) != 0)
		return 2;
	sh->b_lookup_ok = n == 2 && ids[0] == sh->a_ids[0] && ids[1] == sh->a_ids[1];
	if (!sh->b_lookup_ok)
		return 3;
	sh->b_bytes_ok = 1;
	for (uint32_t l = 0; l < L_; l++)
		for (int i = 0; i < 2; i++)
			if (memcmp(sh->a_bytes[l][i], slice(&c, l, ids[i]), sh->slice_bytes))
				sh->b_bytes_ok = 0;
	/* the open window is this worker's own: tokens 32..47 into its own slot */
	if (alloc(&c, 1, 0, &o, &resv, NULL) != 0)
		return 4;
	open[0] = (int32_t)o;
	w = (struct kvq_seq_table){ .n = 0, .m = B_, .sealed = NULL, .open = open };
	if (write_layers(&c, &w, 32) < 0)
		return 5;
	sealed[0] = (int32_t)ids[0];
	sealed[1] = (int32_t)ids[1];
	if (attend(&c, sealed, open, out) < 0)
		return 6;
	sh->b_attn_ok = !memcmp(out, sh->a_out, sizeof(out));
	n = 99;
	sh->b_salt_ok = lookup(&c, "tenant-2", ids, &n) == 0 && n == 0;
	/* Fork adds one hold per id: two releases each succeed, a third is refused */
	ids[0] = sh->a_ids[0];
	ids[1] = sh->a_ids[1];
	sh->b_fork_ok = fork_ids(&c, 2, ids) == 0 && release(&c, 2, ids, 0, NULL) == 0 &&
			release(&c, 2, ids, 0, NULL) == 0 && release(&c, 1, ids, 0, NULL) == -EINVAL;
	cli_close(&c);
	return 0;
}

static int client_c(void)
{
	struct cli c;
	uint32_t o, resv, s[2], got[2];
	int32_t sealed[2], open[3];
	struct kvq_seq_table w;
	struct pstat ps;

	if (open_session(&c) < 0)
		return 1;
	if (alloc(&c, 1, 2, &o, &resv, s) != 0)
		return 2;
	sealed[0] = (int32_t)s[0];
	sealed[1] = (int32_t)s[1];
	open[0] = open[1] = -1;
	open[2] = (int32_t)o;
	w = (struct kvq_seq_table){ .n = 0, .m = NTOK, .sealed = sealed, .open = open };
	if (write_layers(&c, &w, 0) < 0)
		return 3;
	if (publish(&c, 2, s, got) != 0)
		return 4;
	sh->c_dedup_ok = got[0] == sh->a_ids[0] && got[1] == sh->a_ids[1];
	/* the duplicates are gone: two cached blocks, none held unpublished */
	sh->c_stats_ok = stats(&c, &ps) == 0 && ps.cached == 2 && ps.sealed_held == 0;
	/* the caller's holds moved to the cached blocks; its own ids are no longer held */
	sh->c_release_ok = release(&c, 2, s, 0, NULL) == -EINVAL && release(&c, 2, got, 1, &o) == 0;
	cli_close(&c);
	return 0;
}

static int client_d(void)
{
	struct cli c;
	struct pstat before, after;
	uint32_t a0 = sh->a_ids[0], zero = 0, got;
	int errors = 0;

	if (cli_connect(&c) < 0)
		return 1;
	/* order: before Hello, before Attach */
	{
		uint32_t o, r;

		sh->d_order_ok = alloc(&c, 1, 0, &o, &r, NULL) == -EPROTO && hello(&c, KVQ_PROTOCOL_VERSION) == 0 &&
				 alloc(&c, 1, 0, &o, &r, NULL) == -EPROTO && attach(&c) == 0;
	}
	if (stats(&c, &before) != 0)
		return 2;
	errors += release(&c, 1, &a0, 0, NULL) == -EINVAL;
	errors += release(&c, 0, NULL, 1, &zero) == -EINVAL;
	errors += fork_ids(&c, 1, &a0) == -EINVAL;
	errors += publish(&c, 1, &a0, &got) == -EINVAL;
	errors += seal(&c, 1, &zero, &a0) == -EINVAL;
	errors += release(&c, 1, &(uint32_t){ N_SEALED + 5 }, 0, NULL) == -EINVAL;
	sh->d_errors = errors;
	sh->d_unchanged = stats(&c, &after) == 0 && pstat_same(&before, &after, false);
	cli_close(&c);
	return 0;
}

static uint64_t fnv(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static int client_e(void)
{
	struct cli c;
	struct pstat before, after;
	static uint32_t o[N_OPEN + 1], r[N_OPEN + 1], s[N_SEALED + 1];
	uint32_t ids[4], n = 0;
	uint64_t h0, h1;

	if (open_session(&c) < 0)
		return 1;
	if (stats(&c, &before) != 0)
		return 2;
	h0 = fnv(c.base, c.L->total_bytes);
	sh->e_nospc = alloc(&c, 0, N_SEALED + 1, o, r, s) == -ENOSPC && alloc(&c, N_OPEN + 1, 0, o, r, s) == -ENOSPC &&
		      alloc(&c, 1, N_SEALED, o, r, s) == -ENOSPC;
	h1 = fnv(c.base, c.L->total_bytes);
	sh->e_unchanged = h0 == h1 && stats(&c, &after) == 0 && pstat_same(&before, &after, true) &&
			  after.alloc_failures == before.alloc_failures + 3;
	sh->e_still_cached = lookup(&c, NULL, ids, &n) == 0 && n == 2;
	cli_close(&c);
	return 0;
}

/* Holds blocks, tells the parent, waits to be killed. */
static int client_k(int wfd)
{
	struct cli c;
	uint32_t o, r, s[3];

	if (open_session(&c) < 0 || alloc(&c, 1, 3, &o, &r, s) != 0)
		return 1;
	if (write(wfd, "x", 1) != 1)
		return 2;
	for (;;)
		pause();
}

static int run_child(int (*fn)(void))
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0)
		_exit(fn());
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

/* ---------------------------------------------------------------- the daemon */

static pid_t start_daemon(void)
{
	return test_daemon_start("host", "itest", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				 sizeof(daemon_bin));
}

/* Sends raw bytes on a new connection; returns 1 when the daemon closed it
 * (end of stream) within the timeout, 0 when a reply came, -1 otherwise;
 * *ret_status gets a reply's status. */
static int raw_exchange(const void *buf, size_t len, bool close_after, int *ret_status)
{
	struct cli c;
	Kvq__Envelope *rep = NULL;
	int r;

	if (cli_connect(&c) < 0)
		return -1;
	if (write(c.fd, buf, len) != (ssize_t)len) {
		cli_close(&c);
		return -1;
	}
	if (close_after) {
		cli_close(&c);
		return 1;
	}
	r = kvq_frame_recv_envelope(c.fd, &c.dec, NULL, TIMEOUT_MS, &rep);
	if (r == 0) {
		*ret_status = rep->status;
		kvq_frame_envelope_free(rep);
		r = 0;
	} else {
		r = r == -ECONNRESET ? 1 : -1;
	}
	cli_close(&c);
	return r;
}

static void test_bad_frames(void)
{
	uint8_t buf[64];
	int st = 0, r;
	struct cli c;

	/* an envelope that does not parse: answered, id 0, -EBADMSG */
	memcpy(buf, (uint32_t[]){ 6 }, 4);
	memset(buf + 4, 0xff, 6);
	r = raw_exchange(buf, 10, false, &st);
	ok(r == 0 && st == -EBADMSG, "garbage envelope: -EBADMSG reply (r %d, status %d)", r, st);
	/* length 0 and an oversized length: framing faults, closed without a reply */
	memset(buf, 0, 8);
	ok(raw_exchange(buf, 4, false, &st) == 1, "zero-length frame: connection closed");
	memcpy(buf, (uint32_t[]){ KVQ_FRAME_MAX + 1 }, 4);
	ok(raw_exchange(buf, 8, false, &st) == 1, "oversized frame: connection closed");
	/* a truncated frame, then the client goes away */
	memcpy(buf, (uint32_t[]){ 100 }, 4);
	memset(buf + 4, 0x08, 10);
	ok(raw_exchange(buf, 14, true, &st) == 1, "truncated frame sent and closed");
	/* a reply type sent as a request */
	{
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		Kvq__SealReply sr = KVQ__SEAL_REPLY__INIT;

		r = cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0;
		e.body_case = KVQ__ENVELOPE__BODY_SEAL_REPLY;
		e.seal_reply = &sr;
		ok(r && rpc(&c, &e, NULL) == -EOPNOTSUPP, "a reply type as a request: -EOPNOTSUPP");
		cli_close(&c);
	}
	/* another protocol version: -EPROTONOSUPPORT, then closed */
	{
		Kvq__Envelope *rep = NULL;

		r = cli_connect(&c) == 0 ? hello(&c, KVQ_PROTOCOL_VERSION + 1) : -1;
		ok(r == -EPROTONOSUPPORT &&
		   kvq_frame_recv_envelope(c.fd, &c.dec, NULL, TIMEOUT_MS, &rep) == -ECONNRESET,
		   "hello with another protocol version: -EPROTONOSUPPORT and closed (%d)", r);
		kvq_frame_envelope_free(rep);
		cli_close(&c);
	}
	/* others are still served */
	{
		struct pstat ps;

		r = cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0 && stats(&c, &ps) == 0;
		ok(r, "daemon still serves after bad frames");
		cli_close(&c);
	}
}

static void test_kill9(void)
{
	struct cli mon;
	struct pstat base, held, now;
	int pfd[2];
	pid_t pid;
	char x;
	bool back = false;

	if (cli_connect(&mon) < 0 || hello(&mon, KVQ_PROTOCOL_VERSION) != 0 || stats(&mon, &base) != 0 ||
	    pipe(pfd) < 0) {
		ok(0, "kill -9: setup");
		return;
	}
	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		_exit(client_k(pfd[1]));
	}
	close(pfd[1]);
	if (read(pfd[0], &x, 1) != 1) {
		ok(0, "kill -9: client did not allocate");
		close(pfd[0]);
		return;
	}
	close(pfd[0]);
	ok(stats(&mon, &held) == 0 && held.sealed_held == base.sealed_held + 3 && held.open_used == base.open_used + 1,
	   "kill -9: the client holds 3 sealed + 1 open slots");
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	for (int i = 0; i < 200 && !back; i++) {
		if (stats(&mon, &now) == 0 && now.sealed_held == base.sealed_held && now.open_used == base.open_used &&
		    now.sealed_free == base.sealed_free)
			back = true;
		else
			usleep(10000);
	}
	ok(back, "kill -9: its blocks returned to the pool (Stats)");
	cli_close(&mon);
}

/* The configured pool of test_activation_and_reload: 40 KiB per uid, a
 * sealed block of this geometry takes 4352 bytes, so 9 fit. */
static void test_quota(void)
{
	struct cli c1, c2;
	uint32_t s[16], o, r;
	int r1, r2, r3, r4;

	if (open_session(&c1) < 0 || open_session(&c2) < 0) {
		ok(0, "quota: two sessions");
		return;
	}
	ok(c1.L->sealed_block_bytes == 4352, "quota: a sealed block is %llu bytes",
	   (unsigned long long)c1.L->sealed_block_bytes);
	r1 = alloc(&c1, 0, 5, NULL, NULL, s);
	r2 = alloc(&c2, 0, 5, NULL, NULL, s);
	r3 = alloc(&c2, 0, 4, NULL, NULL, s);
	ok(r1 == 0 && r2 == -EDQUOT && r3 == 0,
	   "quota: counted per uid across connections (5 ok, 5 more -EDQUOT, 4 ok: %d %d %d)", r1, r2, r3);
	r4 = alloc(&c2, 1, 0, &o, &r, NULL);
	ok(r4 == -EDQUOT, "quota: an open slot's reservation counts (%d)", r4);
	cli_close(&c1);
	/* c1's lease goes at disconnect; poll until c2 may take its share */
	for (int i = 0; i < 200 && (r4 = alloc(&c2, 0, 5, NULL, NULL, s)) == -EDQUOT; i++)
		usleep(10000);
	ok(r4 == 0, "quota: freed when the other connection closes (%d)", r4);
	cli_close(&c2);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

/*
 * A second kvqd on a config with a [pool] section: socket activation
 * (LISTEN_FDS=1, LISTEN_PID, the listening socket on fd 3) where libsystemd
 * is built in, else a plain --socket; then SIGHUP: the configured pool
 * refuses us until the reloaded file lists our uid; then its quota.
 */
static void test_activation_and_reload(const char *bin)
{
	char conf[160], text[512];
	const char *pool_fmt = "[kvqd]\nbackend = host\nmemory_budget = 64M\nlog_level = warning\n"
			       "[pool " POOL "]\nmodel = " MODEL "\nlayers = 2\nkv_heads = 2\nhead_dim = 32\n"
			       "block_tokens = 16\npolicy = int8\ncapacity = 1M\nacl_uids = %u\nquota_per_uid = 40K\n";
	struct cli c;
	pid_t pid;
	int lfd = -1, st, r = 0;
	bool allowed = false;

	snprintf(conf, sizeof(conf), "%s/act.conf", tmpdir);
	snprintf(sock_path, sizeof(sock_path), "%s/act.sock", tmpdir);
	snprintf(text, sizeof(text), pool_fmt, (unsigned)getuid() + 12345u);
	write_file(conf, text);
#ifdef HAVE_SYSTEMD
	{
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		memcpy(a.sun_path, sock_path, strlen(sock_path));
		lfd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 16) < 0) {
			ok(0, "socket activation: listening socket");
			return;
		}
	}
#endif
	pid = fork();
	if (pid == 0) {
		char n[32];

		if (lfd < 0) {
			execl(bin, bin, "--config", conf, "--socket", sock_path, "--backend", "host", "--foreground",
			      (char *)NULL);
			_exit(127);
		}
		if (lfd != 3 && (dup2(lfd, 3) < 0 || close(lfd) < 0))
			_exit(126);
		snprintf(n, sizeof(n), "%d", (int)getpid());
		setenv("LISTEN_PID", n, 1);
		setenv("LISTEN_FDS", "1", 1);
		execl(bin, bin, "--config", conf, "--backend", "host", "--foreground", (char *)NULL);
		_exit(127);
	}
	if (lfd >= 0) {
		close(lfd);
		r = cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0;
		ok(r, "socket activation: kvqd serves the socket passed as fd 3");
	} else {
		ok(1, "socket activation # SKIP built without libsystemd");
		for (int i = 0; i < 500 && !r; i++) {
			r = cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0;
			if (!r) {
				cli_close(&c);
				usleep(10000);
			}
		}
	}
	r = r ? attach(&c) : -1;
	ok(r == -EEXIST, "configured pool its ACL hides from our uid: an attach that would create it says only "
	   "that the name is taken (%d)", r);
	cli_close(&c);
	snprintf(text, sizeof(text), pool_fmt, (unsigned)getuid());
	write_file(conf, text);
	kill(pid, SIGHUP);
	/* the reload is asynchronous: retry briefly */
	for (int i = 0; i < 200 && !allowed; i++) {
		allowed = cli_connect(&c) == 0 && hello(&c, KVQ_PROTOCOL_VERSION) == 0 && attach(&c) == 0;
		cli_close(&c);
		if (!allowed)
			usleep(10000);
	}
	ok(allowed, "SIGHUP: the reloaded ACL admits our uid");
	test_quota();
	kill(pid, SIGTERM);
	r = waitpid(pid, &st, 0);
	ok(r == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "second kvqd: SIGTERM, exit status 0");
	unlink(sock_path);
	unlink(conf);
}

int main(void)
{
	pid_t d;
	int st, r;
	struct stat sb;

	tap_seed();
	make_data();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 99;
	memset(sh, 0, sizeof(*sh));
	d = start_daemon();
	if (!ok(d > 0, "kvqd starts and listens on %s", sock_path))
		return done_testing();

	r = run_child(client_a);
	ok(r == 0, "client A: hello, attach, alloc, write, seal, publish (exit %d)", r);
	ok(sh->a_fd_ok && sh->a_layout_ok, "attach: pool fd received and mapped, layout matches kvq_layout_new");
	ok(sh->a_publish_ok, "publish: A's own ids returned, 2 blocks cached");
	ok(sh->a_attn_done, "A: attention computed");

	r = run_child(client_b);
	ok(r == 0, "client B ran (exit %d)", r);
	ok(sh->b_lookup_ok, "B: lookup returns A's sealed ids");
	ok(sh->b_bytes_ok, "B: the blocks' bytes equal what A wrote");
	ok(sh->b_attn_ok, "B: attention over the cached prefix equals A's exactly");
	ok(sh->b_salt_ok, "B: another salt gets no hit");
	ok(sh->b_fork_ok, "B: fork takes one more hold per id, released with multiplicity");

	r = run_child(client_c);
	ok(r == 0, "client C ran (exit %d)", r);
	ok(sh->c_dedup_ok, "C: publishing the same tokens returns A's cached ids");
	ok(sh->c_stats_ok, "C: one copy cached, the duplicates freed");
	ok(sh->c_release_ok, "C: its hold moved to the cached blocks");

	test_attach_errors();

	r = run_child(client_d);
	ok(r == 0, "client D ran (exit %d)", r);
	ok(sh->d_order_ok, "D: requests before Hello / Attach get -EPROTO");
	ok(sh->d_errors == 6, "D: naming blocks outside its lease: -EINVAL (%d of 6)", sh->d_errors);
	ok(sh->d_unchanged, "D: and nothing changed");

	r = run_child(client_e);
	ok(r == 0, "client E ran (exit %d)", r);
	ok(sh->e_nospc, "E: allocations beyond the pool get -ENOSPC");
	ok(sh->e_unchanged, "E: nothing allocated or overwritten, failures counted");
	ok(sh->e_still_cached, "E: the cached prefix survives");

	test_kill9();
	test_bad_frames();

	kill(d, SIGTERM);
	r = waitpid(d, &st, 0);
	ok(r == d && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: kvqd exits with status 0");
	ok(stat(sock_path, &sb) < 0, "SIGTERM: socket removed");
	test_activation_and_reload(daemon_bin);
	{
		char conf[128];

		snprintf(conf, sizeof(conf), "%s/kvqd.conf", tmpdir);
		unlink(conf);
		rmdir(tmpdir);
	}
	return done_testing();
}
