import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

// Second hostile review: the one-coordinator parallel pass, the runner's memory of unhandled
// tasks, empty commands, `compact --copy`'s lock, close() with handlers running, import.
// Real processes and files, no mocks. A test marked "Regression:" reproduced a finding of the second review and failed before its fix.

/// Per task, in log order: "S" start (owner), "F" finish, "I" interrupt.
func attack2Timeline(_ log: EventLog) throws -> [TaskID: [(kind: Character, owner: String)]] {
  var timeline: [TaskID: [(kind: Character, owner: String)]] = [:]
  try log.forEachEvent { event in
    guard TaskEvent.typeSet.contains(event.type) else { return }
    switch try TaskEvent(event) {
    case .runStarted(let id, _, let owner, _, _): timeline[id, default: []].append(("S", owner))
    case .runSucceeded(let id, _): timeline[id, default: []].append(("F", "ok"))
    case .runFailed(let id, _, _, _), .errorRecorded(let id, _, true): timeline[id, default: []].append(("F", ""))
    case .runInterrupted(let id): timeline[id, default: []].append(("I", ""))
    default: break
    }
  }
  return timeline
}

// Twenty minutes: some tests here make 6,000–20,000 durable commits, which a loaded disk can
// take minutes over; the limit is there to end a hang, not to time the work.
@Suite(.timeLimit(.minutes(20)), .serialized) struct AttackTests2 {
  // MARK: (2) The memory of unhandled tasks

  /// Regression: register() while a claim command of a pass is in flight. The command was built with
  /// the handler set from before register() (the pass's `handlerInfo` snapshot), so it skips the
  /// tag's tasks as `noHandler`; the pass then inserts them into `UnhandledTasks` *after*
  /// register() called `forget()`. From then on every pass passes them over silently (not even
  /// reported), and automatic running never runs them: tasks with a registered handler are
  /// skipped forever, until some unrelated register() happens.
  @Test func registerDuringAPassLeavesTasksSkippedForever() async throws {
    var leftBehind: [(round: Int, count: Int)] = []
    for round in 0..<3 {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let queue = try await fixture.open()
      defer { queue.close() }
      // Many tasks of a tag nobody handles yet: each claim command reads 512 of them (long enough
      // for a register() to land while one is in the writer).
      let events = (0..<6000).map { n in
        TaskEvent.added(
          tag: "x", payload: Array("{\"n\":\(n)}".utf8), dataId: nil, groupId: nil, manual: false, unique: .append
        ).newEvent
      }
      _ = try await queue.log.append(events)
      // Many lanes: the runs share commits, so the 18,000 runs stay short on a loaded disk.
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = 16
      let runner = TaskRunner(queue: queue, configuration: configuration)
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 200...3000)))
      runner.register(tag: "x") { _ in .succeeded }
      _ = try await pass.value
      // Two more passes with the handler in place: every x task must run.
      _ = try await runner.run()
      let last = try await runner.run()
      let left = try queue.pendingTasks(tag: "x").count
      if left > 0 {
        leftBehind.append((round, left))
        #expect(last.entries.isEmpty, "they are not even reported")
      }
    }
    #expect(leftBehind.isEmpty, "x tasks never run after register(): \(leftBehind)")
  }

  /// Passes: a tag handled only by another runner instance of the same queue: this runner reports
  /// its tasks once, the other runs them; after this runner registers the tag too, nothing of
  /// it is stuck.
  @Test func twoRunnersWithDifferentHandlerSets() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var config = TaskRunner.Configuration()
    config.maxConcurrentTasks = 4
    let a = TaskRunner(queue: queue, configuration: config)
    let b = TaskRunner(queue: queue, configuration: config)
    let ran = Mutex<[TaskID: Int]>([:])
    let handler: @Sendable (RunningTask) async throws -> TaskResult = { task in
      ran.withLock { $0[task.id, default: 0] += 1 }
      try? await Task.sleep(for: .microseconds(Int.random(in: 0...500)))
      return .succeeded
    }
    a.register(tag: "a", handler: handler)
    b.register(tag: "b", handler: handler)
    var ids: [TaskID] = []
    for n in 0..<200 {
      ids.append(try await queue.add(tag: n % 2 == 0 ? "a" : "b", payload: ["n": n], groupId: n % 3 == 0 ? "g\(n % 4)" : nil))
    }
    let noHandlerReports = Mutex<[TaskID: Int]>([:])
    for _ in 0..<20 {
      async let ra = a.run()
      async let rb = b.run()
      for report in [try await ra, try await rb] {
        for e in report.entries where e.outcome == .skipped(.noHandler) {
          noHandlerReports.withLock { $0[e.taskId, default: 0] += 1 }
        }
      }
      if try queue.pendingTasks().isEmpty { break }
    }
    let leftOver = try queue.pendingTasks().map(\.id)
    #expect(leftOver.isEmpty, "left: \(leftOver)")
    #expect(ran.withLock { $0.values.allSatisfy { $0 == 1 } && $0.count == ids.count })
    #expect(noHandlerReports.withLock { $0.values.allSatisfy { $0 == 1 } }, "a task was reported noHandler twice by one runner")
  }

  // MARK: (1) The coordinator loop

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
        if inGroup.withLock({ s in s[g, default: 0] += 1; return s[g]! }) > 1 { overlap.add(1, ordering: .relaxed) }
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
    #expect(Set(listed).count == listed.count, "a task listed twice: \(listed.count) entries, \(Set(listed).count) distinct")
    #expect(overlap.load(ordering: .relaxed) == 0, "two tasks of one group ran at once")
    #expect(started.withLock { $0.values.allSatisfy { $0 == 1 } }, "a task ran twice in one pass")
    let ranIds = Set(started.withLock { Array($0.keys) })
    let reportedRuns = Set(r.entries.filter { if case .skipped = $0.outcome { return false } else { return true } }.map(\.taskId))
    #expect(ranIds == reportedRuns, "ran \(ranIds.count), reported \(reportedRuns.count)")
    let stillRunnable = try queue.nextRunnable()
    #expect(stillRunnable == nil, "left runnable: \(String(describing: stillRunnable))")
    #expect(try queue.pendingTasks().filter { $0.status == .running }.isEmpty)
    // Each ungrouped task ran (nothing skipped it); every task of a group ran in order, up to its first failure.
    let byId = Dictionary(uniqueKeysWithValues: r.entries.map { ($0.taskId, $0.outcome) })
    for (index, id) in ids.enumerated() where index % 2 == 1 { #expect(byId[id] != nil, "ungrouped task \(id) not run") }
    var groups: [String: [TaskID]] = [:]
    for (index, id) in ids.enumerated() where index % 2 == 0 { groups["g\(index % 11)", default: []].append(id) }
    for (g, members) in groups {
      var expectRun = true
      for id in members {
        if expectRun {
          #expect(byId[id] != nil, "group \(g): task \(id) should have run")
          if byId[id] != .succeeded { expectRun = false }
        } else {
          let outcome = byId[id]
          #expect(outcome == nil || outcome == .skipped(.partOfFailedGroup), "group \(g): task \(id) ran after its group failed")
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
    runner.register(tag: "c", isReadyToRun: { _ in
      try? await Task.sleep(for: .microseconds(Int.random(in: 0...500)))
      return true
    }, handler: handler)
    var ids: [TaskID] = []
    for n in 0..<240 {
      ids.append(try await queue.add(tag: n % 3 == 0 ? "c" : "t", payload: ["n": n], groupId: n % 5 == 0 ? "g\(n % 3)" : nil))
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
    let timeline = try attack2Timeline(queue.log)
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

  // MARK: (5) close() racing a parallel pass

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
          seen.withLock { $0.append("round \(round): task \(task.id) started (closed: \(closed.load(ordering: .relaxed))) with its owner's token unlocked") }
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

  // MARK: (3) Empty commands racing another process

  /// Empty commands (a pass with nothing it may run, a pause that changes nothing) in a tight loop
  /// while another process appends: the store verifies healthy, and reopening it twice writes
  /// nothing (no catch-up or rebuild was left for the next open).
  @Test func emptyCommandsRacingAnotherProcessesAppends() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    let queue = store.queue
    try await queue.add(tag: "nobody", payload: ["n": 0])
    let runner = TaskRunner(queue: queue)
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "150"])
    let appender = try Child("ferry-test-worker", ["add-tasks", fixture.path, "150"])
    var empties = 0
    while adder.process.isRunning || appender.process.isRunning {
      _ = try await runner.run()  // "app" and "nobody" tasks: no handler: appends nothing
      _ = try await queue.log.execute { _ in 0 }
      try await queue.resume()  // not paused: appends nothing
      empties += 3
    }
    _ = try await adder.wait()
    _ = try await appender.wait()
    #expect(adder.output.filter { $0.hasPrefix("ack ") }.count == 150)
    // A last empty command after the other process is gone.
    _ = try await queue.log.execute { _ in 0 }
    let head = try queue.log.head()
    #expect(try queue.pendingTasks(tag: "app").count == 300, "the queue projection missed another process's adds")
    store.close()
    let verify = try Child("ferry", ["verify", fixture.path])
    #expect(try await verify.wait() == 0, "\(verify.output)")
    let first = try await FerryStore.open(at: fixture.path)
    let t1 = try first.log.storageInfo().lastTransaction
    #expect(try first.log.head() == head)
    first.close()
    let second = try await FerryStore.open(at: fixture.path)
    let t2 = try second.log.storageInfo().lastTransaction
    second.close()
    print("AttackTests2: \(empties) empty commands; lastTransaction after opens \(t1), \(t2)")
    #expect(t1 == t2, "a second open wrote to the store")
  }

  /// Empty commands right after a compaction that removed everything (the head is only in the
  /// compaction state): positions never fall behind the head, verify is healthy.
  @Test func emptyCommandsAfterCompactingEverything() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let store = try await FerryStore.open(at: fixture.path)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { _ in .succeeded }
      for n in 0..<50 { try await store.queue.add(tag: "t", payload: ["n": n]) }
      _ = try await runner.run()
      _ = try await store.compact(retention: .milliseconds(0))
      _ = try await store.log.execute { _ in 0 }
      _ = try await runner.run()
      store.close()
    }
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "20"])
    let store = try await FerryStore.open(at: fixture.path)
    while adder.process.isRunning { _ = try await store.log.execute { _ in 0 } }
    _ = try await adder.wait()
    _ = try await store.log.execute { _ in 0 }
    store.close()
    let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0"])
    #expect(try await compact.wait() == 0)
    let verify = try Child("ferry", ["verify", fixture.path])
    #expect(try await verify.wait() == 0, "\(verify.output)")
    let reopened = try await TaskQueue.open(at: fixture.path)
    defer { reopened.close() }
    #expect(try reopened.pendingTasks(tag: "app").count == 20)
  }

  // MARK: (4) compact --copy racing a tight open/close loop

  /// Regression (copy: true failed, copy: false passed): ~80–85% of the app's acknowledged adds are gone.
  /// Likely: openers that wait on lock.mdb while `compact --copy` holds its exclusive lock get
  /// only LMDB's *shared* lock when it lets go, so they treat lock.mdb as live and never
  /// re-initialise it — they run on the old file's txnid/reader table against the swapped-in copy.
  /// Later (copy: true, about 1 run in 26): the next open found "acknowledged up to 325, log ends
  /// at 324" — a copy made while the app's commit had written its meta page but not yet published
  /// its id in lock.mdb lacked that commit, and was swapped in once the app closed
  /// (CompactCopyTests in FerryToolsTests holds that state still).
  /// An app that opens the store, adds one task and closes, over and over, while `ferry compact
  /// --copy` runs again and again on a small store, the app pausing 0–3 ms between sessions (the copy takes well under a millisecond, so
  /// the file's mtime, kept at the kernel's tick, may not move between two writes): every add the
  /// app acknowledged must be in the store.
  @Test(arguments: [true, false]) func compactCopyRacingATightOpenCloseLoop(copy: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let queue = try await TaskQueue.open(at: fixture.path)
      try await queue.add(tag: "seed", payload: ["n": 0])
      queue.close()
    }
    let app = try Child("ferry-test-worker", ["attack2-open-add-close-loop", fixture.path, "6000"])
    var compactions = 0
    let deadline = ContinuousClock.now + .seconds(6)
    while ContinuousClock.now < deadline {
      let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0"] + (copy ? ["--copy"] : []))
      if try await compact.wait() == 0 { compactions += 1 }
    }
    _ = try await app.wait()
    let acked = Set(app.output.filter { $0.hasPrefix("ack ") }.map { $0.split(separator: " ")[2] })
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let stored = Set(try queue.pendingTasks(tag: "app").compactMap { $0.dataId?.dropFirst(4) }.map { Substring($0) })
    let lost = acked.subtracting(stored)
    print("AttackTests2 (copy: \(copy)): \(compactions) compactions, \(acked.count) adds acknowledged, \(stored.count) stored")
    #expect(lost.isEmpty, "acknowledged adds lost: \(lost.sorted().prefix(10))")
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
        let id = try await queue.add(tag: "job", payload: ["kind": kind], groupId: n % 3 == 0 ? "g\(n % 5)" : nil)
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
    let timeline = try attack2Timeline(queue.log)
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
      if kinds[id] != "fail" && successes != 1 { problems.append("task \(id) (\(kinds[id] ?? "?")): \(successes) successes") }
    }
    #expect(problems.isEmpty, "\(problems.prefix(10))")
    #expect(try queue.nextRunnable() == nil)
    #expect(try queue.pendingTasks().filter { $0.status == .running }.isEmpty)
  }
}
