/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A throwaway row of the format table, for tests/unit/test_format_row.c
 * only: the build force-includes this header into that test and into its
 * own copy of the kernels (libkvqcore_fmtrow.la), and nowhere else.  4-bit
 * unsigned codes with a scale and zero per 16 elements of the head dim,
 * for K and V: no format of the table has groups of 16.
 */
#ifndef KVQ_TEST_FORMAT_ROW_H
#define KVQ_TEST_FORMAT_ROW_H

#define KVQ_FORMATS_EXTRA(X) X(TESTG16, "testg16", 4, UINT, GROUP, GROUP, 16, 16, 1)
#define TEST_ROW_NAME "testg16"
#define TEST_ROW_BITS 4u
#define TEST_ROW_GROUP 16u

#endif
