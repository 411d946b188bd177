import FerryTools
import Foundation
import LMDB
import TestSupport
import Testing

/// The open's check of LMDB's free-page list against the live trees walks the named databases on
/// several threads when they are large. Both ways must find the same damage, in whichever tree, and a
/// page two trees name must be found when they are walked on different threads.
@Suite(.timeLimit(.minutes(20))) struct FreeListCheckTests {
  static let names = ["a", "b", "c", "d"]

  /// A plain LMDB file of four named databases of about 90 leaf pages each (depth 2), written
  /// with flushed commits and closed; returns its data file and its newest transaction.
  func makeFile(in directory: String) throws -> (file: String, transaction: UInt64) {
    let env = try Environment.open(path: directory, databases: Self.names)
    for name in Self.names {
      let db = try env.database(name)
      try env.write { txn in
        for i in 0..<3000 {
          try txn.put(
            db, key: Array(String(format: "%@-%06d", name, i).utf8),
            value: [UInt8](repeating: UInt8(i & 0xFF), count: 100))
        }
      }
    }
    env.close()
    let check = try DataFileCheck.read(directory + "/data.mdb")
    let transaction = try #require(check.metas.compactMap { $0 }.map(\.transaction).max())
    return (directory + "/data.mdb", transaction)
  }

  /// What the check says of `file` walked on one thread, and on two.
  func verdicts(_ file: String, _ transaction: UInt64) throws -> (one: String?, two: String?) {
    (
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: .max),
      try DataFileCheck.freeListProblem(file, transaction: transaction, parallelAbove: 0)
    )
  }

  /// A copy of the data file to damage, in its own directory.
  func copy(_ file: String, to directory: String) throws -> String {
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let target = directory + "/data.mdb"
    try FileManager.default.copyItem(atPath: file, toPath: target)
    return target
  }

  @Test func aHealthyFileIsCleanWalkedEitherWay() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let (file, transaction) = try makeFile(in: scratch.path + "/store")
    let raw = try RawDataFile(path: file)
    let pageSize = try #require(raw.pageSizeNamedByMetaPage0())
    for name in Self.names {
      let tree = try #require(raw.liveTree(named: name, pageSize: pageSize))
      try #require(tree.leaves.count >= 40, "\(name) has \(tree.leaves.count) leaves")
    }
    let verdict = try verdicts(file, transaction)
    #expect(verdict.one == nil && verdict.two == nil, "\(String(describing: verdict))")
  }

  /// A leaf of each tree in turn names another page in its header (what LMDB frees when it next
  /// copies the leaf): found, and named alike, whichever thread walks that tree.
  @Test func aLeafThatMisnamesItselfIsFoundInEveryTree() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let (file, transaction) = try makeFile(in: scratch.path + "/store")
    let raw = try RawDataFile(path: file)
    let pageSize = try #require(raw.pageSizeNamedByMetaPage0())
    for name in Self.names {
      let damaged = try copy(file, to: scratch.path + "/leaf-\(name)")
      let tree = try #require(raw.liveTree(named: name, pageSize: pageSize))
      let leaf = tree.leaves[tree.leaves.count / 2]
      try overwrite(
        damaged, at: Int(leaf) * pageSize + PageLayout.pageNumberOffset,
        with: withUnsafeBytes(of: (leaf + 1).littleEndian) { Array($0) })
      let verdict = try verdicts(damaged, transaction)
      #expect(verdict.one == "a database's tree is damaged: page \(leaf) says it is page \(leaf + 1)")
      #expect(verdict.two == verdict.one, "tree \(name)")
    }
  }

  /// The root of tree "a" made to name a leaf of tree "d" in place of its first child: that page is
  /// named twice, found from one thread or when the threads' pages are put together.
  @Test func aPageTwoTreesNameIsFoundWalkedEitherWay() throws {
    let scratch = try Scratch()
    defer { scratch.remove() }
    let (file, transaction) = try makeFile(in: scratch.path + "/store")
    let raw = try RawDataFile(path: file)
    let pageSize = try #require(raw.pageSizeNamedByMetaPage0())
    for (from, to) in [("a", "d"), ("a", "b"), ("d", "c")] {
      let damaged = try copy(file, to: scratch.path + "/shared-\(from)-\(to)")
      let source = try #require(raw.liveTree(named: from, pageSize: pageSize))
      let target = try #require(raw.liveTree(named: to, pageSize: pageSize)).leaves[3]
      let root = try #require(raw.page(source.root, pageSize: pageSize))
      try #require(root.isBranch)
      // The first node of the root: its low, high and flags fields hold the child's page number.
      let node = Int(
        UInt16(root.bytes[PageLayout.pageHeaderSize]) | UInt16(root.bytes[PageLayout.pageHeaderSize + 1]) << 8
      )
      var fields: [UInt8] = []
      for part in [target & 0xFFFF, (target >> 16) & 0xFFFF, target >> 32] {
        fields += withUnsafeBytes(of: UInt16(part).littleEndian) { Array($0) }
      }
      try overwrite(damaged, at: Int(source.root) * pageSize + node, with: fields)
      let verdict = try verdicts(damaged, transaction)
      #expect(verdict.one == "a database's tree is damaged: page \(target) is named twice in the trees")
      #expect(verdict.two == verdict.one, "\(from) naming a leaf of \(to)")
    }
  }
}
