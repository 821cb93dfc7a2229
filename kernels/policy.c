/* SPDX-License-Identifier: Apache-2.0 */
/* KV policies: the parser of the policy grammar (policy.h) and the
 * canonical form. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "seterr.h"

static const char *skip_blanks(const char *p, const char *end)
{
	while (p < end && isspace((unsigned char)*p))
		p++;
	return p;
}

static const char *trim_end(const char *p, const char *end)
{
	while (end > p && isspace((unsigned char)end[-1]))
		end--;
	return end;
}

#define ROT_SUFFIX "+rot"

/* One format name in [p, end), blanks trimmed, and its rotation suffix
 * '+' 'rot' (*rot 1 when it has one). */
static int parse_fmt(const char *p, const char *end, int clause, int *rot, char *err, size_t errlen)
{
	char names[KVQ_FMT_NAMES_LEN];
	const char *plus;
	int f;

	p = skip_blanks(p, end);
	end = trim_end(p, end);
	*rot = 0;
	if ((plus = memchr(p, '+', (size_t)(end - p)))) {
		const char *t = skip_blanks(plus + 1, end);
		if (end - t != 3 || memcmp(t, "rot", 3)) {
			kvq_seterr(err, errlen, "clause %d: expected '+rot' after the format name in '%.*s'", clause,
				   (int)(end - p), p);
			return -EINVAL;
		}
		*rot = 1;
		end = trim_end(p, plus);
	}
	if (p == end) {
		kvq_seterr(err, errlen, "clause %d: missing format name", clause);
		return -EINVAL;
	}
	f = kvq_fmt_from_name(p, (size_t)(end - p));
	if (f < 0)
		kvq_seterr(err, errlen, "clause %d: unknown format '%.*s' (known: %s)", clause, (int)(end - p), p,
			   kvq_fmt_names(names, sizeof(names)));
	return f;
}

/* spec := FORMAT | k=FORMAT,v=FORMAT | v=FORMAT,k=FORMAT; *ret_rot the
 * KVQ_ROT_* bits */
static int parse_spec(const char *p, const char *end, int clause, int *ret_k, int *ret_v, int *ret_rot,
		      char *err, size_t errlen)
{
	const char *comma = memchr(p, ',', (size_t)(end - p));
	int f[2] = { -1, -1 }, rot[2] = { 0, 0 };

	if (!comma) {
		const char *q = skip_blanks(p, end);
		if (end - q >= 2 && (q[0] == 'k' || q[0] == 'v') && memchr(q, '=', (size_t)(end - q))) {
			kvq_seterr(err, errlen, "clause %d: '%.*s' names only one of k= and v=", clause,
			       (int)(end - p), p);
			return -EINVAL;
		}
		int x = parse_fmt(p, end, clause, &rot[0], err, errlen);
		if (x < 0)
			return x;
		*ret_k = *ret_v = x;
		*ret_rot = rot[0] ? (int)(KVQ_ROT_K | KVQ_ROT_V) : 0;
		return 0;
	}
	for (int part = 0; part < 2; part++) {
		const char *a = part == 0 ? p : comma + 1;
		const char *b = part == 0 ? comma : end;
		const char *eq;
		int which;

		a = skip_blanks(a, b);
		eq = memchr(a, '=', (size_t)(b - a));
		if (!eq || trim_end(a, eq) - a != 1 || (a[0] != 'k' && a[0] != 'v')) {
			kvq_seterr(err, errlen, "clause %d: expected k=FORMAT,v=FORMAT in '%.*s'", clause,
			       (int)(end - p), p);
			return -EINVAL;
		}
		which = a[0] == 'v';
		if (f[which] >= 0) {
			kvq_seterr(err, errlen, "clause %d: %c= given twice", clause, a[0]);
			return -EINVAL;
		}
		if (memchr(eq + 1, ',', (size_t)(b - eq - 1)) || memchr(eq + 1, '=', (size_t)(b - eq - 1))) {
			kvq_seterr(err, errlen, "clause %d: expected k=FORMAT,v=FORMAT in '%.*s'", clause,
			       (int)(end - p), p);
			return -EINVAL;
		}
		f[which] = parse_fmt(eq + 1, b, clause, &rot[which], err, errlen);
		if (f[which] < 0)
			return -EINVAL;
	}
	*ret_k = f[0];
	*ret_v = f[1];
	*ret_rot = (rot[0] ? (int)KVQ_ROT_K : 0) | (rot[1] ? (int)KVQ_ROT_V : 0);
	return 0;
}

