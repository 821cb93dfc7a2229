/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's books kept for the next kvqd (docs/DESIGN.md, "Restart"): what a
 * restart needs to take the pool back with its cached blocks, written as
 * the daemon runs into a memfd that the service manager keeps (its fd
 * store) beside the pool's memory and its host tier.  The memory of a
 * process that is killed stays as it was written, so the books are current
 * at every instant; there is no log to replay.
 *
 * Layout (host byte order: only this machine's next kvqd reads it):
 *
 *   head     magic, KVQ_BOOKS_VERSION, sizes, a checksum of the identity;
 *            the identity (struct kvq_books_id, then the canonical policy
 *            string): everything that decides what the pool's bytes mean
 *            and what rebuilds its record; then the live part: clean (a
 *            complete snapshot was written at a stop: kvq_books_seal) and
 *            the checksum of everything after the head when clean.
 *   states   per block id, the pool's slot state (daemon/pool.h) with
 *            KVQ_BOOKS_HELD when a client holds it (a reserved or private
 *            slot, a cached block with references): the pool writes it
 *            (kvq_pool_set_mirror) on every change.
 *   open     per open slot, the sealed id reserved for it, or UINT32_MAX.
 *   keys     per block id, a cached block's key and parent with a
 *            checksum, valid while its flag is set.
 *   tier     per host-tier record, a READY record's class, key and parent
 *            with a checksum, valid while its flag is set.
 *   clients  per connection attached to the pool: its process's pid and
 *            start time, and its holder (AttachReply.holder).
 *   owners   per block id and per open slot, which of them holds it
 *            (an entry + 1; 0 none known; 0xffff several).
 *
 * Never a wrong block.  What lets a restart take a slot back is written
 * before the slot can change hands: a key's flag is cleared before its
 * block leaves the cache (eviction, demotion) and set only after the key,
 * parent and checksum are written; a tier record's likewise; a slot's state
 * says held before its id reaches a client, and free only when it is.  A
 * kill at any instant leaves each entry either whole or unset; an entry
 * lost is a miss, never a wrong hit.  Anything else (a checksum that does
 * not match, a size that does not fit, another version) makes the pool
 * start cold (daemon/restore.h).
 *
 * Not thread-safe: the event loop's.
 */
#ifndef KVQD_BOOKS_H
#define KVQD_BOOKS_H

#include <stdint.h>
#include <sys/types.h>

#include "conf.h"
#include "frame.h"

typedef struct kvq_books kvq_books;

#define KVQ_BOOKS_MAGIC "KVQBOOKS"   /* 8 bytes, no terminator */
#define KVQ_BOOKS_VERSION 2u          /* changes with the layout above, struct kvq_books_id and
					* the entries' included: the next kvqd may be another build */
#define KVQ_BOOKS_HELD 0x80u         /* in a state byte: a client holds the slot */
#define KVQ_BOOKS_KEY_LEN 32u

/* Where a pool's record came from, to rebuild one no section names. */
enum kvq_books_origin {
	KVQ_BOOKS_CONF = 0,   /* a [pool NAME] section */
	KVQ_BOOKS_ATTACH,     /* an Attach that created it */
	KVQ_BOOKS_POOLADD,    /* a PoolAdd */
};

/* A pool's identity and record, fixed-size; zero-filled before it is set,
 * so two compare field by field (kvq_books_id_diff). */
struct kvq_books_id {
	char name[KVQ_PROTO_MAX_NAME + 1];
	char model[KVQ_PROTO_MAX_MODEL_ID + 1];
	char group[KVQ_PROTO_MAX_NAME + 1];
	char backend[16];
	int32_t device;
	uint32_t layout_version;
	uint64_t fingerprint;                  /* kvq_blockrec_fingerprint of its layout */
	uint32_t layers, kv_heads, head_dim, block_tokens, window, sink_blocks;
	int32_t act;
	uint32_t n_sealed, n_open, n_sink;
	uint64_t mem_size;                     /* bytes of its memory */
	uint64_t tier_capacity;                /* bytes of its host tier (host_capacity resolved), 0: none */
	uint32_t has_codebooks;
	uint8_t codebooks_sha256[KVQ_PROTO_SHA256];
	uint32_t serial;                       /* names its stored descriptors (kvq.pool.N, ..) */
	uint32_t origin;                       /* enum kvq_books_origin */
	struct kvq_config_acl acl;
	uint64_t quota;
	struct kvq_config_amount capacity, host_capacity;
	uint32_t attention_report_ms;
	uint64_t memory_id;                    /* AttachReply.memory_id: names the memory across restarts */
};

/* A new memfd of books for a pool of identity id and canonical policy,
 * with n_tier host-tier records and room for n_clients attached processes;
 * every slot free, nothing cached, not clean.  Returns 0 and *ret, or a
 * negative code with err set. */
int kvq_books_create(const struct kvq_books_id *id, const char *policy, uint32_t n_tier, uint32_t n_clients,
		     kvq_books **ret, char *err, size_t errlen);

/* Books passed back by the service manager in fd (taken: closed on
 * failure too): the head checked (magic, version, sizes, the identity's
 * checksum) and, when clean, the whole body's checksum.  Returns 0 and
 * *ret, or -EBADMSG (corrupt), -EPROTONOSUPPORT (another version),
 * -EMSGSIZE (truncated or sizes that do not fit) or an errno, with the
 * reason in err. */
int kvq_books_open(int fd, kvq_books **ret, char *err, size_t errlen);

/* The pool name books in fd say they are of, read however damaged the
 * rest is, for the reason a refusal logs: 0, or -EBADMSG (no magic). */
int kvq_books_peek_name(int fd, char *name, size_t len);

/* Unmaps and closes (NULL is fine). */
void kvq_books_free(kvq_books *b);

int kvq_books_fd(const kvq_books *b);
const struct kvq_books_id *kvq_books_identity(const kvq_books *b);
const char *kvq_books_policy(const kvq_books *b);
/* Whether the books were sealed at a stop (a complete snapshot) rather
 * than left by a kill. */
int kvq_books_clean(const kvq_books *b);

/* The first field where want differs from the books' identity, written as
 * a reason ("block_tokens 16, the pool's 32"), or 0 when none does (the
 * record-only fields, serial, origin, ACL, quota and capacities, are not
 * compared: they do not change what the bytes mean; nor is memory_id). */
int kvq_books_id_diff(const kvq_books *b, const struct kvq_books_id *want, const char *policy, char *why,
		      size_t len);

/* The state bytes (n_sealed + n_sink) and the open slots' reserved ids
 * (n_open): the pool writes them (kvq_pool_set_mirror). */
uint8_t *kvq_books_states(kvq_books *b);
uint32_t *kvq_books_open_slots(kvq_books *b);

/* Who holds each block and each open slot (kvq_pool_set_owners): the
 * holder's entry + 1 (kvq_books_client), 0 none known, 0xffff several. */
uint16_t *kvq_books_owners(kvq_books *b);
uint16_t *kvq_books_open_owners(kvq_books *b);

/* Block id is cached under key after parent (-1: none); or (key NULL) is
 * not any more. */
void kvq_books_key(kvq_books *b, uint32_t id, const uint8_t *key, int32_t parent);

/* The key entry of block id: 1 with key and *parent, 0 when unset,
 * -EBADMSG when its checksum does not match. */
int kvq_books_key_get(const kvq_books *b, uint32_t id, uint8_t key[KVQ_BOOKS_KEY_LEN], int32_t *parent);

/* Host-tier records the books have room for. */
uint32_t kvq_books_n_tier(const kvq_books *b);

/* Tier record r is READY with class cls, key and parent (NULL: none); or
 * (key NULL) is not. */
void kvq_books_tier(kvq_books *b, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent);

/* The entry of tier record r: 1 with cls, key and parent (*has_parent), 0
 * when unset, -EBADMSG when its checksum does not match. */
int kvq_books_tier_get(const kvq_books *b, uint32_t r, uint32_t *cls, uint8_t key[KVQ_BOOKS_KEY_LEN],
		       uint8_t parent[KVQ_BOOKS_KEY_LEN], int *has_parent);

/* A connection of process pid attached, as holder: its entry (an index
 * for kvq_books_client_gone), or -ENOSPC when the table is full (its holds
 * then carry no owner, and a restore holds them until every recorded
 * process went). */
int kvq_books_client(kvq_books *b, pid_t pid, uint64_t holder);
void kvq_books_client_gone(kvq_books *b, int entry);

/* The recorded connections: the pid, start time and holder of entry i,
 * pid 0 when unused. */
uint32_t kvq_books_n_clients(const kvq_books *b);
pid_t kvq_books_client_pid(const kvq_books *b, uint32_t i, uint64_t *ret_start, uint64_t *ret_holder);
/* Whether a client could not be recorded since the books were made. */
int kvq_books_clients_lost(const kvq_books *b);

/* A process's start time (field 22 of /proc/PID/stat, clock ticks since
 * boot): with the pid, who it is; 0 when it is gone. */
uint64_t kvq_books_start_time(pid_t pid);

/* A complete snapshot at a stop: the body's checksum and clean set. */
void kvq_books_seal(kvq_books *b);

/* Taken back: no longer clean (the books change from now on). */
void kvq_books_unseal(kvq_books *b);

#endif
