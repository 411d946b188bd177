import FerryLog
import FerryTesting
import Foundation
import Synchronization
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The ends of `Int64`, `UInt64` and `Duration` at the public API (issue 12): each is refused with
/// a typed error or handled without wrapping around — and never traps (a trap would end this
/// whole test process, which is how these were found).
@Suite(.timeLimit(.minutes(20))) struct EdgeValueTests {
  /// Whether `error` is ``FerryError/invalidArgument(_:)``.
  static func isInvalidArgument(_ error: any Error) -> Bool {
    if case .invalidArgument = error as? FerryError { return true }
    return false
  }

  /// The log's head, to show a refused call appended nothing.
  static func head(_ store: FerryStore) throws -> UInt64 { try store.log.head() }

  // MARK: nextRunnable

  @Test func nextRunnableAfterTheLargestTaskIdFindsNothingInsteadOfWrappingToTaskOne() async throws {
    try await withStore { store, _, _ in
      let first = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      try await store.queue.add(tag: "t", payload: Item(name: "b"))
      #expect(try store.queue.nextRunnable()?.id == first)
      #expect(try store.queue.nextRunnable(after: TaskID.max) == nil)
    }
  }

  @Test func nextRunnableAfterTheSecondLargestTaskIdFindsNothing() async throws {
    try await withStore { store, _, _ in
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try store.queue.nextRunnable(after: TaskID(rawValue: .max - 1)) == nil)
    }
  }

  @Test func nextRunnableAtTheEndOfTimeFindsADueRetryAndTheReadyTask() async throws {
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try store.queue.nextRunnable(at: .distantFuture)?.id == id)
    }
  }

  @Test func nextRunnableAtTheStartOfTimeStillFindsTheReadyTask() async throws {
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try store.queue.nextRunnable(at: .distantPast)?.id == id)
    }
  }

  // MARK: Task ids that are not there

  @Test func theLargestTaskIdIsNoSuchTaskEverywhere() async throws {
    try await withStore { store, _, _ in
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let queue = store.queue
      #expect(try queue.task(.max) == nil)
      #expect(try queue.latestError(.max) == nil)
      for attempt in [
        { try queue.history(of: .max) as Any },
        { try queue.payload(of: .max, as: Item.self) as Any },
      ] {
        #expect {
          _ = try attempt()
        } throws: { error in
          if case .noSuchTask(.max) = error as? FerryError { return true }
          return false
        }
      }
      await #expect(throws: FerryError.self) { try await queue.cancel(.max) }
      await #expect(throws: FerryError.self) { try await queue.revive(.max) }
      await #expect(throws: FerryError.self) { try await queue.resolveError(.max) }
      await #expect(throws: FerryError.self) { _ = try await queue.recordError(.max, message: "x") }
      #expect(try queue.pendingTasks().count == 1)
    }
  }

  @Test func taskIdZeroIsNoSuchTask() async throws {
    try await withStore { store, _, _ async throws in
      #expect(try store.queue.task(0) == nil)
      #expect(throws: FerryError.self) { try store.queue.history(of: 0) }
    }
  }

  @Test func runningTheLargestTaskIdIsNoSuchTask() async throws {
    try await withStore { store, _, _ in
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { _ in .succeeded }
      await #expect {
        _ = try await runner.run(.task(.max))
      } throws: { error in
        if case .noSuchTask(.max) = error as? FerryError { return true }
        return false
      }
      #expect(try store.queue.pendingTasks().count == 1)
    }
  }

  // MARK: recordFetch

  @Test func aFetchAtInt64MaxIsRefusedNotFreshForever() async throws {
    try await withStore { store, _, _ in
      let head = try Self.head(store)
      await #expect {
        try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: at(.max))
      } throws: { Self.isInvalidArgument($0) }
      #expect(try store.ledger.record("k") == nil)
      #expect(try Self.head(store) == head)
    }
  }

  @Test func aFetchAtInt64MinIsRefused() async throws {
    try await withStore { store, _, _ in
      let head = try Self.head(store)
      await #expect {
        try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: at(.min))
      } throws: { Self.isInvalidArgument($0) }
      #expect(try Self.head(store) == head)
    }
  }

  @Test func aFetchBeforeNineteenSeventyIsRefused() async throws {
    try await withStore { store, _, _ in
      await #expect {
        try await store.ledger.recordFetch(key: "k", outcome: .failure("offline"), at: at(-1))
      } throws: { Self.isInvalidArgument($0) }
    }
  }

  @Test func aFetchTenYearsAheadOfTheClockIsRefused() async throws {
    try await withStore { store, clock, _ async throws in
      let tenYears: Int64 = 10 * 365 * 86_400_000
      await #expect {
        try await store.ledger.recordFetch(
          key: "k", outcome: .success(isEmpty: false), at: at(clock.milliseconds + tenYears))
      } throws: { Self.isInvalidArgument($0) }
      #expect(try store.ledger.state(key: "k", maxAge: .seconds(1)) == .noCache)
    }
  }

  @Test func aFetchAtTheDistantFutureDateIsRefused() async throws {
    try await withStore { store, _, _ in
      await #expect {
        try await store.ledger.recordFetch(
          key: "k", outcome: .success(isEmpty: false), at: Date.distantFuture)
      } throws: { Self.isInvalidArgument($0) }
    }
  }

  @Test func aFetchJustOverTheAllowedSkewIsRefusedAndOneWithinItAccepted() async throws {
    try await withStore { store, clock, _ in
      let skew = CacheLedger.maxFetchTimeAhead.milliseconds
      await #expect {
        try await store.ledger.recordFetch(
          key: "k", outcome: .success(isEmpty: false), at: at(clock.milliseconds + skew + 1))
      } throws: { Self.isInvalidArgument($0) }
      try await store.ledger.recordFetch(
        key: "k", outcome: .success(isEmpty: false), at: at(clock.milliseconds + skew))
      #expect(try store.ledger.record("k")?.lastSuccess == at(clock.milliseconds + skew))
      // Fetched "later than now": its age is zero, never negative.
      #expect(
        try store.ledger.state(key: "k", maxAge: .seconds(1))
          == .cache(lastFetched: at(clock.milliseconds + skew), age: .zero, isTooOld: false))
    }
  }

  @Test func aFetchWhenTheClockReadsInt64MaxIsAcceptedAtNow() async throws {
    try await withStore { store, clock, _ in
      clock.set(milliseconds: .max)
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: at(.max))
      #expect(try store.ledger.record("k")?.lastSuccessMs == .max)
    }
  }

  // MARK: Ages and max ages

  @Test func anAgeFromATimeBeforeNineteenSeventySaturatesInsteadOfWrappingToZero() async throws {
    try await withStore { store, _, _ in
      // Only another store (an import) can hold such a time now that recordFetch refuses it.
      _ = try await store.log.append(
        CacheEvent.fetched(key: "k", at: .min, outcome: .success(isEmpty: false)).newEvent)
      let state = try store.ledger.state(key: "k", maxAge: .seconds(60))
      #expect(state == .cache(lastFetched: at(.min), age: .milliseconds(Int64.max), isTooOld: true))
    }
  }

  @Test func aMaxAgeOfInt64MaxSecondsIsNeverTooOld() async throws {
    try await withStore { store, clock, _ in
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: at(0))
      let state = try store.ledger.state(key: "k", maxAge: .seconds(Int64.max))
      #expect(state == .cache(lastFetched: at(0), age: .milliseconds(clock.milliseconds), isTooOld: false))
    }
  }

  @Test func aMaxAgeOfInt64MinSecondsIsRefused() async throws {
    try await withStore { store, _, _ in
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false))
      #expect { try store.ledger.state(key: "k", maxAge: .seconds(Int64.min)) } throws: {
        Self.isInvalidArgument($0)
      }
    }
  }

  @Test func aNegativeMaxAgeIsRefusedByKeysOlderThan() async throws {
    try await withStore { store, _, _ in
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false))
      #expect { try store.ledger.keys(olderThan: .milliseconds(-1)) } throws: { Self.isInvalidArgument($0) }
      #expect(try store.ledger.keys(olderThan: .zero) == [])
    }
  }

  // MARK: Compaction

  @Test func aRetentionOfInt64MaxSecondsRemovesNothing() async throws {
    try await withStore { store, clock, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      try await store.queue.cancel(id)
      clock.advance(by: .seconds(86_400 * 365))
      let report = try await store.compact(retention: .seconds(Int64.max))
      #expect(report.removed == 0)
    }
  }

  @Test func aRetentionOfInt64MaxSecondsWithAClockBeforeNineteenSeventyRemovesNothing() async throws {
    try await withStore { store, clock, _ in
      clock.set(milliseconds: -10_000)
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      try await store.queue.cancel(id)
      clock.set(milliseconds: -2)
      // clock − retention overflowed and wrapped to a cutoff at the end of time: everything went.
      let report = try await store.compact(retention: .seconds(Int64.max))
      #expect(report.removed == 0)
      #expect(try store.log.head() == 2)
    }
  }

  @Test func aRetentionOfInt64MinSecondsIsRefused() async throws {
    try await withStore { store, _, _ in
      await #expect { _ = try await store.compact(retention: .seconds(Int64.min)) } throws: {
        Self.isInvalidArgument($0)
      }
    }
  }

  @Test func anAutomaticCompactionLookingEveryInt64MaxSecondsDoesNotTrap() async throws {
    try await withStore { configuration in
      configuration.automaticCompaction = AutomaticCompaction(
        everyEvents: 1, checkInterval: .seconds(Int64.max))
    } _: { store, _, _ in
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      // The compaction task sleeps at once: `Task.sleep(for: .seconds(Int64.max))` trapped.
      try await Task.sleep(for: .milliseconds(100))
      #expect(try store.queue.pendingTasks().count == 1)
    }
  }

  @Test func anAutomaticCompactionLookingEveryNegativeIntervalStillCompacts() async throws {
    try await withStore { configuration in
      configuration.automaticCompaction = AutomaticCompaction(
        everyEvents: 1, retention: .zero, checkInterval: .seconds(Int64.min))
    } _: { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      try await store.queue.cancel(id)
      var compacted: (through: UInt64, removed: UInt64)?
      for _ in 0..<500 where compacted == nil {
        try await Task.sleep(for: .milliseconds(10))
        compacted = try store.log.compactionState()
      }
      #expect(compacted != nil)
    }
  }

  // MARK: The runner

  @Test func aDeadOwnerCheckEveryInt64MaxSecondsDoesNotTrap() async throws {
    try await withStore { store, _, _ in
      var configuration = TaskRunner.Configuration()
      configuration.deadOwnerCheckInterval = .seconds(Int64.max)
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      let ran = EdgeCounter()
      runner.register(tag: "t") { _ in
        ran.increment()
        return .succeeded
      }
      runner.startAutomaticRunning()
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      for _ in 0..<500 where ran.value == 0 { try await Task.sleep(for: .milliseconds(10)) }
      runner.stop()
      #expect(ran.value == 1)
    }
  }

  @Test func aRetryAfterAClockAtInt64MaxStaysAtTheEndOfTimeInsteadOfWrappingToThePast() async throws {
    try await withStore { store, clock, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      clock.set(milliseconds: .max - 10)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { _ in
        .failed("later")
      }
      let report = try await runner.run()
      #expect(report.outcome(of: id) == .failed("later", retryAt: at(.max)))
      let task = try #require(try store.queue.task(id))
      #expect(task.status == .waiting(until: at(.max)))
    }
  }

  @Test func aRetryPolicyOfInt64MaxDelaysNeverTraps() async throws {
    try await withStore { store, clock, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let runner = TaskRunner(queue: store.queue)
      let policy = RetryPolicy(
        maxAttempts: .max, initialDelay: .seconds(Int64.max), multiplier: .infinity,
        maxDelay: .seconds(Int64.max),
        jitter: 1)
      runner.register(tag: "t", retry: policy) { _ in .failed("later") }
      let report = try await runner.run()
      guard case .failed(_, let retryAt?) = report.outcome(of: id) else {
        Issue.record("no retry time: \(String(describing: report.outcome(of: id)))")
        return
      }
      #expect(retryAt > clock.date)
    }
  }

  // MARK: Opening

  @Test(arguments: [0, -1, Int.min])
  func aRebuildChunkSizeBelowOneIsRefused(size: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    await #expect {
      _ = try await fixture.openStore { $0.rebuildChunkSize = size }
    } throws: { Self.isInvalidArgument($0) }
    #expect(!FileManager.default.fileExists(atPath: fixture.path))
  }

  @Test(arguments: [0, -1, Int.min, Int.max])
  func anInitialMapSizeOutOfRangeIsRefusedOrAdjustedNeverATrap(size: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let store = try await fixture.openStore { $0.initialMapSize = size }
      defer { store.close() }
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try store.queue.pendingTasks().count == 1)
    } catch {
      #expect(Self.isInvalidArgument(error) || error is FerryError, "\(error)")
    }
  }
}

