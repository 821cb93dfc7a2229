#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# TAP: the tree's includes go down its layers and never round a cycle.
# Layers, from the lowest: kernels/ (format arithmetic, layout, the CPU and
# CUDA kernels); proto/ (the wire); daemon/ and client/ (the daemon's
# internals and libkvq: neither includes the other); the programs (every
# other folder: kvqctl, bench, examples).  A file may include its own
# layer's files and lower ones.  Quoted includes are resolved as the build
# does: the including file's folder, then the build folder (whose generated
# headers, autoconf's config.h and proto's kvq.pb-c.h, are left out), then
# the tree's top and -I kernels, client, proto, daemon.  tests/ is not
# checked.
#   tests/check-includes.sh [TOP]   (default $top_srcdir)
set -u
. "${top_srcdir:-${1:-.}}/tests/tap.sh"
top=${1:-${top_srcdir:?}}
cd "$top" || exit 1

files=$(find . -path ./tests -prune -o -path './build*' -prune -o \
	\( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -type f -print | sed 's|^\./||' | sort)
[ -n "$files" ]
t $? "sources found under $top"

# edges "FROM TO", TO resolved to a file of the tree
edges=$(for f in $files; do
	dir=$(dirname "$f")
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r inc; do
		for cand in "$dir/$inc" GENERATED "$inc" "kernels/$inc" "client/$inc" "proto/$inc" "daemon/$inc"; do
			if [ "$cand" = GENERATED ]; then
				case $inc in config.h | kvq.pb-c.h) break ;; esac
				continue
			fi
			# a/b/../c -> a/c, ./a -> a
			p=$(printf '%s\n' "$cand" | sed -e 's|/\./|/|g' -e 's|^\./||' -e ':a' -e 's|[^/][^/]*/\.\./||' -e 'ta')
			if [ -f "$p" ]; then
				echo "$f $p"
				break
			fi
		done
	done
done)
[ -n "$edges" ]
t $? "includes found ($(printf '%s\n' "$edges" | wc -l) between files of the tree)"

bad=$(printf '%s\n' "$edges" | awk '
function layer(p) {
	if (p ~ /^kernels\//) return 0
	if (p ~ /^proto\//) return 1
	if (p ~ /^(daemon|client)\//) return 2
	return 3
}
{
	lf = layer($1); lt = layer($2)
	if (lt > lf || (lf == 2 && lt == 2 && substr($1, 1, 6) != substr($2, 1, 6)))
		print $1 " includes " $2
}')
[ -z "$bad" ]
t $? "no include goes up a layer or between daemon/ and client/${bad:+: $(echo "$bad" | tr '\n' ';')}"

# modules: a C file and its header are one (x.c and x.h, and x_int.h, the
# header its own files share), so two .c files that include each other's
# headers are a cycle too (a .cu and a .cuh of one name are a kernel's
# launcher and its templates: two files)
cycle=$(printf '%s\n' "$edges" | awk '
function module(p) { sub(/_int\.h$/, "", p); sub(/\.[ch]$/, "", p); return p }
{
	a = module($1); b = module($2)
	if (a != b) { n[a]++; to[a, n[a]] = b }
}
function visit(v, path,    i, r) {
	if (state[v] == 1) return path " " v
	if (state[v] == 2) return ""
	state[v] = 1
	for (i = 1; i <= n[v]; i++)
		if ((r = visit(to[v, i], path " " v)) != "")
			return r
	state[v] = 2
	return ""
}
END {
	for (v in n)
		if ((r = visit(v, "")) != "") { print r; exit }
}')
[ -z "$cycle" ]
t $? "no include cycle between modules (a .c with its .h)${cycle:+: $cycle}"

finish
