/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvq-bench control: the control-plane benchmark.
 *
 * "control" speaks the protocol (proto/conn.h, not libkvq) to a running
 * kvqd from one client and measures block operations per second in batches
 * of 64 (each block counted once in each of Alloc, Seal, Publish and
 * Release), the round trip of a single small request (Stats), and the time
 * to attach (connect, hello, attach, the pool's fd received and mapped).
 * It attaches to pool "kvq-bench" (or --pool), creating it when needed.
 * Then the batched decode cycle (cycle.c) runs through libkvq's batch API
 * at batch 1, 16 and 256 on a pool of its own ("kvq-bench-batch": the
 * pool's name and "-batch").
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "conn.h"
#include "control.h"
#include "frame.h"
#include "frame_io.h"
#include "kvq_wire.h"

/*
 * "control" drives a running kvqd through the protocol (proto/conn.h, no
 * libkvq) from one client on one connection.  A cycle is what a decode step
 * does with a batch: Seal the batch's open slots into their reserved sealed
 * slots, Publish them (a chain of CTL_BATCH blocks of B tokens each, tokens
 * unique to the cycle and the run, so nothing deduplicates), Release the
 * published blocks, and Alloc the next batch; the four requests go in one
 * write and their replies are read afterwards (kvq_conn_reply): one round
 * trip per cycle, as kvq.proto suggests.
 */
#define CTL_BATCH 64u
#define CTL_OPS_PER_CYCLE (4u * CTL_BATCH)   /* each block: alloc, seal, publish, release */
#define CTL_POOL "kvq-bench"
#define CTL_N_SEALED 4096u   /* cached blocks pile up to here, then Alloc evicts */
#define CTL_N_OPEN 256u
#define CTL_TIMEOUT_MS 5000
#define CTL_RTT_WARM 1000u
#define CTL_RTT_SAMPLES 20000u
#define CTL_ATTACH_SAMPLES 9u
#define CTL_OPS_TARGET 300000.0
#define CTL_RTT_P99_TARGET_US 100.0
#define CTL_ERR (KVQ_PROTO_MAX_MESSAGE + 256)

struct ctl_cfg {
	const char *socket;
	const char *pool;
	int json;
	double seconds;
};

/* The connection, the frames queued for one write, and the mapped pool. */
struct ctl_conn {
	struct kvq_conn conn;
	uint8_t *obuf;             /* frames queued by ctl_queue */
	size_t olen, ocap;
	void *base;
	size_t map_bytes;
	uint32_t block_tokens, n_sealed, n_open;
	char backend[16];
};

static void ctl_init(struct ctl_conn *c)
{
	memset(c, 0, sizeof *c);
	kvq_conn_init(&c->conn, CTL_TIMEOUT_MS);
}

static void ctl_close(struct ctl_conn *c)
{
	if (c->base)
		munmap(c->base, c->map_bytes);
	kvq_conn_close(&c->conn);
	free(c->obuf);
	ctl_init(c);
}

/* Says in err why what failed on c with r; returns r. */
static int ctl_fail(const struct ctl_conn *c, int r, const char *what, char *err)
{
	const struct kvq_conn *k = &c->conn;

	switch (k->fault) {
	case KVQ_CONN_PATH:
	case KVQ_CONN_SOCKET:
		snprintf(err, CTL_ERR, "%s", k->msg);
		break;
	case KVQ_CONN_CONNECT:
		if (r == -ENOENT || r == -ECONNREFUSED)
			snprintf(err, CTL_ERR, "kvqd is not running (nothing listens on %s: %s)", k->path, strerror(-r));
		else
			snprintf(err, CTL_ERR, "cannot connect to %s: %s", k->path, strerror(-r));
		break;
	case KVQ_CONN_STATUS:
		snprintf(err, CTL_ERR, "%s refused: %s (%d)", what, k->msg, r);
		break;
	default:
		snprintf(err, CTL_ERR, "%s: %s", what, k->msg);
	}
	return r;
}

/* Appends e as a frame to the output buffer, with the connection's next
 * request id; returns the id or 0. */
static uint64_t ctl_queue(struct ctl_conn *c, Kvq__Envelope *e, char *err)
{
	int n;

	e->id = ++c->conn.next_id;
	n = kvq_frame_size(e);
	if (n < 0) {
		snprintf(err, CTL_ERR, "cannot frame a request: %s", strerror(-n));
		return 0;
	}
	if (c->olen + (size_t)n > c->ocap) {
		size_t cap = 2 * (c->olen + (size_t)n);
		uint8_t *p = realloc(c->obuf, cap);

		if (!p) {
			snprintf(err, CTL_ERR, "out of memory");
			return 0;
		}
		c->obuf = p;
		c->ocap = cap;
	}
	n = kvq_frame_encode(e, c->obuf + c->olen, c->ocap - c->olen);
	if (n < 0) {
		snprintf(err, CTL_ERR, "cannot frame a request: %s", strerror(-n));
		return 0;
	}
	c->olen += (size_t)n;
	return e->id;
}

/* Sends everything queued in one write (as few sendmsg calls as the socket
 * allows). */
static int ctl_flush(struct ctl_conn *c, char *err)
{
	int r = kvq_frame_send_frames(c->conn.fd, c->obuf, c->olen, -1, c->conn.timeout_ms);

	c->olen = 0;
	if (r < 0) {
		c->conn.broken = true;
		snprintf(err, CTL_ERR, "send to kvqd: %s", r == -EPIPE ? "kvqd closed the connection" : kvq_strerror(r));
	}
	return r;
}

/* The reply to request id (sent by ctl_flush), of body type want: 0 and
 * *ret (kvq_frame_envelope_free; NULL: freed), or kvq_conn_reply's error
 * with why in err. */
static int ctl_reply(struct ctl_conn *c, uint64_t id, Kvq__Envelope__BodyCase want, const char *what,
		     Kvq__Envelope **ret, char *err)
{
	int r = kvq_conn_reply(&c->conn, id, want, ret);

	return r < 0 ? ctl_fail(c, r, what, err) : 0;
}

/* One request, one reply. */
static int ctl_rpc(struct ctl_conn *c, Kvq__Envelope *e, Kvq__Envelope__BodyCase want, const char *what,
		   Kvq__Envelope **ret, char *err)
{
	int r = kvq_conn_call(&c->conn, e, want, ret);

	return r < 0 ? ctl_fail(c, r, what, err) : 0;
}

/* Attaches to pool (creating it when it does not exist) and maps it. */
static int ctl_attach(struct ctl_conn *c, const char *pool, char *err)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	const Kvq__AttachReply *ar;
	int r;

	a.pool = (char *)pool;
	a.model_id = CTL_MODEL;
	a.layers = CTL_LAYERS;
	a.kv_heads = CTL_HEADS;
	a.head_dim = CTL_HEAD_DIM;
	a.block_tokens = CTL_BLOCK_TOKENS;
	a.policy = CTL_POLICY;
	a.act = KVQ__DTYPE__DTYPE_F16;
	a.layout_version = KVQ_LAYOUT_VERSION;
	pc.n_sealed = CTL_N_SEALED;
	pc.n_open = CTL_N_OPEN;
	pc.backend = "";
	pc.device = -1;
	a.create = &pc;
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	r = ctl_rpc(c, &e, KVQ__ENVELOPE__BODY_ATTACH_REPLY, "attach", &rep, err);
	if (r < 0)
		return r;
	ar = rep->attach_reply;
	if (c->conn.pool_fd < 0 || ar->map_bytes < ar->total_bytes || ar->map_bytes > SIZE_MAX) {
		snprintf(err, CTL_ERR, "attach: the reply came without the pool's memory");
		r = -EPROTO;
		goto out;
	}
	c->map_bytes = (size_t)ar->map_bytes;
	c->base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->conn.pool_fd, 0);
	if (c->base == MAP_FAILED) {
		r = -errno;
		c->base = NULL;
		snprintf(err, CTL_ERR, "cannot map the pool (%s backend, %llu bytes): %s", ar->backend,
			 (unsigned long long)ar->map_bytes, strerror(-r));
		goto out;
	}
	c->block_tokens = ar->block_tokens;
	c->n_sealed = ar->n_sealed;
	c->n_open = ar->n_open;
	snprintf(c->backend, sizeof c->backend, "%s", ar->backend);
out:
	kvq_frame_envelope_free(rep);
	return r;
}

