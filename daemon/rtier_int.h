/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's insides (daemon/rtier.h), shared by its files: the
 * tier and its remotes (rtier.c), its writes and write-back
 * (rtier_write.c), its fetches (rtier_fetch.c).  Not for other modules.
 */
#ifndef KVQ_RTIER_INT_H
#define KVQ_RTIER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

#include "chainkey.h"
#include "log.h"
#include "rcluster.h"
#include "remote_value.h"
#include "rtier.h"

#define RTIER_QUEUE_MAX 4096u    /* blocks waiting to be written, per pool */
#define RTIER_QUEUE_BYTES (64u << 20)   /* their values made at eviction (write-back), per pool;
					   an empty queue takes one of any size */

/* One [remote]: its client and what its values need, copied (a reload
 * keeps the running remote). */
struct rtier_remote {
	char name[KVQ_CONFIG_NAME_MAX + 1];
	kvq_rcluster *rc;
	uint8_t key[KVQ_CONFIG_HMAC_MAX];
	uint32_t key_len;
	size_t max_value;
	uint64_t ttl_ms;
	unsigned max_inflight;
};

/* A block to write: its id and local key (written through: only if still
 * cached so), its remote chain key and its parent's; written back, its
 * value, made when it left the pool. */
struct rtier_write {
	uint32_t id;
	bool has_parent;
	uint8_t lkey[KVQ_CHAINKEY_LEN], lparent[KVQ_CHAINKEY_LEN];
	uint8_t chain[KVQ_CHAINKEY_LEN], parent[KVQ_CHAINKEY_LEN];
	uint8_t *val;
	size_t vlen;
};

/* Write-back in a pool with a host tier: a block demoted there, its remote
 * keys kept (by its local key) for when its record leaves the tier; kept
 * too while the record is promoted back, for when the pool evicts it. */
struct rtier_demoted {
	bool used, has_parent;
	uint8_t lkey[KVQ_CHAINKEY_LEN], lparent[KVQ_CHAINKEY_LEN];
	uint8_t chain[KVQ_CHAINKEY_LEN], parent[KVQ_CHAINKEY_LEN];
};

struct kvq_rtier {
	struct rtier_remote *rm;            /* borrowed: the daemon's remotes outlive the pools */
	struct event_base *base;
	struct kvq_rtier_pool p;            /* the pool's, while attached */
	bool attached;                      /* false once detached */
	kvq_remote_codec *codec;
	kvq_remote_codec *vcodec;           /* the verifying threads': fetched values (shared) */
	struct kvq_rstage *stage;           /* a pool kvqd does not map: its copies; else NULL */
	kvq_copier *verify;                 /* the remotes' verifying threads */
	struct kvq_chainkey ck;
	uint8_t identity[KVQ_REMOTE_DIGEST_LEN];
	int write;                          /* enum kvq_remote_write */
	uint32_t nb;                        /* block ids of the pool */
	uint8_t (*lkey)[KVQ_CHAINKEY_LEN];  /* per block id: the local key its remote key was learnt under */
	uint8_t (*rkey)[KVQ_CHAINKEY_LEN];
	bool *known;
	uint32_t rank, world;               /* in a tensor-parallel group; else 0 of 1 */
	struct rtier_write *q;              /* the write queue, a ring */
	uint32_t qhead, qlen, qcap;
	uint64_t qbytes;                    /* of the values in it */
	struct rtier_demoted *dm;           /* open addressing, dm_bits of slots; NULL: no host tier */
	unsigned dm_bits;
	uint32_t dm_len;
	uint64_t dm_mult;                   /* random odd multiplier of the slot */
	uint32_t writing, max_writing;      /* SETs in flight, their bound */
	struct event *drain;
	uint32_t refs;                      /* the pool's, and one per request or fetch in flight */
	uint32_t jobs;                      /* fetched values on the copy engine */
	struct kvq_rtier_stats st;
	struct kvq_log_limit lim[KVQ_RTIER_NERRORS];
};

/* rtier.c: a reference of t dropped, t freed with the last. */
void rtier_unref(struct kvq_rtier *t);
/* rtier.c: error e counted and logged (rate-limited); what says of what. */
void rtier_error(struct kvq_rtier *t, enum kvq_rtier_error e, const char *what);
/* rtier.c: a cluster client's status as an error of the tier. */
enum kvq_rtier_error rtier_status_error(int status);
/* rtier.c: block id's remote chain key learnt, with its local key. */
void rtier_learn_as(struct kvq_rtier *t, uint32_t id, const uint8_t lkey[KVQ_CHAINKEY_LEN],
		    const uint8_t chain[KVQ_CHAINKEY_LEN]);
/* rtier.c: block id's remote chain key (0), or -ENOENT; lkey gets its local key. */
int rtier_rkey(struct kvq_rtier *t, uint32_t id, uint8_t lkey[KVQ_CHAINKEY_LEN], const uint8_t **ret);

/* rtier_write.c: the write queue's drain (the event t->drain). */
void rtier_drain_cb(evutil_socket_t fd, short what, void *arg);
/* rtier_write.c: write-back's leave hook of the prefix index. */
void rtier_on_leave(void *arg, uint32_t id, int32_t parent, int demote);
/* rtier_write.c: write-back's leave hook of the host tier. */
void rtier_tier_leave(void *arg, uint32_t r, bool gone);

#endif
