import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The task-queue events of the log, in order.
private func taskEvents(_ log: EventLog) throws -> [(sequence: UInt64, event: TaskEvent)] {
  try log.events(after: 0, limit: 1_000_000).compactMap { logged in
    guard TaskEvent.typeSet.contains(logged.type) else { return nil }
    return (logged.sequence, try TaskEvent(logged))
  }
}

/// What the log says each task's runs ended with: "started", "succeeded", "failed", … in order.
private func history(_ log: EventLog) throws -> [TaskID: [String]] {
  var said: [TaskID: [String]] = [:]
  for (_, event) in try taskEvents(log) {
    switch event {
    case .runStarted(let id, _, _, _, _): said[id, default: []].append("started")
    case .runSucceeded(let id, _): said[id, default: []].append("succeeded")
    case .runFailed(let id, _, _, _): said[id, default: []].append("failed")
    case .runInterrupted(let id): said[id, default: []].append("interrupted")
    case .runDeferred(let id, _): said[id, default: []].append("deferred")
    case .errorRecorded(let id, _, true): said[id, default: []].append("error")
    default: continue
    }
  }
  return said
}

/// The ids of the batches a handler was called with, in call order.
final class BatchJournal: Sendable {
  private let calls = Mutex<[[TaskID]]>([])
  func note(_ tasks: [RunningTask]) { calls.withLock { $0.append(tasks.map(\.id)) } }
  var all: [[TaskID]] { calls.withLock { $0 } }
}

