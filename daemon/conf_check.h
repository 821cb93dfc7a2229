/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kvqd.conf checks that one value alone cannot make (conf_check.c): a
 * pool section's keys together, the pools of one device together, names.
 */
#ifndef KVQD_CONF_CHECK_H
#define KVQD_CONF_CHECK_H

#include <stdbool.h>

#include "conf.h"

/* What the reader knows of a section at its end. */
struct conf_check_section {
	void *item;             /* the section's struct */
	const unsigned *seen;   /* line of each key set in it (K_*), 0: unset */
	const char *policy;     /* the policy's text, read once layers is known */
	unsigned line;          /* of its header */
};

/* What is wrong (without the file: the reader adds it) and on which line. */
struct conf_check_error {
	unsigned line;
	char msg[KVQ_CONFIG_MSG_MAX];
};

/* A section name: 1-KVQ_CONFIG_NAME_MAX of [A-Za-z0-9._-]. */
bool conf_valid_name(const char *s);

/* The checks of a [pool] section once all its keys are read and the
 * required ones are known to be there (keys that depend on each other):
 * the policy is parsed into the pool, the default window resolved.  0, or
 * -EINVAL with *e set. */
int conf_check_pool(const struct conf_check_section *sec, struct conf_check_error *e);

/* The checks of a [remote] section once its keys are read: a user needs a
 * password; the files (password_file, hmac_key_file) are read into the
 * section, each refused unless a regular file that neither group nor
 * others may access, of a size in bounds.  0, or -EINVAL (-ENOMEM) with
 * *e set. */
int conf_check_remote(const struct conf_check_section *sec, struct conf_check_error *e);

/* The checks across sections, once the file is read and the defaults are
 * in: shares and capacities of the pools of one device, the remote each
 * sharing pool names.  0, or -EINVAL with
 * *e set. */
int conf_check_all(const struct kvq_config *c, struct conf_check_error *e);

#endif
