import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Things handlers remember, shared with the test.
final class Journal: Sendable {
  let entries = Mutex<[String]>([])
  func note(_ entry: String) { entries.withLock { $0.append(entry) } }
  var all: [String] { entries.withLock { $0 } }
}

/// A gate a handler waits at until the test opens it.
final class Gate: Sendable {
  private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
  func wait() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
      let now = state.withLock { s -> Bool in
        if s.open { return true }
        s.waiters.append(continuation)
        return false
      }
      if now { continuation.resume() }
    }
  }
  func open() {
    let waiters = state.withLock { s in
      s.open = true
      defer { s.waiters = [] }
      return s.waiters
    }
    for waiter in waiters { waiter.resume() }
  }
}

func runner(
  _ queue: TaskQueue, _ configure: (inout TaskRunner.Configuration) -> Void = { _ in }
) -> TaskRunner {
  var configuration = TaskRunner.Configuration()
  configuration.random = { 0.5 }  // no jitter: delays are exactly the schedule
  configure(&configuration)
  return TaskRunner(queue: queue, configuration: configuration)
}

// Twenty minutes: some tests here make 6,000–20,000 durable commits, which a loaded disk can
// take minutes over; the limit is there to end a hang, not to time the work.
@Suite(.timeLimit(.minutes(20))) struct TaskRunnerTests {
  @Test func aPassRunsTasksInTheOrderTheyWereAdded() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let journal = Journal()
    let run = runner(queue)
    run.register(tag: "t") { task in
      journal.note(try task.payload(as: Item.self).name)
      return .succeeded
    }
    for name in ["a", "b", "c"] { try await queue.add(tag: "t", payload: Item(name: name)) }
    let report = try await run.run()
    #expect(journal.all == ["a", "b", "c"])
    #expect(report.ran == 3 && report.succeeded == 3 && report.skipped == 0 && report.firstFailure == nil)
    #expect(try queue.pendingTasks().isEmpty)
    try expectConsistent(queue)
  }

  @Test func aFailureSkipsTheRestOfItsGroupAndBacksOff() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(
      tag: "t", retry: RetryPolicy(maxAttempts: 3, initialDelay: .seconds(1), multiplier: 2, jitter: 0.2)
    ) { task in
      try task.payload(as: Item.self).name == "bad" ? .failed("offline") : .succeeded
    }
    let bad = try await queue.add(tag: "t", payload: Item(name: "bad"), groupId: "g")
    let after = try await queue.add(tag: "t", payload: Item(name: "ok"), groupId: "g")
    let loose = try await queue.add(tag: "t", payload: Item(name: "ok"))

    var report = try await run.run()
    let start = fixture.time
    #expect(report.outcome(of: bad) == .failed("offline", retryAt: at(start + 1000)))
    // Behind a head that failed in the pass, the rest of the group waits: the report says so.
    #expect(report.outcome(of: after) == .skipped(.partOfFailedGroup))
    #expect(report.outcome(of: loose) == .succeeded)
    #expect(report.firstFailure?.taskId == bad)

    report = try await run.run()
    #expect(report.entries.isEmpty)  // nothing runnable: a waiting task costs a pass nothing
    #expect(
      try await run.run(.task(bad)).outcome(of: bad) == .skipped(.waitingForRetry(until: at(start + 1000))))
    #expect(try queue.task(after)?.status == .waitingForGroup(behind: bad))

    fixture.time = start + 1000
    report = try await run.run()
    #expect(report.outcome(of: bad) == .failed("offline", retryAt: at(start + 1000 + 2000)))
    fixture.time += 2000
    report = try await run.run()
    #expect(report.outcome(of: bad) == .failed("offline", retryAt: nil))  // third attempt of three
    #expect(try queue.task(bad)?.status == .dead)
    #expect(try queue.task(bad)?.attempts == 3)
    report = try await run.run()
    #expect(report.outcome(of: bad) == nil)
    #expect(try await run.run(.task(bad)).outcome(of: bad) == .skipped(.dead))
    let history = try queue.history(of: bad).map(\.event)
    #expect(
      history == [
        .added, .runStarted(attempt: 1), .runFailed(message: "offline", retryAt: at(start + 1000)),
        .runStarted(attempt: 2), .runFailed(message: "offline", retryAt: at(start + 3000)),
        .runStarted(attempt: 3), .runFailed(message: "offline", retryAt: nil),
      ])

    try await queue.cancel(bad)
    report = try await run.run()
    #expect(report.outcome(of: after) == .succeeded)
    try expectConsistent(queue)
  }

  @Test func theBackoffScheduleDoublesUpToItsCapWithJitterAround() {
    let policy = RetryPolicy(
      maxAttempts: 10, initialDelay: .seconds(1), multiplier: 2, maxDelay: .seconds(10), jitter: 0.2)
    #expect(
      (1...6).map { policy.delay(afterAttempt: $0, random: 0.5) }
        == [1000, 2000, 4000, 8000, 10_000, 10_000].map(Duration.milliseconds))
    #expect(policy.delay(afterAttempt: 1, random: 0) == .milliseconds(800))
    #expect(policy.delay(afterAttempt: 1, random: 1) == .milliseconds(1200))
  }

  @Test func aRecordedErrorBlocksUntilResolvedThenTheGroupRuns() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let journal = Journal()
    let needsLogin = Mutex(true)
    let run = runner(queue)
    run.register(tag: "t") { task in
      let name = try task.payload(as: Item.self).name
      if name == "first" && needsLogin.withLock({ $0 }) { return .recordError("Log in to upload") }
      journal.note(name)
      return .succeeded
    }
    let first = try await queue.add(tag: "t", payload: Item(name: "first"), groupId: "g")
    _ = try await queue.add(tag: "t", payload: Item(name: "second"), groupId: "g")
    var report = try await run.run()
    #expect(report.outcome(of: first) == .errorRecorded("Log in to upload"))
    #expect(try queue.latestError(first)?.message == "Log in to upload")
    report = try await run.run()
    #expect(report.entries.isEmpty)  // a blocked head and its group are not runnable: not touched
    #expect(try await run.run(.task(first)).outcome(of: first) == .skipped(.blockedByError))

    needsLogin.withLock { $0 = false }
    try await queue.resolveError(first)
    report = try await run.run()
    #expect(report.succeeded == 2)
    #expect(journal.all == ["first", "second"])
    try expectConsistent(queue)
  }

  @Test func manualTasksRunOnlyByIdAndOnlyTheHeadOfAGroupRunsAlone() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t") { _ in .succeeded }
    let manual = try await queue.add(tag: "t", payload: Item(name: "m"), options: [.manual])
    let head = try await queue.add(tag: "t", payload: Item(name: "h"), groupId: "g")
    let second = try await queue.add(tag: "t", payload: Item(name: "s"), groupId: "g")
    var report = try await run.run(.task(second))
    #expect(report.outcome(of: second) == .skipped(.notHeadOfGroup))
    report = try await run.run(.group("g"))
    #expect(report.succeeded == 2)
    #expect(report.outcome(of: manual) == nil)
    #expect(try queue.task(manual) != nil)
    report = try await run.run(.task(manual))
    #expect(report.outcome(of: manual) == .succeeded)
    _ = head
    await #expect(throws: FerryError.self) { try await run.run(.task(manual)) }
    await #expect(throws: FerryError.self) { try await run.run(.collection("nope")) }
    try expectConsistent(queue)
  }

  @Test func collectionsNotReadyChecksAndMissingHandlers() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue) { $0.collections = ["uploads": ["photo", "video"]] }
    run.register(tag: "photo") { _ in .succeeded }
    run.register(tag: "video", isReadyToRun: { _ in false }) { _ in .succeeded }
    let photo = try await queue.add(tag: "photo", payload: Item(name: "p"))
    let video = try await queue.add(tag: "video", payload: Item(name: "v"), groupId: "v")
    let afterVideo = try await queue.add(tag: "photo", payload: Item(name: "p2"), groupId: "v")
    let orphan = try await queue.add(tag: "nobody-handles-this", payload: Item(name: "o"))
    var report = try await run.run(.collection("uploads"))
    #expect(report.outcome(of: photo) == .succeeded)
    #expect(report.outcome(of: video) == .skipped(.notReady))
    #expect(report.outcome(of: afterVideo) == .skipped(.partOfFailedGroup))  // its head was skipped
    #expect(report.outcome(of: orphan) == nil)
    report = try await run.run()
    #expect(report.outcome(of: orphan) == .skipped(.noHandler))
    #expect(try queue.task(orphan)?.status == .ready)
    try expectConsistent(queue)
  }

  @Test func throwingHandlersAndPayloadsThatNoLongerDecodeFailClearly() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    struct Offline: Error {}
    let run = runner(queue)
    run.register(tag: "throws") { _ in throw Offline() }
    run.register(tag: "strict") { task in
      _ = try task.payload(as: [Int].self)  // the payload is an object, not an array
      return .succeeded
    }
    run.register(tag: "fatal") { _ in .failed("400 bad request", retryable: false) }
    let throwing = try await queue.add(tag: "throws", payload: Item(name: "x"))
    let strict = try await queue.add(tag: "strict", payload: Item(name: "x"))
    let fatal = try await queue.add(tag: "fatal", payload: Item(name: "x"))
    let report = try await run.run()
    guard case .failed(let message, let retryAt) = report.outcome(of: throwing) else {
      Issue.record("expected a failure")
      return
    }
    #expect(message.contains("Offline"))
    #expect(retryAt != nil)
    guard case .failed(let decodeMessage, nil) = report.outcome(of: strict) else {
      Issue.record("expected a final failure")
      return
    }
    #expect(decodeMessage.contains("does not decode"))
    #expect(try queue.task(strict)?.status == .dead)
    #expect(report.outcome(of: fatal) == .failed("400 bad request", retryAt: nil))
    try expectConsistent(queue)
  }

  @Test func cancelAndClearDuringARunLogTheResultAndTheTaskDoesNotComeBack() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "cancel-me") { task in
      try await queue.cancel(task.id)
      return .succeeded
    }
    run.register(tag: "clear-all") { _ in
      try await queue.clear()
      return .failed("too late")
    }
    let cancelled = try await queue.add(tag: "cancel-me", payload: Item(name: "a"))
    let clearing = try await queue.add(tag: "clear-all", payload: Item(name: "b"))
    let report = try await run.run()
    #expect(report.outcome(of: cancelled) == .succeeded)
    #expect(report.outcome(of: clearing) != nil)
    #expect(try queue.pendingTasks().isEmpty)
    var types: [String] = []
    try queue.log.forEachEvent { types.append($0.type) }
    #expect(types.contains("task.runSucceeded") && types.contains("task.runFailed"))
    try expectConsistent(queue)
  }

  @Test func aSecondPassAskedForDuringAPassSharesItsReport() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let gate = Gate()
    let calls = Mutex(0)
    let run = runner(queue)
    run.register(tag: "t") { _ in
      calls.withLock { $0 += 1 }
      await gate.wait()
      return .succeeded
    }
    try await queue.add(tag: "t", payload: Item(name: "a"))
    try await queue.add(tag: "t", payload: Item(name: "b"))
    async let first = run.run()
    while calls.withLock({ $0 }) == 0 { await Task.yield() }
    async let second = run.run()
    try await Task.sleep(for: .milliseconds(20))
    gate.open()
    let (a, b) = try await (first, second)
    #expect(a == b)
    #expect(a.succeeded == 2)
    #expect(calls.withLock { $0 } == 2)
  }

  @Test func groupsRunInParallelButNeverTwoOfOneGroup() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    struct Step: Codable, Sendable { var group: Int, step: Int }
    let live = Mutex<(total: Int, peak: Int, perGroup: [Int: Int], order: [Int: [Int]], violations: Int)>(
      (0, 0, [:], [:], 0))
    let run = runner(queue) { $0.maxConcurrentTasks = 8 }
    run.register(tag: "step") { task in
      let step = try task.payload(as: Step.self)
      live.withLock { s in
        s.total += 1
        s.peak = max(s.peak, s.total)
        s.perGroup[step.group, default: 0] += 1
        if s.perGroup[step.group, default: 0] > 1 { s.violations += 1 }
        s.order[step.group, default: []].append(step.step)
      }
      try await Task.sleep(for: .milliseconds(2))
      live.withLock { s in
        s.total -= 1
        s.perGroup[step.group, default: 0] -= 1
      }
      return .succeeded
    }
    for step in 0..<5 {
      for group in 0..<8 {
        try await queue.add(tag: "step", payload: Step(group: group, step: step), groupId: "g\(group)")
      }
    }
    let report = try await run.run()
    #expect(report.succeeded == 40)
    #expect(report.entries.map(\.taskId) == report.entries.map(\.taskId).sorted())
    let result = live.withLock { $0 }
    #expect(result.violations == 0)
    #expect(result.peak > 1)
    #expect(result.order.values.allSatisfy { $0 == [0, 1, 2, 3, 4] })
    try expectConsistent(queue)
  }

  @Test func manyConcurrentAddsGetDistinctIds() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let ids = try await withThrowingTaskGroup(of: TaskID.self) { group in
      for i in 0..<200 {
        group.addTask { try await queue.add(tag: "t", payload: Item(name: "\(i)"), groupId: "g\(i % 7)") }
      }
      var ids = Set<TaskID>()
      for try await id in group { ids.insert(id) }
      return ids
    }
    #expect(ids.count == 200)
    #expect(try queue.pendingTasks().count == 200)
    try expectConsistent(queue)
  }

  @Test func observersSeeEachStepAndAPerTaskStreamStartsWithTheStatus() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t") { _ in .succeeded }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    let updates = try queue.updates(for: id)
    _ = try await run.run()
    var seen: [TaskUpdate] = []
    for await update in updates {
      seen.append(update)
      if case .succeeded = update { break }
    }
    #expect(seen == [.current(id, .ready), .running(id, attempt: 1), .succeeded(id)])
  }

  @Test func automaticRunningRunsWhatIsAddedUnlessPaused() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t") { _ in .succeeded }
    let updates = queue.updates()
    run.startAutomaticRunning()
    defer { run.stop() }
    let first = try await queue.add(tag: "t", payload: Item(name: "a"))
    for await update in updates where update == .succeeded(first) { break }

    try await queue.pause()
    let held = try await queue.add(tag: "t", payload: Item(name: "b"))
    try await Task.sleep(for: .milliseconds(100))
    #expect(try queue.task(held)?.status == .ready)
    try await queue.resume()
    for await update in updates where update == .succeeded(held) { break }
    #expect(try queue.pendingTasks().isEmpty)
  }

  /// Regression: pause() while automatic running's pass is under way. The pass claimed a task
  /// added after the pause together with the finish of the run it was waiting for (one commit),
  /// so "no automatic run starts while paused" did not hold. Its claim commands now read the
  /// pause flag: the run under way finishes, nothing more starts (read from the log).
  @Test func aPauseStopsTheAutomaticPassUnderWayFromClaimingMore() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let release = Gate()
      let started = Journal()
      let run = runner(queue)
      run.register(tag: "slow") { task in
        started.note("\(task.id)")
        await release.wait()
        return .succeeded
      }
      run.register(tag: "t") { _ in .succeeded }
      let updates = queue.updates()
      run.startAutomaticRunning()
      defer { run.stop() }
      let slow = try await queue.add(tag: "slow", payload: ["n": 1])
      try await waitUntil { started.all.contains("\(slow)") }
      try await queue.pause()
      let held = try await queue.add(tag: "t", payload: ["n": 2])
      release.open()
      for await update in updates where update == .succeeded(slow) { break }
      try await Task.sleep(for: .milliseconds(50))
      #expect(try queue.task(held)?.status == .ready)
      let startedHeld = try store.log.forEachTaskEvent().contains {
        if case .runStarted(let id, _, _, _, _) = $0.1 { return id == held }
        return false
      }
      #expect(!startedHeld, "a task added after pause() was started by the automatic pass")
      // A run() asked for while paused is the app's own request: it runs.
      #expect(try await run.run().outcome(of: held) == .succeeded)
    }
  }

  @Test func stoppingAHandlerThatHangsInterruptsItsRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let started = Gate()
    let run = runner(queue)
    run.register(tag: "hang") { _ in
      started.open()
      try await Task.sleep(for: .seconds(3600))
      return .succeeded
    }
    let id = try await queue.add(tag: "hang", payload: Item(name: "x"))
    async let report = run.run()
    await started.wait()
    run.stop()
    let stopped = try await report
    #expect(stopped.outcome(of: id) == .interrupted)
    #expect(stopped.interrupted == 1)
    #expect(try queue.task(id)?.status == .ready)
    #expect(try queue.task(id)?.attempts == 1)
    try expectConsistent(queue)
  }

  @Test func aRunCutShortByAKilledProcessIsInterruptedAtOpen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let process = Process()
    process.executableURL = productURL("ferry-test-worker")
    process.arguments = ["run-and-hang", fixture.path]
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    // Read until the handler says it runs, then kill the process mid-run.
    var output = ""
    let deadline = ContinuousClock.now + .seconds(60)
    while !output.contains("running") && ContinuousClock.now < deadline {
      let data = pipe.fileHandleForReading.availableData
      if data.isEmpty { break }
      output += String(decoding: data, as: UTF8.self)
    }
    kill(process.processIdentifier, SIGKILL)
    process.waitUntilExit()
    let id = try #require(
      output.split(separator: " ").last.flatMap { TaskID($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    )

    let queue = try await fixture.open()
    defer { queue.close() }
    #expect(queue.interruptedAtOpen == [id])
    #expect(try queue.task(id)?.status == .ready)
    #expect(try queue.task(id)?.attempts == 1)
    let run = runner(queue)
    run.register(tag: "hang") { task in task.attempt == 2 ? .succeeded : .failed("wrong attempt") }
    #expect(try await run.run().outcome(of: id) == .succeeded)
    try expectConsistent(queue)
  }

  /// Regression: a command that ended several runs tried one group's successor per claim and
  /// stopped at the first empty search, so a group whose head the cursor had passed was left
  /// behind for the rest of the pass (about one pass in three left a whole group's tail).
  @Test func aParallelPassRunsEveryGroupToItsEnd() async throws {
    for round in 0..<4 {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let queue = try await fixture.open()
      defer { queue.close() }
      for i in 0..<800 { try await queue.add(tag: "t", payload: ["i": i], groupId: "g\(i % 8)") }
      let run = runner(queue) { $0.maxConcurrentTasks = 8 }
      run.register(tag: "t") { _ in .succeeded }
      let before = queue.log.statistics.commits
      let report = try await run.run()
      #expect(report.succeeded == 800, "round \(round)")
      #expect(try queue.pendingTasks().isEmpty, "round \(round)")
      // Lanes share commits: far fewer commits than runs (two events each).
      let commits = queue.log.statistics.commits - before
      #expect(commits < 400, "round \(round): \(commits) commits for 800 runs")
    }
  }
}
