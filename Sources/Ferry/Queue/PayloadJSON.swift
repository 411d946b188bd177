import Foundation

/// A task payload's JSON written straight into bytes, the same bytes `JSONEncoder` with
/// `.sortedKeys` writes (keys in UTF-8 byte order, `/` escaped, control characters as `\uXXXX`),
/// for the values most payloads are made of: structs, arrays and dictionaries of strings,
/// booleans, integers and nil. Anything else — floating-point numbers, `Date`, `Data`, `URL`,
/// `Decimal`, nested or super containers, a container asked for twice, a key given twice, a value
/// that encodes nothing — makes ``encode(_:)`` answer nil, and the caller asks `JSONEncoder`. An
/// add encoded its payload with a new `JSONEncoder` state each time; this costs a fraction.
enum PayloadJSON {
  /// The JSON of `value`, or nil when it holds something this encoder leaves to `JSONEncoder`.
  static func encode<T: Encodable>(_ value: T) -> [UInt8]? {
    let encoder = ByteJSONEncoder()
    encoder.encodeValue(value)
    return encoder.failed ? nil : encoder.output
  }
}

/// The encoder behind ``PayloadJSON``: one output buffer, one frame per value being encoded.
private final class ByteJSONEncoder: Encoder {
  /// What the value being encoded asked for.
  enum Container {
    case none
    /// An object: each entry's key and where its `"key":value` bytes lie in `output`.
    case keyed(entries: [Entry])
    case unkeyed(count: Int)
    /// One value, once it is written.
    case single(written: Bool)
  }

  /// One entry of an object (a struct, not a tuple: an array of tuples had its storage type
  /// looked up at run time on every object).
  struct Entry {
    let key: String
    let range: Range<Int>
  }

  struct Frame {
    /// Identifies the frame for the containers it handed out (a container used after its
    /// value's `encode(to:)` returned writes nothing and fails the encoding).
    let id: Int
    let start: Int
    var container: Container = .none
  }

  var output: [UInt8] = []
  var frames: [Frame] = []
  var nextFrameId = 0
  var failed = false
  var codingPath: [any CodingKey] = []
  var userInfo: [CodingUserInfoKey: Any] { [:] }

  init() { output.reserveCapacity(64) }

  /// Encodes one value in a frame of its own, then closes the container it opened (sorting an
  /// object's entries by key).
  func encodeValue<T: Encodable>(_ value: T) {
    if failed { return }
    // The types JSONEncoder writes its own way (and floating-point numbers, whose digits are its own).
    if T.self == Date.self || T.self == Data.self || T.self == URL.self || T.self == Decimal.self
      || T.self == Double.self || T.self == Float.self
    {
      failed = true
      return
    }
    guard frames.count < 256 else {
      failed = true
      return
    }
    nextFrameId += 1
    frames.append(Frame(id: nextFrameId, start: output.count))
    do {
      try value.encode(to: self)
    } catch {
      failed = true
    }
    guard let frame = frames.popLast(), !failed else {
      failed = true
      return
    }
    switch frame.container {
    case .none:
      failed = true  // a value that encodes nothing: JSONEncoder's own rules decide
    case .single(let written):
      if !written { failed = true }
    case .unkeyed:
      output.append(UInt8(ascii: "]"))
    case .keyed(let entries):
      closeObject(start: frame.start, entries: entries)
    }
  }

  /// Ends an object whose entries were written in the order given: sorts them by key's UTF-8
  /// bytes when they are not already, and fails on a key given twice.
  private func closeObject(start: Int, entries: [Entry]) {
    var sorted = true
    for index in entries.indices.dropFirst() {
      let previous = entries[index - 1].key.utf8
      let key = entries[index].key.utf8
      if previous.elementsEqual(key) {
        failed = true
        return
      }
      if !previous.lexicographicallyPrecedes(key) { sorted = false }
    }
    if !sorted {
      let ordered = entries.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
      for index in ordered.indices.dropFirst()
      where ordered[index - 1].key.utf8.elementsEqual(ordered[index].key.utf8) {
        failed = true
        return
      }
      var rebuilt: [UInt8] = [UInt8(ascii: "{")]
      rebuilt.reserveCapacity(output.count - start + 1)
      for (index, entry) in ordered.enumerated() {
        if index > 0 { rebuilt.append(UInt8(ascii: ",")) }
        rebuilt.append(contentsOf: output[entry.range])
      }
      output.removeSubrange(start...)
      output.append(contentsOf: rebuilt)
    }
    output.append(UInt8(ascii: "}"))
  }

  /// Opens `container` in the current frame; the frame's id, or nil (and failed) when the frame
  /// already has one or there is none.
  func open(_ container: Container) -> Int? {
    guard !failed, var frame = frames.last, case .none = frame.container else {
      failed = true
      return nil
    }
    frame.container = container
    frames[frames.count - 1] = frame
    switch container {
    case .keyed: output.append(UInt8(ascii: "{"))
    case .unkeyed: output.append(UInt8(ascii: "["))
    case .single, .none: break
    }
    return frame.id
  }

