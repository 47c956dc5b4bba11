#!/usr/bin/env bash
# Runs every Go fuzz target in the module for FUZZTIME each (default 50000x: an execution count,
# which Go 1.26's fuzz coordinator cannot fail at a deadline; see the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-50000x}
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r file; do
  dir=$(dirname "$file")
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    echo "fuzz $dir $target ($fuzztime)"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "$dir"
  done
done
