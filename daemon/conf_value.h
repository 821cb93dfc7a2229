/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvqd.conf's values (conf_value.c): one value read by its row's type
 * (conf_keys.h) into the field of its section's struct; and the value
 * syntaxes others use too (sizes, the metrics address).
 */
#ifndef KVQD_CONF_VALUE_H
#define KVQD_CONF_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h"

/* What is wrong with a value, without FILE:LINE (the reader adds them). */
struct conf_value_msg {
	char msg[KVQ_CONFIG_MSG_MAX];
};

/* Reads v as row k's value into item (the struct of k's section); a
 * policy's text goes to policy[KVQ_POLICY_MAX_LEN + 1], read once layers
 * is known.  0, or -EINVAL (-ENOMEM) with m set. */
int conf_value_read(struct conf_value_msg *m, int k, const char *v, void *item, char *policy);

/* s without the blanks (spaces, tabs) around it: cut in place. */
char *conf_value_trim(char *s);

/* Decimal digits only, into *ret: 0, -EINVAL or -ERANGE. */
int conf_value_u64(const char *s, uint64_t *ret);

/* Parses a size ("64G", "1536MiB", "4096") into bytes: 0 or -EINVAL
 * (-ERANGE past 2^64 - 1).  Exposed for the CLI and tests. */
int kvq_config_parse_size(const char *s, uint64_t *ret_bytes);

/* Splits a metrics_listen value ("127.0.0.1:9464", "[::1]:9464") into its
 * address (without brackets, into addr[addrlen]) and port.  Only loopback
 * addresses are accepted: the metrics name pools and models and have no
 * authentication.  Returns 0, or -EINVAL with a reason in err. */
int kvq_config_parse_listen(const char *s, char *addr, size_t addrlen, uint16_t *ret_port, char *err,
			    size_t errlen);

#endif
