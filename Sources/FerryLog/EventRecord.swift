/// The on-disk record of one event, as specified in `Specs/event-format.md`:
///
/// ```
/// u8   formatVersion      (1)
/// u8   typeLength         (1...64)
/// [..] type               (ASCII: A-Z a-z 0-9 . _ : -)
/// u16  schemaVersion
/// i64  timestamp          (Unix milliseconds)
/// [16] eventId
/// u32  payloadLength
/// [..] payload
/// u32  crc32c             (of every byte before it)
/// ```
///
/// Every integer is big-endian. Decoding checks, in order: the minimum length, the CRC, the
/// format version, then each field.
public enum EventRecord {
  /// The record format this code writes and the newest it reads.
  public static let formatVersion: UInt8 = 1
  /// The longest event type, in bytes.
  public static let maxTypeLength = 64
  /// The largest payload the format can hold (its length is a u32), less the record's own bytes.
  public static let maxPayloadSize = Int(UInt32.max) - overhead - maxTypeLength
  /// Bytes a record adds around its type and payload.
  public static let overhead = 1 + 1 + 2 + 8 + 16 + 4 + 4

  /// Whether `type` is a valid event type name.
  public static func isValidType(_ type: String) -> Bool {
    let utf8 = type.utf8
    guard (1...maxTypeLength).contains(utf8.count) else { return false }
    return utf8.allSatisfy { byte in
      (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
        || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ":")
        || byte == UInt8(ascii: "-")
    }
  }

  /// Encodes one record; ``FerryLogError/invalidEvent(reason:)`` for a type that is not a valid
  /// name, schema version 0, or a payload larger than ``maxPayloadSize``.
  public static func encode(
    type: String, schemaVersion: UInt16, timestamp: Int64, id: EventID, payload: [UInt8]
  ) throws(FerryLogError) -> [UInt8] {
    guard isValidType(type) else {
      throw .invalidEvent(
        reason: "event type '\(type)' must be 1 to \(maxTypeLength) characters from A-Z a-z 0-9 . _ : -")
    }
    guard schemaVersion >= 1 else { throw .invalidEvent(reason: "schema versions start at 1") }
    guard payload.count <= maxPayloadSize else {
      throw .invalidEvent(
        reason: "a payload of \(payload.count) bytes exceeds the format's maximum of \(maxPayloadSize)")
    }
    let typeBytes = Array(type.utf8)
    var writer = ByteWriter(capacity: overhead + typeBytes.count + payload.count)
    writer.write(formatVersion)
    writer.write(UInt8(typeBytes.count))
    writer.write(typeBytes)
    writer.write(schemaVersion)
    writer.write(timestamp)
    writer.write(id.bytes)
    writer.write(UInt32(payload.count))
    writer.write(payload)
    let crc = writer.bytes.withUnsafeBytes { CRC32C.checksum($0) }
    writer.write(crc)
    return writer.bytes
  }

  /// Decodes the record stored at `sequence`, checking its CRC first.
  ///
  /// Throws ``FerryLogError/corruptRecord(sequence:reason:)`` (naming `sequence`) for a CRC mismatch or
  /// malformed bytes, and ``FerryLogError/unsupportedRecordFormat(sequence:version:supported:)`` for a
  /// record written by a newer format.
  public static func decode(
    _ bytes: UnsafeRawBufferPointer, sequence: UInt64
  ) throws(FerryLogError) -> LoggedEvent {
    guard bytes.count >= overhead + 1 else {
      throw .corruptRecord(
        sequence: sequence,
        reason: "record of \(bytes.count) bytes is shorter than the minimum \(overhead + 1)")
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
    guard version == formatVersion else {
      throw .corruptRecord(sequence: sequence, reason: "format version \(version) is not valid")
    }
    do {
      var reader = ByteReader(body)
      reader.offset = 1
      let typeLength = Int(try reader.read(UInt8.self, "typeLength"))
      let typeBytes = try reader.read(count: typeLength, "type")
      let type = String(decoding: typeBytes, as: UTF8.self)
      guard isValidType(type) else { throw RecordDecodingFailure("event type is not a valid name") }
      let schemaVersion = try reader.read(UInt16.self, "schemaVersion")
      guard schemaVersion >= 1 else { throw RecordDecodingFailure("schema version 0 is not valid") }
      let timestamp = try reader.read(Int64.self, "timestamp")
      let id = EventID(uncheckedBytes: try reader.read(count: 16, "eventId"))
      let payloadLength = Int(try reader.read(UInt32.self, "payloadLength"))
      let payload = try reader.read(count: payloadLength, "payload")
      guard reader.remaining == 0 else {
        throw RecordDecodingFailure("\(reader.remaining) bytes follow the payload")
      }
      return LoggedEvent(
        sequence: sequence, type: type, schemaVersion: schemaVersion, timestamp: timestamp, id: id,
        payload: payload)
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
