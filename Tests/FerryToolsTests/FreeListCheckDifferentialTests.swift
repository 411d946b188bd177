import FerryLog
import FerryTools
import Foundation
import LMDB
import TestSupport
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Darwin)
  import Darwin
#endif

/// The free-list check walked on one thread and on several must refuse the same damaged files: a
/// file one way accepts and the other refuses would make an open's verdict depend on its size and
/// on the machine's processors. Seeded damages of tree pages (meta pages left alone), each checked
/// both ways on one copy of a file of more than 4,096 tree pages, restored after each case.
@Suite(.timeLimit(.minutes(20))) struct FreeListCheckDifferentialTests {
  /// Trees of uneven sizes and record shapes (small records make many node headers to damage,
  /// large ones many leaves), so that the threads' shares are uneven too.
  static let shapes: [(name: String, records: Int, valueSize: Int)] = [
    ("a", 12000, 100), ("b", 4000, 900), ("c", 4000, 900), ("d", 3500, 1500), ("e", 1000, 600),
  ]
  static let seed: UInt64 = 0xF1EE_C4EC
  static let cases = 300

  /// Writes the trees, then rewrites some records of each so that LMDB's free list names pages;
  /// returns the data file and its newest transaction.
  func makeFile(in directory: String) throws -> (file: String, transaction: UInt64) {
    let env = try Environment.open(path: directory, databases: Self.shapes.map(\.name))
    for shape in Self.shapes {
      let db = try env.database(shape.name)
      try env.write { txn in
        for i in 0..<shape.records {
          try txn.put(
            db, key: Array(String(format: "%@-%06d", shape.name, i).utf8),
            value: [UInt8](repeating: UInt8(i & 0xFF), count: shape.valueSize))
        }
      }
    }
    for round in 0..<2 {
      try env.write { txn in
        for shape in Self.shapes {
          let db = try env.database(shape.name)
          for i in stride(from: round, to: shape.records, by: 97) {
            try txn.put(
              db, key: Array(String(format: "%@-%06d", shape.name, i).utf8),
              value: [UInt8](repeating: 0x5A, count: shape.valueSize / 2))
          }
        }
      }
    }
    env.close()
    let check = try DataFileCheck.read(directory + "/data.mdb")
    let transaction = try #require(check.metas.compactMap { $0 }.map(\.transaction).max())
    return (directory + "/data.mdb", transaction)
  }

  /// One damage: bytes written over the file at `offset`, and what they replaced.
  struct Damage: CustomStringConvertible {
    var kind: String
    var page: UInt64
    var offset: Int
    var bytes: [UInt8]
    var description: String {
      "\(kind) on page \(page), byte \(offset) := \(bytes.map { String($0, radix: 16) })"
    }
  }

  /// The root of each tree made to name an inner branch of each other tree: the walk of the first
  /// then covers a whole subtree of the second, on whichever thread. Both ways name the branch where
  /// the trees meet (the merge of two threads' pages alone would find the lowest-numbered page of
  /// the subtree, a leaf, and which trees share a thread depends on the processors).
  @Test func aBranchTwoTreesNameIsRefusedWalkedEitherWay() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let (file, transaction) = try makeFile(in: scratch.path + "/store")
    let raw = try RawDataFile(path: file)
    let pageSize = try #require(raw.pageSizeNamedByMetaPage0())
    let fd = open(file, O_RDWR | O_CLOEXEC)
    try #require(fd >= 0)
    defer { close(fd) }
    var trees: [String: (root: UInt64, branches: [UInt64], leaves: [UInt64])] = [:]
    for shape in Self.shapes {
      let tree = try #require(raw.liveTree(named: shape.name, pageSize: pageSize))
      trees[shape.name] = tree
    }
    for from in Self.shapes.map(\.name) {
      for to in Self.shapes.map(\.name) where to != from {
        let source = try #require(trees[from])
        guard let target = try #require(trees[to]).branches.dropFirst().first else { continue }
        let root = try #require(raw.page(source.root, pageSize: pageSize))
        try #require(root.isBranch)
        let node = Int(
          UInt16(root.bytes[PageLayout.pageHeaderSize]) | UInt16(root.bytes[PageLayout.pageHeaderSize + 1])
            << 8)
        let offset = Int(source.root) * pageSize + node
        let original = raw.read(at: offset, count: 4)
        let fields = withUnsafeBytes(of: UInt32(target).littleEndian) { Array($0) }
        try #require(fields.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4, off_t(offset)) } == 4)
        let one = try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: .max)
        let several = try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: 0)
        try #require(original.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4, off_t(offset)) } == 4)
        #expect(one == "a database's tree is damaged: page \(target) is named twice in the trees")
        #expect(several == one, "\(from) naming \(to)'s branch \(target)")
      }
    }
  }

  @Test func seededDamagesAreRefusedAlikeWalkedEitherWay() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let (file, transaction) = try makeFile(in: scratch.path + "/store")
    let raw = try RawDataFile(path: file)
    let pageSize = try #require(raw.pageSizeNamedByMetaPage0())
    let meta = try #require(DataFileCheck.read(file).newest)

    var treePages: [UInt64] = []
    var branches: [UInt64] = []
    for shape in Self.shapes {
      let tree = try #require(raw.liveTree(named: shape.name, pageSize: pageSize))
      treePages += tree.branches + tree.leaves
      branches += tree.branches
    }
    try #require(treePages.count >= 4096, "only \(treePages.count) tree pages")
    try #require(branches.count >= Self.shapes.count)
    // The main database's leaf holds the trees' records (root, depth, page counts, flags).
    let main = try #require(raw.page(meta.mainRoot, pageSize: pageSize))
    try #require(main.isLeaf)
    let records = main.leafNodes().compactMap(\.inlineData)
    try #require(records.count == Self.shapes.count)
    try #require(meta.freeRoot != .max)
    let healthy = (
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: .max),
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: 0)
    )
    try #require(healthy.0 == nil && healthy.1 == nil, "\(healthy)")

    let fd = open(file, O_RDWR | O_CLOEXEC)
    try #require(fd >= 0)
    defer { close(fd) }
    func write(_ bytes: [UInt8], at offset: Int) throws {
      let wrote = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
      try #require(wrote == bytes.count)
    }

    var random = SeededRandom(seed: Self.seed)
    func below(_ bound: Int) -> Int { Int(random.next() % UInt64(bound)) }
    var refused = 0
    for index in 0..<Self.cases {
      let damage: Damage
      let roll = below(100)
      if roll < 30 {  // one bit anywhere in a tree page
        let page = treePages[below(treePages.count)]
        let offset = Int(page) * pageSize + below(pageSize)
        let old = raw.read(at: offset, count: 1).first ?? 0
        damage = Damage(kind: "bit flip", page: page, offset: offset, bytes: [old ^ UInt8(1 << below(8))])
      } else if roll < 50 {  // one byte of a page header
        let page = treePages[below(treePages.count)]
        let offset = Int(page) * pageSize + below(PageLayout.pageHeaderSize)
        damage = Damage(kind: "header byte", page: page, offset: offset, bytes: [UInt8(below(256))])
      } else if roll < 70 {  // one byte of the node pointers or of a node's header
        let page = treePages[below(treePages.count)]
        let bytes = try #require(raw.page(page, pageSize: pageSize)).bytes
        let lower = Int(
          UInt16(bytes[PageLayout.lowerOffset]) | UInt16(bytes[PageLayout.lowerOffset + 1]) << 8)
        let pointer = PageLayout.pageHeaderSize + below(max(1, lower - PageLayout.pageHeaderSize) / 2 + 1) * 2
        let node = Int(UInt16(bytes[pointer]) | UInt16(bytes[pointer + 1]) << 8)
        let within =
          below(2) == 0 ? pointer + below(2) : min(node + below(PageLayout.nodeHeaderSize), pageSize - 1)
        damage = Damage(
          kind: "node byte", page: page, offset: Int(page) * pageSize + within, bytes: [UInt8(below(256))])
      } else if roll < 85 {  // a branch's child made to name some other page in use
        let page = branches[below(branches.count)]
        let bytes = try #require(raw.page(page, pageSize: pageSize)).bytes
        let lower = Int(
          UInt16(bytes[PageLayout.lowerOffset]) | UInt16(bytes[PageLayout.lowerOffset + 1]) << 8)
        let pointer = PageLayout.pageHeaderSize + below((lower - PageLayout.pageHeaderSize) / 2) * 2
        let node = Int(UInt16(bytes[pointer]) | UInt16(bytes[pointer + 1]) << 8)
        let target = UInt64(2 + below(Int(meta.lastPage) - 1))
        // The child's number: low and high halves, then the flags field's top bits (zero here).
        let fields = withUnsafeBytes(of: UInt32(target).littleEndian) { Array($0) }
        damage = Damage(kind: "branch child", page: page, offset: Int(page) * pageSize + node, bytes: fields)
      } else if roll < 95 {  // one byte of a tree's record in the main database
        let record = records[below(records.count)]
        let offset = Int(meta.mainRoot) * pageSize + record.lowerBound + below(record.count)
        damage = Damage(kind: "record byte", page: meta.mainRoot, offset: offset, bytes: [UInt8(below(256))])
      } else {  // one byte of the free database's root
        let offset = Int(meta.freeRoot) * pageSize + below(pageSize)
        damage = Damage(
          kind: "free-list byte", page: meta.freeRoot, offset: offset, bytes: [UInt8(below(256))])
      }
      let original = raw.read(at: damage.offset, count: damage.bytes.count)
      try write(damage.bytes, at: damage.offset)
      let one = try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: .max)
      let several = try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: 0)
      try write(original, at: damage.offset)
      // The same words, not only both refused: a damaged file walked on several threads is named
      // by the walk on one.
      #expect(
        one == several,
        "seed \(Self.seed) case \(index): \(damage): one thread \(one ?? "clean"), several \(several ?? "clean")"
      )
      if one != nil { refused += 1 }
    }
    print("\(Self.cases) damages from seed \(Self.seed): \(refused) refused")
  }
}
