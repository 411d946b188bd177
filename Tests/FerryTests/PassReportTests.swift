import FerryLog
import Foundation
import TestSupport
import Testing

@testable import Ferry

/// A run report counts errors recorded apart from failures, and accounts for every task the pass
/// decided about — the tasks behind a group head that failed in it too (`Specs/task-events.md` §4.3).
@Suite(.timeLimit(.minutes(20))) struct PassReportTests {
  @Test func errorsRecordedAreCountedApartFromFailures() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "t") { task in
        switch try task.payload(as: Item.self).name {
        case "fail": return .failed("offline")
        case "error": return .recordError("log in")
        default: return .succeeded
        }
      }
      let failing = try await queue.add(tag: "t", payload: Item(name: "fail"))
      _ = try await queue.add(tag: "t", payload: Item(name: "error"))
      _ = try await queue.add(tag: "t", payload: Item(name: "ok"))
      let report = try await run.run()
      #expect(report.ran == 3)
      #expect(report.succeeded == 1)
      #expect(report.failed == 1)
      #expect(report.errorsRecorded == 1)
      #expect(report.firstFailure?.taskId == failing)
      #expect("\(report)" == "3 ran (1 succeeded, 1 failed, 1 error recorded)")
    }
  }

  @Test func theTasksBehindAHeadThatFailedInThePassAreReported() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "t") { task in
        try task.payload(as: Item.self).name == "head" ? .failed("offline") : .succeeded
      }
      let head = try await queue.add(tag: "t", payload: Item(name: "head"), groupId: "g")
      let second = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
      let manual = try await queue.add(tag: "t", payload: Item(name: "m"), groupId: "g", options: [.manual])
      let third = try await queue.add(tag: "t", payload: Item(name: "c"), groupId: "g")
      let loose = try await queue.add(tag: "t", payload: Item(name: "d"))
      let report = try await run.run()
      #expect(report.outcome(of: second) == .skipped(.partOfFailedGroup))
      #expect(report.outcome(of: third) == .skipped(.partOfFailedGroup))
      #expect(report.outcome(of: manual) == nil)  // a pass never runs a manual task
      #expect(report.outcome(of: loose) == .succeeded)
      #expect(report.entries.map(\.taskId) == [head, second, third, loose])
      #expect(report.skipped == 2 && report.ran == 2)
    }
  }

  @Test func aGroupPassSaysWhyItsHeadDoesNotRun() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      let head = try await queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
      let next = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
      try await queue.recordError(head, message: "log in")
      let report = try await run.run(.group("g"))
      #expect(report.outcome(of: head) == .skipped(.blockedByError))
      #expect(report.outcome(of: next) == .skipped(.partOfFailedGroup))
      // By id: it says why too.
      #expect(try await run.run(.task(next)).outcome(of: next) == .skipped(.notHeadOfGroup))
      #expect(try await run.run(.task(head)).outcome(of: head) == .skipped(.blockedByError))
    }
  }
}
