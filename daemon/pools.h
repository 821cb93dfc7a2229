/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's pool records: each pool's identity (name, model id), policy,
 * geometry, ACL, quota, capacity and backend, from a [pool NAME] section, an
 * Attach with create, or a PoolAdd; and, once allocated, its memory
 * (daemon/backend.h), layout, slot books (daemon/pool.h) and prefix index
 * (daemon/prefix.h).  A pool's backend is chosen in one place here: the
 * daemon's own unless the pool names another backend or device.
 *
 * Sizing: each (backend, device) has a budget, kvqd.conf's memory_budget of
 * the device's memory; a pool's capacity is bytes or a share of it.  Slot
 * counts are given (Attach create, PoolAdd) or come from the capacity.
 *
 * Codebooks: a pool whose policy uses a codebook format gets its codebooks
 * from the request that creates it (daemon/codebooks.h), written into its
 * codebook region once, when it is allocated; their SHA-256 is part of the
 * pool's identity for its life: an Attach that sends codebooks must send
 * the same.  kvqd.conf cannot name such a pool (conf_check.c).
 */
#ifndef KVQD_POOLS_H
#define KVQD_POOLS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "attn.h"
#include "backend.h"
#include "codebooks.h"
#include "conf.h"
#include "copier.h"
#include "frame.h"
#include "layout.h"
#include "pool.h"
#include "prefix.h"
#include "restart.h"
#include "rtier.h"
#include "tier.h"

/* A pool created on attach without slot counts gets one open slot per this
 * many sealed ones: the window is a few blocks per sequence, the prefix
 * cache wants the rest. */
#define KVQ_POOLS_SEALED_PER_OPEN 8u

struct kvq_group;
struct kvq_pools_rec;

/* A member pool's place in its tensor-parallel group: all this file knows
 * of groups (daemon/groups.h sets it at join). */
struct kvq_group_link {
	struct kvq_group *g;                     /* NULL: in no group (yet) */
	uint32_t rank, world;
	const uint32_t *pending;                 /* the group's lookups waiting for ranks */
	struct kvq_group **list;                 /* the daemon's groups (struct kvq_pools) */
	void (*leave)(struct kvq_pools_rec *p);  /* out of the group, before the pool's memory goes */
};

struct kvq_pools_rec {
	struct kvq_pools_rec *next;
	char name[KVQ_PROTO_MAX_NAME + 1];
	char model[KVQ_PROTO_MAX_MODEL_ID + 1];
	char policy_str[KVQ_POLICY_MAX_LEN + 1];     /* canonical */
	struct kvq_policy policy;
	struct kvq_layout_params params;             /* n_sealed/n_open 0 until allocated */
	struct kvq_config_acl acl;
	uint64_t quota;                              /* per uid, bytes */
	struct kvq_config_amount capacity;
	struct kvq_config_amount host_capacity;      /* of its host tier: bytes or a share of the host budget */
	struct kvq_tiering *tiering;                 /* its host tier at work (daemon/tiering.h), or NULL */
	struct kvq_rtier *rtier;                     /* its remote tier at work (daemon/rtier.h), or NULL */
	const struct kvq_backend *backend;
	int device;                                  /* 0 for host */
	bool allocated;                              /* memory, layout and books exist */
	struct kvq_layout *L;
	struct kvq_backend_mem mem;
	struct kvq_warm *warm;                       /* its memory's first touch (daemon/warm.h), or NULL */
	kvq_pool *pool;
	kvq_prefix *prefix;
	uint64_t lookup_tokens, hit_tokens;
	uint64_t alloc_failures;                     /* refused before the pool was asked */
	uint64_t device_memory;                      /* of its device, when allocated */
	uint64_t f16_block_bytes;                    /* a sealed block of its geometry in f16, when allocated */
	struct kvq_attn *attn;                       /* attention timings reported, when allocated */
	uint32_t attention_report_ms;                /* told to clients at attach; 0: no timing */
	uint32_t clients;                            /* attached, exiting ones included */
	bool has_codebooks;                          /* allocated with codebooks (a codebook policy) */
	uint8_t codebooks_sha256[KVQ_PROTO_SHA256];  /* theirs, when has_codebooks */
	/* a tensor-parallel group's member pool: the group's name (its prefix
	 * keys' namespace, set when the attach creates it) and its link */
	char group[KVQ_PROTO_MAX_NAME + 1];
	struct kvq_group_link glink;
	uint32_t origin;                             /* enum kvq_books_origin: its section, an Attach, a PoolAdd */
	uint64_t memory_id;                          /* AttachReply.memory_id, when allocated: random, or
							the books' when its memory was taken back */
	struct kvq_restart_pool kept;                /* what it leaves for a restart (daemon/restart.h) */
};

