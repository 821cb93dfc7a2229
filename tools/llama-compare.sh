#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvqd's KV formats beside llama.cpp's KV cache types, on the same model
# (SmolLM2-135M-Instruct Q4_1), text, windows and scored positions.
# llama.cpp is built from the llama-cpp-python source distribution (pip
# download, pinned below; the vendored llama.cpp commit is printed), its own
# llama-perplexity in KL-divergence mode: an FP16-KV pass saves the logits,
# then each KV type is scored against them, at llama.cpp's defaults (which
# rotate quantized K and V by a Walsh-Hadamard matrix) and with
# LLAMA_ATTN_ROT_DISABLE=1.  kvq-run ab runs the same windows with
# --score-from ctx/2 (llama-perplexity scores the second half of each
# window), after checking that both tokenizers give the same ids.  Both
# FP16-KV perplexities, dPPL, KL and top-1 go to a JSON per text under
# OUTDIR (bench/quality by default) that tools/quality-table.py reads.
# Needs a build (build/), the model (tools/fetch-model.sh) and cmake
# (installed with apt-get when missing); texts of at most 128 KiB.  Not part of CI.
#   tools/llama-compare.sh TEXT [TEXT...]
# Environment: KVQ_CTX (tokens per window, default 2048; a text needs two
# windows at least), KVQ_COMPARE_OUT (OUTDIR), KVQ_THREADS (default 2),
# KVQ_RUN_ARGS (more kvq-run options, e.g. "--gpu"; with "--rotate" the
# JSON files are named llama-rot-*, with "--sink" llama-sink-*), KVQ_RUN and KVQD (the
# programs, default build/'s), LLAMA_CPP_PYTHON (the version, default
# below), LLAMA_BUILD (where llama.cpp is built, default
# ~/.cache/kvqd/llama.cpp-VERSION).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
version=${LLAMA_CPP_PYTHON:-0.3.36}
build=${LLAMA_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/kvqd/llama.cpp-$version}
ctx=${KVQ_CTX:-2048}
out=${KVQ_COMPARE_OUT:-$top/bench/quality}
threads=${KVQ_THREADS:-2}
run_bin=${KVQ_RUN:-$top/build/examples/kvq-run/kvq-run}
read -r -a run_args <<<"${KVQ_RUN_ARGS:-}"
# kvqd's format and the llama.cpp type it is compared with, and that type's bits per value
pairs=("int8 q8_0 8.5" "fp8 q5_1 6" "int4g32 q4_1 5" "int4g64 q4_0 4.5")

