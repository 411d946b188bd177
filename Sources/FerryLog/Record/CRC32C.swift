import CFerryCRC

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every record.
///
/// With the CPU's CRC-32C instruction where it has one (SSE4.2 on x86-64, the ARMv8 CRC extension
/// on arm64, through the CFerryCRC target), else software slicing-by-8; both give the same
/// checksum. `CRC32C.checksum("123456789".utf8) == 0xE306_9283`.
package enum CRC32C {
  /// Whether this CPU computes the checksum with an instruction (else software).
  public static let usesHardware = ferry_crc32c_available() != 0

  static let tables: [[UInt32]] = {
    var tables = [[UInt32]](repeating: [UInt32](repeating: 0, count: 256), count: 8)
    for i in 0..<256 {
      var crc = UInt32(i)
      for _ in 0..<8 { crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
      tables[0][i] = crc
    }
    for i in 0..<256 {
      for t in 1..<8 {
        let previous = tables[t - 1][i]
        tables[t][i] = (previous >> 8) ^ tables[0][Int(previous & 0xFF)]
      }
    }
    return tables
  }()

  /// The CRC-32C of `bytes`.
  public static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
    update(0, bytes)
  }

  /// The CRC-32C of a byte sequence.
  public static func checksum<S: Sequence>(_ bytes: S) -> UInt32 where S.Element == UInt8 {
    let array = Array(bytes)
    return array.withUnsafeBytes { update(0, $0) }
  }

  /// Continues a CRC over more bytes: `update(checksum(a), b) == checksum(a + b)`.
  public static func update(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
    guard usesHardware else { return softwareUpdate(crc, bytes) }
    guard let base = bytes.baseAddress, !bytes.isEmpty else { return crc }
    return ferry_crc32c_update(crc, base, bytes.count)
  }

  /// ``update(_:_:)`` in software (slicing-by-8), whatever the CPU has.
  static func softwareUpdate(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
    var c = ~crc
    var index = 0
    let count = bytes.count
    tables.withUnsafeBufferPointer { t in
      let t0 = t[0], t1 = t[1], t2 = t[2], t3 = t[3], t4 = t[4], t5 = t[5], t6 = t[6], t7 = t[7]
      t0.withUnsafeBufferPointer { t0 in
        while count - index >= 8 {
          let lo =
            c
            ^ (UInt32(bytes[index]) | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2]) << 16
              | UInt32(bytes[index + 3]) << 24)
          let hi =
            UInt32(bytes[index + 4]) | UInt32(bytes[index + 5]) << 8 | UInt32(bytes[index + 6]) << 16
            | UInt32(bytes[index + 7]) << 24
          c =
            t7[Int(lo & 0xFF)] ^ t6[Int((lo >> 8) & 0xFF)] ^ t5[Int((lo >> 16) & 0xFF)] ^ t4[Int(lo >> 24)]
            ^ t3[Int(hi & 0xFF)] ^ t2[Int((hi >> 8) & 0xFF)] ^ t1[Int((hi >> 16) & 0xFF)] ^ t0[Int(hi >> 24)]
          index += 8
        }
        while index < count {
          c = (c >> 8) ^ t0[Int((c ^ UInt32(bytes[index])) & 0xFF)]
          index += 1
        }
      }
    }
    return ~c
  }
}
