/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis Cluster client (daemon/rcluster.c) against a real cluster: six
 * redis-server processes on loopback (three masters, three replicas, a
 * password for the default user and a Redis ACL user), made with
 * redis-cli --cluster create in a temporary folder:
 *  - CRC16's vector, hash tags, and slots as the cluster computes them;
 *  - binary values SET and read back across every master; a TTL; EXISTS
 *    and DEL; keys of one hash tag on one master;
 *  - a slot migrated with its keys: MOVED followed; a slot being migrated:
 *    ASK followed; a client allowed one redirection meets two: "loop";
 *  - a wrong password: "auth"; past max_inflight: "full";
 *  - a master stopped (SIGSTOP): its requests end within the bound, the
 *    others are served, and it serves again after SIGCONT; a master killed
 *    (SIGKILL) with requests in flight: every one ends, and after its
 *    replica took over requests succeed; the whole cluster stopped: a new
 *    client starts, its requests end at once with "down", and both clients
 *    join when the cluster is back;
 *  - every callback came exactly once (and, under AddressSanitizer, nothing
 *    leaked).
 * A Redis that cannot be started fails the test.  Every redis-server runs
 * in a process group of its own, dies with this process (PR_SET_PDEATHSIG)
 * and is killed at exit.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis.h>

#include "../tap.h"
#include "../redis_cluster.h"
#include "kvq_wire.h"
#include "rcluster.h"

#define REQUEST_MS 400
#define CONNECT_MS 300
#define NKEYS 300
#define MAX_OPS 8192
#define RC_SETTLE_MS 1500   /* past the client's longest backoff: its map is the cluster's */

static struct event_base *base;

/* --- requests and their callbacks --- */

struct op {
	int calls;
	int status;
	bool sync;            /* refused by the call: no callback */
	int type;             /* the reply's */
	long long integer;
	bool match;           /* a string reply equal to want */
	const char *want;
	size_t wantlen;
	double t_start, t_end;
};

static struct op ops[MAX_OPS];
static int nops, pending;

static void op_cb(void *ctx, int status, struct redisReply *r)
{
	struct op *o = ctx;

	if (++o->calls == 1)
		pending--;
	o->status = status;
	o->t_end = now_ms();
	if (!r)
		return;
	o->type = r->type;
	o->integer = r->integer;
	o->match = o->want && r->type == REDIS_REPLY_STRING && r->len == o->wantlen &&
		   !memcmp(r->str, o->want, o->wantlen);
}

static struct op *op_new(const char *want, size_t wantlen)
{
	struct op *o;

	if (nops >= MAX_OPS) {
		fprintf(stderr, "too many requests for the test's table\n");
		exit(99);
	}
	o = &ops[nops++];
	o->want = want;
	o->wantlen = wantlen;
	o->t_start = now_ms();
	pending++;
	return o;
}

/* The call's result: refused (no callback) leaves pending as it was. */
static int op_sent(struct op *o, int r)
{
	if (r < 0) {
		o->sync = true;
		o->status = r;
		pending--;
	}
	return r;
}

static struct op *get(kvq_rcluster *rc, const char *key, const char *want, size_t wantlen)
{
	struct op *o = op_new(want, wantlen);

	op_sent(o, kvq_rcluster_get(rc, key, strlen(key), op_cb, o));
	return o;
}

static struct op *set(kvq_rcluster *rc, const char *key, const void *val, size_t len, uint64_t ttl_ms)
{
	struct op *o = op_new(NULL, 0);

