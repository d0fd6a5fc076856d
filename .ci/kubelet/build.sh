#!/usr/bin/env bash
# Builds what the kubelet end-to-end tests (`go test -tags kubelet
# ./daemon/e2e/`) need, and prints the directory that holds it:
#
#   kubelet       a real kubelet, built from k8s.io/kubernetes (this module)
#   pause         the pod sandbox program (pause/main.go), static
#   pause.tar     OCI image archive fusiond.test/pause:1   (entrypoint /pause)
#   busybox.tar   OCI image archive fusiond.test/busybox:1 (busybox-static, cmd sh)
#   env           FUSIOND_KUBELET_DIR=<that directory>, for sourcing
#
# Usage:  FUSIOND_KUBELET_DIR=$(.ci/kubelet/build.sh)
#
# Only the directory goes to stdout; progress goes to stderr.
#
# No container registry is reachable from CI, so both images are made here
# from local files. The kubelet takes minutes to compile (about 8 on two
# cores with a cold Go cache), so everything lands in a cache directory
# outside the clone, keyed by a hash of what goes into it (this script, the
# module's go.mod/go.sum, the Go sources, the Go version and the busybox
# binary): a later run with the same key only prints the directory.
# FUSIOND_KUBELET_CACHE moves the cache (default /var/cache/fusiond-ci/kubelet).
#
# As root it also installs the Debian packages the tests run (containerd,
# runc, busybox-static) when they are missing; containerd is not started
# here, the test harness runs its own instance.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version=v1.37.2
cache_root="${FUSIOND_KUBELET_CACHE:-/var/cache/fusiond-ci/kubelet}"

log() { echo "kubelet build: $*" >&2; }

# The version stamped into the binary must be the one go.mod builds.
if ! grep -Eq "^[[:space:]]*k8s.io/kubernetes $k8s_version( |$)" "$here/go.mod"; then
	log "go.mod does not require k8s.io/kubernetes $k8s_version: update k8s_version here"
	exit 1
fi

# --- Debian packages --------------------------------------------------------
# dpkg-query first, so that a machine that has them never touches apt.
missing=()
for pkg in containerd runc busybox-static; do
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$pkg")
	fi
done
if ((${#missing[@]})); then
	if [ "$(id -u)" != 0 ]; then
		log "missing Debian packages ${missing[*]}: run as root to install them"
		exit 1
	fi
	log "installing ${missing[*]}"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
busybox=/bin/busybox
[ -x "$busybox" ] || { log "$busybox missing (package busybox-static)"; exit 1; }

# --- Cache key --------------------------------------------------------------
# The module never builds against a go.work of the clone around it, nor
# rewrites its go.mod/go.sum (-mod=readonly), whatever the caller's GOFLAGS.
export GOWORK=off GOFLAGS="-buildvcs=false -mod=readonly"
key="$(
	cd "$here"
	{
		cat build.sh go.mod go.sum pause/main.go mkimage/main.go
		go version
		sha256sum "$busybox"
	} | sha256sum | cut -c1-16
)"
out="$cache_root/$k8s_version-$key"
if [ -x "$out/kubelet" ] && [ -f "$out/env" ]; then
	log "cached in $out"
	echo "$out"
	exit 0
fi

# --- Build ------------------------------------------------------------------
# Into a scratch directory next to the final one, renamed at the end, so an
# interrupted build never leaves a half-filled cache entry; a lock keeps two
# concurrent runs from compiling the same thing twice.
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9
if [ -x "$out/kubelet" ] && [ -f "$out/env" ]; then # built while we waited
	log "cached in $out"
	echo "$out"
	exit 0
fi
work="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$here"

start=$SECONDS
# The kubelet reports the version it was built as (kubelet --version, the
# node status): without these it says v0.0.0-master.
pkg=k8s.io/component-base/version
minor="${k8s_version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w \
 -X $pkg.gitVersion=$k8s_version \
 -X $pkg.gitMajor=1 \
 -X $pkg.gitMinor=$minor \
 -X $pkg.gitTreeState=clean \
 -X $pkg.buildDate=1970-01-01T00:00:00Z"
log "building kubelet $k8s_version (minutes on a cold Go cache)"
go build -trimpath -ldflags "$ldflags" -o "$work/kubelet" k8s.io/kubernetes/cmd/kubelet
log "kubelet built in $((SECONDS - start)) s"

# The sandbox program and the image tool: standard library only.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause" ./pause
go build -trimpath -o "$work/mkimage" ./mkimage

# Pause image: just the static program.
mkdir -p "$work/rootfs-pause"
cp "$work/pause" "$work/rootfs-pause/pause"
"$work/mkimage" -rootfs "$work/rootfs-pause" -name fusiond.test/pause:1 \
	-out "$work/pause.tar" -entrypoint /pause

# Busybox image: the static busybox and relative links for the applets the
# tests' pods use, plus the directories a container runtime mounts over.
rb="$work/rootfs-busybox"
mkdir -p "$rb/bin" "$rb/etc" "$rb/tmp" "$rb/proc" "$rb/sys" "$rb/dev" "$rb/root"
chmod 1777 "$rb/tmp"
cp "$busybox" "$rb/bin/busybox"
for applet in sh ash env sleep cat ls echo printf grep sed head tail wc date \
	id hostname mkdir rm touch ps kill true false test stat readlink find \
	nproc uname wget tee xargs awk cut sort; do
	ln -s busybox "$rb/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rb/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rb/etc/group"
"$work/mkimage" -rootfs "$rb" -name fusiond.test/busybox:1 \
	-out "$work/busybox.tar" -env PATH=/bin -- sh

rm -rf "$work/rootfs-pause" "$rb" "$work/mkimage"
echo "FUSIOND_KUBELET_DIR=$out" >"$work/env"
chmod 755 "$work"
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
# Older entries (another kubelet version or key) would only fill the disk.
for old in "$cache_root"/v*-*; do
	[ "$old" = "$out" ] || rm -rf "$old"
done
log "built in $((SECONDS - start)) s: $out"
echo "$out"
