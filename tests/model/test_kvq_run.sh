#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvq-run on the real model (SmolLM2-135M-Instruct, tools/fetch-model.sh)
# against a kvqd it starts on a temporary socket: the tokenizer on non-ASCII
# text, a GGUF that is cut short, generation (and a prefix hit with KIVI's
# wide window), FP16-KV perplexity in the range
# the independent reference gives (tools/model-check.py), int8 KV against
# FP16, product quantization with calibrated codebooks.  Skipped when the model has not been fetched.
. "$(dirname "$0")/lib.sh"
text=/usr/share/common-licenses/GPL-3

model_require
if [ ! -f "$text" ]; then
	echo "1..0 # SKIP $text missing (Debian's base-files ships it)"
	exit 0
fi
model_kvqd_start model

json_num() {   # json_num KEY FILE: the first number after "KEY":
	sed -n "s/.*\"$1\":\([-0-9.e]*\).*/\1/p" "$2" | head -n 1
}
between() {   # between X LO HI
	awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x != "" && x >= lo && x <= hi) }'
}

close_to_f16() {   # close_to_f16 KL TOP1
	awk -v k="$1" -v t="$2" 'BEGIN { exit !(k != "" && k < 0.01 && t > 0.95) }'
}

echo "1..32"

# Ids recorded from the tokenizers library (Rust BPE) built from the GGUF's
# vocabulary and merges with SmolLM2's pre-tokenizer, as tools/model-check.py
# builds it: tokenizer.encode(T).ids
t=$(printf 'Größe, café & naïve — 日本語 Ελληνικά «Привет, мир» 12345 it'"'"'s I'"'"'LL  two   spaces\n\ttab 😀 ÿ€')
want="27302 7466 34878 85 28 37366 1456 15486 46494 1841 17097 241 115 40993 179 120 248 5664 239 17162 17162 25723 11517 12001 21118 26112 23708 155 249 46879 16464 32547 28 41337 7872 9175 20306 216 33 34 35 36 37 357 506 339 23 16421 216 827 256 5600 198 197 15999 40303 218 5549 140 14195"
check "non-ASCII text gives the reference tokenizer's ids" test "$("$run" tokenize "$t")" = "$want"
check "non-ASCII text decodes back to the same bytes" test "$("$run" tokenize --decode "$t")" = "$t"
check "control tokens split out with --special, plain text without" \
	test "$("$run" tokenize --special "$(printf '<|im_start|>user\nhi<|im_end|>')")" = "1 4093 198 6004 2" -a \
	"$("$run" tokenize "<|im_end|>")" != "2"

head -c 1000000 "$model" >"$tmp/cut.gguf"
"$run" tokenize --model "$tmp/cut.gguf" hi >/dev/null 2>"$tmp/cut.err"
rc=$?
check "a GGUF cut short is refused with a reason" test $rc -ne 0 -a -s "$tmp/cut.err"

"$run" generate --prompt "What is the capital of France?" --max-tokens 24 >"$tmp/gen.out" 2>"$tmp/gen.err"
check "generate answers a simple question (f16 KV)" grep -q Paris "$tmp/gen.out"

# KIVI's window (4 blocks, 128 tokens) is wider than the way from a hit to
# the next --batch boundary: a second worker with the same system prompt
# still gets a hit, and its answer equals the one without the prefix cache
head -c 2000 /usr/share/common-licenses/Artistic >"$tmp/sys.txt"
for w in cold warm off; do
	a=
	[ $w = off ] && a=--no-prefix-cache
	"$run" generate --kv kivi4 --system-file "$tmp/sys.txt" --prompt "Who may copy the package?" --max-tokens 8 \
		$a >"$tmp/kivi.$w" 2>"$tmp/kivi.$w.err" || echo "# $w: $(tail -n 1 "$tmp/kivi.$w.err")"
