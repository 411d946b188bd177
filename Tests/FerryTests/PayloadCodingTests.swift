import FerryLog
import Foundation
import PropertyBased
import Testing

@_spi(Engine) @testable import Ferry

/// A JSON-shaped value built from a list of numbers (so that failures shrink to small values),
/// encoded through every kind of container an `Encodable` type uses.
indirect enum JSONShape: Encodable, Sendable, CustomStringConvertible {
  case string(String)
  case int(Int64)
  case byte(UInt8)
  case bool(Bool)
  case null
  case array([JSONShape])
  case object([String: JSONShape])
  /// A struct with synthesized coding: optional fields (left out when nil), a nested struct,
  /// arrays and dictionaries.
  case record(ShapeRecord)

  /// Strings with every kind of character JSON escapes, and some it does not.
  static let pieces = [
    "a", "Z", "/", "\"", "\\", "\n", "\r", "\t", "\u{08}", "\u{0C}", "\u{01}", "\u{1F}", "\u{7F}", "é", "日本",
    "😀", " ", "0", "key", "Key", "_",
  ]

  init(_ numbers: inout ArraySlice<Int>, depth: Int = 0) {
    let n = numbers.popFirst() ?? 0
    func text() -> String {
      let count = (numbers.popFirst() ?? 0) % 4
      return (0..<count).map { _ in Self.pieces[(numbers.popFirst() ?? 0) % Self.pieces.count] }.joined()
    }
    switch depth > 3 ? n % 5 : n % 8 {
    case 0: self = .string(text())
    case 1: self = .int(Int64(n) &* (n % 3 == 0 ? -7_919 : 104_729) &* (n % 5 == 0 ? 1 << 40 : 1))
    case 2: self = .byte(UInt8(truncatingIfNeeded: n))
    case 3: self = .bool(n % 2 == 0)
    case 4: self = .null
    case 5:
      let count = (numbers.popFirst() ?? 0) % 4
      self = .array((0..<count).map { _ in JSONShape(&numbers, depth: depth + 1) })
    case 6:
      var object: [String: JSONShape] = [:]
      for _ in 0..<((numbers.popFirst() ?? 0) % 4) { object[text()] = JSONShape(&numbers, depth: depth + 1) }
      self = .object(object)
    default: self = .record(ShapeRecord(&numbers, depth: depth + 1))
    }
  }

  func encode(to encoder: any Encoder) throws {
    switch self {
    case .string(let value):
      var container = encoder.singleValueContainer()
      try container.encode(value)
    case .int(let value):
      var container = encoder.singleValueContainer()
      try container.encode(value)
    case .byte(let value):
      var container = encoder.singleValueContainer()
      try container.encode(value)
    case .bool(let value):
      var container = encoder.singleValueContainer()
      try container.encode(value)
    case .null:
      var container = encoder.singleValueContainer()
      try container.encodeNil()
    case .array(let values):
      var container = encoder.unkeyedContainer()
      for value in values { try container.encode(value) }
    case .object(let values):
      try values.encode(to: encoder)
    case .record(let record):
      try record.encode(to: encoder)
    }
  }

  var description: String {
    String(decoding: (try? JSONEncoder().encode(self)) ?? Data(), as: UTF8.self)
  }
}

struct ShapeRecord: Encodable, Sendable {
  var title: String
  var count: Int
  var note: String?
  var flags: [Bool]
  var byNumber: [Int: String]
  var inner: Inner?
  var zUpper: UInt64
  var Alpha: Int8

  struct Inner: Encodable, Sendable {
    var value: JSONShape
    var id: UInt32
  }

