import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

// Hostile-review attacks on "a task that did not crash runs once, and a live run is never taken
// away from its runner" and "never a crash/hang/ok over missing data". Real processes and files.
// A test marked "Regression:" reproduced a finding of the review and failed on the code as reviewed.

/// Runs `body`, giving up after `seconds`: nil when it did not finish in time (it is cancelled).
func attackWithin<T: Sendable>(
  _ seconds: Double, _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
  try await withThrowingTaskGroup(of: T?.self) { group in
    group.addTask { try await body() }
    group.addTask {
      try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
      return nil
    }
    let first = try await group.next() ?? nil
    group.cancelAll()
    return first
  }
}

/// The runs of each task as the log tells them: (starts, successes, finishes, interruptions).
func attackRuns(_ log: EventLog) throws -> [TaskID: (starts: Int, successes: Int, finishes: Int, interruptions: Int)] {
  var runs: [TaskID: (starts: Int, successes: Int, finishes: Int, interruptions: Int)] = [:]
  try log.forEachEvent { event in
    guard TaskEvent.typeSet.contains(event.type) else { return }
    switch try TaskEvent(event) {
    case .runStarted(let id, _, _, _, _): runs[id, default: (0, 0, 0, 0)].starts += 1
    case .runSucceeded(let id, _):
      runs[id, default: (0, 0, 0, 0)].successes += 1
      runs[id, default: (0, 0, 0, 0)].finishes += 1
    case .runFailed(let id, _, _, _), .errorRecorded(let id, _, true): runs[id, default: (0, 0, 0, 0)].finishes += 1
    case .runInterrupted(let id): runs[id, default: (0, 0, 0, 0)].interruptions += 1
    default: break
    }
  }
  return runs
}

