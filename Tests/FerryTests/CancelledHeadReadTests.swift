import FerryLog
import Foundation
import TestSupport
import Testing

@testable import Ferry

/// The reads agree about a task cancelled while its run is under way: `head(of:)` never names a
/// task `task(_:)` says is gone, and `history(of:)` goes on to that run's logged outcome
/// (`Specs/task-events.md` §4.5).
@Suite(.timeLimit(.minutes(20))) struct CancelledHeadReadTests {
  @Test(arguments: [false, true]) func aHeadCancelledDuringItsRunIsNotTheHeadAndItsOutcomeIsInItsHistory(
    byClear: Bool
  ) async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let run = runner(queue)
      run.register(tag: "slow") { task in
        started.note("\(task.id)")
        await gate.wait()
        return .failed("server said no", retryable: false)
      }
      let head = try await queue.add(tag: "slow", payload: Item(name: "a"), groupId: "g")
      async let report = run.run(.task(head))
      try await waitUntil { started.all.contains("\(head)") }
      if byClear { try await queue.clear() } else { try await queue.cancel(head) }
      let next = try await queue.add(tag: "slow", payload: Item(name: "b"), groupId: "g")
      #expect(try queue.task(head) == nil)
      // Not the cancelled task: the first queued one, which waits for the cancelled run.
      #expect(try queue.head(of: "g") == next)
      #expect(try queue.task(next)?.status == .waitingForGroup(behind: head))
      gate.open()
      _ = try await report
      #expect(try queue.head(of: "g") == next)
      #expect(try queue.task(next)?.status == .ready)
      let kinds = try queue.history(of: head).map(\.event)
      #expect(
        kinds == [
          .added, .runStarted(attempt: 1), byClear ? .cleared : .cancelled,
          .runFailed(message: "server said no", retryAt: nil),
        ])
    }
  }

  @Test func aTwinReplacedDuringItsRunHasItsOutcomeAfterTheReplace() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let gate = Gate()
      let started = Journal()
      let run = runner(queue)
      run.register(tag: "slow") { task in
        started.note("\(task.id)")
        await gate.wait()
        return .succeeded
      }
      let old = try await queue.add(
        tag: "slow", payload: Item(name: "a"), dataId: "d", options: [.unique(.replace)])
      async let report = run.run(.task(old))
      try await waitUntil { started.all.contains("\(old)") }
      let new = try await queue.add(
        tag: "slow", payload: Item(name: "b"), dataId: "d", options: [.unique(.replace)])
      gate.open()
      _ = try await report
      #expect(
        try queue.history(of: old).map(\.event) == [
          .added, .runStarted(attempt: 1), .replaced(by: new), .runSucceeded,
        ])
    }
  }
}
