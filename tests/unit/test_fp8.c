/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 E4M3 and E5M2 as the kernels convert them (kernels/kvq_format.h):
 * every code decoded against a float64 formula; encode of every FP16 value
 * and of random floats against an independent reference (the nearest
 * decoded value in double, ties to the even code, saturating); saturation,
 * infinities and NaN.
 */
#include <math.h>
#include <string.h>

#include "kvq_format.h"
#include "../tap.h"
#include "../ref.h"

typedef double (*ref_dec)(uint8_t);

/* Nearest finite code to x by exhaustive search in double; ties go to the
 * code with an even mantissa; beyond the largest finite value, saturate. */
static uint8_t ref_encode(double x, ref_dec dec, uint8_t maxcode)
{
	double best = INFINITY;
	int bestc = -1;

	if (isnan(x))
		return 0x7f;
	if (fabs(x) >= dec(maxcode))
		return (uint8_t)((signbit(x) ? 0x80 : 0) | maxcode);
	for (int c = 0; c <= maxcode; c++) {
		double v = dec((uint8_t)c), err = fabs(fabs(x) - v);
		if (err < best || (err == best && (c & 1) == 0)) {
			best = err;
			bestc = c;
		}
	}
	return (uint8_t)((signbit(x) ? 0x80 : 0) | bestc);
}

static float f16_value(uint16_t h)
{
	return (float)ref_f16(h);
}

struct fmt {
	const char *name;
	uint8_t (*enc)(float);
	float (*dec)(uint8_t);
	ref_dec ref;
	uint8_t maxcode;
	double maxval;
};

static void test_format(const struct fmt *F)
{
	int bad = 0;

	/* decode: all 256 codes */
	for (int c = 0; c < 256; c++) {
		double r = F->ref((uint8_t)c), v = F->dec((uint8_t)c);
		if (!(r == v || (isnan(r) && isnan(v)) ))
			bad++;
		if (isnan(r) == 0 && signbit(r) != signbit(v))
			bad++;
	}
	ok(bad == 0, "%s: all 256 codes decode as the float64 formula says (%d wrong)", F->name, bad);
	ok(F->ref(F->maxcode) == F->maxval, "%s: largest finite value is %g", F->name, F->maxval);

	/* encode: every FP16 value */
	bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float x = f16_value((uint16_t)h);
		uint8_t got = F->enc(x), want = ref_encode(x, F->ref, F->maxcode);
		if (got != want && !(isnan(x) && got == 0x7f)) {
			if (bad < 5)
				diag("%s: encode(%a) = %#x, want %#x", F->name, x, got, want);
			bad++;
		}
	}
	ok(bad == 0, "%s: encode of all 65536 FP16 values matches the reference (%d wrong)", F->name, bad);

	/* encode: random floats over the whole exponent range, and midpoints */
	bad = 0;
	for (int i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)tap_rand();
		float x;
		memcpy(&x, &u, 4);
		if (isnan(x))
			continue;
		if (F->enc(x) != ref_encode(x, F->ref, F->maxcode)) {
			if (bad < 5)
				diag("%s: encode(%a) = %#x, want %#x", F->name, x, F->enc(x),
				     ref_encode(x, F->ref, F->maxcode));
			bad++;
		}
	}
	for (int c = 0; c < F->maxcode; c++) {
		/* exact midpoints between neighbours: ties to even */
		double mid = (F->ref((uint8_t)c) + F->ref((uint8_t)(c + 1))) / 2;
		float x = (float)mid;
		if ((double)x != mid)
			continue;
		for (int s = 0; s < 2; s++) {
			float y = s ? -x : x;
			if (F->enc(y) != ref_encode(y, F->ref, F->maxcode))
				bad++;
		}
	}
	ok(bad == 0, "%s: encode of random floats and of every midpoint matches the reference (%d wrong)",
	   F->name, bad);

	/* saturation, infinities, NaN */
	ok(F->enc(INFINITY) == F->maxcode && F->enc(-INFINITY) == (0x80 | F->maxcode),
	   "%s: +-inf saturate to +-max", F->name);
	ok(F->enc((float)F->maxval * 4) == F->maxcode && F->enc(-3.0e38f) == (0x80 | F->maxcode),
	   "%s: finite values beyond max saturate", F->name);
	ok(F->enc(NAN) == 0x7f && F->enc(-NAN) == 0x7f, "%s: NaN encodes as 0x7f", F->name);
	ok(isnan(F->dec(0x7f)) && isnan(F->dec(0xff)), "%s: 0x7f and 0xff decode as NaN", F->name);
	ok(F->enc(-0.0f) == 0x80 && F->enc(0.0f) == 0x00, "%s: signed zeros kept", F->name);
}

int main(void)
{
	static const struct fmt e4m3 = { "e4m3", kvq_fp8_e4m3_enc, kvq_fp8_e4m3_dec, ref_e4m3, 0x7e, 448.0 };
	static const struct fmt e5m2 = { "e5m2", kvq_fp8_e5m2_enc, kvq_fp8_e5m2_dec, ref_e5m2, 0x7b, 57344.0 };

	tap_seed();
	test_format(&e4m3);
	test_format(&e5m2);
	ok(isinf(kvq_fp8_e5m2_dec(0x7c)) && isnan(kvq_fp8_e5m2_dec(0x7d)), "e5m2: 0x7c is inf, 0x7d NaN");
	ok(kvq_fp8_e4m3_dec(0x01) == ldexp(1, -9) && kvq_fp8_e4m3_dec(0x08) == ldexp(1, -6),
	   "e4m3: smallest subnormal 2^-9, smallest normal 2^-6");
	ok(kvq_fp8_e4m3_enc(ldexp(1, -10)) == 0x00 && kvq_fp8_e4m3_enc((float)ldexp(3, -10)) == 0x02,
	   "e4m3: half the smallest subnormal rounds to even (0); 1.5 subnormals round to 2");
	return done_testing();
}
