#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks kvq-run's tokenizer and FP16-KV forward pass against Hugging Face
# transformers loading the same .gguf file (tools/model-check-hf.py): token
# ids of every /usr/share/doc/*/copyright file, then logits on Debian's
# license texts.  Makes a venv with pinned torch, transformers, accelerate and
# gguf in the cache directory, starts a kvqd on a temporary socket, prints
# JSON results and AGREE or DISAGREE per text.  Not part of CI: PyPI has no
# CPU-only torch for linux x86_64, so the venv takes the CUDA build and its
# CUDA libraries (about 2.6 GB to download, 4.9 GB installed; never used
# here), and a run takes a few minutes.  Two threads (KVQ_CHECK_THREADS).
#   tools/model-check-hf.sh [N_TOKENS]        (default 256)
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-256}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvqd
venv=$cache/model-check-hf-venv
. "$top/tools/model-env.sh"
kvq_model_env "$top" model-check-hf || exit 1
export OMP_NUM_THREADS=${KVQ_CHECK_THREADS:-2}

if [ ! -x "$venv/bin/python" ] || [ ! -e "$venv/.installed" ]; then
	python3 -m venv "$venv" || {
		echo "python3 -m venv failed: apt-get install python3-venv" >&2
		exit 1
	}
	"$venv/bin/pip" install --quiet torch==2.11.0 transformers==5.17.0 accelerate==1.15.0 gguf==0.19.0 \
		numpy==2.4.6 tokenizers==0.23.3
	touch "$venv/.installed"
fi
. "$top/tools/kvqd-temp.sh"
kvqd_temp_start "$top" check-hf
rc=0
"$venv/bin/python" "$top/tools/model-check-hf.py" tokens "$top/build/examples/kvq-run/kvq-run" "$KVQ_MODEL" \
	/usr/share/doc/*/copyright || rc=1
for text in /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GFDL-1.3; do
	"$venv/bin/python" "$top/tools/model-check-hf.py" "$top/build/examples/kvq-run/kvq-run" "$KVQ_MODEL" "$text" "$n" ||
		rc=1
done
exit $rc
