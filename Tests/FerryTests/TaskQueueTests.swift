import FerryLog
import FerryTesting
import Foundation
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

struct Item: Codable, Equatable, Sendable {
  var name: String
}

/// A fresh store directory and a clock the test moves by hand.
final class QueueFixture: Sendable {
  let path = FileManager.default.temporaryDirectory.path + "/ferry-queue-\(UUID().uuidString.prefix(8))"
  let clock = ManualClock(date: at(1_700_000_000_000))

  /// The clock's time (Unix milliseconds); setting it moves the clock.
  var time: Int64 {
    get { clock.milliseconds }
    set { clock.set(milliseconds: newValue) }
  }

  /// The store's configuration on this fixture's clock.
  func configuration(
    _ configure: (inout FerryStore.Configuration) -> Void = { _ in }
  ) -> FerryStore.Configuration {
    var configuration = FerryStore.Configuration()
    clock.install(in: &configuration)
    configure(&configuration)
    return configuration
  }

  func open() async throws -> TaskQueue {
    try await TaskQueue.open(at: path, configuration: configuration())
  }

  func openStore(_ configure: (inout FerryStore.Configuration) -> Void = { _ in }) async throws -> FerryStore
  {
    try await FerryStore.open(at: path, configuration: configuration(configure))
  }

  func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Runs `body` on a fresh store with its own directory and test clock, then closes and removes it.
func withStore(
  _ configure: (inout FerryStore.Configuration) -> Void = { _ in },
  _ body: (FerryStore, ManualClock, QueueFixture) async throws -> Void
) async throws {
  let fixture = QueueFixture()
  defer { fixture.remove() }
  let store = try await fixture.openStore(configure)
  defer { store.close() }
  try await body(store, fixture.clock, fixture)
}

/// The queue's projection equals a rebuild from the log.
func expectConsistent(_ queue: TaskQueue, sourceLocation: SourceLocation = #_sourceLocation) throws {
  let report = try queue.log.verify()
  #expect(report.isHealthy, "\(report.problems)", sourceLocation: sourceLocation)
}

@Suite(.timeLimit(.minutes(20))) struct TaskQueueTests {
  @Test func tasksAreKeptInTheOrderTheyWereAdded() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let a = try await queue.add(tag: "upload", payload: Item(name: "a"))
    let b = try await queue.add(tag: "upload", payload: Item(name: "b"), dataId: "photo-2")
    let c = try await queue.add(tag: "sync", payload: Item(name: "c"))
    #expect(a < b && b < c)
    #expect(try queue.pendingTasks().map(\.id) == [a, b, c])
    #expect(try queue.pendingTasks(tag: "upload").map(\.id) == [a, b])
    #expect(try queue.pendingTasks(dataId: "photo-2").map(\.id) == [b])
    #expect(try queue.payload(of: b, as: Item.self) == Item(name: "b"))
    let task = try #require(try queue.task(a))
    #expect(task.status == .ready)
    #expect(task.addedAt == at(fixture.time))
    #expect(try queue.nextRunnable()?.id == a)
    #expect(try queue.nextRunnable(after: a)?.id == b)
    try expectConsistent(queue)
  }

