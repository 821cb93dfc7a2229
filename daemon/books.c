/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's books for the next kvqd: a memfd written as the daemon runs (books.h). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "books.h"
#include "seterr.h"

#define HEAD_FIXED 512u      /* magic .. the live part; the identity follows */
#define ALIGN 64u

/* The head's first bytes; the identity and the policy string follow at
 * HEAD_FIXED. */
struct head {
	char magic[8];
	uint32_t version;
	uint32_t head_bytes;          /* HEAD_FIXED + identity + policy, rounded up */
	uint64_t file_bytes;
	uint64_t id_sum;              /* FNV-1a 64 of the identity and the policy */
	uint32_t n_blocks, n_open, n_tier, n_clients;
	uint64_t states_off, open_off, keys_off, tier_off, clients_off, owners_off, open_owners_off;
	uint32_t policy_len;
	/* live */
	uint32_t clean;
	uint32_t clients_lost;
	uint64_t body_sum;            /* FNV-1a 64 of every byte after the head, when clean */
};

struct key_entry {
	uint8_t set;
	uint8_t pad[3];
	int32_t parent;
	uint8_t key[KVQ_BOOKS_KEY_LEN];
	uint64_t sum;
};

struct tier_entry {
	uint8_t set, has_parent;
	uint8_t pad[2];
	uint32_t cls;
	uint8_t key[KVQ_BOOKS_KEY_LEN], parent[KVQ_BOOKS_KEY_LEN];
	uint64_t sum;
};

struct client_entry {
	int32_t pid;               /* 0: unused */
	uint32_t pad;
	uint64_t start;
	uint64_t holder;           /* the connection's (AttachReply.holder) */
};

struct kvq_books {
	int fd;
	uint8_t *map;
	uint64_t size;
	struct head *h;
};

_Static_assert(sizeof(struct head) <= HEAD_FIXED, "head fits");

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
	const uint8_t *s = p;

	for (size_t i = 0; i < len; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h;
}

#define FNV_BASIS 0xcbf29ce484222325ull

