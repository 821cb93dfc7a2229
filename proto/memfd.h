/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sealed memfds: how a client hands kvqd a file it must not change
 * afterwards (a pool's codebooks, kvq.proto "File descriptors"), and how
 * kvqd checks what it got.  A memfd sealed against writing, shrinking and
 * growing (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) holds the same bytes
 * for as long as anyone has it, and can be mapped without a SIGBUS.
 *
 * Functions return 0 or a negative errno with a one-line reason in err;
 * nothing here prints.
 */
#ifndef KVQ_MEMFD_H
#define KVQ_MEMFD_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>

/* The seals a descriptor must carry (kvq_memfd_check). */
#define KVQ_MEMFD_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

/*
 * Copies the file at path (at most max bytes; read to its end, so a pipe
 * will do) into a new memfd called name (close-on-exec) and seals it with
 * KVQ_MEMFD_SEALS and F_SEAL_SEAL.  Returns 0 and *ret_fd (the caller's),
 * or -EFBIG (over max), open(2)'s, read(2)'s or memfd_create(2)'s error.
 */
int kvq_memfd_from_file(const char *path, uint64_t max, const char *name, int *ret_fd, char *err, size_t errlen);

/*
 * Whether fd is a sealed memfd of at most max bytes: a regular file (fstat)
 * whose seals (F_GET_SEALS) include KVQ_MEMFD_SEALS.  Returns 0 and
 * *ret_size, -EINVAL (not a regular file, not a memfd, seals missing: err
 * says which) or -E2BIG (over max).
 */
int kvq_memfd_check(int fd, uint64_t max, uint64_t *ret_size, char *err, size_t errlen);

#endif
