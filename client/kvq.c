/* SPDX-License-Identifier: Apache-2.0 */
#include "config.h"
#include "kvq.h"

const char *kvq_version(void)
{
	return PACKAGE_VERSION;
}
