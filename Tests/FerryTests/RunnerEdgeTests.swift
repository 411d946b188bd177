import FerryLog
import Foundation
import Synchronization
import Testing

@testable import Ferry

/// Waits until `updates` delivers an update `match` accepts; false when the stream ends without
/// one. No wall-clock give-up: an update that never comes is caught by the test's time limit,
/// whose cancellation ends the stream's iteration.
func waitFor(
  _ updates: AsyncStream<TaskUpdate>, _ match: @escaping @Sendable (TaskUpdate) -> Bool
) async -> Bool {
  for await update in updates where match(update) { return true }
  return false
}

/// Races found in review, each pinned by a test.
@Suite(.timeLimit(.minutes(20))) struct RunnerEdgeTests {
  @Test func aRetryThatComesDueDuringALongPassIsStillRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0)) { task in
      let name = try task.payload(as: Item.self).name
      if name == "flaky" { return task.attempt == 1 ? .failed("offline") : .succeeded }
      fixture.time += 2000  // a slow task: the pass outlives the flaky task's retry time
      return .succeeded
    }
    try await queue.pause()
    let flaky = try await queue.add(tag: "t", payload: Item(name: "flaky"))
    _ = try await queue.add(tag: "t", payload: Item(name: "slow"))
    let updates = queue.updates()
    run.startAutomaticRunning()
    defer { run.stop() }
    try await queue.resume()
    #expect(await waitFor(updates) { $0 == .succeeded(flaky) })
  }

  @Test func automaticRunningDoesNotJoinAPassThatNeverListedItsTask() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let started = Gate()
    let release = Gate()
    let run = runner(queue)
    run.register(tag: "manual") { _ in
      started.open()
      await release.wait()
      return .succeeded
    }
    run.register(tag: "t") { _ in .succeeded }
    let manual = try await queue.add(tag: "manual", payload: Item(name: "m"), options: [.manual])
    let updates = queue.updates()
    run.startAutomaticRunning()
    defer { run.stop() }
    async let report = run.run(.task(manual))
    await started.wait()
    let added = try await queue.add(tag: "t", payload: Item(name: "y"))
    release.open()
    #expect(try await report.outcome(of: manual) == .succeeded)
    #expect(await waitFor(updates) { $0 == .succeeded(added) })
  }

  @Test func aHandlersOwnCancellationErrorIsAFailureNotAnEndlessInterruption() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t") { _ in throw CancellationError() }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    let report = try await run.run()
    guard case .failed(let message, let retryAt) = report.outcome(of: id) else {
      Issue.record("expected a failure, got \(String(describing: report.outcome(of: id)))")
      return
    }
    #expect(message.contains("CancellationError"))
    #expect(retryAt != nil)
    #expect(try queue.task(id)?.attempts == 1)
  }

  @Test func aTaskCancelledWhileItsReadinessIsCheckedIsNotRun() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let asked = Gate()
    let answer = Gate()
    let journal = Journal()
    let run = runner(queue)
    run.register(
      tag: "t",
      isReadyToRun: { _ in
        asked.open()
        await answer.wait()
        return true
      }
    ) { _ in
      journal.note("ran")
      return .succeeded
    }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    async let report = run.run()
    await asked.wait()
    try await queue.cancel(id)
    answer.open()
    let finished = try await report
    #expect(finished.outcome(of: id) == .skipped(.noLongerQueued))
    #expect(finished.cancelled == 1)
    #expect(journal.all.isEmpty)
    try expectConsistent(queue)
  }

  @Test func anErrorRecordedDuringARunOutlastsTheRunsFailure() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let started = Gate()
    let finish = Gate()
    let run = runner(queue)
    run.register(tag: "t") { _ in
      started.open()
      await finish.wait()
      return .failed("offline")
    }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    async let report = run.run()
    await started.wait()
    try await queue.recordError(id, message: "fix me")
    finish.open()
    _ = try await report
    #expect(try queue.task(id)?.status == .blockedByError)
    #expect(try queue.task(id)?.lastFailure == "offline")
    #expect(try queue.latestError(id)?.message == "fix me")
    try await queue.resolveError(id)
    #expect(try queue.task(id)?.status == .ready)
    try expectConsistent(queue)
  }

  @Test func hugeMessagesAreCutSoTheOutcomeIsAlwaysLogged() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let run = runner(queue)
    run.register(tag: "t") { _ in .failed(String(repeating: "é", count: 17 << 20)) }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    _ = try await run.run()
    let task = try #require(try queue.task(id))
    #expect(task.status != .running)
    #expect((task.lastFailure?.utf8.count ?? 0) <= TaskQueue.maxMessageLength)
    try await queue.recordError(id, message: String(repeating: "x", count: 1 << 20))
    #expect((try queue.latestError(id)?.message.utf8.count ?? 0) <= TaskQueue.maxMessageLength)
  }

  @Test func retryPoliciesNeverTrapOnStrangeNumbers() {
    #expect(
      RetryPolicy(initialDelay: .seconds(1), jitter: .nan).delay(afterAttempt: 1, random: 0.5) == .seconds(1))
    #expect(
      RetryPolicy(initialDelay: .seconds(1), jitter: 0.2).delay(afterAttempt: 1, random: .nan) == .seconds(1))
    let huge = RetryPolicy(
      maxAttempts: 100, initialDelay: .seconds(1), multiplier: .infinity, maxDelay: .seconds(60))
    #expect(huge.delay(afterAttempt: 50, random: 0.5) == .seconds(60))
    let steep = RetryPolicy(
      maxAttempts: 100, initialDelay: .seconds(1), multiplier: 1e300, maxDelay: .seconds(60), jitter: 0)
    #expect(steep.delay(afterAttempt: 90, random: 0.5) == .seconds(60))
  }

  @Test func historyEndsWhereTheTaskEnded() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    try await queue.cancel(id)
    try await queue.clear()
    try await queue.clear()
    #expect(try queue.history(of: id).map(\.event) == [.added, .cancelled])
  }

  @Test func replacedTasksAreReportedToObservers() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let old = try await queue.add(tag: "save", payload: Item(name: "v1"), dataId: "doc")
    let updates = queue.updates()
    let new = try await queue.add(
      tag: "save", payload: Item(name: "v2"), dataId: "doc", options: [.unique(.replace)])
    var seen: [TaskUpdate] = []
    for await update in updates {
      seen.append(update)
      if update == .added(new) { break }
    }
    #expect(seen == [.cancelled(old), .added(new)])
  }
}
