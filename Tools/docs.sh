#!/usr/bin/env bash
# Builds the DocC documentation of Ferry's libraries (Ferry, FerryLog, FerryTesting, LMDB, and the
# CLI's library FerryTools) with the swift-docc-plugin and fails on any DocC warning: a link that
# does not resolve, an ambiguous symbol link, a topic that names nothing. Tools/test.sh runs it
# after its build, so CI does too.
#
#   bash Tools/docs.sh                 # archives in .build/docs/<Target>.doccarchive
#   bash Tools/docs.sh --out DIR       # elsewhere
#
# To read them in a browser while writing:
#   swift package --disable-sandbox preview-documentation --target Ferry
set -euo pipefail
cd "$(dirname "$0")/.."

out=.build/docs
if [ "${1:-}" = "--out" ] && [ -n "${2:-}" ]; then out=$2; fi
targets=(Ferry FerryLog FerryTesting LMDB FerryTools)

mkdir -p "$out"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
args=()
for target in "${targets[@]}"; do args+=(--target "$target"); done

echo "ferry: building the documentation (${targets[*]})..."
start=$(date +%s)
status=0
swift package --allow-writing-to-directory "$out" generate-documentation "${args[@]}" \
  --output-path "$out" >"$log" 2>&1 || status=$?
seconds=$(( $(date +%s) - start ))
if [ "$status" -ne 0 ]; then
  cat "$log" >&2
  echo "ferry: the documentation build failed" >&2
  exit 1
fi
# DocC's diagnostics start a line ("warning: ..." then the source lines they point at).
problems=$(grep -cE "^(warning|error): " "$log" || true)
if [ "$problems" -ne 0 ]; then
  grep -E -A6 "^(warning|error): " "$log" >&2
  echo "ferry: the documentation has $problems warnings" >&2
  exit 1
fi
echo "ferry: documentation built in ${seconds}s, warnings: 0 (${out}/{$(IFS=,; echo "${targets[*]}")}.doccarchive)"