  init(_ numbers: inout ArraySlice<Int>, depth: Int) {
    let n = numbers.popFirst() ?? 0
    title = JSONShape.pieces[n % JSONShape.pieces.count] + JSONShape.pieces[(n / 7) % JSONShape.pieces.count]
    count = n &* 31 - 500
    note = n % 3 == 0 ? nil : JSONShape.pieces[(n / 3) % JSONShape.pieces.count]
    flags = (0..<(n % 3)).map { $0 % 2 == 0 }
    // Two keys that may coincide (n = 70: both 0): a literal with them would trap.
    byNumber =
      n % 4 == 0
      ? [:] : Dictionary([(n % 10, "x"), (-(n % 7), "/")], uniquingKeysWith: { first, _ in first })
    inner = depth > 3 || n % 2 == 0 ? nil : Inner(value: JSONShape(&numbers, depth: depth + 1), id: UInt32(n))
    zUpper = UInt64(n) << 33
    Alpha = Int8(truncatingIfNeeded: n)
  }
}

/// Values the direct writer leaves to `JSONEncoder`.
struct WithDouble: Encodable { var name = "a"; var score = 1.5 }
struct WithDate: Encodable { var at = Date(timeIntervalSince1970: 1_700_000_000) }
struct WithData: Encodable { var blob = Data([1, 2, 3]) }
struct WithURL: Encodable { var link = URL(fileURLWithPath: "/tmp/x") }
struct WithDecimal: Encodable { var amount = Decimal(string: "12.50") ?? 0 }
struct Nested: Encodable {
  enum Keys: String, CodingKey { case outer, inner }
  func encode(to encoder: any Encoder) throws {
    var container = encoder.container(keyedBy: Keys.self)
    var nested = container.nestedContainer(keyedBy: Keys.self, forKey: .outer)
    try nested.encode(1, forKey: .inner)
  }
}
struct TwiceTheSameKey: Encodable {
  enum Keys: String, CodingKey { case key }
  func encode(to encoder: any Encoder) throws {
    var container = encoder.container(keyedBy: Keys.self)
    try container.encode(1, forKey: .key)
    try container.encode(2, forKey: .key)
  }
}
struct EncodesNothing: Encodable {
  func encode(to encoder: any Encoder) throws {}
}
struct Failing: Encodable {
  struct Refused: Error {}
  func encode(to encoder: any Encoder) throws {
    var container = encoder.unkeyedContainer()
    try container.encode(1)
    throw Refused()
  }
}

@Suite struct PayloadCodingTests {
  static func reference(_ value: some Encodable) throws -> [UInt8] {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return Array(try encoder.encode(value))
  }

  @Test func directJSONIsJSONEncodersBytes() async {
    await propertyCheck(count: 400, input: Gen.int(in: 0...10_000).array(of: 1...60)) { numbers in
      var slice = numbers[...]
      let value = JSONShape(&slice)
      let direct = PayloadJSON.encode(value)
      let expected = try #require(try? Self.reference(value), "JSONEncoder refused \(value)")
      // Strings, integers, booleans, nil, arrays, dictionaries and structs: always written directly.
      #expect(direct == expected, "\(value)")
      #expect((try? TaskQueue.encode(value)) == expected)
    }
  }

  @Test func aStructWithKeysOutOfOrderIsSortedByBytes() throws {
    struct Item: Encodable { var name = "milk"; var count = 2; var Zone = "a/b"; var aisle: Int? = nil }
    let direct = try #require(PayloadJSON.encode(Item()))
    #expect(String(decoding: direct, as: UTF8.self) == #"{"Zone":"a\/b","count":2,"name":"milk"}"#)
    #expect(direct == (try Self.reference(Item())))
  }

