import Foundation
import PropertyBased
import Testing

@testable import FerryLog

/// One golden vector from `Specs/vectors/record-*.json`.
struct RecordVector: Decodable {
  struct Expected: Decodable {
    let formatVersion: UInt8
    let type: String
    let schemaVersion: UInt16
    let timestamp: Int64
    let eventId: String
    let payloadHex: String
    let crc32c: String
  }
  let description: String
  let sequence: UInt64
  let hex: String
  let expect: Expected?
  let error: String?
}

struct CRCVector: Decodable {
  let description: String
  let inputHex: String
  let crc32c: String
}

func bytes(hex: String) throws -> [UInt8] {
  var result: [UInt8] = []
  var iterator = hex.makeIterator()
  while let high = iterator.next() {
    guard let low = iterator.next(), let h = high.hexDigitValue, let l = low.hexDigitValue else {
      throw FerryLogError.invalidEvent(reason: "bad hex in a vector")
    }
    result.append(UInt8(h << 4 | l))
  }
  return result
}

func vectorFiles(prefix: String) throws -> [URL] {
  let directory = repositoryRoot().appendingPathComponent("Specs/vectors")
  return try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)
    .filter { $0.lastPathComponent.hasPrefix(prefix) && $0.pathExtension == "json" }
    .sorted { $0.lastPathComponent < $1.lastPathComponent }
}

/// The case name and sequence of the error decoding fails with, or nil when it succeeds.
func decodeFailure(_ raw: [UInt8], sequence: UInt64) -> (name: String, sequence: UInt64)? {
  let error: FerryLogError
  do {
    _ = try EventRecord.decode(raw, sequence: sequence)
    return nil
  } catch let caught {
    error = caught
  }
  switch error {
  case .corruptRecord(let sequence, _): return ("corruptRecord", sequence)
  case .unsupportedRecordFormat(let sequence, _, _): return ("unsupportedRecordFormat", sequence)
  default: return ("\(error)", 0)
  }
}