	op_sent(o, kvq_rcluster_set(rc, key, strlen(key), val, len, ttl_ms, op_cb, o));
	return o;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

/* Runs the loop until cond(arg) or ms passed; returns cond(arg). */
static bool run_until(bool (*cond)(const void *), const void *arg, int ms)
{
	double end = now_ms() + ms;

	while (!cond(arg) && now_ms() < end)
		event_base_loop(base, EVLOOP_ONCE);
	return cond(arg);
}

static bool none_pending(const void *arg)
{
	(void)arg;
	return pending == 0;
}

static bool op_done(const void *arg)
{
	return ((const struct op *)arg)->calls > 0 || ((const struct op *)arg)->sync;
}

static bool client_ready(const void *arg)
{
	return kvq_rcluster_ready(arg);
}

static bool drain(int ms)
{
	return run_until(none_pending, NULL, ms);
}

static void run_ms(int ms)
{
	run_until(op_done, &(struct op){ 0 }, ms);
}

/* A GET of key, again every 100 ms until it reads want; returns whether it
 * did within ms. */
static bool get_until(kvq_rcluster *rc, const char *key, const char *want, size_t wantlen, int ms)
{
	double end = now_ms() + ms;
	int last = 0;

	while (now_ms() < end) {
		struct op *o = get(rc, key, want, wantlen);

		run_until(op_done, o, REQUEST_MS * 2);
		if (o->calls && o->match)
			return true;
		last = o->status;
		run_ms(100);
	}
	diag("GET %s: still %s", key, kvq_rcluster_status_name(last));
	return false;
}

/* A SET then GET of key, again until both work. */
static bool setget_until(kvq_rcluster *rc, const char *key, int ms)
{
	double end = now_ms() + ms;

	while (now_ms() < end) {
		struct op *s = set(rc, key, "back", 4, 0);

		run_until(op_done, s, REQUEST_MS * 2);
		if (s->calls && !s->status && get_until(rc, key, "back", 4, 1))
			return true;
		run_ms(100);
	}
	return false;
}

/* A client of o (seeds: the first two nodes; timeouts: the test's). */
static kvq_rcluster *client_opts(struct kvq_rcluster_opts o)
{
	char seeds[64], err[256] = "";
	kvq_rcluster *rc = NULL;
	int r;

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d, 127.0.0.1:%d", ports[0], ports[1]);
	o.seeds = seeds;
	o.connect_ms = CONNECT_MS;
	o.request_ms = REQUEST_MS;
	r = kvq_rcluster_new(base, &o, &rc, err, sizeof(err));
	if (r < 0)
		diag("kvq_rcluster_new: %s (%s)", kvq_rcluster_status_name(r), err);
	return rc;
}

static kvq_rcluster *client(const char *user, const char *pass, unsigned max_inflight, unsigned max_redirects)
{
	return client_opts((struct kvq_rcluster_opts){ .user = user, .password = pass, .max_inflight = max_inflight,
						       .max_redirects = max_redirects });
}

static struct kvq_rcluster_stats stats(kvq_rcluster *rc)
{
	struct kvq_rcluster_stats st;

	kvq_rcluster_stats(rc, &st);
	return st;
}

static const char *const failure_names[] = {
#define KVQ_RC_NAME(id, name, status) name,
	KVQ_RCLUSTER_FAILURES(KVQ_RC_NAME)
#undef KVQ_RC_NAME
};

/* The row of a failure status, or -1. */
static int failure_index(int status)
{
	static const int statuses[] = {
#define KVQ_RC_STATUS(id, name, status) status,
		KVQ_RCLUSTER_FAILURES(KVQ_RC_STATUS)
#undef KVQ_RC_STATUS
	};

	for (int i = 0; i < KVQ_RC_NFAILURES; i++)
		if (status && statuses[i] == status)
			return i;
	return -1;
}

static void diag_stats(kvq_rcluster *rc)
{
	struct kvq_rcluster_stats st = stats(rc);

	diag("requests %llu replies %llu moved %llu ask %llu refreshes %llu (failed %llu) masters %u inflight %u",
	     (unsigned long long)st.requests, (unsigned long long)st.replies, (unsigned long long)st.moved,
	     (unsigned long long)st.ask, (unsigned long long)st.refreshes, (unsigned long long)st.refresh_failures,
	     st.masters, st.inflight);
	for (int i = 0; i < KVQ_RC_NFAILURES; i++)
		diag("  %s %llu", failure_names[i], (unsigned long long)st.failures[i]);
}

/* --- the checks --- */

static void check_slots(void)
{
	ok(kvq_rcluster_crc16("123456789", 9) == 0x31C3, "CRC16 of \"123456789\" is 0x31C3 (the cluster spec's vector)");
	ok(kvq_rcluster_slot("foo", 3) == 12182, "slot of foo is 12182");
	ok(kvq_rcluster_slot("{user1000}.following", 20) == kvq_rcluster_slot("{user1000}.followers", 20) &&
	   kvq_rcluster_slot("{user1000}.following", 20) == kvq_rcluster_slot("user1000", 8),
	   "a hash tag decides the slot");
	ok(kvq_rcluster_slot("foo{}{bar}", 10) == kvq_rcluster_crc16("foo{}{bar}", 10) % 16384,
	   "an empty hash tag is no tag: the whole key");
	ok(kvq_rcluster_slot("foo{{bar}}zap", 13) == kvq_rcluster_crc16("{bar", 4) % 16384,
	   "the tag runs from the first { to the next }");
	ok(kvq_rcluster_slot("foo{bar}{zap}", 13) == kvq_rcluster_crc16("bar", 3) % 16384, "only the first tag counts");
	ok(kvq_rcluster_slot("", 0) == 0 && kvq_rcluster_slot("{", 1) == kvq_rcluster_crc16("{", 1) % 16384,
	   "an empty key and an open brace alone");
}

/* Options kvq_rcluster_new refuses, with a reason. */
static void check_opts(void)
{
	static const struct {
		const char *seeds, *user, *password;
		unsigned request_ms;
	} bad[] = {
		{ "", NULL, NULL, 0 }, { "127.0.0.1", NULL, NULL, 0 }, { "127.0.0.1:0", NULL, NULL, 0 },
		{ "127.0.0.1:70000", NULL, NULL, 0 }, { "127.0.0.1:6379,:6380", NULL, NULL, 0 },
		{ "127.0.0.1:6379", "user", NULL, 0 }, { "127.0.0.1:6379", NULL, NULL, 3600001 },
	};
	struct event_base *b = event_base_new();
	int refused = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvq_rcluster_opts o = { .seeds = bad[i].seeds, .user = bad[i].user, .password = bad[i].password,
					       .request_ms = bad[i].request_ms };
		kvq_rcluster *rc = NULL;
		char err[256] = "";

		refused += kvq_rcluster_new(b, &o, &rc, err, sizeof(err)) == -EINVAL && !rc && err[0];
	}
	ok(refused == (int)(sizeof(bad) / sizeof(bad[0])), "bad seeds and options are refused with a reason (%d)",
	   refused);
	event_base_free(b);
}

