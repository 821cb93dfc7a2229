# SPDX-License-Identifier: Apache-2.0
# Sourced by the model tools: kvqd from build/ (or $KVQD) with its embedded
# defaults (host backend unless a client asks for cuda, pools created on
# attach) on a temporary socket, stopped (SIGTERM) when the script exits.
#   kvqd_temp_start TOP TAG    sets kvqd_temp_dir (kept until exit), exports KVQ_SOCKET
kvqd_temp_start() {
	local top=$1 tag=$2
	kvqd_temp_dir=$(mktemp -d "/tmp/kvqd-$tag.XXXXXX")
	"${KVQD:-$top/build/daemon/kvqd}" --backend host --socket "$kvqd_temp_dir/kvqd.sock" --foreground \
		--log-level warning &
	kvqd_temp_pid=$!
	trap 'kill -TERM $kvqd_temp_pid 2>/dev/null; wait $kvqd_temp_pid 2>/dev/null; rm -rf "$kvqd_temp_dir"' EXIT
	for _ in $(seq 500); do
		[ -S "$kvqd_temp_dir/kvqd.sock" ] && break
		kill -0 "$kvqd_temp_pid" 2>/dev/null || break
		sleep 0.01
	done
	if [ ! -S "$kvqd_temp_dir/kvqd.sock" ]; then
		echo "kvqd did not start" >&2
		return 1
	fi
	export KVQ_SOCKET=$kvqd_temp_dir/kvqd.sock
}