@Suite(.timeLimit(.minutes(20))) struct RecordTests {
  @Test func goldenVectorsDecodeAsSpecified() throws {
    let files = try vectorFiles(prefix: "record-")
    #expect(files.count >= 20)
    var valid = 0
    var invalid = 0
    for file in files {
      let vector = try JSONDecoder().decode(RecordVector.self, from: Data(contentsOf: file))
      let name = file.lastPathComponent
      let raw = try bytes(hex: vector.hex)
      if let expected = vector.expect {
        valid += 1
        let event = try EventRecord.decode(raw, sequence: vector.sequence)
        #expect(event.sequence == vector.sequence, "\(name)")
        #expect(event.type == expected.type, "\(name)")
        #expect(event.schemaVersion == expected.schemaVersion, "\(name)")
        #expect(event.timestamp == expected.timestamp, "\(name)")
        #expect(event.id.hex == expected.eventId, "\(name)")
        #expect(event.payload == (try bytes(hex: expected.payloadHex)), "\(name)")
        #expect(hex32(CRC32C.checksum(raw.dropLast(4))) == expected.crc32c, "\(name)")
        #expect(raw.first == expected.formatVersion, "\(name)")
        // The Swift encoder writes exactly the bytes the independent generator wrote (format 1 only
        // through the encoder kept for reproducing old stores).
        let encoded =
          expected.formatVersion == 1
          ? try EventRecord.encodeFormat1(
            type: event.type, schemaVersion: event.schemaVersion, timestamp: event.timestamp, id: event.id,
            payload: event.payload)
          : try EventRecord.encode(
            type: event.type, schemaVersion: event.schemaVersion, timestamp: event.timestamp, id: event.id,
            payload: event.payload, sequence: vector.sequence)
        #expect(encoded == raw, "\(name)")
      } else {
        invalid += 1
        let failure = decodeFailure(raw, sequence: vector.sequence)
        #expect(failure?.name == vector.error, "\(name): \(failure?.name ?? "decoded")")
        #expect(failure?.sequence == vector.sequence, "\(name)")
      }
    }
    #expect(valid >= 6)
    #expect(invalid >= 14)
  }

  @Test func crc32cMatchesPublishedValues() throws {
    let files = try vectorFiles(prefix: "crc32c")
    let file = try #require(files.first)
    let vectors = try JSONDecoder().decode([CRCVector].self, from: Data(contentsOf: file))
    #expect(vectors.count >= 5)
    for vector in vectors {
      #expect(
        hex32(CRC32C.checksum(try bytes(hex: vector.inputHex))) == vector.crc32c, "\(vector.description)")
    }
    #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
    // The software path too, where the CPU's instruction answers the public calls.
    for vector in vectors {
      let input = try bytes(hex: vector.inputHex)
      #expect(
        hex32(input.withUnsafeBytes { CRC32C.softwareUpdate(0, $0) }) == vector.crc32c,
        "\(vector.description)")
    }
  }

  @Test func hardwareAndSoftwareChecksumsAgree() async {
    // Lengths around the 8-byte steps of both paths, and offsets that misalign the start.
    await propertyCheck(
      count: 300, input: Gen.uint8().array(of: 0...300), Gen.int(in: 0...7), Gen.uint32()
    ) { bytes, offset, start in
      let slice = Array(bytes.dropFirst(min(offset, bytes.count)))
      let public_ = slice.withUnsafeBytes { CRC32C.update(start, $0) }
      let software = slice.withUnsafeBytes { CRC32C.softwareUpdate(start, $0) }
      #expect(public_ == software, "hardware: \(CRC32C.usesHardware)")
    }
  }

  @Test func recordsRoundTrip() async {
    let names = Gen.letterOrNumber.string(of: 1...60)
    let separators = Gen.element(of: [".", "_", ":", "-", ""])
    let payloads = Gen.uint8().array(of: 0...600)
    await propertyCheck(
      count: 300, input: names, separators, Gen.uint16(in: 1...UInt16.max), Gen.int64(), payloads,
      Gen.uint64(in: 1...UInt64.max)
    ) { name, separator, schema, timestamp, payload, sequence in
      let type = name + (separator ?? "") + "x"
      let id = EventID.make(milliseconds: timestamp)
      let record = try #require(
        try? EventRecord.encode(
          type: type, schemaVersion: schema, timestamp: timestamp, id: id, payload: payload,
          sequence: sequence))
      #expect(record.count == EventRecord.overhead + type.utf8.count + payload.count)
      let event = try #require(try? EventRecord.decode(record, sequence: sequence))
      // Stored under any other key, the record says so.
      #expect((try? EventRecord.decode(record, sequence: sequence &+ 1)) == nil)
      #expect(event.sequence == sequence)
      #expect(event.type == type)
      #expect(event.schemaVersion == schema)
      #expect(event.timestamp == timestamp)
      #expect(event.id == id)
      #expect(event.payload == payload)
    }
  }

  @Test func everySingleBitFlipIsDetected() async {
    await propertyCheck(
      count: 200, input: Gen.uint8().array(of: 0...200), Gen.int(in: 0...10_000), Gen.int(in: 0...7)
    ) {
      payload, position, bit in
      var record = try #require(
        try? EventRecord.encode(
          type: "bit.flip", schemaVersion: 1, timestamp: 1, id: EventID.make(milliseconds: 1),
          payload: payload, sequence: 7))
      let index = position % record.count
      record[index] ^= UInt8(1 << bit)
      let decoded = try? EventRecord.decode(record, sequence: 7)
      #expect(decoded == nil, "flipping bit \(bit) of byte \(index) went unnoticed")
    }
  }

  @Test func crcCanBeComputedInPieces() async {
    await propertyCheck(count: 200, input: Gen.uint8().array(of: 0...100), Gen.uint8().array(of: 0...100)) {
      a, b in
      let whole = CRC32C.checksum(a + b)
      let first = CRC32C.checksum(a)
      let pieces = b.withUnsafeBytes { CRC32C.update(first, $0) }
      #expect(whole == pieces)
    }
  }

  @Test func encodingRefusesWhatTheFormatCannotHold() {
    let id = EventID.make()
    #expect(throws: FerryLogError.self) {
      try EventRecord.encode(
        type: String(repeating: "t", count: 300), schemaVersion: 1, timestamp: 0, id: id, payload: [],
        sequence: 1)
    }
    #expect(throws: FerryLogError.self) {
      try EventRecord.encode(type: "t", schemaVersion: 0, timestamp: 0, id: id, payload: [], sequence: 1)
    }
  }

  @Test func eventIdsParseAndPrint() throws {
    let id = try #require(EventID(hex: "0190c6a2-7e1b-7c3d-8e4f-a1b2c3d4e5f6"))
    #expect(id.description == "0190c6a2-7e1b-7c3d-8e4f-a1b2c3d4e5f6")
    #expect(id.hex == "0190c6a27e1b7c3d8e4fa1b2c3d4e5f6")
    #expect(EventID(hex: "xyz") == nil)
    #expect(EventID(bytes: [1, 2, 3]) == nil)
    let a = EventID.make(milliseconds: 1000)
    let b = EventID.make(milliseconds: 2000)
    #expect(a < b)
    #expect(a.bytes[8] >> 6 == 0b10)
  }
}