  /// Whether a container of frame `id` may write now (its frame is the current one).
  func isCurrent(_ id: Int?) -> Bool {
    guard !failed, let id, frames.last?.id == id else {
      failed = true
      return false
    }
    return true
  }

  func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
    KeyedEncodingContainer(KeyedContainer<Key>(encoder: self, frame: open(.keyed(entries: []))))
  }

  func unkeyedContainer() -> any UnkeyedEncodingContainer {
    UnkeyedContainer(encoder: self, frame: open(.unkeyed(count: 0)))
  }

  func singleValueContainer() -> any SingleValueEncodingContainer {
    SingleContainer(encoder: self, frame: open(.single(written: false)))
  }

  // MARK: Writing

  func writeNull() { output.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C]) }  // null

  func write(_ value: Bool) {
    if value {
      output.append(contentsOf: [0x74, 0x72, 0x75, 0x65])  // true
    } else {
      output.append(contentsOf: [0x66, 0x61, 0x6C, 0x73, 0x65])  // false
    }
  }

  func write<T: FixedWidthInteger>(_ value: T) { output.append(contentsOf: String(value).utf8) }

  /// A string in quotes, escaped as JSONEncoder escapes it.
  func write(_ string: String) {
    output.append(UInt8(ascii: "\""))
    // Most strings need no escape: their bytes go in with one copy.
    let plain = string.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
      for byte in bytes where byte < 0x20 || byte == 0x22 || byte == 0x2F || byte == 0x5C { return false }
      output.append(contentsOf: bytes)
      return true
    }
    if plain == true {
      output.append(UInt8(ascii: "\""))
      return
    }
    for byte in string.utf8 {
      switch byte {
      case UInt8(ascii: "\""): output.append(contentsOf: [0x5C, 0x22])
      case UInt8(ascii: "\\"): output.append(contentsOf: [0x5C, 0x5C])
      case UInt8(ascii: "/"): output.append(contentsOf: [0x5C, 0x2F])
      case 0x08: output.append(contentsOf: [0x5C, UInt8(ascii: "b")])
      case 0x0C: output.append(contentsOf: [0x5C, UInt8(ascii: "f")])
      case 0x0A: output.append(contentsOf: [0x5C, UInt8(ascii: "n")])
      case 0x0D: output.append(contentsOf: [0x5C, UInt8(ascii: "r")])
      case 0x09: output.append(contentsOf: [0x5C, UInt8(ascii: "t")])
      case 0x00...0x1F:
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        output.append(contentsOf: [
          0x5C, UInt8(ascii: "u"), 0x30, 0x30, digits[Int(byte >> 4)], digits[Int(byte & 0xF)],
        ])
      default: output.append(byte)
      }
    }
    output.append(UInt8(ascii: "\""))
  }

  // MARK: Keyed

  /// Starts an entry of the current object: a comma when it is not the first, then `"key":`.
  func beginEntry(_ key: some CodingKey) -> Int {
    if case .keyed(let entries) = frames[frames.count - 1].container, !entries.isEmpty {
      output.append(UInt8(ascii: ","))
    }
    let start = output.count
    write(key.stringValue)
    output.append(UInt8(ascii: ":"))
    return start
  }

  func endEntry(_ key: some CodingKey, from start: Int) {
    guard !failed, case .keyed(var entries) = frames[frames.count - 1].container else {
      failed = true
      return
    }
    frames[frames.count - 1].container = .none  // the array is held once while appending
    entries.append(Entry(key: key.stringValue, range: start..<output.count))
    frames[frames.count - 1].container = .keyed(entries: entries)
  }

  struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let encoder: ByteJSONEncoder
    let frame: Int?
    var codingPath: [any CodingKey] { encoder.codingPath }

    private func entry(_ key: Key, _ body: () -> Void) {
      guard encoder.isCurrent(frame) else { return }
      let start = encoder.beginEntry(key)
      body()
      encoder.endEntry(key, from: start)
    }

    mutating func encodeNil(forKey key: Key) throws { entry(key) { encoder.writeNull() } }
    mutating func encode(_ value: Bool, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: String, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: Double, forKey key: Key) throws { encoder.failed = true }
    mutating func encode(_ value: Float, forKey key: Key) throws { encoder.failed = true }
    mutating func encode(_ value: Int, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: Int8, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: Int16, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: Int32, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: Int64, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: UInt, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { entry(key) { encoder.write(value) } }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { entry(key) { encoder.write(value) } }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
      entry(key) {
        encoder.codingPath.append(key)
        encoder.encodeValue(value)
        encoder.codingPath.removeLast()
      }
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
      keyedBy keyType: NestedKey.Type, forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
      encoder.failed = true
      return KeyedEncodingContainer(KeyedContainer<NestedKey>(encoder: encoder, frame: nil))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
      encoder.failed = true
      return UnkeyedContainer(encoder: encoder, frame: nil)
    }

    mutating func superEncoder() -> any Encoder {
      encoder.failed = true
      return encoder
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
      encoder.failed = true
      return encoder
    }
  }

  // MARK: Unkeyed

  /// Starts an element of the current array: a comma when it is not the first.
  func beginElement() {
    guard case .unkeyed(let count) = frames[frames.count - 1].container else {
      failed = true
      return
    }
    if count > 0 { output.append(UInt8(ascii: ",")) }
    frames[frames.count - 1].container = .unkeyed(count: count + 1)
  }

  func elementCount(_ frame: Int?) -> Int {
    guard let frame, let found = frames.last(where: { $0.id == frame }),
      case .unkeyed(let count) = found.container
    else { return 0 }
    return count
  }

  struct UnkeyedContainer: UnkeyedEncodingContainer {
    let encoder: ByteJSONEncoder
    let frame: Int?
    var codingPath: [any CodingKey] { encoder.codingPath }
    var count: Int { encoder.elementCount(frame) }

    private func element(_ body: () -> Void) {
      guard encoder.isCurrent(frame) else { return }
      encoder.beginElement()
      body()
    }

    mutating func encodeNil() throws { element { encoder.writeNull() } }
    mutating func encode(_ value: Bool) throws { element { encoder.write(value) } }
    mutating func encode(_ value: String) throws { element { encoder.write(value) } }
    mutating func encode(_ value: Double) throws { encoder.failed = true }
    mutating func encode(_ value: Float) throws { encoder.failed = true }
    mutating func encode(_ value: Int) throws { element { encoder.write(value) } }
    mutating func encode(_ value: Int8) throws { element { encoder.write(value) } }
    mutating func encode(_ value: Int16) throws { element { encoder.write(value) } }
    mutating func encode(_ value: Int32) throws { element { encoder.write(value) } }
    mutating func encode(_ value: Int64) throws { element { encoder.write(value) } }
    mutating func encode(_ value: UInt) throws { element { encoder.write(value) } }
    mutating func encode(_ value: UInt8) throws { element { encoder.write(value) } }
    mutating func encode(_ value: UInt16) throws { element { encoder.write(value) } }
    mutating func encode(_ value: UInt32) throws { element { encoder.write(value) } }
    mutating func encode(_ value: UInt64) throws { element { encoder.write(value) } }

    mutating func encode<T: Encodable>(_ value: T) throws {
      element { encoder.encodeValue(value) }
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
      keyedBy keyType: NestedKey.Type
    ) -> KeyedEncodingContainer<NestedKey> {
      encoder.failed = true
      return KeyedEncodingContainer(KeyedContainer<NestedKey>(encoder: encoder, frame: nil))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
      encoder.failed = true
      return UnkeyedContainer(encoder: encoder, frame: nil)
    }

    mutating func superEncoder() -> any Encoder {
      encoder.failed = true
      return encoder
    }
  }

  // MARK: Single value

  /// Marks the current frame's single value written; false (and failed) when it already was.
  func writeSingle() -> Bool {
    guard case .single(false) = frames[frames.count - 1].container else {
      failed = true
      return false
    }
    frames[frames.count - 1].container = .single(written: true)
    return true
  }

  struct SingleContainer: SingleValueEncodingContainer {
    let encoder: ByteJSONEncoder
    let frame: Int?
    var codingPath: [any CodingKey] { encoder.codingPath }

    /// Writes the value unless one was written (a second write fails the encoding, as
    /// JSONEncoder refuses it).
    private func once(_ body: () -> Void) {
      guard encoder.isCurrent(frame), encoder.writeSingle() else { return }
      body()
    }

    mutating func encodeNil() throws { once { encoder.writeNull() } }
    mutating func encode(_ value: Bool) throws { once { encoder.write(value) } }
    mutating func encode(_ value: String) throws { once { encoder.write(value) } }
    mutating func encode(_ value: Double) throws { encoder.failed = true }
    mutating func encode(_ value: Float) throws { encoder.failed = true }
    mutating func encode(_ value: Int) throws { once { encoder.write(value) } }
    mutating func encode(_ value: Int8) throws { once { encoder.write(value) } }
    mutating func encode(_ value: Int16) throws { once { encoder.write(value) } }
    mutating func encode(_ value: Int32) throws { once { encoder.write(value) } }
    mutating func encode(_ value: Int64) throws { once { encoder.write(value) } }
    mutating func encode(_ value: UInt) throws { once { encoder.write(value) } }
    mutating func encode(_ value: UInt8) throws { once { encoder.write(value) } }
    mutating func encode(_ value: UInt16) throws { once { encoder.write(value) } }
    mutating func encode(_ value: UInt32) throws { once { encoder.write(value) } }
    mutating func encode(_ value: UInt64) throws { once { encoder.write(value) } }

    mutating func encode<T: Encodable>(_ value: T) throws {
      once { encoder.encodeValue(value) }
    }
  }
}
