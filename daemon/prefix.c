/* SPDX-License-Identifier: Apache-2.0 */
/* Prefix index of sealed blocks: content keys, chains, eviction (prefix.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "blockrec.h"
#include "chainkey.h"
#include "layout.h"
#include "prefix.h"

/* a block record (kernels/blockrec.h) carries this index's keys */
_Static_assert(KVQ_BLOCKREC_KEY_LEN == KVQ_PREFIX_KEY_LEN, "one key length");
/* its keys are chain keys in the pool's name (chainkey.h) */
_Static_assert(KVQ_CHAINKEY_LEN == KVQ_PREFIX_KEY_LEN && KVQ_CHAINKEY_MAX_NAME == KVQ_PREFIX_MAX_NAME &&
	       KVQ_CHAINKEY_MAX_SALT == KVQ_PREFIX_MAX_SALT, "one key construction");

enum { IN_CACHE = 1, HELD = 2 };

struct kvq_prefix {
	kvq_pool *pool;
	uint32_t n;                        /* blocks of the pool: sealed, then sink slots */
	uint32_t first_sink;               /* the first sink block id (n_sealed) */
	uint32_t B;                        /* tokens per block */
	struct kvq_chainkey ck;            /* keys in the pool's name */

	/* per sealed id, meaningful while IN_CACHE */
	uint8_t (*key)[KVQ_PREFIX_KEY_LEN];
	int32_t *parent;                   /* -1 for a first block */
	uint32_t *children;                /* cached children */
	uint32_t *pinned_children;         /* children that are pinned */
	uint8_t *flags;                    /* IN_CACHE, HELD (refs > 0 in the pool) */
	uint64_t *tick;                    /* when its last reference went */
	int32_t *heap_pos;                 /* index in heap[], -1 when not there */
	int32_t *next;                     /* next in its hash bucket, -1 at the end */

	/* evictable leaves (in cache, not held, no children), oldest tick on top */
	uint32_t *heap;
	uint32_t heap_len;

	int32_t *bucket;                   /* first block of each bucket, -1 if none */
	unsigned bucket_bits;
	uint64_t mult;                     /* random odd multiplier of the bucket index */

	uint64_t clock;
	uint32_t n_cached[2], n_pinned[2]; /* by class: sealed, sink */

	/* told each evicted block's key before it goes (kvq_prefix_set_evict_hook) */
	void (*evict_hook)(void *arg, const uint8_t *key, int demote);
	void *evict_arg;
	/* told each block's key that goes without a copy (kvq_prefix_set_drop_hook) */
	void (*drop_hook)(void *arg, const uint8_t *key);
	void *drop_arg;
	/* told each block that leaves, with its slot (kvq_prefix_set_leave_hook) */
	void (*leave_hook)(void *arg, uint32_t id, int32_t parent, int demote);
	void *leave_arg;
	/* told each block that enters or leaves the index (kvq_prefix_set_record_hook) */
	void (*record_hook)(void *arg, uint32_t id, const uint8_t *key, int32_t parent);
	void *record_arg;
};

/* ------------------------------------------------------------------- keys */

int kvq_prefix_key(const uint8_t *parent_key, const uint32_t *tokens, uint32_t block_tokens,
		   const char *pool_name, const char *model_id, const void *salt, size_t salt_len,
		   uint8_t ret_key[KVQ_PREFIX_KEY_LEN])
{
	return kvq_chainkey_once(parent_key, tokens, block_tokens, pool_name, model_id, salt, salt_len, ret_key);
}

static int block_key(struct kvq_prefix *x, const uint8_t *parent_key, const uint32_t *tokens, const void *salt,
		     size_t salt_len, uint8_t *ret_key)
{
	return kvq_chainkey_make(&x->ck, parent_key, tokens, salt, salt_len, ret_key);
}

/* ------------------------------------------------------------ hash table */

static uint32_t bucket_of(const struct kvq_prefix *x, const uint8_t *key)
{
	uint64_t k;

	/* SHA-256 output is uniform, but anyone who knows the namespace can
	 * compute keys and grind tokens into one bucket; a secret multiplier
	 * (multiply-shift hashing) takes that aim away */
	memcpy(&k, key, sizeof k);
	return (uint32_t)((k * x->mult) >> (64 - x->bucket_bits));
}