done
kivi_hit=$(sed -n 's/.*: \([0-9]*\) from the prefix cache,.*/\1/p' "$tmp/kivi.warm.err")
check "kivi4 with a cached system prompt: hit ($kivi_hit tokens), same answer as without the cache" \
	sh -c "[ '${kivi_hit:-0}' -gt 0 ] && [ -s '$tmp/kivi.off' ] && cmp -s '$tmp/kivi.warm' '$tmp/kivi.off'"

# tools/model-check.py on these 256 tokens: reference perplexity 21.6594,
# kvq-run 21.6614; allowed: the reference's value +-0.1 %
"$run" perplexity --kv f16 --ctx 256 --limit 256 --json "$text" >"$tmp/ppl.json" 2>&1
ppl=$(json_num ppl "$tmp/ppl.json")
check "f16-KV perplexity of 256 tokens of GPL-3 ($ppl) agrees with the reference" between "$ppl" 21.638 21.681

"$run" ab --kv int8 --kv kivi2 --ctx 256 --limit 256 --gen 0 --json "$text" >"$tmp/ab.json" 2>&1
sed 's/},{/}\n{/g' "$tmp/ab.json" >"$tmp/ab.lines"
kl8=$(grep '"kv":"int8"' "$tmp/ab.lines" | sed -n 's/.*"kl":\([-0-9.e]*\).*/\1/p')
top8=$(grep '"kv":"int8"' "$tmp/ab.lines" | sed -n 's/.*"top1":\([-0-9.e]*\).*/\1/p')
kl2=$(grep '"kv":"kivi2"' "$tmp/ab.lines" | sed -n 's/.*"kl":\([-0-9.e]*\).*/\1/p')
check "int8 KV stays close to f16 (KL $kl8, top-1 $top8)" close_to_f16 "$kl8" "$top8"
check "kivi2 KV moves further from f16 than int8 (KL $kl2 > $kl8)" between "$kl2" "$kl8" 100

# scored as llama-perplexity scores (tools/llama-compare.sh): the second half
# of each window, predictions at positions 128..254 of two windows of 256
"$run" ab --kv int8 --ctx 256 --score-from 128 --limit 512 --gen 0 --json "$text" >"$tmp/abh.json" 2>&1
check "ab --score-from 128 scores 2 x 127 predictions ($(json_num scored "$tmp/abh.json"))" \
	test "$(json_num scored "$tmp/abh.json")" = 254 -a "$(json_num score_from "$tmp/abh.json")" = 128
check "ab refuses a --score-from that leaves nothing to score" \
	sh -c '"$1" ab --kv int8 --ctx 256 --score-from 255 --gen 0 "$2" 2>&1 | grep -q "leaves nothing to score"' \
	sh "$run" "$text"

# the Hadamard rotation (the policy's +rot, done by libkvq) and K centering
# leave the function alone (f16 KV) and take quantization error out of
# per-token K
"$run" perplexity --kv f16+rot --ctx 256 --limit 256 --json "$text" >"$tmp/rot.json" 2>&1
rot=$(json_num ppl "$tmp/rot.json")
check "f16+rot KV leaves the perplexity ($rot vs $ppl) within 0.05 %" \
	awk -v a="$rot" -v b="$ppl" 'BEGIN { exit !(a != "" && b != "" && (a - b) / b < 5e-4 && (b - a) / b < 5e-4) }'
calib=/usr/share/common-licenses/Apache-2.0
"$run" calibrate --limit 512 --out "$tmp/kc.bin" "$calib" >"$tmp/kc.out" 2>&1
"$run" perplexity --k-center "$tmp/kc.bin" --kv f16 --ctx 256 --limit 256 --json "$text" >"$tmp/kc.json" 2>&1
kc=$(json_num ppl "$tmp/kc.json")
check "--k-center leaves the f16-KV perplexity ($kc vs $ppl) within 0.05 %" \
	awk -v a="$kc" -v b="$ppl" 'BEGIN { exit !(a != "" && b != "" && (a - b) / b < 5e-4 && (b - a) / b < 5e-4) }'
