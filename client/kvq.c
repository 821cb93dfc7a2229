/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <string.h>

#include "config.h"
#include "kvq.h"
#include "../kernels/kvq_format.h"

const char *kvq_version(void)
{
	return PACKAGE_VERSION;
}

const char *kvq_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case KVQ_ELAYOUT: return "pool layout version or geometry mismatch";
	case KVQ_EPOLICY: return "bad KV policy";
	case KVQ_EPROTOCOL: return "kvqd's reply broke the protocol";
	case -ENOTSUP: return "operation not supported (by kvqd, or by libkvq: it maps host pools only, not CUDA pools yet)";
	default:
		if (err < 0 && err > -KVQ_EBASE)
			return strerror(-err);
		return "unknown error";
	}
}

uint8_t kvq_fp8_e4m3_encode(float x)
{
	return kvq_fp8_e4m3_enc(x);
}

float kvq_fp8_e4m3_decode(uint8_t code)
{
	return kvq_fp8_e4m3_dec(code);
}

uint8_t kvq_fp8_e5m2_encode(float x)
{
	return kvq_fp8_e5m2_enc(x);
}

float kvq_fp8_e5m2_decode(uint8_t code)
{
	return kvq_fp8_e5m2_dec(code);
}
