# fusiond — build, run, test.
#   make run    the demo: daemon on the development config + a mixed workload
#   make test   every test that runs in minutes (needs root; installs its Debian packages)
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DATE    ?= $(shell date -u $${SOURCE_DATE_EPOCH:+-d @$$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
PKG     := github.com/fusiond/fusiond
LDFLAGS := -X $(PKG)/daemon/buildinfo.version=$(VERSION) -X $(PKG)/daemon/buildinfo.commit=$(COMMIT) -X $(PKG)/daemon/buildinfo.date=$(DATE)
PKGBIN  := _build/pkg/bin
export CGO_ENABLED ?= 1
export CGO_CFLAGS ?= -O2 -Wno-deprecated-declarations

# Debian packages the tests need (installed by `make deps`): device names
# and the hwloc oracle for topology, a static busybox for container rootfs,
# qemu for the cgroup v2 VM, systemd-analyze/dpkg/rpm for the unit and
# package tests, promtool (prometheus) for the metrics, alert-rule and
# dashboard checks, tmux for the `fusionctl top` test, iproute2 for the peers' network
# namespaces; then the linters
# and the booted-Debian test's tools.
TEST_PKGS := pci.ids hwloc busybox-static qemu-system-x86 cpio systemd rpm prometheus tmux bpftrace iproute2
# The eBPF toolchain `make ebpf-check` regenerates the committed probes with.
EBPF_PKGS := clang llvm libbpf-dev bpftool
PKG_TEST_PKGS := lintian rpmlint systemd-container debootstrap

.PHONY: all build run test test-vm test-kubelet vet deps ebpf-check bench start-time gpu-check fuzz fuzz-long clean pkgbin deb rpm package-lint e2e-nspawn chaos plots sim-validate
all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

run: build
	./examples/demo.sh

# The benchmark pictures in docs/img/ (embedded in docs/benchmarks.md),
# from the openb trace fusionctl embeds (cmd/fusionctl/internal/sim/openb):
# the protocol's allocation and failed-request curves (every policy, seeds
# 42..51), and the time-ordered replay's utilisation over time and wait
# CDF. About 5-10 minutes on 2 cores.
PLOT_POLICIES ?= random,dotprod,gpuclustering,gpupacking,bestfit,fgd,fusiond
plots:
	mkdir -p docs/img
	$(GO) run ./cmd/fusionctl simulate --trace default \
	  --policy $(PLOT_POLICIES) --seeds 42-51 --target 130 --plot docs/img/openb-default-alloc.svg --plot docs/img/openb-default-alloc.png
	$(GO) run ./cmd/fusionctl simulate --trace default \
	  --policy fusiond,spread,fgd --timed --load 70 --plot docs/img/openb-default-timed.svg --plot docs/img/openb-default-timed.png

# The ±1-point validation of the six paper baselines on all 17 openb
# traces (mean of seeds 42..51) against FGD_expected_allocation.txt, read
# from cmd/fusionctl/internal/sim/openb (FUSIOND_OPENB_DIR=DIR reads the
# CSV files, plain or .zst, from DIR instead). About 5 minutes on 2 cores;
# .ci/run runs it.
sim-validate:
	FUSIOND_SIM_FULL=1 $(GO) test -count=1 -timeout 45m -v -run '^(TestOpenBValidationFull|TestBoundHoldsFull)$$' ./cmd/fusionctl/internal/sim/

deps:
	./.ci/deps.sh $(TEST_PKGS)

test: deps vet
	$(GO) test -count=1 -timeout 9m ./...

vet:
	$(GO) vet ./...
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi

# cgroup v2 for real: boots Debian 12's kernel under qemu and runs the
# privileged cgroup tests there, the eBPF probe's and the QoS loop's (about 1-2 minutes).
# Two boots: the eBPF probe's and the QoS loop's tests attach and detach
# tracepoint programs many times, and under multi-threaded emulation (qemu's
# default) the guest kernel wedged in 4 of 6 boots of these packages on
# this 2-core host (soft lockups, then no output); with both vCPUs on one
# host thread it did not in 5 of 5. The other packages keep the default:
# the reclaim loop's timed test needs its speed.
test-vm: deps
	FUSIOND_VM_PKGS="./cgroups/ ./daemon/internal/executor/ ./daemon/internal/reclaim/" FUSIOND_VM_RUN='^TestKernel' ./.ci/vm/run.sh
	FUSIOND_VM_ACCEL=tcg,thread=single FUSIOND_VM_PKGS="./ebpf/ ./daemon/internal/qos/" FUSIOND_VM_RUN='^TestKernel' ./.ci/vm/run.sh

# Kubernetes (docs/kubernetes.md): fusiond as the device plugin of a real
# kubelet v1.37.2 (standalone, static pods) on Debian's containerd and runc,
# on the simulated dgxh200 host. .ci/kubelet/build.sh installs those
# packages and builds kubelet (in a module of its own: the project's go.mod
# does not depend on k8s.io/kubernetes), a pause program and the pods' two
# images into a cache outside the clone (FUSIOND_KUBELET_CACHE, default
# /var/cache/fusiond-ci/kubelet): about 5 minutes on a cold Go cache on 2
# cores, nothing when cached. The tests (about a minute) exist only with
# -tags kubelet: nothing skips.
test-kubelet:
	$(GO) vet -tags kubelet ./daemon/e2e/
	dir=$$(./.ci/kubelet/build.sh) && \
	FUSIOND_KUBELET_DIR="$$dir" $(GO) test -tags kubelet -count=1 -timeout 15m -v -run '^TestKubelet' ./daemon/e2e/

# The BPF object and its Go bindings are committed (a build needs no clang):
# regenerate them with clang and fail if anything under ebpf/ changed.
ebpf-check:
	./.ci/deps.sh $(EBPF_PKGS)
	$(GO) generate ./ebpf/
	git diff --exit-code -- ebpf/
	@untracked=$$(git ls-files --others --exclude-standard -- ebpf/); if [ -n "$$untracked" ]; then echo "ebpf-check: generated files not committed: $$untracked"; exit 1; fi

# Packages: stripped PIE binaries, then .deb and .rpm through nfpm.
pkgbin:
	$(GO) build -trimpath -buildmode=pie -ldflags "-s -w $(LDFLAGS)" -o $(PKGBIN)/ ./cmd/fusiond ./cmd/fusionctl

deb: pkgbin
	rm -f dist/fusiond_*.deb
	$(GO) run ./packaging/build -version "$(VERSION)" -bin $(PKGBIN) -out dist deb

rpm: pkgbin
	rm -f dist/fusiond-*.rpm
	$(GO) run ./packaging/build -version "$(VERSION)" -bin $(PKGBIN) -out dist rpm

# lintian and rpmlint, failing on errors and on warnings not overridden.
package-lint: deb rpm
	./.ci/deps.sh $(PKG_TEST_PKGS)
	packaging/test/lint.sh dist/fusiond_*.deb dist/fusiond-*.rpm

# Install the .deb into a debootstrapped Debian 12 and boot it with
# systemd-nspawn (the tree is cached in _build/nspawn; first run ~2 min).
e2e-nspawn: deb
	./.ci/deps.sh $(PKG_TEST_PKGS)
	packaging/test/nspawn-e2e.sh dist/fusiond_*.deb

# Chaos (needs root; docs/reliability.md): kill -9 of fusiond every few
# seconds under 8 submitting clients for CHAOS_DURATION (default 60s; e.g.
# CHAOS_DURATION=120s), then a killed job monitor, a full and a read-only
# state filesystem, a simulated GPU lost under a running job. The tests
# exist only with -tags chaos: nothing skips.
CHAOS_DURATION ?= 60s
chaos:
	CHAOS_DURATION=$(CHAOS_DURATION) $(GO) test -tags chaos -count=1 -timeout 8m -v -run '^TestChaos' ./daemon/e2e/

# Benchmarks behind the figures in README.md and docs/.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./daemon/
	$(GO) test -run '^$$' -bench . ./devices/nvidia/ ./devices/fpga/bitstream/
	$(GO) test -run '^$$' -bench ProbeCost -benchtime 3x ./ebpf/
	$(GO) test -run '^$$' -bench Interference -benchtime 1x ./daemon/internal/qos/

# Start-up time of `fusiond --simulate dgxh200` (make run's daemon): first
# start on an empty state directory and warm start, to the first answer of
# `fusionctl status`, medians of START_RUNS (default 5).
START_RUNS ?= 5
start-time: build
	./.ci/start-time.sh $(START_RUNS)

# Read-only check of a host with a real NVIDIA GPU; exits 1 cleanly without one.
gpu-check:
	$(GO) run ./cmd/fusiond-gpucheck

# Coverage-guided fuzzing of every fuzz target in the module (API bodies,
# job specs, spec files, the config, mig-parted and sharing configs,
# bitstream headers, sysfs parsers, ...), one after the other: `make fuzz`
# 10 s each (FUZZTIME=30s to change), `make fuzz-long` 10 minutes each.
FUZZTIME ?= 10s
fuzz:
	GO=$(GO) ./.ci/fuzz.sh $(FUZZTIME)

fuzz-long:
	GO=$(GO) ./.ci/fuzz.sh 10m

clean:
	rm -rf bin _run _build dist