# K means of rotated K (an earlier kvq-run's --rotate rotated K itself):
# the same file with its rotate word set, refused with a reason
{ head -c 20 "$tmp/kc.bin"; printf '\001\000\000\000'; tail -c +25 "$tmp/kc.bin"; } >"$tmp/kcold.bin"
rc=0
"$run" perplexity --k-center "$tmp/kcold.bin" --kv f16 --ctx 256 --limit 256 "$text" >/dev/null \
	2>"$tmp/kc.err" || rc=$?
check "K means of K rotated by an earlier kvq-run are refused" \
	sh -c "test $rc -ne 0 && grep -q 'calibrate again' '$tmp/kc.err'"
rc=0
"$run" calibrate --rotate --limit 64 --out "$tmp/kcr.bin" "$calib" >/dev/null 2>"$tmp/kcr.err" || rc=$?
check "calibrate of K means refuses --rotate (K is centered unrotated)" \
	sh -c "test $rc -ne 0 && grep -q 'unrotated' '$tmp/kcr.err'"
"$run" ab --kv int4g32 --ctx 256 --limit 256 --gen 0 --json "$text" >"$tmp/ab4.json" 2>&1
"$run" ab --rotate --k-center "$tmp/kc.bin" --kv int4g32 --ctx 256 --limit 256 --gen 0 --json "$text" \
	>"$tmp/ab4r.json" 2>&1
check "--rotate stores int4g32 rotated (the policy reported is k=int4g32+rot,v=int4g32+rot)" \
	grep -q '"kv":"k=int4g32+rot,v=int4g32+rot"' "$tmp/ab4r.json"
kl4=$(sed -n 's/.*"results":.*"kl":\([-0-9.e]*\).*/\1/p' "$tmp/ab4.json")
kl4r=$(sed -n 's/.*"results":.*"kl":\([-0-9.e]*\).*/\1/p' "$tmp/ab4r.json")
check "rotated, centered int4g32 KV is closer to f16 (KL $kl4r < $kl4)" \
	awk -v a="$kl4r" -v b="$kl4" 'BEGIN { exit !(a != "" && b != "" && a < 0.75 * b) }'
# product quantization: codebooks calibrated on another text (512 tokens, k-means
# of 256 centroids: overfit, enough to show the path), a run with them; a policy
# without its codebooks, and codebooks of other transforms, refused with reasons
"$run" calibrate --kv k=int8,v=pq2 --limit 512 --out "$tmp/cb.bin" "$calib" >"$tmp/cb.out" 2>&1
"$run" ab --kv k=int8,v=pq2 --codebooks "$tmp/cb.bin" --ctx 256 --limit 256 --gen 0 --json "$text" \
	>"$tmp/abpq.json" 2>&1
klpq=$(sed -n 's/.*"results":.*"kl":\([-0-9.e]*\).*/\1/p' "$tmp/abpq.json")
bpq=$(sed -n 's/.*"results":.*"bits_per_value":\([-0-9.e]*\).*/\1/p' "$tmp/abpq.json")
check "k=int8,v=pq2 with calibrated codebooks runs ($bpq bits per value, KL $klpq: above int8's $kl8, below 0.5)" \
	awk -v k="$klpq" -v lo="$kl8" -v b="$bpq" 'BEGIN { exit !(k != "" && k > lo && k < 0.5 && b >= 5.1 && b <= 5.2) }'
rc=0
"$run" ab --kv pq2 --codebooks "$tmp/cb.bin" --ctx 256 --limit 256 --gen 0 "$text" >/dev/null 2>"$tmp/pq.err" || rc=$?
check "a policy whose codebooks no --codebooks file holds is refused with a reason" \
	sh -c "test $rc -ne 0 && grep -q 'give --codebooks FILE' '$tmp/pq.err'"
