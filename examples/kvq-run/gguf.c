/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

#define GGUF_MAX_TENSORS 65536
#define GGUF_MAX_KV 65536

struct gguf_kv {
	struct gguf_str key;
	uint32_t type;
	const uint8_t *val;      /* the value's bytes in the mapping */
};

struct gguf_file {
	const uint8_t *map;
	size_t size;
	struct gguf_kv *kv;
	uint64_t n_kv;
	struct gguf_tensor *t;
	uint64_t n_t;
};

/* A bounds-checked cursor over the mapping; any overrun sets bad. */
struct cur {
	const uint8_t *p, *end;
	bool bad;
};

static const void *take(struct cur *c, uint64_t n)
{
	const uint8_t *p = c->p;

	if (c->bad || n > (uint64_t)(c->end - c->p)) {
		c->bad = true;
		return NULL;
	}
	c->p += n;
	return p;
}

static uint64_t take_u(struct cur *c, unsigned bytes)
{
	const uint8_t *p = take(c, bytes);
	uint64_t v = 0;

	if (p)
		memcpy(&v, p, bytes);   /* little-endian hosts only (x86-64, arm64) */
	return v;
}

static struct gguf_str take_str(struct cur *c)
{
	struct gguf_str s = { NULL, 0 };
	uint64_t n = take_u(c, 8);

	if (n > UINT32_MAX) {
		c->bad = true;
		return s;
	}
	s.p = take(c, n);
	s.len = (uint32_t)n;
	return s;
}

static unsigned scalar_bytes(uint32_t type)
{
	static const unsigned b[] = { [GGUF_V_U8] = 1, [GGUF_V_I8] = 1, [GGUF_V_U16] = 2, [GGUF_V_I16] = 2,
		[GGUF_V_U32] = 4, [GGUF_V_I32] = 4, [GGUF_V_F32] = 4, [GGUF_V_BOOL] = 1, [GGUF_V_U64] = 8,
		[GGUF_V_I64] = 8, [GGUF_V_F64] = 8 };

	return type < sizeof(b) / sizeof(b[0]) ? b[type] : 0;
}

/* Skips one value of type (arrays of arrays are refused). */
static void skip_value(struct cur *c, uint32_t type, int depth)
{
	if (type == GGUF_V_STRING) {
		take_str(c);
	} else if (type == GGUF_V_ARRAY && depth == 0) {
		uint32_t et = (uint32_t)take_u(c, 4);
		uint64_t n = take_u(c, 8);

		if (et == GGUF_V_STRING || et == GGUF_V_ARRAY) {
			for (uint64_t i = 0; i < n && !c->bad; i++)
				skip_value(c, et, depth + 1);
		} else if (scalar_bytes(et) && n <= UINT64_MAX / 8) {
			take(c, n * scalar_bytes(et));
		} else {
			c->bad = true;
		}
	} else if (scalar_bytes(type)) {
		take(c, scalar_bytes(type));
	} else {
		c->bad = true;
	}
}

static unsigned block_elems(uint32_t type)
{
	return type == GGUF_T_F32 || type == GGUF_T_F16 || type == GGUF_T_BF16 ? 1 : 32;
}

size_t gguf_row_bytes(uint32_t type, uint64_t n)
{
	switch (type) {
	case GGUF_T_F32: return n * 4;
	case GGUF_T_F16:
	case GGUF_T_BF16: return n * 2;
	case GGUF_T_Q4_0: return n / 32 * 18;
	case GGUF_T_Q4_1: return n / 32 * 20;
	case GGUF_T_Q8_0: return n / 32 * 34;
	default: return 0;
	}
}

const char *gguf_type_name(uint32_t type)
{
	switch (type) {
	case GGUF_T_F32: return "F32";
	case GGUF_T_F16: return "F16";
	case GGUF_T_BF16: return "BF16";
	case GGUF_T_Q4_0: return "Q4_0";
	case GGUF_T_Q4_1: return "Q4_1";
	case GGUF_T_Q8_0: return "Q8_0";
	default: return "unknown";
	}
}

static int failf(char *err, size_t len, int r, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return r;
}

