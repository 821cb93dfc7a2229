# SPDX-License-Identifier: Apache-2.0
# Sourced by the model tests: the model they run (a TAP skip when it has not
# been fetched), a kvqd on a temporary socket stopped when the test exits,
# and check, one TAP line per test.
#   model_require            exports KVQ_MODEL, or prints the skip and exits
#   model_kvqd_start TAG     sets tmp (removed at exit), exports KVQ_SOCKET
#   check DESCRIPTION COMMAND...
top_builddir=${top_builddir:-.}
run=$top_builddir/examples/kvq-run/kvq-run
n=0

model_require() {
	model=${KVQ_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/kvqd/models/SmolLM2-135M-Instruct.Q4_1.gguf}
	if [ ! -f "$model" ]; then
		echo "1..0 # SKIP model not fetched (tools/fetch-model.sh; tools/dev.sh check fetches it)"
		exit 0
	fi
	export KVQ_MODEL=$model
}

model_kvqd_start() {
	tmp=$(mktemp -d "/tmp/kvqd-$1.XXXXXX")
	"${KVQ_TEST_KVQD:-$top_builddir/daemon/kvqd}" --backend host --socket "$tmp/kvqd.sock" --foreground \
		--log-level warning &
	pid=$!
	trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
	i=0
	while [ ! -S "$tmp/kvqd.sock" ] && [ $i -lt 500 ]; do
		sleep 0.01
		i=$((i + 1))
	done
	export KVQ_SOCKET=$tmp/kvqd.sock
}

check() {
	desc=$1
	shift
	n=$((n + 1))
	if "$@"; then
		echo "ok $n - $desc"
	else
		echo "not ok $n - $desc"
	fi
}
