import FerryLog
import FerryTesting
import Foundation
import LMDB
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Priority and deadlines (`Specs/task-events.md` §2.3, §2.4, §4.3): claim order by priority with
/// groups and retries kept in order, adds during a pass, expiry by claim and by a pass's sweep —
/// once, with two runners and a second process racing — runs that outlive their deadline, and a
/// compacted log that brings it all back.
@Suite(.timeLimit(.minutes(20))) struct PriorityDeadlineTests {
  /// Task ids handlers saw, in the order they ran.
  final class Order: Sendable {
    private let ids = Mutex<[TaskID]>([])
    func append(_ id: TaskID) { ids.withLock { $0.append(id) } }
    var all: [TaskID] { ids.withLock { $0 } }
    func reset() { ids.withLock { $0 = [] } }
  }

  /// A Unix-milliseconds time as a `Date`.
  static func date(_ milliseconds: Int64) -> Date { Date(timeIntervalSince1970: Double(milliseconds) / 1000) }

  /// The tasks a log's `task.expired` events name, in log order.
  static func expiredEvents(_ log: EventLog) throws -> [TaskID] {
    var ids: [TaskID] = []
    try log.forEachEvent { event in
      if event.type == "task.expired", case .expired(let id) = try TaskEvent(event) { ids.append(id) }
    }
    return ids
  }

  /// The tasks a log's `task.runStarted` events name, in log order.
  static func starts(_ log: EventLog) throws -> [TaskID] {
    var ids: [TaskID] = []
    try log.forEachEvent { event in
      if event.type == "task.runStarted", case .runStarted(let id, _, _, _, _) = try TaskEvent(event) {
        ids.append(id)
      }
    }
    return ids
  }

  static func runner(_ queue: TaskQueue, order: Order, failFirst: Set<TaskID> = []) -> TaskRunner {
    var configuration = TaskRunner.Configuration()
    configuration.defaultRetry = RetryPolicy(maxAttempts: 5, initialDelay: .seconds(1), jitter: 0)
    let runner = TaskRunner(queue: queue, configuration: configuration)
    runner.register(tag: "t") { task in
      order.append(task.id)
      return failFirst.contains(task.id) && task.attempt == 1 ? .failed("offline") : .succeeded
    }
    return runner
  }

  /// The next-due hint is the earliest retry over every priority level, not the first level's:
  /// the `waiting` index is ordered by level before time.
  @Test func nextDueIsTheEarliestRetryOfAnyPriority() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let high = try await queue.add(tag: "slow", payload: ["n": 1], options: [.priority(.high)])
      let low = try await queue.add(tag: "fast", payload: ["n": 2], options: [.priority(.low)])
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "slow", retry: RetryPolicy(initialDelay: .seconds(60), jitter: 0)) { _ in
        .failed("offline")
      }
      runner.register(tag: "fast", retry: RetryPolicy(initialDelay: .seconds(5), jitter: 0)) { _ in
        .failed("offline")
      }
      let start = clock.milliseconds
      let report = try await runner.run()
      #expect(report.outcome(of: high) == .failed("offline", retryAt: at(start + 60_000)))
      #expect(report.outcome(of: low) == .failed("offline", retryAt: at(start + 5_000)))
      #expect(try queue.nextDueDate() == at(start + 5_000))
      let window = try await runner.run(until: at(start))  // a window already over: runs nothing
      #expect(window.nextDue == at(start + 5_000))
    }
  }

  @Test func claimsTakeHigherPrioritiesFirstAndKeepGroupsAndRetriesInOrder() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let normal = try await queue.add(tag: "t", payload: ["n": "normal"])
      let retry = try await queue.add(tag: "t", payload: ["n": "retry"], groupId: "r")
      let order = Order()
      let runner = Self.runner(queue, order: order, failFirst: [retry])
      let first = try await runner.run(.group("r"))
      #expect(first.outcome(of: retry) == .failed("offline", retryAt: at(clock.milliseconds + 1000)))
      clock.advance(by: .seconds(2))
      // A group whose head is low and whose second task is high: the head competes as low, and
      // the high task never passes it.
      let lowHead = try await queue.add(
        tag: "t", payload: ["n": "g1"], groupId: "g", options: [.priority(.low)])
      let highBehind = try await queue.add(
        tag: "t", payload: ["n": "g2"], groupId: "g", options: [.priority(.high)])
      let low = try await queue.add(tag: "t", payload: ["n": "low"], options: [.priority(.low)])
      let high = try await queue.add(tag: "t", payload: ["n": "high"], options: [.priority(.high)])
      #expect(try queue.task(highBehind)?.status == .waitingForGroup(behind: lowHead))
      #expect(try queue.task(high)?.priority == .high)
      #expect(try queue.nextRunnable()?.id == high)
      order.reset()
      let report = try await runner.run()
      #expect(order.all == [high, retry, normal, lowHead, highBehind, low])
      // The report: the most urgent first, then by id.
      #expect(report.entries.map(\.taskId) == [highBehind, high, normal, retry, lowHead, low])
      #expect(report.entries.map(\.priority) == [.high, .high, .normal, .normal, .low, .low])
      #expect(try Self.starts(store.log) == [retry, high, retry, normal, lowHead, highBehind, low])
      try expectConsistent(queue)
    }
  }

  @Test func aHighPriorityTaskAddedDuringAPassRunsBeforeTheLowerOnesNotYetClaimed() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let ids = [
        try await queue.add(tag: "t", payload: ["n": 1]), try await queue.add(tag: "t", payload: ["n": 2]),
        try await queue.add(tag: "t", payload: ["n": 3], options: [.priority(.low)]),
      ]
      let order = Order()
      let added = Mutex<TaskID?>(nil)
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { task in
        order.append(task.id)
        if task.id == ids[0] {
          let id = try await queue.add(tag: "t", payload: ["n": 4], options: [.priority(.high)])
          added.withLock { $0 = id }
        }
        return .succeeded
      }
      let report = try await runner.run()
      let urgent = try #require(added.withLock { $0 })
      #expect(order.all == [ids[0], urgent, ids[1], ids[2]])
      #expect(report.outcome(of: urgent) == .succeeded)
      #expect(report.entries.map(\.taskId) == [urgent, ids[0], ids[1], ids[2]])
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  @Test func aClaimThatMeetsAPassedDeadlineExpiresTheTaskInstead() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let id = try await queue.add(
        tag: "t", payload: ["n": 1], options: [.deadline(Self.date(clock.milliseconds + 1000))])
      #expect(try queue.task(id)?.deadline == Self.date(clock.milliseconds + 1000))
      var updates = try queue.updates(for: id).makeAsyncIterator()
      #expect(await updates.next() == .current(id, .ready))
      clock.advance(by: .seconds(2))
      let order = Order()
      let runner = Self.runner(queue, order: order)
      let report = try await runner.run(.task(id))
      #expect(report.outcome(of: id) == .expired)
      #expect(await updates.next() == .expired(id))
      #expect(order.all.isEmpty)
      #expect(try queue.task(id) == nil)
      #expect(try queue.history(of: id).map(\.event) == [.added, .expired])
      #expect(try Self.expiredEvents(store.log) == [id])
      // Asked again: it is gone, and nothing more is logged.
      await #expect(throws: FerryError.self) { try await runner.run(.task(id)) }
      #expect(try Self.expiredEvents(store.log) == [id])
      try expectConsistent(queue)
    }
  }

  @Test func aPassSweepsEveryTaskPastItsDeadlineWhateverItsState() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let start = clock.milliseconds
      let soon = Self.date(start + 1000)
      let blocked = try await queue.add(tag: "t", payload: ["n": 1], groupId: "b", options: [.deadline(soon)])
      try await queue.recordError(blocked, message: "fix me")
      let behind = try await queue.add(tag: "t", payload: ["n": 2], groupId: "b", options: [.deadline(soon)])
      let dead = try await queue.add(tag: "dies", payload: ["n": 3], options: [.deadline(soon)])
      let waiting = try await queue.add(tag: "flaky", payload: ["n": 4], options: [.deadline(soon)])
      let manual = try await queue.add(tag: "t", payload: ["n": 5], options: [.manual, .deadline(soon)])
      let later = try await queue.add(
        tag: "t", payload: ["n": 6], options: [.manual, .deadline(Self.date(start + 60_000))])
      let noDeadline = try await queue.add(tag: "t", payload: ["n": 7], groupId: "b")
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { _ in .succeeded }
      runner.register(tag: "dies") { _ in .failed("no", retryable: false) }
      runner.register(tag: "flaky", retry: RetryPolicy(maxAttempts: 3, initialDelay: .seconds(60), jitter: 0))
      { _ in
        .failed("offline")
      }
      let first = try await runner.run()
      #expect(first.outcome(of: dead) == .failed("no", retryAt: nil))
      #expect(first.outcome(of: waiting) == .failed("offline", retryAt: at(start + 60_000)))
      #expect(first.expired == 0)
      let stream = queue.updates()
      let observed = Task {
        var seen: [TaskID] = []
        for await update in stream {
          if case .expired(let id) = update { seen.append(id) }
          if seen.count == 5 { break }
        }
        return seen.sorted()
      }
      clock.advance(by: .seconds(2))
      let report = try await runner.run()
      let expired = [blocked, behind, dead, waiting, manual]
      #expect(report.entries.filter { $0.outcome == .expired }.map(\.taskId) == expired)
      #expect(report.expired == 5)
      #expect(report.ran == 1)  // the group's last task, now its head
      #expect(report.outcome(of: noDeadline) == .succeeded)
      #expect(try queue.pendingTasks().map(\.id) == [later])
      #expect(try Self.expiredEvents(store.log).sorted() == expired)
      #expect(await observed.value == expired)
      for id in expired { #expect(try queue.history(of: id).last?.event == .expired) }
      // Another pass finds nothing more to expire.
      #expect(try await runner.run().expired == 0)
      #expect(try Self.expiredEvents(store.log).count == 5)
      try expectConsistent(queue)
    }
  }

  @Test func aRunUnderWayAtItsDeadlineIsNotInterruptedAndNoRetryStartsAfterIt() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let start = clock.milliseconds
      let slow = try await queue.add(
        tag: "slow", payload: ["n": 1], options: [.deadline(Self.date(start + 1000))])
      let flaky = try await queue.add(
        tag: "flaky", payload: ["n": 2], options: [.deadline(Self.date(start + 1000))])
      let (started, startedContinuation) = AsyncStream<TaskID>.makeStream()
      let (release, releaseContinuation) = AsyncStream<Void>.makeStream()
      let runnerA = TaskRunner(queue: queue)
      runnerA.register(tag: "slow") { task in
        startedContinuation.yield(task.id)
        for await _ in release { break }
        return .succeeded
      }
      runnerA.register(
        tag: "flaky", retry: RetryPolicy(maxAttempts: 3, initialDelay: .milliseconds(100), jitter: 0)
      ) { task in
        startedContinuation.yield(task.id)
        for await _ in release { break }
        return .failed("offline")
      }
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = 2
      let wide = TaskRunner(queue: queue, configuration: configuration)
      wide.register(tag: "slow") { _ in .succeeded }
      wide.register(tag: "flaky") { _ in .succeeded }
      async let passA = runnerA.run(.task(slow))
      async let passB = runnerA.run(.task(flaky))
      var iterator = started.makeAsyncIterator()
      let first = await iterator.next()
      let second = await iterator.next()
      #expect(Set([first, second]) == [slow, flaky])
      // Both deadlines pass while both runs are under way: another runner's pass sweeps and claims,
      // and neither task expires or starts again.
      clock.advance(by: .seconds(5))
      let other = try await wide.run()
      #expect(other.entries.isEmpty)
      #expect(try Self.expiredEvents(store.log).isEmpty)
      releaseContinuation.yield()
      releaseContinuation.yield()
      #expect(try await passA.outcome(of: slow) == .succeeded)
      #expect(try await passB.outcome(of: flaky) == .failed("offline", retryAt: at(clock.milliseconds + 100)))
      #expect(try queue.history(of: slow).map(\.event) == [.added, .runStarted(attempt: 1), .runSucceeded])
      // The failed run's retry would start after the deadline: the next pass expires it instead.
      clock.advance(by: .seconds(1))
      let report = try await wide.run()
      #expect(report.outcome(of: flaky) == .expired)
      #expect(try Self.starts(store.log).filter { $0 == flaky }.count == 1)
      #expect(try Self.expiredEvents(store.log) == [flaky])
      try expectConsistent(queue)
    }
  }

  /// Two runners here and a second process, all running passes while tasks are past their
  /// deadlines: each such task expires exactly once and never starts; the others run once.
  @Test func twoRunnersAndAnotherProcessExpireEachTaskOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)  // the real clock, like the worker's
    defer { queue.close() }
    let past = Date().addingTimeInterval(-1)
    var expiring: [TaskID] = []
    var running: [TaskID] = []
    for i in 0..<1400 {
      let group: String? = i % 4 == 0 ? "g\(i % 20)" : nil
      if i % 3 == 0 {
        running.append(try await queue.add(tag: "job", payload: ["kind": "ok", "n": "\(i)"], groupId: group))
      } else {
        expiring.append(
          try await queue.add(
            tag: "job", payload: ["kind": "ok", "n": "\(i)"], groupId: group,
            options: [.priority(TaskPriority(rawValue: Int8(i % 3) - 1)), .deadline(past)]))
      }
    }
    let child = try Child("ferry-test-worker", ["run-tasks", fixture.path])
    let runners = (0..<2).map { _ in
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "job") { _ in .succeeded }
      return runner
    }
    async let a = runners[0].run()
    async let b = runners[1].run()
    let reports = try await [a, b]
    #expect(try await child.wait() == 0, "worker output: \(child.output.suffix(3))")
    _ = try await runners[0].run()
    let expired = try Self.expiredEvents(queue.log)
    #expect(expired.count == expiring.count)
    #expect(Set(expired) == Set(expiring))
    #expect(Set(try Self.starts(queue.log)).isDisjoint(with: expiring))
    let ledger = try RunLedger(queue.log)
    ledger.expectEachTaskRanOnce(running)
    #expect(running.allSatisfy { ledger.tasks[$0]?.successes == 1 })
    // What this process's passes expired is in their reports, each task once.
    let reported = reports.flatMap(\.entries).filter { $0.outcome == .expired }.map(\.taskId)
    #expect(Set(reported).count == reported.count)
    #expect(Set(reported).isSubset(of: Set(expiring)))
    #expect(try queue.pendingTasks().isEmpty)
    try expectConsistent(queue)
  }

  /// Compaction keeps what the queue needs: a queued task keeps its add (with its priority and
  /// deadline), an expired task's events all go, and a rebuild from what the log holds — no
  /// snapshot, an older projection version — gives the same queue, in the same claim order.
  @Test func aCompactedLogRebuildsPriorityAndDeadlines() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = fixture.clock
    var before: [PendingTask] = []
    var expired: TaskID = 0
    do {
      // Flushed commits: the snapshot and version are edited in data.mdb with raw LMDB writes,
      // which a store with a write-ahead segment undoes (Specs/one-sync-commit.md §5).
      let store = try await fixture.openStore { $0.writeAheadSegment = false }
      let queue = store.queue
      expired = try await queue.add(
        tag: "t", payload: ["n": 0], options: [.deadline(Self.date(clock.milliseconds + 10))])
      _ = try await queue.add(
        tag: "t", payload: ["n": 1],
        options: [.priority(.low), .deadline(Self.date(clock.milliseconds + 60_000))])
      _ = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
      _ = try await queue.add(tag: "t", payload: ["n": 3], groupId: "g", options: [.priority(.high)])
      _ = try await queue.add(tag: "t", payload: ["n": 4], options: [.priority(TaskPriority(rawValue: 100))])
      try await logFinishedTasks(store, 20)
      clock.advance(by: .seconds(1))
      let runner = TaskRunner(queue: queue)  // no handler: the pass only sweeps
      #expect(try await runner.run().outcome(of: expired) == .expired)
      clock.advance(by: .seconds(1))
      _ = try await store.compact(retention: .zero)
      before = try queue.pendingTasks()
      #expect(before.count == 4)
      store.close()
    }
    let environment = try LMDBEnvironment.open(fixture.path, "meta")
    environment.removeSnapshot("taskQueue")
    environment.setProjectionVersion("taskQueue", 3)
    let store = try await fixture.openStore { $0.writeAheadSegment = false }
    defer { store.close() }
    #expect(try store.queue.pendingTasks() == before)
    #expect(throws: FerryError.self) { try store.queue.history(of: expired) }
    #expect(try store.queue.nextRunnable()?.priority == TaskPriority(rawValue: 100))
    // Verify names the snapshot removed above, and nothing else; a rebuild from what the log holds
    // gives the same queue again.
    let report = try store.log.verify()
    #expect(report.problems.count == 1 && report.problems.allSatisfy { "\($0)".contains("has no snapshot") })
    _ = try await store.log.rebuild()
    #expect(try store.queue.pendingTasks() == before)
  }

  /// A version-1 add in a store reads as the current version: normal priority, no deadline.
  @Test func aVersionOneAddReadsAsNormalWithoutADeadline() async throws {
    try await withStore { store, _, _ in
      let vector = try TaskEventVectorTests.load("upcast-004-task-added-v1")
      let stored = try EventRecord.decode(TaskEventVectorTests.bytes(vector.hex), sequence: vector.sequence)
      let v1 = NewEvent(type: "task.added", schemaVersion: 1, payload: stored.payload)
      let id = try #require(try await store.log.append([v1]).first)
      let event = try #require(try store.log.event(at: id))
      #expect(event.storedSchemaVersion == 1)
      #expect(event.schemaVersion == TaskEvent.schemaVersions["task.added"])
      let task = try #require(try store.queue.task(TaskID(rawValue: id)))
      #expect(task.priority == .normal)
      #expect(task.deadline == nil)
      #expect(task.groupId == "notes")
      try expectConsistent(store.queue)
    }
  }
}
