/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvqd.conf reader (conf_parse.c): lines, sections and keys, each value
 * read by conf_value.h, the rows' defaults, inheritance from [kvqd], the
 * section kinds' hooks; and a config's allocation and release.
 */
#ifndef KVQD_CONF_PARSE_H
#define KVQD_CONF_PARSE_H

#include <stddef.h>

#include "conf.h"

/* Built-in defaults, with no file: socket /run/kvqd/kvqd.sock, backend
 * auto, device 0, memory_budget 90%, log_level info, create_on_attach yes
 * for root and the daemon's own user (create_uids / create_gids widen it;
 * create_uids replaces that default), created pools get 25% of the budget, no
 * quota, admin operations for root and the daemon's own user (admin_uids /
 * admin_gids as create_*), no metrics, the limits' defaults, no pools: the
 * rows' defaults (conf_keys.h).  Returns 0 and *ret_config (free with
 * kvq_config_free), or -ENOMEM. */
int kvq_config_new(struct kvq_config **ret_config);

/* Parses the file at path.  Returns 0 and *ret_config; -EINVAL with
 * "PATH:LINE: what is wrong" in err; or the open/read error (negative errno)
 * with "PATH: reason".  *ret_config is untouched on failure. */
int kvq_config_parse_file(const char *path, struct kvq_config **ret_config, char *err, size_t errlen);

/* Parses text[0..len) as if read from a file called name (for messages);
 * same returns as kvq_config_parse_file. */
int kvq_config_parse_string(const char *text, size_t len, const char *name, struct kvq_config **ret_config,
			    char *err, size_t errlen);

/* Frees a config; accepts NULL. */
void kvq_config_free(struct kvq_config *c);

#endif
