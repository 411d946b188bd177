#!/usr/bin/env bash
# Runs Ferry's benchmarks (Tools/Benchmarks, a package of its own so `swift test` never builds GRDB):
# Ferry against the same queue on SQLite (GRDB) and against the bare LMDB floor, in one run.
#   bash Tools/bench.sh            # the full run (several minutes), table on stdout
#   bash Tools/bench.sh --quick    # small sizes, under a minute: the smoke run CI does
#   bash Tools/bench.sh --json     # the same figures as JSON;  --runs N for the medians
#   bash Tools/bench.sh --instructions  # also instructions per add, run and rebuilt event (callgrind,
#                                  # Tools/cost.sh): the stable figure on a shared, noisy machine
set -euo pipefail
cd "$(dirname "$0")/.."
source Tools/setup.sh
# GRDB's SQLite: part of the SDK on macOS; Debian's libsqlite3-dev elsewhere.
if [ "$(uname -s)" != Darwin ] && ! [ -f /usr/include/sqlite3.h ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "ferry: SQLite's headers (sqlite3.h) are missing and there is no apt-get: install them by hand" >&2
    exit 1
  fi
  echo "ferry: installing libsqlite3-dev (for the SQLite peer)..."
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libsqlite3-dev >/dev/null
fi
instructions=0
args=()
for argument in "$@"; do
  if [ "$argument" = --instructions ]; then instructions=1; else args+=("$argument"); fi
done
if [ "$instructions" -eq 1 ] && [ "$(uname -s)" = Darwin ]; then
  echo "ferry: --instructions counts with valgrind's callgrind, which does not run on macOS" >&2
  exit 1
fi
if [ "$instructions" -eq 1 ]; then bash Tools/cost.sh; fi
cd Tools/Benchmarks
ln -sfn ../.. FerryPackage   # a fixed package identity for the repository, whatever its directory is called
echo "ferry: building the benchmarks (release)..." >&2
if ! swift build -c release --product ferry-bench >/dev/null 2>&1; then
  # A .build made before Ferry gained source files may plan without them: plan again.
  rm -f .build/build.db .build/*.yaml
  swift build -c release --product ferry-bench
fi
exec .build/release/ferry-bench "${args[@]}"