// Twenty minutes: some tests here make 6,000–20,000 durable commits, which a loaded disk can
// take minutes over; the limit is there to end a hang, not to time the work.
@Suite(.timeLimit(.minutes(20)), .serialized) struct AttackTests {
  // MARK: Closing the queue while a handler runs

  /// Regression: close() while a handler runs, then reopen in the same process: the reopened queue
  /// interrupts the run (the token was left unlocked on purpose) and runs the task again while the
  /// first handler — which did not crash — is still running. Two concurrent runs of one task in
  /// one process, no crash anywhere.
  @Test func closeWhileAHandlerRunsThenReopenRunsTheTaskAgainBesideTheLiveRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let started = Gate()
    let release = Gate()
    let live = Atomic<Int>(0)
    let maxLive = Atomic<Int>(0)
    let handler: @Sendable (RunningTask) async throws -> TaskResult = { _ in
      let now = live.add(1, ordering: .relaxed).newValue
      _ = maxLive.max(now, ordering: .relaxed)
      started.open()
      await release.wait()
      live.subtract(1, ordering: .relaxed)
      return .succeeded
    }
    let first = try await TaskQueue.open(at: fixture.path)
    let firstRunner = TaskRunner(queue: first)
    firstRunner.register(tag: "slow", handler: handler)
    let id = try await first.add(tag: "slow", payload: ["n": 1])
    let pass = Task { try await firstRunner.run() }
    await started.wait()
    first.close()  // e.g. the app's scene went to the background and the store was closed

    let second = try await TaskQueue.open(at: fixture.path)
    defer { second.close() }
    let secondRunner = TaskRunner(queue: second)
    secondRunner.register(tag: "slow", handler: handler)
    let again = Task { try await secondRunner.run(.task(id)) }
    try await Task.sleep(for: .milliseconds(300))
    release.open()
    _ = try? await pass.value
    _ = try? await again.value
    #expect(second.interruptedAtOpen.isEmpty, "the live run was interrupted at reopen")
    #expect(maxLive.load(ordering: .relaxed) == 1, "two handlers of task \(id) ran at once")
  }

  /// Regression (was racy, usually within a few rounds): close() decides whether to keep the token from the
  /// claims committed so far, then log.close() lets a claim already queued in the writer commit.
  /// That claim names an owner whose token file was just removed and whose pid (this process) is
  /// alive: nobody will ever interrupt it while this process lives, and `run(.task(id))` on it waits
  /// forever.
  @Test func closeRacingAClaimLeavesARunNobodyInterrupts() async throws {
    var stuck: [(Int, TaskID)] = []
    for round in 0..<40 {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let queue = try await TaskQueue.open(at: fixture.path)
      for n in 0..<30 { try await queue.add(tag: "t", payload: ["n": n]) }
      let runner = TaskRunner(queue: queue)
      // A check before each claim: the claim is a command of its own, after a commit with no claim.
      runner.register(tag: "t", isReadyToRun: { _ in true }) { _ in .succeeded }
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 0...4000)))
      queue.close()
      _ = try? await pass.value
      let reopened = try await TaskQueue.open(at: fixture.path)
      defer { reopened.close() }
      _ = try await reopened.interruptRunsOfDeadOwners()
      let running = try reopened.pendingTasks().filter { $0.status == .running }
      if let task = running.first {
        stuck.append((round, task.id))
        // And a run of it by id never ends.
        let other = TaskRunner(queue: reopened)
        other.register(tag: "t") { _ in .succeeded }
        let outcome = try await attackWithin(2) { try await other.run(.task(task.id)) }
        #expect(outcome != nil, "run(.task(\(task.id))) still waiting after 2 s")
        break
      }
    }
    #expect(stuck.isEmpty, "runs left claimed by a closed queue, never interrupted: \(stuck)")
  }

  // MARK: Tokens that are missing for other reasons

  /// Regression: a store copied by `ferry export | ferry import` while a task runs elsewhere. In the new
  /// store the run's owner has no token, and the owner's pid is alive (it is running a task of the
  /// *original* store): the copy's task is "running" for as long as that unrelated process lives,
  /// and `run(.task(id))` on the copy waits for it. The pid fallback cannot tell "the owner of this
  /// store's run" from "some process with that number" (same for a reused pid, pid 1 in a container,
  /// another pid namespace).
  @Test func anImportedStoreWithARunUnderWayElsewhereIsStuckWhileThatPidLives() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let copy = QueueFixture()
    defer { copy.remove() }
    let hanging = try Child("ferry-test-worker", ["run-and-hang", fixture.path])
    defer { hanging.kill() }
    let line = try await hanging.waitForLine(startingWith: "running ")
    let id = try #require(UInt64(line.dropFirst("running ".count)))
    let exportPath = fixture.path + ".jsonl"
    defer { try? FileManager.default.removeItem(atPath: exportPath) }
    _ = FileManager.default.createFile(atPath: exportPath, contents: nil)
    let export = Process()
    export.executableURL = productURL("ferry")
    export.arguments = ["export", fixture.path]
    export.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: exportPath))
    try export.run()
    export.waitUntilExit()
    #expect(export.terminationStatus == 0)
    let importing = try Child("ferry", ["import", copy.path], stdin: FileHandle(forReadingAtPath: exportPath))
    #expect(try await importing.wait() == 0)

    // The import interrupted it: no process owns runs in a store that did not exist a moment ago.
    #expect(importing.output.contains { $0.hasPrefix("interrupted 1 run that was under way") }, "\(importing.output)")
    let queue = try await TaskQueue.open(at: copy.path)
    defer { queue.close() }
    #expect(try queue.task(id)?.status == .ready)
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "hang") { _ in .succeeded }
    // No wall-clock give-up: a run that keeps waiting is caught by the suite's time limit.
    let outcome = try await runner.run(.task(id))
    #expect(outcome.outcome(of: id) == .succeeded, "run(.task) on the copy: \(outcome)")
  }

  // MARK: Waiting for another runner's run

  /// Regression: run(.task(id)) waits for another process's run of the task; the task is cancelled, then
  /// the owner dies. Cancelling removed the claim from `running`, so no dead-owner check ever logs
  /// an interruption, and no outcome ever comes: the waiter hangs forever.
  @Test func runTaskHangsWhenTheTaskIsCancelledAndItsOwnerThenDies() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let hanging = try Child("ferry-test-worker", ["run-and-hang", fixture.path])
    defer { hanging.kill() }
    let line = try await hanging.waitForLine(startingWith: "running ")
    let id = try #require(UInt64(line.dropFirst("running ".count)))
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "hang") { _ in .succeeded }
    let finished = Atomic<Bool>(false)
    let waiting = Task {
      defer { finished.store(true, ordering: .relaxed) }
      return try await runner.run(.task(id))
    }
    defer { waiting.cancel() }
    try await Task.sleep(for: .milliseconds(200))
    try await queue.cancel(id)
    hanging.kill()
    // A run that keeps waiting is caught by the suite's time limit, not by a wall-clock wait a
    // loaded machine can reach.
    while !finished.load(ordering: .relaxed) {
      try await Task.sleep(for: .milliseconds(20))
    }
  }

  /// Regression: run(.task(id)) in process W waits for process G's run. W is paused (SIGSTOP); G's run
  /// succeeds; `ferry compact --retention 0` removes the finished task's events (outcome included);
  /// W resumes and never finds an outcome: it waits forever (it only reads events after its head,
  /// never whether the claim it waits for still exists).
  @Test func runTaskHangsWhenCompactionRemovesTheOutcomeItWaitsFor() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let gate = fixture.path + ".gate"
    defer { try? FileManager.default.removeItem(atPath: gate) }
    let owner = try Child("ferry-test-worker", ["attack-run-gated", fixture.path, gate])
    defer { owner.kill() }
    let line = try await owner.waitForLine(startingWith: "running ")
    let id = try #require(line.split(separator: " ").dropFirst().first.flatMap { UInt64($0) })
    let waiter = try Child("ferry-test-worker", ["attack-run-one", fixture.path, "\(id)"])
    defer { waiter.kill() }
    _ = try await waiter.waitForLine(startingWith: "waiting")
    try await Task.sleep(for: .milliseconds(500))  // in its wait loop
    kill(waiter.pid, SIGSTOP)
    _ = FileManager.default.createFile(atPath: gate, contents: nil)
    _ = try await owner.waitForLine(startingWith: "done ")
    try await Task.sleep(for: .milliseconds(20))
    let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0"])
    #expect(try await compact.wait() == 0)
    kill(waiter.pid, SIGCONT)
    // A waiter that keeps waiting is caught by the suite's time limit; one that ends without an
    // outcome fails here.
    let outcome = try? await waiter.waitForLine(startingWith: "outcome ")
    #expect(outcome != nil, "run(.task(\(id))) in the waiter ended without an outcome: \(waiter.output)")
  }

  // MARK: A paused (SIGSTOP) owner

  /// Passes: a SIGSTOPped owner keeps its flock, so its run is neither interrupted at open, by the
  /// periodic check of automatic running, nor by run(.task(id)) (which waits).
  @Test func aStoppedOwnerKeepsItsRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let hanging = try Child("ferry-test-worker", ["run-and-hang", fixture.path])
    defer {
      kill(hanging.pid, SIGCONT)
      hanging.kill()
    }
    let line = try await hanging.waitForLine(startingWith: "running ")
    let id = try #require(UInt64(line.dropFirst("running ".count)))
    kill(hanging.pid, SIGSTOP)
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    #expect(queue.interruptedAtOpen.isEmpty)
    var configuration = TaskRunner.Configuration()
    configuration.deadOwnerCheckInterval = .milliseconds(20)
    let runner = TaskRunner(queue: queue, configuration: configuration)
    let ran = Atomic<Int>(0)
    runner.register(tag: "hang") { _ in
      ran.add(1, ordering: .relaxed)
      return .succeeded
    }
    runner.startAutomaticRunning()
    let single = try await attackWithin(1.5) { try await runner.run(.task(id)) }
    runner.stop()
    #expect(single == nil, "run(.task) should still be waiting for the paused owner")
    #expect(ran.load(ordering: .relaxed) == 0)
    #expect(try queue.task(id)?.status == .running)
    #expect(try !queue.log.events(after: 0, limit: 100).map(\.type).contains("task.runInterrupted"))
  }

  /// Passes: three runner processes on one store, one of them SIGSTOPped for a while mid-way: each
  /// task runs once, nobody's run is interrupted.
  @Test func threeRunnerProcessesOneOfThemPausedRunEachTaskOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      defer { queue.close() }
      for n in 0..<600 {
        ids.append(try await queue.add(tag: "job", payload: ["kind": "ok", "n": "\(n)"], groupId: n % 4 == 0 ? "g\(n % 20)" : nil))
      }
    }
    let children = [
      try Child("ferry-test-worker", ["run-tasks", fixture.path]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "3"]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"]),
    ]
    _ = try await children[1].waitForLine(startingWith: "ran ")
    kill(children[1].pid, SIGSTOP)
    try await Task.sleep(for: .milliseconds(1500))
    kill(children[1].pid, SIGCONT)
    for child in children { #expect(try await child.wait() == 0) }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runs = try attackRuns(queue.log)
    for id in ids {
      let r = runs[id]
      #expect(r?.starts == 1 && r?.successes == 1 && r?.interruptions == 0, "task \(id): \(String(describing: r))")
    }
  }

  // MARK: The app acting on a task while it runs

  /// Regression: recordError then resolveError while a run is under way; the run then fails for good
  /// (`retryable: false`). The task should be dead; it is ready again (the failure only counts
  /// when the status is `running`, and resolve made it `ready` while the claim stood), so it runs
  /// a second time. The same happens to a retryable failure: its backoff is skipped.
  @Test func resolveDuringARunTurnsAFailureForGoodIntoAnotherRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runner = TaskRunner(queue: queue)
    let started = Gate()
    let release = Gate()
    let calls = Atomic<Int>(0)
    runner.register(tag: "t") { _ in
      calls.add(1, ordering: .relaxed)
      started.open()
      await release.wait()
      return .failed("the server refused it", retryable: false)
    }
    let id = try await queue.add(tag: "t", payload: ["n": 1])
    let pass = Task { try await runner.run() }
    await started.wait()
    try await queue.recordError(id, message: "user must check")
    try await queue.resolveError(id)
    release.open()
    _ = try await pass.value
    let status = try queue.task(id)?.status
    #expect(status == .dead, "status: \(String(describing: status))")
    _ = try await runner.run()
    #expect(calls.load(ordering: .relaxed) == 1, "a task that failed for good ran again")
  }

  /// Passes: stop() at random moments of a pass (mid-claim included), then passes until done:
  /// every task succeeds exactly once, and every run started ended.
  @Test func stopAtRandomMomentsNeverRunsATaskTwice() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    var ids: [TaskID] = []
    for n in 0..<200 { ids.append(try await queue.add(tag: "t", payload: ["n": n], groupId: n % 3 == 0 ? "g" : nil)) }
    var configuration = TaskRunner.Configuration()
    configuration.maxConcurrentTasks = 3
    let runner = TaskRunner(queue: queue, configuration: configuration)
    runner.register(tag: "t") { _ in
      if Bool.random() { try await Task.sleep(for: .microseconds(300)) }
      return .succeeded
    }
    for _ in 0..<30 {
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 0...3000)))
      runner.stop()
      _ = try? await pass.value
    }
    while try queue.nextRunnable() != nil { _ = try await runner.run() }
    let runs = try attackRuns(queue.log)
    for id in ids {
      let r = runs[id]
      #expect(r?.successes == 1 && r.map { $0.starts == $0.finishes + $0.interruptions } == true, "task \(id): \(String(describing: r))")
    }
    #expect(try queue.pendingTasks().isEmpty)
  }

  /// Passes: unique replace and keep racing two runners' claims: a running task is never replaced,
  /// no task is claimed twice at once, and every start ends.
  @Test func uniqueReplaceAndKeepRacingClaims() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runners = [TaskRunner(queue: queue), TaskRunner(queue: queue)]
    let running = Mutex<Set<TaskID>>([])
    let overlap = Atomic<Int>(0)
    for runner in runners {
      runner.register(tag: "save") { task in
        if !running.withLock({ $0.insert(task.id).inserted }) { overlap.add(1, ordering: .relaxed) }
        try? await Task.sleep(for: .microseconds(200))
        running.withLock { _ = $0.remove(task.id) }
        return .succeeded
      }
      runner.startAutomaticRunning()
    }
    for n in 0..<300 {
      try await queue.add(tag: "save", payload: ["v": n], dataId: "note-\(n % 3)", unique: n % 2 == 0 ? .replace : .keep)
    }
    while try !queue.pendingTasks().isEmpty { try await Task.sleep(for: .milliseconds(20)) }
    for runner in runners { runner.stop() }
    #expect(overlap.load(ordering: .relaxed) == 0)
    let runs = try attackRuns(queue.log)
    for (id, r) in runs {
      #expect(r.successes <= 1 && r.starts == r.finishes + r.interruptions, "task \(id): \(r)")
    }
    #expect(try queue.pendingTasks().isEmpty)
  }

  // MARK: The owners directory and descriptors

  /// Passes (checks for crash/hang): `owners` is a file; a pass says why it cannot run (an error),
  /// neither crashes nor hangs nor reports success.
  @Test func ownersIsAFile() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    _ = FileManager.default.createFile(atPath: fixture.path + "/owners", contents: Data("x".utf8))
    let id = try await queue.add(tag: "t", payload: ["n": 1])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t") { _ in .succeeded }
    await #expect(throws: (any Error).self) { try await runner.run() }
    await #expect(throws: (any Error).self) { try await runner.run(.task(id)) }
    #expect(try queue.task(id)?.status == .ready)
  }

  /// Passes: garbage in `owners/` (a directory, a FIFO and a symlink to a FIFO under owner-like
  /// names, a stale staging file, junk names) neither blocks nor crashes open, sweep or a pass.
  @Test func garbageInOwnersIsHarmless() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      try await queue.add(tag: "t", payload: ["n": 1])
      queue.close()
    }
    let owners = fixture.path + "/owners"
    try? FileManager.default.createDirectory(atPath: owners, withIntermediateDirectories: true)
    try FileManager.default.createDirectory(atPath: owners + "/abc-0000000000000001", withIntermediateDirectories: true)
    #expect(mkfifo(owners + "/abd-0000000000000002", 0o600) == 0)
    #expect(mkfifo(fixture.path + ".fifo", 0o600) == 0)
    defer { unlink(fixture.path + ".fifo") }
    #expect(symlink(fixture.path + ".fifo", owners + "/abe-0000000000000003") == 0)
    _ = FileManager.default.createFile(atPath: owners + "/.abf-0000000000000004.new", contents: nil)
    _ = FileManager.default.createFile(atPath: owners + "/not an owner", contents: nil)
    // No wall-clock give-up: a pass that hangs is caught by the suite's time limit.
    let result: RunReport
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      defer { queue.close() }
      let runner = TaskRunner(queue: queue)
      runner.register(tag: "t") { _ in .succeeded }
      result = try await runner.run()
    }
    #expect(result.entries.count == 1)
  }

  /// Passes: every descriptor in use while a pass starts: the pass fails with an error (no crash,
  /// no claim left behind), and succeeds once descriptors are back.
  @Test func noFileDescriptorsLeft() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let child = try Child("ferry-test-worker", ["attack-run-without-fds", fixture.path])
    let status = try await child.wait()
    #expect(status == 0, "\(child.output)")
    #expect(child.output.contains { $0.hasPrefix("first error") }, "\(child.output)")
    #expect(child.output.contains("second Optional(succeeded)"), "\(child.output)")
  }

  // MARK: Cost of a pass

  /// Measures: tasks of a tag this runner has no handler for (another process's tags, say) are
  /// walked and reported by every pass — a pass over 20,000 of them and 1 runnable task reads all
  /// 20,001; with automatic running that happens after every add.
  @Test func aPassWalksEveryTaskItHasNoHandlerFor() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let batch = (0..<20_000).map { n in
      TaskEvent.added(tag: "other", payload: Array("{\"n\":\(n)}".utf8), dataId: nil, groupId: nil, manual: false, unique: .append).newEvent
    }
    let batchFirst = try #require(try await queue.log.append(batch).first)
    let runnable = try await queue.add(tag: "t", payload: ["n": 1])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t") { _ in .succeeded }
    let start = ContinuousClock.now
    let report = try await runner.run()
    let elapsed = ContinuousClock.now - start
    #expect(report.outcome(of: runnable) == .succeeded)
    print("AttackTests: a pass with 20,000 handler-less tasks reported \(report.entries.count) entries in \(elapsed)")
    #expect(report.outcome(of: batchFirst) == .skipped(.noHandler))
    let again = ContinuousClock.now
    let second = try await runner.run()
    print("AttackTests: the next pass (nothing to run) took \(ContinuousClock.now - again)")
    // Reported once, then passed over by their index key alone until a handler is registered.
    #expect(second.entries.isEmpty)
    runner.register(tag: "other") { _ in .succeeded }
    #expect(try await runner.run().succeeded == 20_000)
  }
}