static void check_keyslot(void)
{
	int same = 0;

	for (int i = 0; i < 50; i++) {
		char key[64];
		redisReply *r;

		snprintf(key, sizeof(key), i % 3 ? "k%d{t%d}x" : "{}k%d:%d", i, i * 7);
		r = admin(ports[0], "CLUSTER KEYSLOT %s", key);
		same += r && r->type == REDIS_REPLY_INTEGER && r->integer == kvq_rcluster_slot(key, strlen(key));
		freeReplyObject(r);
	}
	ok(same == 50, "50 keys' slots are the cluster's (CLUSTER KEYSLOT): %d", same);
}

static char *values[NKEYS];
static size_t lens[NKEYS];

static void key_name(char *buf, size_t len, int i)
{
	snprintf(buf, len, "key:%d", i);
}

static void check_binary(kvq_rcluster *rc)
{
	struct op *sets[NKEYS], *gets[NKEYS];
	int set_ok = 0, get_ok = 0, m[8], nm, on_all = 0;

	for (int i = 0; i < NKEYS; i++) {
		char key[32];

		lens[i] = i == 0 ? 0 : (size_t)(tap_rand() % 3000);
		values[i] = malloc(lens[i] + 1);
		for (size_t j = 0; j < lens[i]; j++)
			values[i][j] = (char)(j % 5 == 0 ? 0 : j % 7 == 0 ? '\r' : j % 11 == 0 ? '\n' : tap_rand());
		key_name(key, sizeof(key), i);
		sets[i] = set(rc, key, values[i], lens[i], 0);
	}
	ok(drain(5000), "%d SETs of binary values ended", NKEYS);
	for (int i = 0; i < NKEYS; i++)
		set_ok += sets[i]->calls == 1 && !sets[i]->status && sets[i]->type == REDIS_REPLY_STATUS;
	ok(set_ok == NKEYS, "every SET answered OK: %d", set_ok);
	for (int i = 0; i < NKEYS; i++) {
		char key[32];

		key_name(key, sizeof(key), i);
		gets[i] = get(rc, key, values[i], lens[i]);
	}
	ok(drain(5000), "%d GETs ended", NKEYS);
	for (int i = 0; i < NKEYS; i++)
		get_ok += gets[i]->calls == 1 && !gets[i]->status && gets[i]->match;
	ok(get_ok == NKEYS, "every GET read its bytes back (zeros, CR and LF in them): %d", get_ok);
	nm = masters(m, 8);
	for (int i = 0; i < nm; i++) {
		redisReply *r = admin(m[i], "DBSIZE");

		on_all += r && r->type == REDIS_REPLY_INTEGER && r->integer > 0;
		freeReplyObject(r);
	}
	ok(nm == 3 && on_all == 3, "every one of the %d masters holds some of the keys", nm);
}

