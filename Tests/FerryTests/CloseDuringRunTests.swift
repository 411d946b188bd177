import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// Closing a queue while a handler of its runner runs: the run is neither taken away nor
/// left claimed with nobody to interrupt it.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct CloseDuringRunTests {
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
        let outcome = try await resultWithin(2) { try await other.run(.task(task.id)) }
        #expect(outcome != nil, "run(.task(\(task.id))) still waiting after 2 s")
        break
      }
    }
    #expect(stuck.isEmpty, "runs left claimed by a closed queue, never interrupted: \(stuck)")
  }
}
