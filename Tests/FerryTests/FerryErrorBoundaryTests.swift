import FerryLog
import Foundation
import Testing

@testable import Ferry

/// The store's failures reach the app as ``FerryError`` — the case that names them, with a message
/// a person can act on — and never as the engine's `FerryLogError`: real stores, real files.
@Suite struct FerryErrorBoundaryTests {
  @Test func anAddAndARunAfterCloseAreClosed() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "t") { _ in .succeeded }
    store.close()
    let add = await thrownFerryError { () async throws(FerryError) in
      _ = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    }
    #expect(add == .closed)
    #expect(add?.description == "the store is closed")
    let run = await thrownFerryError { () async throws(FerryError) in _ = try await runner.run() }
    #expect(run == .closed)
    let read = await thrownFerryError { () async throws(FerryError) in
      _ = try store.ledger.state(key: "k", maxAge: .seconds(1))
    }
    #expect(read == .closed)
  }

  @Test func callsWhileSuspendedAreSuspended() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    await store.suspend()
    let read = await thrownFerryError { () async throws(FerryError) in _ = try store.queue.pendingTasks() }
    #expect(read == .suspended)
    #expect(read?.description.contains("resume it") == true)
    let add = await thrownFerryError { () async throws(FerryError) in
      _ = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    }
    #expect(add == .suspended)
    try await store.resume()
    #expect(try store.queue.pendingTasks().isEmpty)
  }

  @Test func aPlainFileIsNotAStore() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    try FileManager.default.createDirectory(atPath: fixture.path, withIntermediateDirectories: true)
    let file = fixture.path + "/notes.txt"
    try Data("not a store".utf8).write(to: URL(fileURLWithPath: file))
    let error = await thrownFerryError { () async throws(FerryError) in
      _ = try await FerryStore.open(at: file)
    }
    guard case .notAStore(let path, _) = error else {
      Issue.record("opening a plain file threw \(String(describing: error))")
      return
    }
    #expect(path == file)
    #expect(error?.description.contains("\(file) is not a Ferry store") == true)
  }

  @Test func aMissingStoreWithoutCreateIsNoSuchStore() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let error = await thrownFerryError { () async throws(FerryError) in
      var configuration = FerryStore.Configuration()
      configuration.createIfMissing = false
      _ = try await FerryStore.open(at: fixture.path, configuration: configuration)
    }
    #expect(error == .noSuchStore(path: fixture.path))
    #expect(error?.description.contains("no Ferry store at \(fixture.path)") == true)
    let readOnly = await thrownFerryError { () async throws(FerryError) in
      _ = try FerryStore.openReadOnly(at: fixture.path)
    }
    #expect(readOnly == .noSuchStore(path: fixture.path))
  }

  @Test func aSecondOpenInTheProcessIsAlreadyOpen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let error = await thrownFerryError { () async throws(FerryError) in
      _ = try await FerryStore.open(at: fixture.path, configuration: fixture.configuration { _ in })
    }
    guard case .alreadyOpen = error else {
      Issue.record("a second open threw \(String(describing: error))")
      return
    }
    #expect(error?.description.contains("already open in this process") == true)
  }

  /// A data file replaced by an older copy lost acknowledged commits: damaged, with the engine's
  /// advice to salvage, and nothing written.
  @Test func aStoreThatLostCommitsIsDamaged() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let copy = fixture.path + ".older-data"
    defer { try? FileManager.default.removeItem(atPath: copy) }
    // Flushed commits: an older data.mdb put back under a write-ahead segment is refused as
    // replaced, not as lost commits (SegmentRecoveryTests).
    var store = try await fixture.openStore { $0.writeAheadSegment = false }
    for n in 0..<3 { try await store.queue.add(tag: "t", payload: Item(name: "\(n)")) }
    store.close()
    try FileManager.default.copyItem(atPath: fixture.path + "/data.mdb", toPath: copy)
    store = try await fixture.openStore { $0.writeAheadSegment = false }
    for n in 3..<6 { try await store.queue.add(tag: "t", payload: Item(name: "\(n)")) }
    store.close()
    try FileManager.default.removeItem(atPath: fixture.path + "/data.mdb")
    try FileManager.default.copyItem(atPath: copy, toPath: fixture.path + "/data.mdb")

    let error = await thrownFerryError { () async throws(FerryError) in
      _ = try await FerryStore.open(
        at: fixture.path, configuration: fixture.configuration { $0.writeAheadSegment = false })
    }
    guard case .damaged(let path, let message) = error else {
      Issue.record("opening a store that lost commits threw \(String(describing: error))")
      return
    }
    #expect(path == fixture.path)
    #expect(message.contains("lost its newest commits"), "\(message)")
    #expect(message.contains("ferry salvage"), "\(message)")
  }

  /// A refresh returns its outcome; the store's failure beneath it is a FerryError too.
  @Test func aRefreshOfAClosedStoreFailsWithFerryError() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    let notes = try CacheRepository<[String]>(
      key: "notes", ledger: store.ledger, maxAge: .seconds(60),
      source: CacheSource(fetch: { ["milk"] }, save: { _ in }, load: { nil }), automaticRefresh: false)
    store.close()
    let result = await notes.refresh(force: true)
    guard case .failed(let error) = result else {
      Issue.record("a refresh of a closed store gave \(result)")
      return
    }
    #expect(error.underlying as? FerryError == .closed, "\(String(describing: error.underlying))")
    #expect(!(error.underlying is FerryLogError))
  }

  /// The mapping of the engine's cases that a test cannot easily make with a real store.
  @Test func theEngineErrorsMapToTheirCasesWithTheirMessages() {
    let newer = FerryError(engine: .newerFormat(path: "/s", found: 9, supported: 3))
    #expect(
      newer
        == .newerFormat(
          path: "/s", message: FerryLogError.newerFormat(path: "/s", found: 9, supported: 3).description))
    #expect(newer.description.contains("upgrade Ferry"))
    guard
      case .damaged(nil, let message) = FerryError(
        engine: .corruptRecord(sequence: 7, reason: "CRC32C mismatch"))
    else {
      Issue.record("a corrupt record is not damage")
      return
    }
    #expect(message.contains("sequence 7"))
    #expect(
      FerryError(engine: .sequenceGap(expected: 4, found: 6)).description.contains("sequence 4 is missing"))
    #expect(FerryError(engine: .diskFull(path: "/s")) == .diskFull(path: "/s"))
    #expect(
      FerryError(engine: .diskFull(path: "/s")).description == FerryLogError.diskFull(path: "/s").description)
    #expect(FerryError(engine: .quotaExceeded(path: "/s")) == .quotaExceeded(path: "/s"))
    #expect(FerryError(engine: .needsRecovery(path: "/s")).description.contains("ferry recover /s"))
    let notCurrent = FerryError(
      engine: .projectionNotCurrent(projection: "queue", reason: "a read-only store"))
    #expect(
      notCurrent
        == .notCurrent(
          FerryLogError.projectionNotCurrent(projection: "queue", reason: "a read-only store").description))
    let damagePage = FerryError(
      engine: .storage(StorageFailure(code: -30796, name: "MDB_CORRUPTED", message: "page 12")))
    #expect(damagePage.description.contains("the store is damaged"))
    let failed = FerryError(
      engine: .projectionFailed(projection: "queue", sequence: 3, underlying: FerryError.noSuchTask(3)))
    #expect(failed == .noSuchTask(3))
    // A stored event that no longer decodes while folded is damage, as when it is read directly.
    let undecodable = FerryError(
      engine: .projectionFailed(projection: "queue", sequence: 3, underlying: PayloadError("truncated tag")))
    guard case .damaged(nil, let foldMessage) = undecodable else {
      Issue.record("an undecodable event met while folding is \(undecodable), not damage")
      return
    }
    #expect(foldMessage.contains("truncated tag"))
    // A schema this code does not know: newer software when stored, the caller's mistake when appended.
    let storedSchema = FerryError(
      engine: .unsupportedSchemaVersion(type: "task.added", version: 9, supported: 3, sequence: 12))
    guard case .newerFormat = storedSchema else {
      Issue.record("a stored event of a newer schema is \(storedSchema)")
      return
    }
    let appendedSchema = FerryError(
      engine: .unsupportedSchemaVersion(type: "task.added", version: 9, supported: 3, sequence: nil))
    guard case .invalidArgument = appendedSchema else {
      Issue.record("an appended event of an unknown schema is \(appendedSchema)")
      return
    }
    #expect(FerryError(CancellationError()) == .cancelled)
    #expect(FerryError(FerryError.taskRunning(5)) == .taskRunning(5))
  }
}
