#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# What libkvq's attention timing costs a real worker: kvq-run generate's
# tokens per second with a kvqd whose pools have attention_timing = no, then
# yes, alternating for ROUNDS rounds, on a short and a long prompt.  Also
# checks that /metrics counts timed calls only in the "yes" runs.
#   bench/timing-cost.sh BINDIR MODEL TEXT [ROUNDS] [-- KVQ_RUN_ARGS...]
# BINDIR holds daemon/kvqd and examples/kvq-run/kvq-run; TEXT is a long text
# whose first 6000 bytes are the long prompt.  KVQ_RUN_ARGS default to
# "--gpu --kv int8".  Prints one line per run and a summary: median tok/s
# with timing off and on, their ratio, and the median of each round's ratio
# (off and on run back to back, so a drift between rounds cancels).
set -u
b=${1:?usage: bench/timing-cost.sh BINDIR MODEL TEXT [ROUNDS] [-- KVQ_RUN_ARGS...]}
model=${2:?model}
text=${3:?text}
rounds=4
[ $# -ge 4 ] && [ "$4" != -- ] && rounds=$4
shift 3
[ $# -ge 1 ] && [ "$1" != -- ] && shift
[ $# -ge 1 ] && [ "$1" = -- ] && shift
[ $# -eq 0 ] && set -- --gpu --kv int8
port=19464
tmp=$(mktemp -d /tmp/kvq-timing.XXXXXX)   # mktemp's template; removed at exit
pid=
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null; rm -rf "$tmp"' EXIT
head -c 6000 "$text" > "$tmp/long.txt"

start() { # $1 = yes|no
	printf '[kvqd]\nattention_timing = %s\nattention_report_ms = 1000\nmetrics_listen = 127.0.0.1:%s\n' \
		"$1" "$port" > "$tmp/kvqd.conf"
	"$b/daemon/kvqd" --config "$tmp/kvqd.conf" --socket "$tmp/kvqd.sock" --foreground \
		--log-level warning 2>> "$tmp/kvqd.log" &
	pid=$!
	for _ in $(seq 500); do [ -S "$tmp/kvqd.sock" ] && return 0; sleep 0.01; done
	echo "kvqd did not start: $(cat "$tmp/kvqd.log")" >&2
	exit 1
}
stop() {
	kill -TERM "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	pid=
	rm -f "$tmp/kvqd.sock"
}
timed_calls() { # the sum of kvq_attention_seconds_count over every series
	python3 -c '
import sys, urllib.request
t = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
print(int(sum(float(l.rsplit(" ", 1)[1]) for l in t.splitlines() if l.startswith("kvq_attention_seconds_count"))))
' "$port"
}
run() { # $1 = prompt kind, $2 = max tokens, then kvq-run's arguments; prints tok/s
	if [ "$1" = short ]; then p="Once upon a time"; else p=$(cat "$tmp/long.txt"); fi
	max=$2
	shift 2
	KVQ_SOCKET=$tmp/kvqd.sock "$b/examples/kvq-run/kvq-run" generate --model "$model" "$@" --raw --no-prefix-cache \
		--max-tokens "$max" --prompt "$p" > /dev/null 2> "$tmp/run.err" || { cat "$tmp/run.err" >&2; exit 1; }
	sed -n 's/.* tokens generated in .* (\([0-9.]*\) tok\/s).*/\1/p' "$tmp/run.err"
}
range() { sort -n "$1" | sed -n '1p;$p' | paste -sd- -; }   # "least-most" of a file of figures
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

args="$*"
for kind in short long; do
	max=1024
	[ "$kind" = long ] && max=256
	: > "$tmp/no.$kind"
	: > "$tmp/yes.$kind"
	: > "$tmp/ratio.$kind"
	i=0
	while [ $i -lt "$rounds" ]; do
		for t in no yes; do
			start $t
			# shellcheck disable=SC2086
			tps=$(set -- $args; run "$kind" "$max" "$@")
			sleep 0.3
			n=$(timed_calls)
			stop
			echo "$kind round $i timing=$t: $tps tok/s, kvq_attention_seconds_count $n"
			echo "$tps" >> "$tmp/$t.$kind"
			[ "$t" = no ] && last_off=$tps
			[ "$t" = yes ] && awk -v a="$tps" -v b="$last_off" 'BEGIN { printf "%.4f\n", a / b }' >> "$tmp/ratio.$kind"
			if [ "$t" = no ] && [ "$n" != 0 ]; then echo "FAIL: timed calls counted with timing off"; exit 1; fi
			if [ "$t" = yes ] && [ "$n" = 0 ]; then echo "FAIL: no timed calls counted with timing on"; exit 1; fi
		done
		i=$((i + 1))
	done
	off=$(median < "$tmp/no.$kind")
	on=$(median < "$tmp/yes.$kind")
	echo "$kind ($args, $max tokens, $rounds rounds): median tok/s timing off $off ($(range "$tmp/no.$kind")), on $on ($(range "$tmp/yes.$kind")), on/off $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }'); median of the rounds' on/off $(median < "$tmp/ratio.$kind") ($(range "$tmp/ratio.$kind"))"
done