/* Connect, Hello (kvq_conn_open), attach, map. */
static int ctl_open(struct ctl_conn *c, const struct ctl_cfg *cfg, char *err)
{
	int r;

	ctl_init(c);
	r = kvq_conn_open(&c->conn, cfg->socket, PROG);
	if (r < 0)
		return ctl_fail(c, r, "hello", err);
	return ctl_attach(c, cfg->pool, err);
}

static double pct(const double *sorted, size_t n, double q)
{
	size_t k = (size_t)ceil(q * (double)n);

	return sorted[k ? k - 1 : 0];
}

/* Round trips of a Stats request for the pool (a few hundred bytes back). */
static int ctl_rtt(struct ctl_conn *c, const struct ctl_cfg *cfg, double *ret_p50, double *ret_p99,
		   double *ret_max, char *err)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	double *v = malloc(CTL_RTT_SAMPLES * sizeof *v);
	int r = 0;

	if (!v) {
		snprintf(err, CTL_ERR, "out of memory");
		return -ENOMEM;
	}
	s.pool = (char *)cfg->pool;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	for (unsigned i = 0; i < CTL_RTT_WARM + CTL_RTT_SAMPLES; i++) {
		double t0 = now_s();

		r = ctl_rpc(c, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, "stats", &rep, err);
		if (r < 0)
			break;
		if (i >= CTL_RTT_WARM)
			v[i - CTL_RTT_WARM] = (now_s() - t0) * 1e6;
		kvq_frame_envelope_free(rep);
		rep = NULL;
	}
	if (r == 0) {
		qsort(v, CTL_RTT_SAMPLES, sizeof *v, cmp_double);
		*ret_p50 = pct(v, CTL_RTT_SAMPLES, 0.50);
		*ret_p99 = pct(v, CTL_RTT_SAMPLES, 0.99);
		*ret_max = v[CTL_RTT_SAMPLES - 1];
	}
	free(v);
	return r;
}

