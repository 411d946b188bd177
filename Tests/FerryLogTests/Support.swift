import FerryLog
import Foundation
import LMDB
import TestSupport

/// A fresh store directory under the system's temporary directory, removed by `remove()`.
struct TemporaryStore {
  let path: String
  /// What ``open(_:catalog:configure:)`` asks for before `configure` runs: false for tests of the
  /// data file's own checks, which edit `data.mdb` directly — a store with a write-ahead segment
  /// takes such an edit for a commit after its checkpoint (`Specs/one-sync-commit.md` §5).
  let writeAheadSegment: Bool

  init(_ label: String = #function, writeAheadSegment: Bool = true) {
    let safe = label.filter { $0.isLetter || $0.isNumber }
    path = FileManager.default.temporaryDirectory.path + "/ferry-log-\(safe)-\(UUID().uuidString.prefix(8))"
    self.writeAheadSegment = writeAheadSegment
  }

  func remove() { try? FileManager.default.removeItem(atPath: path) }

  /// Opens the store with the given projections and options.
  func open(
    _ projections: [any Projection] = [CountByType()], catalog: EventCatalog? = nil,
    configure: (inout EventLog.Configuration) -> Void = { _ in }
  ) throws -> EventLog {
    var configuration = EventLog.Configuration(projections: projections, catalog: catalog)
    configuration.writeAheadSegment = writeAheadSegment
    configure(&configuration)
    return try EventLog.open(at: path, configuration: configuration)
  }

  /// Opens the store's LMDB environment directly, to plant damage a test then looks for.
  func withRawEnvironment(_ databases: [String], _ body: (Environment) throws -> Void) throws {
    let env = try Environment.open(path: path, databases: databases)
    defer { env.close() }
    try body(env)
  }
}

/// The type-count projection under the name the tests use.
func CountByType(version: UInt32 = 1) -> EventTypeCounts {
  EventTypeCounts(name: "countByType", version: version)
}

/// Keeps every payload by sequence, and throws on a payload that starts with "poison".
struct PayloadsBySequence: Projection {
  struct Poisoned: Error {}
  let name = "payloads"
  let version: UInt32 = 1
  let tables = ["bySequence"]

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    if event.payload.starts(with: Array("poison".utf8)) { throw Poisoned() }
    try tables.put("bySequence", key: event.sequence.bigEndianBytes, value: event.payload)
  }
}

/// Uses the payload as a key: a long payload makes a key LMDB cannot hold.
struct PayloadAsKey: Projection {
  let name = "payloadAsKey"
  let version: UInt32 = 1
  let tables = ["keys"]

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    try tables.put("keys", key: event.payload, value: event.sequence.bigEndianBytes)
  }
}

func payload(_ text: String) -> [UInt8] { Array(text.utf8) }

func counts(_ log: EventLog, projection: String = "countByType") throws -> [String: UInt64] {
  try log.read { view in try EventTypeCounts.counts(in: view.tables(of: projection)) }
}

/// The repository's root, found from this file's path.
func repositoryRoot(_ file: String = #filePath) -> URL {
  URL(fileURLWithPath: file).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
}

/// Flips the bits of one byte of a file where `needle` first occurs; returns the offset.
func flipByte(in file: String, after needle: [UInt8], offset extra: Int = 0) throws -> Int? {
  // LMDB copies a page on write, so the file may also hold older copies of a record (freed pages):
  // every copy is damaged, so that the live one surely is. Returns the first offset changed.
  var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
  guard needle.count <= bytes.count else { return nil }
  var first: Int?
  for start in 0...(bytes.count - needle.count) where bytes[start] == needle[0] {
    if Array(bytes[start..<(start + needle.count)]) == needle {
      let target = start + extra
      bytes[target] ^= 0xFF
      first = first ?? target
    }
  }
  if first != nil { try Data(bytes).write(to: URL(fileURLWithPath: file)) }
  return first
}

/// Runs one of this package's executables with a hang guard (a child still running after
/// `timeout` is killed: the blocking read below is beyond any test time limit) and returns its
/// exit status and standard output.
func runProduct(
  _ name: String, _ arguments: [String], timeout: Duration = .seconds(20 * 60)
) async throws -> (
  status: Int32, output: String
) {
  try await runCommand(productURL(name).path, arguments, timeout: timeout)
}

/// Runs the executable at `path` (one of this package's or another, `taskset` say) the same way.
func runCommand(
  _ path: String, _ arguments: [String], timeout: Duration = .seconds(20 * 60)
) async throws -> (
  status: Int32, output: String
) {
  let process = Process()
  process.executableURL = URL(fileURLWithPath: path)
  process.arguments = arguments
  let pipe = Pipe()
  process.standardOutput = pipe
  try process.run()
  let watchdog = Task {
    try await Task.sleep(for: timeout)
    if process.isRunning { process.terminate() }
  }
  let data = pipe.fileHandleForReading.readAll()
  process.waitUntilExit()
  watchdog.cancel()
  return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}
