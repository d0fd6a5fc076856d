#!/usr/bin/env bash
# Runs every fuzz target of the module (every `func FuzzX(f *testing.F)` in
# a _test.go file), one after the other, each for FUZZTIME (default 10s).
# `make fuzz` runs them briefly, `make fuzz-long` for 10 minutes each.
# Seed corpora live in each package's testdata/fuzz/FuzzX/ and run in plain
# `go test` too. Exits non-zero on the first target that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${1:-${FUZZTIME:-10s}}
GO=${GO:-go}
n=0
while IFS=: read -r file name; do
  pkg=./$(dirname "$file")
  echo "==> $pkg $name ($FUZZTIME)"
  $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -parallel "${FUZZPARALLEL:-1}" "$pkg"
  n=$((n + 1))
done < <(git ls-files '*_test.go' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' \
  | sed -E 's/^([^:]+):func (Fuzz[A-Za-z0-9_]*)\(.*/\1:\2/' | sort -u)
echo "==> $n fuzz targets passed ($FUZZTIME each)"
