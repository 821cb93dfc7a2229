#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# TAP: "make install" into a scratch DESTDIR installs what the package
# promises, the installed systemd units pass systemd-analyze verify (their
# Documentation= man pages found among the installed ones), a program outside
# the tree builds against the installed libkvq through pkg-config and runs,
# and "make uninstall" removes it all.
set -u
. "${top_srcdir:?}/tests/tap.sh"

: "${top_builddir:?}" "${kvq_sbindir:?}"
dest=$(mktemp -d /tmp/kvqd-install.XXXXXX)
trap 'rm -rf "$dest"' EXIT
# a make of its own: the outer make's jobserver is not ours to use
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${MAKE:-make} -s -C "$top_builddir" "$@"; }

mk install DESTDIR="$dest" >"$dest.log" 2>&1
st=$?
[ $st -eq 0 ] || sed 's/^/# /' "$dest.log"
t $st "make install DESTDIR=$dest"
rm -f "$dest.log"

for f in "$kvq_sbindir/kvqd" "$kvq_bindir/kvqctl" "$kvq_libdir/libkvq.so" "$kvq_includedir/kvq.h" \
	"$kvq_includedir/kvq_wire.h" "$kvq_pkgconfigdir/kvq.pc" "$kvq_mandir/man8/kvqd.8" "$kvq_mandir/man1/kvqctl.1" \
	"$kvq_mandir/man5/kvqd.conf.5" "$kvq_mandir/man3/libkvq.3" "$kvq_mandir/man5/kvq-codebook.5" "$kvq_docdir/kvqd.conf.example" \
	"$kvq_docdir/DESIGN.md" "$kvq_docdir/kvqd-grafana.json"; do
	[ -e "$dest$f" ]
	t $? "installed $f"