static void check_helpers(kvq_rcluster *rc)
{
	struct op *s, *e, *d, *e2, *d2;
	redisReply *r;
	int port;

	s = set(rc, "ttl-key", "x", 1, 5000);
	drain(2000);
	port = master_of(kvq_rcluster_slot("ttl-key", 7));
	r = admin(port, "PTTL ttl-key");
	ok(!s->status && r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 && r->integer <= 5000,
	   "SET with a TTL: PX 5000 (PTTL %lld)", r ? r->integer : -1);
	freeReplyObject(r);
	e = op_new(NULL, 0);
	op_sent(e, kvq_rcluster_exists(rc, "key:1", 5, op_cb, e));
	d = op_new(NULL, 0);
	op_sent(d, kvq_rcluster_del(rc, "key:1", 5, op_cb, d));
	e2 = op_new(NULL, 0);
	op_sent(e2, kvq_rcluster_exists(rc, "key:1", 5, op_cb, e2));
	d2 = op_new(NULL, 0);
	op_sent(d2, kvq_rcluster_del(rc, "key:1", 5, op_cb, d2));
	drain(2000);
	ok(e->type == REDIS_REPLY_INTEGER && e->integer == 1 && d->integer == 1 && e2->integer == 0 && d2->integer == 0,
	   "EXISTS 1, DEL 1, then EXISTS 0 and DEL 0");
}

static void check_tags(kvq_rcluster *rc)
{
	unsigned slot = kvq_rcluster_slot("tag7", 4);
	int m[8], nm = masters(m, 8), holders = 0, keys = 0;

	for (int i = 0; i < 20; i++) {
		char key[32];

		snprintf(key, sizeof(key), "{tag7}:%d", i);
		set(rc, key, key, strlen(key), 0);
	}
	drain(2000);
	for (int i = 0; i < nm; i++) {
		redisReply *r = admin(m[i], "CLUSTER COUNTKEYSINSLOT %u", slot);

		if (r && r->type == REDIS_REPLY_INTEGER && r->integer > 0) {
			holders++;
			keys += (int)r->integer;
		}
		freeReplyObject(r);
	}
	ok(holders == 1 && keys == 20, "20 keys of one hash tag are on one master (%d holders, %d keys)", holders,
	   keys);
}

