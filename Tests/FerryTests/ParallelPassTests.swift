import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

// Twenty minutes: some tests here make thousands of durable commits, which a loaded disk can
// take minutes over; the limit is there to end a hang, not to time the work.

/// The runner's parallel pass: one coordinator, each runnable task once at every width,
/// stops, joins, a racing close and killed runner processes.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct ParallelPassTests {
  // MARK: The coordinator loop

  /// Passes: widths 1, 2, 8, 64, groups and ungrouped, handlers that throw, fail, record an error,
  /// sleep or return at once: one pass runs every runnable task exactly once, lists each once,
  /// never runs two tasks of a group at once nor a group's task after its failure, and leaves
  /// nothing that could run.
  @Test(arguments: [1, 2, 8, 64]) func parallelPassRunsEachRunnableTaskOnce(width: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var config = TaskRunner.Configuration()
    config.maxConcurrentTasks = width
    config.defaultRetry = RetryPolicy(maxAttempts: 5, initialDelay: .seconds(60))
    let runner = TaskRunner(queue: queue, configuration: config)
    struct Bad: Error {}
    let inGroup = Mutex<[String: Int]>([:])
    let overlap = Atomic<Int>(0)
    let order = Mutex<[TaskID]>([])
    let started = Mutex<[TaskID: Int]>([:])
    runner.register(tag: "t") { task in
      let n = try task.payload(as: [String: Int].self)["n"] ?? 0
      started.withLock { $0[task.id, default: 0] += 1 }
      order.withLock { $0.append(task.id) }
      if let g = task.groupId {
        if inGroup.withLock({ s in
          s[g, default: 0] += 1; return s[g]!
        }) > 1 {
          overlap.add(1, ordering: .relaxed)
        }
      }
      defer { if let g = task.groupId { inGroup.withLock { $0[g, default: 0] -= 1 } } }
      switch n % 9 {
      case 0: throw Bad()
      case 1: return .failed("nope")
      case 2: try? await Task.sleep(for: .microseconds(Int.random(in: 0...2000)))
      case 3: return .recordError("fix")
      case 4: usleep(UInt32.random(in: 0...300))  // blocks its thread
      default: break
      }
      return .succeeded
    }
    var ids: [TaskID] = []
    for n in 0..<400 {
      let group: String? = n % 2 == 0 ? "g\(n % 11)" : nil
      ids.append(try await queue.add(tag: "t", payload: ["n": n], groupId: group))
    }
    // No wall-clock give-up: a pass that never ends is caught by the suite's time limit.
    let r = try await runner.run()
    let listed = r.entries.map(\.taskId)
    #expect(
      Set(listed).count == listed.count,
      "a task listed twice: \(listed.count) entries, \(Set(listed).count) distinct")
    #expect(overlap.load(ordering: .relaxed) == 0, "two tasks of one group ran at once")
    #expect(started.withLock { $0.values.allSatisfy { $0 == 1 } }, "a task ran twice in one pass")
    let ranIds = Set(started.withLock { Array($0.keys) })
    let reportedRuns = Set(
      r.entries.filter { if case .skipped = $0.outcome { return false } else { return true } }.map(\.taskId))
    #expect(ranIds == reportedRuns, "ran \(ranIds.count), reported \(reportedRuns.count)")
    let stillRunnable = try queue.nextRunnable()
    #expect(stillRunnable == nil, "left runnable: \(String(describing: stillRunnable))")
    #expect(try queue.pendingTasks().filter { $0.status == .running }.isEmpty)
    // Each ungrouped task ran (nothing skipped it); every task of a group ran in order, up to its first failure.
    let byId = Dictionary(uniqueKeysWithValues: r.entries.map { ($0.taskId, $0.outcome) })
    for (index, id) in ids.enumerated() where index % 2 == 1 {
      #expect(byId[id] != nil, "ungrouped task \(id) not run")
    }
    var groups: [String: [TaskID]] = [:]
    for (index, id) in ids.enumerated() where index % 2 == 0 {
      groups["g\(index % 11)", default: []].append(id)
    }
    for (g, members) in groups {
      var expectRun = true
      for id in members {
        if expectRun {
          #expect(byId[id] != nil, "group \(g): task \(id) should have run")
          if byId[id] != .succeeded { expectRun = false }
        } else {
          let outcome = byId[id]
          #expect(
            outcome == nil || outcome == .skipped(.partOfFailedGroup),
            "group \(g): task \(id) ran after its group failed")
        }
      }
    }
  }

  /// Passes: stop() at random moments of parallel passes — while commands are in flight, while
  /// runs are being gathered, while an `isReadyToRun` check is asked — with handlers that ignore
  /// cancellation, honour it, throw, or return at once. After each stop nothing is left claimed,
  /// and in the end every task succeeded exactly once and every start ended.
  @Test(arguments: [1, 2, 8]) func stopAtEveryPointOfAParallelPass(width: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var config = TaskRunner.Configuration()
    config.maxConcurrentTasks = width
    config.defaultRetry = RetryPolicy(maxAttempts: 1000, initialDelay: .zero)
    let runner = TaskRunner(queue: queue, configuration: config)
    let succeeded = Mutex<[TaskID: Int]>([:])
    let handler: @Sendable (RunningTask) async throws -> TaskResult = { task in
      let n = try task.payload(as: [String: Int].self)["n"] ?? 0
      switch n % 4 {
      case 0: try await Task.sleep(for: .microseconds(Int.random(in: 0...800)))  // honours cancellation
      case 1: usleep(UInt32.random(in: 0...400))  // ignores it
      case 2: if Bool.random() && task.attempt == 1 { throw CancellationError() }  // its own: a failure
      default: break
      }
      succeeded.withLock { $0[task.id, default: 0] += 1 }
      return .succeeded
    }
    runner.register(tag: "t", handler: handler)
    runner.register(
      tag: "c",
      isReadyToRun: { _ in
        try? await Task.sleep(for: .microseconds(Int.random(in: 0...500)))
        return true
      }, handler: handler)
    var ids: [TaskID] = []
    for n in 0..<240 {
      ids.append(
        try await queue.add(
          tag: n % 3 == 0 ? "c" : "t", payload: ["n": n], groupId: n % 5 == 0 ? "g\(n % 3)" : nil))
    }
    var leftClaimed: [TaskID] = []
    for _ in 0..<40 {
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 0...4000)))
      runner.stop()
      _ = try? await pass.value
      leftClaimed += try queue.pendingTasks().filter { $0.status == .running }.map(\.id)
    }
    #expect(leftClaimed.isEmpty, "claims left after a stopped pass returned: \(leftClaimed)")
    var rounds = 0
    while try queue.nextRunnable() != nil, rounds < 50 {
      _ = try await runner.run()
      rounds += 1
    }
    let leftOver = try queue.pendingTasks().map { ($0.id, $0.status) }
    #expect(leftOver.isEmpty, "left: \(leftOver)")
    let timeline = try runTimeline(queue.log)
    for id in ids {
      let events = timeline[id] ?? []
      let starts = events.filter { $0.kind == "S" }.count
      let ends = events.filter { $0.kind != "S" }.count
      #expect(starts == ends, "task \(id): \(events.map(\.kind))")
    }
    #expect(succeeded.withLock { $0.values.allSatisfy { $0 == 1 } }, "a task's handler succeeded twice")
  }

  /// Passes: run() calls joining a parallel pass while it runs, each right after an add: every
  /// report holds its caller's task, and each task runs once.
  @Test(arguments: [2, 8]) func joinedRunsCoverTheirAdds(width: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var config = TaskRunner.Configuration()
    config.maxConcurrentTasks = width
    let runner = TaskRunner(queue: queue, configuration: config)
    let runs = Mutex<[TaskID: Int]>([:])
    runner.register(tag: "t") { task in
      runs.withLock { $0[task.id, default: 0] += 1 }
      try? await Task.sleep(for: .microseconds(Int.random(in: 0...1500)))
      return .succeeded
    }
    final class Missing: Sendable { let ids = Mutex<[TaskID]>([]) }
    let missing = Missing()
    try await withThrowingTaskGroup(of: Void.self) { group in
      for n in 0..<150 {
        group.addTask {
          let id = try await queue.add(tag: "t", payload: ["n": n], groupId: n % 4 == 0 ? "g\(n % 3)" : nil)
          let report = try await runner.run()
          // A grouped task may wait for its group's head (failed? no: all succeed) — it must be there too.
          if report.outcome(of: id) == nil { missing.ids.withLock { $0.append(id) } }
        }
        if n % 10 == 0 { try await Task.sleep(for: .microseconds(300)) }
      }
      try await group.waitForAll()
    }
    let missed = missing.ids.withLock { $0 }
    #expect(missed.isEmpty, "run() after add did not report the task: \(missed)")
    #expect(runs.withLock { $0.values.allSatisfy { $0 == 1 } && $0.count == 150 })
  }

  // MARK: close() racing a parallel pass

  /// Regression (was racy: hit in 1 of 2 full runs at 40 rounds; now 150): close() at random moments of a parallel pass (width 8): a handler of this queue must never run while
  /// the queue's liveness token is unlocked (another process, or a reopen, would take its run
  /// away and run the task a second time beside it).
  @Test func closeRacingAParallelPassNeverRunsAHandlerWithoutItsToken() async throws {
    var violations: [String] = []
    for round in 0..<150 {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let queue = try await TaskQueue.open(at: fixture.path)
      for n in 0..<60 { try await queue.add(tag: "t", payload: ["n": n]) }
      var config = TaskRunner.Configuration()
      config.maxConcurrentTasks = 8
      let runner = TaskRunner(queue: queue, configuration: config)
      let ownerId = Mutex<String?>(nil)
      let seen = Mutex<[String]>([])
      let closed = Atomic<Bool>(false)
      let path = fixture.path
      runner.register(tag: "t") { task in
        let id = ownerId.withLock { s -> String? in
          if s == nil { s = queue.ownerId }
          return s
        }
        if let id, RunOwner.liveness(of: id, storePath: path) == .dead {
          seen.withLock {
            $0.append(
              "round \(round): task \(task.id) started (closed: \(closed.load(ordering: .relaxed))) with its owner's token unlocked"
            )
          }
        }
        usleep(UInt32.random(in: 0...3000))
        return .succeeded
      }
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 500...6000)))
      queue.close()
      closed.store(true, ordering: .relaxed)
      _ = try? await pass.value
      violations += seen.withLock { $0 }
      if !violations.isEmpty { break }
    }
    // Regression (when it was hit): a claim commits, close() finds no handler running and releases the token,
    // then the lane's child task reaches runClaimed → handlerStarted and runs the handler unowned.
    #expect(violations.isEmpty, "\(violations)")
  }

  // MARK: Killing processes mid-way through parallel passes

  /// Three processes run parallel passes (width 8) over grouped and ungrouped jobs, some of which
  /// kill their process mid-run; one more is killed from outside at a random moment. Read from the
  /// log: a task is never started again while its claim is open unless interrupted first, an
  /// interrupted claim always belongs to a process that died, and every "ok" job succeeded once.
  @Test func killingParallelRunnersNeverDoubleRunsALiveRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var kinds: [TaskID: String] = [:]
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      for n in 0..<300 {
        let kind = n % 37 == 0 ? "crash" : (n % 23 == 0 ? "fail" : "ok")
        let id = try await queue.add(
          tag: "job", payload: ["kind": kind], groupId: n % 3 == 0 ? "g\(n % 5)" : nil)
        kinds[id] = kind
      }
      queue.close()
    }
    var children: [Child] = []
    for _ in 0..<3 { children.append(try Child("ferry-test-worker", ["run-tasks", fixture.path, "8"])) }
    let victim = try Child("ferry-test-worker", ["run-tasks", fixture.path, "8"])
    try await Task.sleep(for: .milliseconds(Int.random(in: 20...200)))
    victim.kill()
    var deadPids: Set<Int32> = [victim.pid]
    for child in children {
      let status = try await child.wait()
      if status != 0 { deadPids.insert(child.pid) }
    }
    _ = try await victim.wait()
    // Finish whatever the crashes left (their tasks were interrupted by the next look).
    for _ in 0..<6 {
      let last = try Child("ferry-test-worker", ["run-tasks", fixture.path, "8"])
      let status = try await last.wait()
      if status != 0 { deadPids.insert(last.pid) } else { break }
    }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let timeline = try runTimeline(queue.log)
    let deadOwners = Set(deadPids.map { String(UInt32($0), radix: 16) })
    var problems: [String] = []
    for (id, events) in timeline {
      var open: String?
      var successes = 0
      for e in events {
        switch e.kind {
        case "S":
          if let owner = open { problems.append("task \(id): started again while \(owner)'s claim was open") }
          open = e.owner
        case "I":
          if let owner = open, !deadOwners.contains(String(owner.split(separator: "-")[0])) {
            problems.append("task \(id): a live owner's claim (\(owner)) was interrupted")
          }
          open = nil
        default:
          if e.owner == "ok" { successes += 1 }
          open = nil
        }
      }
      if kinds[id] != "fail" && successes != 1 {
        problems.append("task \(id) (\(kinds[id] ?? "?")): \(successes) successes")
      }
    }
    #expect(problems.isEmpty, "\(problems.prefix(10))")
    #expect(try queue.nextRunnable() == nil)
    #expect(try queue.pendingTasks().filter { $0.status == .running }.isEmpty)
  }
}
