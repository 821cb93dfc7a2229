/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A read-only GGUF (version 2 and 3) reader: the file is mapped, metadata
 * and tensor descriptions are checked against its size once at open, and
 * tensors point into the mapping.
 */
#ifndef KVQ_RUN_GGUF_H
#define KVQ_RUN_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Tensor types this reader knows (GGML's numbering). */
enum {
	GGUF_T_F32 = 0,
	GGUF_T_F16 = 1,
	GGUF_T_Q4_0 = 2,
	GGUF_T_Q4_1 = 3,
	GGUF_T_Q8_0 = 8,
	GGUF_T_BF16 = 30,
};

/* Metadata value types. */
enum {
	GGUF_V_U8, GGUF_V_I8, GGUF_V_U16, GGUF_V_I16, GGUF_V_U32, GGUF_V_I32, GGUF_V_F32, GGUF_V_BOOL,
	GGUF_V_STRING, GGUF_V_ARRAY, GGUF_V_U64, GGUF_V_I64, GGUF_V_F64,
};

struct gguf_tensor {
	char name[96];
	uint32_t type, n_dims;
	uint64_t ne[4];          /* ne[0] is the row length (contiguous) */
	uint64_t rows;           /* product of ne[1..] */
	size_t row_bytes;
	const uint8_t *data;
};

/* A counted string inside the mapping (not NUL-terminated). */
struct gguf_str {
	const char *p;
	uint32_t len;
};

typedef struct gguf_file gguf_file;

/* Maps and checks path.  Returns 0 and *ret_file, -errno from open/mmap,
 * -EINVAL (not GGUF, a version other than 2/3, truncated or inconsistent)
 * or -ENOTSUP (a tensor type above).  err (may be NULL) gets a reason. */
int gguf_open(const char *path, gguf_file **ret_file, char *err, size_t errlen);

/* Unmaps and frees; NULL is fine. */
void gguf_close(gguf_file *f);

/* The tensor named name, or NULL. */
const struct gguf_tensor *gguf_tensor(const gguf_file *f, const char *name);

/* Bytes of one row of n elements of type t (n a multiple of the block). */
size_t gguf_row_bytes(uint32_t type, uint64_t n);

/* Name of a tensor type ("Q4_1"). */
const char *gguf_type_name(uint32_t type);

/* Scalar metadata: 0 and *ret, -ENOENT (no key) or -EINVAL (not an
 * integer / a float / a string). */
int gguf_get_uint(const gguf_file *f, const char *key, uint64_t *ret);
int gguf_get_float(const gguf_file *f, const char *key, float *ret);
int gguf_get_str(const gguf_file *f, const char *key, struct gguf_str *ret);

/* An array: *ret_n elements of type *ret_type.  For numeric types *ret_data
 * points at the packed values; for strings use gguf_get_str_array.
 * Returns 0, -ENOENT or -EINVAL. */
int gguf_get_array(const gguf_file *f, const char *key, uint32_t *ret_type, uint64_t *ret_n,
		   const void **ret_data);

/* A string array as a malloc'ed vector of n gguf_str (free() it).  Returns
 * 0, -ENOENT, -EINVAL or -ENOMEM. */
int gguf_get_str_array(const gguf_file *f, const char *key, struct gguf_str **ret_strs, uint64_t *ret_n);

#endif