rc=0
"$run" ab --rotate --kv k=int8,v=pq2 --codebooks "$tmp/cb.bin" --ctx 256 --limit 256 --gen 0 "$text" >/dev/null \
	2>"$tmp/pqr.err" || rc=$?
check "codebooks calibrated unrotated are refused with --rotate (another basis)" \
	sh -c "test $rc -ne 0 && grep -q 'give --codebooks FILE' '$tmp/pqr.err'"

# batched generation (generate --prompts: the prompts as one batch):
# prompts of different lengths after a shared system text of about 150
# tokens (so KIVI's 128-token window seals blocks too), in prefill chunks
# of 16, so that short prompts decode while long ones still prefill; each
# sequence's greedy tokens must be exactly those of its prompt alone
gen_ids() {   # gen_ids JSON SEQ: the ids sequence SEQ generated (generate --json)
	sed 's/},{/}\n{/g' "$1" | grep "\"seq\":$2," | sed -n 's/.*"ids":\[\([^]]*\)\].*/\1/p'
}
gen_args="--system-file $tmp/bsys.txt --batch 16 --max-tokens 12 --json"
same_as_alone() {   # same_as_alone KV JSON: each prompt's ids in the batch's JSON equal its own run's
	i=0
	while IFS= read -r line; do
		if [ ! -f "$tmp/alone.$1.$i.json" ]; then
			"$run" generate --kv "$1" $gen_args --prompt "$line" --no-prefix-cache >"$tmp/alone.$1.$i.json" \
				2>"$tmp/alone.err" || return 1
		fi
		a=$(gen_ids "$tmp/alone.$1.$i.json" 0)
		b=$(gen_ids "$2" $i)
		if [ -z "$a" ] || [ "$a" != "$b" ]; then
			echo "# $1, prompt $i: alone [$a], in the batch [$b]"
			return 1
		fi
		i=$((i + 1))
	done <"$tmp/bprompts.txt"
	[ $i -eq 4 ]
}
head -c 600 /usr/share/common-licenses/Artistic >"$tmp/bsys.txt"
printf '%s\n' "What is the capital of France?" \
	"Write a short poem about the sea, the wind and the long grey evenings of a northern winter, when the boats stay in." \
	"Name three prime numbers." \
	"Explain in two sentences why the sky is blue, then say why a sunset is red and how that differs from noon." \
	>"$tmp/bprompts.txt"
for kv in f16 int8 kivi4; do
	"$run" generate --kv $kv $gen_args --prompts "$tmp/bprompts.txt" --no-prefix-cache >"$tmp/batch.$kv.json" \
		2>"$tmp/batch.$kv.err" || echo "# $kv: $(tail -n 1 "$tmp/batch.$kv.err")"
	check "batched generation of 4 prompts of different lengths ($kv KV): each gives the tokens it gives alone" \
		same_as_alone $kv "$tmp/batch.$kv.json"
done
bj=$tmp/batch.int8.json
mixed=$(json_num mixed "$bj")
check "the batch mixed prompt chunks and decode in $mixed step(s); it reports $(json_num decode_tokens_per_s "$bj") tok/s, \
step latency, attention share $(json_num attention_share "$bj"), KV bytes $(json_num kv_bytes_peak "$bj")" \
	awk -v m="$mixed" -v t="$(json_num decode_tokens_per_s "$bj")" -v ms="$(json_num mean "$bj")" \
	-v a="$(json_num attention_share "$bj")" -v b="$(json_num kv_bytes_peak "$bj")" \
	'BEGIN { exit !(m > 0 && t > 0 && ms > 0 && a > 0 && a < 1 && b > 0) }'
# with the prefix cache: the second run finds each prompt's sealed prefix,
# keeps it as a run alone does (its first chunk), and gives the same tokens
for w in cold warm; do
	"$run" generate --kv int8 $gen_args --prompts "$tmp/bprompts.txt" >"$tmp/bcache.$w.json" 2>"$tmp/bcache.$w.err" ||
		echo "# $w: $(tail -n 1 "$tmp/bcache.$w.err")"
