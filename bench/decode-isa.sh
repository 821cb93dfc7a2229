#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# Instructions per KV byte of the decode kernel, read from its machine code
# without a GPU: bench/decode_isa.cu (decode_kernel's sealed-chunk loop)
# compiled for sm_90 per pair, head dim and activation, its chunk loop (the
# outermost loop with MMAs) found in the disassembly and its instructions
# counted per chunk (each once: a static count, the rarely taken rescale
# included; an unrolled loop's divided by its chunks), beside the bytes of
# K and V codes and parameters one chunk of 32 tokens reads.
#   bench/decode-isa.sh [K/V ...]        (default: the formats' own pairs)
# NVCC (default /usr/local/cuda/bin/nvcc) and CUOBJDUMP (default cuobjdump
# beside it, else on PATH) name the tools; KVQ_ISA_D and KVQ_ISA_ACT the
# head dims and activations (defaults "128 64" and "f16 bf16").  Run from
# the source tree; prints one line per instance and a table of op classes
# for each with --ops.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
objdump=${CUOBJDUMP:-$(dirname "$nvcc")/cuobjdump}
[ -x "$objdump" ] || objdump=$(command -v cuobjdump) || { echo "decode-isa: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
ops=
[ "${1:-}" = --ops ] && { ops=1; shift; }
[ $# -gt 0 ] || set -- f16/f16 int8/int8 fp8/fp8 int4g32/int4g32 int4g64/int4g64 int4g128/int4g128 \
	kivi4/kivi4 kivi2/kivi2 int8/int4g32 int8/kivi4 int8/kivi2 int4g64/kivi2
tmp=$(mktemp -d /tmp/kvq-isa.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# a minimal config.h where the tree has not been configured
[ -f "$top/config.h" ] || : > "$tmp/config.h"
# bytes of one 32-token chunk of a (K, V) pair at head dim D: codes and
# parameters as the layout sizes them (kvq_format.h's table); 0 where the
# layout refuses the pair at D
cat > "$tmp/bytes.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvq_format.h"
static int fmt_of(const char *name)
{
#define X(ID, NAME, ...) if (!strcmp(name, NAME)) return KVQ_FMT_##ID;
	KVQ_FORMATS(X)
#undef X
	return -1;
}
int main(int argc, char **argv)
{
	const unsigned D = argc == 4 ? (unsigned)atoi(argv[3]) : 0, B = 32;
	unsigned long n = 0;
	for (int v = 0; v < 2 && D; v++) {
		const int f = fmt_of(argv[1 + v]);
		if (f < 0)
			return 2;
		const unsigned g = kvq_fmt_group(f, v);
		const int kind = kvq_fmt_param_kind(f, v);
		if (g && D % g)
			n = 0, v = 2;
		else
			n += (unsigned long)B * D / kvq_fmt_subdim(f) * kvq_fmt_bits(f) / 8 +
			     kvq_param_count(kind, g, B, D) * kvq_param_entry_bytes(kind);
	}
	printf("%lu\n", n);
	return 0;
}
C
cc -O1 -I"$top/kernels" -o "$tmp/bytes" "$tmp/bytes.c" -lm

printf '%-18s %4s %5s %7s %7s %9s\n' pair D act instr bytes bytes/instr
for pair in "$@"; do
	k=$(echo "${pair%/*}" | tr a-z A-Z) v=$(echo "${pair#*/}" | tr a-z A-Z)
	for d in ${KVQ_ISA_D:-128 64}; do
		for act in ${KVQ_ISA_ACT:-f16 bf16}; do
			a=0
			[ "$act" = bf16 ] && a=1
			nb=$("$tmp/bytes" "${pair%/*}" "${pair#*/}" "$d") || { echo "decode-isa: unknown format in $pair" >&2; exit 2; }
			[ "$nb" -gt 0 ] || { printf '%-18s %4s %5s  (the layout refuses it at D = %s)\n' "$pair" "$d" "$act" "$d"; continue; }
			"$nvcc" -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -DISA_K=KVQ_FMT_$k -DISA_V=KVQ_FMT_$v \
				-DISA_D=$d -DISA_ACT=$a -I"$top/kernels" -I"$top/client" \
				-I"$top/proto" -I"$top" -I"$tmp" -cubin -o "$tmp/k.cubin" "$top/bench/decode_isa.cu"
			"$objdump" -sass "$tmp/k.cubin" > "$tmp/k.sass"
			python3 - "$tmp/k.sass" "${pair%/*}" "${pair#*/}" "$d" "$act" "$nb" "$ops" <<'PY'
import collections, re, sys
sass, kf, vf, D, act, nb, ops = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7]
ins = [(int(m.group(1), 16), m.group(2).strip())
       for m in re.finditer(r'/\*([0-9a-f]{4,})\*/\s+([^;]*);', open(sass).read())]
# loops: conditional branches back (an unconditional one returns from the
# divergent-shuffle fallback); the chunk loop is the outermost with MMAs
loops = sorted({(int(t.group(1), 16), a) for a, b in ins if b.startswith('@') and 'BRA' in b
                for t in [re.search(r'0x([0-9a-f]+)', b)] if t and int(t.group(1), 16) < a},
               key=lambda r: r[0] - r[1])
body = next(bd for lo, hi in loops for bd in [[b for a, b in ins if lo <= a <= hi]]
            if any('HMMA' in b for b in bd))
# the compiler may unroll the loop: its chunks are its MMAs over one chunk's
# (QKᵀ: 2 m-tiles of D/16 k-steps, twice for KIVI K's two parts of q; PV:
# D/16 m-tiles of 2 k-steps)
mma = (2 * (D // 16) * (2 if kf.startswith('kivi') else 1) + 2 * (D // 16))
chunks = sum('HMMA' in b for b in body) / mma
n = len(body) / chunks
print('%-18s %4d %5s %7.0f %7d %9.2f' % (kf + '/' + vf, D, act, n, nb, nb / n))
if ops:
    c = collections.Counter((b.split()[1] if b.startswith('@') else b.split()[0]).split('.')[0] for b in body)
    print('    ' + ' '.join('%s %d' % kv for kv in c.most_common()))
PY
		done
	done
done
