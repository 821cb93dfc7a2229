/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libkvq: the size contract of struct kvq_attach_params (kvq.h, interface
 * 7): a caller's struct of any size from the interface-3 one up is read as
 * far as it goes and the rest taken as zero, so the struct grows at its end
 * without a new soname; bytes this library does not know must be zero,
 * since a field set there would otherwise be dropped without a word.
 */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "libkvq_internal.h"

int kvq_client_attach_sized(kvq_client *c, const struct kvq_attach_params *p, size_t size)
{
	struct kvq_attach_params q;

	if (!c || !p || size < KVQ_ATTACH_PARAMS_MIN)
		return -EINVAL;
	for (size_t i = sizeof q; i < size; i++)
		if (((const unsigned char *)p)[i])
			return client_fail(c, -E2BIG,
					   "struct kvq_attach_params of %zu bytes sets byte %zu; this libkvq knows %zu "
					   "(a field of a newer kvq.h: link the libkvq it was built with)",
					   size, i, sizeof q);
	memset(&q, 0, sizeof q);
	memcpy(&q, p, size < sizeof q ? size : sizeof q);
	return client_attach(c, &q);
}

/* The symbol binaries built against interfaces 3 to 6 call: their struct
 * ends at codebooks. */
int (kvq_client_attach)(kvq_client *c, const struct kvq_attach_params *p)
{
	return kvq_client_attach_sized(c, p, KVQ_ATTACH_PARAMS_MIN);
}
