/* SPDX-License-Identifier: Apache-2.0 */
/* The kvqd.conf checks that one value alone cannot make: a pool section's
 * keys together, the pools of one device together, names.  They say what
 * is wrong and on which line; the reader adds the file. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

	/* sharing: off unless remote is set, and then in a namespace */
	if (seen[K_POOL_remote] && !seen[K_POOL_remote_namespace])
		return fail(e, seen[K_POOL_remote], "pool '%s': remote needs remote_namespace", pl->name);
	if (!seen[K_POOL_remote] && (seen[K_POOL_remote_namespace] || seen[K_POOL_remote_write]))
		return fail(e, seen[K_POOL_remote_namespace] ? seen[K_POOL_remote_namespace] : seen[K_POOL_remote_write],
			    "pool '%s': %s without remote", pl->name,
			    seen[K_POOL_remote_namespace] ? "remote_namespace" : "remote_write");

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

/* A secret's file, read whole into buf[max] (*ret_len bytes): a regular
 * file that neither group nor others may access, of min to max bytes. */
static int read_secret(struct conf_check_error *e, unsigned line, const char *key, const char *path, size_t min,
		       size_t max, void *buf, size_t *ret_len)
{
	struct stat st;
	size_t got = 0;
	int fd, rc = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return fail(e, line, "%s %s: %s", key, path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = fail(e, line, "%s %s: %s", key, path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = fail(e, line, "%s %s: not a regular file", key, path);
		goto out;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		rc = fail(e, line, "%s %s: group or others may access it (mode %04o): it must be 0600 or 0400", key,
			  path, (unsigned)(st.st_mode & 07777));
		goto out;
	}
	/* one byte past max tells a file over the bound */
	for (;;) {
		uint8_t over;
		ssize_t n = got < max ? read(fd, (uint8_t *)buf + got, max - got) : read(fd, &over, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = fail(e, line, "%s %s: %s", key, path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		if (got == max) {
			rc = fail(e, line, "%s %s: longer than %zu bytes", key, path, max);
			goto out;
		}
		got += (size_t)n;
	}
	if (got < min)
		rc = fail(e, line, "%s %s: %zu bytes, fewer than %zu", key, path, got, min);
	else
		*ret_len = got;
out:
	close(fd);
	return rc;
}

int conf_check_remote(const struct conf_check_section *sec, struct conf_check_error *e)
{
	struct kvq_config_remote *r = sec->item;
	const unsigned *seen = sec->seen;
	char pw[KVQ_CONFIG_PASSWORD_MAX + 2];   /* a line end past the longest */
	size_t len = 0;
	int rc;

	if (seen[K_REMOTE_user] && !seen[K_REMOTE_password_file])
		return fail(e, seen[K_REMOTE_user], "remote '%s': user without password_file", r->name);
	if ((rc = read_secret(e, seen[K_REMOTE_hmac_key_file], "hmac_key_file", r->hmac_key_file, KVQ_CONFIG_HMAC_MIN,
			      KVQ_CONFIG_HMAC_MAX, r->hmac_key, &len)) < 0)
		return rc;
	r->hmac_key_len = (uint32_t)len;
	if (!seen[K_REMOTE_password_file])
		return 0;
	if ((rc = read_secret(e, seen[K_REMOTE_password_file], "password_file", r->password_file, 1,
			      sizeof pw, pw, &len)) < 0)
		goto out;
	/* one line: its end is not the password's */
	if (len && pw[len - 1] == '\n')
		len--;
	if (len && pw[len - 1] == '\r')
		len--;
	if (len == 0 || len > KVQ_CONFIG_PASSWORD_MAX || memchr(pw, '\0', len) || memchr(pw, '\n', len) ||
	    memchr(pw, '\r', len)) {
		rc = fail(e, seen[K_REMOTE_password_file],
			  "password_file %s: not one line of 1-%u bytes without NUL bytes", r->password_file,
			  KVQ_CONFIG_PASSWORD_MAX);
		goto out;
	}
	memset(r->password, 0, sizeof r->password);
	memcpy(r->password, pw, len);
out:
	explicit_bzero(pw, sizeof pw);
	return rc;
}

int conf_check_all(const struct kvq_config *c, struct conf_check_error *e)
{
	for (uint32_t i = 0; i < c->n_pools; i++) {
		const struct kvq_config_pool *pl = &c->pools[i];
		double share = 0;
		uint64_t bytes = 0;

		if (pl->remote[0] && !kvq_config_find_remote(c, pl->remote))
			return fail(e, pl->line, "pool '%s': remote '%s' names no [remote %s] section", pl->name,
				    pl->remote, pl->remote);

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
