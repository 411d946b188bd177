import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// A task cancelled, cleared or replaced while its handler runs leaves the queue at once for every
/// caller, but its group waits for that run's outcome and it never runs again
/// (`Specs/task-events.md` §3.2, projection version 5). Orders are read from the log.
@Suite(.timeLimit(.minutes(20))) struct CancelDuringRunTests {
  /// The starts and successes of `ids`, in log order, named by `names`.
  static func order(_ store: FerryStore, _ names: [TaskID: String]) throws -> [String] {
    try store.log.forEachTaskEvent().compactMap { _, event -> String? in
      switch event {
      case .runStarted(let id, _, _, _, _): return names[id].map { "start \($0)" }
      case .runSucceeded(let id, _): return names[id].map { "end \($0)" }
      case .runFailed(let id, _, _, _): return names[id].map { "fail \($0)" }
      default: return nil
      }
    }
  }

  /// Cancelling a group's head while its handler runs: another runner cannot start the group's
  /// next task until the cancelled run ends (it used to start at once — two tasks of one group
  /// running together).
  @Test(arguments: [false, true]) func cancellingARunningHeadKeepsItsGroupWaitingUntilItsRunEnds(
    byClear: Bool
  )
    async throws
  {
    try await withStore { store, _, _ in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let first = runner(queue)
      first.register(tag: "slow") { task in
        started.note("\(task.id)")
        await gate.wait()
        return .succeeded
      }
      let head = try await queue.add(tag: "slow", payload: ["n": 0], groupId: "g")
      let next = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      async let headReport = first.run(.task(head))
      try await waitUntil { started.all.contains("\(head)") }
      if byClear { try await queue.clear() } else { try await queue.cancel(head) }
      // Out of the queue for every caller at once.
      #expect(try queue.task(head) == nil)
      #expect(try queue.pendingTasks().map(\.id) == (byClear ? [] : [next]))
      for attempt in [
        { try await queue.cancel(head) }, { try await queue.updatePayload(head, to: ["n": 9]) },
        { _ = try await queue.recordError(head, message: "x") },
      ] as [@Sendable () async throws -> Void] {
        let error = await #expect(throws: FerryError.self) { try await attempt() }
        #expect(error.map { "\($0)" } == "\(FerryError.noSuchTask(head))")
      }
      if byClear {
        // A task added to the group after the clear waits for the cleared run too.
        let later = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
        #expect(try queue.task(later)?.status == .waitingForGroup(behind: head))
        let second = runner(queue)
        second.register(tag: "t") { _ in .succeeded }
        #expect(try await second.run().outcome(of: later) == nil)
        #expect(try await second.run(.task(later)).outcome(of: later) == .skipped(.notHeadOfGroup))
        #expect(try queue.isIdle() == false, "a handler still runs")
        gate.open()
        #expect(try await headReport.outcome(of: head) == .succeeded)
        #expect(try await second.run(.task(later)).outcome(of: later) == .succeeded)
        #expect(
          try Self.order(store, [head: "head", later: "later"]) == [
            "start head", "end head", "start later", "end later",
          ])
      } else {
        #expect(try queue.task(next)?.status == .waitingForGroup(behind: head))
        let second = runner(queue)
        second.register(tag: "t") { _ in .succeeded }
        #expect(try await second.run().outcome(of: next) == nil)
        #expect(try await second.run(.task(next)).outcome(of: next) == .skipped(.notHeadOfGroup))
        gate.open()
        #expect(try await headReport.outcome(of: head) == .succeeded)
        #expect(try queue.task(next)?.status == .ready)
        #expect(try await second.run().outcome(of: next) == .succeeded)
        #expect(
          try Self.order(store, [head: "head", next: "next"]) == [
            "start head", "end head", "start next", "end next",
          ])
      }
      #expect(try queue.pendingTasks().isEmpty)
      #expect(try store.log.verify().isHealthy)
    }
  }

  /// A cancelled running task whose handler then fails retryably does not come back, and the
  /// group's next task runs after that failure, never before.
  @Test func aCancelledRunThatFailsDoesNotRetryAndFreesItsGroup() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let run = runner(queue)
      run.register(tag: "slow", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { task in
        started.note("\(task.id)")
        await gate.wait()
        return .failed("offline", retryable: true)
      }
      run.register(tag: "t") { _ in .succeeded }
      let head = try await queue.add(tag: "slow", payload: ["n": 0], groupId: "g")
      let next = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      async let headReport = run.run(.task(head))
      try await waitUntil { started.all.contains("\(head)") }
      try await queue.cancel(head)
      #expect(
        try await run.run().outcome(of: next) == nil,
        "the group's next task started beside its cancelled head")
      gate.open()
      _ = try await headReport
      #expect(try queue.task(head) == nil)
      fixture.time += 5000
      #expect(try await run.run().outcome(of: next) == .succeeded)
      #expect(try await run.run().entries.isEmpty)
      #expect(
        try Self.order(store, [head: "head", next: "next"]) == [
          "start head", "fail head", "start next", "end next",
        ])
      #expect(try store.log.verify().isHealthy)
    }
  }

  /// `replace` while the old task's handler runs: the old task leaves the queue (reported
  /// replaced), its run ends as it will, and it never runs again — its stale payload is not sent
  /// after its replacement (it used to retry after the replacement had run).
  @Test func aTaskReplacedDuringItsRunDoesNotRunAgain() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let sent = Journal()
      let run = runner(queue)
      run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { task in
        let value = try task.payload(as: [String: String].self)["v"] ?? "?"
        started.note("\(task.id)")
        if task.attempt == 1 && value == "old" {
          await gate.wait()
          return .failed("offline", retryable: true)
        }
        sent.note(value)
        return .succeeded
      }
      let old = try await queue.add(
        tag: "t", payload: ["v": "old"], dataId: "d", options: [.unique(.replace)])
      async let firstRun = run.run(.task(old))
      try await waitUntil { started.all.contains("\(old)") }
      let new = try await queue.add(
        tag: "t", payload: ["v": "new"], dataId: "d", options: [.unique(.replace)])
      #expect(try queue.pendingTasks().map(\.id) == [new])
      gate.open()
      _ = try await firstRun
      _ = try await run.run()
      fixture.time += 2000
      _ = try await run.run()
      #expect(
        sent.all == ["new"], "the replaced task sent its stale payload after its replacement: \(sent.all)")
      // The replace ends its history; the run under way then logged its outcome, which follows.
      let ending = try queue.history(of: old).suffix(2).map(\.event)
      #expect(ending.first == .replaced(by: new))
      if case .runFailed(let message, _)? = ending.last {
        #expect(message == "offline")
      } else {
        Issue.record("the replaced run's outcome should follow the replace: \(ending)")
      }
      #expect(
        try Self.order(store, [old: "old", new: "new"]) == ["start old", "fail old", "start new", "end new"])
      #expect(try store.log.verify().isHealthy)
    }
  }

  /// An app cancels a group's head whose handler runs in another process (its extension), as seen
  /// by a read-only open too: the head leaves the queue's reads at once, but no pass — here, in a
  /// third open — starts the group's next task until the head's run ends, whether it ends with its
  /// handler's success or with its owner SIGKILLed (then interrupted, and removed, by recovery).
  /// Read from the log; both store modes.
  @Test(arguments: [(false, false), (false, true), (true, false), (true, true)])
  func aCancelledHeadRunningInAnotherProcessHoldsItsGroup(segment: Bool, killed: Bool) async throws {
    let path =
      FileManager.default.temporaryDirectory.path + "/ferry-cancel-run-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let store = try await FerryStore.open(at: path, configuration: configuration)
    defer { store.close() }
    let gate = path + "-gate"
    defer { try? FileManager.default.removeItem(atPath: gate) }
    let queue = store.queue
    let child = try Child("ferry-test-worker", ["run-gated", path, gate, "g"])
    defer { if child.process.isRunning { child.kill() } }
    let line = try await child.waitForLine(startingWith: "running ")
    let head = try #require(TaskID(line.split(separator: " ")[1]))
    let next = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
    try await queue.cancel(head)
    // A third process reads the store read-only (`ferry inspect --json`): the head is gone, the
    // next task waits behind it.
    let inspect = try OperatorCompanyTests.ferry(["inspect", path, "--json"])
    #expect(inspect.status == 0, "\(inspect.stderr)")
    let tasks = try #require(
      (try JSONSerialization.jsonObject(with: Data(inspect.stdout.utf8)) as? [String: Any])?["tasks"]
        as? [[String: Any]])
    #expect(
      tasks.compactMap { $0["id"] as? Int }.map { TaskID(rawValue: UInt64($0)) } == [next],
      "\(inspect.stdout)")
    #expect(tasks.first?["status"] as? String == "waitingForGroup")
    #expect((tasks.first?["behind"] as? Int).map { TaskID(rawValue: UInt64($0)) } == head)
    let report = try #require(
      try JSONSerialization.jsonObject(with: Data(inspect.stdout.utf8)) as? [String: Any])
    #expect((report["cancelledRunning"] as? [Int])?.map { TaskID(rawValue: UInt64($0)) } == [head])
    let human = try OperatorCompanyTests.ferry(["inspect", path])
    #expect(
      human.stdout.contains(
        "cancelled while running (not pending; each holds its group until its run ends): \(head)"))
    #expect(human.stdout.contains("after task \(head)"))
    #expect(try queue.task(next)?.status == .waitingForGroup(behind: head))
    let run = runner(queue)
    run.register(tag: "t") { _ in .succeeded }
    run.register(tag: "gated") { _ in .succeeded }
    for _ in 0..<3 {
      #expect(
        try await run.run().entries.isEmpty, "a pass ran a task of a group whose cancelled head still runs")
    }
    #expect(try await run.run(.task(next)).outcome(of: next) == .skipped(.notHeadOfGroup))
    if killed {
      child.kill()
      _ = try await child.wait()
      #expect(try await queue.interruptRunsOfDeadOwners() == [head])
    } else {
      #expect(FileManager.default.createFile(atPath: gate, contents: Data()))
      #expect(try await child.waitForLine(startingWith: "done ") == "done Optional(succeeded)")
      #expect(try await child.wait() == 0)
    }
    #expect(try await run.run().outcome(of: next) == .succeeded)
    #expect(try await run.run().entries.isEmpty, "the cancelled head ran again")
    let order = try Self.order(store, [head: "head", next: "next"])
    #expect(
      order
        == (killed
          ? ["start head", "start next", "end next"] : ["start head", "end head", "start next", "end next"]))
    let about = try store.log.forEachTaskEvent().compactMap { _, event -> String? in
      switch event {
      case .runStarted(head, _, _, _, _): return "start"
      case .cancelled(head): return "cancelled"
      case .runInterrupted(head): return "interrupted"
      case .runSucceeded(head, _): return "succeeded"
      default: return nil
      }
    }
    #expect(about == ["start", "cancelled", killed ? "interrupted" : "succeeded"])
    #expect(try queue.pendingTasks().isEmpty)
    try expectConsistent(queue)
  }

  /// A run that ends (failing, retryably) a minute after its task was replaced, cancelled or
  /// cleared, and a compaction whose cutoff falls in that minute: everything else of that time
  /// goes — the replacing task's whole history too — and neither the live queue nor a rebuild
  /// (verify, a reopen) brings the task back. (Had the replace left only the replacing add as the
  /// end of the running task's history, the add would go and a rebuild would fold the late
  /// failure into a waiting task again.)
  @Test(arguments: ["replace", "cancel", "clear"]) func compactingAfterALateOutcomeNeverBringsTheTaskBack(
    how: String
  )
    async throws
  {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var store = try await fixture.openStore()
    defer { store.close() }
    let gate = Gate()
    let started = Journal()
    let run = runner(store.queue)
    run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { task in
      started.note("\(task.id)")
      if try task.payload(as: [String: String].self)["v"] == "old" {
        await gate.wait()
        return .failed("offline", retryable: true)
      }
      return .succeeded
    }
    let old = try await store.queue.add(
      tag: "t", payload: ["v": "old"], dataId: "d", options: [.unique(.replace)])
    async let first = run.run(.task(old))
    try await waitUntil { started.all.contains("\(old)") }
    switch how {
    case "replace":
      let new = try await store.queue.add(
        tag: "t", payload: ["v": "new"], dataId: "d", options: [.unique(.replace)])
      #expect(try await run.run(.task(new)).outcome(of: new) == .succeeded)
    case "cancel": try await store.queue.cancel(old)
    default: try await store.queue.clear()
    }
    let other = try await store.queue.add(tag: "t", payload: ["v": "other"])
    #expect(try await run.run(.task(other)).outcome(of: other) == .succeeded)
    fixture.time += 60_000
    gate.open()
    _ = try await first
    #expect(try store.queue.task(old) == nil)
    let report = try await store.compact(retention: .seconds(30))
    #expect(report.removed >= 3, "the other task's history goes: \(report)")
    #expect(try store.queue.task(old) == nil)
    try expectConsistent(store.queue)
    store.close()
    store = try await fixture.openStore()
    _ = try await store.log.rebuild()
    let pending = try store.queue.pendingTasks()
    #expect(pending.isEmpty, "\(pending)")
    try expectConsistent(store.queue)
  }

  /// Regression: automatic running (in this process) runs the group's next task once a cancelled
  /// head's run, in another runner, ends in any way — a success, a retryable or final failure, or
  /// an error recorded (all of which remove the cancelled task). A final failure and a recorded
  /// error did not wake it: the next task waited for an unrelated change.
  @Test(arguments: ["succeeded", "retryable", "final", "error"])
  func automaticRunningRunsTheNextTaskWhenACancelledHeadsRunEnds(ending: String) async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let other = runner(queue)
      other.register(tag: "slow") { task in
        started.note("\(task.id)")
        await gate.wait()
        switch ending {
        case "succeeded": return .succeeded
        case "retryable": return .failed("offline", retryable: true)
        case "final": return .failed("rejected", retryable: false)
        default: return .recordError("log in again")
        }
      }
      let auto = runner(queue)
      auto.register(tag: "t") { _ in .succeeded }
      let head = try await queue.add(tag: "slow", payload: ["n": 0], groupId: "g", options: [.manual])
      let next = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      auto.startAutomaticRunning()
      defer { auto.stop() }
      async let headReport = other.run(.task(head))
      try await waitUntil { started.all.contains("\(head)") }
      try await queue.cancel(head)
      // Let automatic running take the cancel's wake-up and go back to sleep (the group is held).
      try await Task.sleep(for: .milliseconds(300))
      #expect(
        try !Self.order(store, [next: "next"]).contains("start next"), "it started beside the cancelled head")
      gate.open()
      _ = try await headReport
      // No wall-clock give-up: a next task that never runs is caught by the suite's time limit.
      while try queue.task(next) != nil { try await Task.sleep(for: .milliseconds(10)) }
      #expect(
        try queue.task(next) == nil,
        "the group's next task never ran after its cancelled head's run ended (\(ending))")
      #expect(try Self.order(store, [head: "head", next: "next"]).suffix(2) == ["start next", "end next"])
      try expectConsistent(queue)
    }
  }
}