@Suite(.timeLimit(.minutes(20))) struct BatchedHandlerTests {
  @Test func aBatchTakesUpToItsSizeAndLogsTheOutcomeItWasGivenForEachTask() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var ids: [TaskID] = []
    for n in 0..<40 { ids.append(try await queue.add(tag: "note", payload: Item(name: "\(n)"))) }
    let journal = BatchJournal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 16) { tasks in
      journal.note(tasks)
      var results: [TaskID: TaskResult] = [:]
      for task in tasks {
        let n = Int(try task.payload(as: Item.self).name) ?? -1
        switch n % 10 {
        case 3: results[task.id] = .failed("rejected", retryable: false)
        case 7: results[task.id] = .recordError("needs the user")
        default: results[task.id] = .succeeded(output: try TaskOutput("srv-\(n)"), invalidating: ["notes"])
        }
      }
      return results
    }
    let report = try await run.run()
    #expect(journal.all == [Array(ids[0..<16]), Array(ids[16..<32]), Array(ids[32..<40])])
    #expect(report.batches.map(\.taskIds) == journal.all)
    #expect(report.batches.allSatisfy { $0.tag == "note" })
    #expect(report.succeeded == 32)
    #expect(report.failed == 4)
    #expect(report.errorsRecorded == 4)
    let said = try history(queue.log)
    for (n, id) in ids.enumerated() {
      let end = n % 10 == 3 ? "failed" : n % 10 == 7 ? "error" : "succeeded"
      #expect(said[id] == ["started", end], "task \(n): \(said[id] ?? [])")
      if end == "succeeded" { #expect(try queue.output(of: id)?.decode(as: String.self) == "srv-\(n)") }
    }
    #expect(try queue.pendingTasks().count == 8)  // 4 dead, 4 blocked
  }

  @Test func aTaskTheHandlerGaveNoOutcomeForIsDeferredWithItsAttemptGivenBack() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let a = try await queue.add(tag: "note", payload: Item(name: "a"))
    let b = try await queue.add(tag: "note", payload: Item(name: "b"))
    let forget = Mutex(true)
    let run = runner(queue)
    run.register(tag: "note", batchSize: 8, retry: RetryPolicy(maxAttempts: 1)) { tasks in
      let skip = forget.withLock { $0 }
      return Dictionary(
        uniqueKeysWithValues: tasks.filter { !skip || $0.id != b }.map { ($0.id, TaskResult.succeeded) })
    }
    let first = try await run.run()
    #expect(first.entries.first { $0.taskId == b }?.outcome == .deferred(TaskRunner.noOutcome))
    #expect(try history(queue.log)[b] == ["started", "deferred"])
    #expect(try queue.task(b)?.attemptsSpent == 0)
    // Its one attempt was given back: it may still run (a limit of one attempt is not used up).
    forget.withLock { $0 = false }
    run.conditionsChanged()
    let second = try await run.run()
    #expect(second.entries.map(\.taskId) == [b])
    #expect(try history(queue.log)[b] == ["started", "deferred", "started", "succeeded"])
    #expect(try history(queue.log)[a] == ["started", "succeeded"])
  }

  @Test func aThrowFailsEveryTaskOfTheBatchRetryably() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var ids: [TaskID] = []
    for n in 0..<5 { ids.append(try await queue.add(tag: "note", payload: Item(name: "\(n)"))) }
    struct ServerDown: Error {}
    let run = runner(queue)
    run.register(tag: "note", batchSize: 8) { _ in throw ServerDown() }
    let report = try await run.run()
    #expect(report.failed == 5)
    for (_, event) in try taskEvents(queue.log) {
      if case .runFailed(_, let message, let retryable, let next) = event {
        #expect(retryable && next != nil && message.contains("ServerDown"))
      }
    }
    #expect(try history(queue.log).values.allSatisfy { $0 == ["started", "failed"] })
  }

  @Test func aTimeLimitCoversTheWholeBatch() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    for n in 0..<3 { try await queue.add(tag: "note", payload: Item(name: "\(n)")) }
    let entered = Gate()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 8, timeLimit: .seconds(10)) { _ in
      entered.open()
      try await Task.sleep(for: .seconds(3600))  // real time: only cancellation ends it
      return [:]
    }
    async let pass = run.run()
    await entered.wait()
    // The store's clock passes the limit: the call is cancelled, and every task of it fails.
    await fixture.clock.waitForSleepers()
    fixture.time += 10_000
    let report = try await pass
    #expect(report.failed == 3)
    #expect(report.batches.count == 1)
    #expect(
      report.entries.allSatisfy {
        if case .failed(let message, _) = $0.outcome { return message == "timed out after 10 s" }
        return false
      })
  }

  @Test func tasksOfOtherTagsKeepTheirTurnBesideBatches() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var notes: [TaskID] = []
    var others: [TaskID] = []
    for n in 0..<30 {
      if n % 3 == 0 {
        others.append(try await queue.add(tag: "other", payload: Item(name: "\(n)")))
      } else {
        notes.append(try await queue.add(tag: "note", payload: Item(name: "\(n)")))
      }
    }
    let journal = BatchJournal()
    let singles = Journal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 4) { tasks in
      journal.note(tasks)
      return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
    }
    run.register(tag: "other") { task in
      singles.note("\(task.id)")
      return .succeeded
    }
    let report = try await run.run()
    #expect(report.succeeded == 30)
    #expect(journal.all.flatMap { $0 } == notes)
    #expect(journal.all.allSatisfy { $0.count <= 4 })
    #expect(singles.all == others.map { "\($0)" })
    #expect(try history(queue.log).values.allSatisfy { $0 == ["started", "succeeded"] })
  }
}

