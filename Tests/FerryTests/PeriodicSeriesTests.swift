import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The repeating tasks of the log still queued, by the log's adds and the queue's rows.
private func queuedRepeating(_ queue: TaskQueue) throws -> [TaskID] {
  let queued = Set(try queue.pendingTasks().map(\.id))
  return try repeatingAdds(queue.log).map(\.id).filter(queued.contains)
}

/// A hostile user of repeating tasks: cancels by tag or group while a repetition runs, revives a
/// dead repetition after a launch restarted the series, compacts and rebuilds with series in
/// flight. A series must never be doubled, lost or go on after it was cancelled (read from the log).
@Suite(.timeLimit(.minutes(20))) struct PeriodicSeriesTests {
  /// `cancel(tag:)` is how an app stops "sync every minute" (a repeating task has no group). A
  /// repetition that runs at that moment must not add the next one when it succeeds; `clear()`
  /// must not let it either.
  @Test(arguments: ["tag", "clear"])
  func aBulkCancelDuringARunEndsTheSeries(by selection: String) async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let started = Gate()
      let release = Gate()
      let run = runner(queue)
      run.register(tag: "sync") { _ in
        started.open()
        await release.wait()
        return .succeeded
      }
      let id = try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(60)))])
      let pass = Task { try await run.run() }
      await started.wait()
      if selection == "tag" {
        let report = try await queue.cancel(tag: "sync")
        #expect(report.cancelled == [id], "a repeating task is cancelled even while it runs")
        #expect(report.running.isEmpty)
      } else {
        try await queue.clear()
      }
      #expect(try queue.task(id) == nil)
      release.open()
      #expect(try await pass.value.outcome(of: id) == .succeeded)
      #expect(try repeatingAdds(queue.log).map(\.id) == [id], "the success added no repetition")
      #expect(try queue.pendingTasks().isEmpty)
      fixture.time += 3_600_000
      #expect(try await run.run().entries.isEmpty)
      try expectConsistent(queue)
    }
  }

  /// A task that repeats and one that does not, both of a tag, both running at a bulk cancel: the
  /// one-off is left to its run as documented; the series ends.
  @Test func aBulkCancelLeavesARunningOneOffAlone() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let started = Atomic<Int>(0)
      let release = Gate()
      let run = runner(queue) { $0.maxConcurrentTasks = 2 }
      run.register(tag: "sync") { _ in
        started.add(1, ordering: .relaxed)
        await release.wait()
        return .succeeded
      }
      let series = try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(60)))])
      let once = try await queue.add(tag: "sync", payload: Item(name: "now"))
      let pass = Task { try await run.run() }
      try await pollUntil { started.load(ordering: .relaxed) == 2 }
      let report = try await queue.cancel(tag: "sync")
      #expect(report.cancelled == [series])
      #expect(report.running == [once])
      release.open()
      #expect(try await pass.value.succeeded == 2)
      #expect(try queue.pendingTasks().isEmpty)
      #expect(try repeatingAdds(queue.log).map(\.id) == [series])
      try expectConsistent(queue)
    }
  }

  /// The app registers its periodic sync at every launch with `keep`. A repetition dies; at the
  /// next launch the dead twin keeps nothing out, so a new series starts; then the user revives
  /// the dead one. Its success must not leave two series running side by side.
  @Test func aRevivedDeadRepetitionDoesNotDoubleARestartedSeries() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      func register() async throws -> TaskID {
        try await queue.add(
          tag: "sync", payload: Item(name: "inbox"), dataId: "inbox",
          options: [.unique(.keep), .schedule(.every(.seconds(60)))])
      }
      let refuse = Atomic<Bool>(true)
      let run = runner(queue)
      run.register(tag: "sync") { _ in
        refuse.exchange(false, ordering: .relaxed) ? .failed("account locked", retryable: false) : .succeeded
      }
      let dead = try await register()
      #expect(try await run.run().outcome(of: dead) == .failed("account locked", retryAt: nil))
      let restarted = try await register()
      #expect(restarted != dead, "a dead twin keeps nothing out")
      #expect(try await run.run().outcome(of: restarted) == .succeeded)
      try await queue.revive(dead)
      #expect(try await run.run().outcome(of: dead) == .succeeded)
      // Ten intervals: one run each, of one series.
      for _ in 0..<10 {
        fixture.time += 60_000
        _ = try await run.run()
        #expect(try queuedRepeating(queue).count == 1)
      }
      var starts = 0
      try queue.log.forEachEvent { if $0.type == "task.runStarted" { starts += 1 } }
      #expect(starts == 3 + 10, "two runs of the first, one of the restarted, then one per interval")
      try expectConsistent(queue)
    }
  }

  /// While a repetition runs: an add with `replace` starts the one series that goes on (the
  /// running one adds none), an add with `keep` keeps the running one (whose success carries the
  /// series), and `clear()` ends every series.
  @Test func replaceKeepAndClearDuringARunLeaveOneSeriesOrNone() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let started = Gate()
      let release = Gate()
      let run = runner(queue)
      run.register(tag: "sync") { task in
        if task.attempt == 1, try task.payload(as: Item.self).name == "slow" {
          started.open()
          await release.wait()
        }
        return .succeeded
      }
      func add(_ name: String, _ unique: UniquePolicy) async throws -> TaskID {
        try await queue.add(
          tag: "sync", payload: Item(name: name), dataId: "inbox",
          options: [.unique(unique), .schedule(.every(.seconds(60)))])
      }
      // replace
      let first = try await add("slow", .keep)
      var pass = Task { try await run.run(.task(first)) }
      await started.wait()
      let replacement = try await add("new", .replace)
      release.open()
      #expect(try await pass.value.outcome(of: first) == .succeeded)
      #expect(try queuedRepeating(queue) == [replacement])
      #expect(try await run.run().outcome(of: replacement) == .succeeded)
      let afterReplace = try queuedRepeating(queue)
      #expect(afterReplace.count == 1)
      #expect(try queue.payload(of: afterReplace[0], as: Item.self) == Item(name: "new"))
      try await queue.clear()
      // keep
      let started2 = Gate()
      let release2 = Gate()
      let run2 = runner(queue)
      run2.register(tag: "sync") { _ in
        started2.open()
        await release2.wait()
        return .succeeded
      }
      let second = try await add("slow", .keep)
      pass = Task { try await run2.run(.task(second)) }
      await started2.wait()
      #expect(try await add("again", .keep) == second, "the running repetition is the series")
      // clear during the run
      try await queue.clear()
      release2.open()
      #expect(try await pass.value.outcome(of: second) == .succeeded)
      #expect(try queue.pendingTasks().isEmpty)
      fixture.time += 3_600_000
      #expect(try await run.run().entries.isEmpty)
      let adds = try repeatingAdds(queue.log).map(\.id)
      #expect(adds == [first, replacement, afterReplace[0], second], "no repetition after the clear")
      try expectConsistent(queue)
    }
  }

  /// Compaction and a rebuild while a series is in flight keep exactly its one queued repetition
  /// with its start, and its payload as last updated.
  @Test func compactionAndRebuildKeepTheQueuedRepetitionAndItsLatestPayload() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let seen = Mutex<[String]>([])
      let run = runner(queue)
      run.register(tag: "sync") { task in
        let name = try task.payload(as: Item.self).name
        seen.withLock { $0.append(name) }
        return .succeeded
      }
      let first = try await queue.add(
        tag: "sync", payload: Item(name: "v1"), options: [.schedule(.every(.seconds(60)))])
      #expect(try await run.run().succeeded == 1)
      let second = try #require(try queuedRepeating(queue).first)
      try await queue.updatePayload(second, to: Item(name: "v2"))
      fixture.time += 60_000
      #expect(try await run.run().succeeded == 1)
      let third = try #require(try queuedRepeating(queue).first)
      #expect(try queue.payload(of: third, as: Item.self) == Item(name: "v2"))
      fixture.time += 1
      _ = try await store.compact(retention: .zero)
      _ = try await store.log.rebuild()
      #expect(try store.log.verify().isHealthy)
      #expect(try queue.pendingTasks().map(\.id) == [third])
      #expect(try queue.task(third)?.status == .scheduled(at: at(fixture.time - 1 + 60_000)))
      #expect(try queue.payload(of: third, as: Item.self) == Item(name: "v2"))
      #expect(try queue.task(first) == nil)
      fixture.time += 60_000
      #expect(try await run.run().succeeded == 1)
      #expect(seen.withLock { $0 } == ["v1", "v2", "v2"])
      try expectConsistent(queue)
    }
  }

  /// Runner processes SIGKILLed one after another — by the test after their first claim, or by a
  /// job's own handler — while forty series run, and the test process opening the store beside
  /// each: every first task succeeds once, and each success added exactly one repetition in its
  /// own commit (the event right after it), with the same payload and an hour's start that no run
  /// took early (read from the log).
  @Test func killedRunnersNeitherLoseNorDoubleARepetition() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let queue = try await fixture.open()
      defer { queue.close() }
      for n in 0..<40 {
        ids.append(
          try await queue.add(
            tag: "job", payload: ["kind": n % 9 == 4 ? "crash" : "ok"],
            options: [.schedule(.every(.seconds(3600)))]))
      }
    }
    let before = Int64(Date().timeIntervalSince1970 * 1000)
    var dead: [Int32] = []
    var finished = false
    for _ in 0..<12 where !finished {
      let child = try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"])
      _ = try? await child.waitForLine(startingWith: "ran ")
      // A second process on the store while the runner adds repetitions.
      let beside = try await TaskQueue.open(at: fixture.path)
      #expect(try beside.log.verify().isHealthy)
      _ = try beside.pendingTasks()
      beside.close()
      if child.output.contains("done") && child.process.isRunning == false {
        finished = try await child.wait() == 0
      } else {
        child.kill()
        _ = try await child.wait()
      }
      if !finished { dead.append(child.pid) }
    }
    while !finished {
      let child = try Child("ferry-test-worker", ["run-tasks", fixture.path])
      finished = try await child.wait() == 0
      if !finished { dead.append(child.pid) }
    }
    #expect(dead.count >= 4, "four crash jobs each killed a runner")
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let ledger = try RunLedger(queue.log) { owner in dead.contains { owner.hasPrefix(ownerPrefix($0)) } }
    // A task may be killed more than once here (its own crash, then the test's kill): every run
    // ended once, by one success or an interruption of a dead owner's run.
    #expect(ledger.violations.isEmpty, "\(ledger.violations.prefix(5))")
    for id in ids {
      let runs = try #require(ledger.tasks[id])
      #expect(runs.successes == 1 && runs.finishes == 1, "job \(id): \(runs)")
      #expect(runs.starts.count == 1 + runs.interruptions.count, "job \(id): \(runs)")
    }
    let adds = try repeatingAdds(queue.log)
    let repetitions = Array(adds.dropFirst(ids.count))
    #expect(repetitions.count == ids.count, "one repetition per success")
    var origins: [TaskID] = []
    for add in repetitions {
      #expect(ledger.tasks[add.id]?.starts.isEmpty ?? true, "a repetition an hour away did not start")
      #expect((add.startAt ?? 0) >= before + 3_600_000)
      let previous = try #require(try queue.log.event(at: add.id.rawValue - 1))
      guard case .runSucceeded(let origin, _) = try TaskEvent(previous) else {
        Issue.record("repetition \(add.id) is not logged right after a success: \(previous.type)")
        continue
      }
      origins.append(origin)
      let read = { (id: TaskID) in
        try TaskQueue.payload(of: id, at: id.rawValue) { try queue.log.event(at: $0) }.bytes
      }
      #expect(try read(add.id) == read(origin), "the repetition carries its origin's payload")
    }
    #expect(origins.sorted() == ids)
    #expect(Set(try queue.pendingTasks().map(\.id)) == Set(repetitions.map(\.id)))
    try expectConsistent(queue)
  }
}
