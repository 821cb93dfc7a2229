/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Load and faults against the real kvqd: 64 client processes, each doing
 * at least KVQ_LOAD_OPS (10,000) random batched requests over the wire
 * (Alloc, Seal, Publish of chains shared between clients, Lookup, Fork,
 * Release, and now and then a reconnect), in rounds, while the parent kills
 * random clients with SIGKILL and starts new ones in their place, which go
 * on with the slot's count.  Each client keeps its own books of what it
 * holds, so any refusal but -ENOSPC is an error.
 *
 * After each kill the killed process's connection must leave Stats within
 * a bound; after each round, with every client gone, the pool must account
 * for every block (free + held + reserved + cached = capacity, nothing held,
 * nothing referenced, no client left) and kvqd's RSS must not grow between
 * rounds beyond a bound.  The figures are printed as TAP comments.
 *
 * Then the host tier's phase: one more round on a pool of the same size
 * with a host tier (PoolCreate.host_capacity), where evicted chains are
 * demoted and lookups promote them while others allocate and evict, kills
 * included (a client killed while its lookup waits for a promotion among
 * them), twice; after each every slot is accounted for (demoting ones
 * included, none left once the copies ended); the tier holds records
 * within its slots, demotions and promotions both happened, kvqd's RSS is
 * within 16 MiB of its start (not judged under AddressSanitizer, whose
 * shadow and quarantine grow with the heap) and stable between the two.
 */
#include <config.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tap.h"
#include "../daemon.h"
#include "conn.h"
#include "figure.h"
#include "frame.h"
#include "layout.h"

#define N_CLIENTS 64
#define ROUNDS 3
#define POOL "load"
#define MODEL "test/model@1"
#define L_ 2
#define H_ 2
#define D_ 32
#define B_ 16
#define N_SEALED 256
#define N_OPEN 128
#define PROMPTS 64          /* distinct prompts: clients publish and find each other's chains */
#define CHAIN_MAX 4
#define HOLD_MAX 24         /* sealed holds a client keeps before it releases */
#define TIMEOUT_MS 10000
#define KILLS_PER_ROUND 40
#define LEASE_GONE_MS 2000  /* a killed client's connection leaves Stats within this */

struct slot {
	volatile uint64_t ops;          /* requests answered, over every process of the slot */
	volatile uint64_t nospc;
	volatile uint64_t reconnects;
	volatile uint64_t worst_ns;     /* slowest round trip */
	volatile uint64_t total_ns;
	volatile int error;             /* a refusal the client's books did not expect */
	volatile char what[160];
	volatile pid_t pid;
};

static struct slot *slots;
static char sock_path[108], tmpdir[64], daemon_bin[512];
static const char *pool_name = POOL;   /* the pool of the round */
static uint64_t host_capacity;         /* its host tier, when it creates it */
static uint64_t ops_per_slot;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64*, seeded per process */
static uint64_t rng;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (uint32_t)((rng * 2685821657736338717ull) >> 33) % n;
}

static uint32_t token(uint32_t prompt, uint32_t i)
{
	return prompt * 100003u + i * 7u + 1;
}

/* ---------------------------------------------------------------- a client */

/* What one process holds: sealed ids with counts (private: allocated or
 * sealed by it, not yet published), open ids with their reservations. */
struct books {
	uint32_t sealed[HOLD_MAX * 2], count[HOLD_MAX * 2];
	bool private_[HOLD_MAX * 2];
	size_t n_sealed;
	uint32_t open[8], resv[8];
	size_t n_open;
};

struct client {
	struct slot *s;
	struct kvq_conn conn;
	struct books b;
};

static void fail(struct client *c, const char *op, int r)
{
	char what[sizeof(c->s->what)];
	int n = snprintf(what, sizeof(what), "%s: %d ", op, r);

	if (n > 0 && (size_t)n < sizeof(what))
		snprintf(what + n, sizeof(what) - (size_t)n, "%.100s", c->conn.msg);
	memcpy((char *)c->s->what, what, sizeof(what));
	c->s->error = 1;
	_exit(1);
}

/* One request; its round trip counted.  -ENOSPC is returned, any other
 * refusal ends the process with the slot's error set. */
