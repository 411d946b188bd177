import FerryLog
import FerryTesting
import Foundation
import MetricsTestKit
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// A background window whose pass another window cut short, or joined: each pass goes on
/// until its own deadline, and a claim reads the deadline that holds.
@Suite(.timeLimit(.minutes(20))) struct WindowPassLimitTests {
  /// Waits (yielding) until the runner's pass under way claims nothing from `deadline` on: a
  /// window has joined it (or waits for it) and set its deadline.
  static func waitForPassLimit(_ runner: TaskRunner, _ deadline: Int64) async {
    for _ in 0..<1_000_000 {
      if runner.state.withLock({ $0.pass?.control.deadline }) == deadline { return }
      await Task.yield()
    }
  }

  /// A handler that runs until cancelled, then returns `succeeded` (within the grace): a run a
  /// deadline cuts short but that is not interrupted.
  static func untilCancelled(_ started: Gate) -> @Sendable (RunningTask) async throws -> TaskResult {
    { _ in
      started.open()
      try? await Task.sleep(for: .seconds(3600))
      return .succeeded
    }
  }

  /// Two windows on one runner: the longer one started the pass, the shorter one joined it and
  /// cut it at its own deadline. The longer window's deadline is far away and a task is still
  /// ready, yet it reported `outOfWork` and ran nothing more: a pass cut short by another window
  /// is not "nothing more it could run".
  @Test func aWindowWhosePassAnotherWindowCutShortGoesOnUntilItsOwnDeadline() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let first = try await queue.add(tag: "slow", payload: ["n": 1])
      let second = try await queue.add(tag: "t", payload: ["n": 2])
      let started = Gate()
      let run = TaskRunner(queue: queue)
      run.register(tag: "slow", handler: Self.untilCancelled(started))
      run.register(tag: "t") { _ in .succeeded }
      let start = clock.milliseconds
      let long = Task { try await run.run(until: at(start + 100_000)) }
      await started.wait()
      let short = Task { try await run.run(until: at(start + 10_000)) }
      await Self.waitForPassLimit(run, start + 10_000)
      clock.advance(by: .seconds(10))
      let shortReport = try await short.value
      let longReport = try await long.value

      #expect(shortReport.end == .deadline)
      #expect(longReport.outcome(of: first) == .succeeded)
      #expect(longReport.outcome(of: second) == .succeeded, "\(longReport)")
      #expect(longReport.end == .outOfWork)
      #expect(try queue.task(second) == nil)
      try expectConsistent(queue)
    }
  }

  /// Automatic running's pass, joined by a window and cut at the window's deadline, left a ready
  /// task unclaimed and then waited for a wake-up that never came: the queue stayed busy until
  /// the next add.
  @Test func automaticRunningGoesOnAfterAWindowCutItsPassShort() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      _ = try await queue.add(tag: "slow", payload: ["n": 1])
      let second = try await queue.add(tag: "t", payload: ["n": 2])
      let started = Gate()
      let secondRan = Gate()
      let run = TaskRunner(queue: queue)
      run.register(tag: "slow", handler: Self.untilCancelled(started))
      run.register(tag: "t") { _ in
        secondRan.open()
        return .succeeded
      }
      run.startAutomaticRunning()
      defer { run.stop() }
      await started.wait()
      let start = clock.milliseconds
      let window = Task { try await run.run(until: at(start + 10_000)) }
      await Self.waitForPassLimit(run, start + 10_000)
      clock.advance(by: .seconds(10))
      #expect(try await window.value.end == .deadline)
      await secondRan.wait()  // hangs (the suite's time limit) when automatic running stalls
      try await queue.waitUntilIdle()
      #expect(try queue.task(second) == nil)
    }
  }

  /// A pass whose `isReadyToRun` check is slow: a window joins it, its deadline comes while the
  /// check is being asked, the check then says yes — and the claim went ahead after the
  /// deadline (a `task.runStarted` logged past it), since the claim read the pass's deadline as
  /// it was before the window joined. Nothing may be claimed from a window's deadline on.
  @Test func aClaimAfterASlowReadinessCheckReadsTheDeadlineOfAWindowThatJoinedMeanwhile() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let id = try await queue.add(tag: "t", payload: ["n": 1])
      let asked = Gate()
      let answer = Gate()
      let run = TaskRunner(queue: queue)
      run.register(
        tag: "t",
        isReadyToRun: { _ in
          asked.open()
          await answer.wait()
          return true
        }
      ) { _ in .succeeded }
      let pass = Task { try await run.run() }
      await asked.wait()
      let start = clock.milliseconds
      let window = Task { try await run.run(until: at(start + 10_000)) }
      await Self.waitForPassLimit(run, start + 10_000)
      clock.advance(by: .seconds(10))
      answer.open()
      let report = try await window.value
      _ = try await pass.value

      #expect(report.end == .deadline)
      let starts = try store.log.forEachTaskEvent().filter {
        if case .runStarted(id, _, _, _, _) = $0.1 { return true }
        return false
      }
      #expect(starts.isEmpty, "a run of \(id) started after the window's deadline")
      #expect(try queue.task(id)?.status == .ready)
      try expectConsistent(queue)
    }
  }
}