[ $# -ge 1 ] || { echo "usage: tools/llama-compare.sh TEXT [TEXT...]" >&2; exit 2; }
. "$top/tools/model-env.sh"
kvq_model_env "$top" llama-compare || exit 1
. "$top/tools/kvqd-temp.sh"

# cmake from Debian when missing (the C++ compiler comes with the project's
# build dependencies, pip with tools/fetch-model.sh above)
if ! command -v cmake >/dev/null; then
	echo "installing: cmake" >&2
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends cmake >&2
fi

# llama-perplexity and llama-tokenize, once per version
bin=$build/cmake/bin
if [ ! -x "$bin/llama-perplexity" ] || [ ! -x "$bin/llama-tokenize" ] || [ ! -s "$build/commit" ]; then
	rm -rf "$build/src" "$build/cmake"
	mkdir -p "$build/src"
	echo "downloading the llama-cpp-python $version source distribution" >&2
	python3 -m pip download --quiet --no-deps --no-binary=:all: --dest "$build/src" "llama-cpp-python==$version" >&2
	tar -xzf "$build/src/llama_cpp_python-$version.tar.gz" -C "$build/src"
	src=$build/src/llama_cpp_python-$version
	# the vendored llama.cpp: the commit the changelog names for this version
	sed -n "/^## \[$version\]/,/^## \[/p" "$src/CHANGELOG.md" | grep -o -m 1 'llama\.cpp@[0-9a-f]*' |
		sed 's/.*@//' >"$build/commit" || true
	[ -s "$build/commit" ] || echo unknown >"$build/commit"
	cmake -S "$src/vendor/llama.cpp" -B "$build/cmake" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF >&2
	cmake --build "$build/cmake" --target llama-perplexity llama-tokenize -j"$(nproc)" >&2
fi
commit=$(cat "$build/commit")
echo "llama.cpp: llama-cpp-python $version, vendored llama.cpp commit $commit" >&2

tmp=$(mktemp -d /tmp/kvq-llama.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
for text in "$@"; do
	name=$(basename "$text" | tr 'A-Z.' 'a-z-')
	# kvqd's formats rotated (+rot) beside llama.cpp's: their own files
	[[ " ${run_args[*]} " == *" --rotate "* ]] && name=rot-$name
	# with sink blocks (--sink): their own files too
	[[ " ${run_args[*]} " == *" --sink "* ]] && name=sink-$name
	# kvq-run tokenize takes the text as one argument (at most 128 KiB)
	if [ "$(wc -c <"$text")" -gt 131000 ]; then
		echo "llama-compare: $text is over 128 KiB; give its first part" >&2
		exit 1
	fi
	# the same ids from both tokenizers, for the windows scored
	# (--no-escape: llama.cpp's tools otherwise turn "\x08" and the like in
	# the text into the bytes they name, and score another text)
	"$bin/llama-tokenize" -m "$KVQ_MODEL" -f "$text" --ids --no-escape --log-disable 2>/dev/null >"$tmp/ids.llama"
	"$run_bin" tokenize "$(cat "$text")" >"$tmp/ids.kvq"
	chunks=$(python3 - "$tmp/ids.llama" "$tmp/ids.kvq" "$ctx" <<'PY'
import ast, sys
a = ast.literal_eval(open(sys.argv[1]).read().strip())
b = [int(x) for x in open(sys.argv[2]).read().split()]
ctx = int(sys.argv[3])
n = len(a) // ctx * ctx
if n < 2 * ctx:
    sys.exit(f"{len(a)} tokens: llama-perplexity needs two windows of {ctx} at least")
if a[:n] != b[:n]:
    i = next(i for i in range(n) if i >= len(b) or a[i] != b[i])
    sys.exit(f"the tokenizers differ at token {i} of {n}")
print(n // ctx)
PY
) || { echo "llama-compare: $text: the comparison needs the same token ids" >&2; exit 1; }
	echo "=== $text: $chunks windows of $ctx tokens, identical ids in both tools" >&2
	ppl=("$bin/llama-perplexity" -m "$KVQ_MODEL" -c "$ctx" -b "$ctx" --chunks "$chunks" -fa on -t "$threads" --no-escape)
	"${ppl[@]}" -f "$text" --kl-divergence-base "$tmp/base.kld" >"$tmp/base.log" 2>&1
	for p in "${pairs[@]}"; do
		read -r _ type _ <<<"$p"
		"${ppl[@]}" -ctk "$type" -ctv "$type" --kl-divergence-base "$tmp/base.kld" --kl-divergence \
			>"$tmp/$type.log" 2>&1
		LLAMA_ATTN_ROT_DISABLE=1 "${ppl[@]}" -ctk "$type" -ctv "$type" --kl-divergence-base "$tmp/base.kld" \
			--kl-divergence >"$tmp/$type-norot.log" 2>&1
	done
	kv=()
	for p in "${pairs[@]}"; do
		read -r f _ _ <<<"$p"
		kv+=(--kv "$f")
	done
	(
		kvqd_temp_start "$top" "llama-$name"
		"$run_bin" ab "${run_args[@]}" "${kv[@]}" --ctx "$ctx" --score-from $((ctx / 2)) \
			--limit $((chunks * ctx)) --gen 0 --threads "$threads" --json "$text" >"$tmp/kvq.json"
	)
	python3 - "$tmp" "$version" "$commit" "${pairs[@]}" >"$out/llama-$name-$ctx.json" <<'PY'
import json, re, sys
tmp, version, commit, pairs = sys.argv[1], sys.argv[2], sys.argv[3], [p.split() for p in sys.argv[4:]]
run = json.load(open(f"{tmp}/kvq.json"))

def grab(log, pattern):
    m = re.search(pattern, open(log).read())
    if not m:
        sys.exit(f"{log}: no '{pattern}' in llama-perplexity's output")
    return float(m.group(1))

base = grab(f"{tmp}/base.log", r"Final estimate: PPL = ([0-9.]+)")
run["llama"] = {"version": version, "commit": commit, "ppl_f16": base}
for f, t, bits in pairs:
    for tag, label in (("", f"llama.cpp {t}"), ("-norot", f"llama.cpp {t} (rotation off)")):
        log = f"{tmp}/{t}{tag}.log"
        q, b = grab(log, r"Mean PPL\(Q\)\s*:\s*([0-9.]+)"), grab(log, r"Mean PPL\(base\)\s*:\s*([0-9.]+)")
        run["results"].append({"kv": label, "window": 0, "bits_per_value": float(bits), "ppl": q,
                               "dppl_pct": 100.0 * (q - b) / b, "kl": grab(log, r"Mean\s+KLD:\s*([0-9.]+)"),
                               "top1": grab(log, r"Same top p:\s*([0-9.]+)") / 100.0, "rep4": 0.0, "cont_match": 0.0})
json.dump(run, sys.stdout)
print()
PY
	echo "wrote $out/llama-$name-$ctx.json (llama.cpp FP16-KV perplexity $(grep -o 'Final estimate: PPL = [0-9.]*' "$tmp/base.log"))" >&2
done