static int parse_uint(const char **pp, const char *end, unsigned long *ret)
{
	const char *p = *pp;
	unsigned long v = 0;

	if (p == end || !isdigit((unsigned char)*p))
		return -EINVAL;
	while (p < end && isdigit((unsigned char)*p)) {
		v = v * 10 + (unsigned long)(*p - '0');
		if (v > 1000000)
			return -EINVAL;
		p++;
	}
	*pp = p;
	*ret = v;
	return 0;
}

/* range := N | N- | N-M, into [*lo, *hi] */
static int parse_range(const char *p, const char *end, uint32_t n_layers, int clause,
		       uint32_t *lo, uint32_t *hi, char *err, size_t errlen)
{
	const char *s = p;
	unsigned long a, b;

	p = skip_blanks(p, end);
	end = trim_end(p, end);
	if (parse_uint(&p, end, &a) < 0)
		goto bad;
	b = a;
	p = skip_blanks(p, end);
	if (p < end && *p == '-') {
		p = skip_blanks(p + 1, end);
		if (p == end)
			b = n_layers ? n_layers - 1 : 0;
		else if (parse_uint(&p, end, &b) < 0)
			goto bad;
	}
	if (p != end)
		goto bad;
	if (a >= n_layers || b >= n_layers) {
		kvq_seterr(err, errlen, "clause %d: layer %lu beyond the model's %u layers (0-%u)", clause,
		       a >= n_layers ? a : b, n_layers, n_layers - 1);
		return -EINVAL;
	}
	if (b < a) {
		kvq_seterr(err, errlen, "clause %d: range %lu-%lu is empty", clause, a, b);
		return -EINVAL;
	}
	*lo = (uint32_t)a;
	*hi = (uint32_t)b;
	return 0;
bad:
	kvq_seterr(err, errlen, "clause %d: bad layer range '%.*s' (expected N, N- or N-M)", clause,
	       (int)(end - s), s);
	return -EINVAL;
}

int kvq_policy_parse(const char *s, uint32_t n_layers, struct kvq_policy *ret, char *err, size_t errlen)
{
	struct kvq_policy p;
	int owner[KVQ_MAX_LAYERS];
	const char *end, *clause_start;
	int clause = 0, nclauses = 1;

	if (!s) {
		kvq_seterr(err, errlen, "no policy given");
		return -EINVAL;
	}
	if (n_layers == 0 || n_layers > KVQ_MAX_LAYERS) {
		kvq_seterr(err, errlen, "number of layers %u out of range 1-%u", n_layers, KVQ_MAX_LAYERS);
		return -EINVAL;
	}
	if (strlen(s) > KVQ_POLICY_MAX_LEN) {
		kvq_seterr(err, errlen, "policy longer than %u characters", KVQ_POLICY_MAX_LEN);
		return -EINVAL;
	}
	memset(&p, 0, sizeof p);
	p.n_layers = n_layers;
	for (uint32_t l = 0; l < n_layers; l++)
		owner[l] = 0;
	for (const char *c = s; *c; c++)
		nclauses += *c == ';';

	end = s + strlen(s);
	clause_start = s;
	while (clause_start <= end) {
		const char *ce = memchr(clause_start, ';', (size_t)(end - clause_start));
		const char *colon;
		uint32_t lo = 0, hi = n_layers - 1;
		int kf, vf, rot;

		if (!ce)
			ce = end;
		clause++;
		if (skip_blanks(clause_start, ce) == ce) {
			kvq_seterr(err, errlen, "clause %d is empty", clause);
			return -EINVAL;
		}
		colon = memchr(clause_start, ':', (size_t)(ce - clause_start));
		if (colon) {
			if (parse_range(clause_start, colon, n_layers, clause, &lo, &hi, err, errlen) < 0)
				return -EINVAL;
		} else if (nclauses > 1) {
			kvq_seterr(err, errlen, "clause %d has no layer range; only a policy of one clause may omit it",
			       clause);
			return -EINVAL;
		}
		if (parse_spec(colon ? colon + 1 : clause_start, ce, clause, &kf, &vf, &rot, err, errlen) < 0)
			return -EINVAL;
		for (uint32_t l = lo; l <= hi; l++) {
			if (owner[l]) {
				kvq_seterr(err, errlen, "layer %u is covered twice (clauses %d and %d)", l, owner[l],
				       clause);
				return -EINVAL;
			}
			owner[l] = clause;
			p.k[l] = (uint8_t)kf;
			p.v[l] = (uint8_t)vf;
			p.rot[l] = (uint8_t)rot;
		}
		clause_start = ce + 1;
	}
	for (uint32_t l = 0; l < n_layers; l++) {
		if (!owner[l]) {
			kvq_seterr(err, errlen, "layer %u is not covered by any clause", l);
			return -EINVAL;
		}
	}
	*ret = p;
	return 0;
}

