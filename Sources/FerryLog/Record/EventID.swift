import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The 16-byte identity of an event, unique across stores.
///
/// New ids follow the UUID version 7 layout: 48 bits of Unix milliseconds, then random bits, so
/// ids made in order mostly sort in order (cheap to index). An id chosen by the caller (for
/// idempotent appends) may be any 16 bytes.
public struct EventID: Hashable, Sendable, Comparable, CustomStringConvertible {
  /// The first and last 8 bytes as big-endian integers: an id is two words, not an allocation
  /// (every event decoded or prepared has one).
  let high: UInt64
  let low: UInt64

  /// The 16 bytes.
  public var bytes: [UInt8] { high.bigEndianBytes + low.bigEndianBytes }

  /// Wraps exactly 16 bytes; nil for any other count.
  public init?(bytes: [UInt8]) {
    guard bytes.count == 16 else { return nil }
    self.init(uncheckedBytes: bytes)
  }

  init(high: UInt64, low: UInt64) {
    self.high = high
    self.low = low
  }

  /// Exactly 16 bytes (the caller checked the count).
  init(uncheckedBytes bytes: some Collection<UInt8>) {
    var high: UInt64 = 0
    var low: UInt64 = 0
    for (index, byte) in bytes.enumerated() {
      if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
    }
    self.init(high: high, low: low)
  }

  /// Calls `body` with the 16 bytes, in place.
  func withBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
    try withUnsafeBytes(of: (high.bigEndian, low.bigEndian)) { try body($0) }
  }

  /// Parses 32 hexadecimal digits (dashes allowed, as in a UUID); nil when malformed.
  public init?(hex: String) {
    let digits = hex.filter { $0 != "-" }
    guard digits.count == 32 else { return nil }
    var bytes: [UInt8] = []
    var iterator = digits.makeIterator()
    while let high = iterator.next(), let low = iterator.next() {
      guard let h = high.hexDigitValue, let l = low.hexDigitValue else { return nil }
      bytes.append(UInt8(h << 4 | l))
    }
    self.init(uncheckedBytes: bytes)
  }

  /// The random bits of new ids: a generator seeded once per process from the system's source
  /// (which costs a system call each time it is asked).
  private static let random = Mutex(IDRandom())

  /// A new time-ordered random id (UUID version 7 layout).
  public static func make(milliseconds: Int64 = wallClockMilliseconds()) -> EventID {
    let ms = UInt64(bitPattern: milliseconds) & 0xFFFF_FFFF_FFFF
    let random = Self.random.withLock { generator in (generator.next(), generator.next()) }
    // Bytes 0-5 the milliseconds, 6-13 the first random word's bytes from its low end, 14-15 the
    // second's; then the version (7) in byte 6's high nibble and the RFC 4122 variant in byte 8.
    let r = random.0.byteSwapped  // its low byte first, as bytes 6...13
    var high = ms << 16 | (r >> 48)
    var low = r << 16 | (random.1 & 0xFF) << 8 | (random.1 >> 8 & 0xFF)
    high = (high & ~0xF000) | 0x7000  // byte 6: version 7
    low = (low & ~(0xC0 << 56)) | (0x80 << 56)  // byte 8: variant
    return EventID(high: high, low: low)
  }

  /// 32 lowercase hexadecimal digits.
  public var hex: String { digits(dashed: false) }

  /// The id in UUID form (8-4-4-4-12 hexadecimal digits).
  public var description: String { digits(dashed: true) }

  /// The digits written as ASCII bytes in one buffer: a run's idempotency key is one of these, and
  /// building it a Character at a time was the costliest step of a run.
  private func digits(dashed: Bool) -> String {
    let alphabet: StaticString = "0123456789abcdef"
    return String(unsafeUninitializedCapacity: 36) { buffer in
      var at = 0
      alphabet.withUTF8Buffer { alphabet in
        for index in 0..<16 {
          if dashed && (index == 4 || index == 6 || index == 8 || index == 10) {
            buffer[at] = UInt8(ascii: "-")
            at += 1
          }
          let word = index < 8 ? high : low
          let byte = UInt8(truncatingIfNeeded: word >> (56 - 8 * UInt64(index % 8)))
          buffer[at] = alphabet[Int(byte >> 4)]
          buffer[at + 1] = alphabet[Int(byte & 0x0F)]
          at += 2
        }
      }
      return at
    }
  }

  /// Byte-wise order, the order of the event-id index.
  public static func < (lhs: EventID, rhs: EventID) -> Bool {
    lhs.high != rhs.high ? lhs.high < rhs.high : lhs.low < rhs.low
  }
}

/// Milliseconds since the Unix epoch from the system's real-time clock.
public func wallClockMilliseconds() -> Int64 {
  var ts = timespec()
  clock_gettime(CLOCK_REALTIME, &ts)
  return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

/// xoshiro256** (Blackman and Vigna), seeded from the system's random source: 80 unpredictable-
/// enough bits per id, unique across processes by their seeds.
struct IDRandom {
  private var state: (UInt64, UInt64, UInt64, UInt64)

  init() {
    var system = SystemRandomNumberGenerator()
    state = (system.next(), system.next(), system.next(), system.next())
    if state == (0, 0, 0, 0) { state.0 = 1 }
  }

  mutating func next() -> UInt64 {
    let result = rotate(state.1 &* 5, 7) &* 9
    let t = state.1 << 17
    state.2 ^= state.0
    state.3 ^= state.1
    state.1 ^= state.2
    state.0 ^= state.3
    state.2 ^= t
    state.3 = rotate(state.3, 45)
    return result
  }

  private func rotate(_ x: UInt64, _ k: UInt64) -> UInt64 { (x << k) | (x >> (64 - k)) }
}