/* Median of fresh connect + hello + attach (fd received, pool mapped) on
 * the pool that already exists. */
static int ctl_attach_ms(const struct ctl_cfg *cfg, double *ret_ms, char *err)
{
	double v[CTL_ATTACH_SAMPLES];

	for (unsigned i = 0; i < CTL_ATTACH_SAMPLES; i++) {
		struct ctl_conn c;
		double t0 = now_s();
		int r = ctl_open(&c, cfg, err);

		v[i] = (now_s() - t0) * 1e3;
		ctl_close(&c);
		if (r < 0)
			return r;
	}
	*ret_ms = median(v, CTL_ATTACH_SAMPLES);
	return 0;
}

struct ctl_ops {
	uint64_t cycles, requests;
	double seconds;
};

static int ctl_alloc_reply(struct ctl_conn *c, uint64_t id, uint32_t *open, uint32_t *resv, char *err)
{
	Kvq__Envelope *rep = NULL;
	const Kvq__AllocReply *ar;
	int r = ctl_reply(c, id, KVQ__ENVELOPE__BODY_ALLOC_REPLY, "alloc", &rep, err);

	if (r < 0)
		return r;
	ar = rep->alloc_reply;
	if (ar->n_open_ids != CTL_BATCH || ar->n_reserved_ids != CTL_BATCH) {
		snprintf(err, CTL_ERR, "alloc: %zu open ids for %u slots", ar->n_open_ids, CTL_BATCH);
		r = -EPROTO;
	} else {
		memcpy(open, ar->open_ids, CTL_BATCH * sizeof *open);
		memcpy(resv, ar->reserved_ids, CTL_BATCH * sizeof *resv);
	}
	kvq_frame_envelope_free(rep);
	return r;
}

