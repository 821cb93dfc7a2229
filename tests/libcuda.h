/* SPDX-License-Identifier: Apache-2.0 */
/* For the tests of code that loads the CUDA driver at run time. */
#ifndef KVQ_TEST_LIBCUDA_H
#define KVQ_TEST_LIBCUDA_H

#include <dlfcn.h>

/* libcuda.so.1 loadable here?  Tells "no driver" machines from GPU ones. */
__attribute__((unused))
static int libcuda_present(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);

	if (h)
		dlclose(h);
	return h != NULL;
}

#endif
