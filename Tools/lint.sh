#!/usr/bin/env bash
# swift-format's lint with the repository's .swift-format, strict: any finding fails (Tools/test.sh
# runs it). `bash Tools/lint.sh --fix` rewrites what the formatter can fix by itself first.
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(Package.swift Sources Tests Tools)
if [ "${1:-}" = "--fix" ]; then
  swift format format --in-place --parallel --recursive "${paths[@]}"
fi
findings=$(mktemp)
trap 'rm -f "$findings"' EXIT
status=0
swift format lint --strict --parallel --recursive "${paths[@]}" >"$findings" 2>&1 || status=$?
count=$(grep -c ": error: \|: warning: " "$findings" || true)
if [ "$status" -ne 0 ] || [ "$count" -ne 0 ]; then
  head -n 60 "$findings" >&2
  echo "ferry: swift-format lint: $count findings (bash Tools/lint.sh --fix fixes most)" >&2
  exit 1
fi
echo "ferry: swift-format lint: no findings in $(git ls-files '*.swift' | wc -l) Swift files"
