import Foundation
import Testing

@testable import LMDB

/// Which LMDB Ferry runs on: its own reads of the data file know LMDB 0.9's page layout only.
@Suite(.timeLimit(.minutes(20))) struct LMDBVersionTests {
  /// The 0.9 releases and the 0.9 development branch (`mdb.master`, 0.9.70) share the layout.
  @Test(arguments: [(0, 9, 0), (0, 9, 14), (0, 9, 31), (0, 9, 33), (0, 9, 70), (0, 9, 89)])
  func theReleasesOfZeroNineAreSupported(major: Int, minor: Int, patch: Int) {
    #expect(LMDBVersion(major: major, minor: minor, patch: patch).isSupported)
  }

  /// LMDB 1.0 in development calls itself 0.9.90 (`mdb.master3`, 24-byte page headers); any
  /// other major or minor is a layout nobody checked.
  @Test(arguments: [
    (0, 9, 90), (0, 9, 99), (1, 0, 0), (1, 9, 5), (0, 10, 0), (0, 8, 9), (2, 0, 0), (0, 9, -1),
  ])
  func anotherLayoutIsRefused(major: Int, minor: Int, patch: Int) {
    let version = LMDBVersion(major: major, minor: minor, patch: patch)
    #expect(!version.isSupported)
    let refusal = #expect(throws: LMDBError.versionMismatch) { try LMDBVersion.requireSupported(version) }
    #expect(
      refusal?.message.contains("LMDB \(major).\(minor).\(patch),") == true, "\(String(describing: refusal))")
    #expect(refusal?.message.contains(LMDBVersion.supportedRange) == true)
  }

  @Test func theLinkedLMDBIsSupported() throws {
    #expect(LMDBVersion.linked.isSupported, "linked LMDB \(LMDBVersion.linked)")
    #expect(LMDBVersion.linked >= LMDBVersion(major: 0, minor: 9, patch: 0))
    try LMDBVersion.requireSupported()
  }

  /// An open on another LMDB is refused before it creates the directory or touches an existing
  /// environment's files; the same environment then opens on the linked one, its data whole.
  @Test func anOpenOnAnotherLayoutIsRefusedBeforeItTouchesAnything() throws {
    let scratch = ScratchDirectory()
    defer { scratch.remove() }
    var other = Environment.Options()
    other.lmdbVersionInPlaceOfLinked = LMDBVersion(major: 0, minor: 9, patch: 90)
    let refusal = #expect(throws: LMDBError.versionMismatch) {
      try Environment.open(path: scratch.path, options: other)
    }
    #expect(refusal?.message.contains("LMDB 0.9.90,") == true)
    #expect(!FileManager.default.fileExists(atPath: scratch.path), "the refused open created the directory")

    let env = try Environment.open(path: scratch.path, databases: ["a"])
    let a = try env.database("a")
    try env.write { try $0.put(a, key: [1], value: [42]) }
    env.close()
    let before = try Data(contentsOf: URL(fileURLWithPath: scratch.child("data.mdb")))
    other.lmdbVersionInPlaceOfLinked = LMDBVersion(major: 1, minor: 0, patch: 0)
    #expect(throws: LMDBError.versionMismatch) { try Environment.open(path: scratch.path, options: other) }
    #expect(try Data(contentsOf: URL(fileURLWithPath: scratch.child("data.mdb"))) == before)

    let again = try Environment.open(path: scratch.path, databases: ["a"])
    defer { again.close() }
    #expect(try again.read { try $0.get(again.database("a"), key: [1]) } == [42])
  }
}