/* MOVED, ASK and a redirection loop, on the slot of {mig}. */
static void check_redirections(kvq_rcluster *rc)
{
	kvq_rcluster *one = client(ACL_USER, ACL_PASS, 0, 1);
	unsigned slot = kvq_rcluster_slot("mig", 3);
	int a = master_of(slot), m[8], nm = masters(m, 8), b = 0, c = 0;
	char ida[64], idb[64], idc[64];
	struct kvq_rcluster_stats before;
	struct op *o, *o2;
	bool mig;

	for (int i = 0; i < nm; i++)
		if (m[i] != a && !b)
			b = m[i];
		else if (m[i] != a && m[i] != b && !c)
			c = m[i];
	ok(one && run_until(client_ready, one, 3000), "a client allowed one redirection has the map");
	set(rc, "{mig}a", "va", 2, 0);
	set(rc, "{mig}b", "vb", 2, 0);
	drain(2000);
	if (!ok(a && b && c && node_id(a, ida, sizeof(ida)) && node_id(b, idb, sizeof(idb)) &&
		node_id(c, idc, sizeof(idc)), "three masters: slot %u on %d, then %d, then %d", slot, a, b, c)) {
		kvq_rcluster_free(one);
		return;
	}

	/* the slot and its keys to b: MOVED */
	mig = admin_ok(b, "CLUSTER SETSLOT %u IMPORTING %s", slot, ida) &&
	      admin_ok(a, "CLUSTER SETSLOT %u MIGRATING %s", slot, idb) &&
	      admin_ok(a, "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s KEYS {mig}a {mig}b", b, "", PASS) &&
	      admin_ok(b, "CLUSTER SETSLOT %u NODE %s", slot, idb) &&
	      admin_ok(a, "CLUSTER SETSLOT %u NODE %s", slot, idb) &&
	      admin_ok(c, "CLUSTER SETSLOT %u NODE %s", slot, idb);
	ok(mig, "slot %u migrated to %d with its keys", slot, b);
	before = stats(rc);
	o = get(rc, "{mig}a", "va", 2);
	drain(2000);
	ok(o->calls == 1 && o->match && stats(rc).moved > before.moved, "MOVED followed: the value from the new master");

	/* the slot being migrated on to c, {mig}a moved already: ASK */
	mig = admin_ok(c, "CLUSTER SETSLOT %u IMPORTING %s", slot, idb) &&
	      admin_ok(b, "CLUSTER SETSLOT %u MIGRATING %s", slot, idc) &&
	      admin_ok(b, "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s KEYS {mig}a", c, "", PASS);
	ok(mig, "slot %u being migrated to %d, one key moved", slot, c);
	before = stats(rc);
	o = get(rc, "{mig}a", "va", 2);
	o2 = get(rc, "{mig}b", "vb", 2);
	drain(2000);
	ok(o->calls == 1 && o->match && stats(rc).ask == before.ask + 1, "ASK followed: the moved key from the importing master");
	ok(o2->calls == 1 && o2->match, "the key not moved yet from the migrating master");
	ok(stats(rc).moved == before.moved, "ASK did not change the map (no MOVED after it)");
	o = get(one, "{mig}a", "va", 2);
	drain(2000);
	ok(o->calls == 1 && o->status == -ELOOP && stats(one).failures[KVQ_RC_LOOP] == 1,
	   "MOVED then ASK past one redirection allowed: %s", kvq_rcluster_status_name(o->status));

	mig = admin_ok(b, "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s KEYS {mig}b", c, "", PASS) &&
	      admin_ok(c, "CLUSTER SETSLOT %u NODE %s", slot, idc) &&
	      admin_ok(b, "CLUSTER SETSLOT %u NODE %s", slot, idc) &&
	      admin_ok(a, "CLUSTER SETSLOT %u NODE %s", slot, idc);
	o = get(rc, "{mig}b", "vb", 2);
	drain(2000);
	ok(mig && o->calls == 1 && o->match, "the migration ended: the other key from the new master");
	kvq_rcluster_free(one);
	ok(wait_cluster_ok(5000), "the cluster is ok after the migrations");
}

static void check_auth(void)
{
	kvq_rcluster *bad = client(NULL, "wrong", 0, 0), *bad_user = client(ACL_USER, "wrong", 0, 0);
	kvq_rcluster *dflt = client(NULL, PASS, 0, 0);
	struct op *o1, *o2, *o3, *o4;

	o1 = get(bad, "key:2", NULL, 0);
	o2 = get(bad_user, "key:2", NULL, 0);
	drain(3000);
	o3 = get(bad, "key:2", NULL, 0);
	drain(1000);
	ok(o1->status == -EACCES && o2->status == -EACCES && o3->status == -EACCES,
	   "a wrong password (default user, ACL user): %s, %s, then at once %s", kvq_rcluster_status_name(o1->status),
	   kvq_rcluster_status_name(o2->status), kvq_rcluster_status_name(o3->status));
	ok(stats(bad).failures[KVQ_RC_AUTH] == 2 && !kvq_rcluster_ready(bad), "counted as auth, no map");
	o4 = get(dflt, "key:2", values[2], lens[2]);
	drain(3000);
	ok(o4->match, "the default user with its password reads");
	kvq_rcluster_free(bad);
	kvq_rcluster_free(bad_user);
	kvq_rcluster_free(dflt);
}

static void check_full(void)
{
	kvq_rcluster *rc = client(ACL_USER, ACL_PASS, 4, 0);
	struct op *o[5], *big;
	int replied = 0;

	run_until(client_ready, rc, 3000);
	for (int i = 0; i < 5; i++)
		o[i] = get(rc, "key:3", values[3], lens[3]);
	ok(o[4]->sync && o[4]->status == -EAGAIN && stats(rc).failures[KVQ_RC_FULL] == 1,
	   "a fifth request with 4 in flight allowed: %s", kvq_rcluster_status_name(o[4]->status));
	drain(2000);
	for (int i = 0; i < 4; i++)
		replied += o[i]->match;
	ok(replied == 4 && stats(rc).inflight == 0, "the four in flight were answered");
	kvq_rcluster_free(rc);

	rc = client_opts((struct kvq_rcluster_opts){ .user = ACL_USER, .password = ACL_PASS, .max_request_bytes = 1000 });
	big = op_new(NULL, 0);
	op_sent(big, kvq_rcluster_set(rc, "big", 3, values[5], 1000, 0, op_cb, big));
	ok(big->sync && big->status == -E2BIG, "a request over max_request_bytes: refused by the call (%s)",
	   kvq_strerror(big->status));
	kvq_rcluster_free(rc);
}

