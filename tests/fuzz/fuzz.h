/* SPDX-License-Identifier: Apache-2.0 */
/* The fuzz targets' check: a failed one aborts, which libFuzzer reports as a
 * crash with the input that caused it (and the replay tests as a failure). */
#ifndef KVQ_TEST_FUZZ_H
#define KVQ_TEST_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_ASSERT(x)                                                                          \
	do {                                                                                    \
		if (!(x)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);  \
			abort();                                                                \
		}                                                                               \
	} while (0)

#endif