static int parse(gguf_file *f, char *err, size_t errlen)
{
	struct cur c = { f->map, f->map + f->size, false };
	uint64_t align = 32, data_off;
	uint32_t version;

	if (f->size < 24 || memcmp(f->map, "GGUF", 4))
		return failf(err, errlen, -EINVAL, "not a GGUF file");
	take(&c, 4);
	version = (uint32_t)take_u(&c, 4);
	if (version != 2 && version != 3)
		return failf(err, errlen, -EINVAL, "GGUF version %u (2 or 3 supported)", version);
	f->n_t = take_u(&c, 8);
	f->n_kv = take_u(&c, 8);
	if (f->n_t > GGUF_MAX_TENSORS || f->n_kv > GGUF_MAX_KV)
		return failf(err, errlen, -EINVAL, "too many tensors or keys");
	f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(*f->kv));
	f->t = calloc(f->n_t ? f->n_t : 1, sizeof(*f->t));
	if (!f->kv || !f->t)
		return -ENOMEM;
	for (uint64_t i = 0; i < f->n_kv && !c.bad; i++) {
		struct gguf_kv *kv = &f->kv[i];

		kv->key = take_str(&c);
		kv->type = (uint32_t)take_u(&c, 4);
		kv->val = c.p;
		skip_value(&c, kv->type, 0);
		if (!c.bad && kv->key.len == 17 && !memcmp(kv->key.p, "general.alignment", 17) &&
		    kv->type == GGUF_V_U32)
			memcpy(&align, kv->val, 4), align &= 0xffffffffu;
	}
	if (c.bad)
		return failf(err, errlen, -EINVAL, "truncated metadata");
	if (align == 0 || (align & (align - 1)))
		return failf(err, errlen, -EINVAL, "bad alignment %llu", (unsigned long long)align);
	for (uint64_t i = 0; i < f->n_t && !c.bad; i++) {
		struct gguf_tensor *t = &f->t[i];
		struct gguf_str name = take_str(&c);
		uint64_t off;

		t->n_dims = (uint32_t)take_u(&c, 4);
		if (c.bad || t->n_dims < 1 || t->n_dims > 4 || name.len >= sizeof(t->name))
			return failf(err, errlen, -EINVAL, "bad tensor %llu", (unsigned long long)i);
		memcpy(t->name, name.p, name.len);
		t->rows = 1;
		for (uint32_t d = 0; d < 4; d++) {
			t->ne[d] = d < t->n_dims ? take_u(&c, 8) : 1;
			if (t->ne[d] == 0 || t->ne[d] > (1ull << 32))
				return failf(err, errlen, -EINVAL, "tensor %s: bad shape", t->name);
			if (d > 0)
				t->rows *= t->ne[d];
		}
		t->type = (uint32_t)take_u(&c, 4);
		off = take_u(&c, 8);
		t->row_bytes = gguf_row_bytes(t->type, t->ne[0]);
		if (!t->row_bytes)
			return failf(err, errlen, -ENOTSUP, "tensor %s: type %u not supported", t->name, t->type);
		if (t->ne[0] % block_elems(t->type))
			return failf(err, errlen, -EINVAL, "tensor %s: row not a whole number of blocks", t->name);
		t->data = (const uint8_t *)(uintptr_t)off;   /* relative until the data offset is known */
	}
	if (c.bad)
		return failf(err, errlen, -EINVAL, "truncated tensor table");
	data_off = ((uint64_t)(c.p - f->map) + align - 1) / align * align;
	for (uint64_t i = 0; i < f->n_t; i++) {
		struct gguf_tensor *t = &f->t[i];
		uint64_t off = (uint64_t)(uintptr_t)t->data, bytes = t->row_bytes * t->rows;

		if (data_off > f->size || off > f->size - data_off || bytes > f->size - data_off - off)
			return failf(err, errlen, -EINVAL, "tensor %s lies beyond the file", t->name);
		t->data = f->map + data_off + off;
	}
	return 0;
}

