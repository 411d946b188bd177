import FerryLog
import Foundation
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Every ready task behind its group's head reads ``TaskStatus/waitingForGroup(behind:)``, whatever
/// the head's state — only a head may run (`Specs/task-events.md` §3.3).
@Suite(.timeLimit(.minutes(20))) struct GroupStatusTests {
  @Test func aTaskBehindAHeadThatMayStartWaitsForItsGroup() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let head = try await queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
      let second = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
      let third = try await queue.add(tag: "t", payload: Item(name: "c"), groupId: "g")
      let alone = try await queue.add(tag: "t", payload: Item(name: "d"))
      // The head may start: the tasks behind it still wait for it (they read `ready` before).
      #expect(try queue.task(head)?.status == .ready)
      #expect(try queue.task(second)?.status == .waitingForGroup(behind: head))
      #expect(
        try queue.pendingTasks().map(\.status) == [
          .ready, .waitingForGroup(behind: head), .waitingForGroup(behind: head), .ready,
        ])
      let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
      #expect(snapshot.tasks.first { $0.id == third }?.status == .waitingForGroup(behind: head))
      _ = alone
      // Once the head has left, the next one heads the group and is ready.
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      _ = try await run.run(.task(head))
      #expect(try queue.task(second)?.status == .ready)
      #expect(try queue.task(third)?.status == .waitingForGroup(behind: second))
    }
  }

  @Test func aTaskBehindAFailingHeadStillNamesIt() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let head = try await queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
      let next = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
      let run = runner(queue)
      run.register(tag: "t") { _ in .failed("offline") }
      _ = try await run.run()
      guard case .waiting = try queue.task(head)?.status else {
        Issue.record("the head should wait for its retry")
        return
      }
      #expect(try queue.task(next)?.status == .waitingForGroup(behind: head))
    }
  }
}
