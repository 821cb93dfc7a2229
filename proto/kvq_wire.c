/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvq_wire.h"

const char *kvq_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case KVQ_ELAYOUT: return "pool layout version or geometry mismatch";
	case KVQ_EPOLICY: return "bad KV policy";
	case KVQ_EPROTOCOL: return "kvqd's reply broke the protocol";
	case -ENOTSUP:
		return "operation not supported (by kvqd, or by this libkvq: built without CUDA, or no kernel for the pool's "
		       "formats)";
	default:
		if (err < 0 && err > -KVQ_EBASE)
			return strerror(-err);
		return "unknown error";
	}
}

int kvq_default_socket(char *buf, size_t len)
{
	const char *env = getenv("KVQ_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (geteuid() == 0)
		n = snprintf(buf, len, "%s", KVQ_ROOT_SOCKET);
	else if (xdg && xdg[0] == '/')   /* as kvqd: a relative one is no runtime directory */
		n = snprintf(buf, len, "%s/kvqd.sock", xdg);
	else
		return -ENOENT;
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
