import FerryLog
import FerryTools
import Foundation
import LMDB
import TestSupport
import Testing

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

  /// The file, its records rewritten every 97th so that LMDB's free list names pages.
  func makeFile() throws -> FreeListCheckFile {
    try FreeListCheckFile(shapes: Self.shapes, rewriteEvery: 97)
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
    let fixture = try makeFile()
    defer { fixture.remove() }
    for from in Self.shapes.map(\.name) {
      for to in Self.shapes.map(\.name) where to != from {
        let source = try fixture.tree(from)
        guard let target = try fixture.tree(to).branches.dropFirst().first else { continue }
        try #require(try #require(fixture.raw.page(source.root, pageSize: fixture.pageSize)).isBranch)
        let verdict = try fixture.verdicts(
          with: FreeListCheckFile.childFields(target), at: try fixture.nodeOffset(page: source.root, index: 0)
        )
        #expect(verdict.one == "a database's tree is damaged: page \(target) is named twice in the trees")
        #expect(verdict.several == verdict.one, "\(from) naming \(to)'s branch \(target)")
      }
    }
  }

  @Test func seededDamagesAreRefusedAlikeWalkedEitherWay() throws {
    let fixture = try makeFile()
    defer { fixture.remove() }
    let (raw, pageSize) = (fixture.raw, fixture.pageSize)
    let meta = try #require(DataFileCheck.read(fixture.file).newest)

    var treePages: [UInt64] = []
    var branches: [UInt64] = []
    for shape in Self.shapes {
      let tree = try fixture.tree(shape.name)
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
    let healthy = try fixture.verdicts()
    try #require(healthy.one == nil && healthy.several == nil, "\(healthy)")

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
        let lower = Int(u16(bytes, at: PageLayout.lowerOffset))
        let pointer = PageLayout.pageHeaderSize + below(max(1, lower - PageLayout.pageHeaderSize) / 2 + 1) * 2
        let node = Int(u16(bytes, at: pointer))
        let within =
          below(2) == 0 ? pointer + below(2) : min(node + below(PageLayout.nodeHeaderSize), pageSize - 1)
        damage = Damage(
          kind: "node byte", page: page, offset: Int(page) * pageSize + within, bytes: [UInt8(below(256))])
      } else if roll < 85 {  // a branch's child made to name some other page in use
        let page = branches[below(branches.count)]
        let bytes = try #require(raw.page(page, pageSize: pageSize)).bytes
        let lower = Int(u16(bytes, at: PageLayout.lowerOffset))
        let node = try fixture.nodeOffset(page: page, index: below((lower - PageLayout.pageHeaderSize) / 2))
        let target = UInt64(2 + below(Int(meta.lastPage) - 1))
        damage = Damage(
          kind: "branch child", page: page, offset: node, bytes: FreeListCheckFile.childFields(target))
      } else if roll < 95 {  // one byte of a tree's record in the main database
        let record = records[below(records.count)]
        let offset = Int(meta.mainRoot) * pageSize + record.lowerBound + below(record.count)
        damage = Damage(kind: "record byte", page: meta.mainRoot, offset: offset, bytes: [UInt8(below(256))])
      } else {  // one byte of the free database's root
        let offset = Int(meta.freeRoot) * pageSize + below(pageSize)
        damage = Damage(
          kind: "free-list byte", page: meta.freeRoot, offset: offset, bytes: [UInt8(below(256))])
      }
      let (one, several) = try fixture.verdicts(with: damage.bytes, at: damage.offset)
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
