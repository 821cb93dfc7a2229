#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# The Python package's GPU checks, on a machine with a GPU, torch and
# transformers 5.x (no network needed):
#   tests/gpu/python.sh BUILD_DIR MODEL.gguf [OUT_DIR]
# BUILD_DIR: a CUDA build (daemon/kvqd, .libs/libkvq.so.3,
# examples/kvq-run/kvq-run); MODEL: SmolLM2-135M-Instruct.Q4_1.gguf.
# Runs, against a kvqd of BUILD_DIR on a temporary socket:
#   tests/gpu/test_torch.py  the torch path on cuda pools against the host
#                            path, data_ptr() against the kernels' pointers
#   tests/gpu/test_hf.py     transformers with KvqCache: greedy f16 equality, a
#                            left-padded batch against DynamicCache and alone,
#                            int8/kivi4 delta PPL and top-1 against kvq-run ab,
#                            two processes sharing a system prompt
# The package is used from this tree (PYTHONPATH); $KVQ_WHEELS, if set, is a
# folder of wheels pip installs first without an index (the gguf wheel that
# transformers' GGUF loader needs).  KVQ_HF_ARGS are added to test_hf.py's.
# Logs and a summary in OUT_DIR (default $OUT, else /tmp/kvq-gpu-python).
set -u
b=$(cd "${1:?usage: tests/gpu/python.sh BUILD_DIR MODEL.gguf [OUT_DIR]}" && pwd)
model=${2:?usage: tests/gpu/python.sh BUILD_DIR MODEL.gguf [OUT_DIR]}
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${3:-${OUT:-/tmp/kvq-gpu-python}}
mkdir -p "$out"
py=${PYTHON:-python3}
if [ -n "${KVQ_WHEELS:-}" ]; then
	"$py" -m pip install --quiet --no-index --no-deps --find-links "$KVQ_WHEELS" "$KVQ_WHEELS"/*.whl \
		> "$out/pip.log" 2>&1 || { echo "pip install of $KVQ_WHEELS failed: $out/pip.log"; exit 1; }
fi
tmp=$(mktemp -d /tmp/kvqd-gpu-python.XXXXXX)
"$b/daemon/kvqd" --backend host --socket "$tmp/kvqd.sock" --foreground --log-level warning > "$out/kvqd.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 500); do [ -S "$tmp/kvqd.sock" ] && break; sleep 0.01; done
export KVQ_SOCKET=$tmp/kvqd.sock KVQ_LIBRARY=$b/.libs/libkvq.so.3 PYTHONPATH=$top/python${PYTHONPATH:+:$PYTHONPATH}
rc=0
"$py" "$top/tests/gpu/test_torch.py" > "$out/torch.log" 2>&1 || rc=1
# shellcheck disable=SC2086
"$py" "$top/tests/gpu/test_hf.py" --model "$model" --kvq-run "$b/examples/kvq-run/kvq-run" ${KVQ_HF_ARGS:-} \
	> "$out/hf.log" 2>&1 || rc=1
{
	echo "== tests/gpu/test_torch.py"
	grep -E '^(ok|not ok|# cuda vs host)' "$out/torch.log"
	echo "== tests/gpu/test_hf.py"
	grep '^{' "$out/hf.log" || tail -n 20 "$out/hf.log"
	echo "exit $rc"
} | tee "$out/summary.txt"
exit $rc
