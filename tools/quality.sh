#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The KV-format quality table (bench/QUALITY.md): kvq-run ab (every policy
# against FP16 KV in one pass over the text) on English texts that Debian's
# base-files package ships, at context 2048 and at the model's maximum (8192),
# then tools/quality-table.py.  Needs a build (build/) and the model
# (tools/fetch-model.sh); starts its own kvqd on a temporary socket.
#   tools/quality.sh [OUTDIR]      (default bench/quality; the table goes to bench/QUALITY.md)
# Environment: KVQ_THREADS (default 2), KVQ_QUALITY_RUNS (a subset of the run
# names below, e.g. "gpl3-2048").
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$top/bench/quality}
threads=${KVQ_THREADS:-2}
run_bin=$top/build/examples/kvq-run/kvq-run
export KVQ_MODEL=${KVQ_MODEL:-$(bash "$top/tools/fetch-model.sh" | tail -n 1)}

# every format (int4g128 needs head dim 128; SmolLM2 has 64), a mixed K/V policy, layer-wise policies, open windows 32 and 128
all=(bf16 int8 fp8 fp8e5m2 int4g64 int4g32 kivi4 kivi2 k=int8,v=int4g32
	"0-9:int8;10-:kivi4" "0-9:int8;10-:kivi2" "k=int4g64,v=kivi2"
	int4g32@32 int4g32@128 kivi4@32 kivi4@128 kivi2@32 kivi2@128)
# at 8192 (one window of the whole text: slow on two cores) a subset
long=(int8 fp8 int4g32 kivi4 kivi2 k=int8,v=int4g32 "0-9:int8;10-:kivi4" kivi2@128)

# name  text  ctx  policy-list  continuations (greedy tokens, prompts)
runs=(
	"gpl3-2048 /usr/share/common-licenses/GPL-3 2048 all 32 2"
	"gpl3-8192 /usr/share/common-licenses/GPL-3 8192 long 0 0"
	"gfdl-2048 /usr/share/common-licenses/GFDL-1.3 2048 all 32 2"
)

. "$top/tools/kvqd-temp.sh"
kvqd_temp_start "$top" quality
mkdir -p "$out"
for r in "${runs[@]}"; do
	read -r name text ctx list gen gp <<<"$r"
	if [ -n "${KVQ_QUALITY_RUNS:-}" ] && [[ " $KVQ_QUALITY_RUNS " != *" $name "* ]]; then
		continue
	fi
	declare -n pol=$list
	args=()
	for p in "${pol[@]}"; do
		args+=(--kv "$p")
	done
	echo "=== $name: $text, ctx $ctx, ${#pol[@]} policies against f16" >&2
	"$run_bin" ab "${args[@]}" --ctx "$ctx" --gen "$gen" --gen-prompts "$gp" --threads "$threads" --json \
		"$text" >"$out/$name.json.tmp"
	mv "$out/$name.json.tmp" "$out/$name.json"
	unset -n pol
done
python3 "$top/tools/quality-table.py" "$out"/*.json >"$top/bench/QUALITY.md"
echo "wrote $top/bench/QUALITY.md" >&2
