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

/// Calls `body` with `bytes` where they lie, keeping `body`'s error type (an array's
/// `withUnsafeBytes` throws untyped: the outcome comes out as a result).
@inlinable
package func withRawBytes<T, E: Error>(
  _ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(E) -> T
) throws(E) -> T {
  let outcome = bytes.withUnsafeBytes { raw -> Result<T, E> in
    do throws(E) { return .success(try body(raw)) } catch { return .failure(error) }
  }
  return try outcome.get()
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

  /// Runs `read` with a ``RawPayloadReader`` at this reader's place over its bytes, and moves on
  /// by what it read.
  @inlinable
  mutating func reading<T>(
    _ read: (inout RawPayloadReader) throws(PayloadError) -> T
  ) throws(PayloadError) -> T {
    let start = offset
    let (value, end) = try withRawBytes(bytes) { buffer throws(PayloadError) in
      var reader = RawPayloadReader(buffer, offset: start)
      return (try read(&reader), reader.offset)
    }
    offset = end
    return value
  }

  /// Reads a fixed-width big-endian integer.
  @inlinable
  public mutating func read<T: FixedWidthInteger>(
    _: T.Type = T.self, _ field: String
  ) throws(PayloadError) -> T {
    try reading { reader throws(PayloadError) in try reader.read(T.self, field) }
  }

  /// Reads a boolean byte (0 or 1; anything else is an error).
  @inlinable
  public mutating func readBool(_ field: String) throws(PayloadError) -> Bool {
    try reading { reader throws(PayloadError) in try reader.readBool(field) }
  }

  /// Reads a length-prefixed byte string.
  @inlinable
  public mutating func readBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    try reading { reader throws(PayloadError) in try reader.readBytes(field) }
  }

  /// Steps over a length-prefixed byte string without copying it; returns an empty array (for
  /// a decoder that fills the field but never reads it).
  @inlinable
  public mutating func skipBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    try reading { reader throws(PayloadError) in try reader.skipBytes(field) }
  }

  /// Reads a length-prefixed UTF-8 string.
  @inlinable
  public mutating func readString(_ field: String) throws(PayloadError) -> String {
    try reading { reader throws(PayloadError) in try reader.readString(field) }
  }

  /// Reads an optional string.
  @inlinable
  public mutating func readOptionalString(_ field: String) throws(PayloadError) -> String? {
    try reading { reader throws(PayloadError) in try reader.readOptionalString(field) }
  }

  /// Reads an optional integer.
  @inlinable
  public mutating func readOptional<T: FixedWidthInteger>(
    _: T.Type = T.self, _ field: String
  ) throws(PayloadError) -> T? {
    try reading { reader throws(PayloadError) in try reader.readOptional(T.self, field) }
  }

  /// Fails unless every byte was read.
  @inlinable
  public func finish(_ what: String) throws(PayloadError) {
    guard remaining == 0 else { throw PayloadError("\(remaining) unexpected bytes after \(what)") }
  }
}

/// ``PayloadReader`` over bytes held elsewhere (a record's payload where it lies in the map):
/// the same reads, valid while those bytes are.
public struct RawPayloadReader {
  @usableFromInline let bytes: UnsafeRawBufferPointer
  /// Where the next read starts.
  public var offset: Int

  /// A reader over `bytes`, from `offset`.
  @inlinable public init(_ bytes: UnsafeRawBufferPointer, offset: Int = 0) {
    self.bytes = bytes
    self.offset = offset
  }

  /// Bytes not read yet.
  @inlinable public var remaining: Int { bytes.count - offset }

  /// The next `count` bytes, checked to be there; `field` names them in the error.
  @inlinable @inline(__always)
  mutating func take(_ count: Int, _ field: String) throws(PayloadError) -> UnsafeRawBufferPointer {
    guard count >= 0, remaining >= count else {
      throw PayloadError("truncated at \(field): needs \(count) bytes, \(remaining) left")
    }
    defer { offset += count }
    return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)])
  }

  /// Reads a fixed-width big-endian integer.
  @inlinable @inline(__always)
  public mutating func read<T: FixedWidthInteger>(
    _: T.Type = T.self, _ field: String
  ) throws(PayloadError) -> T {
    // One unaligned load, not a shift per byte through bounds checks.
    T(bigEndian: try take(T.bitWidth / 8, field).loadUnaligned(as: T.self))
  }

  /// Reads a boolean byte (0 or 1; anything else is an error).
  @inlinable @inline(__always)
  public mutating func readBool(_ field: String) throws(PayloadError) -> Bool {
    let byte: UInt8 = try read(UInt8.self, field)
    guard byte <= 1 else { throw PayloadError("\(field) is \(byte), not a boolean") }
    return byte == 1
  }

  /// Reads a length-prefixed byte string.
  @inlinable
  public mutating func readBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    Array(try readBuffer(field))
  }

  /// Reads a length-prefixed byte string where it lies.
  @inlinable @inline(__always)
  public mutating func readBuffer(_ field: String) throws(PayloadError) -> UnsafeRawBufferPointer {
    let count = Int(try read(UInt32.self, field))
    return try take(count, field)
  }

  /// Steps over a length-prefixed byte string without copying it; returns an empty array.
  @inlinable
  public mutating func skipBytes(_ field: String) throws(PayloadError) -> [UInt8] {
    _ = try readBuffer(field)
    return []
  }

  /// Reads a length-prefixed UTF-8 string.
  @inlinable
  public mutating func readString(_ field: String) throws(PayloadError) -> String {
    let raw = try readBuffer(field).assumingMemoryBound(to: UInt8.self)
    // Straight from the bytes, without a copy: ASCII (every tag, id and owner Ferry writes) needs
    // no validation, so the generic UTF-8 check runs only for other text.
    if Self.isASCII(raw) { return String(decoding: raw, as: UTF8.self) }
    guard let string = String(validating: raw, as: UTF8.self) else {
      throw PayloadError("\(field) is not valid UTF-8")
    }
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
