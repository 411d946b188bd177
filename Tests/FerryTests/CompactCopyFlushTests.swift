@_spi(Engine) import Ferry
import FerryLog
import Foundation
import TestSupport
import Testing

/// `ferry compact --copy` (the worker runs the same function) when a flush to the disk fails: a
/// failure injected at the flush of the compacted copy, before the rename, must leave the store's
/// own data.mdb in place byte for byte; one at the directory's flush after the rename is reported.
/// Both exit with status 12 and keep every pending task.
@Suite(.timeLimit(.minutes(20))) struct CompactCopyFlushTests {
  @Test func aFailedFlushOfTheCopyLeavesTheOriginalDataFileInPlace() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let kept = try await Self.storeWithFinishedAndPendingTasks(fixture)
    let goOn = fixture.path + ".go-on"
    defer { try? FileManager.default.removeItem(atPath: goOn) }
    // Stopped once its copy is made — the events already removed in place — so that the data file
    // can be read as the swap would replace it.
    let compactor = try Child(
      "ferry-test-worker", ["compact-copy", fixture.path],
      environment: [
        "FERRY_CRASH_POINT": "compact.copied", "FERRY_CRASH_SIGNAL": "STOP", "FERRY_CRASH_GO_ON_FILE": goOn,
        "FERRY_FAIL_FLUSH": "compact.copy",
      ])
    defer { compactor.kill() }
    try await pollUntil { isStopped(compactor.pid) || !compactor.process.isRunning }
    try #require(isStopped(compactor.pid), "the compactor did not reach its copy: \(compactor.output)")
    let original = try Data(contentsOf: URL(fileURLWithPath: fixture.path + "/data.mdb"))
    let entries = try FileManager.default.contentsOfDirectory(atPath: fixture.path).sorted()
    try #require(entries.contains { $0.hasPrefix(".compact-") }, "no copy beside the store: \(entries)")

    #expect(FileManager.default.createFile(atPath: goOn, contents: nil))
    kill(compactor.pid, SIGCONT)
    let said = try await compactor.waitForLine(startingWith: "")  // "compacted" or "refused S M"
    #expect(said.hasPrefix("refused 12 "), "\(said)")
    #expect(
      said.contains("could not flush the compacted copy") && said.contains("nothing was swapped"), "\(said)")

    #expect(try Data(contentsOf: URL(fileURLWithPath: fixture.path + "/data.mdb")) == original)
    let after = try FileManager.default.contentsOfDirectory(atPath: fixture.path).sorted()
    #expect(after.contains("lock.mdb"), "LMDB's lock file was removed: \(after)")
    #expect(!after.contains { $0.hasPrefix(".compact-") }, "the copy was left behind: \(after)")
    try await Self.expectWhole(fixture, kept: kept)
  }

  @Test func aFailedFlushOfTheDirectoryAfterTheSwapIsReported() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let kept = try await Self.storeWithFinishedAndPendingTasks(fixture)
    let compactor = try Child(
      "ferry-test-worker", ["compact-copy", fixture.path],
      environment: ["FERRY_FAIL_FLUSH": "compact.directory"])
    defer { compactor.kill() }
    let said = try await compactor.waitForLine(startingWith: "")
    #expect(said.hasPrefix("refused 12 "), "\(said)")
    #expect(said.contains("the compacted copy is in place"), "\(said)")
    let after = try FileManager.default.contentsOfDirectory(atPath: fixture.path).sorted()
    #expect(!after.contains { $0.hasPrefix(".compact-") }, "the copy was left behind: \(after)")
    try await Self.expectWhole(fixture, kept: kept)
  }
}

extension CompactCopyFlushTests {
  /// 120 tasks, the even ones succeeded (their events are what compaction removes); the pending ids.
  static func storeWithFinishedAndPendingTasks(_ fixture: QueueFixture) async throws -> Set<TaskID> {
    let store = try await fixture.openStore()
    defer { store.close() }
    var ids: [TaskID] = []
    for n in 0..<120 { ids.append(try await store.queue.add(tag: "t", payload: ["n": n])) }
    let runner = TaskRunner(queue: store.queue)
    runner.register(tag: "t") { task in
      task.id.rawValue % 2 == 0 ? .succeeded : .failed("later", retryable: false)
    }
    _ = try await runner.run()
    return Set(ids.filter { $0.rawValue % 2 == 1 })
  }

  /// The store opens with exactly the pending tasks and verifies.
  static func expectWhole(_ fixture: QueueFixture, kept: Set<TaskID>) async throws {
    let store = try await fixture.openStore()
    defer { store.close() }
    #expect(Set(try store.queue.pendingTasks().map(\.id)) == kept)
    #expect(try store.log.verify().isHealthy)
  }
}
