import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// `run(.task(id))` waiting for another process's run of the task: it ends when that run's
/// outcome is gone (cancelled, compacted away) or its owner dies.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct RunTaskWaitTests {
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
    let id = try #require(TaskID(line.dropFirst("running ".count)))
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
    let owner = try Child("ferry-test-worker", ["run-gated", fixture.path, gate])
    defer { owner.kill() }
    let line = try await owner.waitForLine(startingWith: "running ")
    let id = try #require(line.split(separator: " ").dropFirst().first.flatMap { TaskID($0) })
    let waiter = try Child("ferry-test-worker", ["run-one", fixture.path, "\(id)"])
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
}