/* The records, newest first, and the daemon's backend. */
struct kvq_pools {
	struct kvq_pools_rec *head;
	struct kvq_group *groups;                    /* tensor-parallel groups (daemon/groups.h) */
	const struct kvq_backend *backend;           /* --backend, else kvqd.conf's */
	int device;                                  /* its device */
	char backend_reason[KVQ_BACKEND_MSG_MAX];    /* why that backend, for the log */
	kvq_copier *copier;                          /* the host tiers' copies: synchronous until the
							server gives its own (kvq_copier_new with its loop) */
	struct kvq_restart *restart;                 /* what a restart leaves and takes back */
	struct kvq_rtiers *rtiers;                   /* the [remote] sections' clients, or NULL: set by the
						   server on its loop (kvq_pools_remotes) */
};

/*
 * What is resident in a pool, derived from its slot books alone (kvq.proto
 * PoolStats 29-34, kvqctl(1) "Resident figures").  After a commit a live
 * sequence longer than the window holds window / B open slots and a shorter
 * one fewer, so sequences is a lower bound (exact when window = B) and
 * open_used the upper one; with sink blocks every live sequence holds one
 * sink reference from its first token, so sequences is exact (the sink
 * references) and sealed_tokens leaves the sinks to sink_tokens; every
 * reference on a sealed block is one
 * sequence's (libkvq takes one per sequence), so sealed_tokens counts
 * tokens as the sequences see them and sealed_distinct_tokens as stored.
 */
struct kvq_resident {
	uint32_t sequences;
	uint64_t sealed_tokens, sealed_distinct_tokens, open_tokens_max;
	uint64_t sink_tokens;            /* sink blocks with a reference x block tokens (at most) */
	uint64_t bytes;                  /* their sealed and sink blocks, open slots and the reservations */
	uint64_t f16_bytes;              /* distinct sealed, sink and open tokens (at their bound) in f16 */
};

/* One allocated pool, for Stats and the metrics. */
struct kvq_pools_info {
	const char *name, *model, *policy, *backend;
	int device;                      /* -1 for host */
	uint32_t layers, kv_heads, head_dim, block_tokens, window, sink_blocks;
	int act;
	uint64_t total_bytes, sealed_block_bytes, open_block_bytes;   /* a sink slot has open_block_bytes */
	uint64_t device_memory;          /* of the pool's device (host: physical memory) */
	struct kvq_pool_stats st;
	uint64_t lookup_tokens, hit_tokens, alloc_failures;   /* alloc_failures: all refusals */
	uint32_t clients;
	struct kvq_resident res;
	uint32_t attention_report_ms;
	const struct kvq_attn *attn;
	const uint8_t *codebooks_sha256;  /* KVQ_PROTO_SHA256 bytes, or NULL: no codebooks */
	const char *group;               /* tensor-parallel group, "" for none */
	uint32_t rank, world_size;       /* in it (0, 0 for none) */
	uint32_t group_pending;          /* its lookups waiting for ranks */
	struct kvq_tiering_stats tier;   /* its host tier's (all 0 without one) */
	struct kvq_rtier_stats remote;   /* its remote tier's (all 0 without one) */
	struct {                         /* what this start took back (daemon/restart.h) */
		uint64_t blocks, records;    /* cached blocks, host-tier records */
		uint64_t held;               /* slots held now for processes alive at the restart */
		uint64_t us;                 /* time taken */
		const char *cold;            /* why books a restart left were not taken back, or "" */
	} restart;
};

/* No records; the daemon's backend from its name ("auto", "host", "cuda")
 * and device; keep (NULL: none) the service manager that keeps pools
 * across a restart (daemon/restart.h).  Returns 0, or a negative code with
 * err set. */
int kvq_pools_init(struct kvq_pools *ps, const char *backend, int device, const struct kvq_keep *keep, char *err,
		   size_t errlen);

/* Frees every record. */
void kvq_pools_fini(struct kvq_pools *ps);

/* The record called name, or NULL. */
struct kvq_pools_rec *kvq_pools_find(const struct kvq_pools *ps, const char *name);

/* Adds p (first); takes it out and frees it. */
void kvq_pools_add(struct kvq_pools *ps, struct kvq_pools_rec *p);
void kvq_pools_remove(struct kvq_pools *ps, struct kvq_pools_rec *p);

/* A record (not allocated, not added) from a [pool NAME] section.  Returns
 * 0 and *ret, or a negative code with err set. */
int kvq_pools_from_config(const struct kvq_pools *ps, const struct kvq_config_pool *c, struct kvq_pools_rec **ret,
			  char *err, size_t errlen);

/* A record (not allocated, not added) from an Attach with create (its
 * geometry, policy, backend and device): attachable by creator's uid, root
 * and the daemon's uid (a pool is a trust boundary: whoever maps it can read
 * and write all of it), with cfg's quota and create_capacity.  Returns 0 and
 * *ret, or a negative code (KVQ_EPOLICY for the policy; -ENOSPC when kvqd
 * holds KVQ_PROTO_MAX_POOLS pools already) with err set. */
