import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import Ferry

/// Open findings, recorded as known issues (each expectation says what should hold): changing
/// them changes documented semantics and the projection, so they are described, not fixed here.
@Suite(.timeLimit(.minutes(2))) struct PushCompanyProbeTests {
  /// Probe: cancelling a group's head while its handler runs makes the next task the head at once:
  /// another runner starts it while the cancelled run is still under way — the group runs two
  /// tasks at once (read from the log: the next task's start comes before the head's outcome).
  @Test func cancellingARunningHeadLetsTheNextTaskOfItsGroupStartBeforeItEnds() async throws {
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
      try await queue.cancel(head)
      let second = runner(queue)
      second.register(tag: "t") { _ in .succeeded }
      let nextOutcome = try await second.run(.task(next)).outcome(of: next)
      gate.open()
      _ = try await headReport
      let order = try store.log.forEachTaskEvent().compactMap { _, event -> String? in
        switch event {
        case .runStarted(let id, _, _, _): return "start \(id == head ? "head" : "next")"
        case .runSucceeded(let id): return "end \(id == head ? "head" : "next")"
        default: return nil
        }
      }
      withKnownIssue("open: a cancel of a running head frees its group at once (Specs/task-events.md §4.1)") {
        #expect(nextOutcome != .succeeded || order == ["start head", "end head", "start next", "end next"], "\(order)")
      }
    }
  }

  /// Probe: `replace` leaves a task whose run is under way; when that run fails retryably, the old
  /// task (old payload) retries after its replacement ran — stale data sent last.
  @Test func aTaskReplacedDuringItsRunRetriesAfterItsReplacement() async throws {
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
      let old = try await queue.add(tag: "t", payload: ["v": "old"], dataId: "d", unique: .replace)
      async let firstRun = run.run(.task(old))
      try await waitUntil { started.all.contains("\(old)") }
      let new = try await queue.add(tag: "t", payload: ["v": "new"], dataId: "d", unique: .replace)
      gate.open()
      _ = try await firstRun
      _ = try await run.run()
      fixture.time += 2000
      _ = try await run.run()
      let last = try queue.history(of: old).last?.event
      withKnownIssue("open: replace leaves a running task, which retries after its replacement") {
        #expect(sent.all == ["new"], "the replaced task sent its stale payload after its replacement: \(sent.all)")
        #expect(last == .replaced(by: new))
      }
    }
  }
}
