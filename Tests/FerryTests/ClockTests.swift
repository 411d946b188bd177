import Clocks
import FerryLog
import FerryTesting
import Foundation
import PropertyBased
import Synchronization
import Testing

@_spi(Engine) @testable import Ferry

/// A store on an injected `any Clock<Duration>` (issue 14): "now" is the start date plus the time
/// elapsed on the clock, waits sleep on the clock, and times come and go as `Date`s while the log
/// keeps milliseconds.
@Suite(.timeLimit(.minutes(20))) struct ClockTests {
  static let start: Int64 = 1_700_000_000_000

  /// A store on `clock`, whose reading at open stands for `start`.
  static func withStore(
    on clock: any Clock<Duration>, startDate: Date? = at(start),
    _ body: (FerryStore, QueueFixture) async throws -> Void
  ) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var configuration = FerryStore.Configuration()
    configuration.clock = clock
    configuration.startDate = startDate
    let store = try await FerryStore.open(at: fixture.path, configuration: configuration)
    defer { store.close() }
    try await body(store, fixture)
  }

  /// Waits (yielding) until something sleeps on a swift-clocks test clock: no count of tries, which
  /// a loaded machine could use up first; one that never sleeps is ended by the suite's time limit.
  static func waitForSuspension(on clock: TestClock<Duration>) async {
    while true {
      do { try await clock.checkSuspension() } catch { return }  // it throws while one sleeps
      await Task.yield()
    }
  }

  // MARK: swift-clocks' TestClock

  @Test func aTestClockFromAnotherPackageMakesARetryDueExactlyWhenAdvancedPastTheBackoff() async throws {
    let clock = TestClock<Duration>()
    try await Self.withStore(on: clock) { store, _ in
      let queue = store.queue
      #expect(store.ledger.now == at(Self.start))
      let id = try await queue.add(tag: "t", payload: Item(name: "a"))
      #expect(try queue.task(id)?.addedAt == at(Self.start))
      let run = runner(queue)
      run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(30), jitter: 0)) { task in
        task.attempt == 1 ? .failed("offline") : .succeeded
      }
      await clock.advance(by: .seconds(5))
      let due = at(Self.start + 5_000 + 30_000)
      #expect(try await run.run().outcome(of: id) == .failed("offline", retryAt: due))
      #expect(try queue.task(id)?.status == .waiting(until: due))

      await clock.advance(by: .seconds(30) - .milliseconds(1))
      #expect(try queue.nextRunnable() == nil)
      #expect(try await run.run(.task(id)).outcome(of: id) == .skipped(.waitingForRetry(until: due)))
      await clock.advance(by: .milliseconds(1))  // exactly the retry time
      #expect(try queue.nextRunnable()?.id == id)
      #expect(try await run.run().outcome(of: id) == .succeeded)
      // The log stamps its events with the injected clock's time, in milliseconds.
      let last = try #require(try store.log.event(at: try store.log.head()))
      #expect(last.timestamp == Self.start + 35_000)
      try expectConsistent(queue)
    }
  }

  @Test func aTestClockFromAnotherPackageMakesACacheKeyTooOldExactlyPastItsMaxAge() async throws {
    let clock = TestClock<Duration>()
    try await Self.withStore(on: clock) { store, _ in
      let ledger = store.ledger
      try await ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
      await clock.advance(by: .seconds(60))
      #expect(
        try ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: at(Self.start), age: .seconds(60), isTooOld: false))
      #expect(try ledger.keys(olderThan: .seconds(60)).isEmpty)
      await clock.advance(by: .milliseconds(1))
      #expect(
        try ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: at(Self.start), age: .milliseconds(60_001), isTooOld: true))
      #expect(try ledger.keys(olderThan: .seconds(60)) == ["notes"])
    }
  }

  /// The automatic runner's retry timer sleeps on the injected clock: advancing it past the retry
  /// time wakes the runner, and nothing else does.
  @Test func automaticRunningWakesWhenATestClockIsAdvancedPastARetryTime() async throws {
    let clock = TestClock<Duration>()
    try await Self.withStore(on: clock) { store, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(3600), jitter: 0)) { task in
        task.attempt == 1 ? .failed("offline") : .succeeded
      }
      let id = try await queue.add(tag: "t", payload: Item(name: "a"))
      run.startAutomaticRunning()
      defer { run.stop() }
      try await waitUntil { try queue.task(id)?.status == .waiting(until: at(Self.start + 3_600_000)) }
      await Self.waitForSuspension(on: clock)  // the runner's timer
      await clock.advance(by: .seconds(3600))
      try await waitUntil { try queue.task(id) == nil }
      #expect(try queue.pendingTasks().isEmpty)
    }
  }

  /// A time limit is measured on the injected clock too.
  @Test func aTimeLimitRunsOutWhenATestClockIsAdvancedPastIt() async throws {
    let clock = TestClock<Duration>()
    try await Self.withStore(on: clock) { store, _ in
      let queue = store.queue
      let run = runner(queue)
      let started = Gate()
      run.register(tag: "slow", timeLimit: .seconds(10)) { _ in
        started.open()
        try await Task.sleep(for: .seconds(3600))  // real time: only cancellation ends it
        return .succeeded
      }
      let id = try await queue.add(tag: "slow", payload: Item(name: "a"))
      async let report = run.run()
      await started.wait()
      await Self.waitForSuspension(on: clock)  // the limit's timer
      await clock.advance(by: .seconds(10))
      #expect(
        try await report.outcome(of: id)
          == .failed("timed out after 10 s", retryAt: at(Self.start + 10_000 + 1000)))
    }
  }

  // MARK: ManualClock

  @Test func aManualClockWakesASleeperExactlyWhenMovedToItsDeadline() async throws {
    let clock = ManualClock(date: at(Self.start))
    #expect(clock.date == at(Self.start))
    #expect(clock.now == .init(sinceUnixEpoch: .milliseconds(Self.start)))
    let woke = Mutex(false)
    let deadline = clock.now.advanced(by: .seconds(10))
    let sleeper = Task {
      try await clock.sleep(until: deadline)
      woke.withLock { $0 = true }
    }
    await clock.waitForSleepers()
    clock.advance(by: .seconds(10) - .nanoseconds(1))
    for _ in 0..<100 { await Task.yield() }
    #expect(clock.sleeperCount == 1)
    #expect(woke.withLock { $0 } == false)
    clock.set(at(Self.start - 60_000))  // back: still asleep
    #expect(clock.sleeperCount == 1)
    clock.advance(to: deadline)
    try await sleeper.value
    #expect(woke.withLock { $0 })
    #expect(clock.date == at(Self.start + 10_000))
    // A deadline that has come returns at once; `Clock`'s own helpers work on it.
    try await clock.sleep(until: deadline)
    try await clock.sleep(for: .zero)
    #expect(clock.sleeperCount == 0)
  }

  @Test func cancellingASleepOnAManualClockEndsItAtOnceWithCancellationError() async throws {
    let clock = ManualClock()
    let sleeper = Task { try await clock.sleep(until: clock.now.advanced(by: .seconds(3600))) }
    await clock.waitForSleepers()
    sleeper.cancel()
    await #expect(throws: CancellationError.self) { try await sleeper.value }
    #expect(clock.sleeperCount == 0)
    // Cancelled before it sleeps: it never does.
    let early = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      try await clock.sleep(until: clock.now.advanced(by: .seconds(1)))
    }
    await #expect(throws: CancellationError.self) { try await early.value }
    #expect(clock.sleeperCount == 0)
  }

  /// A `ManualClock` is a `DatedClock`: set as the clock (no `install`, no start date), the store
  /// takes its date, and a store reopened after the clock moved on carries on from it.
  @Test func aStoreReopenedOnAnAdvancedManualClockCarriesOnFromTheClocksDate() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let clock = ManualClock(date: at(Self.start))
    var configuration = FerryStore.Configuration()
    configuration.clock = clock
    var store = try await FerryStore.open(at: fixture.path, configuration: configuration)
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    var run = runner(store.queue)
    run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(60), jitter: 0)) { _ in
      .failed("offline")
    }
    #expect(try await run.run().outcome(of: id) == .failed("offline", retryAt: at(Self.start + 60_000)))
    store.close()

    clock.advance(by: .seconds(60))
    store = try await FerryStore.open(at: fixture.path, configuration: configuration)
    defer { store.close() }
    #expect(store.ledger.now == at(Self.start + 60_000))
    #expect(try store.queue.nextRunnable()?.id == id)
    run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    #expect(try await run.run().outcome(of: id) == .succeeded)
  }

  @Test(arguments: [Double.infinity, -.infinity, .nan])
  func aStartDateThatIsNoTimeIsRefusedAtOpen(seconds: Double) async throws {
    await #expect {
      try await Self.withStore(on: TestClock<Duration>(), startDate: Date(timeIntervalSince1970: seconds)) {
        _, _ in
      }
    } throws: { error in
      guard case .invalidArgument(let message) = error as? FerryError else { return false }
      return message.hasPrefix("startDate must be a time")
    }
  }

  @Test func aStartDateGivenWinsOverADatedClocksOwnDate() async throws {
    let clock = ManualClock(date: at(Self.start))
    try await Self.withStore(on: clock, startDate: at(42_000)) { store, _ in
      #expect(store.ledger.now == at(42_000))
      clock.advance(by: .seconds(1))
      #expect(store.ledger.now == at(43_000))
    }
  }

  // MARK: Real clocks

  @Test func theDefaultClockIsTheSystemsWallClock() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let before = Date().unixMilliseconds
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    #expect(FerryStore.Configuration().clock is ContinuousClock)
    #expect(FerryStore.Configuration().startDate == nil)
    let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
    let added = try #require(try store.queue.task(id)).addedAt.unixMilliseconds
    let after = Date().unixMilliseconds
    #expect(before <= added && added <= after)
    #expect(store.ledger.now.unixMilliseconds >= added)
  }

  /// The kinds of time a store can have, for the cancellation test.
  enum Kind: String, CaseIterable, Sendable {
    case system, continuousFromADate, suspending, swiftClocksTestClock, manual
  }

  /// Cancelling the task of a wait an hour away ends it at once, whatever the clock.
  @Test(arguments: Kind.allCases)
  func cancellingAWaitEndsItPromptlyOnEveryKindOfClock(kind: Kind) async throws {
    let time: StoreTime
    switch kind {
    case .system: time = StoreTime(ContinuousClock(), startDate: nil)
    case .continuousFromADate: time = StoreTime(ContinuousClock(), startDate: at(Self.start))
    case .suspending: time = StoreTime(SuspendingClock(), startDate: nil)
    case .swiftClocksTestClock: time = StoreTime(TestClock<Duration>(), startDate: at(Self.start))
    case .manual: time = StoreTime(ManualClock(), startDate: nil)
    }
    let until = time.now().addingSaturating(3_600_000)
    let waiter = Task { await time.sleep(until) }
    for _ in 0..<100 { await Task.yield() }
    waiter.cancel()
    await waiter.value
    #expect(time.now() < until)
  }

  /// A wait longer than one sleep of a clock may be sleeps in steps, and still ends exactly at its
  /// time.
  @Test func aWaitBeyondTheLongestSingleSleepEndsExactlyAtItsTime() async throws {
    let clock = ManualClock(date: at(Self.start))
    let time = StoreTime(clock, startDate: nil)
    let until = Self.start + 3 * StoreTime.longestStep.milliseconds + 5
    let done = Mutex(false)
    // A child task: should the wait never end, the test's time limit cancels it with the test.
    async let waiter: Void = {
      await time.sleep(until)
      done.withLock { $0 = true }
    }()
    for step in 1...3 {
      await clock.waitForSleepers()
      clock.advance(by: StoreTime.longestStep)
      if step < 3 {
        for _ in 0..<100 { await Task.yield() }
        #expect(done.withLock { $0 } == false)
      }
    }
    await clock.waitForSleepers()
    clock.advance(by: .milliseconds(4))
    for _ in 0..<100 { await Task.yield() }
    #expect(done.withLock { $0 } == false)
    #expect(time.now() == until - 1)
    clock.advance(by: .milliseconds(1))
    await waiter
    #expect(done.withLock { $0 })
    #expect(time.now() == until)
  }

  // MARK: Dates and milliseconds

  @Test func everyMillisecondADateHoldsExactlyComesBackFromItsDate() async {
    await propertyCheck(input: Gen.int64(in: -2_000_000_000_000_000...2_000_000_000_000_000)) { ms in
      #expect(at(ms).unixMilliseconds == ms)
      #expect(ManualClock(date: at(ms)).date == at(ms))
    }
    for ms: Int64 in [0, 1, -1, 999, -999, 1000, -1001, Self.start, Self.start + 1, 253_402_300_799_999] {
      #expect(at(ms).unixMilliseconds == ms)
    }
  }

  @Test func aDateBetweenMillisecondsIsTakenAsTheLastMillisecondAtOrBeforeIt() async throws {
    #expect(Date(timeIntervalSince1970: 1.0005).unixMilliseconds == 1000)
    #expect(Date(timeIntervalSince1970: 0.0009).unixMilliseconds == 0)
    #expect(Date(timeIntervalSince1970: -0.0005).unixMilliseconds == -1)
    #expect(Date(timeIntervalSince1970: -1.0005).unixMilliseconds == -1001)
    // So a fetch recorded at such a date is kept at that millisecond.
    try await Self.withStore(on: ManualClock(date: at(Self.start))) { store, _ in
      let date = at(Self.start - 1000).addingTimeInterval(0.0007)
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: date)
      #expect(try store.ledger.record("k")?.lastSuccess == at(Self.start - 1000))
      #expect(try store.ledger.record("k")?.lastSuccessMs == Self.start - 1000)
    }
  }

  @Test func datesBeyondTheMillisecondRangeSaturateAndNeverTrap() async throws {
    #expect(Date.distantFuture.unixMilliseconds > Self.start)
    #expect(Date.distantPast.unixMilliseconds < 0)
    for (date, expected) in [
      (Date(timeIntervalSince1970: 1e300), Int64.max), (Date(timeIntervalSince1970: -1e300), Int64.min),
      (Date(timeIntervalSince1970: .infinity), Int64.max),
      (Date(timeIntervalSince1970: -.infinity), Int64.min),
      (Date(timeIntervalSince1970: .nan), 0), (at(.max), Int64.max), (at(.min), Int64.min),
    ] {
      #expect(date.unixMilliseconds == expected, "\(date.timeIntervalSince1970)")
    }
    try await Self.withStore(on: ManualClock(date: at(Self.start))) { store, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      for date in [
        Date(timeIntervalSince1970: .infinity), Date(timeIntervalSince1970: -.infinity),
        Date(timeIntervalSince1970: .nan), .distantFuture, .distantPast,
      ] {
        #expect(try store.queue.nextRunnable(at: date)?.id == id)
        _ = try store.queue.isIdle(at: date)
        await #expect(throws: FerryError.self) {
          try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false), at: date)
        }
      }
      #expect(try store.ledger.record("k") == nil)
      // A clock set far past the end of Int64 milliseconds reads as the end, and a ManualClock set
      // there stays put.
      let clock = ManualClock(date: Date(timeIntervalSince1970: .infinity))
      #expect(clock.date.unixMilliseconds == .max)
      clock.set(Date(timeIntervalSince1970: -.infinity))
      #expect(clock.date.unixMilliseconds == .min)
    }
  }

  @Test func timesPrintAsISO8601EvenAtTheEndsOfTime() {
    #expect("\(TaskStatus.waiting(until: at(0)))" == "waiting until 1970-01-01T00:00:00.000Z")
    #expect(
      "\(RunOutcome.failed("x", retryAt: at(Self.start + 1)))"
        == "failed: x, retry at 2023-11-14T22:13:20.001Z")
    for date in [
      at(.max), at(.min), Date(timeIntervalSince1970: .infinity), Date(timeIntervalSince1970: .nan),
    ] {
      #expect("\(TaskStatus.waiting(until: date))".hasPrefix("waiting until "))
    }
  }

  // MARK: RetryPolicy in Durations

  @Test func aRetryPolicyTakesANegativeDelayAsZero() async throws {
    let policy = RetryPolicy(initialDelay: .seconds(-5), maxDelay: .milliseconds(-1))
    #expect(policy.initialDelay == .zero && policy.maxDelay == .zero)
    #expect(policy.delay(afterAttempt: 3, random: 0.9) == .zero)
    var changed = RetryPolicy(initialDelay: .seconds(1), jitter: 0)
    changed.initialDelay = .seconds(-3)  // set after the initializer: the delay still clamps
    #expect(changed.delay(afterAttempt: 1, random: 0.5) == .zero)
    changed = RetryPolicy(initialDelay: .seconds(1), jitter: 0)
    changed.maxDelay = .seconds(-3)
    #expect(changed.delay(afterAttempt: 1, random: 0.5) == .zero)
    // A runner with such a policy retries at once, never in the past.
    try await Self.withStore(on: ManualClock(date: at(Self.start))) { store, _ in
      let id = try await store.queue.add(tag: "t", payload: Item(name: "a"))
      let run = runner(store.queue)
      run.register(tag: "t", retry: changed) { _ in .failed("offline") }
      #expect(try await run.run().outcome(of: id) == .failed("offline", retryAt: at(Self.start)))
      #expect(try store.queue.nextRunnable()?.id == id)
    }
  }

  @Test func aRetryPolicysDelaysAreWholeMilliseconds() {
    #expect(
      RetryPolicy(initialDelay: .microseconds(1500), jitter: 0).delay(afterAttempt: 1, random: 0)
        == .milliseconds(1))
    #expect(
      RetryPolicy(initialDelay: .nanoseconds(999_999), jitter: 0).delay(afterAttempt: 1, random: 0) == .zero)
    let policy = RetryPolicy(
      initialDelay: .milliseconds(1), multiplier: 1.5, maxDelay: .seconds(1), jitter: 0)
    #expect(policy.delay(afterAttempt: 2, random: 0) == .milliseconds(1))  // 1.5 ms, rounded down
    #expect(policy.delay(afterAttempt: 40, random: 0) == .seconds(1))
  }
}
