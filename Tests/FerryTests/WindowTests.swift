import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The one place these tests read and move the store's test clock and turn its times into dates.
struct WindowTime {
  let clock: ManualClock
  var now: Int64 { clock.milliseconds }
  var sleepers: Int { clock.sleeperCount }
  func date(_ ms: Int64) -> Date { Date(timeIntervalSince1970: Double(ms) / 1000) }
  func advance(_ ms: Int64) { clock.advance(by: .milliseconds(ms)) }
  func waitForSleepers(_ count: Int) async { await clock.waitForSleepers(count) }
}

/// What the log says happened to one task's runs, counted from its events.
struct LoggedRuns: Equatable {
  var starts = 0
  var succeeded = 0
  var failed = 0
  var interrupted = 0

  static func read(_ log: EventLog) throws -> [TaskID: LoggedRuns] {
    var runs: [TaskID: LoggedRuns] = [:]
    for (_, event) in try log.forEachTaskEvent() {
      switch event {
      case .runStarted(let id, _, _, _, _): runs[id, default: LoggedRuns()].starts += 1
      case .runSucceeded(let id, _): runs[id, default: LoggedRuns()].succeeded += 1
      case .runFailed(let id, _, _, _), .errorRecorded(let id, _, true):
        runs[id, default: LoggedRuns()].failed += 1
      case .runInterrupted(let id): runs[id, default: LoggedRuns()].interrupted += 1
      default: break
      }
    }
    return runs
  }
}