done
bhit=$(json_num hit_tokens "$tmp/bcache.warm.json")
hit_and_same() {   # hit_and_same HIT JSON
	[ "${1:-0}" -gt 0 ] && same_as_alone int8 "$2"
}
check "a batch whose prompts the prefix cache holds takes them ($bhit tokens) and gives the tokens each gives alone" \
	hit_and_same "$bhit" "$tmp/bcache.warm.json"
refused() {   # refused PATTERN ARGS...: kvq-run ARGS fails, its message matching PATTERN
	pat=$1
	shift
	rc=0
	"$run" "$@" >/dev/null 2>"$tmp/refused.err" || rc=$?
	[ $rc -ne 0 ] && grep -q "$pat" "$tmp/refused.err"
}
check "generate --seqs 0 is refused with a reason" refused "seqs between" generate --prompt hi --seqs 0
check "generate --seqs above the limit (1024) is refused with a reason" refused "seqs between" \
	generate --prompt hi --seqs 1025
: >"$tmp/empty.txt"
check "generate --prompts of an empty file is refused with a reason" refused "no prompts" \
	generate --prompts "$tmp/empty.txt"
check "a step too small for a prompt chunk beside every decode is refused with a reason" refused "at least --seqs" \
	generate --prompt hi --seqs 4 --batch 16 --step-tokens 8
# continuations: --ctx tokens of FILE from a point of each sequence's own
"$run" generate --kv int8 --ctx 48 --seqs 3 --max-tokens 4 --batch 16 --ignore-eos --json "$text" >"$tmp/cont.json" \
	2>"$tmp/cont.err"
froms=$(sed 's/},{/}\n{/g' "$tmp/cont.json" | sed -n 's/.*"from_token":\([0-9]*\),.*"generated":4,.*/\1/p' | tr '\n' ' ')
check "generate --ctx 48 --seqs 3 FILE continues FILE from 3 points of its own ($froms), 4 tokens each" \
	sh -c '[ $# -eq 3 ] && [ "$(printf "%s\n" "$@" | sort -u | wc -l)" -eq 3 ]' sh $froms
# --ignore-eos (for measurements): every sequence runs to --max-tokens,
# the first prompt (which stops after 7 tokens) included
"$run" generate --kv int8 $gen_args --prompts "$tmp/bprompts.txt" --ignore-eos --max-tokens 20 >"$tmp/noeos.json" \
	2>"$tmp/noeos.err"
noeos=$(sed -n 's/^{[^[]*"generated":\([0-9]*\),.*/\1/p' "$tmp/noeos.json")
check "--ignore-eos: every sequence generates --max-tokens ($noeos of 4 x 20), the first its tokens alone and more" \
	sh -c '[ "$1" = 80 ] && [ -n "$2" ] && case "$3" in "$2",*) true ;; *) false ;; esac' sh \
	"$noeos" "$(gen_ids "$tmp/alone.int8.0.json" 0)" "$(gen_ids "$tmp/noeos.json" 0)"

# --gpu: the GPU path where a GPU is usable (tests/gpu/model.sh compares
# it with this path), else a refusal that names the reason
rc=0
"$run" perplexity --gpu --kv f16 --ctx 256 --limit 256 --json "$text" >"$tmp/gpu.json" 2>"$tmp/gpu.err" || rc=$?
gppl=$(json_num ppl "$tmp/gpu.json")
check "--gpu runs and agrees ($gppl) or is refused with a reason ($(head -c 120 "$tmp/gpu.err"))" \
	sh -c "if [ $rc -eq 0 ]; then awk -v a='$gppl' -v b='$ppl' 'BEGIN { exit !((a - b) / b < 1e-3 && (b - a) / b < 1e-3) }';
	else grep -qi 'cuda\|gpu\|cublas' '$tmp/gpu.err'; fi"

exit 0
