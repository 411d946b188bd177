import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// A store that has lived through many compactions keeps running tasks in this process while
/// other processes compact it and are killed part-way — inside the compaction's transaction, and
/// (with the write-ahead segment) in the checkpoint that follows it: nothing acknowledged is lost,
/// every task runs exactly as often as its handler asks, and verify stays healthy.
@Suite(.timeLimit(.minutes(20)), .serialized) struct LongLivedKillTests {
  @Test(arguments: [false, true]) func compactorsKilledBesideALongLivedRunner(segment: Bool) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore { $0.writeAheadSegment = segment }
    let runs = Mutex<[TaskID: Int]>([:])
    let runner = TaskRunner(queue: store.queue)
    let retry = RetryPolicy(maxAttempts: 5, initialDelay: .seconds(1), jitter: 0)
    runner.register(tag: "ok") { task in
      runs.withLock { $0[task.id, default: 0] += 1 }
      return .succeeded
    }
    runner.register(tag: "flaky", retry: retry) { task in
      runs.withLock { $0[task.id, default: 0] += 1 }
      return task.attempt == 1 ? .failed("again", retryable: true) : .succeeded
    }
    runner.register(tag: "stuck") { task in
      runs.withLock { $0[task.id, default: 0] += 1 }
      return task.attempt == 1 ? .recordError("fix me") : .succeeded
    }
    var expected: [TaskID: Int] = [:]
    let points =
      segment ? ["compaction", "segment.checkpointSynced", "segment.checkpointWritten"] : ["compaction"]
    var killed = 0
    let rounds = 24
    for round in 0..<rounds {
      // A compactor in another process, killed at a crash point, while this process works.
      let point = points[round % points.count]
      let input = Pipe()
      let compactor = try Child(
        "ferry-test-worker", ["compact-until-line", fixture.path, "7"] + (segment ? ["segment"] : []),
        stdin: input.fileHandleForReading,
        environment: ["FERRY_CRASH_POINT": point, "FERRY_CRASH_AFTER": "\(1 + round % 3)"])
      for cycle in 0..<4 {
        for error in try store.queue.errors() { try await store.queue.resolveError(error.taskId) }
        let g = "g\(round)-\(cycle)"
        expected[try await store.queue.add(tag: "ok", payload: ["r": round], groupId: g)] = 1
        expected[try await store.queue.add(tag: "ok", payload: ["r": round], groupId: g)] = 1
        expected[try await store.queue.add(tag: "flaky", payload: ["r": round])] = 2
        expected[try await store.queue.add(tag: "stuck", payload: ["r": round], groupId: "s")] = 2
        _ = try await runner.run()
        fixture.clock.advance(by: .seconds(2))
        _ = try await runner.run()
        try await store.ledger.recordFetch(key: "k\(cycle)", outcome: .success(isEmpty: false))
        _ = try await store.compact(retention: .zero)
      }
      try await waitForExit(compactor)
      try? input.fileHandleForWriting.close()
      if compactor.process.terminationReason == .uncaughtSignal { killed += 1 }
    }
    // Finish the work still queued (the last stuck task's error).
    for _ in 0..<3 {
      for error in try store.queue.errors() { try await store.queue.resolveError(error.taskId) }
      fixture.clock.advance(by: .seconds(2))
      _ = try await runner.run()
    }
    #expect(killed >= rounds / 2, "compactors killed: \(killed) of \(rounds)")
    let ran = runs.withLock { $0 }
    let pending = Set(try store.queue.pendingTasks().map(\.id))
    for (id, count) in expected where !pending.contains(id) {
      #expect(ran[id] == count, "task \(id) ran \(ran[id] ?? 0) times, expected \(count)")
    }
    #expect(pending.isEmpty, "still queued: \(pending.sorted())")
    // What the log still holds never shows a task succeeding twice.
    var succeeded: [TaskID: Int] = [:]
    try store.log.forEachEvent { event in
      if event.type == "task.runSucceeded", case .runSucceeded(let id, _)? = try? TaskEvent(event) {
        succeeded[id, default: 0] += 1
      }
    }
    #expect(succeeded.values.allSatisfy { $0 == 1 })
    let report = try store.log.verify()
    #expect(report.isHealthy, "\(report.problems)")
    let live = try store.log.read { try FerryStore.snapshot(of: $0) }
    _ = try await store.log.rebuild()
    #expect(try store.log.read { try FerryStore.snapshot(of: $0) } == live)
    let head = try store.log.head()
    // Alone now: a compactor killed inside its compaction, or (segment) after it committed and
    // before its checkpoint's header; the next open finds the same state.
    store.close()
    for (point, after) in points.map({ ($0, $0 == "compaction" ? 1 : 2) }) {
      let stdin = Pipe()
      let compactor = try Child(
        "ferry-test-worker", ["compact-until-line", fixture.path, "7"] + (segment ? ["segment"] : []),
        stdin: stdin.fileHandleForReading,
        environment: ["FERRY_CRASH_POINT": point, "FERRY_CRASH_AFTER": "\(after)"])
      defer { try? stdin.fileHandleForWriting.close() }
      try await waitForExit(compactor)
      #expect(
        compactor.process.terminationReason == .uncaughtSignal, "\(point): \(compactor.output.suffix(3))")
      let reopened = try await fixture.openStore { $0.writeAheadSegment = segment }
      #expect(try reopened.log.read { try FerryStore.snapshot(of: $0) } == live, "after a kill at \(point)")
      #expect(try reopened.log.verify().isHealthy, "after a kill at \(point)")
      reopened.close()
    }
    print(
      "long-lived runner (segment \(segment)): \(killed) compactors killed, \(expected.count) tasks, head \(head)"
    )
  }
}
