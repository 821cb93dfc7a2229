/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A host pool's first touch off the request path.  A host pool's memfd is
 * fallocated whole when it is made (daemon/backend_host.c: every page
 * reserved and charged), but the kernel clears each page, and kvqd maps it,
 * only when it is first touched: a fetch from the remote tier that unpacks
 * into fresh slots paid a page fault and a page clear per 4 KiB on the copy
 * engine's thread (bench/RESULTS.md).  A warm-up thread per pool, at the
 * lowest priority, populates kvqd's mapping of it writable in 4 MiB steps
 * (MADV_POPULATE_WRITE: the contents are not changed, so memory taken back
 * by a restart is warmed alike) until it is all mapped or it is stopped.
 * No memory is added: the pages were reserved already.
 */
#ifndef KVQD_WARM_H
#define KVQD_WARM_H

#include <stdint.h>

typedef struct kvq_warm kvq_warm;

/* Starts warming map[0, size) (kvqd's mapping of a host pool).  Returns the
 * warm-up, or NULL when it could not start (the pool is then touched as it
 * is used, as before). */
kvq_warm *kvq_warm_start(void *map, uint64_t size);

/* Stops the warm-up and waits for its thread (before the mapping goes);
 * NULL is fine. */
void kvq_warm_stop(kvq_warm *w);

#endif