done
for d in unit:"$kvq_unitdir/kvqd.service" unit:"$kvq_unitdir/kvqd.socket" sysusers:"$kvq_sysusersdir/kvqd.conf" \
	tmpfiles:"$kvq_tmpfilesdir/kvqd.conf"; do
	case ${d#*:} in
	no/*) skip "installed ${d%%:*} file" "configured with --with-...dir=no" ;;
	*) [ -f "$dest${d#*:}" ]; t $? "installed ${d#*:}" ;;
	esac
done

LD_LIBRARY_PATH="$dest$kvq_libdir" "$dest$kvq_bindir/kvqctl" --version | grep -q "^kvqctl [0-9]"
t $? "the installed kvqctl runs (--version)"
"$dest$kvq_sbindir/kvqd" --version | grep -q "^kvqd [0-9]"
t $? "the installed kvqd runs (--version)"

# The unit as installed names the installed kvqd ...
unit="$dest$kvq_unitdir/kvqd.service"
if [ -f "$unit" ]; then
	grep -qx "ExecStart=$kvq_sbindir/kvqd .*" "$unit"
	t $? "kvqd.service runs $kvq_sbindir/kvqd"
	# ... which lives under DESTDIR here: verify a copy that points there
	if command -v systemd-analyze >/dev/null 2>&1; then
		mkdir -p "$dest/verify"
		sed "s|^ExecStart=$kvq_sbindir/|ExecStart=$dest$kvq_sbindir/|" "$unit" >"$dest/verify/kvqd.service"
		cp "$dest$kvq_unitdir/kvqd.socket" "$dest/verify/"
		# any message is a finding: unknown keys only warn
		out=$(MANPATH="$dest$kvq_mandir" SYSTEMD_LOG_LEVEL=notice \
			systemd-analyze verify "$dest/verify/kvqd.service" "$dest/verify/kvqd.socket" 2>&1)
		st=$?
		[ $st -eq 0 ] && [ -z "$out" ]
		t $? "systemd-analyze verify kvqd.service kvqd.socket (exit $st)${out:+: $(echo "$out" | tr '\n' ' ')}"
	else
		skip "systemd-analyze verify" "systemd-analyze not installed (Debian: systemd)"
	fi
	for key in Type=notify WatchdogSec= "ExecReload=/bin/sh -c 'kill -HUP \$\$MAINPID'" RuntimeDirectoryPreserve=yes \
		"Documentation=man:kvqd(8)" ProtectSystem=strict ProtectHome=yes DevicePolicy=closed \
		"DeviceAllow=char-nvidia\* rw" NoNewPrivileges=yes; do
		grep -q "^$key" "$unit"
		t $? "kvqd.service: $key"
	done
	! grep -q "^PrivateDevices" "$unit"
	t $? "kvqd.service: no PrivateDevices (it would hide the GPU)"
	# ExecReload run as systemd runs it ("$$" a literal "$", MAINPID in the
	# environment) reaches the installed kvqd as SIGHUP, which it handles
	reload=$(sed -n 's/^ExecReload=//p' "$unit" | sed 's/\$\$/$/g')
	"$dest$kvq_sbindir/kvqd" --foreground --backend host --socket "$dest/reload.sock" --log-level notice \
		2>"$dest/reload.log" &
	kvqd_pid=$!
	# "listening" is logged once the signal handlers are in place (as
	# READY=1, before which systemd sends no reload)
	for _ in $(seq 1000); do
		grep -q listening "$dest/reload.log" && break
		sleep 0.01
	done
	eval "set -- $reload"
	MAINPID=$kvqd_pid "$@"
	st=$?
	for _ in $(seq 1000); do
		grep -q SIGHUP "$dest/reload.log" && break
		sleep 0.01
	done
	grep -q SIGHUP "$dest/reload.log" && kill -0 "$kvqd_pid" 2>/dev/null
	t $? "kvqd.service's ExecReload ($reload: exit $st) sends kvqd SIGHUP: $(grep -m 1 SIGHUP "$dest/reload.log")"
	kill -TERM "$kvqd_pid" 2>/dev/null
	wait "$kvqd_pid" 2>/dev/null
	rm -f "$dest/reload.log"
else
	skip "systemd-analyze verify" "units not installed"
fi

sysusers="$dest$kvq_sysusersdir/kvqd.conf"
if [ -f "$sysusers" ] && command -v systemd-sysusers >/dev/null 2>&1; then
	out=$(systemd-sysusers --dry-run "$sysusers" 2>&1)
	t $? "systemd-sysusers --dry-run accepts sysusers.d/kvqd.conf"
	for g in kvq kvq-admin; do
		echo "$out" | grep -q "group '$g'" || getent group "$g" >/dev/null
		t $? "sysusers.d/kvqd.conf provides the group $g"
	done
else
	skip "systemd-sysusers --dry-run" "no sysusers.d file or no systemd-sysusers"
fi

# A program outside the tree, built only from what was installed.
cat >"$dest/use.c" <<'EOC'
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <kvq.h>

int main(void)
{
	kvq_client *c = NULL;
	int r = kvq_client_connect("/nonexistent/kvqd.sock", "use", &c);

	if (r == -ENOENT && !c && strlen(kvq_version())) {
		printf("version %s; connecting to a missing socket gives ENOENT, as expected\n", kvq_version());
		return 0;
	}
	printf("version '%s'; connecting to a missing socket gave '%s', not ENOENT\n", kvq_version(),
	       kvq_strerror(r));
	return 1;
}
EOC
flags=$(PKG_CONFIG_PATH="$dest$kvq_pkgconfigdir" PKG_CONFIG_SYSROOT_DIR="$dest" pkg-config --cflags --libs kvq)
t $? "pkg-config --cflags --libs kvq: $flags"
# shellcheck disable=SC2086
${CC:-cc} -o "$dest/use" "$dest/use.c" $flags 2>&1
t $? "a program outside the tree compiles and links against the installed libkvq"
out=$(LD_LIBRARY_PATH="$dest$kvq_libdir" "$dest/use" 2>&1)
t $? "it runs with the installed library: $out"

mk uninstall DESTDIR="$dest" >/dev/null 2>&1
left=$(find "$dest" -type f ! -path "$dest/verify/*" ! -name 'use*' | head -n 5)
[ -z "$left" ]
t $? "make uninstall removes every installed file${left:+: left $left}"

finish
