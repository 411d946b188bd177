import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// The push side's conveniences used in company: two runners in one process, or an app and its
/// extension on one store. Promises are read from the log.
@Suite(.timeLimit(.minutes(3))) struct PushCompanyAttackTests {
  /// Whether `condition` holds within `limit` (a hang detector, not a timing assertion: the
  /// condition is expected to hold at once or soon after).
  func holds(within limit: Duration = .seconds(20), _ condition: () throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + limit
    while try !condition() {
      if ContinuousClock.now > deadline { return false }
      try await Task.sleep(for: .milliseconds(5))
    }
    return true
  }

  /// Each task's run starts and outcomes, read from the log.
  func runs(_ log: EventLog) throws -> [TaskID: (starts: Int, succeeded: Int)] {
    var result: [TaskID: (starts: Int, succeeded: Int)] = [:]
    for (_, event) in try log.forEachTaskEvent() {
      switch event {
      case .runStarted(let id, _, _, _): result[id, default: (0, 0)].starts += 1
      case .runSucceeded(let id): result[id, default: (0, 0)].succeeded += 1
      default: break
      }
    }
    return result
  }

  /// Automatic running is asleep with a group held by a manual head (and a later task run, so the
  /// pass under way, if any, is past the group's next task). Returns (head, next).
  func heldGroup(_ queue: TaskQueue, tag: String = "t", headTag: String = "t") async throws -> (TaskID, TaskID) {
    let updates = queue.updates()
    let head = try await queue.add(tag: headTag, payload: ["n": 0], groupId: "g", manual: true)
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
    let path = FileManager.default.temporaryDirectory.path + "/ferry-push-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let store = try await FerryStore.open(at: path, configuration: configuration)
    defer { store.close() }
    let queue = store.queue
    let automatic = runner(queue)
    automatic.register(tag: "t") { _ in .succeeded }
    automatic.startAutomaticRunning()
    defer { automatic.stop() }
    let (head, next) = try await heldGroup(queue, headTag: "ext")
    let child = try Child("ferry-test-worker", ["push-run-one", path, "\(head)", "ext", "ok"])
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
    let path = FileManager.default.temporaryDirectory.path + "/ferry-push-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    let store = try await FerryStore.open(at: path)
    defer { store.close() }
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
    let child = try Child("ferry-test-worker", ["push-run-one", path, "\(id)", "t", "retry"])
    defer { if child.process.isRunning { child.kill() } }
    let outcome = (try? await child.waitForLine(startingWith: "outcome")) ?? ""
    #expect(outcome.hasPrefix("outcome Optional(failed: try again, retry at"), "\(child.output)")
    #expect(try await child.wait() == 0)
    #expect(try await holds { try queue.task(id) == nil }, "the retry the other process scheduled never ran")
    let runs = try runs(store.log)
    #expect(runs[id]?.starts == 2 && runs[id]?.succeeded == 1)
    try expectConsistent(queue)
  }
}

