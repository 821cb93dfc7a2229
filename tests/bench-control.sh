#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvq-bench control against a host-backend kvqd, briefly: every request kind
# of its cycle (Alloc, Seal, Publish, Release, Stats, attach) must be taken,
# and its batched decode cycle through libkvq must run at each batch size
# (the figures are the GPU machine's business, not checked here).  TAP.
set -u
b=${top_builddir:-.}
. "${top_srcdir:-.}/tests/tap.sh"
bench="$b/bench/kvq-bench"
dir=$(mktemp -d)
"$b/daemon/kvqd" --socket "$dir/kvqd.sock" --backend host --foreground > "$dir/kvqd.log" 2>&1 &
pid=$!
for i in $(seq 50); do [ -S "$dir/kvqd.sock" ] && break; sleep 0.1; done
"$bench" control --socket "$dir/kvqd.sock" --seconds 0.3 > "$dir/out" 2>&1
rc=$?
t $rc "kvq-bench control runs its cycles against kvqd (exit $rc$( [ $rc -eq 0 ] || printf ': %s' "$(tail -1 "$dir/out")"))"
grep -q '^block operations: [0-9]' "$dir/out"
t $? "it reports block operations"
grep -q '^round trip .* p99 [0-9.]* us' "$dir/out" && grep -q '^attach .* median of 9' "$dir/out"
t $? "and round trips and attaches"
for size in 1 16 256; do
	grep -Eq "^batch +$size: [0-9]+ block operations/s, [0-9]+ steps/s; per step [0-9.]+ round trips" "$dir/out"
	t $? "and a batched decode cycle of $size sequences, with its round trips per step"
done
kill "$pid"
wait "$pid"
t $? "kvqd exits 0 on SIGTERM"
rm -rf "$dir"
finish