int kvq_pools_from_attach(const struct kvq_pools *ps, const struct kvq_config *cfg, const Kvq__Attach *a,
			  uid_t creator, struct kvq_pools_rec **ret, char *err, size_t errlen);

/*
 * The codebooks a request brings for p (kvq.proto, "File descriptors"):
 * created says whether the request creates p (an Attach that creates it, a
 * PoolAdd) or joins it; a->codebooks whether it announces them; fd the
 * descriptor that came with it, or -1.  Returns 0 and *ret (opened, or empty
 * when none came: kvq_codebooks_close either way), or -EINVAL (announced
 * without a descriptor or the reverse; sent for a policy without codebook
 * formats; missing where created with one; a descriptor or file that is
 * bad), -E2BIG (over KVQ_CB_MAX_FILE) or, joining, KVQ_ELAYOUT (they differ
 * from p's), with the reason in err.
 */
int kvq_pools_codebooks(const struct kvq_pools_rec *p, bool created, const Kvq__Attach *a, int fd,
			struct kvq_codebooks *ret, char *err, size_t errlen);

/* Allocates memory and books of p within its device's budget (cfg's
 * memory_budget less the pools there): want_sealed and want_open slots (and,
 * with sink blocks, want_sink sink slots, 0: as many as open ones) when both
 * are given, else as many as its capacity holds (a sink slot per open slot);
 * and writes cb's data
 * (kvq_pools_codebooks) into its codebook region, which a policy with a
 * codebook format needs and one without refuses (cb NULL or empty: none).
 * Returns 0, or a negative code with err set and p not allocated. */
int kvq_pools_allocate(const struct kvq_pools *ps, const struct kvq_config *cfg, struct kvq_pools_rec *p,
		       uint32_t want_sealed, uint32_t want_open, uint32_t want_sink, const struct kvq_codebooks *cb,
		       char *err, size_t errlen);

/* The attention report interval a pool called name gets from cfg: its
 * section's attention_timing, else [kvqd]'s; 0 when it does not time. */
uint32_t kvq_pools_report_ms(const struct kvq_config *cfg, const char *name);

/* Gives back the memory and books of p; the record stays (not allocated). */
void kvq_pools_release(struct kvq_pools_rec *p);

/* Releases and frees a record that is not in the list; NULL is fine. */
void kvq_pools_rec_free(struct kvq_pools_rec *p);

/* After kvqd.conf's pools at start: every other pool a restart left
 * (daemon/restart.h) taken back, rebuilt from its books when no section
 * names it; the restart's figures logged. */
void kvq_pools_restore_rest(struct kvq_pools *ps, const struct kvq_config *cfg);

/* At a stop: every pool's books sealed as they are, so that what clients
 * hold now is held at the next start. */
void kvq_pools_keep(struct kvq_pools *ps);

/* A connection of process pid (pidfd: the connection's, borrowed, or -1)
 * attached to p as holder (AttachReply holder): its entry in p's books
 * (-1: none), for kvq_pools_detached when it goes. */
int kvq_pools_attached(struct kvq_pools_rec *p, pid_t pid, int pidfd, uint64_t holder);
void kvq_pools_detached(struct kvq_pools_rec *p, int entry);

/* Attach.replaces: what p held since a restart for holder, a connection
 * of process pid, released; returns the slots released
 * (kvq_restart_replaced). */
uint64_t kvq_pools_replaced(struct kvq_pools_rec *p, pid_t pid, uint64_t holder);

/* A random number other than 0 (a memory id, a holder). */
uint64_t kvq_pools_random_id(void);

/* Releases what restored pools hold for processes all gone; returns how
 * many pools still hold. */
uint32_t kvq_pools_holds_check(struct kvq_pools *ps);

/* Releases what restored pools hold for process (pid, start), whose
 * pidfd said it exited; returns how many pools still hold. */
uint32_t kvq_pools_holds_exited(struct kvq_pools *ps, pid_t pid, uint64_t start);

/* What an allocated p is and holds (strings valid while p lives). */
void kvq_pools_info(const struct kvq_pools_rec *p, struct kvq_pools_info *ret);

/* Starts the remote tiers: the cluster clients of cfg's [remote] sections
 * on base (daemon/rtier.h), and the tier of every allocated pool whose
 * section names one (a pool allocated later gets its own then).  A pool
 * whose tier cannot start runs without it (logged).  Returns 0, or a
 * negative code with err set. */
int kvq_pools_remotes(struct kvq_pools *ps, struct event_base *base, const struct kvq_config *cfg, char *err,
		      size_t errlen);

#endif
