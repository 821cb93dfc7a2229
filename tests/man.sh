#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# TAP: the man pages lint clean (mandoc -T lint), each long option that
# kvqd --help and kvqctl --help print is in its man page and each option a
# man page documents is one the program prints.  The kvqd.conf keys are
# checked against kvqd.conf(5) by tests/unit/test_conf_schema.c, from the
# schema's rows.
set -u
. "${top_srcdir:?}/tests/tap.sh"
: "${top_srcdir:?}" "${top_builddir:?}"
man=$top_srcdir/man

for page in kvqd.8 kvqctl.1 kvqd.conf.5 libkvq.3 kvq-codebook.5; do
	if command -v mandoc >/dev/null 2>&1; then
		out=$(mandoc -T lint -W warning "$man/$page" 2>&1)
		st=$?
	else
		# groff reports what it cannot format as warnings on stderr
		out=$(groff -man -ww -z "$man/$page" 2>&1)
		st=$?
		[ -z "$out" ] || st=1
	fi
	t $st "lint $page${out:+: $(echo "$out" | head -n 3 | tr '\n' ' ')}"
done

# "--kv-heads" is written "\-\-kv\-heads" in a man page
escape() { printf '%s' "$1" | sed 's/-/\\-/g'; }

for pair in daemon/kvqd:kvqd.8 kvqctl/kvqctl:kvqctl.1; do
	bin=$top_builddir/${pair%%:*}
	page=$man/${pair#*:}
	help=$("$bin" --help)
	opts=$(printf '%s\n' "$help" | grep -o -- '--[a-z][a-z-]*' | sort -u)
	[ -n "$opts" ]
	t $? "${pair%%:*} --help lists options"
	for o in $opts; do
		grep -qF -- "$(escape "$o")" "$page"
		t $? "${pair#*:} documents $o"
	done
	for o in $(grep -o -- '\\-\\-[a-z][a-z]*\(\\-[a-z][a-z]*\)*' "$page" | sed 's/\\-/-/g' | sort -u); do
		printf '%s\n' "$help" | grep -q -- "$o\\b"
		t $? "${pair%%:*} --help has $o, which ${pair#*:} documents"
	done
done

# each command's own --help (taken from the commands kvqctl --help lists):
# its usage, and every option it prints is in kvqctl(1)
ctl=$top_builddir/kvqctl/kvqctl
cmds=$("$ctl" --help | sed -n '/^Commands/,$ s/^  \([a-z][a-z]*\( [a-z][a-z]*\)*\).*$/\1/p')
[ -n "$cmds" ]
t $? "kvqctl --help lists commands: $(echo $cmds | tr '\n' ' ')"
while read -r c; do
	# shellcheck disable=SC2086
	help=$("$ctl" $c --help)
	t $? "kvqctl $c --help exits 0"
	printf '%s\n' "$help" | grep -q "^Usage: kvqctl \[OPTION\]\.\.\. $c"
	t $? "kvqctl $c --help prints its usage"
	grep -q "^\.B $c\( \|\$\)" "$man/kvqctl.1"
	t $? "kvqctl.1 documents the command $c"
	for o in $(printf '%s\n' "$help" | grep -o -- '--[a-z][a-z-]*' | sort -u); do
		grep -qF -- "$(escape "$o")" "$man/kvqctl.1"
		t $? "kvqctl.1 documents $o of $c"
	done
done <<EOF
$cmds
EOF

# kvqd.conf(5) and the example config against the configuration schema's
# rows, both ways: tests/unit/test_conf_schema.c

finish
