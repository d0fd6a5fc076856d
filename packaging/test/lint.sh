#!/usr/bin/env bash
# Lints the built packages: lintian on the .deb and rpmlint on the .rpm must
# report no errors and no warnings beyond those overridden, each with its
# reason, in packaging/lint/.
#
#   packaging/test/lint.sh dist/fusiond_*.deb dist/fusiond-*.rpm
#
# Needs: apt-get install -y lintian rpmlint
set -euo pipefail
die() { echo "lint: FAIL: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 PACKAGE.deb|PACKAGE.rpm..."
lintdir=$(dirname "$(realpath "$0")")/../lint
for pkg in "$@"; do
	case "$pkg" in
	*.deb)
		command -v lintian >/dev/null || die "lintian missing: apt-get install -y lintian"
		# The overrides ship inside the package
		# (/usr/share/lintian/overrides/fusiond), where lintian reads them.
		rc=0
		out=$(lintian --pedantic --fail-on error,warning "$pkg" 2>&1) || rc=$?
		echo "$out" | grep -v 'running with root privileges' || true
		[ $rc = 0 ] || die "lintian on $pkg (exit $rc)"
		echo "lint: lintian $pkg: clean"
		;;
	*.rpm)
		command -v rpmlint >/dev/null || die "rpmlint missing: apt-get install -y rpmlint"
		out=$(rpmlint --strict -c "$lintdir/rpmlint.toml" -r "$lintdir/fusiond.rpmlintrc" "$pkg" 2>&1) || {
			echo "$out"
			die "rpmlint on $pkg"
		}
		echo "$out" | tail -1
		grep -q " 0 errors, 0 warnings" <<<"$out" || die "rpmlint on $pkg: $(echo "$out" | tail -1)"
		echo "lint: rpmlint $pkg: clean"
		;;
	*) die "not a .deb or .rpm: $pkg" ;;
	esac
done
