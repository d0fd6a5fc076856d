#!/usr/bin/env bash
# Boots Debian 12's own cloud kernel under qemu (software emulation) with a
# pure cgroup v2 hierarchy and runs the privileged real-kernel tests there:
# tier limits, the eBPF device filter, cgroup.kill, the run-queue latency
# probe and the QoS loop. Exits non-zero when a
# test fails, the result line is missing, or the VM runs past the timeout.
#
# Needs root-free qemu and: apt-get install -y qemu-system-x86 busybox-static cpio
# Environment:
#   FUSIOND_VM_PKGS     Go packages whose tests run in the VM (default ./cgroups/)
#   FUSIOND_VM_RUN      -test.run pattern (default ^TestKernel)
#   FUSIOND_VM_ARGS     extra test flags, e.g. "-test.bench=CPUIsolation -test.benchtime=10x"
#   FUSIOND_VM_TIMEOUT  seconds before the VM is declared hung (default 900)
#   FUSIOND_VM_TEST_TIMEOUT  -test.timeout of each test binary, in seconds
#                       (default: the VM timeout less 60 s, shared out
#                       between the binaries, so that all of them fit)
#   FUSIOND_VM_BUILD    cache directory (default _build/vm in the repository)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${FUSIOND_VM_BUILD:-$repo/_build/vm}
pkgs=${FUSIOND_VM_PKGS:-./cgroups/}
run=${FUSIOND_VM_RUN:-^TestKernel}
args=${FUSIOND_VM_ARGS:-}
timeout_s=${FUSIOND_VM_TIMEOUT:-900}
go=${GO:-go}

for tool in qemu-system-x86_64 cpio busybox apt-get dpkg-deb; do
	command -v "$tool" >/dev/null || { echo "test-vm: $tool missing (apt-get install -y qemu-system-x86 busybox-static cpio)" >&2; exit 2; }
done
mkdir -p "$build"

# 1. The kernel: Debian's current cloud kernel package, downloaded once.
if [ ! -s "$build/vmlinuz" ]; then
	pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
	[ -n "$pkg" ] || { echo "test-vm: cannot resolve linux-image-cloud-amd64 (apt-get update?)" >&2; exit 2; }
	(cd "$build" && rm -f ./*.deb && apt-get download "$pkg")
	rm -rf "$build/kernel" && dpkg-deb -x "$build"/"$pkg"_*.deb "$build/kernel"
	cp "$build"/kernel/boot/vmlinuz-* "$build/vmlinuz"
	rm -rf "$build/kernel" "$build"/*.deb
fi

# 2. The initramfs: busybox, static test binaries and an /init that runs them.
root="$build/root"
rm -rf "$root" && mkdir -p "$root"/{bin,tests,proc,sys,dev,tmp}
cp "$(command -v busybox)" "$root/bin/busybox"
if ldd "$root/bin/busybox" >/dev/null 2>&1; then echo "test-vm: busybox must be static (apt-get install -y busybox-static)" >&2; exit 2; fi
n=0
for p in $pkgs; do
	n=$((n + 1))
	(cd "$repo" && CGO_ENABLED=0 "$go" test -c -o "$root/tests/$n-$(basename "$p").test" "$p")
done
# Every binary must be able to time out (and print its stacks) before the
# VM as a whole does.
per_test=${FUSIOND_VM_TEST_TIMEOUT:-$(((timeout_s - 60) / (n > 0 ? n : 1)))}
[ "$per_test" -ge 30 ] || per_test=30
# Values pasted into /init are quoted for its shell; the extra flags are
# split into words first.
read -ra argv <<<"$args"
run_q=$(printf %q "$run")
args_q=""
[ ${#argv[@]} -eq 0 ] || args_q=$(printf '%q ' "${argv[@]}")
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "test-vm: kernel \$(uname -r), controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)"
status=0
for t in /tests/*.test; do
	echo "=== \$t"
	\$t -test.v -test.count=1 -test.timeout=${per_test}s -test.run $run_q $args_q || status=1
done
if [ \$status = 0 ]; then echo "FUSIOND-VM-RESULT: PASS"; else echo "FUSIOND-VM-RESULT: FAIL"; fi
sync
echo o > /proc/sysrq-trigger
sleep 10
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$build/initrd.gz"

# 3. Boot. KVM guests hang on this kind of host: software emulation only.
log="$build/console.log"
echo "test-vm: booting $(basename "$(readlink -f "$build/vmlinuz")") with $pkgs (log $log)"
set +e
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 -accel tcg -m 1024 -smp 2 -nographic -no-reboot \
	-kernel "$build/vmlinuz" -initrd "$build/initrd.gz" \
	-append "console=ttyS0 panic=-1 quiet" </dev/null 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
	echo "test-vm: FAIL: VM did not finish within ${timeout_s}s" >&2
	exit 1
fi
if grep -q '^FUSIOND-VM-RESULT: PASS' "$log"; then
	echo "test-vm: PASS"
	exit 0
fi
echo "test-vm: FAIL (qemu exit $rc; see $log)" >&2
exit 1
