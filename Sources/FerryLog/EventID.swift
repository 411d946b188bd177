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
  /// The 16 bytes.
  public let bytes: [UInt8]

  /// Wraps exactly 16 bytes; nil for any other count.
  public init?(bytes: [UInt8]) {
    guard bytes.count == 16 else { return nil }
    self.bytes = bytes
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
    self.bytes = bytes
  }

  /// The random bits of new ids: a generator seeded once per process from the system's source
  /// (which costs a system call each time it is asked).
  private static let random = Mutex(IDRandom())

  /// A new time-ordered random id (UUID version 7 layout).
  public static func make(milliseconds: Int64 = wallClockMilliseconds()) -> EventID {
    var bytes = [UInt8](repeating: 0, count: 16)
    let ms = UInt64(bitPattern: milliseconds)
    for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: ms >> (8 * (5 - i))) }
    let random = Self.random.withLock { generator in (generator.next(), generator.next()) }
    for i in 6..<16 {
      let source = i < 14 ? random.0 >> (8 * (i - 6)) : random.1 >> (8 * (i - 14))
      bytes[i] = UInt8(truncatingIfNeeded: source)
    }
    bytes[6] = (bytes[6] & 0x0F) | 0x70  // version 7
    bytes[8] = (bytes[8] & 0x3F) | 0x80  // RFC 4122 variant
    return EventID(uncheckedBytes: bytes)
  }

  init(uncheckedBytes: [UInt8]) { self.bytes = uncheckedBytes }

  /// 32 lowercase hexadecimal digits.
  public var hex: String {
    let digits: [Character] = Array("0123456789abcdef")
    var out = ""
    out.reserveCapacity(32)
    for byte in bytes {
      out.append(digits[Int(byte >> 4)])
      out.append(digits[Int(byte & 0x0F)])
    }
    return out
  }

  /// The id in UUID form (8-4-4-4-12 hexadecimal digits).
  public var description: String {
    let h = Array(hex)
    return String(h[0..<8]) + "-" + String(h[8..<12]) + "-" + String(h[12..<16]) + "-" + String(h[16..<20])
      + "-"
      + String(h[20..<32])
  }

  /// Byte-wise order, the order of the event-id index.
  public static func < (lhs: EventID, rhs: EventID) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
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