  @Test func onlyTheHeadOfAGroupMayRunAndManualTasksNeverDo() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let first = try await queue.add(tag: "t", payload: Item(name: "1"), groupId: "album")
    let second = try await queue.add(tag: "t", payload: Item(name: "2"), groupId: "album")
    let manual = try await queue.add(tag: "t", payload: Item(name: "m"), options: [.manual])
    let loose = try await queue.add(tag: "t", payload: Item(name: "3"))
    #expect(try queue.nextRunnable()?.id == first)
    #expect(try queue.nextRunnable(after: first)?.id == loose)  // second is not the head; manual never runs
    try await queue.cancel(first)
    #expect(try queue.nextRunnable()?.id == second)
    #expect(try queue.task(manual)?.manual == true)
    try expectConsistent(queue)
  }

  @Test func uniquePoliciesKeepReplaceOrAppend() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let original = try await queue.add(tag: "save", payload: Item(name: "v1"), dataId: "doc")
    let kept = try await queue.add(
      tag: "save", payload: Item(name: "v2"), dataId: "doc", options: [.unique(.keep)])
    #expect(kept == original)
    #expect(try queue.payload(of: original, as: Item.self).name == "v1")
    let replacement = try await queue.add(
      tag: "save", payload: Item(name: "v3"), dataId: "doc", options: [.unique(.replace)])
    #expect(try queue.pendingTasks().map(\.id) == [replacement])
    let appended = try await queue.add(tag: "save", payload: Item(name: "v4"), dataId: "doc")
    #expect(try queue.pendingTasks().map(\.id) == [replacement, appended])
    // Another tag with the same data id is another task.
    let other = try await queue.add(
      tag: "delete", payload: Item(name: "x"), dataId: "doc", options: [.unique(.keep)])
    #expect(other > appended)
    await #expect(throws: FerryError.self) {
      try await queue.add(tag: "save", payload: Item(name: "?"), options: [.unique(.keep)])
    }
    try expectConsistent(queue)
  }

  /// A replace while the twin runs: the add command logs the twin's cancel, then the add; the
  /// twin leaves the queue (its run ends as it will). A log written before version 5 — the add
  /// without the cancel — still folds as it did: the running twin stays queued.
  @Test func aRunningTaskIsReplacedByItsOwnCancel() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let running = try await queue.add(tag: "save", payload: Item(name: "v1"), dataId: "doc")
    _ = try await queue.record([.runStarted(running, attempt: 1, owner: "", runner: 0)])
    let next = try await queue.add(
      tag: "save", payload: Item(name: "v2"), dataId: "doc", options: [.unique(.replace)])
    #expect(try queue.pendingTasks().map(\.id) == [next])
    #expect(try queue.log.event(at: next.rawValue - 1).map { try TaskEvent($0) } == .cancelled(running))
    #expect(try queue.history(of: running).last?.event == .replaced(by: next))
    let earlier = try await queue.add(tag: "save", payload: Item(name: "v3"), dataId: "old")
    _ = try await queue.record([.runStarted(earlier, attempt: 1, owner: "", runner: 0)])
    let add = TaskEvent.added(
      tag: "save", payload: Array(#"{"name":"v4"}"#.utf8), dataId: "old", groupId: nil, manual: false,
      unique: .replace, priority: 0, deadline: nil)
    let later = try #require(try await queue.record([add]).first)
    #expect(try queue.pendingTasks().map(\.id) == [next, earlier, TaskID(rawValue: later)])
    #expect(try queue.history(of: earlier).last?.event == .runStarted(attempt: 1))
    try expectConsistent(queue)
  }

  @Test func aRecordedErrorBlocksTheTaskAndItsGroupUntilResolved() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let head = try await queue.add(tag: "t", payload: Item(name: "1"), groupId: "g")
    _ = try await queue.add(tag: "t", payload: Item(name: "2"), groupId: "g")
    let errorId = try await queue.recordError(head, message: "Log in again to upload")
    #expect(try queue.task(head)?.status == .blockedByError)
    #expect(try queue.nextRunnable() == nil)
    let error = try #require(try queue.latestError(head))
    #expect(error.errorId == errorId)
    #expect(error.message == "Log in again to upload")
    #expect(error.recordedAt == at(fixture.time))
    #expect(try queue.errors().map(\.taskId) == [head])

    try await queue.resolveError(head)
    #expect(try queue.latestError(head) == nil)
    #expect(try queue.errors().isEmpty)
    #expect(try queue.nextRunnable()?.id == head)
    #expect(try queue.task(head)?.errorCount == 1)
    await #expect(throws: FerryError.self) { try await queue.resolveError(head) }
    try expectConsistent(queue)
  }

  @Test func runOutcomesMoveTasksThroughTheirStates() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let a = try await queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
    let b = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")

    _ = try await queue.record([.runStarted(a, attempt: 1, owner: "", runner: 0)])
    #expect(try queue.task(a)?.status == .running)
    #expect(try queue.nextRunnable() == nil)  // the head is running: its group waits

    let retryAt = fixture.time + 30_000
    _ = try await queue.record([.runFailed(a, message: "offline", retryable: true, nextEligibleAt: retryAt)])
    #expect(try queue.task(a)?.status == .waiting(until: at(retryAt)))
    #expect(try queue.task(a)?.lastFailure == "offline")
    #expect(try queue.nextRunnable(at: at(retryAt - 1)) == nil)
    #expect(try queue.nextRunnable(at: at(retryAt))?.id == a)

    _ = try await queue.record([.runStarted(a, attempt: 2, owner: "", runner: 0), .runInterrupted(a)])
    #expect(try queue.task(a)?.status == .ready)
    #expect(try queue.task(a)?.attempts == 2)

    _ = try await queue.record([
      .runStarted(a, attempt: 3, owner: "", runner: 0),
      .runFailed(a, message: "400", retryable: false, nextEligibleAt: nil),
    ])
    #expect(try queue.task(a)?.status == .dead)
    #expect(try queue.nextRunnable() == nil)  // a dead head holds its group
    try await queue.revive(a)
    #expect(try queue.task(a)?.status == .ready)
    #expect(try queue.task(a)?.attempts == 3)

    _ = try await queue.record([.runStarted(a, attempt: 4, owner: "", runner: 0), .runSucceeded(a)])
    #expect(try queue.task(a) == nil)
    #expect(try queue.nextRunnable()?.id == b)
    try expectConsistent(queue)
  }

  @Test func clearRemovesEverythingAndLateResultsDoNotBringTasksBack() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let running = try await queue.add(tag: "t", payload: Item(name: "a"), dataId: "d", groupId: "g")
    _ = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
    _ = try await queue.record([.runStarted(running, attempt: 1, owner: "", runner: 0)])
    try await queue.recordError(running, message: "x")
    try await queue.clear()
    #expect(try queue.pendingTasks().isEmpty)
    #expect(try queue.errors().isEmpty)
    _ = try await queue.record([
      .runFailed(running, message: "late", retryable: true, nextEligibleAt: 0), .runSucceeded(running),
    ])
    #expect(try queue.pendingTasks().isEmpty)
    await #expect(throws: FerryError.self) { try await queue.cancel(running) }
    let fresh = try await queue.add(
      tag: "t", payload: Item(name: "c"), dataId: "d", groupId: "g", options: [.unique(.keep)])
    #expect(fresh != running)
    #expect(try queue.nextRunnable()?.id == fresh)
    try expectConsistent(queue)
  }

  @Test func pauseAndTheQueueSurviveReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var queue = try await fixture.open()
    #expect(try queue.isPaused() == false)
    try await queue.pause()
    let id = try await queue.add(tag: "t", payload: Item(name: "kept"))
    queue.close()
    queue = try await fixture.open()
    defer { queue.close() }
    #expect(try queue.isPaused())
    #expect(try queue.payload(of: id, as: Item.self) == Item(name: "kept"))
    try await queue.resume()
    #expect(try queue.isPaused() == false)
    try expectConsistent(queue)
  }

  @Test func badArgumentsAreRefusedWithClearErrors() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    await #expect(throws: FerryError.self) { try await queue.add(tag: "", payload: Item(name: "")) }
    await #expect(throws: FerryError.self) {
      try await queue.add(tag: String(repeating: "t", count: 201), payload: Item(name: ""))
    }
    await #expect(throws: FerryError.self) {
      try await queue.add(tag: "t", payload: Item(name: ""), dataId: String(repeating: "d", count: 251))
    }
    await #expect(throws: FerryError.self) {
      try await queue.add(tag: "t", payload: Item(name: ""), groupId: String(repeating: "g", count: 251))
    }
    // The longest allowed ids still fit in LMDB's keys.
    let long = try await queue.add(
      tag: String(repeating: "t", count: 200), payload: Item(name: ""),
      dataId: String(repeating: "d", count: 250),
      groupId: String(repeating: "g", count: 250), options: [.unique(.keep)])
    #expect(try queue.task(long) != nil)
    await #expect(throws: FerryError.self) { try await queue.cancel(999) }
    await #expect(throws: FerryError.self) { try await queue.recordError(999, message: "?") }
    await #expect(throws: FerryError.self) { try await queue.revive(long) }
    #expect(throws: FerryError.self) { try queue.payload(of: long, as: [Int].self) }
    #expect(try queue.pendingTasks().count == 1)
    try expectConsistent(queue)
  }

  @Test func findingTheNextRunnableTaskNeverScansTheQueue() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    // 100,000 pending tasks; the first 10,000 are blocked: 5,000 by recorded errors, 5,000 behind
    // the blocked heads of their groups.
    let payload = Array(#"{"name":"x"}"#.utf8)
    var blockedHeads: [TaskID] = []
    for batch in 0..<100 {
      var events: [TaskEvent] = []
      for i in 0..<1000 {
        let n = batch * 1000 + i
        let group: String? = n < 10_000 ? "g\(n / 2)" : nil
        events.append(
          .added(tag: "t", payload: payload, dataId: nil, groupId: group, manual: false, unique: .append))
      }
      let ids = try await queue.record(events)
      if batch < 10 {
        blockedHeads += stride(from: 0, to: ids.count, by: 2).map { TaskID(rawValue: ids[$0]) }
      }
    }
    _ = try await queue.record(blockedHeads.map { .errorRecorded($0, message: "blocked", endsRun: false) })
    #expect(try queue.pendingTasks().count == 100_000)

    let probe = try queue.probeNextRunnable()
    #expect(probe.task?.id == 10_001)
    // The priority levels present (one seek per level and one past the last, in `waiting` and in
    // `ready`), then one ready key, the (empty) waiting level, one row: a constant, whatever the
    // queue holds.
    #expect(probe.touched <= 6)
    let later = try queue.probeNextRunnable(after: 60_000)
    #expect(later.task?.id == 60_001)
    #expect(later.touched <= 6)
    try expectConsistent(queue)
  }
}
