#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The AVX2 decode loops prefetch the next head slice; a compiler may drop a
# prefetch it wrongly takes to have no effect (GCC 12 dropped every
# _mm_prefetch of ops_avx2.c at -O1 and above), which costs speed, not
# correctness, so only the object code shows it.  TAP output.
set -u
b=${top_builddir:-.}
obj=
for f in "$b"/kernels/cpu/.libs/libkvqavx2_la-ops_avx2.o "$b"/kernels/cpu/libkvqavx2_la-ops_avx2.o; do
	[ -f "$f" ] && { obj=$f; break; }
done
if [ -z "$obj" ]; then
	echo "1..0 # SKIP no AVX2 kernels object (not an x86-64 build)"
	exit 0
fi
n=$(objdump -d "$obj" | grep -c 'prefetcht0')
if [ "$n" -ge 4 ]; then
	echo "ok 1 - $obj holds $n prefetch instructions"
else
	echo "not ok 1 - $obj holds $n prefetch instructions (the K and V loops prefetch)"
	echo "1..1"
	exit 1
fi
echo "1..1"
