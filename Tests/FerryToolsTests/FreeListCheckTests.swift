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

  /// Four named databases of about 90 leaf pages each (depth 2).
  func makeFile() throws -> FreeListCheckFile {
    try FreeListCheckFile(shapes: Self.names.map { ($0, 3000, 100) })
  }

  @Test func aHealthyFileIsCleanWalkedEitherWay() throws {
    let fixture = try makeFile()
    defer { fixture.remove() }
    for name in Self.names {
      let tree = try fixture.tree(name)
      try #require(tree.leaves.count >= 40, "\(name) has \(tree.leaves.count) leaves")
    }
    let verdict = try fixture.verdicts()
    #expect(verdict.one == nil && verdict.several == nil, "\(String(describing: verdict))")
  }

  /// A leaf of each tree in turn names another page in its header (what LMDB frees when it next
  /// copies the leaf): found, and named alike, whichever thread walks that tree.
  @Test func aLeafThatMisnamesItselfIsFoundInEveryTree() throws {
    let fixture = try makeFile()
    defer { fixture.remove() }
    for name in Self.names {
      let tree = try fixture.tree(name)
      let leaf = tree.leaves[tree.leaves.count / 2]
      let verdict = try fixture.verdicts(
        with: withUnsafeBytes(of: (leaf + 1).littleEndian) { Array($0) },
        at: Int(leaf) * fixture.pageSize + PageLayout.pageNumberOffset)
      #expect(verdict.one == "a database's tree is damaged: page \(leaf) says it is page \(leaf + 1)")
      #expect(verdict.several == verdict.one, "tree \(name)")
    }
  }

  /// The root of tree "a" made to name a leaf of tree "d" in place of its first child: that page is
  /// named twice, found from one thread or when the threads' pages are put together.
  @Test func aPageTwoTreesNameIsFoundWalkedEitherWay() throws {
    let fixture = try makeFile()
    defer { fixture.remove() }
    for (from, to) in [("a", "d"), ("a", "b"), ("d", "c")] {
      let source = try fixture.tree(from)
      let target = try fixture.tree(to).leaves[3]
      try #require(try #require(fixture.raw.page(source.root, pageSize: fixture.pageSize)).isBranch)
      let verdict = try fixture.verdicts(
        with: FreeListCheckFile.childFields(target), at: try fixture.nodeOffset(page: source.root, index: 0))
      #expect(verdict.one == "a database's tree is damaged: page \(target) is named twice in the trees")
      #expect(verdict.several == verdict.one, "\(from) naming a leaf of \(to)")
    }
  }
}