int gguf_open(const char *path, gguf_file **ret_file, char *err, size_t errlen)
{
	gguf_file *f = calloc(1, sizeof(*f));
	struct stat st;
	int fd, r;

	if (!f)
		return -ENOMEM;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		r = failf(err, errlen, -errno, "%s: %s", path, strerror(errno));
		goto fail;
	}
	f->size = (size_t)st.st_size;
	f->map = mmap(NULL, f->size ? f->size : 1, PROT_READ, MAP_PRIVATE, fd, 0);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		r = failf(err, errlen, -errno, "mmap %s: %s", path, strerror(errno));
		goto fail;
	}
	close(fd);
	fd = -1;
	r = parse(f, err, errlen);
	if (r < 0)
		goto fail;
	*ret_file = f;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	gguf_close(f);
	return r;
}

void gguf_close(gguf_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap((void *)f->map, f->size ? f->size : 1);
	free(f->kv);
	free(f->t);
	free(f);
}

const struct gguf_tensor *gguf_tensor(const gguf_file *f, const char *name)
{
	for (uint64_t i = 0; i < f->n_t; i++)
		if (!strcmp(f->t[i].name, name))
			return &f->t[i];
	return NULL;
}

static const struct gguf_kv *find(const gguf_file *f, const char *key)
{
	size_t n = strlen(key);

	for (uint64_t i = 0; i < f->n_kv; i++)
		if (f->kv[i].key.len == n && !memcmp(f->kv[i].key.p, key, n))
			return &f->kv[i];
	return NULL;
}

int gguf_get_uint(const gguf_file *f, const char *key, uint64_t *ret)
{
	const struct gguf_kv *kv = find(f, key);
	uint64_t v = 0;

	if (!kv)
		return -ENOENT;
	switch (kv->type) {
	case GGUF_V_U8: case GGUF_V_U16: case GGUF_V_U32: case GGUF_V_U64: case GGUF_V_BOOL:
		memcpy(&v, kv->val, scalar_bytes(kv->type));
		break;
	case GGUF_V_I8: case GGUF_V_I16: case GGUF_V_I32: case GGUF_V_I64: {
		int64_t s = 0;
		unsigned b = scalar_bytes(kv->type);

		memcpy(&s, kv->val, b);
		s = (int64_t)((uint64_t)s << (64 - 8 * b)) >> (64 - 8 * b);   /* sign-extend */
		if (s < 0)
			return -EINVAL;
		v = (uint64_t)s;
		break;
	}
	default:
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

int gguf_get_float(const gguf_file *f, const char *key, float *ret)
{
	const struct gguf_kv *kv = find(f, key);
	double d;

	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_V_F32) {
		memcpy(ret, kv->val, 4);
	} else if (kv->type == GGUF_V_F64) {
		memcpy(&d, kv->val, 8);
		*ret = (float)d;
	} else {
		return -EINVAL;
	}
	return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, struct gguf_str *ret)
{
	const struct gguf_kv *kv = find(f, key);
	struct cur c;

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_V_STRING)
		return -EINVAL;
	c = (struct cur){ kv->val, f->map + f->size, false };
	*ret = take_str(&c);
	return 0;
}

/* The array header of key: element type and count; *c is left on the data. */
static int array_at(const gguf_file *f, const char *key, struct cur *c, uint32_t *ret_type, uint64_t *ret_n)
{
	const struct gguf_kv *kv = find(f, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_V_ARRAY)
		return -EINVAL;
	*c = (struct cur){ kv->val, f->map + f->size, false };
	*ret_type = (uint32_t)take_u(c, 4);
	*ret_n = take_u(c, 8);
	return 0;
}

int gguf_get_array(const gguf_file *f, const char *key, uint32_t *ret_type, uint64_t *ret_n,
		   const void **ret_data)
{
	struct cur c;
	int r = array_at(f, key, &c, ret_type, ret_n);

	if (r < 0)
		return r;
	*ret_data = c.p;
	return 0;
}

int gguf_get_str_array(const gguf_file *f, const char *key, struct gguf_str **ret_strs, uint64_t *ret_n)
{
	struct gguf_str *v;
	struct cur c;
	uint32_t type;
	uint64_t n;
	int r = array_at(f, key, &c, &type, &n);

	if (r < 0)
		return r;
	if (type != GGUF_V_STRING || n > (1u << 24))
		return -EINVAL;
	v = calloc(n ? n : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++)
		v[i] = take_str(&c);   /* checked at open: cannot overrun */
	*ret_strs = v;
	*ret_n = n;
	return 0;
}
