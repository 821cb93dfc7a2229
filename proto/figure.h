/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading a pool's figures (kvq.proto PoolStats.figures, version 7) by
 * name: the one lookup libkvq, kvqctl and the tests share.  kvqd makes the
 * list from its table (daemon/figures.h); a reader knows no figure list.
 */
#ifndef KVQ_FIGURE_H
#define KVQ_FIGURE_H

#include <stdint.h>
#include <sys/types.h>

#include "kvq.pb-c.h"

/* The index in p->figures of the figure called name, or -1. */
ssize_t kvq_figure_index(const Kvq__PoolStats *p, const char *name);

/* The figure called name of p: returns 0 and *ret_value, or -ENOENT (a
 * daemon without that figure) with *ret_value untouched. */
int kvq_figure_get(const Kvq__PoolStats *p, const char *name, uint64_t *ret_value);

/* The figure called name of p, or 0 when p has none (a display's value). */
uint64_t kvq_figure_or_0(const Kvq__PoolStats *p, const char *name);

#endif
