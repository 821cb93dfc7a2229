# SPDX-License-Identifier: Apache-2.0
# TAP for the shell tests (sourced): t STATUS DESCRIPTION, skip DESCRIPTION
# REASON, and finish, which prints the plan and exits non-zero on a failure.
n=0
failed=0
t() {
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi
}
skip() {
	n=$((n + 1))
	echo "ok $n - $1 # SKIP $2"
}
finish() {
	echo "1..$n"
	exit $failed
}