static int call(struct client *c, const char *op, Kvq__Envelope *e, Kvq__Envelope__BodyCase want,
		Kvq__Envelope **ret)
{
	uint64_t t0 = now_ns(), dt;
	int r = kvq_conn_call(&c->conn, e, want, ret);

	dt = now_ns() - t0;
	c->s->total_ns += dt;
	if (dt > c->s->worst_ns)
		c->s->worst_ns = dt;
	if (r == -ENOSPC) {
		c->s->nospc++;
	} else if (r < 0) {
		fail(c, op, r);
	}
	c->s->ops++;
	return r;
}

static void attach(struct client *c)
{
	Kvq__PoolCreate pc = KVQ__POOL_CREATE__INIT;
	Kvq__Attach a = KVQ__ATTACH__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	int r;

	r = kvq_conn_open(&c->conn, sock_path, "load");
	if (r < 0)
		fail(c, "connect", r);
	pc.n_sealed = N_SEALED;
	pc.n_open = N_OPEN;
	pc.backend = "host";
	pc.device = -1;
	pc.host_capacity = host_capacity;
	a.pool = (char *)pool_name;
	a.model_id = MODEL;
	a.policy = "int8";
	a.layers = L_;
	a.kv_heads = H_;
	a.head_dim = D_;
	a.block_tokens = B_;
	a.act = KVQ__DTYPE__DTYPE_F16;
	a.layout_version = KVQ_LAYOUT_VERSION;
	a.create = &pc;
	e.body_case = KVQ__ENVELOPE__BODY_ATTACH;
	e.attach = &a;
	call(c, "attach", &e, KVQ__ENVELOPE__BODY_ATTACH_REPLY, NULL);
	memset(&c->b, 0, sizeof(c->b));
}

static void hold(struct books *b, uint32_t id, uint32_t n, bool priv)
{
	for (size_t i = 0; i < b->n_sealed; i++)
		if (b->sealed[i] == id) {
			b->count[i] += n;
			return;
		}
	b->sealed[b->n_sealed] = id;
	b->count[b->n_sealed] = n;
	b->private_[b->n_sealed++] = priv;
}

/* References held, with multiplicity. */
static uint32_t books_refs(const struct books *b)
{
	uint32_t n = 0;

	for (size_t i = 0; i < b->n_sealed; i++)
		n += b->count[i];
	return n;
}

static void op_alloc(struct client *c)
{
	Kvq__Alloc a = KVQ__ALLOC__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	struct books *b = &c->b;

	a.n_open = b->n_open < 4 ? rnd(3) : 0;
	a.n_sealed = b->n_sealed + 4 <= HOLD_MAX ? rnd(4) : 0;
	if (!a.n_open && !a.n_sealed)
		a.n_sealed = b->n_sealed < HOLD_MAX ? 1 : 0;
	if (!a.n_open && !a.n_sealed)
		return;
	e.body_case = KVQ__ENVELOPE__BODY_ALLOC;
	e.alloc = &a;
	if (call(c, "alloc", &e, KVQ__ENVELOPE__BODY_ALLOC_REPLY, &rep) < 0)
		return;
	for (size_t i = 0; i < rep->alloc_reply->n_open_ids; i++) {
		b->open[b->n_open] = rep->alloc_reply->open_ids[i];
		b->resv[b->n_open++] = rep->alloc_reply->reserved_ids[i];
	}
	for (size_t i = 0; i < rep->alloc_reply->n_sealed_ids; i++)
		hold(b, rep->alloc_reply->sealed_ids[i], 1, true);
	kvq_frame_envelope_free(rep);
}

static void op_seal(struct client *c)
{
	Kvq__Seal q = KVQ__SEAL__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct books *b = &c->b;
	uint32_t open[8], resv[8];
	size_t n = b->n_open ? 1 + rnd((uint32_t)b->n_open) : 0;

	if (!n)
		return;
	/* the last n open slots */
	memcpy(open, b->open + b->n_open - n, n * sizeof(uint32_t));
	memcpy(resv, b->resv + b->n_open - n, n * sizeof(uint32_t));
	q.n_open_ids = q.n_sealed_ids = n;
	q.open_ids = open;
	q.sealed_ids = resv;
	e.body_case = KVQ__ENVELOPE__BODY_SEAL;
	e.seal = &q;
	call(c, "seal", &e, KVQ__ENVELOPE__BODY_SEAL_REPLY, NULL);
	b->n_open -= n;
	for (size_t i = 0; i < n; i++)
		hold(b, resv[i], 1, true);
}