/* Keys of key:N whose master is (or is not) port, n at most; returns how
 * many. */
static int keys_on(int port, bool on, int *out, int n)
{
	redisReply *r = admin(live_port(), "CLUSTER SLOTS");
	int k = 0;

	for (int i = 2; r && r->type == REDIS_REPLY_ARRAY && i < NKEYS && k < n; i++) {
		char key[32];
		long long slot;
		int owner = 0;

		key_name(key, sizeof(key), i);
		slot = kvq_rcluster_slot(key, strlen(key));
		for (size_t j = 0; j < r->elements; j++)
			if (slot >= r->element[j]->element[0]->integer && slot <= r->element[j]->element[1]->integer)
				owner = (int)r->element[j]->element[2]->element[1]->integer;
		if ((owner == port) == on)
			out[k++] = i;
	}
	freeReplyObject(r);
	return k;
}

static void check_stopped(kvq_rcluster *rc)
{
	int m[8], nm = masters(m, 8), port = m[nm - 1], idx = node_index(port);
	int hung[10], fine[10], nh = keys_on(port, true, hung, 10), nf = keys_on(port, false, fine, 10);
	struct op *oh[10], *of[10];
	int bounded = 0, served = 0;
	char key[32];

	kill(pids[idx], SIGSTOP);
	for (int i = 0; i < nh; i++) {
		key_name(key, sizeof(key), hung[i]);
		oh[i] = get(rc, key, values[hung[i]], lens[hung[i]]);
	}
	for (int i = 0; i < nf; i++) {
		key_name(key, sizeof(key), fine[i]);
		of[i] = get(rc, key, values[fine[i]], lens[fine[i]]);
	}
	drain(REQUEST_MS + 1000);
	for (int i = 0; i < nh; i++)
		bounded += oh[i]->calls == 1 && (oh[i]->status == -ETIMEDOUT || oh[i]->status == -ECONNRESET) &&
			   oh[i]->t_end - oh[i]->t_start <= REQUEST_MS + 150;
	for (int i = 0; i < nf; i++)
		served += of[i]->calls == 1 && of[i]->match;
	ok(nh == 10 && bounded == nh, "a stopped master: its %d requests ended within %d ms (timeout or conn): %d",
	   nh, REQUEST_MS, bounded);
	ok(nf == 10 && served == nf, "the other masters served theirs meanwhile: %d of %d", served, nf);
	ok(stats(rc).failures[KVQ_RC_TIMEOUT] >= 1, "counted as timeouts");
	kill(pids[idx], SIGCONT);
	key_name(key, sizeof(key), hung[0]);
	ok(get_until(rc, key, values[hung[0]], lens[hung[0]], 15000), "after SIGCONT its keys are served again");
	ok(wait_cluster_ok(15000), "the cluster is ok again");
}

static void check_killed(kvq_rcluster *rc)
{
	int m[8], nm = masters(m, 8), port = m[0], idx = node_index(port), on[10];
	struct op *o[NKEYS];
	int ended = 0, answered = 0, kinds[KVQ_RC_NFAILURES + 1] = { 0 }, n = keys_on(port, true, on, 10);
	char key[32];
	double t0;
	bool back;
	redisReply *r;

	for (int i = 2; i < NKEYS; i++) {
		key_name(key, sizeof(key), i);
		o[i] = get(rc, key, values[i], lens[i]);
	}
	/* replication is asynchronous: what the replica lacks is lost with the master */
	r = admin(port, "WAIT 1 5000");
	ok(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1, "its replica has every write (WAIT)");
	freeReplyObject(r);
	diag("killing the master on port %d (%d of its keys among key:N, %d masters)", port, n, nm);
	if (!ok(idx >= 0 && pids[idx] > 0, "the master's process"))
		return;
	kill(-pids[idx], SIGKILL);
	waitpid(pids[idx], NULL, 0);
	pids[idx] = 0;
	drain(REQUEST_MS + 2000);
	for (int i = 2; i < NKEYS; i++) {
		int k = failure_index(o[i]->status);

		ended += o[i]->calls == 1;
		kinds[k < 0 ? KVQ_RC_NFAILURES : k] += o[i]->status != 0;
		answered += o[i]->match;
	}
	diag("the requests in flight: %d answered, %d timeout, %d conn, %d down, %d other", answered,
	     kinds[KVQ_RC_TIMEOUT], kinds[KVQ_RC_CONN], kinds[KVQ_RC_DOWN], kinds[KVQ_RC_NFAILURES]);
	ok(ended == NKEYS - 2, "a master killed with %d requests in flight: every one ended (%d)", NKEYS - 2, ended);
	t0 = now_ms();
	key_name(key, sizeof(key), on[0]);
	back = n > 0 && get_until(rc, key, values[on[0]], lens[on[0]], 20000);
	if (!ok(back, "its replica took over: its keys are read again (after %.1f s)", (now_ms() - t0) / 1e3))
		diag_stats(rc);
	ok(wait_cluster_ok(15000), "the cluster is ok after the failover");
	run_ms(RC_SETTLE_MS);
	ok(stats(rc).masters == 3 && stats(rc).connections == 3,
	   "the client's map has the 3 masters, and its connections are theirs: the dead master's is closed (%u, %u)",
	   stats(rc).masters, stats(rc).connections);
}

