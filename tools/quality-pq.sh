#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The product-quantized formats (pq2, pq1) in the KV-format quality table
# (bench/QUALITY.md): k-means codebooks calibrated on Debian texts that no
# run scores (Apache-2.0, MPL-2.0, Artistic, CC0-1.0 and the start of
# perldiag.pod), plain and after --rotate --k-center (the K means from
# Apache-2.0, as tools/quality.sh takes them), then kvq-run ab of PQ for V
# only, K only and both, beside kivi2 and int4g32 in the same pass, at
# contexts 2048 and 8192; then tools/quality-table.py over every result.
# Needs a build (build/) and the model (tools/fetch-model.sh); starts its own
# kvqd on a temporary socket.
#   tools/quality-pq.sh [OUTDIR]    (default bench/quality; the table goes to OUTDIR/../QUALITY.md)
# Environment: KVQ_THREADS (default 2), KVQ_QUALITY_RUNS (a subset of the run
# names below), KVQ_RUN and KVQD (the programs, default build/'s), KVQ_TEXTS
# (a directory holding the texts under their base names), KVQ_CB_TOKENS
# (calibration tokens, default 8192), KVQ_CB_DIR (keep the K means and
# codebooks there, and take those already there instead of calibrating again),
# KVQ_RUN_ARGS (more kvq-run options for the runs, e.g. "--gpu": the GPU path).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/bench/quality}
threads=${KVQ_THREADS:-2}
run_bin=${KVQ_RUN:-$top/build/examples/kvq-run/kvq-run}
read -r -a run_args <<<"${KVQ_RUN_ARGS:-}"
. "$top/tools/model-env.sh"
kvq_model_env "$top" quality-pq || exit 1

# PQ on V only, K only and both; beside them the 2- and 4-bit formats it is
# measured against, at their default windows and at kivi's (4 blocks)
short=(kivi2 int4g32 pq2 pq2@128 pq1@128 k=int8,v=pq2 k=pq2,v=int8 k=kivi4,v=pq2 k=kivi2,v=pq2
	k=int4g32,v=pq1@128)
long=(kivi2 int4g32 pq2@128 k=int8,v=pq2 k=kivi2,v=pq2)

licenses=/usr/share/common-licenses
gpl3=$licenses/GPL-3
gfdl=$licenses/GFDL-1.3
calib=($licenses/Apache-2.0 $licenses/MPL-2.0 $licenses/Artistic $licenses/CC0-1.0)
perldiag=/usr/share/perl/5.36.0/pod/perldiag.pod
# name  text  ctx  policy-list  -|rot,kc
runs=(
	"pq-gpl3-2048 $gpl3 2048 short -"
	"pq-rotkc-gpl3-2048 $gpl3 2048 short rot,kc"
	"pq-gfdl-2048 $gfdl 2048 short -"
	"pq-rotkc-gfdl-2048 $gfdl 2048 short rot,kc"
	"pq-gpl3-8192 $gpl3 8192 long -"
	"pq-rotkc-gpl3-8192 $gpl3 8192 long rot,kc"
)

. "$top/tools/kvqd-temp.sh"
mkdir -p "$out"
if [ -n "${KVQ_CB_DIR:-}" ]; then
	tmp=$KVQ_CB_DIR
	mkdir -p "$tmp"
else
	tmp=$(mktemp -d /tmp/kvq-quality-pq.XXXXXX)
	trap 'rm -rf "$tmp"' EXIT
fi
if [ -n "${KVQ_TEXTS:-}" ]; then
	for i in "${!calib[@]}"; do calib[i]=$KVQ_TEXTS/$(basename "${calib[i]}"); done
	perldiag=$KVQ_TEXTS/$(basename "$perldiag")
fi
{ cat "${calib[@]}"; head -c 60000 "$perldiag"; } >"$tmp/calib.txt"
(
	kvqd_temp_start "$top" calibrate-pq
	[ -f "$tmp/kc.bin" ] ||
		"$run_bin" calibrate --threads "$threads" --out "$tmp/kc.bin" "${calib[0]}" >&2
	for f in pq2 pq1; do
		[ -f "$tmp/cb-$f.bin" ] ||
			"$run_bin" calibrate --kv "$f" --threads "$threads" --limit "${KVQ_CB_TOKENS:-8192}" \
				--out "$tmp/cb-$f.bin" "$tmp/calib.txt" >&2
		[ -f "$tmp/cb-$f-rotkc.bin" ] ||
			"$run_bin" calibrate --kv "$f" --threads "$threads" --limit "${KVQ_CB_TOKENS:-8192}" --rotate \
				--k-center "$tmp/kc.bin" --out "$tmp/cb-$f-rotkc.bin" "$tmp/calib.txt" >&2
	done
)
for r in "${runs[@]}"; do
	read -r name text ctx list opt <<<"$r"
	if [ -n "${KVQ_QUALITY_RUNS:-}" ] && [[ " $KVQ_QUALITY_RUNS " != *" $name "* ]]; then
		continue
	fi
	declare -n pol=$list
	args=("${run_args[@]}")
	case $opt in
	-) args+=(--codebooks "$tmp/cb-pq2.bin" --codebooks "$tmp/cb-pq1.bin") ;;
	rot,kc) args+=(--rotate --k-center "$tmp/kc.bin" --codebooks "$tmp/cb-pq2-rotkc.bin"
		--codebooks "$tmp/cb-pq1-rotkc.bin") ;;
	esac
	[ -n "${KVQ_TEXTS:-}" ] && text=$KVQ_TEXTS/$(basename "$text")
	for p in "${pol[@]}"; do
		args+=(--kv "$p")
	done
	echo "=== $name: $text, ctx $ctx, ${#pol[@]} policies against f16 ($opt)" >&2
	(
		kvqd_temp_start "$top" "quality-$name"
		"$run_bin" ab "${args[@]}" --ctx "$ctx" --gen 0 --threads "$threads" --json "$text" \
			>"$out/$name.json.tmp"
		mv "$out/$name.json.tmp" "$out/$name.json"
	)
	unset -n pol
done
python3 "$top/tools/quality-table.py" "$out"/*.json $(ls "$out"/cpu/*.json 2>/dev/null) >"$out/../QUALITY.md"
echo "wrote $(cd "$out/.." && pwd)/QUALITY.md" >&2
