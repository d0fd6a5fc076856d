# fusiond — build, run, test.
#   make run    the demo: daemon on the development config + a mixed workload
#   make test   every test that runs in minutes (needs root; installs its Debian packages)
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
PKG     := github.com/fusiond/fusiond
LDFLAGS := -X $(PKG)/daemon/buildinfo.version=$(VERSION) -X $(PKG)/daemon/buildinfo.commit=$(COMMIT) -X $(PKG)/daemon/buildinfo.date=$(DATE)
export CGO_ENABLED ?= 1
export CGO_CFLAGS ?= -O2 -Wno-deprecated-declarations

# Debian packages the tests need (installed by `make deps`).
TEST_PKGS := pci.ids hwloc busybox-static qemu-system-x86 cpio

.PHONY: all build run test test-unit test-vm vet deps bench gpu-check fuzz clean
all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

run: build
	./examples/demo.sh

deps:
	./.ci/deps.sh $(TEST_PKGS)

test: deps vet
	$(GO) test -count=1 -timeout 9m ./...

vet:
	$(GO) vet ./...
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi

# cgroup v2 for real: boots Debian 12's kernel under qemu and runs the
# privileged cgroup tests there (about 1-2 minutes).
test-vm: deps
	./test/vm/run.sh

# Benchmarks behind the figures in README.md and docs/.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./daemon/
	$(GO) test -run '^$$' -bench . ./devices/nvidia/ ./devices/fpga/bitstream/

# Read-only check of a host with a real NVIDIA GPU; exits 1 cleanly without one.
gpu-check:
	$(GO) run ./cmd/fusiond-gpucheck

# Short coverage-guided fuzzing of every parser (30 s each).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeSpec$$' -fuzztime 30s ./daemon/api/

clean:
	rm -rf bin _run _build
