@_spi(Engine) import Ferry
import FerryCrashWorkload
import FerryLog
import Foundation
import LMDB
import Synchronization
import Testing

/// The crash checks must be able to fail: fed a store and acknowledgements that break an invariant,
/// they say so.
@Suite(.timeLimit(.minutes(20))) struct CrashCheckTests {
  @Test func aCleanWorkloadPassesEveryCheck() async throws {
    let store = DemoStore()
    defer { store.remove() }
    let acks = Mutex<[String]>([])
    try await runCrashWorkload(path: store.path, seed: 5, operations: 150) { line in
      acks.withLock { $0.append(line) }
    }
    let parsed = acks.withLock { $0 }.compactMap { Acknowledgement(line: $0) }
    #expect(parsed.count > 100)
    let report = await checkAfterCrash(path: store.path, acknowledged: parsed)
    #expect(report.lost == 0)
    #expect(report.violations.isEmpty, "\(report.violations)")
    #expect(report.head == parsed.last?.sequence)
  }

  @Test func aMissingOrChangedAcknowledgedEventIsLost() async throws {
    let store = DemoStore()
    defer { store.remove() }
    let acks = Mutex<[String]>([])
    try await runCrashWorkload(path: store.path, seed: 6, operations: 40) { line in
      acks.withLock { $0.append(line) }
    }
    var parsed = acks.withLock { $0 }.compactMap { Acknowledgement(line: $0) }
    let head = try #require(parsed.last?.sequence)
    parsed.append(try #require(Acknowledgement(line: "ack \(head + 1) task.added 1234abcd")))
    parsed.append(try #require(Acknowledgement(line: "ack 1 task.added 0")))
    let report = await checkAfterCrash(path: store.path, acknowledged: parsed)
    #expect(report.lost == 2)
    #expect(report.violations.count >= 2)
  }

  @Test func aRunInFlightIsReportedInterruptedAndReady() async throws {
    let store = DemoStore()
    defer { store.remove() }
    do {
      let open = try await FerryStore.open(at: store.path)
      let id = try await open.queue.add(tag: "t", payload: ["n": 1])
      // What a kill mid-handler leaves: a durable run start and no outcome.
      _ = try await open.log.append(
        NewEvent(type: "task.runStarted", payload: id.rawValue.bigEndianBytes + UInt32(1).bigEndianBytes))
      open.close()
    }
    let report = await checkAfterCrash(path: store.path, acknowledged: [])
    #expect(report.interrupted == [1])
    #expect(report.violations.isEmpty, "\(report.violations)")
  }

  @Test func aProjectionRowPlantedAfterTheCrashIsAViolation() async throws {
    let store = DemoStore()
    defer { store.remove() }
    try await runCrashWorkload(path: store.path, seed: 7, operations: 30) { _ in }
    // Flushed commits first: a store with a write-ahead segment takes the planted row for a
    // commit after its checkpoint, which the check's recovery undoes (Specs/one-sync-commit.md §5).
    var flushed = FerryStore.Configuration()
    flushed.writeAheadSegment = false
    try await FerryStore.open(at: store.path, configuration: flushed).close()
    let env = try LMDB.Environment.open(path: store.path, databases: ["p:cacheAges:keys"])
    try env.write { try $0.put(try env.database("p:cacheAges:keys"), key: Array("ghost".utf8), value: [0]) }
    env.close()
    let report = await checkAfterCrash(path: store.path, acknowledged: [])
    #expect(!report.violations.isEmpty)
  }
}