  @Test func whatTheDirectWriterDoesNotKnowGoesToJSONEncoder() throws {
    #expect(PayloadJSON.encode(WithDouble()) == nil)
    #expect(try TaskQueue.encode(WithDouble()) == (try Self.reference(WithDouble())))
    #expect(PayloadJSON.encode(WithDate()) == nil)
    #expect(try TaskQueue.encode(WithDate()) == (try Self.reference(WithDate())))
    #expect(PayloadJSON.encode(WithData()) == nil)
    #expect(try TaskQueue.encode(WithData()) == (try Self.reference(WithData())))
    #expect(PayloadJSON.encode(WithURL()) == nil)
    #expect(try TaskQueue.encode(WithURL()) == (try Self.reference(WithURL())))
    #expect(PayloadJSON.encode(WithDecimal()) == nil)
    #expect(try TaskQueue.encode(WithDecimal()) == (try Self.reference(WithDecimal())))
    #expect(PayloadJSON.encode(Nested()) == nil)
    #expect(try TaskQueue.encode(Nested()) == (try Self.reference(Nested())))
    #expect(PayloadJSON.encode(TwiceTheSameKey()) == nil)
    #expect(try TaskQueue.encode(TwiceTheSameKey()) == (try Self.reference(TwiceTheSameKey())))
    #expect(PayloadJSON.encode(EncodesNothing()) == nil)
    #expect(PayloadJSON.encode([1.5, 2]) == nil)
    #expect(PayloadJSON.encode(["a": Date(timeIntervalSince1970: 0)]) == nil)
    // An error the value throws is the caller's, as before.
    #expect(PayloadJSON.encode(Failing()) == nil)
    #expect(throws: FerryError.self) { try TaskQueue.encode(Failing()) }
  }

  @Test func aPayloadWrittenDirectlyDecodesAsItsType() async throws {
    struct Photo: Codable, Equatable, Sendable {
      var name: String; var size: Int; var tags: [String]; var album: String?
    }
    let store = try await FerryStore.open(
      at: FileManager.default.temporaryDirectory.path + "/ferry-json-\(UUID().uuidString.prefix(8))")
    defer {
      store.close()
      try? FileManager.default.removeItem(atPath: store.log.path)
    }
    let photo = Photo(name: "cat \"1\"/2.jpg", size: 1 << 40, tags: ["a", "é", "\n"], album: nil)
    let id = try await store.queue.add(tag: "upload", payload: photo)
    #expect(try store.queue.payload(of: id, as: Photo.self) == photo)
  }

  /// The task row's stored layout (`Specs/task-events.md` §3.1), written field by field with a
  /// `PayloadWriter`: what `TaskRow.bytes` must equal, whatever writes it.
  static func referenceRow(_ row: TaskRow) -> [UInt8] {
    var writer = PayloadWriter()
    writer.write(row.tag)
    writer.write(row.dataId)
    writer.write(row.groupId)
    writer.write(row.manual)
    writer.write(row.status.rawValue)
    writer.write(row.attempts)
    writer.write(row.eligibleAt)
    writer.write(row.addedAt)
    writer.write(row.lastFailure)
    writer.write(row.errorCount)
    writer.write(row.claim?.owner)
    writer.write(row.claim?.runner ?? 0)
    writer.write(row.claim?.attempt ?? 0)
    writer.write(UInt8(bitPattern: row.priority))
    writer.write(row.deadline)
    writer.write(row.givenBack)
    writer.write(row.startAt)
    writer.write(row.interval)
    return writer.bytes
  }

  @Test func rowsAreWrittenInTheirLayoutAndReadBack() async {
    let texts = Gen.element(of: JSONShape.pieces).array(of: 0...5)
    await propertyCheck(count: 300, input: texts, texts, Gen.int(in: 0...1_000_000), Gen.int64()) {
      pieces, others, n, time in
      let a = pieces.compactMap { $0 }
      let b = others.compactMap { $0 }
      var row = TaskRow(
        tag: a.joined().isEmpty ? "t" : a.joined(), dataId: n % 2 == 0 ? b.joined() : nil,
        groupId: n % 3 == 0 ? nil : a.joined() + "g", manual: n % 5 == 0,
        status: TaskRow.Status(rawValue: UInt8(n % 5)) ?? .ready, attempts: UInt32(n),
        eligibleAt: n % 4 == 0 ? time : nil,
        addedAt: time, lastFailure: n % 7 == 0 ? b.joined() + "failed" : nil, errorCount: UInt32(n / 3),
        priority: Int8(truncatingIfNeeded: n), deadline: n % 6 == 0 ? time / 2 : nil)
      if n % 2 == 1 {
        row.claim = TaskRow.Claim(owner: b.joined(), runner: UInt32(n), attempt: UInt32(n / 2))
      }
      row.givenBack = UInt32(n / 7)
      if n % 3 == 1 { row.startAt = time / 3 }
      if n % 4 == 1 { row.interval = Int64(n) + 1 }
      #expect(row.bytes == Self.referenceRow(row))
      #expect((try? TaskRow(bytes: row.bytes)) == row)
    }
  }

