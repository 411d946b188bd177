import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Tasks a runner has no handler for: registering during a pass, two runners with different
/// handler sets, and what a pass over many such tasks costs.
///
/// A test marked "Regression:" failed on the code before its fix.
@Suite(.timeLimit(.minutes(20)), .serialized) struct UnhandledTaskTests {
  // MARK: The memory of unhandled tasks

  /// Regression: register() while a claim command of a pass is in flight. The command was built with
  /// the handler set from before register() (the pass's `handlerInfo` snapshot), so it skips the
  /// tag's tasks as `noHandler`; the pass then inserts them into `UnhandledTasks` *after*
  /// register() called `forget()`. From then on every pass passes them over silently (not even
  /// reported), and automatic running never runs them: tasks with a registered handler are
  /// skipped forever, until some unrelated register() happens.
  @Test func registerDuringAPassLeavesTasksSkippedForever() async throws {
    var leftBehind: [(round: Int, count: Int)] = []
    for round in 0..<3 {
      let fixture = QueueFixture()
      defer { fixture.remove() }
      let queue = try await fixture.open()
      defer { queue.close() }
      // Many tasks of a tag nobody handles yet: each claim command reads 512 of them (long enough
      // for a register() to land while one is in the writer).
      let events = (0..<6000).map { n in
        TaskEvent.added(
          tag: "x", payload: Array("{\"n\":\(n)}".utf8), dataId: nil, groupId: nil, manual: false,
          unique: .append
        ).newEvent
      }
      _ = try await queue.log.append(events)
      // Many lanes: the runs share commits, so the 18,000 runs stay short on a loaded disk.
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = 16
      let runner = TaskRunner(queue: queue, configuration: configuration)
      let pass = Task { try await runner.run() }
      try await Task.sleep(for: .microseconds(Int.random(in: 200...3000)))
      runner.register(tag: "x") { _ in .succeeded }
      _ = try await pass.value
      // Two more passes with the handler in place: every x task must run.
      _ = try await runner.run()
      let last = try await runner.run()
      let left = try queue.pendingTasks(tag: "x").count
      if left > 0 {
        leftBehind.append((round, left))
        #expect(last.entries.isEmpty, "they are not even reported")
      }
    }
    #expect(leftBehind.isEmpty, "x tasks never run after register(): \(leftBehind)")
  }

  /// Passes: a tag handled only by another runner instance of the same queue: this runner reports
  /// its tasks once, the other runs them; after this runner registers the tag too, nothing of
  /// it is stuck.
  @Test func twoRunnersWithDifferentHandlerSets() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var config = TaskRunner.Configuration()
    config.maxConcurrentTasks = 4
    let a = TaskRunner(queue: queue, configuration: config)
    let b = TaskRunner(queue: queue, configuration: config)
    let ran = Mutex<[TaskID: Int]>([:])
    let handler: @Sendable (RunningTask) async throws -> TaskResult = { task in
      ran.withLock { $0[task.id, default: 0] += 1 }
      try? await Task.sleep(for: .microseconds(Int.random(in: 0...500)))
      return .succeeded
    }
    a.register(tag: "a", handler: handler)
    b.register(tag: "b", handler: handler)
    var ids: [TaskID] = []
    for n in 0..<200 {
      ids.append(
        try await queue.add(
          tag: n % 2 == 0 ? "a" : "b", payload: ["n": n], groupId: n % 3 == 0 ? "g\(n % 4)" : nil))
    }
    let noHandlerReports = Mutex<[TaskID: Int]>([:])
    for _ in 0..<20 {
      async let ra = a.run()
      async let rb = b.run()
      for report in [try await ra, try await rb] {
        for e in report.entries where e.outcome == .skipped(.noHandler) {
          noHandlerReports.withLock { $0[e.taskId, default: 0] += 1 }
        }
      }
      if try queue.pendingTasks().isEmpty { break }
    }
    let leftOver = try queue.pendingTasks().map(\.id)
    #expect(leftOver.isEmpty, "left: \(leftOver)")
    #expect(ran.withLock { $0.values.allSatisfy { $0 == 1 } && $0.count == ids.count })
    #expect(
      noHandlerReports.withLock { $0.values.allSatisfy { $0 == 1 } },
      "a task was reported noHandler twice by one runner")
  }

  // MARK: Cost of a pass

  /// Measures: tasks of a tag this runner has no handler for (another process's tags, say) are
  /// walked and reported by every pass — a pass over 20,000 of them and 1 runnable task reads all
  /// 20,001; with automatic running that happens after every add.
  @Test func aPassWalksEveryTaskItHasNoHandlerFor() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let batch = (0..<20_000).map { n in
      TaskEvent.added(
        tag: "other", payload: Array("{\"n\":\(n)}".utf8), dataId: nil, groupId: nil, manual: false,
        unique: .append
      ).newEvent
    }
    let batchFirst = try #require(try await queue.log.append(batch).first)
    let runnable = try await queue.add(tag: "t", payload: ["n": 1])
    let runner = TaskRunner(queue: queue)
    runner.register(tag: "t") { _ in .succeeded }
    let start = ContinuousClock.now
    let report = try await runner.run()
    let elapsed = ContinuousClock.now - start
    #expect(report.outcome(of: runnable) == .succeeded)
    print(
      "UnhandledTaskTests: a pass with 20,000 handler-less tasks reported \(report.entries.count) entries in \(elapsed)"
    )
    #expect(report.outcome(of: TaskID(rawValue: batchFirst)) == .skipped(.noHandler))
    let again = ContinuousClock.now
    let second = try await runner.run()
    print("UnhandledTaskTests: the next pass (nothing to run) took \(ContinuousClock.now - again)")
    // Reported once, then passed over by their index key alone until a handler is registered.
    #expect(second.entries.isEmpty)
    runner.register(tag: "other") { _ in .succeeded }
    #expect(try await runner.run().succeeded == 20_000)
  }
}