static int32_t hash_find(const struct kvq_prefix *x, const uint8_t *key)
{
	for (int32_t b = x->bucket[bucket_of(x, key)]; b >= 0; b = x->next[b])
		if (memcmp(x->key[b], key, KVQ_PREFIX_KEY_LEN) == 0)
			return b;
	return -1;
}

static void hash_insert(struct kvq_prefix *x, uint32_t b)
{
	int32_t *head = &x->bucket[bucket_of(x, x->key[b])];

	x->next[b] = *head;
	*head = (int32_t)b;
}

static void hash_remove(struct kvq_prefix *x, uint32_t b)
{
	int32_t *link = &x->bucket[bucket_of(x, x->key[b])];

	while (*link != (int32_t)b)
		link = &x->next[*link];
	*link = x->next[b];
	x->next[b] = -1;
}

/* ------------------------------------------------- heap of evictable leaves */

static int older(const struct kvq_prefix *x, uint32_t i, uint32_t j)
{
	return x->tick[x->heap[i]] < x->tick[x->heap[j]];
}

static void heap_swap(struct kvq_prefix *x, uint32_t i, uint32_t j)
{
	uint32_t t = x->heap[i];

	x->heap[i] = x->heap[j];
	x->heap[j] = t;
	x->heap_pos[x->heap[i]] = (int32_t)i;
	x->heap_pos[x->heap[j]] = (int32_t)j;
}

static void heap_up(struct kvq_prefix *x, uint32_t i)
{
	while (i > 0 && older(x, i, (i - 1) / 2)) {
		heap_swap(x, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static void heap_down(struct kvq_prefix *x, uint32_t i)
{
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < x->heap_len && older(x, l, m))
			m = l;
		if (r < x->heap_len && older(x, r, m))
			m = r;
		if (m == i)
			return;
		heap_swap(x, i, m);
		i = m;
	}
}

static void heap_push(struct kvq_prefix *x, uint32_t b)
{
	uint32_t i = x->heap_len++;

	x->heap[i] = b;
	x->heap_pos[b] = (int32_t)i;
	heap_up(x, i);
}

static void heap_remove(struct kvq_prefix *x, uint32_t b)
{
	int32_t pos = x->heap_pos[b];
	uint32_t i, last, moved;

	if (pos < 0)
		return;
	i = (uint32_t)pos;
	last = --x->heap_len;
	x->heap_pos[b] = -1;
	if (i == last)
		return;
	moved = x->heap[last];
	x->heap[i] = moved;
	x->heap_pos[moved] = (int32_t)i;
	heap_up(x, i);
	heap_down(x, (uint32_t)x->heap_pos[moved]);
}

/* ------------------------------------------------------------ pinning */

/* Class of block b: 0 sealed, 1 sink (daemon/pool.h). */
static int cls_of(const struct kvq_prefix *x, uint32_t b)
{
	return b >= x->first_sink;
}

static int pinned(const struct kvq_prefix *x, uint32_t b)
{
	return (x->flags[b] & HELD) || x->pinned_children[b] > 0;
}

/* b's pinned state just turned to on; its ancestors count pinned children,
 * so carry the change up for as long as an ancestor's own state turns too. */
static void pin_carry(struct kvq_prefix *x, uint32_t b, int on)
{
	for (int32_t p = x->parent[b]; p >= 0; p = x->parent[p]) {
		int was = pinned(x, (uint32_t)p);

		x->pinned_children[p] += on ? 1u : (uint32_t)-1;
		if (pinned(x, (uint32_t)p) == was)
			return;
		x->n_pinned[cls_of(x, (uint32_t)p)] += on ? 1u : (uint32_t)-1;
	}
}

static void on_held(void *ctx, uint32_t b, int held)
{
	struct kvq_prefix *x = ctx;
	int was = pinned(x, b);

	if (held) {
		x->flags[b] |= HELD;
		heap_remove(x, b);
	} else {
		x->flags[b] &= (uint8_t)~HELD;
		x->tick[b] = ++x->clock;
		if (x->children[b] == 0)
			heap_push(x, b);
	}
	if (pinned(x, b) != was) {
		x->n_pinned[cls_of(x, b)] += held ? 1u : (uint32_t)-1;
		pin_carry(x, b, held);
	}
}

/* ------------------------------------------------------------ eviction */

/* Evicts b, an evictable leaf (in the heap): its slot freed, or, with
 * demote, handed to the host tier's copy (kvq_pool_cache_demoting). */
static uint32_t evict_block_to(struct kvq_prefix *x, uint32_t b, int demote)
{
	int32_t p = x->parent[b];

	/* the record goes before the slot can change hands */
	if (x->record_hook)
		x->record_hook(x->record_arg, b, NULL, -1);
	if (x->evict_hook)
		x->evict_hook(x->evict_arg, x->key[b], demote);
	if (!demote && x->drop_hook)
		x->drop_hook(x->drop_arg, x->key[b]);
	if (x->leave_hook)
		x->leave_hook(x->leave_arg, b, p, demote);
	heap_remove(x, b);
	hash_remove(x, b);
	x->flags[b] = 0;
	x->n_cached[cls_of(x, b)]--;
	/* b was an unpinned leaf: no pin count above it changes */
	if (p >= 0 && --x->children[p] == 0 && !(x->flags[p] & HELD))
		heap_push(x, (uint32_t)p);
	if (demote)
		kvq_pool_cache_demoting(x->pool, b);
	else
		kvq_pool_cache_evicted(x->pool, b);
	return b;
}

static uint32_t evict_block(struct kvq_prefix *x, uint32_t b)
{
	return evict_block_to(x, b, 0);
}

static uint32_t evict_one(struct kvq_prefix *x)
{
	return evict_block(x, x->heap[0]);
}

int kvq_prefix_evict_key(kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN])
{
	int32_t b = hash_find(x, key);

	if (b < 0)
		return -ENOENT;
	if (x->heap_pos[b] < 0)
		return -EBUSY;
	evict_block(x, (uint32_t)b);
	return 0;
}

