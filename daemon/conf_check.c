/* SPDX-License-Identifier: Apache-2.0 */
/* The kvqd.conf checks that one value alone cannot make: a pool section's
 * keys together, the pools of one device together, names, and the metrics
 * address. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "codebook.h"
#include "conf_parser.h"
#include "layout.h"

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

/* Checks a [pool] section once all its keys are read: what needs several
 * keys (policy and layers, window and block size, capacity and geometry). */
int conf_check_pool(struct conf_parser *p)
{
	static const int required[] = { K_MODEL, K_LAYERS, K_KV_HEADS, K_HEAD_DIM, K_POLICY };
	struct kvq_config_pool *pl = p->pool;
	struct kvq_layout_params lp;
	struct kvq_layout *L = NULL;
	char msg[KVQ_CONFIG_MSG_MAX];
	unsigned line;
	int rc;

	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
		if (!p->seen[required[i]])
			return conf_fail(p, p->sec_line, "pool '%s': missing key '%s'", pl->name,
					 conf_keys[required[i]].name);
	if (!p->seen[K_CAPACITY] && !p->seen[K_MEMORY_SHARE])
		return conf_fail(p, p->sec_line, "pool '%s': missing key 'capacity' or 'memory_share'", pl->name);

	if (kvq_policy_parse(p->policy, pl->layers, &pl->policy, msg, sizeof msg) < 0)
		return conf_fail(p, p->seen[K_POLICY], "policy: %s", msg);
	/* codebooks come only with a request (kvq.proto, "File descriptors") */
	if (kvq_codebook_bytes(&pl->policy, pl->kv_heads, pl->head_dim) > 0)
		return conf_fail(p, p->seen[K_POLICY],
				 "pool '%s': policy %s uses a codebook format: pools with codebook formats are created "
				 "by a client that sends the codebooks (kvqctl pool create --codebooks)", pl->name,
				 p->policy);

	lp = (struct kvq_layout_params){
		.layers = pl->layers, .kv_heads = pl->kv_heads, .head_dim = pl->head_dim,
		.block_tokens = pl->block_tokens, .window = 0, .n_sealed = 1, .n_open = 1,
		.act = pl->act, .policy = &pl->policy,
	};
	/* with the default window, whatever the layout refuses is the
	 * policy's doing: the geometry keys were range-checked when read */
	if (kvq_layout_new(&lp, &L, msg, sizeof msg) < 0)
		return conf_fail(p, p->seen[K_POLICY], "policy: %s", msg);
	if (p->seen[K_WINDOW]) {
		kvq_layout_free(L);
		L = NULL;
		if (pl->window % pl->block_tokens || pl->window > 64 * pl->block_tokens)
			return conf_fail(p, p->seen[K_WINDOW],
				         "window %u is not a multiple of block_tokens (%u) up to 64 blocks", pl->window,
				         pl->block_tokens);
		lp.window = pl->window;
		if (kvq_layout_new(&lp, &L, msg, sizeof msg) < 0)
			return conf_fail(p, p->seen[K_WINDOW], "window: %s", msg);
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
		return conf_fail(p, p->sec_line, "pool '%s': %s", pl->name, msg);
	if (pl->capacity.kind == KVQ_AMOUNT_BYTES && pl->capacity.bytes < L->total_bytes) {
		line = p->seen[K_CAPACITY];
		rc = conf_fail(p, line,
			       "capacity %llu bytes is less than one sealed block and one open window (%llu bytes)",
			       (unsigned long long)pl->capacity.bytes, (unsigned long long)L->total_bytes);
		kvq_layout_free(L);
		return rc;
	}
	kvq_layout_free(L);
	return 0;
}

int conf_check_all(struct conf_parser *p)
{
	const struct kvq_config *c = p->c;

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
			return conf_fail(p, pl->line,
					 "pool '%s': memory_share of the pools on device %d adds up to %g%%", pl->name,
					 pl->device, share);
		if (pl->capacity.kind == KVQ_AMOUNT_BYTES && c->memory_budget.kind == KVQ_AMOUNT_BYTES &&
		    bytes > c->memory_budget.bytes)
			return conf_fail(p, pl->line,
				         "pool '%s': capacity of the pools on device %d adds up to %llu bytes, over "
				         "memory_budget (%llu)",
				         pl->name, pl->device, (unsigned long long)bytes,
				         (unsigned long long)c->memory_budget.bytes);
	}
	return 0;
}

int kvq_config_parse_listen(const char *s, char *addr, size_t addrlen, uint16_t *ret_port, char *err,
			    size_t errlen)
{
	const char *colon, *host = s;
	size_t hlen;
	uint64_t port;
	struct in_addr a4;
	struct in6_addr a6;
	char h[KVQ_CONFIG_LISTEN_MAX + 1];

	if (strlen(s) > KVQ_CONFIG_LISTEN_MAX)
		return kvq_seterr(err, errlen, "longer than %u bytes", KVQ_CONFIG_LISTEN_MAX), -EINVAL;
	colon = strrchr(s, ':');
	if (!colon)
		return kvq_seterr(err, errlen, "not ADDRESS:PORT"), -EINVAL;
	if (conf_parse_u64(colon + 1, &port) < 0 || port == 0 || port > 65535)
		return kvq_seterr(err, errlen, "port is not a number in 1-65535"), -EINVAL;
	hlen = (size_t)(colon - s);
	if (hlen >= 2 && s[0] == '[' && s[hlen - 1] == ']') {
		host++;
		hlen -= 2;
	}
	memcpy(h, host, hlen);
	h[hlen] = '\0';
	if (inet_pton(AF_INET, h, &a4) == 1) {
		if ((ntohl(a4.s_addr) >> 24) != 127)
			return kvq_seterr(err, errlen, "%s is not a loopback address (127.0.0.0/8)", h), -EINVAL;
	} else if (inet_pton(AF_INET6, h, &a6) == 1 && host != s) {
		if (!IN6_IS_ADDR_LOOPBACK(&a6))
			return kvq_seterr(err, errlen, "%s is not the loopback address ::1", h), -EINVAL;
	} else {
		return kvq_seterr(err, errlen, "'%s' is not an IPv4 address or a bracketed IPv6 address", h), -EINVAL;
	}
	if (hlen >= addrlen)
		return kvq_seterr(err, errlen, "address too long"), -EINVAL;
	memcpy(addr, h, hlen + 1);
	*ret_port = (uint16_t)port;
	return 0;
}
