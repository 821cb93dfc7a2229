/* SPDX-License-Identifier: Apache-2.0 */
#include "config.h"
#include "kvq.h"
#include "../kernels/kvq_format.h"

const char *kvq_version(void)
{
	return PACKAGE_VERSION;
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
