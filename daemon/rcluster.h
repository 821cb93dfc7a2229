/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A Redis Cluster client on the daemon's event loop, over hiredis 0.14's
 * asynchronous API and its libevent adapter (hiredis 0.14 knows nothing of
 * clusters).  It keeps the slot map (CLUSTER SLOTS), one connection per
 * master, follows MOVED and ASK, and ends every request exactly once: with
 * a reply, or with a failure status (the table below) within the request's
 * bound.  docs/DESIGN.md, "Remote tier".
 *
 * Statuses are negated errno values (kvq_strerror() names them):
 * -ETIMEDOUT the request's bound passed; -ECONNRESET its node's connection
 * failed or was lost (the node may have died: the map is asked again);
 * -ENETDOWN no map (no node reachable), the slot is not served, or the
 * cluster said CLUSTERDOWN; -ELOOP more redirections than allowed; -EACCES
 * the cluster refused AUTH; -EAGAIN (returned by the call, never through a
 * callback) too many requests in flight; -ECANCELED the client was freed.
 *
 * The process must ignore SIGPIPE (hiredis writes with write(2)); kvqd does.
 * hiredis resolves a host name with a blocking getaddrinfo(3) on the loop:
 * give seeds as addresses (the cluster names its nodes by address unless
 * told otherwise).
 */
#ifndef KVQD_RCLUSTER_H
#define KVQD_RCLUSTER_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct redisReply;
typedef struct kvq_rcluster kvq_rcluster;

#define KVQ_RCLUSTER_SLOTS 16384

/* The failures, one row each: the counter's index, its name, the status a
 * request ends with. */
#define KVQ_RCLUSTER_FAILURES(X) \
	X(TIMEOUT, "timeout", -ETIMEDOUT) \
	X(CONN, "conn", -ECONNRESET) \
	X(DOWN, "down", -ENETDOWN) \
	X(LOOP, "loop", -ELOOP) \
	X(AUTH, "auth", -EACCES) \
	X(FULL, "full", -EAGAIN) \
	X(CANCELLED, "cancelled", -ECANCELED)

enum kvq_rcluster_failure {
#define KVQ_RC_ENUM(id, name, status) KVQ_RC_##id,
	KVQ_RCLUSTER_FAILURES(KVQ_RC_ENUM)
#undef KVQ_RC_ENUM
	KVQ_RC_NFAILURES
};

struct kvq_rcluster_opts {
	const char *seeds;          /* "host:port,host:port,..." (at least one) */
	const char *user;           /* Redis ACL user for AUTH (NULL: the default user) */
	const char *password;       /* NULL: no AUTH */
	unsigned connect_ms;        /* bound on a connection's start (0: 1000) */
	unsigned request_ms;        /* bound on a request, redirections included (0: 1000) */
	unsigned max_inflight;      /* requests not yet ended (0: 1024) */
	unsigned max_redirects;     /* MOVED and ASK one request follows (0: 5) */
	size_t max_request_bytes;   /* a request's arguments together (0: 64 MiB) */
};

struct kvq_rcluster_stats {
	uint64_t requests;          /* taken (a callback will come) */
	uint64_t replies;           /* ended with a reply (status 0, error replies included) */
	uint64_t moved, ask;        /* redirections followed */
	uint64_t refreshes;         /* slot maps taken */
	uint64_t refresh_failures;  /* rounds in which no node gave a map */
	uint64_t failures[KVQ_RC_NFAILURES];  /* by kind (FULL: refused by the call) */
	unsigned inflight;          /* now */
	unsigned masters;           /* in the map now (0: none) */
	unsigned connections;       /* to nodes, open or opening, now */
};

/* A request's end: status 0 and the reply (hiredis's: valid during the call
 * only; it may be an error reply such as WRONGTYPE), or a status above and
 * NULL.  The callback may issue requests; it must not free the client. */
typedef void kvq_rcluster_cb(void *ctx, int status, struct redisReply *reply);

/* A client on base; it asks the seeds for the slot map at once and keeps
 * asking with a bounded backoff while no node answers, so it succeeds with
 * the cluster down.  Returns 0 and *ret, or -EINVAL (bad seeds or options,
 * err says which) or -ENOMEM. */
int kvq_rcluster_new(struct event_base *base, const struct kvq_rcluster_opts *o, kvq_rcluster **ret,
		     char *err, size_t errlen);

/* Ends every request still pending with -ECANCELED, closes every connection
 * and frees (NULL is fine).  Not from a request's callback. */
void kvq_rcluster_free(kvq_rcluster *rc);

/* Whether the client has a slot map (it has reached the cluster). */
int kvq_rcluster_ready(const kvq_rcluster *rc);

/* argv[0..argc) (binary-safe: argvlen gives each length) to the master of
 * key's slot; key is the command's key, also among the arguments.  The
 * arguments are copied.  Returns 0 (cb comes later from the loop, never
 * from within this call, exactly once) or -EAGAIN (max_inflight requests
 * pending), -E2BIG (over max_request_bytes), -EINVAL, -ENOMEM: then cb
 * never comes. */
int kvq_rcluster_command(kvq_rcluster *rc, const void *key, size_t keylen, int argc, const char *const *argv,
			 const size_t *argvlen, kvq_rcluster_cb *cb, void *ctx);

/* GET, SET (ttl_ms > 0: with PX ttl_ms), EXISTS and DEL of one key, as
 * kvq_rcluster_command. */
int kvq_rcluster_get(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx);
int kvq_rcluster_set(kvq_rcluster *rc, const void *key, size_t keylen, const void *val, size_t vallen,
		     uint64_t ttl_ms, kvq_rcluster_cb *cb, void *ctx);
int kvq_rcluster_exists(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx);
int kvq_rcluster_del(kvq_rcluster *rc, const void *key, size_t keylen, kvq_rcluster_cb *cb, void *ctx);

/* A string reply's bytes (reply->len of them and a terminator), taken out
 * of the reply within its callback: the caller frees them with free(3);
 * the reply goes without them.  Saves a copy of a large value.  NULL for
 * another type or -ENOMEM. */
char *kvq_rcluster_take_str(struct redisReply *reply);

/* The counters now. */
void kvq_rcluster_stats(const kvq_rcluster *rc, struct kvq_rcluster_stats *ret);

/* The failure row's name of a status ("timeout", ...; "ok" for 0, "error"
 * for another). */
const char *kvq_rcluster_status_name(int status);

/* CRC16 (XMODEM: polynomial 0x1021, initial 0), the Redis Cluster key
 * hash. */
uint16_t kvq_rcluster_crc16(const void *buf, size_t len);

/* key's slot: the CRC16 of its first {hash tag} when that is not empty,
 * else of the whole key, mod 16384. */
unsigned kvq_rcluster_slot(const void *key, size_t keylen);

#endif
