/// Writes the fields of an event payload in Ferry's compact binary layout (see
/// `Specs/task-events.md`): big-endian integers, strings and byte strings with a length prefix,
/// optionals with a presence byte. Readers must read the fields back in the same order.
///
/// ```swift
/// var writer = PayloadWriter()
/// writer.write("groceries")
/// writer.write(UInt64(42))
/// let bytes = writer.bytes
/// ```
public struct PayloadWriter: Sendable {
  // Inlinable, so that writes of concrete types are specialized in the modules that encode
  // payloads and rows (unspecialized, each write looked up generic metadata).
  @usableFromInline var storage: [UInt8] = []

  /// The bytes written so far.
  @inlinable public var bytes: [UInt8] { storage }

  /// An empty writer.
  @inlinable public init() {}

  /// An empty writer with room for `capacity` bytes.
  @inlinable public init(capacity: Int) { storage.reserveCapacity(capacity) }

  /// Writes a fixed-width integer, big-endian.
  @inlinable
  public mutating func write<T: FixedWidthInteger>(_ value: T) {
    withUnsafeBytes(of: value.bigEndian) { storage.append(contentsOf: $0) }
  }

  /// Writes a boolean as one byte (0 or 1).
  @inlinable
  public mutating func write(_ value: Bool) { storage.append(value ? 1 : 0) }

  /// Writes a string as a u32 byte count and its UTF-8 bytes.
  @inlinable
  public mutating func write(_ value: String) {
    let utf8 = value.utf8
    write(UInt32(truncatingIfNeeded: utf8.count))
    storage.append(contentsOf: utf8)
  }

  /// Writes a byte string as a u32 count and the bytes.
  @inlinable
  public mutating func write(bytes value: [UInt8]) {
    write(UInt32(truncatingIfNeeded: value.count))
    storage.append(contentsOf: value)
  }

  /// Writes an optional string: a presence byte, then the string when present.
  @inlinable
  public mutating func write(_ value: String?) {
    write(value != nil)
    if let value { write(value) }
  }

  /// Writes an optional integer: a presence byte, then the integer when present.
  @inlinable
  public mutating func write<T: FixedWidthInteger>(_ value: T?) {
    write(value != nil)
    if let value { write(value) }
  }
}

/// Reads the fields a ``PayloadWriter`` wrote, in the same order, failing with
/// ``PayloadError`` instead of reading past the end.
public struct PayloadReader: Sendable {
  // Inlinable, so that reads of concrete integer types are specialized in the modules that decode
  // payloads (unspecialized, each byte went through protocol witnesses).
  @usableFromInline let bytes: [UInt8]
  @usableFromInline var offset = 0

  /// A reader over `bytes`.
  @inlinable public init(_ bytes: [UInt8]) { self.bytes = bytes }

  /// Bytes not read yet.
  @inlinable public var remaining: Int { bytes.count - offset }

  /// Reads a fixed-width big-endian integer.
  @inlinable
  public mutating func read<T: FixedWidthInteger>(
    _: T.Type = T.self, _ field: String
  ) throws(PayloadError) -> T {
    let size = T.bitWidth / 8
    guard remaining >= size else {
      throw PayloadError("truncated at \(field): needs \(size) bytes, \(remaining) left")
    }
    // One unaligned load, not a shift per byte through the array's bounds checks.
    let start = offset
    let raw = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: start, as: T.self) }
    offset += size
    return T(bigEndian: raw)
  }

  /// Reads a boolean byte (0 or 1; anything else is an error).
  @inlinable
  public mutating func readBool(_ field: String) throws(PayloadError) -> Bool {
    let byte: UInt8 = try read(UInt8.self, field)
    guard byte <= 1 else { throw PayloadError("\(field) is \(byte), not a boolean") }
    return byte == 1
  }

  /// Reads a length-prefixed byte string.
  @inlinable
  public mutating func readBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    let count = Int(try read(UInt32.self, field))
    guard remaining >= count else {
      throw PayloadError("truncated at \(field): needs \(count) bytes, \(remaining) left")
    }
    defer { offset += count }
    return Array(bytes[offset..<(offset + count)])
  }

  /// Steps over a length-prefixed byte string without copying it; returns an empty array (for
  /// a decoder that fills the field but never reads it).
  @inlinable
  public mutating func skipBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    let count = Int(try read(UInt32.self, field))
    guard remaining >= count else {
      throw PayloadError("truncated at \(field): needs \(count) bytes, \(remaining) left")
    }
    offset += count
    return []
  }

  /// Reads a length-prefixed UTF-8 string.
  @inlinable
  public mutating func readString(_ field: String) throws(PayloadError) -> String {
    let count = Int(try read(UInt32.self, field))
    guard remaining >= count else {
      throw PayloadError("truncated at \(field): needs \(count) bytes, \(remaining) left")
    }
    let start = offset
    // Straight from the bytes, without a copy: ASCII (every tag, id and owner Ferry writes) needs
    // no validation, so the generic UTF-8 check runs only for other text.
    let string = bytes.withUnsafeBufferPointer { all -> String? in
      let raw = UnsafeBufferPointer(rebasing: all[start..<(start + count)])
      if PayloadReader.isASCII(raw) { return String(decoding: raw, as: UTF8.self) }
      return String(validating: raw, as: UTF8.self)
    }
    guard let string else { throw PayloadError("\(field) is not valid UTF-8") }
    offset += count
    return string
  }

  /// Whether every byte is below 0x80 (eight at a time).
  @inlinable
  static func isASCII(_ raw: UnsafeBufferPointer<UInt8>) -> Bool {
    guard let base = raw.baseAddress else { return true }
    var index = 0
    let count = raw.count
    while count - index >= 8 {
      if UnsafeRawPointer(base + index).loadUnaligned(as: UInt64.self) & 0x8080_8080_8080_8080 != 0 {
        return false
      }
      index += 8
    }
    while index < count {
      if base[index] >= 0x80 { return false }
      index += 1
    }
    return true
  }

  /// Reads an optional string.
  @inlinable
  public mutating func readOptionalString(_ field: String) throws(PayloadError) -> String? {
    try readBool(field) ? try readString(field) : nil
  }

  /// Reads an optional integer.
  @inlinable
  public mutating func readOptional<T: FixedWidthInteger>(
    _: T.Type = T.self, _ field: String
  ) throws(PayloadError) -> T? {
    try readBool(field) ? try read(T.self, field) : nil
  }

  /// Fails unless every byte was read.
  @inlinable
  public func finish(_ what: String) throws(PayloadError) {
    guard remaining == 0 else { throw PayloadError("\(remaining) unexpected bytes after \(what)") }
  }
}

/// A payload that does not decode: what was wrong with it.
public struct PayloadError: Error, Sendable, CustomStringConvertible {
  /// What was wrong.
  public let reason: String
  /// Creates the error.
  @inlinable public init(_ reason: String) { self.reason = reason }
  /// The reason.
  public var description: String { reason }
}
