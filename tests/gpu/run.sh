#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# The whole GPU proof in one command, for a machine with a GPU:
#   tests/gpu/run.sh BUILD_DIR [OUT_DIR]
# runs the GPU tests of BUILD_DIR (format arithmetic on the device, the CUDA
# kernels against the CPU kernels, a cuda pool shared by two processes,
# libkvq's sequences on a cuda pool against a host pool; the kernel and
# sequence tests twice, the second time with the Hopper decode kernel, KVQ_CUDA_KERNELS=sm90),
# compute-sanitizer memcheck and racecheck on the kernels' small cases,
# kvq-bench decode/prefill/append (beside PyTorch SDPA where PyTorch is
# installed), and kvq-bench control against a host-backend kvqd;
# full logs go to OUT_DIR (default $OUT, else /tmp/kvq-gpu), a table of
# results is printed last.  Exit status 1 when
# any step failed.  KVQ_GPU_STEP_TIMEOUT bounds each step (seconds, default 600);
# KVQ_BENCH_ARGS are passed to kvq-bench decode; KVQ_FI_DIR names a directory
# with FlashInfer's own kernels built into timing programs (fi_attn, fi_decode) for the
# "vs FlashInfer" columns.  KVQ_GPU_STEPS (a blank-separated list of step
# names) runs only those steps.
set -u
b=${1:?usage: tests/gpu/run.sh BUILD_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/kvq-gpu}}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
failed=0

echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); $(date -u '+%Y-%m-%d %H:%M UTC')" >> "$summary"

step() {
	name=$1
	shift
	case " ${KVQ_GPU_STEPS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
	t0=$(date +%s)
	timeout "${KVQ_GPU_STEP_TIMEOUT:-600}" "$@" > "$out/$name.log" 2>&1
	rc=$?
	t1=$(date +%s)
	pass=$(grep -c '^ok ' "$out/$name.log")
	fail=$(grep -c '^not ok ' "$out/$name.log")
	[ "$rc" -eq 0 ] || failed=1
	printf '%-10s rc=%-3s ok=%-5s not_ok=%-4s %4ss\n' "$name" "$rc" "$pass" "$fail" $((t1 - t0)) >> "$summary"
	grep '^not ok ' "$out/$name.log" | head -20 >> "$summary"
}

# fresh random inputs each run (the tests print the seed; set KVQ_TEST_SEED to repeat one)
KVQ_TEST_SEED=${KVQ_TEST_SEED:-$(date +%s)}
export KVQ_TEST_SEED
echo "seed: $KVQ_TEST_SEED" >> "$summary"
step format "$b/tests/gpu/test_format_gpu.bin"
step kernels "$b/tests/gpu/test_kernels"
grep 'largest relative error' "$out/kernels.log" >> "$summary"
step cudapool env KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_cuda_pool"
step cudaseq env KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_cuda_seq"
step cudabatch env KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_cuda_batch"
step cudatier env KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_cuda_tier"
step cudarestart env KVQ_TEST_KVQD="$b/daemon/kvqd" KVQ_TEST_KVQCTL="$b/kvqctl/kvqctl" "$b/tests/gpu/test_cuda_restart"
# the remote tier with cuda pools: a Redis Cluster of six redis-server found on PATH (redis-cli too)
step cudaremote env KVQ_TEST_KVQD="$b/daemon/kvqd" KVQ_TEST_KVQCTL="$b/kvqctl/kvqctl" "$b/tests/gpu/test_cuda_remote"
# again with the Hopper decode kernel (KVQ_CUDA_KERNELS=sm90): on a Hopper GPU
# it takes the decode steps of a pair that has it (decode_sm90.cuh: the rows
# of kernels/cuda/instances.h with sm90); the runs above keep the kernels
# that run on sm_80 and later, the default.
step kernels90 env KVQ_CUDA_KERNELS=sm90 "$b/tests/gpu/test_kernels"
step cudaseq90 env KVQ_CUDA_KERNELS=sm90 KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_cuda_seq"
# a tensor-parallel group on two GPUs (skipped on a machine of one)
step groups2 env KVQ_TEST_KVQD="$b/daemon/kvqd" "$b/tests/gpu/test_groups_gpu"
if command -v compute-sanitizer > /dev/null; then
	step memcheck env KVQ_GPU_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/gpu/test_kernels"
	step racecheck env KVQ_GPU_SMALL=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$b/tests/gpu/test_kernels"
	grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/memcheck.log" "$out/racecheck.log" >> "$summary"
