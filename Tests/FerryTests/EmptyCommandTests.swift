import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Commands that write nothing, racing another process's appends and after a compaction that
/// removed everything.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct EmptyCommandTests {
  // MARK: Empty commands racing another process

  /// Empty commands (a pass with nothing it may run, a pause that changes nothing) in a tight loop
  /// while another process appends: the store verifies healthy, and reopening it twice writes
  /// nothing (no catch-up or rebuild was left for the next open).
  @Test func emptyCommandsRacingAnotherProcessesAppends() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    let queue = store.queue
    try await queue.add(tag: "nobody", payload: ["n": 0])
    let runner = TaskRunner(queue: queue)
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "150"])
    let appender = try Child("ferry-test-worker", ["add-tasks", fixture.path, "150"])
    var empties = 0
    while adder.process.isRunning || appender.process.isRunning {
      _ = try await runner.run()  // "app" and "nobody" tasks: no handler: appends nothing
      _ = try await queue.log.execute { _ in 0 }
      try await queue.resume()  // not paused: appends nothing
      empties += 3
    }
    _ = try await adder.wait()
    _ = try await appender.wait()
    #expect(adder.output.filter { $0.hasPrefix("ack ") }.count == 150)
    // A last empty command after the other process is gone.
    _ = try await queue.log.execute { _ in 0 }
    let head = try queue.log.head()
    #expect(
      try queue.pendingTasks(tag: "app").count == 300, "the queue projection missed another process's adds")
    store.close()
    let verify = try Child("ferry", ["verify", fixture.path])
    #expect(try await verify.wait() == 0, "\(verify.output)")
    let first = try await FerryStore.open(at: fixture.path)
    let t1 = try first.log.storageInfo().lastTransaction
    #expect(try first.log.head() == head)
    first.close()
    let second = try await FerryStore.open(at: fixture.path)
    let t2 = try second.log.storageInfo().lastTransaction
    second.close()
    print("EmptyCommandTests: \(empties) empty commands; lastTransaction after opens \(t1), \(t2)")
    #expect(t1 == t2, "a second open wrote to the store")
  }

  /// Empty commands right after a compaction that removed everything (the head is only in the
  /// compaction state): positions never fall behind the head, verify is healthy.
  @Test func emptyCommandsAfterCompactingEverything() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let store = try await FerryStore.open(at: fixture.path)
      let runner = TaskRunner(queue: store.queue)
      runner.register(tag: "t") { _ in .succeeded }
      for n in 0..<50 { try await store.queue.add(tag: "t", payload: ["n": n]) }
      _ = try await runner.run()
      _ = try await store.compact(retention: .milliseconds(0))
      _ = try await store.log.execute { _ in 0 }
      _ = try await runner.run()
      store.close()
    }
    let adder = try Child("ferry-test-worker", ["add-tasks", fixture.path, "20"])
    let store = try await FerryStore.open(at: fixture.path)
    while adder.process.isRunning { _ = try await store.log.execute { _ in 0 } }
    _ = try await adder.wait()
    _ = try await store.log.execute { _ in 0 }
    store.close()
    let compact = try Child("ferry", ["compact", fixture.path, "--retention", "0"])
    #expect(try await compact.wait() == 0)
    let verify = try Child("ferry", ["verify", fixture.path])
    #expect(try await verify.wait() == 0, "\(verify.output)")
    let reopened = try await TaskQueue.open(at: fixture.path)
    defer { reopened.close() }
    #expect(try reopened.pendingTasks(tag: "app").count == 20)
  }
}
