#!/usr/bin/env bash
# Runs the Ferry demo (the README's main command). Extra arguments go to `ferry demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source Tools/setup.sh
echo "ferry: building the ferry tool (release)..."
swift build -c release --product ferry 2>&1 | grep -E "error:|warning:|Build complete" || true
exec .build/release/ferry demo "$@"
