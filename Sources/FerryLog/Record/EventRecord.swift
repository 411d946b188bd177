/// The on-disk record of one event, as specified in `Specs/event-format.md`. Format 2 (written):
///
/// ```
/// u8   formatVersion      (2)
/// u8   typeLength         (1...64)
/// [..] type               (ASCII: A-Z a-z 0-9 . _ : -)
/// u16  schemaVersion
/// i64  timestamp          (Unix milliseconds)
/// [16] eventId
/// u32  payloadLength
/// [..] payload
/// u64  sequence           (the key it is stored under; format 2 only)
/// u32  crc32c             (of every byte before it)
/// ```
///
/// Format 1 (still read, never written) is the same without `sequence`: a record of format 1
/// cannot tell whether it is stored under the right key. Every integer is big-endian. Decoding
/// checks, in order: the minimum length, the CRC, the format version, each field, then (format 2)
/// that the sequence inside the record is the one it is stored under.
package enum EventRecord {
  /// The record format this code writes and the newest it reads.
  public static let formatVersion: UInt8 = 2
  /// The longest event type, in bytes.
  public static let maxTypeLength = 64
  /// The largest payload the format can hold (its length is a u32), less the record's own bytes.
  public static let maxPayloadSize = Int(UInt32.max) - overhead - maxTypeLength
  /// Bytes a format 2 record adds around its type and payload.
  public static let overhead = 1 + 1 + 2 + 8 + 16 + 4 + 8 + 4
  /// Bytes a format 1 record added around its type and payload (no sequence).
  public static let format1Overhead = overhead - 8

  /// Whether `type` is a valid event type name.
  public static func isValidType(_ type: String) -> Bool {
    let utf8 = type.utf8
    guard (1...maxTypeLength).contains(utf8.count) else { return false }
    // Over the string's own bytes when it has them in a row (every native string does): the
    // byte-wise walk of the UTF-8 view costs every decoded record some hundred instructions more.
    if let valid = utf8.withContiguousStorageIfAvailable({ $0.allSatisfy(isTypeByte) }) { return valid }
    return utf8.allSatisfy(isTypeByte)
  }

  private static func isTypeByte(_ byte: UInt8) -> Bool {
    (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
      || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ":")
      || byte == UInt8(ascii: "-")
  }

  /// A format 2 record without its sequence and CRC yet: everything the appending caller can
  /// encode (and checksum) before the writer gives it a sequence number. ``sealed(at:)`` finishes it
  /// with 12 bytes of work on the writer thread.
  public struct Unsealed: Sendable {
    /// Every byte before the sequence.
    public let body: [UInt8]
    /// CRC-32C of `body`.
    public let bodyCRC: UInt32

    /// The complete record, stored under `sequence`.
    public func sealed(at sequence: UInt64) -> [UInt8] {
      let count = body.count
      let crc = withUnsafeBytes(of: sequence.bigEndian) { CRC32C.update(bodyCRC, $0) }
      return makeBytes(count: count + 12) { out in
        body.withUnsafeBytes { out.copyMemory(from: $0) }
        out.storeBytes(of: sequence.bigEndian, toByteOffset: count, as: UInt64.self)
        out.storeBytes(of: crc.bigEndian, toByteOffset: count + 8, as: UInt32.self)
      }
    }
  }

  /// Encodes the part of a format 2 record that precedes its sequence number;
  /// ``FerryLogError/invalidEvent(reason:)`` for a type that is not a valid name, schema version 0,
  /// or a payload larger than ``maxPayloadSize``.
  public static func encodeUnsealed(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8]
  ) throws(FerryLogError) -> Unsealed {
    try encodeUnsealed(
      type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id, payload: payload,
      typeChecked: false)
  }

  /// ``encodeUnsealed(type:schemaVersion:timestamp:id:payload:)`` for a caller that has checked
  /// `type` with ``isValidType(_:)`` already (the append path: once an event, not twice).
  static func encodeUnsealed(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8], typeChecked: Bool
  ) throws(FerryLogError) -> Unsealed {
    let body = try encodeBody(
      format: formatVersion, type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id,
      payload: payload, spare: 12, typeChecked: typeChecked)
    return Unsealed(body: body, bodyCRC: body.withUnsafeBytes { CRC32C.checksum($0) })
  }

  /// Encodes one complete format 2 record stored under `sequence`.
  public static func encode(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8], sequence: UInt64
  ) throws(FerryLogError) -> [UInt8] {
    try encodeUnsealed(
      type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id, payload: payload
    )
    .sealed(at: sequence)
  }

  /// Encodes a record of the old format 1 (no sequence inside): never written by Ferry any more;
  /// for tests and tools that reproduce stores written before format 2.
  public static func encodeFormat1(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8]
  ) throws(FerryLogError) -> [UInt8] {
    var bytes = try encodeBody(
      format: 1, type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id, payload: payload,
      spare: 4)
    var crc = bytes.withUnsafeBytes { CRC32C.checksum($0) }.bigEndian
    withUnsafeBytes(of: &crc) { bytes.append(contentsOf: $0) }
    return bytes
  }

  private static func encodeBody(
    format: UInt8, type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8],
    spare: Int, typeChecked: Bool = false
  ) throws(FerryLogError) -> [UInt8] {
    guard typeChecked || isValidType(type) else {
      throw .invalidEvent(
        reason: "event type '\(type)' must be 1 to \(maxTypeLength) characters from A-Z a-z 0-9 . _ : -")
    }
    guard schemaVersion >= 1 else { throw .invalidEvent(reason: "schema versions start at 1") }
    guard payload.count <= maxPayloadSize else {
      throw .invalidEvent(
        reason: "a payload of \(payload.count) bytes exceeds the format's maximum of \(maxPayloadSize)")
    }
    var writer = ByteWriter(capacity: overhead - 12 + type.utf8.count + payload.count + spare)
    writer.write(format)
    writer.write(UInt8(type.utf8.count))
    writer.bytes.append(contentsOf: type.utf8)
    writer.write(schemaVersion)
    writer.write(timestamp)
    writer.write(id.high)
    writer.write(id.low)
    writer.write(UInt32(payload.count))
    writer.write(payload)
    return writer.bytes
  }

  /// Decodes the record stored at `sequence`, checking its CRC first.
  ///
  /// Throws ``FerryLogError/corruptRecord(sequence:reason:)`` (naming `sequence`) for a CRC mismatch,
  /// malformed bytes, or a format 2 record that holds another sequence than the one it is stored
  /// under; ``FerryLogError/unsupportedRecordFormat(sequence:version:supported:)`` for a record
  /// written by a newer format.
  public static func decode(
    _ bytes: UnsafeRawBufferPointer, sequence: UInt64
  ) throws(FerryLogError) -> LoggedEvent {
    try decode(bytes, sequence: sequence) { _ in nil }
  }

  /// ``decode(_:sequence:)`` with `name` asked first for the type's string (and whether it is a
  /// valid name) given its bytes: a catalog hands its own, so that no string is made per record.
  static func decode(
    _ bytes: UnsafeRawBufferPointer, sequence: UInt64,
    name: (UnsafeRawBufferPointer) -> (String, isValid: Bool)?
  ) throws(FerryLogError) -> LoggedEvent {
    let (header, payload) = try decodeInPlace(bytes, sequence: sequence, name: name)
    return LoggedEvent(header, payload: Array(payload))
  }

  /// ``decode(_:sequence:name:)`` without copying the payload: the record's fields and its
  /// payload where it lies in `bytes` (every check is the same).
  static func decodeInPlace(
    _ bytes: UnsafeRawBufferPointer, sequence: UInt64,
    name: (UnsafeRawBufferPointer) -> (String, isValid: Bool)?
  ) throws(FerryLogError) -> (RecordHeader, UnsafeRawBufferPointer) {
    guard bytes.count >= format1Overhead + 1 else {
      throw .corruptRecord(
        sequence: sequence,
        reason: "record of \(bytes.count) bytes is shorter than the minimum \(format1Overhead + 1)")
    }
    let version = bytes[0]
    let body = UnsafeRawBufferPointer(rebasing: bytes[0..<(bytes.count - 4)])
    let stored =
      UInt32(bytes[bytes.count - 4]) << 24 | UInt32(bytes[bytes.count - 3]) << 16
      | UInt32(bytes[bytes.count - 2]) << 8 | UInt32(bytes[bytes.count - 1])
    let computed = CRC32C.checksum(body)
    guard stored == computed else {
      throw .corruptRecord(
        sequence: sequence,
        reason: "CRC32C mismatch: stored \(hex32(stored)), computed \(hex32(computed))")
    }
    // Checked after the CRC, so that a damaged first byte reads as damage, not as a newer format.
    if version > formatVersion {
      throw .unsupportedRecordFormat(sequence: sequence, version: version, supported: formatVersion)
    }
    guard version >= 1 else {
      throw .corruptRecord(sequence: sequence, reason: "format version \(version) is not valid")
    }
    do {
      var reader = ByteReader(body)
      reader.offset = 1
      let typeLength = Int(try reader.read(UInt8.self, "typeLength"))
      let typeBytes = try reader.readBuffer(count: typeLength, "type")
      let type: String
      let known = name(typeBytes)
      if let known, known.isValid {
        type = known.0
      } else {
        type = known?.0 ?? String(decoding: typeBytes, as: UTF8.self)
        guard isValidType(type) else { throw RecordDecodingFailure("event type is not a valid name") }
      }
      let schemaVersion = try reader.read(UInt16.self, "schemaVersion")
      guard schemaVersion >= 1 else { throw RecordDecodingFailure("schema version 0 is not valid") }
      let timestamp = try reader.read(Int64.self, "timestamp")
      let id = EventID(
        high: try reader.read(UInt64.self, "eventId"), low: try reader.read(UInt64.self, "eventId"))
      let payloadLength = Int(try reader.read(UInt32.self, "payloadLength"))
      let payload = try reader.readBuffer(count: payloadLength, "payload")
      if version >= 2 {
        let recorded = try reader.read(UInt64.self, "sequence")
        guard reader.remaining == 0 else {
          throw RecordDecodingFailure("\(reader.remaining) bytes follow the sequence")
        }
        guard recorded == sequence else {
          throw RecordDecodingFailure(
            "it is stored under sequence \(sequence) but was written as sequence \(recorded)")
        }
      }
      guard reader.remaining == 0 else {
        throw RecordDecodingFailure("\(reader.remaining) bytes follow the payload")
      }
      let header = RecordHeader(
        sequence: sequence, type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id)
      return (header, payload)
    } catch let failure as RecordDecodingFailure {
      throw .corruptRecord(sequence: sequence, reason: failure.reason)
    } catch {
      throw .corruptRecord(sequence: sequence, reason: "\(error)")
    }
  }

  /// Decodes a record held in an array.
  public static func decode(_ bytes: [UInt8], sequence: UInt64) throws(FerryLogError) -> LoggedEvent {
    do {
      return try bytes.withUnsafeBytes { buffer in try decode(buffer, sequence: sequence) }
    } catch let error as FerryLogError {
      throw error
    } catch {
      throw .corruptRecord(sequence: sequence, reason: "\(error)")
    }
  }
}

func hex32(_ value: UInt32) -> String {
  let digits = String(value, radix: 16)
  return "0x" + String(repeating: "0", count: max(0, 8 - digits.count)) + digits
}
