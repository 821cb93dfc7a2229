#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks kvq-run's tokenizer and FP16-KV forward pass against an independent
# reference (tools/model-check.py: the gguf package's dequantizers, the
# tokenizers library, a float64 numpy forward): token ids of every
# /usr/share/doc/*/copyright file, then logits on Debian's license texts.
# Makes a venv with the reference's packages in the cache directory, starts a
# kvqd on a temporary socket, prints JSON results and AGREE or DISAGREE per
# text.  Not part of CI (it downloads the packages; a few minutes).
#   tools/model-check.sh [N_TOKENS]        (default 256)
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-256}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvqd
venv=$cache/model-check-venv
. "$top/tools/model-env.sh"
kvq_model_env "$top" model-check || exit 1

if [ ! -x "$venv/bin/python" ]; then
	python3 -m venv "$venv" || {
		echo "python3 -m venv failed: apt-get install python3-venv" >&2
		exit 1
	}
	"$venv/bin/pip" install --quiet gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3
fi
. "$top/tools/kvqd-temp.sh"
kvqd_temp_start "$top" check
rc=0
# the tokenizer on every copyright file Debian installed (many non-ASCII names)
"$venv/bin/python" "$top/tools/model-check.py" tokens "$top/build/examples/kvq-run/kvq-run" "$KVQ_MODEL" \
	/usr/share/doc/*/copyright || rc=1
for text in /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GFDL-1.3; do
	"$venv/bin/python" "$top/tools/model-check.py" "$top/build/examples/kvq-run/kvq-run" "$KVQ_MODEL" "$text" "$n" ||
		rc=1
done
exit $rc
