import FerryLog
import FerryTesting
import Foundation
import LMDB
import Testing

@_spi(Engine) @testable import Ferry

/// Adds `count` tasks that ran and succeeded, straight into the log in big batches (as the runner
/// would log them, without running anything): add, run started, run succeeded.
func logFinishedTasks(_ store: FerryStore, _ count: Int) async throws {
  var left = count
  while left > 0 {
    let batch = min(2000, left)
    let adds = try await store.log.append(
      (0..<batch).map { _ in
        TaskEvent.added(
          tag: "t", payload: Array(#"{"n":1}"#.utf8), dataId: nil, groupId: nil, manual: false,
          unique: .append
        )
        .newEvent
      })
    var outcomes: [NewEvent] = []
    for id in adds {
      outcomes.append(TaskEvent.runStarted(TaskID(rawValue: id), attempt: 1, owner: "", runner: 0).newEvent)
      outcomes.append(TaskEvent.runSucceeded(TaskID(rawValue: id)).newEvent)
    }
    _ = try await store.log.append(outcomes)
    left -= batch
  }
}

@Suite(.timeLimit(.minutes(20))) struct CompactionTests {
  @Test func compactionRemovesFinishedWorkAndKeepsEverythingStillNeeded() async throws {
    try await withStore { store, clock, fixture in
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "done") { _ in .succeeded }
      runner.register(tag: "stuck") { _ in .recordError("fix me") }
      let pending = try await store.queue.add(tag: "stuck", payload: ["n": 1], groupId: "g")
      let behind = try await store.queue.add(tag: "done", payload: ["n": 2], groupId: "g")
      let finished = try await store.queue.add(tag: "done", payload: ["n": 3])
      let cancelled = try await store.queue.add(tag: "done", payload: ["n": 4], options: [.manual])
      try await store.queue.cancel(cancelled)
      _ = try await runner.run()
      for i in 0..<3 { try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: i == 0)) }
      try await store.ledger.recordFetch(key: "k", outcome: .failure("503"))
      try await store.ledger.recordFetch(key: "k", outcome: .failure("504"))
      let newestFailure = try store.log.head()
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false))
      let newestSuccess = try store.log.head()
      let before = try store.log.read { try FerryStore.snapshot(of: $0) }
      let pendingHistory = try store.queue.history(of: pending)
      let head = try store.log.head()

      clock.advance(by: .seconds(60))
      let report = try await store.compact(retention: .seconds(30))
      #expect(report.snapshotSequence == head)
      #expect(report.removed > 0)
      #expect(try store.log.compactionState()?.through == head)
      // Finished tasks are gone from the log; the pending group keeps its whole history.
      #expect(try store.log.event(at: finished) == nil)
      #expect(try store.log.event(at: cancelled) == nil)
      #expect(try store.queue.history(of: pending) == pendingHistory)
      #expect(try store.log.event(at: behind) != nil)
      // Of the cache key's fetches, the newest success and newest failure stay.
      var fetches: [UInt64] = []
      try store.log.forEachEvent { if $0.type == "cache.fetched" { fetches.append($0.sequence) } }
      #expect(fetches == [newestFailure, newestSuccess])
      // The state is unchanged, a rebuild (from the snapshot plus the tail) gives it again, verify agrees.
      #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == before)
      _ = try await store.log.rebuild()
      #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == before)
      #expect(try store.log.verify().isHealthy)
      // Time travel before the compaction point says so.
      do {
        _ = try store.log.withProjections(asOf: 3) { _ in 0 }
        Issue.record("a state before the compaction point was shown")
      } catch FerryLogError.historyCompacted(let through) {
        #expect(through == head)
      }
      // And the store goes on: more work, then a rebuild from snapshot + tail equals what is stored.
      try await store.queue.resolveError(pending)
      runner.register(tag: "stuck") { _ in .succeeded }
      _ = try await runner.run()
      try await store.ledger.recordFetch(key: "k2", outcome: .success(isEmpty: false))
      let after = try store.log.read { try FerryStore.snapshot(of: $0) }
      #expect(try store.log.withProjections(asOf: nil) { try FerryStore.snapshot(of: $0) } == after)
      _ = try await store.log.rebuild()
      #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == after)
      #expect(after.tasks.isEmpty)
    }
  }

  @Test func finishedWorkInsideTheRetentionWindowStays() async throws {
    try await withStore { store, clock, fixture in
      try await logFinishedTasks(store, 10)
      clock.advance(by: .seconds(120))
      try await logFinishedTasks(store, 10)
      clock.advance(by: .seconds(1))
      let report = try await store.compact(retention: .seconds(60))
      #expect(report.removed == 30)  // the first ten tasks, three events each
      #expect(report.remaining == 30)
      #expect(try store.log.verify().isHealthy)
    }
  }

  /// On both write paths: with the write-ahead segment a checkpoint's pages are pinned until the
  /// next one (`Specs/one-sync-commit.md` §10), which must not take the file past the same bound.
  @Test(arguments: [false, true]) func aLongRunStaysWithinABoundedSize(writeAheadSegment: Bool) async throws {
    try await withStore({ $0.writeAheadSegment = writeAheadSegment }) { store, clock, fixture in
      var largestFile = 0
      var largestLog = 0
      // FERRY_COMPACTION_ROUNDS raises it for long runs (100 rounds: a million tasks).
      let rounds = ProcessInfo.processInfo.environment["FERRY_COMPACTION_ROUNDS"].flatMap(Int.init) ?? 10
      for _ in 0..<rounds {
        try await logFinishedTasks(store, 10_000)
        largestLog = max(
          largestLog,
          try store.log.read { _ in 0 }
            + Int(try store.log.head() - (try store.log.compactionState()?.through ?? 0)))
        clock.advance(by: .milliseconds(1))
        let report = try await store.compact(retention: .zero)
        #expect(report.remaining == 0)
        let size =
          (try FileManager.default.attributesOfItem(atPath: fixture.path + "/data.mdb")[.size] as? NSNumber)?
          .intValue ?? 0
        largestFile = max(largestFile, size)
      }
      let head = try store.log.head()
      #expect(head == UInt64(rounds * 30_000))
      var left = 0
      try store.log.forEachEvent { _ in left += 1 }
      #expect(left == 0)
      // Everything was compacted away, yet a sequence number is never given out twice.
      #expect(
        try await store.queue.add(tag: "t", payload: ["n": 1])
          == TaskID(rawValue: UInt64(rounds * 30_000 + 1)))
      print(
        "compaction (segment \(writeAheadSegment)): \(rounds * 10_000) tasks (\(rounds * 30_000) events) logged and compacted every 10000 tasks: at most \(largestLog) events and \(largestFile / 1_048_576) MiB on disk at any time"
      )
      #expect(largestLog <= 30_000)
      #expect(largestFile <= 32 << 20)
      #expect(try store.log.verify().isHealthy)
    }
  }

  static func flushed(_ configuration: inout FerryStore.Configuration) {
    configuration.writeAheadSegment = false
  }

  @Test func aDamagedSnapshotIsReportedAndTheQueueIsRebuiltFromWhatTheLogHolds() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    // Flushed commits: the damage is planted with a raw LMDB write, which a store with a
    // write-ahead segment undoes at its next open alone (Specs/one-sync-commit.md §5).
    var store = try await fixture.openStore(Self.flushed)
    try await logFinishedTasks(store, 50)
    let keep = try await store.queue.add(tag: "t", payload: ["n": 1], groupId: "g")
    clock.advance(by: .seconds(1))
    _ = try await store.compact(retention: .zero)
    let before = try store.log.read { try FerryStore.snapshot(of: $0) }
    store.close()

    let env = try LMDBEnvironment.open(fixture.path, "s:taskQueue:tasks")
    env.plant()
    store = try await fixture.openStore(Self.flushed)
    defer { store.close() }
    let report = try store.log.verify()
    #expect(report.problems.contains { "\($0)".contains("CRC32C") })
    _ = try await store.log.rebuild()
    let after = try store.log.read { try FerryStore.snapshot(of: $0) }
    #expect(after.tasks.map(\.id) == [keep])
    #expect(after.tasks == before.tasks)
  }

  @Test func automaticCompactionRunsPastItsThreshold() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    let store = try await fixture.openStore {
      $0.automaticCompaction = AutomaticCompaction(
        everyEvents: 30, retention: .zero, checkInterval: .milliseconds(20))
    }
    defer { store.close() }
    try await logFinishedTasks(store, 20)
    // A check may come between the last event and this advance: then it compacts while nothing
    // is before the cutoff yet (removing 0), and ten more tasks bring the next one.
    clock.advance(by: .milliseconds(1))
    var state: (through: UInt64, removed: UInt64)?
    var retriggered = false
    for _ in 0..<500 where (state?.removed ?? 0) < 60 {
      try await Task.sleep(for: .milliseconds(20))
      state = try store.log.compactionState()
      if state?.removed == 0 && !retriggered {
        retriggered = true
        try await logFinishedTasks(store, 10)
        clock.advance(by: .milliseconds(1))
      }
    }
    // Every task of the first twenty was removed, by the first compaction or the retriggered one.
    #expect(state?.through == (retriggered ? 90 : 60))
    #expect((state?.removed ?? 0) >= 60)
  }

  @Test func negativeRetentionIsRefused() async throws {
    try await withStore { store, _, _ in
      await #expect(throws: FerryError.self) { try await store.compact(retention: .seconds(-1)) }
    }
  }
  /// The upgrade this version makes (taskQueue projection 1 → 2) on a store whose newest events
  /// a compaction removed: the projection is rebuilt at open and covers the log to its head.
  @Test func aCompactedStoreWhoseNewestEventsAreGoneOpensAfterTheQueueProjectionChanges() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    do {
      let store = try await fixture.openStore()
      let kept = try await store.queue.add(tag: "t", payload: ["n": 0])
      try await logFinishedTasks(store, 20)  // the newest events: finished tasks
      clock.advance(by: .seconds(1))
      _ = try await store.compact(retention: .zero)
      #expect(try store.log.head() > (try store.log.events(after: 0, limit: 1000).last?.sequence ?? 0))
      #expect(try store.queue.task(kept) != nil)
      store.close()
    }
    // As a store written by the previous version: its taskQueue projection is at version 1.
    let environment = try LMDBEnvironment.open(fixture.path, "meta")
    environment.setProjectionVersion("taskQueue", 1)
    let store = try await fixture.openStore()
    defer { store.close() }
    #expect(try store.queue.pendingTasks().count == 1)
    #expect(try store.log.verify().isHealthy)
  }

  /// Regression: retention dropped `cache.forgotten` but kept the key's older success, so a
  /// rebuild from the log brought the forgotten key back, cached, with its old time.
  @Test func aForgottenKeyStaysForgottenAfterCompactionAndARebuild() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    var store = try await fixture.openStore()
    try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
    try await store.ledger.recordFetch(key: "kept", outcome: .success(isEmpty: false))
    clock.advance(by: .seconds(10))
    try await store.ledger.forget("notes")
    clock.advance(by: .seconds(10))
    _ = try await store.compact(retention: .seconds(5))  // the forget is older than the window
    store.close()
    try LMDBEnvironment.open(fixture.path, "meta").removeSnapshot("cacheAges")  // rebuild from the log
    store = try await fixture.openStore()
    defer { store.close() }
    _ = try await store.log.rebuild()
    #expect(try store.ledger.state(key: "notes", maxAge: .seconds(3600)) == .noCache)
    #expect(try store.ledger.record("kept")?.lastSuccess != nil)
  }

  /// Regression: retention dropped a `queue.cleared` older than the window while a task it ended
  /// stayed (a late outcome, logged after the clear, was within the window): a rebuild brought the
  /// cleared task back.
  @Test func aClearStaysWhileATaskItEndedStays() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    var store = try await fixture.openStore()
    let start = clock.milliseconds
    let id = try await store.queue.add(tag: "t", payload: ["n": 1])
    _ = try await store.log.append(TaskEvent.runStarted(id, attempt: 1, owner: "", runner: 0).newEvent)
    try await store.queue.clear()
    clock.advance(by: .seconds(10))
    // The run's late outcome: logged after the clear, it does not bring the task back.
    _ = try await store.log.append(
      TaskEvent.runFailed(id, message: "late", retryable: true, nextEligibleAt: start + 60_000).newEvent)
    #expect(try store.queue.task(id) == nil)
    _ = try await store.compact(retention: .seconds(5))
    store.close()
    try LMDBEnvironment.open(fixture.path, "meta").removeSnapshot("taskQueue")  // rebuild from the log
    store = try await fixture.openStore()
    defer { store.close() }
    _ = try await store.log.rebuild()
    #expect(try store.queue.task(id) == nil)
    #expect(try store.queue.pendingTasks().isEmpty)
  }
}

