import FerryTools
import Foundation
import LMDB
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// A plain LMDB file of named databases for the free-list check's tests, written with flushed
/// commits and closed, and checked both ways: walked on one thread and on several.
struct FreeListCheckFile {
  let scratch: Scratch
  let file: String
  let transaction: UInt64
  let raw: RawDataFile
  let pageSize: Int

  /// Writes each shape's records (key "NAME-000123", `valueSize` bytes of value); with
  /// `rewriteEvery`, two more commits rewrite every so many records of each database with shorter
  /// values, so that LMDB's free list names pages.
  init(shapes: [(name: String, records: Int, valueSize: Int)], rewriteEvery: Int? = nil) throws {
    scratch = try Scratch()
    let directory = scratch.path + "/store"
    let env = try Environment.open(path: directory, databases: shapes.map(\.name))
    func key(_ name: String, _ i: Int) -> [UInt8] { Array(String(format: "%@-%06d", name, i).utf8) }
    for shape in shapes {
      let db = try env.database(shape.name)
      try env.write { txn in
        for i in 0..<shape.records {
          try txn.put(
            db, key: key(shape.name, i), value: [UInt8](repeating: UInt8(i & 0xFF), count: shape.valueSize))
        }
      }
    }
    if let rewriteEvery {
      for round in 0..<2 {
        try env.write { txn in
          for shape in shapes {
            let db = try env.database(shape.name)
            for i in stride(from: round, to: shape.records, by: rewriteEvery) {
              try txn.put(
                db, key: key(shape.name, i), value: [UInt8](repeating: 0x5A, count: shape.valueSize / 2))
            }
          }
        }
      }
    }
    env.close()
    file = directory + "/data.mdb"
    transaction = try #require(try DataFileCheck.read(file).metas.compactMap { $0 }.map(\.transaction).max())
    raw = try RawDataFile(path: file)
    pageSize = try #require(raw.pageSizeNamedByMetaPage0())
  }

  func remove() { scratch.remove() }

  /// The pages of the named database's tree.
  func tree(_ name: String) throws -> (root: UInt64, branches: [UInt64], leaves: [UInt64]) {
    try #require(raw.liveTree(named: name, pageSize: pageSize))
  }

  /// What the check says of the file walked on one thread, and on several.
  func verdicts() throws -> (one: String?, several: String?) {
    (
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: .max),
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: 0)
    )
  }

  /// The verdicts with `bytes` written over the file at `offset`; the file as it was afterwards.
  func verdicts(with bytes: [UInt8], at offset: Int) throws -> (one: String?, several: String?) {
    let original = raw.read(at: offset, count: bytes.count)
    try write(bytes, at: offset)
    defer { try? write(original, at: offset) }
    return try verdicts()
  }

  private func write(_ bytes: [UInt8], at offset: Int) throws {
    let fd = open(file, O_RDWR | O_CLOEXEC)
    try #require(fd >= 0)
    defer { close(fd) }
    try #require(bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) } == bytes.count)
  }

  /// The byte offset in the file of the node that node pointer `index` of `page` names.
  func nodeOffset(page: UInt64, index: Int) throws -> Int {
    let bytes = try #require(raw.page(page, pageSize: pageSize)).bytes
    return Int(page) * pageSize + Int(u16(bytes, at: PageLayout.pageHeaderSize + 2 * index))
  }

  /// The fields of a branch node (low and high halves, then the flags field's top bits) that make
  /// it name `page`.
  static func childFields(_ page: UInt64) -> [UInt8] {
    [page & 0xFFFF, (page >> 16) & 0xFFFF, page >> 32].flatMap {
      withUnsafeBytes(of: UInt16($0).littleEndian) { Array($0) }
    }
  }
}

/// A little-endian u16 of `bytes` at `offset`.
func u16(_ bytes: [UInt8], at offset: Int) -> UInt16 {
  UInt16(bytes[offset]) | UInt16(bytes[offset + 1]) << 8
}
