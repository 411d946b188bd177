#!/usr/bin/env bash
# Sourced by Tools/demo.sh and Tools/test.sh: makes sure this machine can build Ferry.
# Installs LMDB's headers and library (Debian's liblmdb-dev, Homebrew's lmdb on macOS) when they
# are missing.
set -euo pipefail

# Whether pkg-config finds LMDB and its header is where pkg-config says (/usr/include on Debian,
# Homebrew's prefix on macOS).
ferry_lmdb_found() {
  command -v pkg-config >/dev/null 2>&1 && pkg-config --exists lmdb 2>/dev/null || return 1
  local include
  include="$(pkg-config --variable=includedir lmdb 2>/dev/null)"
  [ -f "${include:-/usr/include}/lmdb.h" ]
}

# Whether the LMDB pkg-config finds is one Ferry runs on: its own checks read LMDB 0.9's page
# layout, and it refuses any other at open (LMDB 1.0 — Homebrew's lmdb today — lays pages out
# otherwise; its development line called itself 0.9.90).
ferry_lmdb_supported() {
  local version
  version="$(pkg-config --modversion lmdb 2>/dev/null)"
  case "$version" in
    0.9.[0-9] | 0.9.[0-8][0-9]) return 0 ;;
  esac
  echo "ferry: pkg-config finds LMDB ${version:-of no version}; Ferry runs on LMDB 0.9 only (0.9.0 to 0.9.89)." >&2
  echo "ferry: build LMDB 0.9.33 (git tag LMDB_0.9.33 of https://git.openldap.org/openldap/openldap," >&2
  echo "ferry: make -C libraries/liblmdb install prefix=DIR, SOEXT=.dylib on macOS), write DIR/lib/pkgconfig/lmdb.pc" >&2
  echo "ferry: for it and put that directory first in PKG_CONFIG_PATH" >&2
  exit 1
}

ferry_setup() {
  if ! command -v swift >/dev/null 2>&1; then
    echo "ferry: the Swift toolchain (swift) is not on PATH; install Swift 6.1 or newer first" >&2
    exit 1
  fi
  if [ "$(uname -s)" = Darwin ]; then
    # Homebrew installs as the user (never with sudo); its pkg-config finds its own lmdb.pc.
    if ! ferry_lmdb_found; then
      if ! command -v brew >/dev/null 2>&1; then
        echo "ferry: LMDB is missing and Homebrew (brew) is not installed: install it, then: brew install lmdb pkg-config" >&2
        exit 1
      fi
      echo "ferry: installing lmdb and pkg-config with Homebrew..."
      brew install lmdb pkg-config
    fi
    if ! ferry_lmdb_found; then
      echo "ferry: Homebrew's lmdb is installed but pkg-config cannot find it (PKG_CONFIG_PATH should include $(brew --prefix lmdb 2>/dev/null)/lib/pkgconfig)" >&2
      exit 1
    fi
    ferry_lmdb_supported
    return 0
  fi
  if ferry_lmdb_found; then
    ferry_lmdb_supported
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
  else
    echo "ferry: no apt-get here; install LMDB's development package and pkg-config by hand" >&2
    exit 1
  fi
  if ! ferry_lmdb_found; then
    echo "ferry: liblmdb-dev was installed but pkg-config still cannot find lmdb" >&2
    exit 1
  fi
  ferry_lmdb_supported
}

ferry_setup