/// Opens a store's environment directly to damage it on purpose.
struct LMDBEnvironment {
  let environment: Environment
  let table: Database

  static func open(_ path: String, _ name: String) throws -> LMDBEnvironment {
    let environment = try Environment.open(path: path, databases: [name])
    return LMDBEnvironment(environment: environment, table: try environment.database(name))
  }

  /// Stores `version` as the projection's version in `meta` (its position kept) and closes.
  func setProjectionVersion(_ projection: String, _ version: UInt32) {
    _ = try? environment.write { txn in
      let key = Array("projection:\(projection)".utf8)
      if var value = try txn.get(table, key: key), value.count == 12 {
        value.replaceSubrange(0..<4, with: withUnsafeBytes(of: version.bigEndian, Array.init))
        try txn.put(table, key: key, value: value)
      }
    }
    environment.close()
  }

  /// Removes a projection's snapshot record from `meta` (a rebuild then starts from the log) and closes.
  func removeSnapshot(_ projection: String) {
    _ = try? environment.write { txn in _ = try txn.delete(table, key: Array("snapshot:\(projection)".utf8)) }
    environment.close()
  }

  /// Changes one byte of the first row and closes.
  func plant() {
    _ = try? environment.write { txn in
      let first = try txn.withCursor(table) { try $0.first() }
      if let first {
        var value = first.value
        value[value.count - 1] ^= 0x01
        try txn.put(table, key: first.key, value: value)
      }
    }
    environment.close()
  }

}
