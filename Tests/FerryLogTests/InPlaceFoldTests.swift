import Foundation
import Synchronization
import Testing

@testable import FerryLog

/// Writes every field of each event it folds, by sequence, from whichever path folds it: the
/// rows of a replay in place must equal those of the live path (events), record by record.
struct EchoFields: InPlaceFolding {
  /// How many records each path folded (to show which path a replay took).
  final class Paths: Sendable {
    let inPlace = Atomic<Int>(0)
    let events = Atomic<Int>(0)
  }
  let name = "echo"
  let version: UInt32 = 1
  let tables = ["rows"]
  let paths: Paths

  static func row(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: UnsafeRawBufferPointer
  ) -> [UInt8] {
    var writer = PayloadWriter()
    writer.write(type)
    writer.write(schemaVersion)
    writer.write(timestamp)
    writer.write(bytes: id.bytes)
    writer.write(bytes: Array(payload))
    return writer.bytes
  }

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    paths.events.add(1, ordering: .relaxed)
    let row = event.payload.withUnsafeBytes {
      Self.row(
        type: event.type, schemaVersion: event.schemaVersion, timestamp: event.timestamp, id: event.id,
        payload: $0)
    }
    try tables.put("rows", key: event.sequence.bigEndianBytes, value: row)
  }

  func apply(_ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables) throws {
    paths.inPlace.add(1, ordering: .relaxed)
    let row = Self.row(
      type: header.type, schemaVersion: header.schemaVersion, timestamp: header.timestamp, id: header.id,
      payload: payload)
    try tables.put("rows", key: header.sequence.bigEndianBytes, value: row)
  }
}

/// A projection outside the package's in-place protocol: with it in a replay, every record is
/// folded as an event.
struct PlainCount: Projection {
  let name = "plain"
  let version: UInt32 = 1
  let tables = ["n"]
  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    let count = try tables.get("n", key: [1]).flatMap { UInt64(bigEndianBytes: $0) } ?? 0
    try tables.put("n", key: [1], value: (count + 1).bigEndianBytes)
  }
}

@Suite(.timeLimit(.minutes(20))) struct InPlaceFoldTests {
  func rows(_ log: EventLog) throws -> [[UInt8]] {
    try log.read { view in try view.tables(of: "echo").entries("rows").map { $0.key + $0.value } }
  }

  /// A rebuild folds records in place when every projection can and the record needs no upcast;
  /// upcast records, and every record when a plain projection is folded too, go as events; all
  /// three give the live path's rows.
  @Test func aReplayInPlaceFoldsWhatTheLivePathFolds() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let catalog = EventCatalog([
      .init("a"), .init("b", version: 2, upcasters: [1: { $0 + [0xB1] }]),
      .init("c", version: 3, upcasters: [1: { $0 + [1] }, 2: { $0 + [2] }]),
    ])
    do {
      // Old versions written before the catalog had the newer ones.
      let log = try store.open([])
      var events: [NewEvent] = []
      for i in 0..<60 {
        let payload = (0..<(i % 7 * 9)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ i) }
        switch i % 4 {
        case 0: events.append(NewEvent(type: "a", payload: payload))
        case 1: events.append(NewEvent(type: "b", schemaVersion: 1, payload: payload))
        case 2: events.append(NewEvent(type: "c", schemaVersion: UInt16(1 + i % 3), payload: payload))
        default: events.append(NewEvent(type: "b", schemaVersion: 2, payload: payload))
        }
      }
      _ = try await log.append(events)
      log.close()
    }
    let paths = EchoFields.Paths()
    // The reference: every record folded as an event (a plain projection beside the echo).
    let live: [[UInt8]]
    do {
      let log = try store.open([EchoFields(paths: paths), PlainCount()], catalog: catalog)
      defer { log.close() }
      live = try rows(log)
    }
    #expect(live.count == 60)
    #expect(paths.inPlace.load(ordering: .relaxed) == 0)
    #expect(paths.events.load(ordering: .relaxed) == 60)
    // A rebuild: in place except the upcast records.
    let before = (paths.inPlace.load(ordering: .relaxed), paths.events.load(ordering: .relaxed))
    do {
      let log = try store.open([EchoFields(paths: paths)], catalog: catalog) { $0.rebuildChunkSize = 7 }
      defer { log.close() }
      let report = try await log.rebuild()
      #expect(report.eventsReplayed == 60)
      #expect(try rows(log) == live)
    }
    let inPlace = paths.inPlace.load(ordering: .relaxed) - before.0
    let asEvents = paths.events.load(ordering: .relaxed) - before.1
    // Current versions: every "a" (15), the v2 "b" (15) and the v3 "c" (5 of 15).
    #expect(inPlace == 35)
    #expect(asEvents == 25)
    // With a plain projection beside it, every record goes as an event.
    let mixedBefore = paths.inPlace.load(ordering: .relaxed)
    do {
      let log = try store.open([EchoFields(paths: paths), PlainCount()], catalog: catalog)
      defer { log.close() }
      _ = try await log.rebuild()
      #expect(try rows(log) == live)
    }
    #expect(paths.inPlace.load(ordering: .relaxed) == mixedBefore)
    // Without a catalog, nothing is upcast and every record goes in place.
    let plainBefore = paths.events.load(ordering: .relaxed)
    do {
      let log = try store.open([EchoFields(paths: paths)])
      defer { log.close() }
      _ = try await log.rebuild()
      let stored = try rows(log)
      #expect(stored.count == 60)
    }
    #expect(paths.events.load(ordering: .relaxed) == plainBefore)
  }

  /// A record whose payload is damaged is refused by the in-place path exactly as by the event
  /// path: the CRC is checked before anything is folded.
  @Test func aDamagedRecordIsRefusedInPlaceToo() async throws {
    let store = TemporaryStore(writeAheadSegment: false)  // the record is damaged in data.mdb
    defer { store.remove() }
    do {
      let log = try store.open([])
      _ = try await log.append(
        (0..<5).map { NewEvent(type: "a", payload: Array(repeating: UInt8($0), count: 40)) })
      log.close()
    }
    try store.withRawEnvironment(["events"]) { env in
      try env.write { txn in
        let db = try env.database("events")
        var record = try #require(try txn.get(db, key: UInt64(3).bigEndianBytes))
        record[record.count / 2] ^= 0x10
        try txn.put(db, key: UInt64(3).bigEndianBytes, value: record)
      }
    }
    let paths = EchoFields.Paths()
    do {
      let log = try store.open([EchoFields(paths: paths)])
      log.close()
      Issue.record("a store with a damaged record folded it")
    } catch let error as FerryLogError {
      #expect("\(error)".contains("3"), "\(error)")
    }
    // Nothing past the damage was folded in place.
    #expect(paths.inPlace.load(ordering: .relaxed) <= 2)
  }
}
