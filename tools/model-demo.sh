#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two kvq-run workers share a prompt prefix through kvqd, on the real model.
# Starts kvqd with its embedded defaults (host backend, pools created on
# attach) on a temporary socket.  Both workers get the same system prompt
# (the Artistic License text Debian ships, about 1300 tokens) and different
# questions.  Worker 1 runs cold and publishes its sealed (int8) blocks;
# worker 2 finds them, skips their prefill and prints hit tokens and prefill
# time; then worker 2's question again with the prefix cache disabled must
# give the same tokens.  Needs build/ and the model (tools/fetch-model.sh).
#   tools/model-demo.sh [POLICY]       (default int8)
# Environment: KVQ_RUN_ARGS (more kvq-run options, e.g. "--gpu"), KVQ_RUN and
# KVQD (the programs, default build/'s), KVQ_TEXTS (a directory holding the
# system prompt's text under its base name).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
policy=${1:-int8}
system=/usr/share/common-licenses/Artistic
[ -n "${KVQ_TEXTS:-}" ] && system=$KVQ_TEXTS/Artistic
run=${KVQ_RUN:-$top/build/examples/kvq-run/kvq-run}
read -r -a run_args <<<"${KVQ_RUN_ARGS:-}"
. "$top/tools/model-env.sh"
kvq_model_env "$top" model-demo || exit 1

. "$top/tools/kvqd-temp.sh"
kvqd_temp_start "$top" model-demo
gen() {   # gen NAME QUESTION [ARGS...]
	local name=$1 q=$2
	shift 2
	echo "--- $name: \"$q\""
	"$run" generate --kv "$policy" --system-file "$system" --prompt "$q" --max-tokens 48 --threads 2 --stats "${run_args[@]}" "$@" \
		>"$kvqd_temp_dir/$name.out" 2>"$kvqd_temp_dir/$name.err" || { cat "$kvqd_temp_dir/$name.err"; return 1; }
	cat "$kvqd_temp_dir/$name.out"
	sed 's/^kvq-run: /  /' "$kvqd_temp_dir/$name.err"
}

echo "kvq-run: SmolLM2-135M-Instruct, KV policy $policy; system prompt: $system"
gen "worker 1 (cold)" "Who may charge a fee under this license?"
gen "worker 2 (warm)" "Can I distribute modified versions of the package?"
gen "worker 2 again, prefix cache disabled" "Can I distribute modified versions of the package?" --no-prefix-cache
if cmp -s "$kvqd_temp_dir/worker 2 (warm).out" "$kvqd_temp_dir/worker 2 again, prefix cache disabled.out"; then
	echo "worker 2's output with the shared prefix equals its output without the prefix cache: yes"
else
	echo "worker 2's output with the shared prefix equals its output without the prefix cache: NO"
	exit 1
fi
