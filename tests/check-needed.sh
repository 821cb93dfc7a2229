#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# No binary of the project may need libcuda (docs/DESIGN.md): machines without a GPU
# driver must be able to start every program.  TAP output.
set -u
b=${top_builddir:-.}
n=0; fail=0
for f in "$b"/.libs/libkvq.so "$b"/bench/.libs/kvq-bench "$b"/bench/kvq-bench \
         "$b"/daemon/kvqd "$b"/daemon/.libs/kvqd "$b"/kvqctl/kvqctl \
         "$b"/tests/unit/test_backend "$b"/tests/unit/.libs/test_backend "$b"/tests/unit/test_driver \
         "$b"/tests/gpu/*.bin \
         "$b"/tests/gpu/test_cuda_pool "$b"/tests/gpu/.libs/test_cuda_pool; do
	[ -f "$f" ] || continue
	head -c 4 "$f" | grep -q ELF || continue
	n=$((n + 1))
	needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
	case " $needed" in
	*" libcuda.so"*) echo "not ok $n - $f needs libcuda: $needed"; fail=1 ;;
	*) echo "ok $n - $f does not need libcuda ($needed)" ;;
	esac
done
if [ "$n" -eq 0 ]; then
	echo "not ok 1 - no binary found to check under $b"
	n=1; fail=1
fi
echo "1..$n"
exit $fail
