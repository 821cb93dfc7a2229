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

#include <event2/event.h>

#include "conf.h"
#include "hist.h"
#include "pools.h"

typedef struct kvq_server kvq_server;

/* Most connections at once (live and dying ones); beyond, accept closes.
 * (Reply bytes queued per client: KVQ_PEER_OUT_HIGH, daemon/peer.h.) */
#define KVQ_SERVER_MAX_CONNS 1024u

/*
 * A server on base with config (borrowed: it must outlive the server, or be
 * replaced with kvq_server_set_config), default backend name ("auto", "host",
 * "cuda") and device.  Pools listed in config without create_on_attach are
 * allocated now.  Returns 0 and *ret, or a negative code with err set.
 */
int kvq_server_new(struct event_base *base, const struct kvq_config *config, const char *backend,
		   int device, kvq_server **ret, char *err, size_t errlen);

/* Listens on a new socket at path (a stale socket file is replaced).
 * Returns 0 or a negative errno with err set. */
int kvq_server_listen_path(kvq_server *s, const char *path, char *err, size_t errlen);

/* Listens on fd, an already bound and listening Unix stream socket (socket
 * activation); the server owns it.  Returns 0 or a negative errno. */
int kvq_server_listen_fd(kvq_server *s, int fd, char *err, size_t errlen);

/* Takes ACLs and quotas of existing pools from config (SIGHUP); config
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

/* Latency histogram of the requests of row i of the request table, with
 * the row's name in *ret_name; NULL past the last row. */
const struct kvq_hist *kvq_server_latency(const kvq_server *s, size_t i, const char **ret_name);

/* Closes every connection, frees the pools, unlinks a socket it created.
 * NULL is fine. */
void kvq_server_free(kvq_server *s);

#endif