fi
# PyTorch SDPA at the same shapes (where PyTorch is there), then ours
sdpa=""
if python3 -c 'import torch' 2> /dev/null; then
	python3 "$(dirname "$0")/../../bench/sdpa.py" > "$out/sdpa.txt" 2>&1 && sdpa="--sdpa $out/sdpa.txt"
fi
# FlashInfer's own decode kernels at the same shapes, where its timing
# programs are built (KVQ_FI_DIR: the directory holding fi_attn and fi_decode)
fi=""
if [ -n "${KVQ_FI_DIR:-}" ] && [ -x "$KVQ_FI_DIR/fi_attn" ] && [ -x "$KVQ_FI_DIR/fi_decode" ]; then
	for p in 16 32; do
		"$KVQ_FI_DIR/fi_attn" --page $p > "$out/fi_attn$p.txt" 2>&1 && fi="$fi --fi $out/fi_attn$p.txt"
		"$KVQ_FI_DIR/fi_decode" --page $p > "$out/fi_decode$p.txt" 2>&1 && fi="$fi --fi $out/fi_decode$p.txt"
	done
fi
step bench sh -c "\"$b/bench/kvq-bench\" decode $sdpa $fi ${KVQ_BENCH_ARGS:-} && \"$b/bench/kvq-bench\" prefill $sdpa ${KVQ_BENCH_ARGS:-} && \"$b/bench/kvq-bench\" append ${KVQ_BENCH_ARGS:-}"
# libkvq's batch API on a cuda pool of a cuda-backend kvqd, against the
# kernels' interface on the same tables, and kvq-bench decode and append at
# its shapes in the same run
gpu=$(mktemp -d)
"$b/daemon/kvqd" --socket "$gpu/kvqd.sock" --backend cuda --foreground > "$gpu/kvqd.log" 2>&1 &
kvqd_pid=$!
for i in 1 2 3 4 5 6 7 8 9 10; do [ -S "$gpu/kvqd.sock" ] && break; sleep 0.2; done
step batch sh -c "\"$b/bench/kvq-bench\" batch --socket \"$gpu/kvqd.sock\" --format int8,int4g32 && \"$b/bench/kvq-bench\" decode --format int8,int4g32 --shape 64x8192x32/8x128 --shape 256x2048x32/8x128 --shape 256x1024x32/8x128 && \"$b/bench/kvq-bench\" append --format int8,int4g32"
kill "$kvqd_pid"
wait "$kvqd_pid"
cat "$gpu/kvqd.log" >> "$out/batch.log"
rm -rf "$gpu"
# the control plane on this (otherwise idle) machine: a host-backend kvqd
ctl=$(mktemp -d)
"$b/daemon/kvqd" --socket "$ctl/kvqd.sock" --backend host --foreground > "$ctl/kvqd.log" 2>&1 &
kvqd_pid=$!
for i in 1 2 3 4 5 6 7 8 9 10; do [ -S "$ctl/kvqd.sock" ] && break; sleep 0.2; done
step control "$b/bench/kvq-bench" control --socket "$ctl/kvqd.sock" --seconds 3
kill "$kvqd_pid"
wait "$kvqd_pid"
rm -rf "$ctl"
[ -f "$out/bench.log" ] && grep -v '^{' "$out/bench.log" | tail -45 >> "$summary"
[ -f "$out/batch.log" ] && grep -v '^{' "$out/batch.log" | tail -40 >> "$summary"
[ -f "$out/control.log" ] && tail -18 "$out/control.log" >> "$summary"
# few files: the small test logs in one
for t in format cudapool cudaseq cudaseqp cudabatch; do
	[ -f "$out/$t.log" ] || continue
	echo "== $t" >> "$out/tests.log"
	cat "$out/$t.log" >> "$out/tests.log"
	rm -f "$out/$t.log"
done
cat "$summary"
exit $failed
