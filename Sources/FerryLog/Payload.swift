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
    var value: T = 0
    for i in 0..<size { value = (value << 8) | T(bytes[offset + i]) }
    offset += size
    return value
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

  /// Reads a length-prefixed UTF-8 string.
  @inlinable
  public mutating func readString(_ field: String) throws(PayloadError) -> String {
    let raw = try readBytes(field)
    guard let string = String(validating: raw, as: UTF8.self) else {
      throw PayloadError("\(field) is not valid UTF-8")
    }
    return string
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