/// Background windows, deadlines and condition wake-ups (`Specs/task-events.md` §4.6) on real
/// stores, with two runners and a second process where they matter.
@Suite(.timeLimit(.minutes(20))) struct WindowTests {
  @Test func aWindowEndingMidPassLeavesTheStoreConsistentAndTheNextWindowRunsTheInterruptedTaskOnce()
    async throws
  {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let first = try await queue.add(tag: "t", payload: ["n": 1])
      let slow = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
      let behind = try await queue.add(tag: "t", payload: ["n": 3], groupId: "g")
      let later = try await queue.add(tag: "t", payload: ["n": 4])
      let started = Gate()
      let journal = Journal()
      let run = runner(queue)
      run.register(tag: "t") { task in
        if task.id == slow && task.attempt == 1 {
          started.open()
          do {
            try await Task.sleep(for: .seconds(3600))  // ends only when cancelled
          } catch {
            journal.note("cancelled \(task.id)")
            throw error
          }
        }
        return .succeeded
      }
      let start = time.now
      let window = Task { try await run.run(until: time.date(start + 10_000)) }
      await started.wait()
      time.advance(10_000)  // the deadline, mid-pass
      let report = try await window.value

      #expect(report.end == .deadline)
      #expect(report.outcome(of: first) == .succeeded)
      #expect(report.outcome(of: slow) == .interrupted)
      #expect(report.outcome(of: behind) == nil)
      #expect(report.outcome(of: later) == nil)  // never claimed
      #expect(report.interrupted == 1 && report.succeeded == 1)
      #expect(journal.all == ["cancelled \(slow)"])
      #expect(report.nextDue == time.date(start + 10_000))  // work is ready: due now
      #expect(try queue.nextDueDate() == report.nextDue)
      let interrupted = try #require(try queue.task(slow))
      #expect(interrupted.status == .ready)
      #expect(interrupted.attempts == 1)
      #expect(interrupted.lastFailure == nil)  // not a failure
      // The projection equals a replay of the log, and a rebuild gives the same queue.
      try expectConsistent(queue)
      let before = try queue.pendingTasks()
      _ = try await store.log.rebuild()
      #expect(try queue.pendingTasks() == before)
      var runs = try LoggedRuns.read(store.log)
      #expect(runs[slow] == LoggedRuns(starts: 1, interrupted: 1))
      #expect(runs[later] == nil && runs[behind] == nil)

      // The next window runs the interrupted task once, and the rest.
      let next = try await run.run(for: .seconds(60))
      #expect(next.end == .outOfWork)
      #expect(next.outcome(of: slow) == .succeeded)
      #expect(next.outcome(of: behind) == .succeeded)
      #expect(next.outcome(of: later) == .succeeded)
      #expect(next.nextDue == nil)
      runs = try LoggedRuns.read(store.log)
      #expect(runs[slow] == LoggedRuns(starts: 2, succeeded: 1, interrupted: 1))
      for id in [first, behind, later] { #expect(runs[id] == LoggedRuns(starts: 1, succeeded: 1)) }
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  /// At the deadline both handlers are cancelled: one returns a result within the grace (logged),
  /// the other ignores its cancellation and is left behind after the grace (interrupted); what it
  /// returns later is dropped. Each run has one outcome in the log.
  @Test func atTheDeadlineAResultWithinTheGraceIsLoggedAndAHandlerIgnoringCancellationIsAbandoned()
    async throws
  {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let stubborn = try await queue.add(tag: "stubborn", payload: ["n": 1])
      let finisher = try await queue.add(tag: "finisher", payload: ["n": 2])
      let run = runner(queue) {
        $0.maxConcurrentTasks = 2
        $0.interruptionGrace = .seconds(3)
      }
      let journal = Journal()
      let releaseStubborn = Gate()
      let releaseFinisher = Gate()
      run.register(tag: "stubborn") { task in
        guard task.attempt == 1 else { return .succeeded }
        journal.note("stubborn started")
        await releaseStubborn.wait()  // not cancellable
        journal.note("stubborn ended, cancelled: \(Task.isCancelled)")
        return .failed("too late to be logged")
      }
      run.register(tag: "finisher") { _ in
        journal.note("finisher started")
        await releaseFinisher.wait()
        return .succeeded  // after its cancellation, within the grace
      }
      let start = time.now
      let window = Task { try await run.run(until: time.date(start + 5000)) }
      try await waitUntil { journal.all.count == 2 }
      time.advance(5000)  // the deadline: both handlers are cancelled, each with a grace timer
      await time.waitForSleepers(2)
      releaseFinisher.open()
      try await waitUntil { time.sleepers == 1 }  // the finisher ended: its grace timer is gone
      time.advance(3000)  // the grace: the stubborn handler is left behind
      let report = try await window.value
      #expect(report.end == .deadline)
      #expect(report.outcome(of: finisher) == .succeeded)
      #expect(report.outcome(of: stubborn) == .interrupted)
      #expect(report.nextDue == time.date(start + 8000))
      #expect(try queue.task(stubborn)?.status == .ready)

      releaseStubborn.open()
      try await waitUntil { journal.all.count == 3 }
      #expect(journal.all.last == "stubborn ended, cancelled: true")
      for _ in 0..<200 { await Task.yield() }
      var runs = try LoggedRuns.read(store.log)
      #expect(runs[stubborn] == LoggedRuns(starts: 1, interrupted: 1))
      #expect(runs[finisher] == LoggedRuns(starts: 1, succeeded: 1))
      try expectConsistent(queue)

      let next = try await run.run(for: .seconds(10))
      #expect(next.outcome(of: stubborn) == .succeeded)
      runs = try LoggedRuns.read(store.log)
      #expect(runs[stubborn] == LoggedRuns(starts: 2, succeeded: 1, interrupted: 1))
      #expect(
        try queue.history(of: stubborn).map(\.event) == [
          .added, .runStarted(attempt: 1), .runInterrupted, .runStarted(attempt: 2), .runSucceeded,
        ])
      try expectConsistent(queue)
    }
  }

  /// The window waits for a retry time that comes before its deadline and runs the retry; it ends
  /// when only retries after the deadline are left, and reports the earliest as `nextDue` — what
  /// `nextDueDate()` reads from the indexes too.
  @Test func nextDueIsTheEarliestRetryTimeAndARetryDueWithinTheWindowRunsInIt() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let soon = try await queue.add(tag: "soon", payload: ["n": 1])
      let late = try await queue.add(tag: "late", payload: ["n": 2])
      let run = runner(queue)
      run.register(tag: "soon", retry: RetryPolicy(initialDelay: .seconds(3))) { task in
        task.attempt == 1 ? .failed("offline") : .succeeded
      }
      run.register(tag: "late", retry: RetryPolicy(maxAttempts: 10, initialDelay: .seconds(60))) { _ in
        .failed("the server is down")
      }
      #expect(try queue.nextDueDate() == time.date(time.now))
      let start = time.now
      let window = Task { try await run.run(until: time.date(start + 10_000)) }
      await time.waitForSleepers(2)  // the deadline, and the retry of "soon": the window waits
      #expect(try queue.nextDueDate() == time.date(start + 3000))
      time.advance(3000)
      let report = try await window.value
      #expect(report.end == .outOfWork)
      #expect(report.outcome(of: soon) == .succeeded)
      #expect(report.outcome(of: late) == .failed("the server is down", retryAt: time.date(start + 60_000)))
      #expect(report.nextDue == time.date(start + 60_000))
      #expect(
        "\(report)" == "the window ran out of work: 1 succeeded, 1 failed; next due "
          + time.date(start + 60_000).ISO8601Format())
      #expect(try queue.nextDueDate() == time.date(start + 60_000))
      let runs = try LoggedRuns.read(store.log)
      #expect(runs[soon] == LoggedRuns(starts: 2, succeeded: 1, failed: 1))
      #expect(runs[late] == LoggedRuns(starts: 1, failed: 1))

      // Paused: nothing is due, and a window runs nothing.
      try await queue.pause()
      #expect(try queue.nextDueDate() == nil)
      time.advance(60_000)
      let paused = try await run.run(for: .seconds(10))
      #expect(paused.end == .paused && paused.entries.isEmpty && paused.nextDue == nil)
      try await queue.resume()
      #expect(try queue.nextDueDate() == time.date(time.now))  // its retry time has come
      // Only a blocked task left: nothing time alone makes runnable.
      try await queue.recordError(late, message: "fix it")
      #expect(try queue.nextDueDate() == nil)
      try expectConsistent(queue)
    }
  }

  @Test func aWindowWhoseDeadlineHasPassedRunsNothingAndReportsNextDue() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let ready = try await queue.add(tag: "t", payload: ["n": 1])
      let waiting = try await queue.add(tag: "t", payload: ["n": 2])
      let run = runner(queue)
      run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(5))) { _ in .failed("offline") }
      _ = try await run.run(.task(waiting))
      let head = try store.log.head()

      let past = try await run.run(until: time.date(time.now - 1))
      #expect(past.end == .deadline)
      #expect(past.entries.isEmpty)
      #expect(past.nextDue == time.date(time.now))  // a ready task
      let none = try await run.run(for: .zero)
      #expect(none.end == .deadline && none.entries.isEmpty)
      #expect(try store.log.head() == head)  // nothing claimed, nothing logged

      try await queue.cancel(ready)
      let later = try await run.run(until: time.date(time.now - 1000))
      #expect(later.nextDue == time.date(time.now + 5000))  // the retry time
      #expect(try store.log.head() == head + 1)  // the cancel only
    }
  }

  /// An operating system's expiration handler cancels the task awaiting the window; `stop()` does
  /// the same: the run under way is interrupted and the window returns its report.
  @Test func cancellingTheWindowsCallerOrStopEndsItLikeADeadline() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let id = try await queue.add(tag: "upload", payload: ["n": 1])
      let journal = Journal()
      let run = runner(queue)
      run.register(tag: "upload") { task in
        guard task.attempt < 3 else { return .succeeded }
        journal.note("started \(task.attempt)")
        try await Task.sleep(for: .seconds(3600))
        return .succeeded
      }
      let window = Task { try await run.run(for: .seconds(3600)) }
      try await waitUntil { journal.all == ["started 1"] }
      window.cancel()
      let cancelled = try await window.value
      #expect(cancelled.end == .stopped)
      #expect(cancelled.outcome(of: id) == .interrupted)
      #expect(cancelled.nextDue == time.date(time.now))
      #expect(try queue.task(id)?.status == .ready)

      let stopped = Task { try await run.run(for: .seconds(3600)) }
      try await waitUntil { journal.all.count == 2 }
      run.stop()
      let report = try await stopped.value
      #expect(report.end == .stopped)
      #expect(report.outcome(of: id) == .interrupted)

      // stop() ends the windows under way only: the next one runs.
      let next = try await run.run(for: .seconds(60))
      #expect(next.end == .outOfWork && next.outcome(of: id) == .succeeded)
      #expect(try LoggedRuns.read(store.log)[id] == LoggedRuns(starts: 3, succeeded: 1, interrupted: 2))
      try expectConsistent(queue)
    }
  }

  /// A task skipped as not ready runs once the app says conditions changed — with automatic
  /// running, and in a window waiting for a retry — without the app calling `run()`.
  @Test func conditionsChangedRunsATaskSkippedAsNotReadyWithoutRun() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let online = Atomic<Bool>(false)
      let run = runner(queue)
      run.register(tag: "upload", isReadyToRun: { _ in online.load(ordering: .relaxed) }) { _ in .succeeded }
      let changes = queue.updates()
      run.startAutomaticRunning()
      let id = try await queue.add(tag: "upload", payload: ["n": 1])
      var iterator = changes.makeAsyncIterator()
      while let change = await iterator.next(), change != .skipped(id, .notReady) {}
      online.store(true, ordering: .relaxed)
      run.conditionsChanged()
      while let change = await iterator.next(), change != .succeeded(id) {}
      run.stop()
      #expect(try queue.task(id) == nil)
      #expect(try LoggedRuns.read(store.log)[id] == LoggedRuns(starts: 1, succeeded: 1))

      // A window: not ready, and nothing else to wait for — it ends; its nextDue leaves the task
      // out (time alone will not run it), though the queue's own hint counts it.
      online.store(false, ordering: .relaxed)
      let upload = try await queue.add(tag: "upload", payload: ["n": 2])
      let alone = try await run.run(for: .seconds(30))
      #expect(alone.end == .outOfWork)
      #expect(alone.outcome(of: upload) == .skipped(.notReady))
      #expect(alone.nextDue == nil)
      #expect(try queue.nextDueDate() == time.date(time.now))

      // A window waiting for a retry wakes on conditionsChanged and runs the task.
      let flaky = try await queue.add(tag: "flaky", payload: ["n": 3])
      run.register(tag: "flaky", retry: RetryPolicy(initialDelay: .seconds(60))) { task in
        task.attempt == 1 ? .failed("offline") : .succeeded
      }
      let start = time.now
      let window = Task { try await run.run(until: time.date(start + 120_000)) }
      await time.waitForSleepers(2)  // the deadline and the retry of "flaky"
      online.store(true, ordering: .relaxed)
      run.conditionsChanged()
      try await waitUntil { try queue.task(upload) == nil }
      time.advance(60_000)
      let report = try await window.value
      #expect(report.end == .outOfWork)
      #expect(report.outcome(of: upload) == .succeeded)
      #expect(report.outcome(of: flaky) == .succeeded)
      #expect(report.nextDue == nil)
      #expect(try LoggedRuns.read(store.log)[upload] == LoggedRuns(starts: 1, succeeded: 1))
      try expectConsistent(queue)
    }
  }

  /// The runner-wide check (`Configuration.isReadyToRun`) holds back every tag, even one with a
  /// check of its own that says yes; automatic running runs them all once conditions change.
  @Test func theRunnersOwnConditionHoldsEveryTagUntilConditionsChange() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let online = Atomic<Bool>(false)
      let run = runner(queue) { $0.isReadyToRun = { _ in online.load(ordering: .relaxed) } }
      run.register(tag: "a") { _ in .succeeded }
      run.register(tag: "b", isReadyToRun: { _ in true }) { _ in .succeeded }
      let a = try await queue.add(tag: "a", payload: ["n": 1])
      let b = try await queue.add(tag: "b", payload: ["n": 2])
      let skipped = try await run.run()
      #expect(skipped.outcome(of: a) == .skipped(.notReady) && skipped.outcome(of: b) == .skipped(.notReady))
      #expect(try LoggedRuns.read(store.log).isEmpty)

      let changes = queue.updates()
      run.startAutomaticRunning()
      defer { run.stop() }
      var seen = Set<TaskID>()
      var iterator = changes.makeAsyncIterator()
      online.store(true, ordering: .relaxed)
      run.conditionsChanged()
      while seen.count < 2, let change = await iterator.next() {
        if case .succeeded(let id) = change { seen.insert(id) }
      }
      #expect(seen == [a, b])
      #expect(try queue.nextDueDate() == nil)
      try expectConsistent(queue)
    }
  }

  /// Two runners of one queue in windows with two lanes each: the deadline cuts both mid-pass;
  /// nothing is claimed from it on; the next windows run every interrupted task once more.
  @Test func twoRunnersWindowsOnOneQueueStopAtTheDeadlineAndEveryTaskSucceedsOnce() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      var ids: [TaskID] = []
      for i in 0..<30 {
        ids.append(try await queue.add(tag: "t", payload: ["n": i], groupId: i % 2 == 0 ? "g\(i % 5)" : nil))
      }
      let hang = Atomic<Bool>(false)
      let hanging = Atomic<Int>(0)
      let starts = Atomic<Int>(0)
      let runners = [
        runner(queue) { $0.maxConcurrentTasks = 2 }, runner(queue) { $0.maxConcurrentTasks = 2 },
      ]
      for run in runners {
        run.register(tag: "t") { _ in
          // The first window: after ten runs, every handler hangs until it is cancelled.
          if starts.add(1, ordering: .relaxed).newValue > 10 && hang.load(ordering: .relaxed) {
            hanging.add(1, ordering: .relaxed)
            try await Task.sleep(for: .seconds(3600))
          }
          return .succeeded
        }
      }
      hang.store(true, ordering: .relaxed)
      let start = time.now
      let deadline = start + 10_000
      let windows = runners.map { run in Task { try await run.run(until: time.date(deadline)) } }
      try await waitUntil { hanging.load(ordering: .relaxed) == 4 }  // every lane hangs
      time.advance(10_000)
      var interrupted = Set<TaskID>()
      for window in windows {
        let report = try await window.value
        #expect(report.end == .deadline)
        for entry in report.entries where entry.outcome == .interrupted { interrupted.insert(entry.taskId) }
      }
      #expect(interrupted.count == 4)
      // From the deadline on, only interruptions were logged.
      var late: [String] = []
      try store.log.forEachEvent { event in if event.timestamp >= deadline { late.append(event.type) } }
      #expect(late.count == 4 && late.allSatisfy { $0 == "task.runInterrupted" })
      try expectConsistent(queue)

      hang.store(false, ordering: .relaxed)
      let next = runners.map { run in Task { try await run.run(for: .seconds(60)) } }
      for window in next { #expect(try await window.value.end == .outOfWork) }
      let ledger = try RunLedger(store.log, deadOwners: { _ in true })
      #expect(ledger.violations.isEmpty, "\(ledger.violations.prefix(3))")
      let runs = try LoggedRuns.read(store.log)
      for id in ids {
        let expected =
          interrupted.contains(id)
          ? LoggedRuns(starts: 2, succeeded: 1, interrupted: 1) : LoggedRuns(starts: 1, succeeded: 1)
        #expect(runs[id] == expected, "task \(id)")
      }
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  /// A second process runs the same store's tasks while this process's window hangs in two runs
  /// and reaches its deadline: the interrupted tasks are runnable again and every task succeeds
  /// exactly once, in whichever process.
  @Test func aWindowBesideARunnerInAnotherProcess() async throws {
    try await withStore { store, clock, fixture in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      var jobs: [TaskID] = []
      for _ in 0..<40 { jobs.append(try await queue.add(tag: "job", payload: ["kind": "ok"])) }
      let mine = Mutex<[TaskID]>([])
      let hang = Atomic<Bool>(true)
      let run = runner(queue) { $0.maxConcurrentTasks = 2 }
      run.register(tag: "job") { task in
        if hang.load(ordering: .relaxed) {
          mine.withLock { $0.append(task.id) }
          try await Task.sleep(for: .seconds(3600))
        }
        return .succeeded
      }
      let start = time.now
      let window = Task { try await run.run(until: time.date(start + 10_000)) }
      try await waitUntil { mine.withLock { $0.count } == 2 }
      let child = try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"])
      defer { if child.process.isRunning { child.kill() } }
      _ = try await child.waitForLine(startingWith: "ran ")
      time.advance(10_000)  // the deadline, while the other process runs
      let report = try await window.value
      #expect(report.end == .deadline)
      let hung = mine.withLock { $0 }
      #expect(Set(report.entries.filter { $0.outcome == .interrupted }.map(\.taskId)) == Set(hung))
      _ = try await child.waitForLine(startingWith: "done")
      #expect(try await child.wait() == 0)

      hang.store(false, ordering: .relaxed)
      let next = try await run.run(for: .seconds(60))
      #expect(next.end == .outOfWork)
      let ledger = try RunLedger(store.log, deadOwners: { _ in true })
      #expect(ledger.violations.isEmpty, "\(ledger.violations.prefix(3))")
      #expect(Set(ledger.tasks.values.flatMap(\.starts)).count == 2)  // both processes ran jobs
      let runs = try LoggedRuns.read(store.log)
      for id in jobs {
        let expected =
          hung.contains(id)
          ? LoggedRuns(starts: 2, succeeded: 1, interrupted: 1) : LoggedRuns(starts: 1, succeeded: 1)
        #expect(runs[id] == expected, "task \(id)")
      }
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  /// The deadline is decided inside the claim commands: a pass between two runs when it comes
  /// (here its handler moves the clock past it) claims nothing more, before any timer fires.
  @Test func nothingIsClaimedFromTheDeadlineOnEvenBetweenTwoRuns() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let first = try await queue.add(tag: "t", payload: ["n": 1])
      let second = try await queue.add(tag: "t", payload: ["n": 2])
      let start = time.now
      let run = runner(queue)
      run.register(tag: "t") { _ in
        time.advance(10_000)  // the deadline comes while this handler runs
        return .succeeded
      }
      let report = try await run.run(until: time.date(start + 10_000))
      #expect(report.end == .deadline)
      #expect(report.outcome(of: first) == .succeeded)  // a result in time is logged
      #expect(report.outcome(of: second) == nil)
      let runs = try LoggedRuns.read(store.log)
      #expect(runs[first] == LoggedRuns(starts: 1, succeeded: 1))
      #expect(runs[second] == nil)
      #expect(try queue.task(second)?.attempts == 0)

      // The commands alone, with no window's timer to cut the pass: a pass limited to a deadline
      // that comes during a run finishes that run and claims nothing after it.
      let third = try await queue.add(tag: "t", payload: ["n": 3])
      let control = PassControl()
      control.limit(until: time.now + 10_000)
      let limited = try await run.executePass(.all, control: control)
      #expect(limited.entries.count == 1)
      let claimed = try #require(limited.entries.first?.taskId)
      #expect([second, third].contains(claimed))
      #expect(try LoggedRuns.read(store.log)[claimed] == LoggedRuns(starts: 1, succeeded: 1))
      #expect(try queue.pendingTasks().count == 1)
      try expectConsistent(queue)
    }
  }

  /// `stop()` of a plain pass whose handler ignores its cancellation: the run is logged
  /// interrupted after the grace instead of holding the pass for ever; its late result is dropped.
  @Test func stopGivesAHandlerThatIgnoresCancellationTheGraceThenInterruptsIt() async throws {
    try await withStore { store, clock, _ in
      let time = WindowTime(clock: clock)
      let queue = store.queue
      let id = try await queue.add(tag: "t", payload: ["n": 1])
      let run = runner(queue) { $0.interruptionGrace = .seconds(2) }
      let started = Gate()
      let release = Gate()
      let journal = Journal()
      run.register(tag: "t") { task in
        guard task.attempt == 1 else { return .succeeded }
        started.open()
        await release.wait()  // not cancellable
        journal.note("ended")
        return .succeeded  // too late: dropped
      }
      let pass = Task { try await run.run() }
      await started.wait()
      run.stop()
      await time.waitForSleepers(1)  // the grace timer
      time.advance(2000)
      let report = try await pass.value
      #expect(report.outcome(of: id) == .interrupted)
      release.open()
      try await waitUntil { journal.all == ["ended"] }
      for _ in 0..<200 { await Task.yield() }
      #expect(try LoggedRuns.read(store.log)[id] == LoggedRuns(starts: 1, interrupted: 1))
      #expect(try queue.task(id)?.status == .ready)
      #expect(try await run.run().outcome(of: id) == .succeeded)
      try expectConsistent(queue)
    }
  }

  @Test func aWindowRefusesASingleTaskAndAnUnknownCollection() async throws {
    try await withStore { store, _, _ in
      let run = runner(store.queue)
      await #expect(throws: FerryError.self) { try await run.run(for: .seconds(1), .task(1)) }
      let unknown = await #expect(throws: FerryError.self) {
        try await run.run(for: .seconds(1), .collection("x"))
      }
      #expect(unknown.map { "\($0)" } == "\(FerryError.unknownCollection("x"))")
    }
  }
}