static int spec_print(char *buf, size_t len, int kf, int vf, unsigned rot)
{
	if (kf == vf && !rot)
		return snprintf(buf, len, "%s", kvq_fmt_name(kf));
	return snprintf(buf, len, "k=%s%s,v=%s%s", kvq_fmt_name(kf), rot & KVQ_ROT_K ? ROT_SUFFIX : "",
			kvq_fmt_name(vf), rot & KVQ_ROT_V ? ROT_SUFFIX : "");
}

int kvq_policy_format(const struct kvq_policy *p, char *buf, size_t len)
{
	size_t used = 0;
	uint32_t l = 0;

	if (len)
		buf[0] = '\0';
	if (p->n_layers == 0 || p->n_layers > KVQ_MAX_LAYERS)
		return -EINVAL;
	for (uint32_t i = 0; i < p->n_layers; i++)
		if (p->k[i] >= KVQ_FMT_COUNT || p->v[i] >= KVQ_FMT_COUNT || p->rot[i] & ~(KVQ_ROT_K | KVQ_ROT_V))
			return -EINVAL;
	while (l < p->n_layers) {
		uint32_t e = l;
		char tmp[64];
		int n;

		while (e + 1 < p->n_layers && p->k[e + 1] == p->k[l] && p->v[e + 1] == p->v[l] &&
		       p->rot[e + 1] == p->rot[l])
			e++;
		if (l == 0 && e == p->n_layers - 1) {
			n = spec_print(tmp, sizeof tmp, p->k[l], p->v[l], p->rot[l]);
		} else {
			char spec[56];
			spec_print(spec, sizeof spec, p->k[l], p->v[l], p->rot[l]);
			if (e == l)
				n = snprintf(tmp, sizeof tmp, "%s%u:%s", l ? ";" : "", l, spec);
			else
				n = snprintf(tmp, sizeof tmp, "%s%u-%u:%s", l ? ";" : "", l, e, spec);
		}
		if (used + (size_t)n + 1 > len) {
			if (len)
				snprintf(buf + used, len - used, "%s", tmp);
			return -ENOSPC;
		}
		memcpy(buf + used, tmp, (size_t)n + 1);
		used += (size_t)n;
		l = e + 1;
	}
	return (int)used;
}

unsigned kvq_policy_subdim(const struct kvq_policy *p, uint32_t layer, int is_v)
{
	int f;

	if (layer >= p->n_layers || layer >= KVQ_MAX_LAYERS)
		return 0;
	f = is_v ? p->v[layer] : p->k[layer];
	return f < KVQ_FMT_COUNT && kvq_fmt_param_kind(f, is_v) == KVQ_PARAM_CODEBOOK ? kvq_fmt_subdim(f) : 0;
}

int kvq_policy_equal(const struct kvq_policy *a, const struct kvq_policy *b)
{
	return a->n_layers == b->n_layers && a->n_layers <= KVQ_MAX_LAYERS && !memcmp(a->k, b->k, a->n_layers) &&
	       !memcmp(a->v, b->v, a->n_layers) && !memcmp(a->rot, b->rot, a->n_layers);
}

int kvq_policy_rotates(const struct kvq_policy *p)
{
	for (uint32_t l = 0; l < p->n_layers; l++)
		if (p->rot[l])
			return 1;
	return 0;
}

int kvq_policy_uses_kivi(const struct kvq_policy *p)
{
	for (uint32_t l = 0; l < p->n_layers; l++)
		if (kvq_fmt_param_kind(p->k[l], 0) == KVQ_PARAM_CHANNEL ||
		    kvq_fmt_param_kind(p->v[l], 0) == KVQ_PARAM_CHANNEL)
			return 1;
	return 0;
}