/* A chain of private blocks held once, as blocks 0.. of a prompt. */
static void op_publish(struct client *c)
{
	Kvq__PublishBlock pb[CHAIN_MAX], *pp[CHAIN_MAX];
	Kvq__Publish q = KVQ__PUBLISH__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	struct books *b = &c->b;
	uint32_t tok[CHAIN_MAX][B_], prompt = rnd(PROMPTS);
	size_t idx[CHAIN_MAX], n = 0, want = 1 + rnd(CHAIN_MAX);

	for (size_t i = 0; i < b->n_sealed && n < want; i++)
		if (b->private_[i] && b->count[i] == 1)
			idx[n++] = i;
	if (!n)
		return;
	for (size_t i = 0; i < n; i++) {
		kvq__publish_block__init(&pb[i]);
		pb[i].block_case = KVQ__PUBLISH_BLOCK__BLOCK_SEALED_ID;
		pb[i].sealed_id = b->sealed[idx[i]];
		for (uint32_t t = 0; t < B_; t++)
			tok[i][t] = token(prompt, (uint32_t)i * B_ + t);
		pb[i].n_tokens = B_;
		pb[i].tokens = tok[i];
		if (i) {
			pb[i].parent_case = KVQ__PUBLISH_BLOCK__PARENT_PARENT_ID;
			pb[i].parent_id = b->sealed[idx[i - 1]];
		}
		pp[i] = &pb[i];
	}
	q.n_blocks = n;
	q.blocks = pp;
	e.body_case = KVQ__ENVELOPE__BODY_PUBLISH;
	e.publish = &q;
	if (call(c, "publish", &e, KVQ__ENVELOPE__BODY_PUBLISH_REPLY, &rep) < 0)
		return;
	if (rep->publish_reply->n_ids != n)
		fail(c, "publish reply", -EPROTO);
	/* a duplicate's hold moved to the cached block: take the published
	 * entries out, then hold what the reply names */
	for (size_t k = n; k-- > 0;) {
		size_t i = idx[k];

		b->n_sealed--;
		b->sealed[i] = b->sealed[b->n_sealed];
		b->count[i] = b->count[b->n_sealed];
		b->private_[i] = b->private_[b->n_sealed];
	}
	for (size_t i = 0; i < n; i++)
		hold(b, rep->publish_reply->ids[i], 1, false);
	kvq_frame_envelope_free(rep);
}

static void op_lookup(struct client *c)
{
	Kvq__Lookup q = KVQ__LOOKUP__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	struct books *b = &c->b;
	uint32_t tok[CHAIN_MAX * B_], prompt = rnd(PROMPTS), n = (1 + rnd(CHAIN_MAX)) * B_;

	if (b->n_sealed + CHAIN_MAX > HOLD_MAX || books_refs(b) > 4 * HOLD_MAX)
		return;
	for (uint32_t t = 0; t < n; t++)
		tok[t] = token(prompt, t);
	q.n_tokens = n;
	q.tokens = tok;
	q.max_tokens = n;
	e.body_case = KVQ__ENVELOPE__BODY_LOOKUP;
	e.lookup = &q;
	if (call(c, "lookup", &e, KVQ__ENVELOPE__BODY_LOOKUP_REPLY, &rep) < 0)
		return;
	for (size_t i = 0; i < rep->lookup_reply->n_sealed_ids; i++)
		hold(b, rep->lookup_reply->sealed_ids[i], 1, false);
	kvq_frame_envelope_free(rep);
}