static void check_restart(kvq_rcluster *rc)
{
	kvq_rcluster *late;
	struct op *o1, *o2, *o3;
	double t0;
	bool started = true;

	for (int i = 0; i < NODES; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGTERM);
			waitpid(pids[i], NULL, 0);
			pids[i] = 0;
		}
	o1 = get(rc, "key:4", NULL, 0);
	drain(REQUEST_MS + 1000);
	ok(o1->calls == 1 && o1->status < 0, "the whole cluster stopped: a request fails (%s)",
	   kvq_rcluster_status_name(o1->status));
	late = client(ACL_USER, ACL_PASS, 0, 0);
	t0 = now_ms();
	o2 = get(late, "key:4", NULL, 0);
	run_until(op_done, o2, 2000);
	ok(late && o2->calls == 1 && o2->status == -ENETDOWN && now_ms() - t0 < 200,
	   "a client made while the cluster is down: made, its request fails at once with down (%s, %.0f ms)",
	   kvq_rcluster_status_name(o2->status), now_ms() - t0);
	run_ms(300);
	t0 = now_ms();
	o3 = get(late, "key:4", NULL, 0);
	run_until(op_done, o3, 2000);
	ok(o3->status == -ENETDOWN && now_ms() - t0 < 50, "and the next at once too (%.0f ms)", now_ms() - t0);
	for (int i = 0; i < NODES; i++)
		started &= node_start(i);
	ok(started && wait_cluster_ok(30000), "the cluster started again");
	ok(setget_until(late, "late-key", 15000) && kvq_rcluster_ready(late), "the late client joined it");
	ok(setget_until(rc, "early-key", 15000), "the first client too");
	ok(stats(late).refresh_failures >= 1, "the late client's rounds failed while it was down (%llu)",
	   (unsigned long long)stats(late).refresh_failures);
	kvq_rcluster_free(late);
}

int main(void)
{
	struct event *tick;
	struct timeval tv = { 0, 5000 };
	kvq_rcluster *rc;
	int once = 0, sync_ok = 0;

	check_slots();
	check_opts();
	if (!cluster_up())
		return done_testing();
	check_keyslot();

	base = event_base_new();
	tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	event_add(tick, &tv);
	rc = client(ACL_USER, ACL_PASS, MAX_OPS, 0);
	ok(rc && run_until(client_ready, rc, 3000) && stats(rc).masters == 3, "a client (ACL user) has the map: 3 masters");
	check_binary(rc);
	check_helpers(rc);
	check_tags(rc);
	check_redirections(rc);
	check_auth();
	check_full();
	check_stopped(rc);
	check_killed(rc);
	check_restart(rc);
	kvq_rcluster_free(rc);

	for (int i = 0; i < nops; i++) {
		once += !ops[i].sync && ops[i].calls == 1;
		sync_ok += ops[i].sync && ops[i].calls == 0;
	}
	ok(once + sync_ok == nops && pending == 0,
	   "every request's callback came exactly once (%d), none for those refused (%d)", once, sync_ok);
	for (int i = 0; i < NKEYS; i++)
		free(values[i]);
	event_free(tick);
	event_base_free(base);
	return done_testing();
}
