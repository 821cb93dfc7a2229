/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "utf8.h"
#include "unicode_table.h"

/* Control and user-defined tokens (GGUF token types 3 and 4). */
#define TOK_TYPE_CONTROL 3
#define TOK_TYPE_USER 4
#define TOK_MAX_SPECIAL 256

struct merge_slot {
	uint64_t pair;           /* (left id + 1) << 32 | right id; 0 = empty */
	uint32_t rank, merged;
};

struct tok {
	struct gguf_str *vocab;
	uint32_t n_vocab, eos;
	int32_t *ids_by_hash;    /* open addressing: vocabulary string -> id */
	uint32_t id_mask;
	struct merge_slot *merges;
	uint32_t merge_mask;
	uint32_t byte_tok[256];  /* token of each single byte */
	int16_t cp_byte[512];    /* code point (< 512) -> byte, -1 if none */
	uint32_t special[TOK_MAX_SPECIAL], n_special;
};

/* ---------------------------------------------------------------- unicode */

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (cp < r[mid][0])
			hi = mid;
		else if (cp > r[mid][1])
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

static bool is_letter(uint32_t cp)
{
	return in_ranges(unicode_letters, sizeof(unicode_letters) / sizeof(unicode_letters[0]), cp);
}

static bool is_number(uint32_t cp)
{
	return in_ranges(unicode_numbers, sizeof(unicode_numbers) / sizeof(unicode_numbers[0]), cp);
}

/* Unicode White_Space (what \s matches). */
static bool is_space(uint32_t cp)
{
	return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
	       (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
	       cp == 0x3000;
}

/* Decodes one UTF-8 sequence at s[0..n); an invalid byte stands for itself
 * as a code point of its own class (0xdc00 + byte: neither letter, number
 * nor space).  Returns its length. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
	unsigned len = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
	uint32_t v;

	if (len == 1) {
		*cp = s[0];
		return 1;
	}
	if (len == 0 || len > n)
		goto bad;
	v = s[0] & (0x7f >> len);
	for (unsigned i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			goto bad;
		v = v << 6 | (s[i] & 0x3f);
	}
	if ((len == 2 && v < 0x80) || (len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10ffff)))
		goto bad;
	*cp = v;
	return len;
bad:
	*cp = 0xdc00 + s[0];
	return 1;
}

/* GPT-2's byte -> printable code point map. */
static uint32_t byte_cp(unsigned b)
{
	unsigned n = 0;

	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
		return b;
	for (unsigned i = 0; i < b; i++)
		if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255)))
			n++;
	return 256 + n;
}

/* ---------------------------------------------------------------- tables */

