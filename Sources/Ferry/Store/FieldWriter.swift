import FerryLog

/// Something that takes the fields of a payload or row in ``PayloadWriter``'s layout
/// (`Specs/task-events.md`): the same `write(to:)` serves the exact-size ``FieldWriter`` and a
/// growing ``PayloadWriter``.
protocol FieldSink {
  mutating func write<T: FixedWidthInteger>(_ value: T)
  mutating func write(_ value: Bool)
  mutating func write(_ value: String)
  mutating func write(bytes value: [UInt8])
  mutating func write(_ value: String?)
  mutating func write<T: FixedWidthInteger>(_ value: T?)
}

extension PayloadWriter: FieldSink {}

/// Writes fields in ``PayloadWriter``'s layout into one array allocated at its exact size: no
/// growth checks, no reallocation (rows and payloads are written on every change of a task).
struct FieldWriter: FieldSink {
  private let base: UnsafeMutableRawPointer?
  private let capacity: Int
  private(set) var count = 0
  /// A write did not fit: the size given was wrong, and nothing more is written.
  private(set) var overflowed = false

  private init(base: UnsafeMutableRawPointer?, capacity: Int) {
    self.base = base
    self.capacity = capacity
  }

  /// The bytes `body` writes when they are exactly `size`; nil when the size was wrong (the
  /// caller then writes them with a ``PayloadWriter``).
  static func encode(size: Int, _ body: (inout FieldWriter) -> Void) -> [UInt8]? {
    // Written in temporary memory, then copied into the array: an array made at its size
    // (`repeating:count:`, `unsafeUninitializedCapacity:`) looked its storage type up at run time
    // on every call, which cost more than the copy.
    withEncoded(size: size, body) { Array($0) }
  }

  /// Calls `use` with the bytes `body` writes, in temporary memory (no array), when they are
  /// exactly `size`; nil when the size was wrong (`use` is not called).
  static func withEncoded<R>(
    size: Int, _ body: (inout FieldWriter) -> Void, use: (UnsafeRawBufferPointer) throws -> R
  ) rethrows -> R? {
    try withEncodedInline(size: size, body, use: use)
  }

  /// ``withEncoded(size:_:use:)`` inlined where it is called: for a task row, whose `write(to:)`
  /// closure, handed to a call, captured the row by copying it (retaining each of its strings,
  /// releasing them after) on every change of a task. (Not for an event's payload: inlined
  /// there, the enum was copied for its switch instead.)
  @inline(__always)
  static func withEncodedInline<R>(
    size: Int, _ body: (inout FieldWriter) -> Void, use: (UnsafeRawBufferPointer) throws -> R
  ) rethrows -> R? {
    try withUnsafeTemporaryAllocation(byteCount: size, alignment: 8) { buffer -> R? in
      var writer = FieldWriter(base: buffer.baseAddress, capacity: size)
      body(&writer)
      guard !writer.overflowed, writer.count == size else { return nil }
      return try use(UnsafeRawBufferPointer(buffer))
    }
  }

  /// Bytes a string takes: a u32 count and its UTF-8 bytes.
  static func size(_ value: String) -> Int { 4 + value.utf8.count }
  /// Bytes an optional string takes: a presence byte, then the string.
  static func size(_ value: String?) -> Int { 1 + (value.map(size) ?? 0) }
  /// Bytes an optional integer takes: a presence byte, then the integer.
  static func size<T: FixedWidthInteger>(_ value: T?) -> Int { 1 + (value == nil ? 0 : MemoryLayout<T>.size) }

  /// Room for `size` more bytes at the end, or nil (and `overflowed`) when there is none.
  @inline(__always)
  private mutating func claim(_ size: Int) -> UnsafeMutableRawPointer? {
    guard !overflowed, let base, capacity - count >= size else {
      overflowed = true
      return nil
    }
    defer { count += size }
    return base + count
  }

  @inline(__always)
  mutating func write<T: FixedWidthInteger>(_ value: T) {
    claim(MemoryLayout<T>.size)?.storeBytes(of: value.bigEndian, as: T.self)
  }

  @inline(__always)
  mutating func write(_ value: Bool) { write(UInt8(value ? 1 : 0)) }

  mutating func write(_ value: String) {
    let utf8 = value.utf8
    write(UInt32(truncatingIfNeeded: utf8.count))
    guard let target = claim(utf8.count) else { return }
    let copied: Void? = utf8.withContiguousStorageIfAvailable { source in
      if let from = source.baseAddress { target.copyMemory(from: from, byteCount: source.count) }
    }
    if copied == nil {
      for (offset, byte) in utf8.enumerated() {
        target.storeBytes(of: byte, toByteOffset: offset, as: UInt8.self)
      }
    }
  }

  mutating func write(bytes value: [UInt8]) {
    write(UInt32(truncatingIfNeeded: value.count))
    guard let target = claim(value.count) else { return }
    value.withUnsafeBytes { source in
      if let from = source.baseAddress { target.copyMemory(from: from, byteCount: source.count) }
    }
  }

  @inline(__always)
  mutating func write(_ value: String?) {
    write(value != nil)
    if let value { write(value) }
  }

  @inline(__always)
  mutating func write<T: FixedWidthInteger>(_ value: T?) {
    write(value != nil)
    if let value { write(value) }
  }
}

// A task id is stored as its bare sequence number (`Specs/task-events.md` §2).
extension FieldSink {
  mutating func write(_ id: TaskID) { write(id.rawValue) }
  mutating func write(_ id: TaskID?) { write(id?.rawValue) }
}

extension FieldWriter {
  /// Bytes an optional task id takes: a presence byte, then the id.
  static func size(_ id: TaskID?) -> Int { size(id?.rawValue) }
}
