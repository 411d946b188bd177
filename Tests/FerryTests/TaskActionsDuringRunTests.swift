import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The app acting on a task while it runs (resolve, stop, unique replace and keep): each task
/// still runs once.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct TaskActionsDuringRunTests {
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
    for n in 0..<200 {
      ids.append(try await queue.add(tag: "t", payload: ["n": n], groupId: n % 3 == 0 ? "g" : nil))
    }
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
    let runs = try runsByTask(queue.log)
    for id in ids {
      let r = runs[id]
      #expect(
        r?.successes == 1 && r.map { $0.starts == $0.finishes + $0.interruptions } == true,
        "task \(id): \(String(describing: r))")
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
      try await queue.add(
        tag: "save", payload: ["v": n], dataId: "note-\(n % 3)",
        options: [.unique(n % 2 == 0 ? .replace : .keep)])
    }
    while try !queue.pendingTasks().isEmpty { try await Task.sleep(for: .milliseconds(20)) }
    for runner in runners { runner.stop() }
    #expect(overlap.load(ordering: .relaxed) == 0)
    let runs = try runsByTask(queue.log)
    for (id, r) in runs {
      #expect(r.successes <= 1 && r.starts == r.finishes + r.interruptions, "task \(id): \(r)")
    }
    #expect(try queue.pendingTasks().isEmpty)
  }
}
