import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The push side's conveniences used in company: two runners in one process, or an app and its
/// extension on one store. Promises are read from the log.
@Suite(.timeLimit(.minutes(20))) struct PushCompanyTests {
  /// Waits until `condition` holds and says so (true). No wall-clock give-up, which a loaded
  /// machine could reach: a condition that never holds is caught by the suite's time limit.
  func holds(_ condition: () throws -> Bool) async throws -> Bool {
    while try !condition() { try await Task.sleep(for: .milliseconds(5)) }
    return true
  }

  /// A store in a directory of its own, which a child process opens too; `remove` closes the
  /// store and deletes the directory.
  func sharedStore(
    segment: Bool = false
  ) async throws -> (store: FerryStore, path: String, remove: () -> Void) {
    let path = FileManager.default.temporaryDirectory.path + "/ferry-push-\(UUID().uuidString.prefix(8))"
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    do {
      let store = try await FerryStore.open(at: path, configuration: configuration)
      return (
        store, path,
        {
          store.close()
          try? FileManager.default.removeItem(atPath: path)
        }
      )
    } catch {
      try? FileManager.default.removeItem(atPath: path)
      throw error
    }
  }

  /// Each task's run starts and outcomes, read from the log.
  func runs(_ log: EventLog) throws -> [TaskID: (starts: Int, succeeded: Int)] {
    var result: [TaskID: (starts: Int, succeeded: Int)] = [:]
    for (_, event) in try log.forEachTaskEvent() {
      switch event {
      case .runStarted(let id, _, _, _, _): result[id, default: (0, 0)].starts += 1
      case .runSucceeded(let id, _): result[id, default: (0, 0)].succeeded += 1
      default: break
      }
    }
    return result
  }

  /// Automatic running is asleep with a group held by a manual head (and a later task run, so the
  /// pass under way, if any, is past the group's next task). Returns (head, next).
  func heldGroup(
    _ queue: TaskQueue, tag: String = "t", headTag: String = "t"
  ) async throws -> (TaskID, TaskID) {
    let updates = queue.updates()
    let head = try await queue.add(tag: headTag, payload: ["n": 0], groupId: "g", options: [.manual])
    let next = try await queue.add(tag: tag, payload: ["n": 1], groupId: "g")
    let marker = try await queue.add(tag: tag, payload: ["n": 2])
    for await update in updates where update == .succeeded(marker) { break }
    #expect(try queue.task(next)?.status == .waitingForGroup(behind: head))
    // Let automatic running go to sleep (the adds' wake-ups may owe it one more pass): the
    // change below must be what wakes it. Not a timed assertion: a fixed runner passes either way.
    try await Task.sleep(for: .milliseconds(200))
    return (head, next)
  }

  /// Regression: automatic running woke only on adds, resolutions, revivals, interruptions and
  /// resumes. Cancelling a group's head that held the group (manual, blocked, dead) made the next
  /// task the head and ready, but nothing ran it until some unrelated add: `waitUntilIdle()` hung.
  @Test func automaticRunningRunsTheNextTaskOfAGroupWhoseHeadIsCancelled() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      run.startAutomaticRunning()
      defer { run.stop() }
      let (head, next) = try await heldGroup(queue)
      try await queue.cancel(head)
      #expect(try await holds { try queue.task(next) == nil }, "the group's new head was never run")
      let runs = try runs(store.log)
      #expect(runs[next]?.starts == 1 && runs[next]?.succeeded == 1)
      #expect(runs[head] == nil)
      try expectConsistent(queue)
    }
  }

  /// Regression: a window waiting for a retry slept through the success of a manual head that
  /// another runner ran (`run(.task(id))`): the group's next task, ready since, waited for the
  /// retry's time (or the window ended "out of work" without it). Windows wake as automatic
  /// running does.
  @Test func aWindowRunsTheNextTaskAfterAnotherRunnerRunsTheManualHead() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let window = runner(queue)
      window.register(tag: "t") { _ in .succeeded }
      window.register(tag: "later", retry: RetryPolicy(initialDelay: .seconds(60), jitter: 0)) { _ in
        .failed("offline", retryable: true)
      }
      let head = try await queue.add(tag: "t", payload: ["n": 0], groupId: "g", options: [.manual])
      let next = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      let later = try await queue.add(tag: "later", payload: ["n": 2])
      // The window's first pass fails `later` (a retry in 60 s of the store's clock, which this
      // test does not move) and cannot reach `next`: it waits for the retry.
      let running = Task { try await window.run(for: .seconds(3600)) }
      #expect(try await holds { try queue.task(later)?.attempts == 1 }, "the window never ran its first pass")
      let other = runner(queue)
      other.register(tag: "t") { _ in .succeeded }
      #expect(try await other.run(.task(head)).outcome(of: head) == .succeeded)
      let ran = try await holds { try queue.task(next) == nil }
      running.cancel()
      let report = try await running.value
      #expect(ran, "the window never ran the group's next task: \(report)")
      let runs = try runs(store.log)
      #expect(runs[next]?.starts == 1 && runs[next]?.succeeded == 1)
      #expect(runs[head]?.starts == 1)
      try expectConsistent(queue)
    }
  }

  /// Regression: a manual head run by another runner of the process (`run(.task(id))`, the only
  /// way a manual task runs) succeeded, and the automatic runner never ran the task behind it.
  @Test func automaticRunningRunsTheNextTaskAfterAnotherRunnerRunsTheManualHead() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let automatic = runner(queue)
      automatic.register(tag: "t") { _ in .succeeded }
      automatic.startAutomaticRunning()
      defer { automatic.stop() }
      let (head, next) = try await heldGroup(queue)
      let other = runner(queue)
      other.register(tag: "t") { _ in .succeeded }
      #expect(try await other.run(.task(head)).outcome(of: head) == .succeeded)
      #expect(try await holds { try queue.task(next) == nil }, "the group's new head was never run")
      let runs = try runs(store.log)
      #expect(runs[head]?.starts == 1 && runs[head]?.succeeded == 1)
      #expect(runs[next]?.starts == 1 && runs[next]?.succeeded == 1)
      try expectConsistent(queue)
    }
  }

  /// Regression, across processes: the extension runs the manual head of a group; the app's
  /// automatic running sees the success through the log's tail and runs the task behind it.
  @Test(arguments: [false, true])
  func automaticRunningRunsTheNextTaskAfterAnotherProcessRunsTheHead(segment: Bool) async throws {
    let (store, path, remove) = try await sharedStore(segment: segment)
    defer { remove() }
    let queue = store.queue
    let automatic = runner(queue)
    automatic.register(tag: "t") { _ in .succeeded }
    automatic.startAutomaticRunning()
    defer { automatic.stop() }
    let (head, next) = try await heldGroup(queue, headTag: "ext")
    let child = try Child("ferry-test-worker", ["run-one-with-result", path, "\(head)", "ext", "ok"])
    defer { if child.process.isRunning { child.kill() } }
    #expect(try await child.waitForLine(startingWith: "outcome") == "outcome Optional(succeeded)")
    #expect(try await child.wait() == 0)
    #expect(try await holds { try queue.task(next) == nil }, "the group's new head was never run")
    let runs = try runs(store.log)
    #expect(runs[head]?.starts == 1 && runs[head]?.succeeded == 1)
    #expect(runs[next]?.starts == 1 && runs[next]?.succeeded == 1)
    try expectConsistent(queue)
  }

  /// Regression: another process's one-off run failed retryably; the app's automatic running had
  /// set its next wake-up before that retry time existed (it wakes at "the earliest retry time"),
  /// and slept on: the retry never ran.
  @Test func automaticRunningRetriesATaskAnotherProcessFailed() async throws {
    let (store, path, remove) = try await sharedStore()
    defer { remove() }
    let queue = store.queue
    let allowed = Mutex(false)
    let automatic = runner(queue)
    automatic.register(tag: "t", isReadyToRun: { _ in allowed.withLock { $0 } }) { _ in .succeeded }
    let updates = queue.updates()
    automatic.startAutomaticRunning()
    defer { automatic.stop() }
    let id = try await queue.add(tag: "t", payload: ["n": 0])
    for await update in updates where update == .skipped(id, .notReady) { break }
    // Let automatic running go to sleep (the add's wake-up may owe it one more pass).
    try await Task.sleep(for: .milliseconds(200))
    allowed.withLock { $0 = true }  // from now on a pass runs it
    let child = try Child("ferry-test-worker", ["run-one-with-result", path, "\(id)", "t", "retry"])
    defer { if child.process.isRunning { child.kill() } }
    let outcome = (try? await child.waitForLine(startingWith: "outcome")) ?? ""
    #expect(outcome.hasPrefix("outcome Optional(failed: try again, retry at"), "\(child.output)")
    #expect(try await child.wait() == 0)
    #expect(try await holds { try queue.task(id) == nil }, "the retry the other process scheduled never ran")
    let runs = try runs(store.log)
    #expect(runs[id]?.starts == 2 && runs[id]?.succeeded == 1)
    try expectConsistent(queue)
  }

  /// Two processes add with keep and replace on the same three data ids at once, while a runner
  /// in each (the parent's running automatically) runs them. From the log: every acknowledged add
  /// is an add of that tag and data id (kept: an earlier one); no task starts twice; every task
  /// ends succeeded or replaced by a later add of its data id made while it was not running; a
  /// kept id was not over before the add that kept it was asked for; the queue ends empty and
  /// equal to a rebuild.
  @Test(arguments: [false, true])
  func keepAndReplaceFromTwoProcessesWithRunnersInBoth(segment: Bool) async throws {
    let (store, path, remove) = try await sharedStore(segment: segment)
    defer { remove() }
    let queue = store.queue
    let automatic = runner(queue)
    automatic.register(tag: "job") { _ in
      try? await Task.sleep(for: .milliseconds(1))
      return .succeeded
    }
    automatic.startAutomaticRunning()
    let extra = segment ? ["segment"] : []
    let adder = try Child("ferry-test-worker", ["unique-adds", path, "150", "7"] + extra)
    defer { if adder.process.isRunning { adder.kill() } }
    let other = try Child("ferry-test-worker", ["run-jobs-until-idle", path, "1"] + extra)
    defer { if other.process.isRunning { other.kill() } }
    // (kept or added id, policy, data id, the log's head before the add was asked for)
    var mine: [(TaskID, UniquePolicy, String, UInt64)] = []
    var seed: UInt64 = 11
    for i in 0..<150 {
      seed = seed &* 6364136223846793005 &+ 1442695040888963407
      let policy: UniquePolicy = (seed >> 33) % 2 == 0 ? .keep : .replace
      let dataId = "d\(i % 3)"
      let before = try store.log.head()
      mine.append(
        (
          try await queue.add(
            tag: "job", payload: ["kind": "ok"], dataId: dataId, options: [.unique(policy)]), policy, dataId,
          before
        ))
    }
    #expect(try await adder.waitForLine(startingWith: "done") == "done")
    #expect(try await adder.wait() == 0)
    try await queue.waitUntilIdle()
    automatic.stop()
    _ = try await other.waitForLine(startingWith: "done")
    #expect(try await other.wait() == 0)

    let events = try store.log.forEachTaskEvent()
    var adds: [TaskID: (String?, UniquePolicy)] = [:]
    var starts: [TaskID: Int] = [:]
    var endedAt: [TaskID: UInt64] = [:]
    for (record, event) in events {
      switch event {
      case .added(_, _, let dataId, _, _, let unique, _, _, _):
        adds[TaskID(rawValue: record.sequence)] = (dataId, unique)
      case .runStarted(let id, _, _, _, _): starts[id, default: 0] += 1
      case .runSucceeded(let id, _): endedAt[id] = endedAt[id] ?? record.sequence
      default: break
      }
    }
    for (id, count) in starts { #expect(count == 1, "task \(id) started \(count) times") }
    let theirs = adder.output.filter { $0.hasPrefix("ack ") }.map { $0.split(separator: " ") }
    #expect(theirs.count == 150)
    var acked = mine.map { ($0.0, $0.1, $0.2) }
    for fields in theirs {
      acked.append((TaskID(fields[1]) ?? 0, fields[2] == "keep" ? .keep : .replace, String(fields[3])))
    }
    for (id, policy, dataId) in acked {
      #expect(adds[id]?.0 == dataId, "ack \(id) \(policy) \(dataId) is not an add of that data id")
    }
    // A kept id was still queued when its add was asked for (it had not succeeded before then).
    for (id, policy, _, before) in mine where policy == .keep && id.rawValue <= before {
      if let end = endedAt[id] { #expect(end > before, "keep returned \(id), which had succeeded at \(end)") }
    }
    for id in adds.keys.sorted() {
      // A replace ends a history; a run under way then logs its outcome after it.
      let events = try queue.history(of: id).map(\.event)
      let last = events.first { if case .replaced = $0 { return true } else { return false } } ?? events.last
      switch last {
      case .runSucceeded?: #expect(starts[id] == 1)
      case .replaced(let by)?:
        #expect(adds[by]?.0 == adds[id]?.0 && adds[by]?.1 == .replace && by > id)
        #expect(starts[id] == nil || endedAt[id] != nil, "task \(id) was replaced, yet ran without ending")
      default: Issue.record("task \(id)'s history ends with \(String(describing: last))")
      }
    }
    #expect(try queue.pendingTasks().isEmpty)
    try expectConsistent(queue)
  }

  /// The app updates and cancels a task whose handler runs in the extension: the update is refused
  /// while the run is under way (taskRunning) and after the cancel (noSuchTask), never applied to
  /// a finished task; the run's success is logged once, after the cancel, and the task never runs
  /// again — not by a pass, not by run(.task) — read from the log.
  @Test(arguments: [false, true])
  func updateAndCancelWhileAnotherProcessRunsTheTask(segment: Bool) async throws {
    let (store, path, remove) = try await sharedStore(segment: segment)
    defer { remove() }
    let gate = path + "-gate"
    defer { try? FileManager.default.removeItem(atPath: gate) }
    let queue = store.queue
    let child = try Child("ferry-test-worker", ["run-gated", path, gate])
    defer { if child.process.isRunning { child.kill() } }
    let line = try await child.waitForLine(startingWith: "running ")
    let id = try #require(TaskID(line.split(separator: " ")[1]))
    let stream = try queue.updates(for: id)
    let running = await #expect(throws: FerryError.self) { try await queue.updatePayload(id, to: ["n": 2]) }
    #expect(running.map { "\($0)" } == "\(FerryError.taskRunning(id))")
    try await queue.cancel(id)
    let gone = await #expect(throws: FerryError.self) { try await queue.updatePayload(id, to: ["n": 3]) }
    #expect(gone.map { "\($0)" } == "\(FerryError.noSuchTask(id))")
    let again = await #expect(throws: FerryError.self) { try await queue.cancel(id) }
    #expect(again.map { "\($0)" } == "\(FerryError.noSuchTask(id))")
    let run = runner(queue)
    run.register(tag: "gated") { _ in .succeeded }
    let single = await #expect(throws: FerryError.self) { try await run.run(.task(id)) }
    #expect(single.map { "\($0)" } == "\(FerryError.noSuchTask(id))")
    #expect(FileManager.default.createFile(atPath: gate, contents: Data()))
    #expect(try await child.waitForLine(startingWith: "done ") == "done Optional(succeeded)")
    #expect(try await child.wait() == 0)
    _ = try await run.run()
    var seen: [TaskUpdate] = []
    for await update in stream {
      seen.append(update)
      if case .succeeded = update { break }
    }
    #expect(seen.contains(.cancelled(id)))
    let about = try store.log.forEachTaskEvent().compactMap { _, event -> String? in
      switch event {
      case .runStarted(id, _, _, _, _): return "start"
      case .runSucceeded(id, _): return "succeeded"
      case .cancelled(id): return "cancelled"
      case .payloadUpdated(id, _): return "updated"
      default: return nil
      }
    }
    #expect(about == ["start", "cancelled", "succeeded"])
    // The cancel ends its history; the run under way then logged its outcome, which follows.
    #expect(try queue.history(of: id).suffix(2).map(\.event) == [.cancelled, .runSucceeded])
    try expectConsistent(queue)
  }
}
