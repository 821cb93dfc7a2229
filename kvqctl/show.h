/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What Stats carries as kvqctl shows it (kvqctl(1), stats and pools): the
 * daemon, its devices and each pool, as JSON (json.h) or text.  A pool's
 * figures are read by name (kvq.proto PoolStats.figures); those the layout
 * has no place for are shown under their own names.
 */
#ifndef KVQCTL_SHOW_H
#define KVQCTL_SHOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvq.pb-c.h"

/* A pool's figures (PoolStats.figures) as a display reads them: by name,
 * each read marking the figure shown (when shown is not NULL), so that the
 * display can add the figures it has no place of its own for under their
 * names (a figure newer than this layout: kvqd's table, daemon/figures.h). */
struct figs {
	const Kvq__PoolStats *p;
	bool *shown;             /* per figure of p, or NULL */
};

/* The figure called name, or 0 when kvqd has none; fig32 clamps it. */
uint64_t fig(const struct figs *fs, const char *name);
uint32_t fig32(const struct figs *fs, const char *name);

/* Sealed bytes per token of a pool, and what the same geometry takes in
 * f16 (the baseline of the ratio), from the layout code. */
struct pool_fig {
	double bpt, bpt_f16;
	uint64_t used;           /* slot bytes in use: held, cached, reserved, open */
};

void pool_figures(const struct figs *fs, struct pool_fig *f);

/* "1.50 GiB": binary units for pool sizes, as kvqd.conf takes them. */
const char *human_bytes(double b, char *buf, size_t len);

/* a / b, NAN when b is 0. */
double ratio(uint64_t a, uint64_t b);

/* A pool's codebooks_sha256 in hex, its first n bytes (all: 32), or "-"
 * when it has none. */
const char *sha_str(const ProtobufCBinaryData *h, size_t n, char *buf, size_t len);

/* A device ordinal, "-" for host (-1). */
const char *dev_str(int device, char *buf, size_t len);

/* One pool's JSON object, with its clients when sr is not NULL. */
void json_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr);

/* The document of stats and pools: the daemon, then each pool, with its
 * clients when with_clients. */
void json_stats(const Kvq__StatsReply *sr, bool with_clients);

/* The daemon's line and one per device; a pool's lines, with its clients'
 * when sr is not NULL. */
void print_daemon(const Kvq__StatsReply *sr);
void print_pool(const Kvq__PoolStats *p, const Kvq__StatsReply *sr);

#endif