/// Durations longer than `Int64.max` seconds — valid, but `Duration.components` traps on them —
/// at every public API that takes a duration: saturated or refused, never a trap (the attack of
/// the writer's poll found `writerSpin` trapping so; these took the same path).
@Suite(.timeLimit(.minutes(20))) struct HugeDurationTests {
  static let huge: [Duration] = [
    .seconds(1e19), .seconds(Int64.max) * 4, .seconds(-1e19), .seconds(Int64.min) * 4,
  ]

  @Test func theConversionsSaturate() {
    #expect(Duration.seconds(1e19).milliseconds == .max)
    #expect(Duration.seconds(-1e19).milliseconds == .min)
    #expect((Duration.seconds(Int64.max) * 4).nanoseconds == .max)
    #expect((Duration.seconds(Int64.min) * 4).nanoseconds == .min)
    #expect(Duration.milliseconds(Int64.max).milliseconds == .max)
    #expect(Duration.milliseconds(Int64.max - 1).milliseconds == .max - 1)
    #expect(Duration.milliseconds(-1_500).milliseconds == -1_500)
    #expect(Duration.nanoseconds(Int64.max - 1).nanoseconds == .max - 1)
    #expect(Duration.nanoseconds(-7).nanoseconds == -7)
  }

  @Test func retryPoliciesTimeLimitsAndWindowsTakeThem() async throws {
    for huge in Self.huge {
      let policy = RetryPolicy(maxAttempts: 3, initialDelay: huge, multiplier: 2, maxDelay: huge, jitter: 0)
      #expect(policy.delay(afterAttempt: 1, random: 0.5) >= .zero)
    }
    try await withStore { store, _, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      var configuration = TaskRunner.Configuration()
      configuration.defaultTimeLimit = .seconds(1e19)
      configuration.timeLimitGrace = .seconds(1e19)
      configuration.interruptionGrace = .seconds(-1e19)
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(
        tag: "t", retry: RetryPolicy(maxAttempts: 2, initialDelay: .seconds(1e19), maxDelay: .seconds(1e19))
      ) { _ in .failed("no", retryable: true) }
      let report = try await runner.run(.task(id))
      #expect(report.entries.count == 1)
      #expect(try store.queue.task(id) != nil)  // waiting for a retry at the end of time
    }
  }

  @Test func cacheAgesAndRetentionTakeThem() async throws {
    try await withStore { store, _, _ in
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false))
      for huge in Self.huge {
        if huge > .zero {
          guard case .cache(_, _, let isTooOld) = try store.ledger.state(key: "k", maxAge: huge) else {
            Issue.record("no cache")
            continue
          }
          #expect(!isTooOld)
          #expect(try store.ledger.keys(olderThan: huge).isEmpty)
          #expect(try await store.compact(retention: huge).removed == 0)
        } else {
          #expect { try store.ledger.state(key: "k", maxAge: huge) } throws: {
            EdgeValueTests.isInvalidArgument($0)
          }
        }
      }
    }
  }

  @Test func aManualClockMovedPastTheEndOfTimeReadsTheEndOfTime() {
    let clock = ManualClock(date: Date(timeIntervalSince1970: 0))
    clock.advance(by: .seconds(1e19))
    #expect(clock.date == Date(unixMilliseconds: .max))
    clock.advance(by: .seconds(-1e19) * 3)
    #expect(clock.date == Date(unixMilliseconds: .min))
  }

  @Test func aStoreOpensWithThem() async throws {
    for huge in Self.huge {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let store = try await fixture.openStore {
        $0.gaugeInterval = huge
        $0.writerSpin = huge
      }
      try await store.queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try store.queue.pendingTasks().count == 1)
      store.close()
    }
  }
}

/// A count shared with handlers.
final class EdgeCounter: Sendable {
  private let count = Mutex(0)
  func increment() { count.withLock { $0 += 1 } }
  var value: Int { count.withLock { $0 } }
}