@Suite(.timeLimit(.minutes(20))) struct BatchGroupOrderTests {
  @Test func consecutiveTasksOfAGroupShareABatchInGroupOrder() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var g: [TaskID] = []
    var h: [TaskID] = []
    var loose: [TaskID] = []
    for n in 0..<5 {
      g.append(try await queue.add(tag: "note", payload: Item(name: "g\(n)"), groupId: "g"))
      if n < 3 { h.append(try await queue.add(tag: "note", payload: Item(name: "h\(n)"), groupId: "h")) }
      if n < 2 { loose.append(try await queue.add(tag: "note", payload: Item(name: "u\(n)"))) }
    }
    let journal = BatchJournal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 16) { tasks in
      journal.note(tasks)
      return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
    }
    _ = try await run.run()
    // The first task, the rest of its group, then the other heads in id order, each with its group.
    #expect(journal.all == [g + h + loose])
    // Each group's successes were logged in group order.
    var successes: [TaskID] = []
    for (_, event) in try taskEvents(queue.log) {
      if case .runSucceeded(let id, _) = event { successes.append(id) }
    }
    #expect(successes.filter(g.contains) == g)
    #expect(successes.filter(h.contains) == h)
  }

  @Test func aTaskThatDoesNotSucceedGivesBackTheRestOfItsGroupWhateverTheHandlerSaid() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var g: [TaskID] = []
    var h: [TaskID] = []
    for n in 0..<6 {
      g.append(try await queue.add(tag: "note", payload: Item(name: "g\(n)"), groupId: "g"))
      if n < 3 { h.append(try await queue.add(tag: "note", payload: Item(name: "h\(n)"), groupId: "h")) }
    }
    let failing = Mutex(true)
    let journal = BatchJournal()
    let run = runner(queue)
    let third = g[2]
    run.register(tag: "note", batchSize: 16) { tasks in
      journal.note(tasks)
      let fail = failing.withLock { $0 }
      var results: [TaskID: TaskResult] = [:]
      for task in tasks {
        // The third of g fails; the handler says the rest of g succeeded all the same.
        results[task.id] = fail && task.id == third ? .failed("conflict") : .succeeded
      }
      return results
    }
    let first = try await run.run()
    #expect(journal.all == [g + h])
    let said = try history(queue.log)
    #expect(said[g[0]] == ["started", "succeeded"])
    #expect(said[g[1]] == ["started", "succeeded"])
    #expect(said[g[2]] == ["started", "failed"])
    for id in g[3...] {
      #expect(said[id] == ["started", "interrupted"], "task \(id): \(said[id] ?? [])")
      #expect(first.entries.first { $0.taskId == id }?.outcome == .skipped(.partOfFailedGroup))
      #expect(try queue.task(id)?.attemptsSpent == 0)
    }
    for id in h { #expect(said[id] == ["started", "succeeded"]) }
    // After the backoff the group goes on from its failed task, in one batch, in order.
    failing.withLock { $0 = false }
    fixture.time += 60_000
    let second = try await run.run()
    #expect(journal.all.last == Array(g[2...]))
    #expect(second.succeeded == 4)
    var successes: [TaskID] = []
    for (_, event) in try taskEvents(queue.log) {
      if case .runSucceeded(let id, _) = event { successes.append(id) }
    }
    #expect(successes.filter(g.contains) == g)
    #expect(Set(successes).count == successes.count)
    #expect(try queue.pendingTasks().isEmpty)
  }

  @Test func aGroupTaskOfAnotherTagEndsItsGroupsShareOfTheBatch() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let a = try await queue.add(tag: "note", payload: Item(name: "a"), groupId: "g")
    let b = try await queue.add(tag: "note", payload: Item(name: "b"), groupId: "g")
    let c = try await queue.add(tag: "photo", payload: Item(name: "c"), groupId: "g")
    let d = try await queue.add(tag: "note", payload: Item(name: "d"), groupId: "g")
    let journal = BatchJournal()
    let order = Journal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 16) { tasks in
      journal.note(tasks)
      for task in tasks { order.note("\(task.id)") }
      return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
    }
    run.register(tag: "photo") { task in
      order.note("\(task.id)")
      return .succeeded
    }
    _ = try await run.run()
    #expect(journal.all == [[a, b], [d]])
    #expect(order.all == [a, b, c, d].map { "\($0)" })
  }
}