static uint64_t fnv(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static int lookup(const tok *t, const char *p, size_t n)
{
	for (uint32_t i = (uint32_t)fnv(p, n) & t->id_mask;; i = (i + 1) & t->id_mask) {
		int32_t id = t->ids_by_hash[i];

		if (id < 0)
			return -ENOENT;
		if (t->vocab[id].len == n && !memcmp(t->vocab[id].p, p, n))
			return id;
	}
}

static const struct merge_slot *merge_find(const tok *t, uint32_t a, uint32_t b)
{
	uint64_t key = ((uint64_t)a + 1) << 32 | b;

	for (uint32_t i = (uint32_t)mix64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		if (t->merges[i].pair == key)
			return &t->merges[i];
		if (!t->merges[i].pair)
			return NULL;
	}
}

static uint32_t pow2_above(uint64_t n)
{
	uint32_t m = 1;

	while (m < 2 * n)
		m <<= 1;
	return m;
}

static int fail(char *err, size_t len, const char *msg)
{
	if (err && len)
		snprintf(err, len, "tokenizer: %s", msg);
	return -EINVAL;
}

static int load_merges(tok *t, const gguf_file *f, char *err, size_t errlen)
{
	struct gguf_str *m = NULL;
	uint64_t n;
	char buf[512];
	int r = gguf_get_str_array(f, "tokenizer.ggml.merges", &m, &n);

	if (r < 0)
		return r == -ENOMEM ? r : fail(err, errlen, "no merges");
	t->merge_mask = pow2_above(n) - 1;
	t->merges = calloc(t->merge_mask + 1, sizeof(*t->merges));
	if (!t->merges) {
		free(m);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < n; i++) {
		const char *sp = memchr(m[i].p, ' ', m[i].len);
		int a, b, ab;
		size_t la;

		if (!sp || m[i].len >= sizeof(buf))
			goto bad;
		la = (size_t)(sp - m[i].p);
		a = lookup(t, m[i].p, la);
		b = lookup(t, sp + 1, m[i].len - la - 1);
		memcpy(buf, m[i].p, la);
		memcpy(buf + la, sp + 1, m[i].len - la - 1);
		ab = lookup(t, buf, m[i].len - 1);
		if (a < 0 || b < 0 || ab < 0)
			goto bad;
		uint64_t key = ((uint64_t)a + 1) << 32 | (uint32_t)b;
		uint32_t j = (uint32_t)mix64(key) & t->merge_mask;

		while (t->merges[j].pair && t->merges[j].pair != key)
			j = (j + 1) & t->merge_mask;
		if (!t->merges[j].pair)   /* a repeated merge keeps its first rank */
			t->merges[j] = (struct merge_slot){ key, (uint32_t)i, (uint32_t)ab };
	}
	free(m);
	return 0;
bad:
	free(m);
	return fail(err, errlen, "a merge names tokens outside the vocabulary");
}

int tok_new(const gguf_file *f, tok **ret_tok, char *err, size_t errlen)
{
	struct gguf_str model;
	const uint8_t *types = NULL;   /* int32 each, unaligned in the mapping */
	uint32_t ttype;
	uint64_t n, nt = 0, eos = 0, unk = 0;
	tok *t;
	int r;

	if (gguf_get_str(f, "tokenizer.ggml.model", &model) < 0 || model.len != 4 || memcmp(model.p, "gpt2", 4))
		return fail(err, errlen, "not a byte-level BPE (gpt2) vocabulary");
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	r = gguf_get_str_array(f, "tokenizer.ggml.tokens", &t->vocab, &n);
	if (r < 0 || n == 0 || n > INT32_MAX) {
		r = r == -ENOMEM ? r : fail(err, errlen, "no vocabulary");
		goto fail;
	}
	t->n_vocab = (uint32_t)n;
	if (gguf_get_array(f, "tokenizer.ggml.token_type", &ttype, &nt, (const void **)&types) == 0 &&
	    (ttype != GGUF_V_I32 || nt != n))
		types = NULL;
	gguf_get_uint(f, "tokenizer.ggml.eos_token_id", &eos);
	if (gguf_get_uint(f, "tokenizer.ggml.unknown_token_id", &unk) < 0 || unk >= n)
		unk = 0;
	t->eos = eos < n ? (uint32_t)eos : 0;
	t->id_mask = pow2_above(n) - 1;
	t->ids_by_hash = malloc(sizeof(int32_t) * (t->id_mask + 1));
	if (!t->ids_by_hash) {
		r = -ENOMEM;
		goto fail;
	}
	memset(t->ids_by_hash, 0xff, sizeof(int32_t) * (t->id_mask + 1));
	for (uint32_t id = 0; id < n; id++) {
		uint32_t i = (uint32_t)fnv(t->vocab[id].p, t->vocab[id].len) & t->id_mask;
		int32_t type = 0;

		if (lookup(t, t->vocab[id].p, t->vocab[id].len) >= 0)
			continue;   /* a duplicate string: the first id wins */
		while (t->ids_by_hash[i] >= 0)
			i = (i + 1) & t->id_mask;
		t->ids_by_hash[i] = (int32_t)id;
		if (types)
			memcpy(&type, types + 4 * (size_t)id, 4);
		if ((type == TOK_TYPE_CONTROL || type == TOK_TYPE_USER) && t->vocab[id].len &&
		    t->n_special < TOK_MAX_SPECIAL)
			t->special[t->n_special++] = id;
	}
	for (unsigned i = 0; i < 512; i++)
		t->cp_byte[i] = -1;
	for (unsigned b = 0; b < 256; b++) {
		char s[4];
		size_t len = utf8_put(byte_cp(b), s);

		/* bytes that never occur in UTF-8 (0xc0, 0xf5..) may have no
		 * token: they become the unknown token */
		r = lookup(t, s, len);
		t->byte_tok[b] = r >= 0 ? (uint32_t)r : (uint32_t)unk;
		t->cp_byte[byte_cp(b)] = (int16_t)b;
	}
	r = load_merges(t, f, err, errlen);
	if (r < 0)
		goto fail;
	*ret_tok = t;
	return 0;
fail:
	tok_free(t);
	return r;
}

void tok_free(tok *t)
{
	if (!t)
		return;
	free(t->vocab);
	free(t->ids_by_hash);
	free(t->merges);
	free(t);
}

uint32_t tok_vocab(const tok *t)
{
	return t->n_vocab;
}

uint32_t tok_eos(const tok *t)
{
	return t->eos;
}

int tok_find(const tok *t, const char *piece)
{
	return lookup(t, piece, strlen(piece));
}

/* ---------------------------------------------------------------- encode */

struct ids {
	uint32_t *v;
	size_t n, cap;
};

static int push(struct ids *o, uint32_t id)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 256;
		uint32_t *v = realloc(o->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = id;
	return 0;
}

/* BPE of one pre-token: bytes -> byte tokens, then the lowest-ranked
 * adjacent pair merged until no pair has a merge. */
static int bpe(const tok *t, const unsigned char *p, size_t n, struct ids *out)
{
	uint32_t stack_sym[64], *sym = n <= 64 ? stack_sym : malloc(n * sizeof(*sym));
	size_t m = n;
	int r = 0;

	if (!sym)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		sym[i] = t->byte_tok[p[i]];
	while (m > 1) {
		const struct merge_slot *best = NULL;
		size_t at = 0;

		for (size_t i = 0; i + 1 < m; i++) {
			const struct merge_slot *s = merge_find(t, sym[i], sym[i + 1]);

			if (s && (!best || s->rank < best->rank)) {
				best = s;
				at = i;
			}
		}
		if (!best)
			break;
		sym[at] = best->merged;
		memmove(sym + at + 1, sym + at + 2, (m - at - 2) * sizeof(*sym));
		m--;
	}
	for (size_t i = 0; i < m && r == 0; i++)
		r = push(out, sym[i]);
	if (sym != stack_sym)
		free(sym);
	return r;
}

enum { CL_SPACE, CL_LETTER, CL_NUMBER, CL_OTHER };

static int cls(uint32_t cp)
{
	return is_space(cp) ? CL_SPACE : is_letter(cp) ? CL_LETTER : is_number(cp) ? CL_NUMBER : CL_OTHER;
}

/* Length in bytes of the pre-token at s[0..n) (GPT-2's regex; digits come
 * here one at a time, split off by the caller). */
static size_t pretoken(const unsigned char *s, size_t n)
{
	static const char *const contractions[] = { "'s", "'t", "'re", "'ve", "'m", "'ll", "'d" };
	uint32_t cp, cp2;
	size_t l = utf8_next(s, n, &cp), i, last;
	int c = cls(cp), c2;

	if (cp == '\'')
		for (unsigned k = 0; k < sizeof(contractions) / sizeof(contractions[0]); k++) {
			size_t cl = strlen(contractions[k]);

			if (cl <= n && !memcmp(s, contractions[k], cl))
				return cl;
		}
	if (cp == ' ' && l < n) {   /* " ?X+": an optional space before a run */
		utf8_next(s + l, n - l, &cp2);
		c2 = cls(cp2);
		if (c2 != CL_SPACE)
			c = c2;
		else
			c = CL_SPACE;
	}
	if (c != CL_SPACE) {
		i = cp == ' ' ? 1 : 0;
		while (i < n) {
			size_t k = utf8_next(s + i, n - i, &cp2);

			if (cls(cp2) != c)
				break;
			i += k;
		}
		return i;
	}
	/* \s+(?!\S)|\s+ : a run of spaces leaves its last one to the next
	 * token when a non-space follows */
	i = 0;
	last = 0;
	while (i < n) {
		size_t k = utf8_next(s + i, n - i, &cp2);

		if (!is_space(cp2))
			break;
		last = i;
		i += k;
	}
	if (i < n && last > 0)
		return last;
	return i;
}

/* Plain text: digits one by one, the rest by pretoken(). */
static int encode_plain(const tok *t, const unsigned char *s, size_t n, struct ids *out)
{
	size_t i = 0;
	int r = 0;

	while (i < n && r == 0) {
		size_t seg = i, k;
		uint32_t cp;

		/* the run up to the next digit (the digit split comes first) */
		while (seg < n) {
			k = utf8_next(s + seg, n - seg, &cp);
			if (is_number(cp))
				break;
			seg += k;
		}
		while (i < seg && r == 0) {
			k = pretoken(s + i, seg - i);
			r = bpe(t, s + i, k, out);
			i += k;
		}
		if (seg < n && r == 0) {
			k = utf8_next(s + seg, n - seg, &cp);
			r = bpe(t, s + seg, k, out);
			i = seg + k;
		}
	}
	return r;
}

int tok_encode(const tok *t, const char *text, size_t len, int special, uint32_t **ret_ids, size_t *ret_n)
{
	const unsigned char *s = (const unsigned char *)text;
	struct ids out = { NULL, 0, 0 };
	size_t start = 0, i = 0;
	int r = 0;

	while (i <= len && r == 0) {
		uint32_t hit = 0;
		size_t hl = 0;

		for (uint32_t k = 0; special && i < len && k < t->n_special; k++) {
			const struct gguf_str *v = &t->vocab[t->special[k]];

			if (v->len > hl && v->len <= len - i && !memcmp(s + i, v->p, v->len)) {
				hit = t->special[k];
				hl = v->len;
			}
		}
		if (hl || i == len) {
			r = encode_plain(t, s + start, i - start, &out);
			if (r == 0 && hl)
				r = push(&out, hit);
			i += hl ? hl : 1;
			start = i;
		} else {
			i++;
		}
	}
	if (r < 0) {
		free(out.v);
		return r;
	}
	*ret_ids = out.v;
	*ret_n = out.n;
	return 0;
}

int tok_decode(const tok *t, uint32_t id, char *buf, size_t len)
{
	const struct gguf_str *v;
	size_t i = 0, o = 0;

	if (id >= t->n_vocab)
		return -EINVAL;
	v = &t->vocab[id];
	while (i < v->len) {
		uint32_t cp;
		size_t k = utf8_next((const unsigned char *)v->p + i, v->len - i, &cp);
		int b = cp < 512 ? t->cp_byte[cp] : -1;

		/* control tokens and anything outside the byte map: as written */
		for (size_t j = 0; j < (b >= 0 ? 1 : k); j++, o++)
			if (o + 1 < len)
				buf[o] = b >= 0 ? (char)b : v->p[i + j];
		i += k;
	}
	if (len)
		buf[o < len ? o : len - 1] = 0;
	return (int)o;
}
