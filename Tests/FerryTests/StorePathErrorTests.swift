import Foundation
import Testing

@testable import Ferry

/// Paths an app may get wrong reach it as the ``FerryError`` case that names the mistake — never a
/// bare storage error, and never a store opened or created somewhere else.
@Suite struct StorePathErrorTests {
  /// C stops reading a path at its first NUL: the open must refuse it, not create the store at
  /// the part before the NUL.
  @Test func aPathWithANulIsAnInvalidArgumentAndCreatesNothing() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let error = await thrownFerryError { () async throws(FerryError) in
      _ = try await FerryStore.open(at: fixture.path + "\0more")
    }
    guard case .invalidArgument(let message) = error else {
      Issue.record("a path with a NUL threw \(String(describing: error))")
      return
    }
    #expect(message.contains("NUL"), "\(message)")
    #expect(!FileManager.default.fileExists(atPath: fixture.path))
    let readOnly = await thrownFerryError { () async throws(FerryError) in
      _ = try FerryStore.openReadOnly(at: fixture.path + "\0more")
    }
    guard case .invalidArgument = readOnly else {
      Issue.record("a read-only open of a path with a NUL threw \(String(describing: readOnly))")
      return
    }
  }

  @Test func aPathBelowAPlainFileIsNotAStore() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    try FileManager.default.createDirectory(atPath: fixture.path, withIntermediateDirectories: true)
    let file = fixture.path + "/notes.txt"
    try Data("not a directory".utf8).write(to: URL(fileURLWithPath: file))
    for readOnly in [false, true] {
      let error = await thrownFerryError { () async throws(FerryError) in
        if readOnly {
          _ = try FerryStore.openReadOnly(at: file + "/store")
        } else {
          _ = try await FerryStore.open(at: file + "/store")
        }
      }
      guard case .notAStore(let path, let reason) = error else {
        Issue.record("opening below a plain file (read-only: \(readOnly)) threw \(String(describing: error))")
        continue
      }
      #expect(path == file + "/store")
      #expect(reason.contains("part of its path is a file"), "\(reason)")
    }
  }

  @Test func aPathTooLongForTheFileSystemIsAnInvalidArgument() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    try FileManager.default.createDirectory(atPath: fixture.path, withIntermediateDirectories: true)
    for path in [
      fixture.path + "/" + String(repeating: "n", count: 300),
      fixture.path + String(repeating: "/d", count: 2_100),
    ] {
      let error = await thrownFerryError { () async throws(FerryError) in
        _ = try await FerryStore.open(at: path)
      }
      guard case .invalidArgument(let message) = error else {
        Issue.record("a \(path.utf8.count)-byte path threw \(String(describing: error))")
        continue
      }
      #expect(message.contains("too long"), "\(message)")
    }
  }

  /// A directory where LMDB's lock file belongs: the store is damaged, and the message says which
  /// file and what to do.
  @Test func aDirectoryInPlaceOfTheLockFileIsDamaged() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    _ = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    store.close()
    try FileManager.default.removeItem(atPath: fixture.path + "/lock.mdb")
    try FileManager.default.createDirectory(
      atPath: fixture.path + "/lock.mdb", withIntermediateDirectories: false)
    let error = await thrownFerryError { () async throws(FerryError) in
      _ = try await FerryStore.open(at: fixture.path, configuration: fixture.configuration())
    }
    guard case .damaged(let path, let message) = error else {
      Issue.record("a directory as lock.mdb threw \(String(describing: error))")
      return
    }
    #expect(path == fixture.path)
    #expect(message.contains("lock.mdb is a directory"), "\(message)")
  }
}