/// Two runners of this process and a runner process on one store, batched: the log shows every
/// task started once and succeeded once, each group's successes in group order.
@Suite(.timeLimit(.minutes(20))) struct BatchCompanyTests {
  @Test func twoRunnersAndAnotherProcessNeverRunABatchedTaskTwice() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    var groups: [String: [TaskID]] = [:]
    var all: [TaskID] = []
    for n in 0..<300 {
      let group: String? = n % 4 == 0 ? nil : "g\(n % 9)"
      let id = try await store.queue.add(tag: "note", payload: ["n": "\(n)"], groupId: group)
      all.append(id)
      if let group { groups[group, default: []].append(id) }
    }
    let child = try Child("ferry-test-worker", ["batch-run", fixture.path, "8"])
    let runners = (0..<2).map { _ in
      var configuration = TaskRunner.Configuration()
      configuration.maxConcurrentTasks = 3
      return TaskRunner(queue: store.queue, configuration: configuration)
    }
    for runner in runners {
      runner.register(tag: "note", batchSize: 8) { tasks in
        await Task.yield()
        return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
      }
    }
    try await withThrowingTaskGroup(of: Void.self) { passes in
      for runner in runners {
        passes.addTask {
          for _ in 0..<50 where try !store.queue.pendingTasks().isEmpty { _ = try await runner.run() }
        }
      }
      try await passes.waitForAll()
    }
    let status = try await child.wait()
    #expect(status == 0, "\(child.output.suffix(3))")
    #expect(try store.queue.pendingTasks().isEmpty)
    let said = try history(store.log)
    for id in all { #expect(said[id] == ["started", "succeeded"], "task \(id): \(said[id] ?? [])") }
    var successes: [TaskID] = []
    for (_, event) in try taskEvents(store.log) {
      if case .runSucceeded(let id, _) = event { successes.append(id) }
    }
    for (group, ids) in groups { #expect(successes.filter(ids.contains) == ids, "group \(group)") }
    let childBatches = child.output.filter { $0.hasPrefix("batch ") }
    print("batch company: \(all.count) tasks; the other process ran \(childBatches.count) batches")
  }
}

/// A runner process killed in the middle of a batch: after its runs are interrupted, the batch is
/// sent again, whole, with the same idempotency keys, and every task succeeds once.
@Suite(.timeLimit(.minutes(20))) struct BatchKillTests {
  @Test func aBatchCutShortByAKillIsSentAgainWithTheSameKeys() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    var ids: [TaskID] = []
    for n in 0..<40 {
      let kind = n == 5 ? "crash" : "ok"
      ids.append(try await store.queue.add(tag: "note", payload: ["kind": kind], groupId: "g\(n % 3)"))
    }
    let killed = try Child("ferry-test-worker", ["batch-run", fixture.path, "16", "kill"])
    let status = try await killed.wait()
    #expect(
      status == SIGKILL && killed.process.terminationReason == .uncaughtSignal, "\(killed.output.suffix(3))")
    let cut = try #require(killed.output.last { $0.hasPrefix("batch ") })
    let finisher = try Child("ferry-test-worker", ["batch-run", fixture.path, "16"])
    #expect(try await finisher.wait() == 0, "\(finisher.output.suffix(3))")
    let resent = try #require(finisher.output.first { $0.hasPrefix("batch ") })
    // The same tasks, in the same order, with the same keys; attempt 2 (the first was interrupted).
    func parts(_ line: String) -> [(id: String, attempt: String, key: String)] {
      line.split(separator: " ").dropFirst().map { item in
        let fields = item.split(separator: ":").map(String.init)
        return (fields[0], fields.count > 1 ? fields[1] : "", fields.count > 2 ? fields[2] : "")
      }
    }
    let before = parts(cut)
    let after = parts(resent)
    #expect(before.count == 16)
    #expect(before.map(\.id) == after.map(\.id))
    #expect(before.map(\.key) == after.map(\.key))
    #expect(before.allSatisfy { $0.attempt == "1" } && after.allSatisfy { $0.attempt == "2" })
    let said = try history(store.log)
    let cutIds = Set(before.compactMap { TaskID($0.id) })
    for id in ids {
      let expected =
        cutIds.contains(id) ? ["started", "interrupted", "started", "succeeded"] : ["started", "succeeded"]
      #expect(said[id] == expected, "task \(id): \(said[id] ?? [])")
    }
    #expect(try store.queue.pendingTasks().isEmpty)
    #expect(try store.queue.task(ids[0])?.attemptsSpent ?? 0 == 0)
  }
}
