#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# TAP: the Python package as its README installs it -- a fresh venv, pip
# install of python/ (NumPy comes from the package index) -- then
# tests/python/test_host.py against a real kvqd on host pools, with the
# libkvq of this build ($KVQ_LIBRARY), and against the kvqd built with a
# throwaway figure row (tests/figrow/kvqd).  PYTHON picks the interpreter
# (default python3).  About 20 s, most of it pip.
set -u
: "${top_srcdir:?}" "${top_builddir:?}"
lib=$top_builddir/.libs/libkvq.so.3
if [ ! -e "$lib" ]; then
	echo "1..0 # SKIP no shared libkvq in this build (configured with --disable-shared)"
	exit 0
fi
work=$top_builddir/tests/python-work
rm -rf "$work"
mkdir -p "$work"
# pip builds in the source folder, which distcheck keeps read-only: a copy
cp -R "$top_srcdir/python" "$work/src" && chmod -R u+w "$work/src"
if ! { "${PYTHON:-python3}" -m venv "$work/venv" && "$work/venv/bin/pip" install --quiet "$work/src"; } \
	>"$work/install.log" 2>&1; then
	echo "not ok 1 - python3 -m venv and pip install ./python (python3-venv, and pip's index for NumPy)"
	tail -n 20 "$work/install.log" | sed 's/^/# /'
	echo "1..1"
	exit 1
fi
KVQ_LIBRARY=$(cd "$top_builddir/.libs" && pwd)/libkvq.so.3 KVQD=$top_builddir/daemon/kvqd \
	KVQCTL=$top_builddir/kvqctl/kvqctl CREF=$top_builddir/tests/python/cref KVQ_TEST_INSTALLED=1 \
	KVQD_FIGROW=$top_builddir/tests/figrow/kvqd FIGURE_ROW_H=$top_srcdir/tests/unit/figure_row.h \
	exec "$work/venv/bin/python" "$top_srcdir/tests/python/test_host.py"
