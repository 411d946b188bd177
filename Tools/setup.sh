#!/usr/bin/env bash
# Sourced by Tools/demo.sh and Tools/test.sh: makes sure this machine can build Ferry.
# Installs LMDB's headers and library (Debian's liblmdb-dev) when they are missing.
set -euo pipefail

ferry_setup() {
  if ! command -v swift >/dev/null 2>&1; then
    echo "ferry: the Swift toolchain (swift) is not on PATH; install Swift 6.1 or newer first" >&2
    exit 1
  fi
  if pkg-config --exists lmdb 2>/dev/null && [ -f /usr/include/lmdb.h ]; then
    return 0
  fi
  echo "ferry: installing liblmdb-dev (LMDB headers and library)..."
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "ferry: liblmdb-dev is missing and this user cannot install it (not root, no sudo)" >&2
      exit 1
    fi
  fi
  if command -v apt-get >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq liblmdb-dev pkg-config >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install lmdb pkg-config
  else
    echo "ferry: no apt-get or brew here; install LMDB's development package by hand" >&2
    exit 1
  fi
  if ! pkg-config --exists lmdb; then
    echo "ferry: liblmdb-dev was installed but pkg-config still cannot find lmdb" >&2
    exit 1
  fi
}

ferry_setup
