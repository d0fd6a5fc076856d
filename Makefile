GO ?= go
export CGO_ENABLED ?= 1

.PHONY: all build test vet fmt
all: build

build:
	$(GO) build -o bin/ ./cmd/...

test: vet
	$(GO) test -count=1 ./...

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt needed'; exit 1; }
