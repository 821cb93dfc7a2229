/* SPDX-License-Identifier: Apache-2.0 */
/* The kvqd.conf checks that one value alone cannot make: a pool section's
 * keys together, the pools of one device together, names.  They say what
 * is wrong and on which line; the reader adds the file. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codebook.h"
#include "conf.h"
#include "conf_check.h"
#include "layout.h"
#include "seterr.h"

/* What is wrong, and where: returns -EINVAL. */
static int fail(struct conf_check_error *e, unsigned line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct conf_check_error *e, unsigned line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	e->line = line;
	return -EINVAL;
}

bool conf_valid_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > KVQ_CONFIG_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '.' && *s != '_' && *s != '-')
			return false;
	return true;
}

/* What needs several keys of a [pool] section: policy and layers, window
 * and block size, capacity and geometry. */
int conf_check_pool(const struct conf_check_section *sec, struct conf_check_error *e)
{
	struct kvq_config_pool *pl = sec->item;
	const unsigned *seen = sec->seen;
	struct kvq_layout_params lp;
	struct kvq_layout *L = NULL;
	char msg[KVQ_CONFIG_MSG_MAX];
	unsigned line;
	int rc;

	if (kvq_policy_parse(sec->policy, pl->layers, &pl->policy, msg, sizeof msg) < 0)
		return fail(e, seen[K_POOL_policy], "policy: %s", msg);
	/* codebooks come only with a request (kvq.proto, "File descriptors") */
	if (kvq_codebook_bytes(&pl->policy, pl->kv_heads, pl->head_dim) > 0)
		return fail(e, seen[K_POOL_policy],
				 "pool '%s': policy %s uses a codebook format: pools with codebook formats are created "
				 "by a client that sends the codebooks (kvqctl pool create --codebooks)", pl->name,
				 sec->policy);

	lp = (struct kvq_layout_params){
		.layers = pl->layers, .kv_heads = pl->kv_heads, .head_dim = pl->head_dim,
		.block_tokens = pl->block_tokens, .window = 0, .n_sealed = 1, .n_open = 1,
		.act = pl->act, .policy = &pl->policy,
	};
	/* with the default window, whatever the layout refuses is the
	 * policy's doing: the geometry keys were range-checked when read */
	if (kvq_layout_new(&lp, &L, msg, sizeof msg) < 0)
		return fail(e, seen[K_POOL_policy], "policy: %s", msg);
	if (seen[K_POOL_window]) {
		kvq_layout_free(L);
		L = NULL;
		if (pl->window % pl->block_tokens || pl->window > 64 * pl->block_tokens)
			return fail(e, seen[K_POOL_window],
				         "window %u is not a multiple of block_tokens (%u) up to 64 blocks", pl->window,
				         pl->block_tokens);
		lp.window = pl->window;
		if (kvq_layout_new(&lp, &L, msg, sizeof msg) < 0)
			return fail(e, seen[K_POOL_window], "window: %s", msg);
	}
	pl->window = L->window;
	kvq_layout_free(L);

	/* the smallest useful pool: one sealed block and one window of open
	 * blocks (and as many sink slots) */
	lp.window = pl->window;
	lp.n_open = pl->window / pl->block_tokens;
	lp.sink_blocks = pl->sink_blocks;
	lp.n_sink = pl->sink_blocks ? lp.n_open : 0;
	if ((rc = kvq_layout_new(&lp, &L, msg, sizeof msg)) < 0)
		return fail(e, sec->line, "pool '%s': %s", pl->name, msg);
	if (pl->capacity.kind == KVQ_AMOUNT_BYTES && pl->capacity.bytes < L->total_bytes) {
		line = seen[K_POOL_capacity];
		rc = fail(e, line,
			       "capacity %llu bytes is less than one sealed block and one open window (%llu bytes)",
			       (unsigned long long)pl->capacity.bytes, (unsigned long long)L->total_bytes);
		kvq_layout_free(L);
		return rc;
	}
	kvq_layout_free(L);
	return 0;
}

int conf_check_all(const struct kvq_config *c, struct conf_check_error *e)
{
	for (uint32_t i = 0; i < c->n_pools; i++) {
		const struct kvq_config_pool *pl = &c->pools[i];
		double share = 0;
		uint64_t bytes = 0;

		for (uint32_t j = 0; j <= i; j++) {
			const struct kvq_config_pool *q = &c->pools[j];

			if (q->device != pl->device)
				continue;
			if (q->capacity.kind == KVQ_AMOUNT_PERCENT)
				share += q->capacity.percent;
			else if (__builtin_add_overflow(bytes, q->capacity.bytes, &bytes))
				bytes = UINT64_MAX;
		}
		if (pl->capacity.kind == KVQ_AMOUNT_PERCENT && share > 100.0 + 1e-9)
			return fail(e, pl->line,
					 "pool '%s': memory_share of the pools on device %d adds up to %g%%", pl->name,
					 pl->device, share);
		if (pl->capacity.kind == KVQ_AMOUNT_BYTES && c->memory_budget.kind == KVQ_AMOUNT_BYTES &&
		    bytes > c->memory_budget.bytes)
			return fail(e, pl->line,
				         "pool '%s': capacity of the pools on device %d adds up to %llu bytes, over "
				         "memory_budget (%llu)",
				         pl->name, pl->device, (unsigned long long)bytes,
				         (unsigned long long)c->memory_budget.bytes);
	}
	return 0;
}
