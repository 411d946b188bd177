@_spi(Engine) import Ferry
import FerryLog
import Foundation
import Testing

/// A finished or cancelled task leaves no row behind in any of the queue's tables, whatever it went
/// through: the removal skips the deletes of rows a task cannot have (a `ready` row for a task that
/// is not ready, an `errors` row for one that never had an error), and this shows it skips no more.
@Suite(.timeLimit(.minutes(20))) struct RemovalTests {
  static let tables = [
    "tasks", "ready", "waiting", "running", "groups", "unique", "errors", "payloads", "deadlines",
  ]

  func rows(_ queue: TaskQueue) throws -> [String: Int] {
    try queue.log.read { view in
      var counts: [String: Int] = [:]
      for table in Self.tables { counts[table] = try view.tables(of: "taskQueue").count(table) }
      return counts
    }
  }

  @Test func everyWayATaskEndsLeavesNoRow() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }

    // Succeeds after an error recorded and resolved (an `errors` row existed and was deleted on
    // resolve; the count stays raised).
    let resolved = try await queue.add(tag: "ok", payload: Item(name: "a"), dataId: "d1")
    _ = try await queue.recordError(resolved, message: "fix me")
    // Cancelled while blocked by an error (its `errors` row is still there).
    let blocked = try await queue.add(tag: "ok", payload: Item(name: "b"), groupId: "g")
    _ = try await queue.recordError(blocked, message: "still broken")
    // Cancelled while ready and not the head of its group, and one cancelled as head.
    let behind = try await queue.add(tag: "ok", payload: Item(name: "c"), groupId: "g")
    let head = try await queue.add(tag: "ok", payload: Item(name: "d"), groupId: "h")
    let second = try await queue.add(tag: "ok", payload: Item(name: "e"), groupId: "h")
    // Fails once (waiting for its retry), then cancelled.
    let waiting = try await queue.add(tag: "flaky", payload: Item(name: "f"))
    // Cancelled while ready, with its `ready` row.
    let plain = try await queue.add(tag: "ok", payload: Item(name: "g"))
    let readyBefore = try rows(queue)["ready"] ?? 0
    try await queue.cancel(plain)
    #expect(try rows(queue)["ready"] == readyBefore - 1)

    var counts = try rows(queue)
    #expect(counts["errors"] == 2)
    try await queue.resolveError(resolved)
    counts = try rows(queue)
    #expect(counts["errors"] == 1)
    #expect((counts["ready"] ?? 0) >= 2)

    let run = runner(queue)
    run.register(tag: "ok") { _ in .succeeded }
    run.register(tag: "flaky", retry: RetryPolicy(initialDelay: .seconds(3600))) { _ in .failed("offline") }
    // The queue's first pass: `resolved` succeeds, `head` and `second` (group h) succeed in order,
    // `waiting` fails and waits an hour; group g stays blocked behind `blocked`.
    _ = try await run.run()
    #expect(try queue.task(resolved) == nil)
    #expect(try queue.task(head) == nil)
    #expect(try queue.task(second) == nil)
    guard case .waiting = try queue.task(waiting)?.status else {
      Issue.record(
        "the failed task is not waiting for its retry: \(String(describing: try queue.task(waiting)))")
      return
    }
    #expect(try queue.task(behind) != nil)
    #expect(try rows(queue)["waiting"] == 1)

    try await queue.cancel(behind)
    try await queue.cancel(blocked)
    try await queue.cancel(waiting)
    for (table, count) in try rows(queue) { #expect(count == 0, "\(count) rows left in \(table)") }
    try expectConsistent(queue)
  }
}