/* Pipelined Seal / Publish / Release / Alloc cycles for cfg->seconds. */
static int ctl_ops(struct ctl_conn *c, const struct ctl_cfg *cfg, struct ctl_ops *ret, char *err)
{
	uint32_t B = c->block_tokens, open[CTL_BATCH], resv[CTL_BATCH], *tokens;
	Kvq__PublishBlock blk[CTL_BATCH], *blkp[CTL_BATCH];
	Kvq__Envelope e_alloc = KVQ__ENVELOPE__INIT, e_seal = KVQ__ENVELOPE__INIT, e_pub = KVQ__ENVELOPE__INIT,
		      e_rel = KVQ__ENVELOPE__INIT;
	Kvq__Alloc al = KVQ__ALLOC__INIT;
	Kvq__Seal se = KVQ__SEAL__INIT;
	Kvq__Publish pu = KVQ__PUBLISH__INIT;
	Kvq__Release rl = KVQ__RELEASE__INIT;
	struct ctl_ops o = { 0 };
	struct timespec ts;
	uint64_t seed, id_alloc, ids[3];
	double t0, deadline;
	int r, held_open = 0;

	if (c->n_open < CTL_BATCH || c->n_sealed < 2 * CTL_BATCH) {
		snprintf(err, CTL_ERR, "pool %s has %u open / %u sealed slots; the benchmark needs %u / %u", cfg->pool,
			 c->n_open, c->n_sealed, CTL_BATCH, 2 * CTL_BATCH);
		return -ENOSPC;
	}
	tokens = malloc((size_t)CTL_BATCH * B * sizeof *tokens);
	if (!tokens) {
		snprintf(err, CTL_ERR, "out of memory");
		return -ENOMEM;
	}
	/* a run's tokens differ from an earlier run's on the same pool too */
	clock_gettime(CLOCK_REALTIME, &ts);
	seed = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + ((uint64_t)getpid() << 40);

	al.n_open = CTL_BATCH;
	e_alloc.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e_alloc.alloc = &al;
	se.n_open_ids = se.n_sealed_ids = CTL_BATCH;
	se.open_ids = open;
	se.sealed_ids = resv;
	e_seal.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e_seal.seal = &se;
	for (uint32_t i = 0; i < CTL_BATCH; i++) {
		kvq__publish_block__init(&blk[i]);
		blk[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
		if (i)
			blk[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
		blk[i].n_tokens = B;
		blk[i].tokens = tokens + (size_t)i * B;
		blkp[i] = &blk[i];
	}
	pu.n_blocks = CTL_BATCH;
	pu.blocks = blkp;
	e_pub.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e_pub.publish = &pu;
	rl.n_sealed_ids = CTL_BATCH;
	rl.sealed_ids = resv;
	e_rel.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e_rel.release = &rl;

	t0 = now_s();
	deadline = t0 + cfg->seconds;
	id_alloc = ctl_queue(c, &e_alloc, err);
	r = id_alloc ? ctl_flush(c, err) : -ENOMEM;
	if (r == 0)
		r = ctl_alloc_reply(c, id_alloc, open, resv, err);
	if (r < 0)
		goto out;
	held_open = 1;
	o.requests = 1;
	while (now_s() < deadline) {
		Kvq__Envelope *rep = NULL;

		for (uint32_t i = 0; i < CTL_BATCH; i++) {
			blk[i].sealed_id = resv[i];
			blk[i].parent_id = i ? resv[i - 1] : 0;
		}
		for (size_t k = 0; k < (size_t)CTL_BATCH * B; k++)
			tokens[k] = (uint32_t)rng_next(&seed);
		ids[0] = ctl_queue(c, &e_seal, err);
		ids[1] = ids[0] ? ctl_queue(c, &e_pub, err) : 0;
		ids[2] = ids[1] ? ctl_queue(c, &e_rel, err) : 0;
		id_alloc = ids[2] ? ctl_queue(c, &e_alloc, err) : 0;
		r = id_alloc ? ctl_flush(c, err) : -ENOMEM;
		if (r < 0)
			goto out;
		r = ctl_reply(c, ids[0], KVQ__ENVELOPE__BODY_SEAL_REPLY, "seal", NULL, err);
		if (r == 0)
			r = ctl_reply(c, ids[1], KVQ__ENVELOPE__BODY_PUBLISH_REPLY, "publish", &rep, err);
		if (r == 0) {
			/* a duplicate would move the hold to another id and the
			 * pipelined Release would name the wrong one */
			for (uint32_t i = 0; i < CTL_BATCH && r == 0; i++)
				if (rep->publish_reply->n_ids != CTL_BATCH || rep->publish_reply->ids[i] != resv[i]) {
					snprintf(err, CTL_ERR, "publish: block %u was deduplicated; tokens repeat", i);
					r = -EPROTO;
				}
			kvq_frame_envelope_free(rep);
		}
		held_open = 0;
		if (r == 0)
			r = ctl_reply(c, ids[2], KVQ__ENVELOPE__BODY_RELEASE_REPLY, "release", NULL, err);
		if (r == 0)
			r = ctl_alloc_reply(c, id_alloc, open, resv, err);
		if (r < 0)
			goto out;
		held_open = 1;
		o.cycles++;
		o.requests += 4;
	}
	o.seconds = now_s() - t0;
	*ret = o;
out:
	if (held_open) {
		/* the last batch, allocated but not counted; failures here only
		 * leave slots held until the connection closes */
		Kvq__Release last = KVQ__RELEASE__INIT;
		Kvq__Envelope e = KVQ__ENVELOPE__INIT;
		char err2[CTL_ERR];
		int r2;

		last.n_open_ids = CTL_BATCH;
		last.open_ids = open;
		e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
		e.release = &last;
		r2 = ctl_rpc(c, &e, KVQ__ENVELOPE__BODY_RELEASE_REPLY, "release", NULL, r < 0 ? err2 : err);
		if (r == 0)
			r = r2;
	}
	free(tokens);
	return r;
}

/* The batched decode cycle's batch sizes (cycle.c). */
#define CTL_CYCLE_SIZES 3u
static const uint32_t ctl_cycle_size[CTL_CYCLE_SIZES] = { 1, 16, 256 };

/* A batch size's run as rates: per second, per step. */
struct ctl_cycle {
	double ops_s, steps_s;
	double trips, begin_trips, commit_trips, requests, releases;
};

static struct ctl_cycle ctl_cycle_figures(const struct cycle_result *y)
{
	const double steps = y->steps ? (double)y->steps : 1.0;

	return (struct ctl_cycle){
		.ops_s = (double)(y->allocs + y->seals + y->publishes + y->releases) / y->seconds,
		.steps_s = (double)y->steps / y->seconds,
		.trips = (double)(y->begin_waits + y->commit_waits) / steps,
		.begin_trips = (double)y->begin_waits / steps,
		.commit_trips = (double)y->commit_waits / steps,
		.requests = (double)(y->begin_requests + y->commit_requests) / steps,
		.releases = (double)y->ended / steps,
	};
}

static void ctl_cycle_print(const char *pool, double seconds, const struct cycle_result *cy)
{
	printf("batched decode (libkvq kvq_batch, pool %s, sequences of %u tokens, %.2f s per batch size):\n", pool,
	       CYCLE_SEQ_TOKENS, seconds);
	for (unsigned i = 0; i < CTL_CYCLE_SIZES; i++) {
		struct ctl_cycle f = ctl_cycle_figures(&cy[i]);

		printf("batch %3u: %.0f block operations/s, %.0f steps/s; per step %.2f round trips (begin %.2f + "
		       "commit %.2f), %.2f requests, %.2f ended sequences\n", cy[i].size, f.ops_s, f.steps_s, f.trips,
		       f.begin_trips, f.commit_trips, f.requests, f.releases);
	}
	printf("  a step appends one token to each sequence: kvq_batch_add (m = 1) for each, kvq_batch_begin, a\n"
	       "  kvq_batch_write of each layer, kvq_batch_commit; round trips and requests of begin and commit as\n"
	       "  kvq_batch_requests reports them; a block operation is each block counted once when a begin\n"
	       "  allocates it, once each when a commit seals and publishes it, once when it is released; a\n"
	       "  sequence that reached %u tokens is freed (kvq_seq_free: one Release, a round trip outside\n"
	       "  the step, timed) and replaced by an empty one\n", CYCLE_SEQ_TOKENS);
}

int cmd_control(int argc, char **argv)
{
	struct ctl_cfg cfg = { .pool = CTL_POOL, .seconds = 3.0 };
	struct ctl_conn c;
	struct ctl_ops o = { 0 };
	struct cycle_result cy[CTL_CYCLE_SIZES] = { 0 };
	char err[CTL_ERR] = "", sockbuf[108], bpool[KVQ_PROTO_MAX_NAME + 1];
	double p50 = 0, p99 = 0, pmax = 0, attach_ms = 0, ops_s, t_first;
	int r;

	for (int i = 1; i < argc; i++) {
		const char *opt = argv[i], *val = NULL;

		if (!strcmp(opt, "--json")) {
			cfg.json = 1;
			continue;
		}
		if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
			usage(stdout);
			return 0;
		}
		if (strcmp(opt, "--socket") && strcmp(opt, "--pool") && strcmp(opt, "--seconds")) {
			fprintf(stderr, PROG " control: unknown option '%s' (see " PROG " --help)\n", opt);
			return 2;
		}
		if (i + 1 >= argc || !*argv[i + 1]) {
			fprintf(stderr, PROG " control: %s needs a value\n", opt);
			return 2;
		}
		val = argv[++i];
		if (!strcmp(opt, "--socket")) {
			cfg.socket = val;
		} else if (!strcmp(opt, "--pool")) {
			cfg.pool = val;
		} else {
			char *end;

			errno = 0;
			cfg.seconds = strtod(val, &end);
			if (errno || *end || !(cfg.seconds > 0.0 && cfg.seconds <= 3600.0)) {
				fprintf(stderr, PROG " control: --seconds takes a number of seconds in (0, 3600]\n");
				return 2;
			}
		}
	}
	if (!cfg.socket) {
		/* $KVQ_SOCKET, else kvqd's default, as libkvq and kvqctl */
		if (kvq_default_socket(sockbuf, sizeof sockbuf) < 0) {
			fprintf(stderr, PROG " control: no default socket ($KVQ_SOCKET and $XDG_RUNTIME_DIR unset): "
				"use --socket\n");
			return 1;
		}
		cfg.socket = sockbuf;
	}

	/* the first attach creates the pool: timed, but not the figure */
	t_first = now_s();
	r = ctl_open(&c, &cfg, err);
	t_first = (now_s() - t_first) * 1e3;
	if (r == 0) {
		if (!cfg.json)
			fprintf(stderr, PROG " control: pool %s on %s (%s backend, B=%u, %u sealed / %u open slots); "
				"round trips ...\n", cfg.pool, cfg.socket, c.backend, c.block_tokens, c.n_sealed,
				c.n_open);
		r = ctl_rtt(&c, &cfg, &p50, &p99, &pmax, err);
	}
	if (r == 0) {
		if (!cfg.json)
			fprintf(stderr, PROG " control: block operations for %.1f s ...\n", cfg.seconds);
		r = ctl_ops(&c, &cfg, &o, err);
	}
	ctl_close(&c);
	if (r == 0)
		r = ctl_attach_ms(&cfg, &attach_ms, err);
	if (r == 0 && (size_t)snprintf(bpool, sizeof bpool, "%s-batch", cfg.pool) >= sizeof bpool) {
		snprintf(err, CTL_ERR, "pool name %s is too long for the batched cycle's pool (%s-batch)", cfg.pool,
			 cfg.pool);
		r = -ENAMETOOLONG;
	}
	for (unsigned i = 0; r == 0 && i < CTL_CYCLE_SIZES; i++) {
		if (!cfg.json)
			fprintf(stderr, PROG " control: batched decode steps of %u sequences for %.1f s ...\n",
				ctl_cycle_size[i], cfg.seconds / CTL_CYCLE_SIZES);
		r = cycle_run(cfg.socket, bpool, ctl_cycle_size[i], cfg.seconds / CTL_CYCLE_SIZES, &cy[i], err,
			      CTL_ERR);
	}
	if (r < 0) {
		fprintf(stderr, PROG " control: %s\n", err);
		return 1;
	}

	ops_s = (double)o.cycles * CTL_OPS_PER_CYCLE / o.seconds;
	if (cfg.json) {
		printf("{\"ops_per_s\":%.0f,\"rtt_p50_us\":%.2f,\"rtt_p99_us\":%.2f,\"attach_ms\":%.3f,\"batch\":[", ops_s,
		       p50, p99, attach_ms);
		for (unsigned i = 0; i < CTL_CYCLE_SIZES; i++) {
			struct ctl_cycle f = ctl_cycle_figures(&cy[i]);

			printf("%s{\"size\":%u,\"ops_per_s\":%.0f,\"steps_per_s\":%.0f,\"trips_per_step\":%.3f,"
			       "\"requests_per_step\":%.3f,\"releases_per_step\":%.3f}", i ? "," : "", cy[i].size,
			       f.ops_s, f.steps_s, f.trips, f.requests, f.releases);
		}
		printf("]}\n");
		return 0;
	}
	printf("kvq-bench control: one client, pool %s (model %s, L=%u H=%u D=%u B=%u, %s), socket %s\n", cfg.pool,
	       CTL_MODEL, CTL_LAYERS, CTL_HEADS, CTL_HEAD_DIM, CTL_BLOCK_TOKENS, CTL_POLICY, cfg.socket);
	printf("block operations: %.0f /s  [%s: >= %.0f]\n", ops_s, ops_s >= CTL_OPS_TARGET ? "PASS" : "MISS",
	       CTL_OPS_TARGET);
	printf("  %llu cycles in %.2f s (%.0f cycles/s, %.0f requests/s, one round trip per cycle); a cycle is\n"
	       "  Seal %u + Publish %u (a chain, %u distinct tokens each) + Release %u + Alloc %u (next batch),\n"
	       "  pipelined: %u block operations = each of %u blocks counted once in each of Alloc, Seal,\n"
	       "  Publish, Release (the first Alloc counts, the last one, never sealed, does not)\n",
	       (unsigned long long)o.cycles, o.seconds, (double)o.cycles / o.seconds, (double)o.requests / o.seconds,
	       CTL_BATCH, CTL_BATCH, CTL_BLOCK_TOKENS, CTL_BATCH, CTL_BATCH, CTL_OPS_PER_CYCLE, CTL_BATCH);
	printf("round trip (Stats of the pool, one request at a time, %u samples): p50 %.1f us, p99 %.1f us, "
	       "max %.1f us  [%s: p99 < %.0f us on an idle machine]\n", CTL_RTT_SAMPLES, p50, p99, pmax,
	       p99 < CTL_RTT_P99_TARGET_US ? "PASS" : "MISS", CTL_RTT_P99_TARGET_US);
	printf("attach (connect + hello + attach + fd + mmap, existing pool): median of %u %.3f ms "
	       "(first attach of this run: %.3f ms)\n", CTL_ATTACH_SAMPLES, attach_ms, t_first);
	ctl_cycle_print(bpool, cfg.seconds / CTL_CYCLE_SIZES, cy);
	return 0;
}
