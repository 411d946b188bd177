#!/usr/bin/env bash
# Tries the README's install section the way an app would: a fresh package in a temporary
# directory that depends on this checkout, links only the `Ferry` product, builds, and runs a task.
# Then checks the module walls from the app's side: an app that names Ferry's crash points (the
# kill switch of its crash tests, `package` access) must not compile.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/Tools/setup.sh" >/dev/null
app=$(mktemp -d)
trap 'rm -rf "$app"' EXIT
identity=$(basename "$root" | tr '[:upper:]' '[:lower:]')
mkdir -p "$app/Sources/NotesApp"
cat >"$app/Package.swift" <<SWIFT
// swift-tools-version: 6.1
import PackageDescription

let package = Package(
  name: "NotesApp",
  platforms: [.macOS(.v15)],
  dependencies: [.package(path: "$root")],
  targets: [
    .executableTarget(name: "NotesApp", dependencies: [.product(name: "Ferry", package: "$identity")])
  ]
)
SWIFT
cat >"$app/Sources/NotesApp/main.swift" <<'SWIFT'
@_spi(Engine) import Ferry
import Foundation

struct Note: Codable, Sendable { var text: String }

let path = NSTemporaryDirectory() + "ferry-install-\(UUID().uuidString)"
try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(atPath: path) }
let store = try await FerryStore.open(at: path)
let id = try await store.queue.add(tag: "save-note", payload: Note(text: "milk"))
let runner = TaskRunner(queue: store.queue)
runner.register(tag: "save-note") { _ in .succeeded }
let report = try await runner.run()
print("install check: task \(id): \(report)")
store.close()
SWIFT
log="$app/build.log"
if ! (cd "$app" && swift build >"$log" 2>&1); then
  cat "$log" >&2
  echo "ferry: a fresh package depending on Ferry does not build" >&2
  exit 1
fi
output=$("$app/.build/debug/NotesApp")
echo "$output"
[[ "$output" == *"1 ran (1 succeeded, 0 failed)"* ]] || { echo "ferry: the install check's task did not run" >&2; exit 1; }

# The wall: the same app naming CrashPoint must fail to compile, for that reason.
cat >"$app/Sources/NotesApp/main.swift" <<'SWIFT'
@_spi(Engine) import Ferry
import FerryLog

CrashPoint.reach(CrashPoint.beforeCommit)
SWIFT
if (cd "$app" && swift build >"$log" 2>&1); then
  echo "ferry: an app linking Ferry can name CrashPoint: the crash tests' kill switch is visible to apps" >&2
  exit 1
fi
if ! grep -qE "CrashPoint.*(package|inaccessible|cannot find)|(package|inaccessible|cannot find).*CrashPoint" "$log"; then
  cat "$log" >&2
  echo "ferry: the app naming CrashPoint failed to build for another reason" >&2
  exit 1
fi
echo "install check: an app cannot name CrashPoint ($(grep -m1 -oE "'CrashPoint' is inaccessible[^;]*|cannot find 'CrashPoint' in scope" "$log"))"