extension AttackTests {
  /// Regression (the window was closed by holding LMDB's exclusive lock from the last check to the
  /// rename, and comparing the file's state across the close): looks for acknowledged writes lost to `ferry compact --copy`: it checks that nobody else has
  /// the store open, copies, checks again, fsyncs the copy and renames it over `data.mdb`. A process
  /// that opens the store between the second check and the rename writes into the old file, which
  /// the rename then discards (its claims, its adds, its outcomes). Adders race compactions; every
  /// add a child acknowledged must be in the store at the end.
  @Test func compactCopyRacingProcessesThatOpenTheStore() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      for n in 0..<2000 { try await queue.add(tag: "bulk", payload: ["n": n]) }  // a file worth fsyncing
      queue.close()
    }
    var acked = 0
    var compactions = 0
    let deadline = ContinuousClock.now + .seconds(8)
    while ContinuousClock.now < deadline {
      let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0", "--copy"])
      try await Task.sleep(for: .microseconds(Int.random(in: 0...20_000)))
      let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "2"])
      if try await compact.wait() == 0 { compactions += 1 }
      _ = try await adder.wait()
      acked += adder.output.filter { $0.hasPrefix("ack ") }.count
    }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let apps = try queue.pendingTasks(tag: "app").count
    print("AttackTests: \(compactions) compactions swapped in, \(acked) adds acknowledged, \(apps) in the store")
    #expect(apps == acked, "acknowledged adds lost")
  }
}
