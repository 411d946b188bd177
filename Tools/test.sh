#!/usr/bin/env bash
# Runs every Ferry test (the README's test command; CI runs it too).
# Installs what the build needs first, fails on any compiler warning in Ferry's own code, and
# checks that the golden vectors in Specs/vectors are exactly what Tools/make-vectors.py writes.
set -euo pipefail
cd "$(dirname "$0")/.."
source Tools/setup.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "ferry: building (with tests)..."
status=0
swift build --build-tests >"$log" 2>&1 || status=$?
grep -E "error:|warning:|Build complete|Fetching|Computed" "$log" | grep -v "^\s*|" | tail -n 40 || true
if [ "$status" -ne 0 ]; then
  cat "$log" >&2
  echo "ferry: the build failed" >&2
  exit 1
fi
own_warnings=$(grep -E "^$(pwd)/(Sources|Tests|Tools)/.*warning:" "$log" | sort -u || true)
if [ -n "$own_warnings" ]; then
  echo "$own_warnings" >&2
  echo "ferry: the build has warnings in Ferry's own code" >&2
  exit 1
fi

if command -v python3 >/dev/null 2>&1; then
  vectors=$(mktemp -d)
  python3 Tools/make-vectors.py --out "$vectors" >/dev/null
  if ! diff -r "$vectors" Specs/vectors >/dev/null; then
    diff -r "$vectors" Specs/vectors | head -20 >&2
    echo "ferry: Specs/vectors differ from what Tools/make-vectors.py writes" >&2
    exit 1
  fi
  rm -rf "$vectors"
  echo "ferry: golden vectors match their generator"
fi

# The README's install section, tried from a fresh package that links only `Ferry`.
bash Tools/try-install.sh

swift test --skip-build "$@"

# Power loss (not just process death): skipped, saying so, where root or loop devices are missing.
bash Tools/power-loss.sh