  @Test func everyQueueEventReadsBackAsWritten() async {
    let texts = Gen.element(of: JSONShape.pieces).array(of: 0...5)
    await propertyCheck(count: 300, input: texts, Gen.uint8().array(of: 0...40), Gen.int(in: 0...1_000_000)) {
      pieces, bytes, n in
      let text = pieces.compactMap { $0 }
      let id = TaskID(rawValue: UInt64(n) << 20 | 7)
      let events: [TaskEvent] = [
        .added(
          tag: text.joined() + "t", payload: bytes, dataId: n % 2 == 0 ? text.joined() : nil,
          groupId: n % 3 == 0 ? nil : "g", manual: n % 5 == 0, unique: [.append, .keep, .replace][n % 3],
          priority: Int8(truncatingIfNeeded: n), deadline: n % 4 == 0 ? Int64(n) * -3 : nil,
          schedule: AddSchedule(
            startAt: n % 3 == 1 ? Int64(n) * 7 : nil, interval: n % 5 == 2 ? Int64(n) + 1 : nil)),
        .runStarted(
          id, attempt: UInt32(n), owner: text.joined(), runner: UInt32(n / 2),
          batch: n % 3 == 0 ? TaskID(rawValue: id.rawValue - 1) : nil),
        .runSucceeded(id),
        .runSucceeded(
          id,
          details: SuccessDetails(
            output: n % 2 == 0 ? bytes : nil, invalidates: n % 3 == 0 ? [] : text + ["k"])),
        .runDeferred(id, reason: text.joined()),
        .runFailed(
          id, message: text.joined(), retryable: n % 2 == 0, nextEligibleAt: n % 3 == 0 ? nil : Int64(n)),
        .runInterrupted(id), .errorRecorded(id, message: text.joined(), endsRun: n % 2 == 1),
        .errorResolved(id),
        .cancelled(id), .expired(id), .revived(id), .payloadUpdated(id, payload: bytes), .cleared, .paused,
        .resumed,
      ]
      for event in events {
        let logged = LoggedEvent(
          sequence: 9, type: event.type, schemaVersion: event.schemaVersion, timestamp: 1, id: EventID.make(),
          payload: event.payload)
        #expect((try? TaskEvent(logged)) == event)
        // The fold's decoding is the same, but for the payload bytes it never reads.
        let folded = try? TaskEvent.forFold(logged)
        switch event {
        case .added(
          let tag, _, let dataId, let groupId, let manual, let unique, let priority, let deadline,
          let schedule):
          #expect(
            folded
              == .added(
                tag: tag, payload: [], dataId: dataId, groupId: groupId, manual: manual, unique: unique,
                priority: priority, deadline: deadline, schedule: schedule))
        case .payloadUpdated(let task, _): #expect(folded == .payloadUpdated(task, payload: []))
        default: #expect(folded == event)
        }
      }
      let other = LoggedEvent(
        sequence: 9, type: "cache.fetched", schemaVersion: 1, timestamp: 1, id: EventID.make(), payload: bytes
      )
      switch Result(catching: { try TaskEvent.forFold(other) }) {
      case .success(let decoded): #expect(decoded == nil)
      case .failure(let error): Issue.record("another side's event did not pass: \(error)")
      }
      #expect(throws: FerryError.self) { try TaskEvent(other) }
    }
  }
}