int kvq_prefix_has(const kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN])
{
	return hash_find(x, key) >= 0;
}

int kvq_prefix_evict_unless(kvq_prefix *x, int (*keep)(void *arg, const uint8_t *key), void *arg)
{
	uint32_t *victims = malloc(sizeof(*victims) * ((size_t)x->n_cached[0] + x->n_cached[1] + 1)), len = 0;
	int n = 0;

	if (!victims)
		return -ENOMEM;
	for (uint32_t i = 0; i < x->heap_len; i++)
		if (!keep(arg, x->key[x->heap[i]]))
			victims[len++] = x->heap[i];
	/* each block at most once: the leaves found, then each parent when its
	 * last child went */
	for (uint32_t i = 0; i < len; i++) {
		const uint32_t b = victims[i];
		const int32_t p = x->parent[b];

		evict_block(x, b);
		n++;
		if (p >= 0 && x->heap_pos[p] >= 0 && !keep(arg, x->key[p]))
			victims[len++] = (uint32_t)p;
	}
	free(victims);
	return n;
}

void kvq_prefix_set_evict_hook(kvq_prefix *x, void (*hook)(void *arg, const uint8_t *key, int demote), void *arg)
{
	x->evict_hook = hook;
	x->evict_arg = arg;
}

void kvq_prefix_set_drop_hook(kvq_prefix *x, void (*hook)(void *arg, const uint8_t *key), void *arg)
{
	x->drop_hook = hook;
	x->drop_arg = arg;
}

void kvq_prefix_set_leave_hook(kvq_prefix *x, void (*hook)(void *arg, uint32_t id, int32_t parent, int demote),
			       void *arg)
{
	x->leave_hook = hook;
	x->leave_arg = arg;
}

void kvq_prefix_set_record_hook(kvq_prefix *x, void (*hook)(void *arg, uint32_t id, const uint8_t *key,
							    int32_t parent),
				void *arg)
{
	x->record_hook = hook;
	x->record_arg = arg;
}

/* Evictable leaf b out of the index for the host tier, described in *v. */
static void demote_block(struct kvq_prefix *x, uint32_t b, struct kvq_prefix_victim *v)
{
	int32_t p = x->parent[b];

	v->id = b;
	v->cls = cls_of(x, b);
	memcpy(v->key, x->key[b], KVQ_PREFIX_KEY_LEN);
	v->has_parent = p >= 0;
	if (p >= 0)
		memcpy(v->parent, x->key[p], KVQ_PREFIX_KEY_LEN);
	else
		memset(v->parent, 0, KVQ_PREFIX_KEY_LEN);
	evict_block_to(x, b, 1);
}