static void op_fork(struct client *c)
{
	Kvq__Fork q = KVQ__FORK__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct books *b = &c->b;
	uint32_t ids[4];
	size_t n = b->n_sealed ? 1 + rnd(b->n_sealed < 4 ? (uint32_t)b->n_sealed : 4) : 0, at[4];

	for (size_t i = 0; i < n; i++) {
		at[i] = rnd((uint32_t)b->n_sealed);
		ids[i] = b->sealed[at[i]];
	}
	if (!n)
		return;
	q.n_sealed_ids = n;
	q.sealed_ids = ids;
	e.body_case = KVQ__ENVELOPE__BODY_FORK;
	e.fork = &q;
	call(c, "fork", &e, KVQ__ENVELOPE__BODY_FORK_REPLY, NULL);
	for (size_t i = 0; i < n; i++)
		b->count[at[i]]++;
}

/* Some holds (with multiplicity) and some open slots go back. */
static void op_release(struct client *c)
{
	Kvq__Release q = KVQ__RELEASE__INIT;
	Kvq__Envelope e = KVQ__ENVELOPE__INIT;
	struct books *b = &c->b;
	uint32_t sealed[HOLD_MAX * 8], open[8];
	size_t ns = 0, no = 0;

	for (size_t i = 0; i < b->n_sealed;) {
		if (rnd(2)) {
			uint32_t k = 1 + rnd(b->count[i]);

			for (uint32_t j = 0; j < k; j++)
				sealed[ns++] = b->sealed[i];
			if ((b->count[i] -= k) == 0) {
				b->n_sealed--;
				b->sealed[i] = b->sealed[b->n_sealed];
				b->count[i] = b->count[b->n_sealed];
				b->private_[i] = b->private_[b->n_sealed];
				continue;
			}
		}
		i++;
	}
	while (b->n_open && rnd(2)) {
		b->n_open--;
		open[no++] = b->open[b->n_open];
	}
	if (!ns && !no)
		return;
	q.n_sealed_ids = ns;
	q.sealed_ids = sealed;
	q.n_open_ids = no;
	q.open_ids = open;
	e.body_case = KVQ__ENVELOPE__BODY_RELEASE;
	e.release = &q;
	call(c, "release", &e, KVQ__ENVELOPE__BODY_RELEASE_REPLY, NULL);
}

static void client_run(struct slot *s, uint64_t target, uint64_t seed)
{
	struct client c = { .s = s };

	rng = seed | 1;
	kvq_conn_init(&c.conn, TIMEOUT_MS);
	attach(&c);
	while (s->ops < target) {
		uint32_t x = rnd(100);

		if (x < 1) {
			/* a reconnect: the daemon drops everything this connection held */
			kvq_conn_close(&c.conn);
			s->reconnects++;
			attach(&c);
		} else if (x < 25) {
			op_alloc(&c);
		} else if (x < 40) {
			op_seal(&c);
		} else if (x < 55) {
			op_publish(&c);
		} else if (x < 72) {
			op_lookup(&c);
		} else if (x < 80 && books_refs(&c.b) <= 4 * HOLD_MAX) {
			op_fork(&c);
		} else {
			op_release(&c);
		}
	}
	kvq_conn_close(&c.conn);
	_exit(0);
}

/* ---------------------------------------------------------------- the parent */

static pid_t spawn(int i, uint64_t target, uint64_t seed)
{
	pid_t pid = fork();

	if (pid == 0)
		client_run(&slots[i], target, seed);
	slots[i].pid = pid;
	return pid;
}

struct pool_view {
	uint32_t n_sealed, n_open, sealed_free, sealed_reserved, sealed_held, cached, referenced, open_used, clients;
	uint64_t evictions;
	uint32_t demoting;
	uint64_t tier_records, tier_demotions, tier_promotions, tier_capacity;
	size_t n_client_list;           /* connections Stats lists besides the caller */
	bool pid_listed;
};

/* The pool as Stats reports it to the checker's connection; pid_listed:
 * whether a connection of pid is listed. */
