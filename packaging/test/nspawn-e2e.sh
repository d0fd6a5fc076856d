#!/usr/bin/env bash
# Boots a Debian 12 (systemd as PID 1) with systemd-nspawn, installs the
# fusiond .deb with dpkg inside it and checks the package end to end:
# socket activation, jobs by root and by a fusiond group member, restart
# and crash recovery, watchdog, journald fields, purge. Runs as root.
#
#   packaging/test/nspawn-e2e.sh dist/fusiond_*.deb
#
# The debootstrap'd tree is cached in $FUSIOND_NSPAWN_CACHE (default
# _build/nspawn); each run boots a fresh copy of it. Exits 0 when every
# check passed, else prints each failed check and exits 1.
# Needs: debootstrap systemd-container (apt), network to a Debian mirror
# the first time ($FUSIOND_DEBIAN_MIRROR, default deb.debian.org).
set -euo pipefail

die() { echo "nspawn-e2e: FAIL: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 PACKAGE.deb"
deb=$(realpath "$1")
[ -f "$deb" ] || die "no such package: $1"
[ "$(id -u)" = 0 ] || die "must run as root"
for tool in debootstrap systemd-nspawn; do
	command -v "$tool" >/dev/null || die "$tool missing: apt-get install -y debootstrap systemd-container"
done

here=$(dirname "$(realpath "$0")")
cache=${FUSIOND_NSPAWN_CACHE:-_build/nspawn}
mirror=${FUSIOND_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=$cache/debian12
mkdir -p "$cache"
if [ ! -e "$base/.fusiond-rootfs-ok" ]; then
	echo "nspawn-e2e: debootstrapping Debian 12 minbase into $base (about a minute)"
	rm -rf "$base" "$base.tmp"
	debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$base.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
		die "debootstrap failed, see $cache/debootstrap.log"
	mv "$base.tmp" "$base"
	touch "$base/.fusiond-rootfs-ok"
fi

root=$cache/run
rm -rf "$root"
cp -a "$base" "$root"
install -m 0644 "$deb" "$root/root/fusiond.deb"
install -m 0755 "$here/inside.sh" "$root/root/inside.sh"
# The checks run as a oneshot unit once the container has booted, then
# power it off whatever the outcome.
cat >"$root/etc/systemd/system/fusiond-e2e.service" <<'UNIT'
[Unit]
Description=fusiond package end-to-end checks
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
ExecStart=/root/inside.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=480
[Install]
WantedBy=multi-user.target
UNIT
ln -s /etc/systemd/system/fusiond-e2e.service "$root/etc/systemd/system/multi-user.target.wants/fusiond-e2e.service"
echo fusiond-e2e >"$root/etc/hostname"

echo "nspawn-e2e: booting $root"
rc=0
timeout -k 30 600 systemd-nspawn -D "$root" --register=no --keep-unit -b --console=pipe \
	>"$cache/console.log" 2>&1 </dev/null || rc=$?
# The checks' own lines, from the container's journal.
journalctl -D "$root/var/log/journal" --no-pager -o cat -u fusiond-e2e.service 2>/dev/null |
	grep -a -E '^(ok|FAIL|info)' || true
result=$root/root/e2e-result
if [ ! -f "$result" ]; then
	tail -40 "$cache/console.log" >&2
	die "no result from inside the container (nspawn exit $rc; console in $cache/console.log)"
fi
if [ "$(head -1 "$result")" != PASS ]; then
	echo "nspawn-e2e: failed checks:" >&2
	sed 's/^/  /' "$result" >&2
	die "see $cache/console.log; the container tree is kept in $root"
fi
rm -rf "$root"
echo "nspawn-e2e: PASS"