uint32_t kvq_prefix_demote(kvq_prefix *x, int cls, uint32_t count, uint32_t max, struct kvq_prefix_victim *ret)
{
	uint32_t n = 0, of_cls = 0;

	/* the eviction order, as cache_evict takes it: blocks of the other
	 * class on the way go too (a sink comes after its chain) */
	while (of_cls < count && n < max && x->heap_len > 0) {
		demote_block(x, x->heap[0], &ret[n]);
		of_cls += ret[n].cls == cls;
		n++;
	}
	return n;
}

int kvq_prefix_demote_key(kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN], struct kvq_prefix_victim *ret)
{
	int32_t b = hash_find(x, key);

	if (b < 0)
		return -ENOENT;
	if (x->heap_pos[b] < 0)
		return -EBUSY;
	demote_block(x, (uint32_t)b, ret);
	return 0;
}

int kvq_prefix_chain_key(kvq_prefix *x, const uint8_t *parent_key, const uint32_t *tokens, const void *salt,
			 size_t salt_len, uint8_t ret_key[KVQ_PREFIX_KEY_LEN])
{
	if (salt_len > KVQ_PREFIX_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	return block_key(x, parent_key, tokens, salt, salt_len, ret_key);
}

int64_t kvq_prefix_find(const kvq_prefix *x, const uint8_t key[KVQ_PREFIX_KEY_LEN])
{
	return hash_find(x, key);
}

int kvq_prefix_evict(kvq_prefix *x, uint32_t count, uint32_t *ret_ids, uint32_t *ret_evicted)
{
	uint32_t i;

	/* every unpinned block has an unpinned leaf below it, so the heap runs
	 * dry only when nothing evictable is left */
	for (i = 0; i < count && x->heap_len > 0; i++) {
		uint32_t b = evict_one(x);

		if (ret_ids)
			ret_ids[i] = b;
	}
	*ret_evicted = i;
	return 0;
}

uint32_t kvq_prefix_evictable(const kvq_prefix *x, int cls)
{
	if (cls < 0)
		return x->n_cached[0] + x->n_cached[1] - x->n_pinned[0] - x->n_pinned[1];
	return x->n_cached[cls] - x->n_pinned[cls];
}

static uint32_t cache_evictable(void *ctx, int cls)
{
	return kvq_prefix_evictable(ctx, cls);
}

/* Evicts in the eviction order until count blocks of class cls went: an
 * unpinned block of either class is reached once the leaves below it went,
 * so the heap runs dry only when no block of cls is evictable. */
static uint32_t cache_evict(void *ctx, int cls, uint32_t count)
{
	struct kvq_prefix *x = ctx;
	uint32_t n = 0;

	while (n < count && x->heap_len > 0)
		n += cls_of(x, evict_one(x)) == cls;
	return n;
}

/* ------------------------------------------------------------ lifetime */

int kvq_prefix_new(kvq_pool *pool, uint32_t block_tokens, const char *pool_name, const char *model_id,
		   kvq_prefix **ret)
{
	struct kvq_prefix *x;
	struct kvq_pool_stats st;
	struct kvq_pool_cache cache;
	size_t pl, ml, nb;
	int r = -ENOMEM;

	if (!pool || !pool_name || !model_id || block_tokens == 0 || block_tokens > KVQ_MAX_BLOCK_TOKENS)
		return -EINVAL;
	pl = strnlen(pool_name, KVQ_PREFIX_MAX_NAME + 1);
	ml = strnlen(model_id, KVQ_PREFIX_MAX_NAME + 1);
	if (pl == 0 || ml == 0 || pl > KVQ_PREFIX_MAX_NAME || ml > KVQ_PREFIX_MAX_NAME)
		return -EINVAL;
	kvq_pool_stats(pool, &st);
	if (st.sealed_cached > 0 || st.sink_cached > 0)
		return -EINVAL;   /* it would hold blocks this index knows nothing of */

	x = calloc(1, sizeof *x);
	if (!x)
		return -ENOMEM;
	x->pool = pool;
	x->n = st.n_sealed + st.n_sink;
	x->first_sink = st.n_sealed;
	x->B = block_tokens;

	/* buckets: a power of two >= n, at least 2 so the shift stays < 64 */
	x->bucket_bits = 1;
	while ((1ull << x->bucket_bits) < x->n)
		x->bucket_bits++;
	nb = (size_t)1 << x->bucket_bits;

	x->key = calloc((size_t)x->n + 1, sizeof *x->key);
	x->parent = calloc((size_t)x->n + 1, sizeof *x->parent);
	x->children = calloc((size_t)x->n + 1, sizeof *x->children);
	x->pinned_children = calloc((size_t)x->n + 1, sizeof *x->pinned_children);
	x->flags = calloc((size_t)x->n + 1, sizeof *x->flags);
	x->tick = calloc((size_t)x->n + 1, sizeof *x->tick);
	x->heap_pos = calloc((size_t)x->n + 1, sizeof *x->heap_pos);
	x->next = calloc((size_t)x->n + 1, sizeof *x->next);
	x->heap = calloc((size_t)x->n + 1, sizeof *x->heap);
	x->bucket = calloc(nb, sizeof *x->bucket);
	if (!x->key || !x->parent || !x->children || !x->pinned_children || !x->flags || !x->tick ||
	    !x->heap_pos || !x->next || !x->heap || !x->bucket)
		goto fail;
	for (uint32_t i = 0; i < x->n; i++) {
		x->heap_pos[i] = -1;
		x->next[i] = -1;
		x->parent[i] = -1;
	}
	for (size_t i = 0; i < nb; i++)
		x->bucket[i] = -1;

	if ((r = kvq_chainkey_init(&x->ck, block_tokens, pool_name, model_id)) < 0)
		goto fail;
	r = -EIO;
	if (RAND_bytes((unsigned char *)&x->mult, sizeof x->mult) != 1)
		goto fail;
	x->mult |= 1;

	cache.ctx = x;
	cache.held = on_held;
	cache.evictable = cache_evictable;
	cache.evict = cache_evict;
	kvq_pool_set_cache(pool, &cache);
	*ret = x;
	return 0;

fail:
	x->pool = NULL;   /* not attached yet */
	kvq_prefix_free(x);
	return r;
}

void kvq_prefix_free(kvq_prefix *x)
{
	if (!x)
		return;
	if (x->pool)
		kvq_pool_set_cache(x->pool, NULL);
	kvq_chainkey_fini(&x->ck);
	free(x->key);
	free(x->parent);
	free(x->children);
	free(x->pinned_children);
	free(x->flags);
	free(x->tick);
	free(x->heap_pos);
	free(x->next);
	free(x->heap);
	free(x->bucket);
	free(x);
}

/* ------------------------------------------------------ publish, lookup */

/* CACHED block id into the index under key after parent (cached, or -1),
 * a leaf; held when it has references. */
static void insert(struct kvq_prefix *x, uint32_t id, const uint8_t *key, int32_t parent, int held)
{
	memcpy(x->key[id], key, KVQ_PREFIX_KEY_LEN);
	x->parent[id] = parent;
	x->children[id] = 0;
	x->pinned_children[id] = 0;
	x->flags[id] = IN_CACHE | (held ? HELD : 0);
	x->heap_pos[id] = -1;
	hash_insert(x, id);
	x->n_cached[cls_of(x, id)]++;
	if (parent >= 0) {
		x->children[parent]++;
		heap_remove(x, (uint32_t)parent);   /* no longer a leaf */
	}
	if (held) {
		x->n_pinned[cls_of(x, id)]++;
		pin_carry(x, id, 1);
	} else {
		x->tick[id] = ++x->clock;
		heap_push(x, id);
	}
}

int kvq_prefix_publish(kvq_prefix *x, uint32_t id, int32_t parent, const uint32_t *tokens,
		       const void *salt, size_t salt_len, uint32_t *ret_id)
{
	uint8_t key[KVQ_PREFIX_KEY_LEN];
	int32_t found;
	int r;

	if (id >= x->n || parent < -1 || (parent >= 0 && (uint32_t)parent >= x->n))
		return -ERANGE;
	if (!tokens || salt_len > KVQ_PREFIX_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	r = kvq_pool_check_sealed(x->pool, id, KVQ_POOL_BIT(KVQ_POOL_PRIVATE));
	if (r < 0)
		return r;
	if (parent >= 0 && !(x->flags[parent] & IN_CACHE))
		return -EINVAL;
	r = block_key(x, parent >= 0 ? x->key[parent] : NULL, tokens, salt, salt_len, key);
	if (r < 0)
		return r;
	found = hash_find(x, key);
	if (found >= 0) {
		*ret_id = (uint32_t)found;
		return 0;
	}

	r = kvq_pool_cache_insert(x->pool, id);
	if (r < 0)
		return r;
	insert(x, id, key, parent, 1);   /* a private block has references */
	if (x->record_hook)
		x->record_hook(x->record_arg, id, key, parent);
	*ret_id = id;
	return 0;
}

int kvq_prefix_restore(kvq_prefix *x, uint32_t id, const uint8_t key[KVQ_PREFIX_KEY_LEN], int32_t parent)
{
	if (id >= x->n || parent < -1 || (parent >= 0 && (uint32_t)parent >= x->n))
		return -ERANGE;
	if (kvq_pool_check_sealed(x->pool, id, KVQ_POOL_BIT(KVQ_POOL_CACHED)) < 0 || (x->flags[id] & IN_CACHE) ||
	    (parent >= 0 && !(x->flags[parent] & IN_CACHE)) || hash_find(x, key) >= 0)
		return -EINVAL;
	insert(x, id, key, parent, kvq_pool_refs(x->pool, id) > 0);
	if (x->record_hook)
		x->record_hook(x->record_arg, id, key, parent);
	return 0;
}

int kvq_prefix_match(kvq_prefix *x, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		     const void *salt, size_t salt_len, uint32_t max_ids, uint32_t *ret_count)
{
	uint8_t key[KVQ_PREFIX_KEY_LEN];
	uint32_t nb = (n_tokens < max_tokens ? n_tokens : max_tokens) / x->B, count = 0;
	int32_t last = -1;

	if ((nb && !tokens) || salt_len > KVQ_PREFIX_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	if (nb > max_ids)
		nb = max_ids;
	for (; count < nb; count++) {
		int r = block_key(x, last >= 0 ? x->key[last] : NULL, tokens + (size_t)count * x->B, salt, salt_len,
				  key);
		if (r < 0)
			return r;
		if ((last = hash_find(x, key)) < 0)
			break;
	}
	*ret_count = count;
	return 0;
}

int kvq_prefix_lookup(kvq_prefix *x, const uint32_t *tokens, uint32_t n_tokens, uint32_t max_tokens,
		      const void *salt, size_t salt_len, uint32_t *ret_ids, uint32_t max_ids,
		      uint32_t *ret_count)
{
	uint8_t key[KVQ_PREFIX_KEY_LEN];
	uint32_t nb = (n_tokens < max_tokens ? n_tokens : max_tokens) / x->B;
	uint32_t count = 0;
	int32_t last = -1;
	int r;

	if ((nb && !tokens) || salt_len > KVQ_PREFIX_MAX_SALT || (salt_len && !salt))
		return -EINVAL;
	if (nb > max_ids)
		nb = max_ids;
	/* first pass finds the chain and writes nothing, so a failure leaves
	 * ret_ids and every reference as they were */
	for (; count < nb; count++) {
		int32_t b;

		r = block_key(x, last >= 0 ? x->key[last] : NULL, tokens + (size_t)count * x->B, salt, salt_len,
			      key);
		if (r < 0)
			return r;
		b = hash_find(x, key);
		if (b < 0)
			break;
		if (kvq_pool_refs(x->pool, (uint32_t)b) >= KVQ_POOL_MAX_REFS)
			return -EOVERFLOW;
		last = b;
	}
	/* keys chain, so the blocks found are last and its ancestors */
	for (uint32_t i = count; i-- > 0; last = x->parent[last])
		ret_ids[i] = (uint32_t)last;
	/* references root first: each block's parent is then pinned already,
	 * and the pin carry stops after one step */
	for (uint32_t i = 0; i < count; i++)
		kvq_pool_ref(x->pool, ret_ids[i]);
	*ret_count = count;
	return 0;
}

/* --------------------------------------------------------------- queries */

int kvq_prefix_block_key(const kvq_prefix *x, uint32_t id, uint8_t ret_key[KVQ_PREFIX_KEY_LEN])
{
	if (id >= x->n)
		return -ERANGE;
	if (!(x->flags[id] & IN_CACHE))
		return -EINVAL;
	memcpy(ret_key, x->key[id], KVQ_PREFIX_KEY_LEN);
	return 0;
}

int64_t kvq_prefix_parent(const kvq_prefix *x, uint32_t id)
{
	if (id >= x->n)
		return -ERANGE;
	if (!(x->flags[id] & IN_CACHE))
		return -EINVAL;
	return x->parent[id];
}
