import FerryLog
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Batched handlers attacked as a hostile app would use them: a handler that asks for a task of
/// its own batch, another runner waiting for a task a batch defers, batches at the largest size.
@Suite(.timeLimit(.minutes(20))) struct BatchedHandlerEdgeTests {
  /// The starts and ends the log holds for each task, in log order.
  static func said(_ log: EventLog) throws -> [TaskID: [String]] {
    var said: [TaskID: [String]] = [:]
    for (_, event) in try log.forEachTaskEvent() {
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

  /// A batched handler that asks its runner to run another task of its own batch would wait for
  /// its own call's outcome: refused like a handler of one task asking for its own task (it used
  /// to wait for ever — until the time limit cancelled the whole batch).
  @Test func aBatchedHandlerAskingToRunATaskOfItsOwnBatchIsRefused() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let a = try await queue.add(tag: "note", payload: Item(name: "a"))
    let b = try await queue.add(tag: "note", payload: Item(name: "b"))
    let answers = Journal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: 8, timeLimit: .seconds(10)) { tasks in
      do {
        _ = try await run.run(.task(b))
        answers.note("ran")
      } catch FerryError.invalidArgument(_) {
        answers.note("refused")
      } catch {
        answers.note("threw \(error)")
      }
      return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
    }
    let pass = Task { try await run.run() }
    // A call stuck waiting for itself ends only when the store's clock passes its time limit.
    while answers.all.isEmpty {
      fixture.time += 60_000
      try await Task.sleep(for: .milliseconds(5))
    }
    let report = try await pass.value
    #expect(answers.all == ["refused"])
    #expect(report.batches.map(\.taskIds) == [[a, b]])
    #expect(report.succeeded == 2)
    #expect(try Self.said(queue.log)[b] == ["started", "succeeded"])
  }

  /// `run(.task(id))` of a task in another runner's batch waits for that batch and reports the
  /// task's outcome as the log says it: a deferral (no outcome from the batch handler) is a
  /// deferral, not an interruption.
  @Test func waitingForATaskAnotherRunnersBatchDefersReportsTheDeferral() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    // The waiting runner has no handler for the tag: arriving after the batch ended, it skips the
    // task (`noHandler`) instead of running it, and the round is tried again.
    let waiter = runner(queue)
    var outcome: RunOutcome?
    for _ in 0..<20 {
      let a = try await queue.add(tag: "note", payload: Item(name: "a"))
      let b = try await queue.add(tag: "note", payload: Item(name: "b"))
      let entered = Gate()
      let gate = Gate()
      let batching = runner(queue)
      batching.register(tag: "note", batchSize: 8) { tasks in
        entered.open()
        await gate.wait()
        // No outcome for b: deferred.
        return Dictionary(
          uniqueKeysWithValues: tasks.filter { $0.id != b }.map { ($0.id, TaskResult.succeeded) })
      }
      let pass = Task { try await batching.run() }
      await entered.wait()
      let waiting = Task { try await waiter.run(.task(b)).outcome(of: b) }
      // Only lets the batch end sooner or later: a waiter that comes late is told apart below.
      try await Task.sleep(for: .milliseconds(50))
      gate.open()
      let batchReport = try await pass.value
      #expect(batchReport.outcome(of: a) == .succeeded)
      #expect(batchReport.outcome(of: b) == .deferred(TaskRunner.noOutcome))
      let seen = try await waiting.value
      try await queue.cancel(b)
      if seen == .skipped(.noHandler) { continue }
      outcome = seen
      break
    }
    #expect(outcome == .deferred(TaskRunner.noOutcome))
  }

  /// A batch size of 1000 takes 1000 ready tasks of the tag in one call, as the spec says ("while
  /// there is room"): the search for other heads used to stop after 512 keys, so such a batch
  /// held at most 513 tasks.
  @Test func theLargestBatchIsFilledWhenThatManyTasksAreReady() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    var ids: [TaskID] = []
    for start in stride(from: 0, to: 1200, by: 100) {
      let added = try await withThrowingTaskGroup(of: TaskID.self) { adds in
        for n in start..<start + 100 {
          adds.addTask { try await queue.add(tag: "note", payload: Item(name: "\(n)")) }
        }
        var added: [TaskID] = []
        for try await id in adds { added.append(id) }
        return added
      }
      ids += added
    }
    ids.sort()
    let sizes = Journal()
    let run = runner(queue)
    run.register(tag: "note", batchSize: TaskRunner.maxBatchSize) { tasks in
      sizes.note("\(tasks.count)")
      return Dictionary(uniqueKeysWithValues: tasks.map { ($0.id, TaskResult.succeeded) })
    }
    let report = try await run.run()
    #expect(sizes.all == ["1000", "200"])
    #expect(report.batches.map(\.taskIds.count) == [1000, 200])
    #expect(report.batches.flatMap(\.taskIds) == ids, "the batches took the tasks in id order")
    #expect(report.succeeded == 1200)
    let said = try Self.said(queue.log)
    #expect(ids.allSatisfy { said[$0] == ["started", "succeeded"] })
  }
}

