#!/usr/bin/env bash
# Tries the README's install section the way an app would: a fresh package in a temporary
# directory that depends on this checkout, links only the `Ferry` product, builds, and runs a task.
# The app imports `Ferry` alone and makes open, add, run and refresh fail inside functions typed
# `throws(FerryError)`, so the compiler proves no other error escapes; each must arrive as the
# FerryError case expected. Then checks the module walls from the app's side: an app that names
# Ferry's crash points (the kill switch of its crash tests, `package` access) must not compile,
# nor one that reaches the engine (`store.log`) or the experimental knobs without asking by SPI.
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
import Ferry
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

// Each failure must be a FerryError: these are typed, so nothing else can escape them.
func open(_ path: String, create: Bool = true) async throws(FerryError) {
  var configuration = FerryStore.Configuration()
  configuration.createIfMissing = create
  try await FerryStore.open(at: path, configuration: configuration).close()
}
func add(_ store: FerryStore, tag: String) async throws(FerryError) {
  _ = try await store.queue.add(tag: tag, payload: Note(text: "eggs"))
}
func run(_ runner: TaskRunner) async throws(FerryError) { _ = try await runner.run() }

var failures = 0
@MainActor func expect(_ label: String, as expected: String, _ body: () async throws(FerryError) -> Void, _ matches: (FerryError) -> Bool) async {
  do {
    try await body()
    print("install check: \(label): no error"); failures += 1
  } catch {
    let ok = matches(error)
    print("install check: \(label): \(ok ? "FerryError.\(expected)" : "UNEXPECTED") (\(error))")
    if !ok { failures += 1 }
  }
}
let plainFile = path + "/plain-file"
FileManager.default.createFile(atPath: plainFile, contents: Data("not a store".utf8))
await expect("open of a plain file", as: "notAStore", { () async throws(FerryError) in try await open(plainFile) }) {
  if case .notAStore = $0 { true } else { false }
}
await expect("open without create of a missing store", as: "noSuchStore", { () async throws(FerryError) in
  try await open(path + "/missing", create: false)
}) { if case .noSuchStore = $0 { true } else { false } }
await expect("open of a store open already", as: "alreadyOpen", { () async throws(FerryError) in try await open(path) }) {
  if case .alreadyOpen = $0 { true } else { false }
}
await expect("add with an empty tag", as: "invalidArgument", { () async throws(FerryError) in try await add(store, tag: "") }) {
  if case .invalidArgument = $0 { true } else { false }
}
store.close()
await expect("add after close", as: "closed", { () async throws(FerryError) in try await add(store, tag: "save-note") }) {
  $0 == .closed
}
await expect("run after close", as: "closed", { () async throws(FerryError) in try await run(runner) }) { $0 == .closed }

// A refresh returns its outcome; a store failure in it is a FerryError too.
let notes = try CacheRepository<[Note]>(
  key: "notes", ledger: store.ledger, maxAge: .seconds(60),
  source: CacheSource(fetch: { [Note(text: "milk")] }, save: { _ in }, load: { nil }), automaticRefresh: false)
let refreshed = await notes.refresh(force: true)
if case .failed(let error) = refreshed, let underlying = error.underlying as? FerryError, underlying == .closed {
  print("install check: refresh of a closed store: .failed, underlying FerryError.closed (\(underlying))")
} else {
  print("install check: refresh of a closed store: UNEXPECTED \(refreshed)"); failures += 1
}
print("install check: \(failures) unexpected")
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
[[ "$output" == *"install check: 0 unexpected"* ]] || { echo "ferry: a failure arrived otherwise than as expected" >&2; exit 1; }

# The engine and the experimental knobs: only where the app asks for them by SPI.
cat >"$app/Sources/NotesApp/main.swift" <<'SWIFT'
import Ferry

let store = try await FerryStore.open(at: "/tmp/never-opened")
print(store.log)
var configuration = FerryStore.Configuration()
configuration.writerSpin = .zero
SWIFT
if (cd "$app" && swift build >"$log" 2>&1); then
  echo "ferry: an app that imports Ferry reaches store.log: the engine is in the public API" >&2
  exit 1
fi
for name in log writerSpin; do
  if ! grep -qE "'$name' is inaccessible due to '@_spi' protection level" "$log"; then
    cat "$log" >&2
    echo "ferry: the app naming $name failed to build for another reason" >&2
    exit 1
  fi
done
echo "install check: an app cannot name store.log or writerSpin without @_spi ($(grep -m1 -oE "'log' is inaccessible[^;]*" "$log"))"

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