static int pool_view(struct kvq_conn *chk, pid_t pid, struct pool_view *v)
{
	Kvq__Envelope e = KVQ__ENVELOPE__INIT, *rep = NULL;
	Kvq__Stats s = KVQ__STATS__INIT;
	const Kvq__StatsReply *sr;
	const Kvq__PoolStats *p;
	int r;

	s.pool = (char *)pool_name;
	e.body_case = KVQ__ENVELOPE__BODY_STATS;
	e.stats = &s;
	r = kvq_conn_call(chk, &e, KVQ__ENVELOPE__BODY_STATS_REPLY, &rep);
	if (r < 0)
		return r;
	sr = rep->stats_reply;
	if (sr->n_pools != 1) {
		kvq_frame_envelope_free(rep);
		return -ENOENT;
	}
	p = sr->pools[0];
	/* the pool's figures by name (kvq.proto PoolStats.figures) */
#define FIG(name) (uint32_t)kvq_figure_or_0(p, #name)
	*v = (struct pool_view){ FIG(n_sealed), FIG(n_open), FIG(sealed_free), FIG(sealed_reserved), FIG(sealed_held),
				 FIG(cached), FIG(referenced), FIG(open_used), FIG(clients),
				 kvq_figure_or_0(p, "evictions"), FIG(demoting), kvq_figure_or_0(p, "tier_records"),
				 kvq_figure_or_0(p, "tier_demotions"), kvq_figure_or_0(p, "tier_promotions"),
				 kvq_figure_or_0(p, "tier_capacity"), 0, false };
#undef FIG
	for (size_t i = 0; i < sr->n_clients; i++) {
		if (sr->clients[i]->id == chk->client_id)
			continue;
		v->n_client_list++;
		if ((pid_t)sr->clients[i]->pid == pid)
			v->pid_listed = true;
	}
	kvq_frame_envelope_free(rep);
	return 0;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* How long a killed pid stays listed; -1 when longer than LEASE_GONE_MS. */
static long lease_gone_ms(struct kvq_conn *chk, pid_t pid)
{
	uint64_t t0 = now_ns();
	struct pool_view v;

	for (;;) {
		long ms = (long)((now_ns() - t0) / 1000000u);
		int r = pool_view(chk, pid, &v);

		/* killed before any client created the round's pool: nothing listed */
		if (r == -ENOENT)
			return ms;
		if (r < 0)
			return -1;
		if (!v.pid_listed)
			return ms;
		if (ms > LEASE_GONE_MS)
			return -1;
		sleep_ms(1);
	}
}

/* Whether pid runs with AddressSanitizer (its runtime mapped). */
static bool sanitized(pid_t pid)
{
	char path[64], line[512];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, "libasan") != NULL;
	if (f)
		fclose(f);
	return found;
}

struct totals {
	unsigned kills, kills_late, errors;
	long worst_gone;
};

/* One round: every slot's clients until each did target operations in
 * all, KILLS_PER_ROUND of them killed and started again on the way. */
static void run_round(struct kvq_conn *chk, uint64_t target, uint64_t *seed, struct totals *t)
{
	unsigned round_kills = 0;
	int live = 0, st;

	for (int i = 0; i < N_CLIENTS; i++, live++)
		spawn(i, target, ++*seed * 0x9e3779b97f4a7c15ull);
	while (live > 0) {
		pid_t pid;

		/* reap what finished (or failed) */
		while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
			for (int i = 0; i < N_CLIENTS; i++)
				if (slots[i].pid == pid) {
					slots[i].pid = 0;
					if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
						t->errors++;
					else if (slots[i].ops < target)
						t->errors++;
					live--;
				}
		}
		if (live == 0)
			break;
		sleep_ms(5 + rnd(20));
		if (round_kills < KILLS_PER_ROUND) {
			int i = (int)rnd(N_CLIENTS);
			long ms;

			pid = slots[i].pid;
			if (pid <= 0 || kill(pid, SIGKILL) < 0)
				continue;
			waitpid(pid, &st, 0);
			slots[i].pid = 0;
			t->kills++;
			round_kills++;
			ms = lease_gone_ms(chk, pid);
			if (ms < 0)
				t->kills_late++;
			else if (ms > t->worst_gone)
				t->worst_gone = ms;
			if (slots[i].ops < target)
				spawn(i, target, ++*seed * 0x9e3779b97f4a7c15ull);
			else
				live--;
		}
	}
}

/* After a round, every client gone: nothing may be held, every slot
 * accounted for; waits for the clients' connections and the copies to
 * the host tier to end first.  Returns the pool's view. */
static struct pool_view round_end(struct kvq_conn *chk, const char *label)
{
	struct pool_view v = { 0 };

