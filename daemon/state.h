/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the request handlers work on: the configuration, the pool records and
 * the connections, each with its peer's identity, its pool and its lease,
 * and the accounting over them (quotas, ACLs).  No sockets here: the server
 * (daemon/server.c) accepts and closes connections and moves their bytes
 * (daemon/peer.h); tests build a state and connections in process.
 *
 * When a connection closes, its lease goes at once if the peer process
 * lives on; if the peer is exiting the connection moves to the dying list
 * and keeps its lease (it counts for quotas and Stats) until the peer has
 * exited, since a dying process's socket closes before its GPU work stops.
 */
#ifndef KVQD_STATE_H
#define KVQD_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "conf.h"
#include "frame.h"
#include "lease.h"
#include "pools.h"

/* Supplementary groups taken from the peer for ACLs; more are ignored. */
#define KVQ_CONN_MAX_GROUPS 64

struct kvq_state;
struct kvq_peer;
struct event;

struct kvq_conn {
	struct kvq_state *st;
	struct kvq_conn *prev, *next;            /* in st->conns, or st->dying when exiting */
	bool exiting;                            /* closed; the lease waits for the peer's exit */
	uint64_t id;
	char name[KVQ_PROTO_MAX_NAME + 1];       /* the Hello's label */
	uid_t uid;                               /* the peer's identity (SO_PEERCRED) */
	gid_t groups[KVQ_CONN_MAX_GROUPS + 1];   /* primary gid first */
	size_t n_groups;
	pid_t pid;
	bool hello;
	struct kvq_pools_rec *pool;              /* attached to, or NULL */
	int kept;                                /* its entry in the pool's books (daemon/restart.h), or -1 */
	uint64_t holder;                         /* AttachReply.holder: its holds' name across a restart */
	kvq_lease *lease;                        /* what it holds there */
	/* the server's: */
	struct kvq_peer *peer;                   /* the socket; NULL once closed */
	int pidfd;                               /* -1 when there is none */
	struct event *pev;                       /* exiting: waits for the pidfd */
	struct event *tev;                       /* the handshake and idle timeouts */
	int64_t accepted_ms, active_ms;          /* CLOCK_MONOTONIC: accept, the last request */
	int64_t timing_ms;                       /* its attach, then its last attention report taken */
	struct kvq_reply *waiting;               /* a reply that waits (request.h, struct kvq_wait), or NULL */
	struct event *wev;                       /* its bound */
	size_t wait_row;                         /* its request's row (daemon/request.h) */
	void (*resume)(struct kvq_conn *c);      /* the server's: finish the waiting reply now */
};

struct kvq_state {
	const struct kvq_config *cfg;            /* borrowed */
	struct kvq_pools pools;
	struct kvq_conn *conns;                  /* live */
	struct kvq_conn *dying;                  /* exiting, lease kept */
	uint32_t n_conns;                        /* in both lists */
	uint64_t next_id;
	struct timespec started;                 /* CLOCK_MONOTONIC */
};

/* A state with cfg (borrowed: it must outlive the state, or be replaced with
 * kvq_state_set_config), the default backend ("auto", "host", "cuda") and
 * device.  Pools listed in cfg without create_on_attach are allocated now,
 * and, with keep (NULL: none), every pool a restart left is taken back
 * (daemon/restart.h).  Returns 0, or a negative code with err set and
 * nothing to free. */
int kvq_state_init(struct kvq_state *st, const struct kvq_config *cfg, const char *backend, int device,
		   const struct kvq_keep *keep, char *err, size_t errlen);

/* Frees the pools; every connection must be freed first. */
void kvq_state_fini(struct kvq_state *st);

/* Takes ACLs and quotas of existing pools from cfg (SIGHUP); cfg replaces
 * the borrowed one.  New pools wait for a restart (logged). */
void kvq_state_set_config(struct kvq_state *st, const struct kvq_config *cfg);

/* A new live connection with the next id, no identity yet (the caller sets
 * uid, groups, pid) and no pidfd.  Returns 0 and *ret, or -ENOMEM. */
int kvq_state_conn_new(struct kvq_state *st, struct kvq_conn **ret);

/* Moves a closed connection that keeps its lease to the dying list. */
void kvq_state_conn_exiting(struct kvq_conn *c);

/* Gives back c's lease and pool and frees it (out of its list); the server
 * has closed its peer, pidfd and event. */
void kvq_state_conn_free(struct kvq_conn *c);

/* Whether c's peer passes acl. */
bool kvq_conn_acl_ok(const struct kvq_conn *c, const struct kvq_config_acl *acl);

/* Root, and whoever admin_uids / admin_gids name (by default the daemon's
 * own user): admin requests change what every client of a pool sees. */
bool kvq_conn_is_admin(const struct kvq_conn *c);

/* Whether c sees pool p in Stats (and may name it in an admin request). */
bool kvq_conn_sees(const struct kvq_conn *c, const struct kvq_pools_rec *p);

/* Bytes a lease holds in p: each distinct sealed id one sealed block, each
 * open slot an open block and its reservation. */
uint64_t kvq_state_lease_bytes(const struct kvq_pools_rec *p, const kvq_lease *l);

/* Whether uid may take extra more bytes of p: its quota counts what it
 * holds over all its connections, exiting ones too, so reconnecting does
 * not escape it. */
bool kvq_state_quota_allows(const struct kvq_state *st, const struct kvq_pools_rec *p, uid_t uid, uint64_t extra);

#endif
