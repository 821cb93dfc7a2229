/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cuda backend of a libkvq built without CUDA: no operations.  Attach
 * refuses a cuda pool with -ENOTSUP (never a silent host fallback on device
 * memory), a stream is refused, device-memory attention says why.
 */
#include "libkvq_internal.h"

const struct client_backend client_cuda = {
	.name = "cuda",
	.compiled = false,
};