/// A batch-running process killed at its N-th commit — just before or just after it, so a claim
/// commit or an outcome commit lost or kept — then another process finishing the queue. The log
/// must show every task started and ended in turn (never two runs of it at once), one success
/// each, and each group's successes in group order, whatever the failures given back meanwhile.
@Suite(.timeLimit(.minutes(20))) struct BatchedHandlerKillTests {
  @Test(arguments: [CrashPoint.beforeCommit, CrashPoint.afterCommit], [2, 3, 4, 6, 9])
  func aKillAtAnyCommitNeverRunsATaskTwiceNorOutOfGroupOrder(point: String, after: Int) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await FerryStore.open(at: fixture.path)
    defer { store.close() }
    var groups: [String: [TaskID]] = [:]
    var all: [TaskID] = []
    for n in 0..<40 {
      let group: String? = n % 5 == 0 ? nil : "g\(n % 4)"
      let kind = n % 7 == 3 ? "fail" : "ok"
      let id = try await store.queue.add(tag: "note", payload: ["kind": kind], groupId: group)
      all.append(id)
      if let group { groups[group, default: []].append(id) }
    }
    let killed = try Child(
      "ferry-test-worker", ["batch-run", fixture.path, "6"],
      environment: ["FERRY_CRASH_POINT": point, "FERRY_CRASH_AFTER": "\(after)"])
    let status = try await killed.wait()
    #expect(status == 0 || status == SIGKILL, "\(killed.output.suffix(3))")
    print(
      "batch kill at \(point) #\(after): status \(status), \(killed.output.filter { $0.hasPrefix("batch ") }.count) calls"
    )
    let finisher = try Child("ferry-test-worker", ["batch-run", fixture.path, "6"])
    #expect(try await finisher.wait() == 0, "\(finisher.output.suffix(3))")
    #expect(try store.queue.pendingTasks().isEmpty)
    let said = try BatchedHandlerEdgeTests.said(store.log)
    for id in all {
      let runs = said[id] ?? []
      // Started, ended, started, ended…: a second start before an end would be two runs at once.
      let inTurn = runs.enumerated().allSatisfy { index, word in (word == "started") == (index % 2 == 0) }
      #expect(inTurn && runs.last == "succeeded", "task \(id): \(runs)")
      #expect(runs.filter { $0 == "succeeded" }.count == 1, "task \(id): \(runs)")
    }
    var successes: [TaskID] = []
    for (_, event) in try store.log.forEachTaskEvent() {
      if case .runSucceeded(let id, _) = event { successes.append(id) }
    }
    for (group, ids) in groups { #expect(successes.filter(ids.contains) == ids, "group \(group)") }
  }
}
