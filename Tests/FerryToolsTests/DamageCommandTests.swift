import Ferry
import FerryLog
import Foundation
import LMDB
import TestSupport
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The CLI over stores damaged in ways the log's own checks catch: each command exits 6 naming
/// what is wrong, and a user without permission is told so.
///
/// The stores commit flushed: the damage is planted with raw LMDB writes, which a store with a
/// write-ahead segment takes for commits after its checkpoint and undoes at recovery
/// (`Specs/one-sync-commit.md` §5; SegmentStoreCommandTests: a raw write behind its back).
@Suite(.timeLimit(.minutes(20)), .serialized) struct DamageCommandTests {
  static var flushed: FerryStore.Configuration {
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = false
    return configuration
  }

  func makeStore(_ path: String, tasks: Int = 20) async throws {
    let store = try await FerryStore.open(at: path, configuration: Self.flushed)
    for i in 0..<tasks { _ = try await store.queue.add(tag: "note", payload: ["n": i]) }
    store.close()
  }

  func plant(_ path: String, _ body: (Transaction, Database) throws -> Void) throws {
    let env = try Environment.open(path: path, databases: ["events"])
    defer { env.close() }
    let events = try env.database("events")
    try env.write { txn in try body(txn, events) }
  }

  static let readingCommands: [[String]] = [["verify"], ["export"], ["log"], ["stats"], ["replay"]]

  @Test func aMissingEventIsExitSixInEveryCommandThatReadsTheLog() async throws {
    let place = DemoStore()
    defer { place.remove() }
    try await makeStore(place.path)
    try plant(place.path) { txn, events in _ = try txn.delete(events, key: UInt64(7).bigEndianBytes) }
    for command in Self.readingCommands {
      let result = try ferry(command + [place.path])
      #expect(result.status == 6, "\(command): \(result.status) \(result.stderr)")
      #expect(result.stderr.contains("7") || result.stdout.contains("7"), "\(command) names the sequence")
    }
  }

  @Test func aRecordUnderTheWrongKeyIsExitSix() async throws {
    let place = DemoStore()
    defer { place.remove() }
    try await makeStore(place.path)
    try plant(place.path) { txn, events in
      let record = try #require(try txn.get(events, key: UInt64(3).bigEndianBytes))
      try txn.put(events, key: UInt64(4).bigEndianBytes, value: record)
    }
    for command in Self.readingCommands {
      let result = try ferry(command + [place.path])
      #expect(result.status == 6, "\(command): \(result.status) \(result.stderr)")
      #expect((result.stderr + result.stdout).contains("written as sequence 3"), "\(command)")
    }
  }

  @Test func aStoreThatLostItsNewestCommitsIsExitSixAndUntouched() async throws {
    let place = DemoStore()
    defer { place.remove() }
    try await makeStore(place.path, tasks: 10)
    let older = place.path + ".data-copy"
    defer { try? FileManager.default.removeItem(atPath: older) }
    try FileManager.default.copyItem(atPath: place.path + "/data.mdb", toPath: older)
    try await {
      let store = try await FerryStore.open(at: place.path, configuration: Self.flushed)
      for i in 0..<5 { _ = try await store.queue.add(tag: "later", payload: ["n": i]) }
      store.close()
    }()
    try FileManager.default.removeItem(atPath: place.path + "/data.mdb")
    try FileManager.default.copyItem(atPath: older, toPath: place.path + "/data.mdb")
    let before = try Data(contentsOf: URL(fileURLWithPath: place.path + "/data.mdb"))
    for command in Self.readingCommands + [["inspect"], ["compact"]] {
      let result = try ferry(command + [place.path])
      #expect(result.status == 6, "\(command): \(result.status) \(result.stderr)")
      #expect(result.stderr.contains("lost its newest commits"), "\(command): \(result.stderr)")
      #expect(result.stderr.contains("up to sequence 15"), "\(command): \(result.stderr)")
    }
    #expect(try Data(contentsOf: URL(fileURLWithPath: place.path + "/data.mdb")) == before)
  }

  @Test func aUserWithoutPermissionIsToldSo() async throws {
    let place = DemoStore()
    defer { place.remove() }
    try await makeStore(place.path)
    let probe = Process()
    probe.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
    probe.arguments = ["-u", "nobody", "--", productURL("ferry").path, "--version"]
    probe.standardOutput = FileHandle.nullDevice
    probe.standardError = FileHandle.nullDevice
    guard getuid() == 0, (try? probe.run()) != nil else {
      print("permission: skipped (needs root and runuser to act as another user)")
      return
    }
    probe.waitUntilExit()
    guard probe.terminationStatus == 0 else {
      print("permission: skipped (user nobody cannot run the built ferry here)")
      return
    }
    for command in [["inspect"], ["verify"], ["export"], ["compact"]] {
      let run = Process()
      run.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
      run.arguments = ["-u", "nobody", "--", productURL("ferry").path] + command + [place.path]
      let errors = Pipe()
      run.standardError = errors
      run.standardOutput = FileHandle.nullDevice
      try run.run()
      let message = String(decoding: errors.fileHandleForReading.readAll(), as: UTF8.self)
      run.waitUntilExit()
      #expect(run.terminationStatus == 7, "\(command): \(run.terminationStatus) \(message)")
      #expect(message.contains("permission denied"), "\(command): \(message)")
    }
  }
}
