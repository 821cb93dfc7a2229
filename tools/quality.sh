#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The KV-format quality table (bench/QUALITY.md): kvq-run ab (every policy
# against FP16 KV in one pass over the text) on English texts Debian ships
# (base-files' licence texts; perl-modules' Locale::Maketext essay, long
# enough for the model's maximum context), at context 2048 and at the
# model's maximum (8192): plain; with K centered (kvq-run --k-center, the
# means calibrated on another text, Debian's Apache-2.0); with the Hadamard
# rotation (--rotate); with both; rotated with and without sink blocks
# (--sink: each sequence's first block exact); then tools/quality-table.py.  Needs a build (build/) and the
# model (tools/fetch-model.sh); starts its own kvqd on a temporary socket.
#   tools/quality.sh [OUTDIR]      (default bench/quality; the table goes to OUTDIR/../QUALITY.md)
# Environment: KVQ_THREADS (default 2), KVQ_QUALITY_RUNS (a subset of the run
# names below, e.g. "gpl3-2048"), KVQ_RUN_ARGS (more kvq-run options, e.g.
# "--gpu": the GPU path), KVQ_RUN and KVQD (the programs, default build/'s),
# KVQ_TEXTS (a directory holding the texts under their base names),
# KVQ_QUALITY_JOBS (runs at once, default 1).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/bench/quality}
threads=${KVQ_THREADS:-2}
run_bin=${KVQ_RUN:-$top/build/examples/kvq-run/kvq-run}
read -r -a run_args <<<"${KVQ_RUN_ARGS:-}"
. "$top/tools/model-env.sh"
kvq_model_env "$top" quality || exit 1

# every format (int4g128 needs head dim 128; SmolLM2 has 64), a mixed K/V policy, layer-wise policies,
# and open windows other than the default (one 32-token block, four with KIVI)
all=(bf16 int8 fp8 fp8e5m2 int4g64 int4g32 kivi4 kivi2 k=int8,v=int4g32
	"0-9:int8;10-:kivi4" "0-9:int8;10-:kivi2" "k=int4g64,v=kivi2"
	int4g32@128 kivi4@32 kivi4@256 kivi2@32 kivi2@256)
# at 8192 (one window of the whole text: slow on two cores) a subset
long=(int8 fp8 int4g32 kivi4 kivi2 k=int8,v=int4g32 "0-9:int8;10-:kivi4" kivi2@256)
# sink blocks against the same policies without, both rotated: the per-token
# formats, KIVI, and mixes near 4 bits per value
sinkset=(int8 fp8 int4g32 int4g64 kivi4 kivi2@32 k=int4g64,v=kivi2@32 k=int4g32,v=int4g64)
sinklong=(int8 fp8 int4g32 kivi4)

gpl3=/usr/share/common-licenses/GPL-3
gfdl=/usr/share/common-licenses/GFDL-1.3
maketext=/usr/share/perl/5.36.0/Locale/Maketext.pod
calib=/usr/share/common-licenses/Apache-2.0
# name  text  ctx  policy-list  continuations (greedy tokens, prompts)  -|kc|rot|rot,kc
runs=(
	"gpl3-2048 $gpl3 2048 all 32 2 -"
	"gpl3-8192 $gpl3 8192 long 0 0 -"
	"gfdl-2048 $gfdl 2048 all 32 2 -"
	"maketext-8192 $maketext 8192 long 0 0 -"
	"kc-gpl3-2048 $gpl3 2048 all 32 2 kc"
	"kc-gfdl-2048 $gfdl 2048 all 32 2 kc"
	"rot-gpl3-2048 $gpl3 2048 all 32 2 rot"
	"rot-gfdl-2048 $gfdl 2048 all 32 2 rot"
	"rotkc-gpl3-2048 $gpl3 2048 all 32 2 rot,kc"
	"rotkc-gpl3-8192 $gpl3 8192 long 0 0 rot,kc"
	"rotkc-gfdl-2048 $gfdl 2048 all 32 2 rot,kc"
	"rotkc-maketext-8192 $maketext 8192 long 0 0 rot,kc"
	"rotset-gpl3-2048 $gpl3 2048 sinkset 0 0 rot"
	"sink-rot-gpl3-2048 $gpl3 2048 sinkset 0 0 rot,sink"
	"rotset-gfdl-2048 $gfdl 2048 sinkset 0 0 rot"
	"sink-rot-gfdl-2048 $gfdl 2048 sinkset 0 0 rot,sink"
	"rotset-gpl3-8192 $gpl3 8192 sinklong 0 0 rot"
	"sink-rot-gpl3-8192 $gpl3 8192 sinklong 0 0 rot,sink"
)

# every run (and the calibration) gets its own kvqd: kvq-run's pools are
# named by model, policy, window and size, so runs at once would share them
. "$top/tools/kvqd-temp.sh"
mkdir -p "$out"
kc=$(mktemp -d /tmp/kvq-quality.XXXXXX)
trap 'rm -rf "$kc"' EXIT
[ -n "${KVQ_TEXTS:-}" ] && calib=$KVQ_TEXTS/$(basename "$calib")
# K centers (CPU path; one pass over the calibration text; K is centered
# before libkvq rotates it, so rotated runs take the same file)
(
	kvqd_temp_start "$top" calibrate
	"$run_bin" calibrate --threads "$threads" --out "$kc/kc.bin" "$calib" >&2
)
jobs=0 failed=0
for r in "${runs[@]}"; do
	read -r name text ctx list gen gp opt <<<"$r"
	if [ -n "${KVQ_QUALITY_RUNS:-}" ] && [[ " $KVQ_QUALITY_RUNS " != *" $name "* ]]; then
		continue
	fi
	declare -n pol=$list
	args=("${run_args[@]}")
	case $opt in
	kc) args+=(--k-center "$kc/kc.bin") ;;
	rot) args+=(--rotate) ;;
	rot,kc) args+=(--rotate --k-center "$kc/kc.bin") ;;
	rot,sink) args+=(--rotate --sink) ;;
	esac
	[ -n "${KVQ_TEXTS:-}" ] && text=$KVQ_TEXTS/$(basename "$text")
	for p in "${pol[@]}"; do
		args+=(--kv "$p")
	done
	echo "=== $name: $text, ctx $ctx, ${#pol[@]} policies against f16 ($opt)" >&2
	(
		kvqd_temp_start "$top" "quality-$name"
		"$run_bin" ab "${args[@]}" --ctx "$ctx" --gen "$gen" --gen-prompts "$gp" --threads "$threads" --json \
			"$text" >"$out/$name.json.tmp"
		mv "$out/$name.json.tmp" "$out/$name.json"
	) &
	unset -n pol
	if ((++jobs >= ${KVQ_QUALITY_JOBS:-1})); then
		wait -n || failed=1
		jobs=$((jobs - 1))
	fi
done
while ((jobs > 0)); do
	wait -n || failed=1
	jobs=$((jobs - 1))
done
# (OUTDIR/cpu/ may hold earlier CPU-path runs, kept for comparison)
python3 "$top/tools/quality-table.py" "$out"/*.json $(ls "$out"/cpu/*.json 2>/dev/null) >"$out/../QUALITY.md"
echo "wrote $(cd "$out/.." && pwd)/QUALITY.md" >&2
exit $failed
