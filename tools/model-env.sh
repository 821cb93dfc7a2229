# SPDX-License-Identifier: Apache-2.0
# Sourced by the tools that run the model: exports KVQ_MODEL, the path
# tools/fetch-model.sh prints, unless it is set already.  Returns 1 when the
# model cannot be had; fetch-model.sh, or this, has then printed one line
# saying what failed and what to do.
#   kvq_model_env TOP NAME        (NAME: the caller, for the message)
kvq_model_env() {
	local top=$1 name=$2 path
	if [ -n "${KVQ_MODEL:-}" ]; then
		if [ ! -f "$KVQ_MODEL" ]; then
			echo "$name: KVQ_MODEL=$KVQ_MODEL is not a file; point it at SmolLM2-135M-Instruct.Q4_1.gguf, or unset it to fetch the model" >&2
			return 1
		fi
		export KVQ_MODEL
		return 0
	fi
	path=$(bash "$top/tools/fetch-model.sh") || return 1
	path=${path##*$'\n'}   # the last line
	if [ ! -f "$path" ]; then
		echo "$name: tools/fetch-model.sh printed '$path', which is not a file" >&2
		return 1
	fi
	export KVQ_MODEL=$path
}
