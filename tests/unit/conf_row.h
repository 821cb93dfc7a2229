/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A throwaway row of kvqd.conf's schema, for tests/unit/test_conf_row.c
 * only: the build force-includes this header into that test and into its
 * own copy of the configuration code (libkvqconf_row.la), and nowhere else.
 * A [kvqd] key in milliseconds, 10 to 5000, 250 by default, that a reload
 * does not apply.
 */
#ifndef KVQ_TEST_CONF_ROW_H
#define KVQ_TEST_CONF_ROW_H

#define KVQ_CONF_KVQD_EXTRA(X) \
	X(KVQD, test_row_ms, U32, test_row_ms, 10, 5000, 1, "250", 0, "a throwaway key of the test build")
#define TEST_ROW_RELOAD 0

#endif
