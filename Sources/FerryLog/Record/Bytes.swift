/// Big-endian encoding helpers: keys built from these sort in numeric order.
extension FixedWidthInteger {
  /// The integer's bytes, most significant first.
  @inlinable public var bigEndianBytes: [UInt8] {
    withUnsafeBytes(of: self.bigEndian) { Array($0) }
  }

  /// Reads a big-endian integer from exactly `Self.bitWidth / 8` bytes; nil when the size differs.
  @inlinable public init?<C: Collection>(bigEndianBytes bytes: C) where C.Element == UInt8 {
    guard bytes.count == Self.bitWidth / 8 else { return nil }
    var value: Self = 0
    for byte in bytes { value = (value << 8) | Self(byte) }
    self = value
  }
}

/// An array of `count` bytes that `body` writes: written in temporary memory, then copied into
/// the array. (An array made at its size — `repeating:count:`, `unsafeUninitializedCapacity:` —
/// looked its storage type up at run time on every call, and growing one reallocated: keys,
/// rows and records are made for every event, and the copy costs less.) `body` must write
/// every byte.
package func makeBytes(count: Int, _ body: (UnsafeMutableRawBufferPointer) -> Void) -> [UInt8] {
  withUnsafeTemporaryAllocation(byteCount: count, alignment: 8) { buffer in
    buffer.initializeMemory(as: UInt8.self, repeating: 0)
    body(buffer)
    return Array(UnsafeRawBufferPointer(buffer))
  }
}

/// Appends big-endian fields to a byte array.
struct ByteWriter {
  var bytes: [UInt8] = []

  init(capacity: Int) { bytes.reserveCapacity(capacity) }

  mutating func write<T: FixedWidthInteger>(_ value: T) {
    withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
  }

  mutating func write(_ raw: [UInt8]) { bytes.append(contentsOf: raw) }
}

/// Reads big-endian fields from a buffer, failing with a reason instead of reading past its end.
struct ByteReader {
  let buffer: UnsafeRawBufferPointer
  var offset = 0

  init(_ buffer: UnsafeRawBufferPointer) { self.buffer = buffer }

  var remaining: Int { buffer.count - offset }

  // Inlined (every record's decoding reads eight fields: a call each cost more than the read);
  // the failure is made out of line.
  @inline(__always)
  mutating func read<T: FixedWidthInteger>(_: T.Type, _ field: String) throws(RecordDecodingFailure) -> T {
    let size = T.bitWidth / 8
    guard remaining >= size else { throw Self.truncated(field, needs: size, left: remaining) }
    let raw = buffer.loadUnaligned(fromByteOffset: offset, as: T.self)
    offset += size
    return T(bigEndian: raw)
  }

  /// The next `count` bytes, in place (valid as long as the buffer is).
  @inline(__always)
  mutating func readBuffer(
    count: Int, _ field: String
  ) throws(RecordDecodingFailure) -> UnsafeRawBufferPointer {
    guard count >= 0, remaining >= count else {
      throw Self.truncated(field, needs: count, left: remaining)
    }
    defer { offset += count }
    return UnsafeRawBufferPointer(rebasing: buffer[offset..<(offset + count)])
  }

  @inline(never)
  private static func truncated(_ field: String, needs: Int, left: Int) -> RecordDecodingFailure {
    RecordDecodingFailure("truncated at \(field): needs \(needs) bytes, \(left) left")
  }
}

/// Why a record's bytes could not be decoded.
struct RecordDecodingFailure: Error {
  let reason: String
  init(_ reason: String) { self.reason = reason }
}
