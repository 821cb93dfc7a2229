/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvqd server: the listening socket and client connections on one
 * libevent loop, each request answered through the table of
 * daemon/request.h against the daemon's state (daemon/state.h: pools,
 * connections, leases).
 *
 * Each connection gets the peer's SO_PEERCRED identity and a pidfd at
 * accept.  Every request is checked (kvq_frame_check, then against the
 * connection's state and lease) before anything changes; an error reply
 * changes nothing.  When a connection closes its lease (daemon/lease.h) is
 * dropped at once if the peer process lives on, or, if it is dying, only when
 * its pidfd reports the exit: a dying process's socket closes before its GPU
 * work has stopped.
 */
#ifndef KVQD_SERVER_H
#define KVQD_SERVER_H

#include <stdint.h>

#include <event2/event.h>

#include "conf.h"
#include "hist.h"
#include "pools.h"

typedef struct kvq_server kvq_server;
struct kvq_keep;

/*
 * File descriptors kept for kvqd's own use (standard streams, the listening
 * and metrics sockets, the event loop, a spare for refusals, a memfd per
 * pool up to kvqd.conf's 64): the connection limit is at most half of
 * RLIMIT_NOFILE less these, each connection taking two (its socket and its
 * peer's pidfd).
 */
#define KVQ_SERVER_FD_RESERVE 96u
/* Connections accepted (or refused) per turn of the loop. */
#define KVQ_SERVER_ACCEPT_BATCH 64u

/*
 * What the limits (kvqd.conf, conf_keys.h) did, for the metrics: X(id,
 * family, label, help); rows of one family are adjacent, its first row has
 * the help.
 */
#define KVQ_SERVER_COUNTERS(X) \
	X(REFUSED_MAX, "kvq_connections_refused_total", "limit=\"max_connections\"", \
	  "Connections refused, by the limit that refused them (each told why).") \
	X(REFUSED_UID, "kvq_connections_refused_total", "limit=\"max_connections_per_uid\"", NULL) \
	X(REFUSED_FDS, "kvq_connections_refused_total", "limit=\"file_descriptors\"", NULL) \
	X(TIMEOUT_HANDSHAKE, "kvq_connection_timeouts_total", "timeout=\"handshake\"", \
	  "Connections closed by a timeout (handshake_timeout_ms, idle_timeout_ms).") \
	X(TIMEOUT_IDLE, "kvq_connection_timeouts_total", "timeout=\"idle\"", NULL) \
	X(ACCEPT_PAUSES, "kvq_accept_pauses_total", NULL, \
	  "Times kvqd stopped accepting for accept_pause_ms: out of file descriptors or at max_connections.") \
	X(BACKPRESSURE, "kvq_backpressure_total", NULL, \
	  "Times a connection's queued replies reached max_output and kvqd stopped reading its requests.")

enum {
#define KVQ_SERVER_COUNTER_ID(id, family, label, help) KVQ_SERVER_##id,
	KVQ_SERVER_COUNTERS(KVQ_SERVER_COUNTER_ID)
#undef KVQ_SERVER_COUNTER_ID
	KVQ_SERVER_N_COUNTERS
};

/*
 * A server on base with config (borrowed: it must outlive the server, or be
 * replaced with kvq_server_set_config), default backend name ("auto", "host",
 * "cuda") and device.  Pools listed in config without create_on_attach are
 * allocated now, and with keep (NULL: none; daemon/restart.h) the pools an
 * earlier kvqd left are taken back.  Returns 0 and *ret, or a negative code
 * with err set.
 */
int kvq_server_new(struct event_base *base, const struct kvq_config *config, const char *backend,
		   int device, const struct kvq_keep *keep, kvq_server **ret, char *err, size_t errlen);

/* At a stop, before kvq_server_free: every pool's books sealed as they are
 * now, so that what the clients hold is held at the next start. */
void kvq_server_keep(kvq_server *s);

/* Listens on a new socket at path (a stale socket file is replaced).
 * Returns 0 or a negative errno with err set. */
int kvq_server_listen_path(kvq_server *s, const char *path, char *err, size_t errlen);

/* Listens on fd, an already bound and listening Unix stream socket (socket
 * activation); the server owns it.  Returns 0 or a negative errno. */
int kvq_server_listen_fd(kvq_server *s, int fd, char *err, size_t errlen);

/* The connection limit now: max_connections, or fewer when the file
 * descriptors allow fewer (KVQ_SERVER_FD_RESERVE). */
uint32_t kvq_server_max_connections(const kvq_server *s);

/* Counter i (KVQ_SERVER_*) with its family, label (NULL: none) and help
 * (NULL: the family's first row has it); -ENOENT past the last. */
int kvq_server_counter(const kvq_server *s, int i, uint64_t *ret_value, const char **ret_family,
		       const char **ret_label, const char **ret_help);

/* Takes ACLs, quotas and limits from config (SIGHUP); config
 * replaces the borrowed one.  Geometry changes of a pool are ignored; a new
 * pool waits for the next start, with a log line. */
void kvq_server_set_config(kvq_server *s, const struct kvq_config *config);

/* One-line status for logs and sd_notify STATUS. */
void kvq_server_status(const kvq_server *s, char *buf, size_t len);

/* The i-th allocated pool (0, 1, ... in the server's order).  Returns 0 and
 * *ret (strings valid until the pool is dropped), or -ENOENT past the end. */
int kvq_server_pool_info(const kvq_server *s, uint32_t i, struct kvq_pools_info *ret);

/* Live connections, and connections closed whose exiting peer still holds
 * a lease. */
void kvq_server_connections(const kvq_server *s, uint32_t *ret_live, uint32_t *ret_exiting);

/* Error replies are counted per row of the request table and status, up to
 * KVQ_SERVER_ERR_CODES statuses a row; further ones as KVQ_SERVER_ERR_OTHER. */
#define KVQ_SERVER_ERR_CODES 16u
#define KVQ_SERVER_ERR_OTHER INT32_MIN

/* The i-th status (0, 1, ...) row's error replies had, with the row's name
 * and the count.  Returns 0, or -ENOENT past the last status or row. */
int kvq_server_request_errors(const kvq_server *s, size_t row, size_t i, const char **ret_request, int *ret_code,
			      uint64_t *ret_n);

/* Latency histogram of the requests of row i of the request table, with
 * the row's name in *ret_name; NULL past the last row. */
const struct kvq_hist *kvq_server_latency(const kvq_server *s, size_t i, const char **ret_name);

/* Closes every connection, frees the pools, unlinks a socket it created.
 * NULL is fine. */
void kvq_server_free(kvq_server *s);

#endif
