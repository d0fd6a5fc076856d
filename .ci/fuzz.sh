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
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fuzz() { $GO test -run '^$' -fuzz "^${2}\$" -fuzztime "$FUZZTIME" -parallel "${FUZZPARALLEL:-1}" "$1" 2>&1 | tee "$out"; }
n=0
while IFS=: read -r file name; do
  pkg=./$(dirname "$file")
  echo "==> $pkg $name ($FUZZTIME)"
  if ! fuzz "$pkg" "$name"; then
    # Go's fuzzing engine sometimes reports "context deadline exceeded"
    # when -fuzztime ends while its worker is busy, with no failing input
    # found: run that target once more. A real failure writes its input
    # under testdata/fuzz and fails again.
    if grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written to' "$out"; then
      echo "==> $pkg $name: the engine timed out without a failing input; running it once more"
      fuzz "$pkg" "$name"
    else
      exit 1
    fi
  fi
  n=$((n + 1))
done < <(git ls-files '*_test.go' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' \
  | sed -E 's/^([^:]+):func (Fuzz[A-Za-z0-9_]*)\(.*/\1:\2/' | sort -u)
echo "==> $n fuzz targets passed ($FUZZTIME each)"
