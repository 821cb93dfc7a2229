#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvq-run ab --prompts on the real model (SmolLM2-135M-Instruct,
# tools/fetch-model.sh) against a kvqd it starts on a temporary socket, with
# prompts files it writes: every continuation equals kvq-run generate
# --no-prefix-cache on the same prompt (plain lines, JSON lines with a
# system prompt, --raw), prompts beyond the context are skipped and counted,
# the JSON is valid, the bf16 control sits below a 2-bit format, and bad
# input is refused with the file and line.  Skipped when the model has not
# been fetched; the checks that read JSON need python3.
. "$(dirname "$0")/lib.sh"

model_require
model_kvqd_start ab

skip() {   # skip DESCRIPTION REASON
	n=$((n + 1))
	echo "ok $n - $1 # SKIP $2"
}
have_py=false
command -v python3 >/dev/null 2>&1 && have_py=true
pycheck() {   # pycheck DESCRIPTION SCRIPT ARGS...: SCRIPT (python3) exits 0
	if $have_py; then
		d=$1
		shift
		check "$d" python3 "$@"
	else
		skip "$1" "no python3"
	fi
}

echo "1..14"

# ab's JSON against generate: for every prompt run and every row, generate
# with that row's KV (POLICY@WINDOW as ab names it) on the same prompt
cat >"$tmp/same.py" <<'EOF'
import json, subprocess, sys
run, report, gen = sys.argv[1], sys.argv[2], sys.argv[3]
extra = sys.argv[4:]
d = json.load(open(report))
bad = 0
for p in d["per_prompt"]:
    if p["skipped"]:
        continue
    for c in [p["f16"]] + p["kv"]:
        kv = "%s@%d" % (c["kv"], c["window"])
        args = [run, "generate", "--kv", kv, "--no-prefix-cache", "--max-tokens", gen, "--prompt", p["prompt"]]
        sysp = p.get("system")
        if sysp is not None:
            args += ["--system", sysp]
        out = subprocess.run(args + extra, capture_output=True).stdout.decode("utf-8", "replace")
        if out[:-1] != c["text"]:
            print("# line %d, kv %s: ab %r, generate %r" % (p["line"], kv, c["text"], out[:-1]))
            bad += 1
sys.exit(bad != 0)
EOF

long=$(awk 'BEGIN { for (i = 0; i < 300; i++) printf "word%d ", i }')
printf '%s\n\n%s\n%s\n%s\n' "What is the capital of France?" "Give three tips for staying healthy." "$long" \
	"Write a haiku about the sea." >"$tmp/plain.txt"
"$run" ab --prompts "$tmp/plain.txt" --block 16 --kv int8 --kv kivi2@16 --ctx 256 --gen 24 --json \
	>"$tmp/plain.json" 2>"$tmp/plain.err"
if $have_py; then
	check "ab --prompts --json is valid JSON" python3 -m json.tool "$tmp/plain.json" /dev/null
else
	skip "ab --prompts --json is valid JSON" "no python3"
fi
pycheck "the prompt beyond --ctx (line 4) is skipped and counted, the three others run" - "$tmp/plain.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(not (d["prompts"] == 4 and d["run"] == 3 and d["skipped"] == 1 and d["skipped_lines"] == [4]))
EOF
pycheck "f16, the bf16 control, int8 and kivi2@16: each continuation equals generate's" \
	"$tmp/same.py" "$run" "$tmp/plain.json" 24 --block 16
pycheck "kivi2@16 leaves f16's continuation somewhere (the fork after a difference is tested)" - "$tmp/plain.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
k = [r for r in d["results"] if r["kv"] == "kivi2"][0]
diff = [c for p in d["per_prompt"] if not p["skipped"] for c in p["kv"] if c["kv"] == "kivi2" and not c["exact"]]
sys.exit(not (k["exact_match"] < 1 and diff and d["most_different"]))
EOF
pycheck "the bf16 control row is below kivi2@16 in KL and at or above it in top-1" - "$tmp/plain.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = {x["kv"]: x for x in d["results"]}
b, k = r["bf16"], r["kivi2"]
sys.exit(not (b["control"] and b["kl"] < k["kl"] and b["top1"] >= k["top1"] and b["tf_positions"] > 0))
EOF

# JSON lines: a system prompt of the line's own, a member that is skipped,
# escapes; and the same prompts file with --system for the lines without
printf '%s\n%s\n' '{"prompt": "Name a color.", "system": "You answer in one word.", "id": [1, {"x": null}]}' \
	'{"prompt": "Say \"hi\"\tplease.\u00e9"}' >"$tmp/lines.jsonl"
"$run" ab --prompts "$tmp/lines.jsonl" --kv int8 --gen 16 --json >"$tmp/lines.json" 2>"$tmp/lines.err"
pycheck "JSON lines with a system prompt: the continuations equal generate --system's" \
	"$tmp/same.py" "$run" "$tmp/lines.json" 16

printf '%s\n' "The capital of France is" >"$tmp/raw.txt"
"$run" ab --prompts "$tmp/raw.txt" --raw --kv int8 --gen 12 --json >"$tmp/raw.json" 2>"$tmp/raw.err"
pycheck "--raw: the continuations equal generate --raw's" "$tmp/same.py" "$run" "$tmp/raw.json" 12 --raw

"$run" ab --prompts "$tmp/plain.txt" --block 16 --kv kivi2@16 --ctx 256 --gen 24 >"$tmp/plain.md" 2>"$tmp/plain.md.err"
check "Markdown: the table with the control row, and kivi2's most different prompts by line" \
	sh -c "grep -q '^| bf16 (control) |' '$tmp/plain.md' && grep -q '^| kivi2 |' '$tmp/plain.md' &&
	grep -q '^### kivi2 (window 16): the prompts that differ most' '$tmp/plain.md' &&
	grep -q 'plain.txt line [0-9]' '$tmp/plain.md' && grep -q '1 skipped' '$tmp/plain.md'"

refused() {   # refused PATTERN ARGS...: kvq-run ARGS fails and says PATTERN
	pat=$1
	shift
	"$run" "$@" >/dev/null 2>"$tmp/refused.err" && return 1
	grep -q -- "$pat" "$tmp/refused.err" || { sed 's/^/# /' "$tmp/refused.err"; return 1; }
}
check "a missing prompts file is refused with its name" \
	refused "$tmp/none.txt: No such file" ab --prompts "$tmp/none.txt"
printf '\n  \n' >"$tmp/empty.txt"
check "a file without prompts is refused" refused "empty.txt: no prompts" ab --prompts "$tmp/empty.txt"
printf '%s\n%s\n' '{"prompt": "ok"}' '{"prompt": "not closed}' >"$tmp/bad.jsonl"
check "a bad JSON line is refused with its number" refused "bad.jsonl:2: a string not closed" \
	ab --prompts "$tmp/bad.jsonl"
printf '%s\n' '{"system": "x"}' >"$tmp/noprompt.jsonl"
check "a JSON line without \"prompt\" is refused" refused 'noprompt.jsonl:1: no "prompt"' \
	ab --prompts "$tmp/noprompt.jsonl"
check "a system prompt with --raw is refused" refused 'lines.jsonl:1: "system" with --raw' \
	ab --prompts "$tmp/lines.jsonl" --raw
check "every prompt beyond the context is refused, counted" refused "every prompt skipped (1 longer" \
	ab --prompts "$tmp/raw.txt" --ctx 8 --gen 4

exit 0
