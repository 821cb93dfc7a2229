/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A throwaway row of the pool figures' table (daemon/figures.h), for
 * tests/integration/test_figure_row.c and tests/python/test_host.py only:
 * the build force-includes this header into a kvqd of its own
 * (tests/figrow/kvqd) and nowhere else.  kvqctl, libkvq and the Python
 * package are the build's own: they must show the figure without knowing
 * it.  Its value, 4200 + the clients attached, is one those tests know.
 */
#ifndef KVQ_TEST_FIGURE_ROW_H
#define KVQ_TEST_FIGURE_ROW_H

#define KVQ_POOL_FIGURES_EXTRA(X)                                                                    \
	X(test_row, "test_row_figure", GAUGE, "kvq_test_row_figure", NULL,                           \
	  "A throwaway figure: 4200 + the connections attached.", 4200 + (uint64_t)i->clients)
#define TEST_FIGURE_NAME "test_row_figure"
#define TEST_FIGURE_FAMILY "kvq_test_row_figure"
#define TEST_FIGURE_BASE 4200u

#endif