	for (int tries = 0; tries < 200; tries++) {
		if (pool_view(chk, 0, &v) < 0 || (v.clients == 0 && v.demoting == 0))
			break;
		sleep_ms(10);
	}
	ok(pool_view(chk, 0, &v) == 0 && v.n_sealed == N_SEALED &&
	   v.sealed_free + v.sealed_reserved + v.sealed_held + v.cached + v.demoting == v.n_sealed,
	   "%s: free %u + reserved %u + held %u + cached %u + demoting %u = capacity %u", label, v.sealed_free,
	   v.sealed_reserved, v.sealed_held, v.cached, v.demoting, v.n_sealed);
	ok(v.clients == 0 && v.n_client_list == 0 && v.sealed_held == 0 && v.sealed_reserved == 0 &&
	   v.open_used == 0 && v.referenced == 0 && v.demoting == 0,
	   "%s: no lease outlives its process (clients %u, listed %zu, held %u, reserved %u, open %u, "
	   "referenced %u), no copy left (demoting %u)", label, v.clients, v.n_client_list, v.sealed_held,
	   v.sealed_reserved, v.open_used, v.referenced, v.demoting);
	return v;
}

int main(void)
{
	const char *env_ops = getenv("KVQ_LOAD_OPS");
	uint64_t ops_total = 0, nospc = 0, reconnects = 0, worst_ns = 0, total_ns = 0;
	long rss[ROUNDS], rss_start, rss_tier[2];
	struct totals t = { 0 };
	struct kvq_conn chk;
	struct pool_view v;
	uint64_t seed = 0x5eed;
	uint64_t t_start = now_ns();
	pid_t dpid;
	int st;

	rng = 0x2545f4914f6cdd1dull;
	ops_per_slot = env_ops && atoll(env_ops) > 0 ? (uint64_t)atoll(env_ops) : 10000;
	slots = mmap(NULL, N_CLIENTS * sizeof(*slots), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!ok(slots != MAP_FAILED, "shared counters"))
		return done_testing();
	memset(slots, 0, N_CLIENTS * sizeof(*slots));
	{
		/* under AddressSanitizer freed memory waits in a quarantine of
		 * 256 MiB by default, which fills over several rounds and grows the
		 * RSS with the bytes freed, not with what the daemon holds: a small
		 * one fills in the first round (no effect without the sanitizer) */
		const char *asan = getenv("ASAN_OPTIONS");
		char opts[512];

		snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=16", asan ? asan : "", asan && *asan ? ":" : "");
		setenv("ASAN_OPTIONS", opts, 1);
	}
	dpid = test_daemon_start("host", "load", tmpdir, sizeof(tmpdir), sock_path, sizeof(sock_path), daemon_bin,
				 sizeof(daemon_bin));
	if (!ok(dpid > 0, "kvqd started (%s)", daemon_bin))
		return done_testing();
	rss_start = test_rss_kib(dpid);
	kvq_conn_init(&chk, TIMEOUT_MS);
	if (!ok(kvq_conn_open(&chk, sock_path, "load-check") == 0, "the checker's connection"))
		goto out;

	for (int round = 0; round < ROUNDS; round++) {
		char label[32];

		/* each slot's share of its ops in this round: all of it by the last */
		run_round(&chk, ops_per_slot * (uint64_t)(round + 1) / ROUNDS, &seed, &t);
		snprintf(label, sizeof(label), "round %d", round + 1);
		v = round_end(&chk, label);
		rss[round] = test_rss_kib(dpid);
		diag("round %d: %u kills so far, kvqd RSS %ld KiB, %u cached, %llu evictions", round + 1, t.kills,
		     rss[round], v.cached, (unsigned long long)v.evictions);
	}
	for (int i = 0; i < N_CLIENTS; i++) {
		ops_total += slots[i].ops;
		nospc += slots[i].nospc;
		reconnects += slots[i].reconnects;
		total_ns += slots[i].total_ns;
		if (slots[i].worst_ns > worst_ns)
			worst_ns = slots[i].worst_ns;
		if (slots[i].error)
			diag("client slot %d: %s", i, (const char *)slots[i].what);
	}
	ok(t.errors == 0, "every client process did its share with no refusal its books did not expect (%u failed)",
	   t.errors);
	ok(ops_total >= (uint64_t)N_CLIENTS * ops_per_slot, "%llu operations by %d clients (at least %llu each)",
	   (unsigned long long)ops_total, N_CLIENTS, (unsigned long long)ops_per_slot);
	ok(t.kills > 0 && t.kills_late == 0, "%u kill -9, each killed client's connection gone from Stats within %d "
	   "ms (worst %ld ms)", t.kills, LEASE_GONE_MS, t.worst_gone);
	/* the first round grows the daemon's heap to its working size */
	ok(rss[ROUNDS - 1] >= 0 && rss[ROUNDS - 1] <= rss[1] + 4096,
	   "kvqd's RSS stable between rounds: %ld, %ld, %ld KiB (at most 4 MiB over round 2)", rss[0], rss[1],
	   rss[2]);
	diag("figures: %llu operations, %u kills, %llu reconnects, %llu -ENOSPC, blocks leaked %u, "
	     "RSS per round %ld/%ld/%ld KiB, worst round trip %.2f ms, mean %.3f ms, %.1f s",
	     (unsigned long long)ops_total, t.kills, (unsigned long long)reconnects, (unsigned long long)nospc,
	     v.sealed_held + v.sealed_reserved + v.open_used, rss[0], rss[1], rss[2], (double)worst_ns / 1e6,
	     ops_total ? (double)total_ns / (double)ops_total / 1e6 : 0.0, (double)(now_ns() - t_start) / 1e9);

	/* the host tier's round, on a pool of its own (created by the first
	 * attach, with its tier); the tier's memfd is the daemon's, not its RSS
	 * until touched: the bound covers what the tier's books cost */
	pool_name = "loadtier";
	host_capacity = 2u << 20;
	t.errors = 0;
	t.kills_late = 0;
	for (int round = 0; round < 2; round++) {
		run_round(&chk, ops_per_slot + ops_per_slot * (uint64_t)(round + 1) / ROUNDS, &seed, &t);
		v = round_end(&chk, round ? "host tier round 2" : "host tier round 1");
		rss_tier[round] = test_rss_kib(dpid);
	}
	ok(t.errors == 0 && t.kills_late == 0, "host tier rounds: no unexpected refusal (%u failed), killed clients "
	   "gone in time (%u late)", t.errors, t.kills_late);
	ok(v.tier_capacity > 0 && v.tier_demotions > 0 && v.tier_promotions > 0 &&
	   v.tier_records <= v.tier_capacity / 1024,
	   "host tier rounds: %llu blocks demoted, %llu promoted by lookups, %llu records held in %llu bytes",
	   (unsigned long long)v.tier_demotions, (unsigned long long)v.tier_promotions,
	   (unsigned long long)v.tier_records, (unsigned long long)v.tier_capacity);
	/* under AddressSanitizer the daemon's RSS carries its shadow and
	 * quarantine, which grow with the heap: there only the second round
	 * against the first tells a leak */
	if (sanitized(dpid))
		diag("kvqd runs under AddressSanitizer: its RSS from start %ld KiB to %ld is not judged", rss_start,
		     rss_tier[1]);
	else
		ok(rss_start > 0 && rss_tier[1] >= 0 && rss_tier[1] - rss_start <= 16384,
		   "kvqd's RSS within 16 MiB of its start after the tier's rounds: %ld -> %ld KiB (tier %llu KiB)",
		   rss_start, rss_tier[1], (unsigned long long)(host_capacity >> 10));
	ok(rss_tier[0] > 0 && rss_tier[1] >= 0 && rss_tier[1] <= rss_tier[0] + 4096,
	   "kvqd's RSS stable between the tier's rounds: %ld, %ld KiB (at most 4 MiB more)", rss_tier[0], rss_tier[1]);
	kvq_conn_close(&chk);
out:
	kill(dpid, SIGTERM);
	ok(waitpid(dpid, &st, 0) == dpid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvqd exits cleanly on SIGTERM");
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd) != 0)
			diag("could not remove %s", tmpdir);
	}
	return done_testing();
}