static uint64_t round_up(uint64_t v)
{
	return (v + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

static struct kvq_books_id *id_of(const struct kvq_books *b)
{
	return (struct kvq_books_id *)(b->map + HEAD_FIXED);
}

static uint64_t id_sum(const struct kvq_books *b)
{
	return fnv(FNV_BASIS, b->map + HEAD_FIXED, sizeof(struct kvq_books_id) + b->h->policy_len);
}

static struct key_entry *keys(const struct kvq_books *b)
{
	return (struct key_entry *)(b->map + b->h->keys_off);
}

static struct tier_entry *tiers(const struct kvq_books *b)
{
	return (struct tier_entry *)(b->map + b->h->tier_off);
}

static struct client_entry *clients(const struct kvq_books *b)
{
	return (struct client_entry *)(b->map + b->h->clients_off);
}

/* The offsets of every table after a head of head_bytes. */
static uint64_t lay_out(struct head *h)
{
	uint64_t off = h->head_bytes;

	h->states_off = off;
	off = round_up(off + h->n_blocks);
	h->open_off = off;
	off = round_up(off + (uint64_t)h->n_open * sizeof(uint32_t));
	h->keys_off = off;
	off = round_up(off + (uint64_t)h->n_blocks * sizeof(struct key_entry));
	h->tier_off = off;
	off = round_up(off + (uint64_t)h->n_tier * sizeof(struct tier_entry));
	h->clients_off = off;
	off = round_up(off + (uint64_t)h->n_clients * sizeof(struct client_entry));
	h->owners_off = off;
	off = round_up(off + (uint64_t)h->n_blocks * sizeof(uint16_t));
	h->open_owners_off = off;
	return round_up(off + (uint64_t)h->n_open * sizeof(uint16_t));
}

int kvq_books_create(const struct kvq_books_id *id, const char *policy, uint32_t n_tier, uint32_t n_clients,
		     kvq_books **ret, char *err, size_t errlen)
{
	struct head h = { .version = KVQ_BOOKS_VERSION };
	size_t plen = strlen(policy);
	char name[96];
	struct kvq_books *b;
	int e;

	memcpy(h.magic, KVQ_BOOKS_MAGIC, 8);
	h.policy_len = (uint32_t)plen + 1;
	h.head_bytes = (uint32_t)round_up(HEAD_FIXED + sizeof *id + h.policy_len);
	h.n_blocks = id->n_sealed + id->n_sink;
	h.n_open = id->n_open;
	h.n_tier = n_tier;
	h.n_clients = n_clients;
	h.file_bytes = lay_out(&h);
	b = calloc(1, sizeof *b);
	if (!b)
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	/* shows as /memfd:kvq-books:NAME in /proc/PID/maps */
	snprintf(name, sizeof name, "kvq-books:%s", id->name);
	b->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (b->fd < 0) {
		e = errno;
		free(b);
		return kvq_seterr(err, errlen, "books: memfd_create: %s", strerror(e)), -e;
	}
	b->size = h.file_bytes;
	if (ftruncate(b->fd, (off_t)b->size) < 0 || fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		e = errno;
		goto fail;
	}
	b->map = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (b->map == MAP_FAILED) {
		e = errno;
		b->map = NULL;
		goto fail;
	}
	b->h = (struct head *)b->map;
	*b->h = h;
	memcpy(id_of(b), id, sizeof *id);
	memcpy(b->map + HEAD_FIXED + sizeof *id, policy, plen + 1);
	b->h->id_sum = id_sum(b);
	memset(b->map + h.open_off, 0xff, (size_t)h.n_open * sizeof(uint32_t));
	*ret = b;
	return 0;
fail:
	kvq_books_free(b);
	return kvq_seterr(err, errlen, "books of %llu bytes: %s", (unsigned long long)h.file_bytes, strerror(e)), -e;
}

int kvq_books_open(int fd, kvq_books **ret, char *err, size_t errlen)
{
	struct kvq_books *b = calloc(1, sizeof *b);
	struct head h;
	struct stat st;
	int r;

	if (!b) {
		close(fd);
		return kvq_seterr(err, errlen, "out of memory"), -ENOMEM;
	}
	b->fd = fd;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		kvq_seterr(err, errlen, "books: %s", strerror(-r));
		goto fail;
	}
	b->size = (uint64_t)st.st_size;
	r = -EMSGSIZE;
	if (b->size < HEAD_FIXED) {
		kvq_seterr(err, errlen, "books truncated: %llu bytes", (unsigned long long)b->size);
		goto fail;
	}
	b->map = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (b->map == MAP_FAILED) {
		b->map = NULL;
		r = -errno;
		kvq_seterr(err, errlen, "books: mmap: %s", strerror(-r));
		goto fail;
	}
	b->h = (struct head *)b->map;
	h = *b->h;
	if (memcmp(h.magic, KVQ_BOOKS_MAGIC, 8)) {
		r = -EBADMSG;
		kvq_seterr(err, errlen, "not books (no magic)");
		goto fail;
	}
	if (h.version != KVQ_BOOKS_VERSION) {
		r = -EPROTONOSUPPORT;
		kvq_seterr(err, errlen, "books version %u, this kvqd reads %u", h.version, KVQ_BOOKS_VERSION);
		goto fail;
	}
	{
		struct head want = h;

		if (h.policy_len == 0 || h.policy_len > 65536 || h.n_blocks > (1u << 28) || h.n_open > (1u << 28) ||
		    h.n_tier > (1u << 28) || h.n_clients > (1u << 24) ||
		    h.head_bytes != round_up(HEAD_FIXED + sizeof(struct kvq_books_id) + h.policy_len) ||
		    lay_out(&want) != h.file_bytes || want.keys_off != h.keys_off || want.tier_off != h.tier_off ||
		    want.clients_off != h.clients_off || want.open_off != h.open_off ||
		    want.states_off != h.states_off || want.owners_off != h.owners_off ||
		    want.open_owners_off != h.open_owners_off) {
			r = -EBADMSG;
			kvq_seterr(err, errlen, "books: sizes that do not add up");
			goto fail;
		}
	}
	if (h.file_bytes != b->size) {
		kvq_seterr(err, errlen, "books of %llu bytes, %llu recorded", (unsigned long long)b->size,
			   (unsigned long long)h.file_bytes);
		goto fail;
	}
	r = -EBADMSG;
	if (b->map[HEAD_FIXED + sizeof(struct kvq_books_id) + h.policy_len - 1] != 0 || id_sum(b) != h.id_sum) {
		kvq_seterr(err, errlen, "books: the identity's checksum does not match");
		goto fail;
	}
	if (h.clean && fnv(FNV_BASIS, b->map + h.head_bytes, b->size - h.head_bytes) != h.body_sum) {
		kvq_seterr(err, errlen, "books: the snapshot's checksum does not match");
		goto fail;
	}
	*ret = b;
	return 0;
fail:
	kvq_books_free(b);
	return r;
}

int kvq_books_peek_name(int fd, char *name, size_t len)
{
	char head[8], id_name[sizeof(((struct kvq_books_id *)0)->name)];

	if (pread(fd, head, sizeof head, 0) != sizeof head || memcmp(head, KVQ_BOOKS_MAGIC, 8) ||
	    pread(fd, id_name, sizeof id_name, HEAD_FIXED + offsetof(struct kvq_books_id, name)) != sizeof id_name)
		return -EBADMSG;
	id_name[sizeof id_name - 1] = 0;
	snprintf(name, len, "%s", id_name);
	return 0;
}

void kvq_books_free(kvq_books *b)
{
	if (!b)
		return;
	if (b->map)
		munmap(b->map, b->size);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
}

int kvq_books_fd(const kvq_books *b)
{
	return b->fd;
}

const struct kvq_books_id *kvq_books_identity(const kvq_books *b)
{
	return id_of(b);
}

const char *kvq_books_policy(const kvq_books *b)
{
	return (const char *)b->map + HEAD_FIXED + sizeof(struct kvq_books_id);
}

int kvq_books_clean(const kvq_books *b)
{
	return b->h->clean != 0;
}

#define DIFF_U(field)                                                                                        \
	do {                                                                                                 \
		if (have->field != want->field)                                                              \
			return snprintf(why, len, "%s %llu, the books' %llu", #field,                         \
					(unsigned long long)want->field, (unsigned long long)have->field), 1; \
	} while (0)
#define DIFF_S(field)                                                                                        \
	do {                                                                                                 \
		if (strcmp(have->field, want->field))                                                        \
			return snprintf(why, len, "%s %s, the books' %s", #field, want->field, have->field), 1; \
	} while (0)

int kvq_books_id_diff(const kvq_books *b, const struct kvq_books_id *want, const char *policy, char *why,
		      size_t len)
{
	const struct kvq_books_id *have = id_of(b);

	DIFF_S(name);
	DIFF_S(model);
	DIFF_S(group);
	if (strcmp(kvq_books_policy(b), policy))
		return snprintf(why, len, "policy %s, the books' %s", policy, kvq_books_policy(b)), 1;
	DIFF_S(backend);
	DIFF_U(device);
	DIFF_U(layout_version);
	DIFF_U(fingerprint);
	DIFF_U(layers);
	DIFF_U(kv_heads);
	DIFF_U(head_dim);
	DIFF_U(block_tokens);
	DIFF_U(window);
	DIFF_U(sink_blocks);
	DIFF_U(act);
	DIFF_U(n_sealed);
	DIFF_U(n_open);
	DIFF_U(n_sink);
	DIFF_U(mem_size);
	DIFF_U(tier_capacity);
	DIFF_U(has_codebooks);
	if (memcmp(have->codebooks_sha256, want->codebooks_sha256, sizeof have->codebooks_sha256))
		return snprintf(why, len, "other codebooks"), 1;
	return 0;
}

uint8_t *kvq_books_states(kvq_books *b)
{
	return b->map + b->h->states_off;
}

uint32_t *kvq_books_open_slots(kvq_books *b)
{
	return (uint32_t *)(b->map + b->h->open_off);
}

uint16_t *kvq_books_owners(kvq_books *b)
{
	return (uint16_t *)(b->map + b->h->owners_off);
}

uint16_t *kvq_books_open_owners(kvq_books *b)
{
	return (uint16_t *)(b->map + b->h->open_owners_off);
}

static uint64_t key_sum(uint32_t id, const struct key_entry *e)
{
	uint64_t h = fnv(FNV_BASIS, &id, sizeof id);

	h = fnv(h, &e->parent, sizeof e->parent);
	return fnv(h, e->key, sizeof e->key);
}

void kvq_books_key(kvq_books *b, uint32_t id, const uint8_t *key, int32_t parent)
{
	struct key_entry *e = &keys(b)[id];

	/* unset first: a kill in between leaves no entry, not a torn one */
	__atomic_store_n(&e->set, 0, __ATOMIC_RELEASE);
	if (!key)
		return;
	e->parent = parent;
	memcpy(e->key, key, KVQ_BOOKS_KEY_LEN);
	e->sum = key_sum(id, e);
	__atomic_store_n(&e->set, 1, __ATOMIC_RELEASE);
}

int kvq_books_key_get(const kvq_books *b, uint32_t id, uint8_t key[KVQ_BOOKS_KEY_LEN], int32_t *parent)
{
	const struct key_entry *e = &keys(b)[id];

	if (!e->set)
		return 0;
	if (e->set != 1 || e->sum != key_sum(id, e))
		return -EBADMSG;
	memcpy(key, e->key, KVQ_BOOKS_KEY_LEN);
	*parent = e->parent;
	return 1;
}

uint32_t kvq_books_n_tier(const kvq_books *b)
{
	return b->h->n_tier;
}

static uint64_t tier_sum(uint32_t r, const struct tier_entry *e)
{
	uint64_t h = fnv(FNV_BASIS, &r, sizeof r);

	h = fnv(h, &e->has_parent, 1);
	h = fnv(h, &e->cls, sizeof e->cls);
	h = fnv(h, e->key, sizeof e->key);
	return fnv(h, e->parent, sizeof e->parent);
}

void kvq_books_tier(kvq_books *b, uint32_t r, uint32_t cls, const uint8_t *key, const uint8_t *parent)
{
	struct tier_entry *e = &tiers(b)[r];

	__atomic_store_n(&e->set, 0, __ATOMIC_RELEASE);
	if (!key)
		return;
	e->cls = cls;
	e->has_parent = parent != NULL;
	memcpy(e->key, key, KVQ_BOOKS_KEY_LEN);
	if (parent)
		memcpy(e->parent, parent, KVQ_BOOKS_KEY_LEN);
	else
		memset(e->parent, 0, KVQ_BOOKS_KEY_LEN);
	e->sum = tier_sum(r, e);
	__atomic_store_n(&e->set, 1, __ATOMIC_RELEASE);
}

int kvq_books_tier_get(const kvq_books *b, uint32_t r, uint32_t *cls, uint8_t key[KVQ_BOOKS_KEY_LEN],
		       uint8_t parent[KVQ_BOOKS_KEY_LEN], int *has_parent)
{
	const struct tier_entry *e = &tiers(b)[r];

	if (r >= b->h->n_tier || !e->set)
		return 0;
	if (e->set != 1 || e->has_parent > 1 || e->sum != tier_sum(r, e))
		return -EBADMSG;
	*cls = e->cls;
	*has_parent = e->has_parent;
	memcpy(key, e->key, KVQ_BOOKS_KEY_LEN);
	memcpy(parent, e->parent, KVQ_BOOKS_KEY_LEN);
	return 1;
}

uint64_t kvq_books_start_time(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* the command name may hold blanks and parentheses: fields count
	 * from the last ')' (field 2's end); start time is field 22 */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
			 &start) != 1)
		return 0;
	return start;
}

int kvq_books_client(kvq_books *b, pid_t pid, uint64_t holder)
{
	struct client_entry *c = clients(b);

	for (uint32_t i = 0; i < b->h->n_clients; i++)
		if (c[i].pid == 0) {
			c[i].start = kvq_books_start_time(pid);
			c[i].holder = holder;
			__atomic_store_n(&c[i].pid, (int32_t)pid, __ATOMIC_RELEASE);
			return (int)i;
		}
	b->h->clients_lost = 1;
	return -ENOSPC;
}

void kvq_books_client_gone(kvq_books *b, int entry)
{
	if (entry >= 0 && (uint32_t)entry < b->h->n_clients)
		__atomic_store_n(&clients(b)[entry].pid, 0, __ATOMIC_RELEASE);
}

uint32_t kvq_books_n_clients(const kvq_books *b)
{
	return b->h->n_clients;
}

pid_t kvq_books_client_pid(const kvq_books *b, uint32_t i, uint64_t *ret_start, uint64_t *ret_holder)
{
	const struct client_entry *c = &clients(b)[i];

	*ret_start = c->start;
	*ret_holder = c->holder;
	return c->pid;
}

int kvq_books_clients_lost(const kvq_books *b)
{
	return b->h->clients_lost != 0;
}

void kvq_books_seal(kvq_books *b)
{
	b->h->body_sum = fnv(FNV_BASIS, b->map + b->h->head_bytes, b->size - b->h->head_bytes);
	__atomic_store_n(&b->h->clean, 1, __ATOMIC_RELEASE);
}

void kvq_books_unseal(kvq_books *b)
{
	__atomic_store_n(&b->h->clean, 0, __ATOMIC_RELEASE);
}
