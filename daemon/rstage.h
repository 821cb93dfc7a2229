/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's copies of a pool kvqd does not map (a cuda pool:
 * docs/DESIGN.md §4, "The remote tier"): a channel of the pool's backend
 * (backend.h, chan_open) over a pinned staging region of two records of
 * the pool's largest class, one for each thread that copies:
 *
 *  - the loop's (kvq_rstage_pull): a block's slices, DMA'd to the host
 *    where a record of its class has them (kvq_blockrec_slice_at), for the
 *    value of a block written to the remote; synchronous, as the value is
 *    made now (at eviction, before the slot can be reused);
 *  - the copy engine's (kvq_rstage_push): a checked record's slices,
 *    copied into the staging then DMA'd into a slot, for a fetch.
 *
 * The two share the channel's stream: each waits for its own copies and at
 * most the other's one record.  Not otherwise thread-safe.
 */
#ifndef KVQD_RSTAGE_H
#define KVQD_RSTAGE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "layout.h"

struct kvq_rstage;

/* The staging of the pool in mem (laid out as L) and its channel, on the
 * loop.  Returns 0 and *ret, or a negative code with err set (no channel:
 * a backend without one, no driver). */
int kvq_rstage_open(struct kvq_backend_mem *mem, const struct kvq_layout *L, struct kvq_rstage **ret, char *err,
		    size_t errlen);

/* On the loop, after the copy engine's last push (NULL is fine). */
void kvq_rstage_close(struct kvq_rstage *s);

/* On the loop: block r's slices into the loop's record, whose header and
 * tokens are left as they were (kvq_blockrec_seal makes it a record).
 * Returns 0 and *ret (valid until the next pull), or a negative code with
 * err set. */
int kvq_rstage_pull(struct kvq_rstage *s, struct kvq_block_ref r, const uint8_t **ret, char *err, size_t errlen);

/* On the copy thread: the slices of rec, a record of r's class that
 * kvq_blockrec_check took, into block r.  Returns 0, or a negative code
 * with err set. */
int kvq_rstage_push(struct kvq_rstage *s, struct kvq_block_ref r, const void *rec, char *err, size_t errlen);

#endif
