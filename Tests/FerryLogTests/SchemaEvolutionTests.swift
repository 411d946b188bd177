import Foundation
import LMDB
import Testing

@testable import FerryLog

/// The worked example of `Specs/schema-evolution.md`: `note.saved` gains a `pinned` field in
/// schema version 2, with an upcaster for version 1 records, and the projection that reads it moves
/// to version 2 and is rebuilt at open.
enum Notes {
  /// Version 1 of the event: the text.
  static func v1(_ text: String) -> [UInt8] {
    var writer = PayloadWriter()
    writer.write(text)
    return writer.bytes
  }

  /// Version 2: the text and whether the note is pinned.
  static func v2(_ text: String, pinned: Bool) -> [UInt8] {
    var writer = PayloadWriter()
    writer.write(text)
    writer.write(pinned)
    return writer.bytes
  }

  /// The upcaster 1 → 2: a version 1 note was never pinned.
  static let catalogV1 = EventCatalog([.init("note.saved", version: 1)])
  static let catalogV2 = EventCatalog([.init("note.saved", version: 2, upcasters: [1: { $0 + [0] }])])

  /// Version 1 of the projection: text by sequence.
  struct ProjectionV1: Projection {
    let name = "notes"
    let version: UInt32 = 1
    let tables = ["bySequence"]
    func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
      var reader = PayloadReader(event.payload)
      try tables.put(
        "bySequence", key: event.sequence.bigEndianBytes, value: Array(try reader.readString("text").utf8))
    }
  }

  /// Version 2: also a table of pinned notes — it needs every note's `pinned`, old ones included.
  struct ProjectionV2: Projection {
    let name = "notes"
    let version: UInt32 = 2
    let tables = ["bySequence", "pinned"]
    func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
      var reader = PayloadReader(event.payload)
      let text = try reader.readString("text")
      try tables.put("bySequence", key: event.sequence.bigEndianBytes, value: Array(text.utf8))
      if try reader.readBool("pinned") {
        try tables.put("pinned", key: event.sequence.bigEndianBytes, value: [])
      }
      try reader.finish("note.saved v2")
    }
  }
}

struct UpcastVector: Decodable {
  let hex: String
  let type: String
  let storedSchemaVersion: UInt16
  let timestamp: Int64
  let eventId: String
  let v1PayloadHex: String
  let upcastSchemaVersion: UInt16
  let upcastPayloadHex: String
}

@Suite(.timeLimit(.minutes(20))) struct SchemaEvolutionTests {
  @Test func anOldRecordIsUpcastOnReadAndItsStoredBytesNeverChange() async throws {
    let file = repositoryRoot().appendingPathComponent("Specs/vectors/upcast-001-note-v1.json")
    let vector = try JSONDecoder().decode(UpcastVector.self, from: Data(contentsOf: file))
    // Flushed commits, as a store of that age has: the old record is put in data.mdb directly.
    let store = TemporaryStore(writeAheadSegment: false)
    defer { store.remove() }

    // Written by version 1 of the code: the exact bytes of the golden vector.
    var log = try store.open([Notes.ProjectionV1()], catalog: Notes.catalogV1)
    let id = try #require(EventID(hex: vector.eventId))
    _ = try await log.append(
      NewEvent(
        type: vector.type, schemaVersion: 1, payload: try bytes(hex: vector.v1PayloadHex), id: id,
        timestamp: vector.timestamp))
    _ = try await log.append(NewEvent(type: "note.saved", payload: Notes.v1("call mum")))
    // Written today in record format 2; a store written before format 2 holds the vector's exact
    // format 1 bytes: put them in its place, as such a store would have them.
    #expect(
      try log.record(at: 1)
        == EventRecord.encode(
          type: vector.type, schemaVersion: 1, timestamp: vector.timestamp, id: id,
          payload: try bytes(hex: vector.v1PayloadHex), sequence: 1))
    log.close()
    let environment = try Environment.open(path: store.path, databases: ["events"])
    let events = try environment.database("events")
    try environment.write { txn in
      try txn.put(events, key: UInt64(1).bigEndianBytes, value: try bytes(hex: vector.hex))
    }
    environment.close()
    #expect((try bytes(hex: vector.hex)).first == 1)

    // Version 2 of the code: new catalog with the upcaster, new projection version.
    log = try store.open([Notes.ProjectionV2()], catalog: Notes.catalogV2)
    defer { log.close() }
    #expect(log.eventsReplayedAtOpen == 2)  // the version bump rebuilt the projection from the log
    let old = try #require(try log.event(at: 1))
    #expect(old.schemaVersion == vector.upcastSchemaVersion)
    #expect(old.storedSchemaVersion == vector.storedSchemaVersion)
    #expect(old.payload == (try bytes(hex: vector.upcastPayloadHex)))
    #expect(try log.record(at: 1) == (try bytes(hex: vector.hex)))  // stored bytes untouched

    let pinned = try await log.append(
      NewEvent(type: "note.saved", schemaVersion: 2, payload: Notes.v2("pay rent", pinned: true)))
    let rows = try log.read { view in
      (
        try view.tables(of: "notes").count("bySequence"),
        try view.tables(of: "notes").entries("pinned").map(\.key)
      )
    }
    #expect(rows.0 == 3)
    #expect(rows.1 == [pinned.bigEndianBytes])
    #expect(try log.verify().isHealthy)
    // A version 2 record cannot be written with the version 1 catalog's code: newer schema refused.
    let decoded = try EventRecord.decode(try #require(try log.record(at: pinned)), sequence: pinned)
    #expect(throws: FerryLogError.self) { try Notes.catalogV1.upcast(decoded) }
  }
}
