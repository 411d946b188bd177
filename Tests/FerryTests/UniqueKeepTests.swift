import FerryLog
import Foundation
import TestSupport
import Testing

@testable import Ferry

/// An add with `unique: .keep` keeps only a twin that will still run: a dead twin never swallows
/// a newer change (`Specs/task-events.md` §3.2, §4.1; projection version 6).
@Suite(.timeLimit(.minutes(20))) struct UniqueKeepTests {
  @Test func aDeadTwinDoesNotKeepANewerChangeOut() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let run = runner(queue)
      run.register(tag: "save") { _ in .failed("refused", retryable: false) }
      let dead = try await queue.add(
        tag: "save", payload: Item(name: "v1"), dataId: "note-1", options: [.unique(.keep)])
      _ = try await run.run()
      #expect(try queue.task(dead)?.status == .dead)

      let newer = try await queue.add(
        tag: "save", payload: Item(name: "v2"), dataId: "note-1", options: [.unique(.keep)])
      #expect(newer != dead)
      // The dead twin stays, dead and visible; the newer change is queued after it.
      #expect(try queue.pendingTasks(dataId: "note-1").map(\.id) == [dead, newer])
      #expect(try queue.task(dead)?.status == .dead)
      #expect(try queue.payload(of: newer, as: Item.self) == Item(name: "v2"))
      // A third keep add keeps the live twin.
      let third = try await queue.add(
        tag: "save", payload: Item(name: "v3"), dataId: "note-1", options: [.unique(.keep)])
      #expect(third == newer)
      // The fold agrees with the command: a rebuild from the log gives the same queue.
      try expectConsistent(queue)
    }
  }

  @Test func aBlockedTwinStillKeeps() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let blocked = try await queue.add(
        tag: "save", payload: Item(name: "v1"), dataId: "n", options: [.unique(.keep)])
      try await queue.recordError(blocked, message: "log in")
      let again = try await queue.add(
        tag: "save", payload: Item(name: "v2"), dataId: "n", options: [.unique(.keep)])
      #expect(again == blocked)
      #expect(try queue.pendingTasks().map(\.id) == [blocked])
      try expectConsistent(queue)
    }
  }
}
