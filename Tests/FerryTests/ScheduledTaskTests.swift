import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The times `task.runStarted` events of a task were logged at, read back from the log.
func startTimes(_ log: EventLog, of id: TaskID) throws -> [Int64] {
  var times: [Int64] = []
  try log.forEachEvent { event in
    guard event.type == "task.runStarted", case .runStarted(let started, _, _, _, _) = try TaskEvent(event),
      started == id
    else { return }
    times.append(event.timestamp)
  }
  return times
}

/// A task added with a start time runs no sooner than it — in every runner, window and process,
/// across a reopen, a compaction and an export — and waits in the time-ordered index, so delayed
/// tasks cost a claim nothing until they are due.
@Suite(.timeLimit(.minutes(20))) struct ScheduledTaskTests {
  @Test func aDelayedTaskRunsNoSoonerThanItsStart() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let start = fixture.time + 60_000
      let later = try await queue.add(
        tag: "t", payload: Item(name: "later"), options: [.schedule(.after(.seconds(60)))])
      let now = try await queue.add(tag: "t", payload: Item(name: "now"))
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      #expect(try queue.task(later)?.status == .scheduled(at: at(start)))
      #expect(try queue.task(later)?.startAt == at(start))
      #expect(try queue.nextDueDate() == at(fixture.time))
      let first = try await run.run()
      #expect(first.outcome(of: now) == .succeeded)
      #expect(first.outcome(of: later) == nil)
      #expect(try queue.nextRunnable() == nil)
      #expect(try queue.nextDueDate() == at(start))
      fixture.time = start - 1
      #expect(try await run.run().entries.isEmpty)
      #expect(try await run.run(.task(later)).outcome(of: later) == .skipped(.scheduled(at: at(start))))
      fixture.time = start
      #expect(try await run.run().outcome(of: later) == .succeeded)
      #expect(try startTimes(queue.log, of: later) == [start])
      try expectConsistent(queue)
    }
  }

  @Test func theStartSurvivesAReopenACompactionAndAnExportedLog() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let start = fixture.time + 3_600_000
    var scheduled: [TaskID] = []
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      for n in 0..<5 {
        scheduled.append(
          try await store.queue.add(
            tag: "t", payload: Item(name: "\(n)"), options: [.schedule(.at(at(start)))]))
        // Work that finishes, so that the compaction has events to remove.
        try await store.queue.add(tag: "t", payload: Item(name: "done \(n)"))
      }
      let run = runner(store.queue)
      run.register(tag: "t") { _ in .succeeded }
      #expect(try await run.run().succeeded == 5)
      fixture.time += 60_000
      let report = try await store.compact(retention: .zero)
      #expect(report.removed > 0)
    }
    let store = try await fixture.openStore()
    defer { store.close() }
    for id in scheduled { #expect(try store.queue.task(id)?.status == .scheduled(at: at(start))) }
    // A rebuild from what the log still holds says the same.
    try expectConsistent(store.queue)
    let run = runner(store.queue)
    run.register(tag: "t") { _ in .succeeded }
    #expect(try await run.run().entries.isEmpty)
    fixture.time = start
    #expect(try await run.run().succeeded == 5)
    for id in scheduled { #expect(try startTimes(store.queue.log, of: id) == [start]) }
  }

  @Test func automaticRunningAndWindowsWaitForTheStart() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let start = fixture.time + 10_000
      let id = try await queue.add(tag: "t", payload: Item(name: "a"), options: [.schedule(.at(at(start)))])
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      // A window that ends before the start runs nothing and names the start as its next due time.
      let window = try await run.run(until: at(start - 1))
      #expect(window.nextDue == at(start))
      #expect(try queue.task(id) != nil)
      run.startAutomaticRunning()
      defer { run.stop() }
      for _ in 0..<20 { await Task.yield() }
      #expect(try startTimes(queue.log, of: id).isEmpty)
      fixture.time = start
      // The loop's timer is on the store's clock: moving it runs the task, with no call to run().
      try await pollUntil { (try? queue.task(id)) == nil }
      #expect(try startTimes(queue.log, of: id) == [start])
    }
  }

  @Test func aScheduledHeadHoldsItsGroupAndAResolvedErrorKeepsTheStart() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      let start = fixture.time + 5_000
      let head = try await queue.add(
        tag: "t", payload: Item(name: "head"), groupId: "g", options: [.schedule(.at(at(start)))])
      let behind = try await queue.add(tag: "t", payload: Item(name: "behind"), groupId: "g")
      #expect(try queue.task(behind)?.status == .waitingForGroup(behind: head))
      try await queue.recordError(head, message: "check the address")
      #expect(try queue.task(head)?.status == .blockedByError)
      try await queue.resolveError(head)
      #expect(try queue.task(head)?.status == .scheduled(at: at(start)))
      let journal = Journal()
      let run = runner(queue)
      run.register(tag: "t") { task in
        journal.note(try task.payload(as: Item.self).name)
        return .succeeded
      }
      #expect(try await run.run().entries.isEmpty)
      fixture.time = start
      _ = try await run.run()
      #expect(journal.all == ["head", "behind"])
      try expectConsistent(queue)
    }
  }

  @Test func schedulesFerryCannotKeepAreRefused() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    do {
      let cases: [(TaskSchedule, Bool, Date?)] = [
        (.after(.seconds(-1)), false, nil),
        (.at(Date(timeIntervalSince1970: .nan)), false, nil),
        (.at(Date(timeIntervalSince1970: .infinity)), false, nil),
        (.every(.milliseconds(999)), false, nil),
        (.every(.seconds(Int64.max)), false, nil),
        (.every(.seconds(60)), true, nil),  // manual
        (.every(.seconds(60)), false, at(fixture.time + 1_000_000)),  // a deadline
        (.at(at(fixture.time + 10_000)), false, at(fixture.time + 10_000)),  // the deadline is the start
        (.after(.seconds(Int64.max)), false, nil),
      ]
      for (schedule, manual, deadline) in cases {
        await #expect(throws: FerryError.self, "\(schedule)") {
          try await queue.add(
            tag: "t", payload: Item(name: "x"),
            options: TaskOptions(manual: manual, deadline: deadline, schedule: schedule))
        }
      }
      // In a group, each repetition would hold every change added after it.
      await #expect(throws: FerryError.self) {
        try await queue.add(
          tag: "t", payload: Item(name: "x"), groupId: "mail", options: [.schedule(.every(.seconds(60)))])
      }
      #expect(try queue.pendingTasks().isEmpty)
      #expect(try queue.log.head() == 0)
    }
  }

  @Test func aDelayRoundsUpToTheMillisecond() async throws {
    try await withStore { store, _, fixture in
      let id = try await store.queue.add(
        tag: "t", payload: Item(name: "a"), options: [.schedule(.after(.microseconds(1500)))])
      #expect(try store.queue.task(id)?.startAt == at(fixture.time + 2))
    }
  }

  /// Ten thousand delayed tasks and a hundred ready ones: the next-runnable lookup reads the index
  /// entries it returns and the delayed ones' first key, never the delayed tasks one by one.
  @Test func delayedTasksAreNotReadByTheNextRunnableLookup() async throws {
    try await withStore { store, _, fixture in
      let queue = store.queue
      // One commit for all of them: a loaded disk makes 10,000 durable adds slow.
      let adds = (0..<10_000).map { n in
        TaskEvent.added(
          tag: "t", payload: Array("{\"n\":\(n)}".utf8), dataId: nil, groupId: nil, manual: false,
          unique: .append,
          schedule: AddSchedule(startAt: fixture.time + 1_000 + Int64(n), interval: nil)
        ).newEvent
      }
      _ = try await queue.log.append(adds)
      let ready = try await queue.add(tag: "t", payload: Item(name: "ready"))
      let probe = try queue.probeNextRunnable()
      #expect(probe.task?.id == ready)
      #expect(probe.touched < 10)
      fixture.time += 1_000 + 4_999
      // Due now: the first 5,000 of them, oldest start first; still one key read for the answer.
      let due = try queue.probeNextRunnable()
      #expect(due.task?.id == 1)
      #expect(due.touched < 10)
    }
  }

  /// Two runner processes over tasks due in the past and tasks due in a year: each due task runs
  /// once, no future one starts (read from the log).
  @Test func twoRunnerProcessesRunDueTasksOnceAndLeaveFutureOnes() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var due: [TaskID] = []
    var future: [TaskID] = []
    let nextYear = Date().addingTimeInterval(365 * 24 * 3600)
    do {
      // The fixture's clock is in 2023: `.after` there is long past on the workers' real clocks.
      let queue = try await fixture.open()
      defer { queue.close() }
      for n in 0..<120 {
        let group = n % 3 == 0 ? "g\(n % 9)" : nil
        if n % 4 == 0 {
          future.append(
            try await queue.add(
              tag: "job", payload: ["kind": "ok"], groupId: group, options: [.schedule(.at(nextYear))]))
        } else {
          due.append(
            try await queue.add(
              tag: "job", payload: ["kind": "ok"], groupId: group, options: [.schedule(.after(.seconds(5)))]))
        }
      }
    }
    let children = [
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "3"]),
      try Child("ferry-test-worker", ["run-tasks", fixture.path, "2"]),
    ]
    for child in children { #expect(try await child.wait() == 0) }
    let queue = try await TaskQueue.open(at: fixture.path)
    defer { queue.close() }
    let runs = try runsByTask(queue.log)
    // A future task holds its group: what is behind it has not run either.
    let held = try Set(queue.pendingTasks().map(\.id))
    for id in due where !held.contains(id) {
      #expect(runs[id]?.starts == 1 && runs[id]?.successes == 1, "task \(id)")
    }
    for id in future { #expect(runs[id] == nil, "task \(id) started before its start") }
    #expect(held.isSuperset(of: future))
    #expect(held.count < 60)
    try expectConsistent(queue)
  }
}
