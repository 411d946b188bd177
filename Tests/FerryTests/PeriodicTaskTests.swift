import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Every `task.added` of the log whose schedule repeats, in log order: (task id, start, interval).
func repeatingAdds(_ log: EventLog) throws -> [(id: TaskID, startAt: Int64?, interval: Int64)] {
  var adds: [(id: TaskID, startAt: Int64?, interval: Int64)] = []
  try log.forEachEvent { event in
    guard event.type == "task.added",
      case .added(_, _, _, _, _, _, _, _, let schedule) = try TaskEvent(event),
      let interval = schedule.interval
    else { return }
    adds.append((TaskID(rawValue: event.sequence), schedule.startAt, interval))
  }
  return adds
}

/// A repeating task: each success adds the next repetition in the same commit, due an interval
/// after that success; missed intervals run once; pause, cancel, a failure and a crash act on the
/// series as `TaskSchedule.every(_:startingAt:)` documents. Times are on the injected clock.
@Suite(.timeLimit(.minutes(20))) struct PeriodicTaskTests {
  static let quarter: Int64 = 15 * 60_000

  @Test func eachSuccessAddsTheNextRepetitionAnIntervalLaterWithItsOwnKey() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let first = try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(900)))])
      let keys = Mutex<[String]>([])
      let run = runner(queue)
      run.register(tag: "sync") { task in
        keys.withLock { $0.append(task.idempotencyKey) }
        return .succeeded
      }
      var ids = [first]
      var due = fixture.time
      for round in 0..<3 {
        if round > 0 {
          // Not before its time.
          fixture.time = due - 1
          #expect(try await run.run().entries.isEmpty)
        }
        let done = due + 7_000  // late by 7 s: the next is counted from this success
        fixture.time = done
        #expect(try await run.run().outcome(of: ids[round]) == .succeeded)
        let next = try #require(try queue.pendingTasks().first)
        #expect(next.id > ids[round])
        #expect(next.status == .scheduled(at: at(done + Self.quarter)))
        #expect(next.repeatInterval == .seconds(900))
        #expect(try queue.payload(of: next.id, as: Item.self) == Item(name: "inbox"))
        ids.append(next.id)
        due = done + Self.quarter
      }
      #expect(Set(keys.withLock { $0 }).count == 3, "each repetition is a change of its own")
      #expect(try repeatingAdds(queue.log).map(\.id) == ids)
      try expectConsistent(queue)
    }
  }

  @Test func fiveIntervalsMissedWhileTheAppWasClosedRunOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let hour: Int64 = 3_600_000
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      try await store.queue.add(
        tag: "refresh", payload: Item(name: "feed"), options: [.schedule(.every(.seconds(3600)))])
      let run = runner(store.queue)
      run.register(tag: "refresh") { _ in .succeeded }
      #expect(try await run.run().succeeded == 1)
    }
    // Closed for five and a half intervals.
    fixture.time += 5 * hour + hour / 2
    let store = try await fixture.openStore()
    defer { store.close() }
    let run = runner(store.queue)
    run.register(tag: "refresh") { _ in .succeeded }
    run.startAutomaticRunning()
    try await pollUntil { (try? repeatingAdds(store.queue.log).count) == 3 }
    for _ in 0..<50 { await Task.yield() }
    run.stop()
    let starts = try store.queue.log.events(after: 0, limit: 1_000).filter { $0.type == "task.runStarted" }
    #expect(starts.count == 2, "one run at the first open, one after the gap — not five")
    let next = try #require(try store.queue.pendingTasks().first)
    #expect(next.status == .scheduled(at: at(fixture.time + hour)))
  }

  @Test func pauseHoldsTheSeriesAndResumeRunsItOnce() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(60)))])
      let run = runner(queue)
      run.register(tag: "sync") { _ in .succeeded }
      run.startAutomaticRunning()
      defer { run.stop() }
      try await pollUntil { (try? repeatingAdds(queue.log).count) == 2 }
      try await queue.pause()
      for _ in 0..<4 {
        fixture.time += 60_000
        for _ in 0..<20 { await Task.yield() }
      }
      #expect(try repeatingAdds(queue.log).count == 2)
      try await queue.resume()
      try await pollUntil { (try? repeatingAdds(queue.log).count) == 3 }
      for _ in 0..<50 { await Task.yield() }
      #expect(try repeatingAdds(queue.log).count == 3, "one run for the four intervals paused")
    }
  }

  @Test func cancelStopsTheSeriesWhetherQueuedOrRunning() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let started = Gate()
      let release = Gate()
      let run = runner(queue)
      run.register(tag: "sync") { task in
        if try task.payload(as: Item.self).name == "slow" {
          started.open()
          await release.wait()
        }
        return .succeeded
      }
      // Cancelled while queued.
      let queued = try await queue.add(
        tag: "sync", payload: Item(name: "a"), options: [.schedule(.every(.seconds(60)))])
      try await queue.cancel(queued)
      fixture.time += 120_000
      #expect(try await run.run().entries.isEmpty)
      // Cancelled while its run is under way: the run's success adds no repetition.
      let running = try await queue.add(
        tag: "sync", payload: Item(name: "slow"), options: [.schedule(.every(.seconds(60)))])
      let pass = Task { try await run.run() }
      await started.wait()
      try await queue.cancel(running)
      release.open()
      #expect(try await pass.value.outcome(of: running) == .succeeded)
      #expect(try queue.pendingTasks().isEmpty)
      #expect(try repeatingAdds(queue.log).map(\.id) == [queued, running])
      try expectConsistent(queue)
    }
  }

  @Test func aFailureRetriesTheSameRepetitionAndTheIntervalCountsFromItsSuccess() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let id = try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(600)))])
      let calls = Atomic<Int>(0)
      let run = runner(queue)
      run.register(tag: "sync", retry: RetryPolicy(initialDelay: .seconds(10), multiplier: 1, jitter: 0)) {
        _ in
        calls.add(1, ordering: .relaxed).newValue <= 2 ? .failed("server busy", retryable: true) : .succeeded
      }
      for _ in 0..<2 {
        #expect(
          try await run.run().outcome(of: id) == .failed("server busy", retryAt: at(fixture.time + 10_000)))
        #expect(try repeatingAdds(queue.log).count == 1, "a failure adds no repetition")
        fixture.time += 10_000
      }
      #expect(try await run.run().outcome(of: id) == .succeeded)
      let next = try #require(try queue.pendingTasks().first)
      #expect(next.status == .scheduled(at: at(fixture.time + 600_000)))
      #expect(try queue.pendingTasks().count == 1)
    }
  }

  @Test func aRepetitionThatDiesHoldsTheSeriesUntilRevived() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let id = try await queue.add(
        tag: "sync", payload: Item(name: "inbox"), options: [.schedule(.every(.seconds(60)))])
      let refuse = Atomic<Bool>(true)
      let run = runner(queue)
      run.register(tag: "sync") { _ in
        refuse.load(ordering: .relaxed) ? .failed("account closed", retryable: false) : .succeeded
      }
      #expect(try await run.run().outcome(of: id) == .failed("account closed", retryAt: nil))
      #expect(try queue.task(id)?.status == .dead)
      fixture.time += 600_000
      #expect(try await run.run().entries.isEmpty)
      #expect(try repeatingAdds(queue.log).count == 1, "ten intervals dead: no repetition piled up")
      refuse.store(false, ordering: .relaxed)
      try await queue.revive(id)
      #expect(try await run.run().outcome(of: id) == .succeeded)
      #expect(try queue.pendingTasks().map(\.status) == [.scheduled(at: at(fixture.time + 60_000))])
    }
  }

  @Test func addingWithKeepAtEveryLaunchKeepsOneSeries() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      func register() async throws -> TaskID {
        try await queue.add(
          tag: "sync", payload: Item(name: "inbox"), dataId: "inbox",
          options: [.unique(.keep), .schedule(.every(.seconds(60)))])
      }
      let first = try await register()
      #expect(try await register() == first)
      let run = runner(queue)
      run.register(tag: "sync") { _ in .succeeded }
      _ = try await run.run()
      let repetition = try #require(try queue.pendingTasks().first?.id)
      #expect(repetition != first)
      #expect(try await register() == repetition, "the series' next task is the one kept")
      #expect(try queue.pendingTasks().count == 1)
    }
  }

  /// Two runner processes over twenty repeating jobs, one of which SIGKILLs its runner on its
  /// first attempt: each job runs to one success, and each success added exactly one repetition,
  /// due an hour later on the workers' clock (read from the log).
  @Test func aKillDuringARunAndTwoRunnerProcessesAddExactlyOneRepetitionEach() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var ids: [TaskID] = []
    do {
      let queue = try await fixture.open()
      defer { queue.close() }
      for n in 0..<20 {
        ids.append(
          try await queue.add(
            tag: "job", payload: ["kind": n == 7 ? "crash" : "ok"],
            options: [.schedule(.every(.seconds(3600)))]))
      }
    }
    let before = Int64(Date().timeIntervalSince1970 * 1000)
    let first = try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"])
    let second = try Child("ferry-test-worker", ["run-tasks", fixture.path, "3"])
    let statuses = [try await first.wait(), try await second.wait()]
    #expect(statuses.filter { $0 == 0 }.count >= 1)
    // The job that killed its runner is finished by whichever runner is left, or by a third.
    #expect(try await Child("ferry-test-worker", ["run-tasks", fixture.path]).wait() == 0)
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runs = try runsByTask(queue.log)
    for id in ids { #expect(runs[id]?.successes == 1, "job \(id): \(String(describing: runs[id]))") }
    #expect(runs[ids[7]]?.starts == 2 && runs[ids[7]]?.interruptions == 1)
    let adds = try repeatingAdds(queue.log)
    #expect(adds.count == 40, "twenty jobs and one repetition each")
    let repetitions = adds.dropFirst(20)
    for add in repetitions {
      #expect(runs[add.id] == nil, "a repetition an hour away did not start")
      #expect((add.startAt ?? 0) >= before + 3_600_000)
    }
    #expect(Set(try queue.pendingTasks().map(\.id)) == Set(repetitions.map(\.id)))
    try expectConsistent(queue)
  }
}
