import Foundation
import Testing

@testable import Ferry
@testable import FerryLog

/// The golden vectors of the queue's schema-2 events (`Specs/task-events.md` §2.1, §2.3), of
/// `task.added` version 3 (§2.6), and of `task.payloadUpdated` (§2.2) and `task.expired` (§2.4),
/// written by the independent generator (`Tools/make-vectors.py`): each upcaster turns a record
/// into what the next version says, old records read as the current version, and current events
/// encode to exactly the generator's bytes.
@Suite struct TaskEventVectorTests {
  struct Vector: Decodable {
    let sequence: UInt64
    let hex: String
    let type: String
    let timestamp: Int64
    let eventId: String
    let upcastPayloadHex: String?
    let upcastSchemaVersion: UInt16?
    let payloadHex: String?
  }

  static func load(_ name: String) throws -> Vector {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
      .deletingLastPathComponent()
    let data = try Data(contentsOf: root.appendingPathComponent("Specs/vectors/\(name).json"))
    return try JSONDecoder().decode(Vector.self, from: data)
  }

  /// The add of the `task.added` vectors, with a priority, a deadline and a schedule.
  static func noteAdd(priority: Int8, deadline: Int64?, schedule: AddSchedule = .none) -> TaskEvent {
    .added(
      tag: "save-note", payload: Array(#"{"id":7}"#.utf8), dataId: "note-7", groupId: "notes", manual: false,
      unique: .append, priority: priority, deadline: deadline, schedule: schedule)
  }

  static func bytes(_ hex: String) -> [UInt8] {
    var result: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
      let next = hex.index(index, offsetBy: 2)
      result.append(UInt8(hex[index..<next], radix: 16) ?? 0)
      index = next
    }
    return result
  }

  @Test(arguments: [
    ("upcast-002-task-runStarted-v1", TaskEvent.runStarted(42, attempt: 3, owner: "", runner: 0)),
    (
      "upcast-003-task-errorRecorded-v1",
      TaskEvent.errorRecorded(42, message: "Log in to upload", endsRun: true)
    ),
    ("upcast-004-task-added-v1", Self.noteAdd(priority: 0, deadline: nil)),
    ("upcast-005-task-runSucceeded-v1", TaskEvent.runSucceeded(42)),
    ("upcast-006-task-added-v2", Self.noteAdd(priority: 1, deadline: 1_768_467_660_123)),
    (
      "upcast-007-task-runStarted-v2",
      TaskEvent.runStarted(42, attempt: 3, owner: "1f2e-00112233aabbccdd", runner: 7)
    ),
    (
      "task-001-runStarted-v2",
      TaskEvent.runStarted(42, attempt: 3, owner: "1f2e-00112233aabbccdd", runner: 7)
    ),
    // Records of version 2 that were current once: they read as version 3 now.
    ("task-004-added-v2-high-deadline", Self.noteAdd(priority: 1, deadline: 1_768_467_660_123)),
    ("task-005-added-v2-low", Self.noteAdd(priority: -1, deadline: nil)),
  ])
  func olderRecordsUpcastAsSpecified(_ name: String, _ expected: TaskEvent) throws {
    let vector = try Self.load(name)
    let stored = try EventRecord.decode(Self.bytes(vector.hex), sequence: vector.sequence)
    // The vector's own step: the upcaster of the stored version gives the next version's payload.
    if let step = vector.upcastPayloadHex {
      let upcaster = try #require(TaskEvent.upcasters[stored.type]?[stored.storedSchemaVersion])
      #expect(try upcaster(stored.payload) == Self.bytes(step))
      #expect(vector.upcastSchemaVersion == stored.storedSchemaVersion + 1)
    }
    // The catalog's chain: every read sees the current version.
    let upcast = try FerryStore.catalog.upcast(stored)
    #expect(upcast.schemaVersion == TaskEvent.schemaVersions[stored.type])
    #expect(try TaskEvent(upcast) == expected)
    #expect(upcast.payload == expected.payload)
  }

  @Test(arguments: [
    (
      "task-011-runStarted-v3-batch",
      TaskEvent.runStarted(42, attempt: 3, owner: "1f2e-00112233aabbccdd", runner: 7, batch: 40)
    ),
    ("task-002-errorRecorded-v2", TaskEvent.errorRecorded(42, message: "Log in to upload", endsRun: false)),
    ("task-003-payloadUpdated", TaskEvent.payloadUpdated(42, payload: Array(#"{"item":"oat milk"}"#.utf8))),
    ("task-006-expired", TaskEvent.expired(42)),
    (
      "task-009-added-v3-start",
      Self.noteAdd(
        priority: 0, deadline: nil, schedule: AddSchedule(startAt: 1_768_471_200_000, interval: nil))
    ),
    (
      "task-010-added-v3-every",
      Self.noteAdd(
        priority: 0, deadline: nil, schedule: AddSchedule(startAt: 1_768_471_200_000, interval: 900_000))
    ),
    (
      "task-007-runSucceeded-v2",
      TaskEvent.runSucceeded(
        42, details: SuccessDetails(output: Array(#"{"id":"srv-7"}"#.utf8), invalidates: ["notes", "note/7"]))
    ),
    ("task-008-runDeferred", TaskEvent.runDeferred(42, reason: "offline")),
  ])
  func currentEventsEncodeToTheGeneratorsBytes(_ name: String, _ event: TaskEvent) throws {
    let vector = try Self.load(name)
    #expect(event.payload == Self.bytes(vector.payloadHex ?? ""))
    let id = try #require(EventID(bytes: Self.bytes(vector.eventId)))
    let record = try EventRecord.encode(
      type: event.type, schemaVersion: event.schemaVersion, timestamp: vector.timestamp, id: id,
      payload: event.payload, sequence: vector.sequence)
    #expect(record == Self.bytes(vector.hex))
    let decoded = try EventRecord.decode(record, sequence: vector.sequence)
    #expect(decoded.type == vector.type)
    #expect(decoded.schemaVersion == event.schemaVersion)
    #expect(try TaskEvent(FerryStore.catalog.upcast(decoded)) == event)
  }
}
