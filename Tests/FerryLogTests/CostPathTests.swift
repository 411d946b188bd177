import Foundation
import PropertyBased
import Testing

@testable import FerryLog

/// The cheaper paths of the write and read side (issue 16) keep what the slower ones promised:
/// event ids in their layout and order, strings read from payloads exactly as written (and
/// refused when they are not UTF-8), record types matched by their bytes, the head mark raised
/// after each commit.
@Suite struct CostPathTests {
  @Test func newIdsKeepTheVersion7LayoutAndSortByTheirBytes() async {
    await propertyCheck(count: 300, input: Gen.int64(in: 0...(1 << 47)), Gen.int64(in: 0...(1 << 47))) {
      a, b in
      let first = EventID.make(milliseconds: a)
      let second = EventID.make(milliseconds: b)
      for (id, ms) in [(first, a), (second, b)] {
        let bytes = id.bytes
        #expect(bytes.count == 16)
        #expect(bytes[0..<6].reduce(Int64(0)) { $0 << 8 | Int64($1) } == ms)
        #expect(bytes[6] >> 4 == 7, "version nibble of \(id)")
        #expect(bytes[8] >> 6 == 2, "variant bits of \(id)")
        #expect(EventID(bytes: bytes) == id)
        #expect(EventID(hex: id.hex) == id)
      }
      #expect((first < second) == first.bytes.lexicographicallyPrecedes(second.bytes))
      #expect((first == second) == (first.bytes == second.bytes))
      let withBytes = first.withBytes { Array($0) }
      #expect(withBytes == first.bytes)
    }
  }

  @Test func idsOfAnyBytesKeepThem() async {
    await propertyCheck(count: 200, input: Gen.uint8().array(of: 16...16), Gen.uint8().array(of: 16...16)) {
      a, b in
      let x = try #require(EventID(bytes: a))
      let y = try #require(EventID(bytes: b))
      #expect(x.bytes == a)
      #expect((x < y) == a.lexicographicallyPrecedes(b))
      #expect((x == y) == (a == b))
      #expect(Set([x, y]).count == (a == b ? 1 : 2))
    }
  }

  @Test func stringsReadFromPayloadsAreTheStringsWritten() async {
    let pieces = ["a", "Zz09", "é", "日本語", "😀", "\u{0}", "\u{7F}", " ", "longer ascii text!"]
    await propertyCheck(
      count: 300, input: Gen.element(of: pieces).array(of: 0...12), Gen.uint8().array(of: 0...20)
    ) {
      parts, bytes in
      let text = parts.compactMap { $0 }.joined()
      var writer = PayloadWriter()
      writer.write(text)
      writer.write(bytes: bytes)
      writer.write(String?.some(text + "x"))
      var reader = PayloadReader(writer.bytes)
      #expect((try? reader.readString("a")) == text)
      #expect((try? reader.skipBytes("b")) == [])
      #expect((try? reader.readOptionalString("c")) == text + "x")
      #expect(reader.remaining == 0)
    }
  }

  @Test func bytesThatAreNotUTF8AreRefusedAsAString() {
    for bad: [UInt8] in [
      [0xFF], [0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0xC3], [0xED, 0xA0, 0x80], [0x80],
    ] {
      var writer = PayloadWriter()
      writer.write(bytes: bad)
      var reader = PayloadReader(writer.bytes)
      #expect(throws: PayloadError.self) { try reader.readString("name") }
    }
    // A length past the end is refused by both the string read and the skip.
    var short = PayloadReader([0, 0, 0, 9, 0x61])
    #expect(throws: PayloadError.self) { try short.readString("name") }
    var skipped = PayloadReader([0, 0, 0, 9, 0x61])
    #expect(throws: PayloadError.self) { try skipped.skipBytes("blob") }
  }

  @Test func recordTypesAreMatchedByTheirBytesAgainstTheCatalog() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    do {
      // Written without a catalog: old versions, and a type the catalog below does not know.
      let log = try store.open()
      _ = try await log.append([
        NewEvent(type: "item.added", payload: [1]), NewEvent(type: "item.renamedLongName", payload: [2]),
        NewEvent(type: "item.renamedLongName", schemaVersion: 2, payload: [3]),
        NewEvent(type: "item.added2", payload: []),
      ])
      log.close()
    }
    let catalog = EventCatalog([
      .init("item.added"), .init("item.renamedLongName", version: 2, upcasters: [1: { $0 + [9] }]),
    ])
    let log = try store.open(catalog: catalog)
    defer { log.close() }
    for (sequence, type, stored, payload) in [
      (UInt64(1), "item.added", UInt16(1), [UInt8]([1])), (2, "item.renamedLongName", 1, [2, 9]),
      (3, "item.renamedLongName", 2, [3]),
    ] {
      let event = try #require(try log.event(at: sequence))
      #expect(event.type == type)
      #expect(event.payload == payload)
      #expect(event.storedSchemaVersion == stored)
      #expect(event.schemaVersion == (type == "item.added" ? 1 : 2))
    }
    // A type the catalog does not know is still named in the error.
    do {
      _ = try log.event(at: 4)
      Issue.record("an event of an unknown type was read")
    } catch FerryLogError.unknownEventType(let type, let sequence) {
      #expect(type == "item.added2")
      #expect(sequence == 4)
    }
  }

  @Test func theHeadMarkFollowsCommitsAndKeepsAHigherMark() async throws {
    let store = TemporaryStore()
    defer { store.remove() }
    let log = try store.open()
    defer { log.close() }
    _ = try await log.append((0..<3).map { _ in NewEvent(type: "a", payload: []) })
    guard case .mark(let first) = HeadMark.read(in: store.path) else {
      Issue.record("no readable head mark after a commit")
      return
    }
    #expect(first.head == 3)
    #expect(!first.isCreating)
    // A damaged mark says nothing: the next commit writes its own head.
    let path = HeadMark.path(in: store.path)
    var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
    bytes[30] ^= 0x40
    try Data(bytes).write(to: URL(fileURLWithPath: path))
    #expect(HeadMark.read(in: store.path) == .unreadable)
    _ = try await log.append(NewEvent(type: "a", payload: []))
    #expect(HeadMark.read(in: store.path) == .mark(HeadMark.Contents(storeId: first.storeId, head: 4)))
    #expect(EventLog.acknowledgedHead(in: store.path) == 4)
    // Another process raised it further: a commit below that leaves it.
    HeadMark.write(HeadMark.Contents(storeId: first.storeId, head: 100), in: store.path)
    _ = try await log.append(NewEvent(type: "a", payload: []))
    #expect(HeadMark.read(in: store.path) == .mark(HeadMark.Contents(storeId: first.storeId, head: 100)))
  }
}
