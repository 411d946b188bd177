import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The queue controls of issue 14 (`Specs/task-events.md` §2.2, §3.3, §4.1, §4.4, §4.5): payload
/// updates, cancel by tag and by group, waiting until idle, the `waitingForGroup` status and a
/// run's time limit — on real stores, with real processes where another process matters.
@Suite(.timeLimit(.minutes(20))) struct QueueControlTests {
  // MARK: Payload updates

  @Test func aPayloadUpdateReachesTheNextRunKeepsGroupOrderAndSurvivesRebuildAndReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var store = try await fixture.openStore()
    let first = try await store.queue.add(tag: "t", payload: Item(name: "one"), groupId: "g")
    let second = try await store.queue.add(tag: "t", payload: Item(name: "two"), groupId: "g")
    let third = try await store.queue.add(tag: "t", payload: Item(name: "three"), groupId: "g")
    let changes = try store.queue.updates(for: second)
    try await store.queue.updatePayload(second, to: Item(name: "two, fixed"))
    try await store.queue.updatePayload(second, to: Item(name: "two, fixed again"))

    #expect(try store.queue.payload(of: second, as: Item.self) == Item(name: "two, fixed again"))
    #expect(try store.queue.pendingTasks().map(\.id) == [first, second, third])  // same id, same place
    #expect(try store.queue.task(second)?.status == .waitingForGroup(behind: first))
    var iterator = changes.makeAsyncIterator()
    #expect(await iterator.next() == .current(second, .waitingForGroup(behind: first)))
    #expect(await iterator.next() == .payloadUpdated(second))
    #expect(
      try store.queue.history(of: second).map(\.event) == [.added, .payloadUpdated, .payloadUpdated])

    // A rebuild from the log folds the updates again.
    _ = try await store.log.rebuild()
    #expect(try store.queue.payload(of: second, as: Item.self) == Item(name: "two, fixed again"))
    #expect(try store.log.verify().isHealthy)
    store.close()
    store = try await fixture.openStore()
    defer { store.close() }
    #expect(try store.queue.payload(of: second, as: Item.self) == Item(name: "two, fixed again"))

    let seen = Journal()
    let run = runner(store.queue)
    run.register(tag: "t") { task in
      seen.note(try task.payload(as: Item.self).name)
      return .succeeded
    }
    #expect(try await run.run().succeeded == 3)
    #expect(seen.all == ["one", "two, fixed again", "three"])
    try expectConsistent(store.queue)
  }

  /// The main use: a run records an error, the user fixes the item, resolves the error, and the
  /// fix is what the next run sends. A dead task takes an update too and stays dead until revived.
  @Test func aBlockedOrDeadTaskTakesAnUpdateAndKeepsItsStatusUntilResolvedOrRevived() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let seen = Journal()
      let run = runner(queue)
      run.register(tag: "note") { task in
        let name = try task.payload(as: Item.self).name
        seen.note(name)
        switch name {
        case "typo": return .recordError("fix the title")
        case "rejected": return .failed("the server refuses it", retryable: false)
        default: return .succeeded
        }
      }
      let blocked = try await queue.add(tag: "note", payload: Item(name: "typo"), groupId: "n1")
      let behind = try await queue.add(tag: "note", payload: Item(name: "later"), groupId: "n1")
      let dead = try await queue.add(tag: "note", payload: Item(name: "rejected"))
      _ = try await run.run()
      #expect(try queue.task(blocked)?.status == .blockedByError)
      #expect(try queue.task(dead)?.status == .dead)

      try await queue.updatePayload(blocked, to: Item(name: "title"))
      try await queue.updatePayload(dead, to: Item(name: "accepted"))
      #expect(try queue.task(blocked)?.status == .blockedByError)  // the update resolves nothing
      #expect(try queue.task(dead)?.status == .dead)
      #expect(try await run.run().entries.isEmpty)

      try await queue.resolveError(blocked)
      try await queue.revive(dead)
      let report = try await run.run()
      #expect(report.outcome(of: blocked) == .succeeded)
      #expect(report.outcome(of: behind) == .succeeded)
      #expect(report.outcome(of: dead) == .succeeded)
      #expect(seen.all == ["typo", "rejected", "title", "later", "accepted"])
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  @Test func anUpdateOfARunningTaskIsRefusedInThisProcessAndFromAnotherOne() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      let queue = store.queue
      let started = Gate()
      let release = Gate()
      let run = runner(queue)
      run.register(tag: "slow") { _ in
        started.open()
        await release.wait()
        return .failed("offline")
      }
      let id = try await queue.add(tag: "slow", payload: Item(name: "old"))
      async let report = run.run()
      await started.wait()
      let refused = await #expect(throws: FerryError.self) {
        try await queue.updatePayload(id, to: Item(name: "new"))
      }
      #expect(refused.map { "\($0)" } == "\(FerryError.taskRunning(id))")
      #expect(try queue.payload(of: id, as: Item.self) == Item(name: "old"))
      release.open()
      #expect(try await report.outcome(of: id) == .failed("offline", retryAt: at(fixture.time + 1000)))
      // The run has ended (a retryable failure): now the update is taken.
      try await queue.updatePayload(id, to: Item(name: "new"))
      #expect(try queue.payload(of: id, as: Item.self) == Item(name: "new"))
      let missing = await #expect(throws: FerryError.self) {
        try await queue.updatePayload(TaskID(rawValue: id.rawValue + 100), to: Item(name: "nobody"))
      }
      #expect(missing.map { "\($0)" } == "\(FerryError.noSuchTask(TaskID(rawValue: id.rawValue + 100)))")
    }

    // Another process's runner has the task: refused here, by the claim in the log.
    let other = QueueFixture()
    defer { other.remove() }
    let (child, id) = try await Child.hangingRun(in: other.path)
    defer { child.kill() }  // it hangs for ever: killed here
    let store = try await other.openStore()
    defer { store.close() }
    let refused = await #expect(throws: FerryError.self) {
      try await store.queue.updatePayload(id, to: ["item": "oat milk"])
    }
    #expect(refused.map { "\($0)" } == "\(FerryError.taskRunning(id))")
    #expect(try store.log.forEachTaskEvent().filter { $0.1.type == "task.payloadUpdated" }.isEmpty)
  }

  /// Compaction keeps a queued task's whole history, its payload updates with it: a rebuild from
  /// what the compacted log holds gives the updated payload.
  @Test func aPayloadUpdateSurvivesCompactionAndARebuildFromTheCompactedLog() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var store = try await fixture.openStore()
    let kept = try await store.queue.add(tag: "t", payload: Item(name: "old"))
    for i in 0..<5 {
      let done = try await store.queue.add(tag: "t", payload: Item(name: "done \(i)"))
      try await store.queue.cancel(done)
    }
    try await store.queue.updatePayload(kept, to: Item(name: "new"))
    fixture.clock.advance(by: .seconds(10))
    let compaction = try await store.compact(retention: .zero)
    #expect(compaction.removed == 10)
    #expect(try store.queue.payload(of: kept, as: Item.self) == Item(name: "new"))
    store.close()
    try LMDBEnvironment.open(fixture.path, "meta").removeSnapshot(TaskQueueProjection.projectionName)
    store = try await fixture.openStore()
    defer { store.close() }
    _ = try await store.log.rebuild()
    #expect(try store.queue.payload(of: kept, as: Item.self) == Item(name: "new"))
    #expect(try store.log.verify().isHealthy)
  }

  // MARK: Cancel by tag and by group

  /// Two runners work (two lanes each) while a cancel by tag comes: the tasks of the tag that had
  /// no run under way are cancelled in one commit and never run afterwards; those that ran go on.
  @Test func cancelByTagWhileTwoRunnersWorkCancelsWhatIsNotRunning() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      var tagged: [TaskID] = []
      var others: [TaskID] = []
      for i in 0..<16 {
        tagged.append(
          try await queue.add(tag: "sync", payload: ["i": i], groupId: i < 12 ? "g\(i % 4)" : nil))
        if i % 2 == 0 {
          others.append(try await queue.add(tag: "photo", payload: ["i": i], groupId: "p\(i % 3)"))
        }
      }
      let release = Gate()
      let started = Journal()
      let runners = [
        runner(queue) { $0.maxConcurrentTasks = 2 }, runner(queue) { $0.maxConcurrentTasks = 2 },
      ]
      for run in runners {
        run.register(tag: "sync") { task in
          started.note("\(task.id)")
          await release.wait()
          return .succeeded
        }
        run.register(tag: "photo") { _ in .succeeded }
      }
      async let firstPass = runners[0].run()
      async let secondPass = runners[1].run()
      try await waitUntil { started.all.count >= 4 }  // every lane holds a "sync" run

      let report = try await queue.cancel(tag: "sync")
      release.open()
      _ = try await (firstPass, secondPass)

      // From the log: the cancels are one run of consecutive events; what was running at that
      // point is `running`, every other queued task of the tag is `cancelled`.
      let events = try store.log.forEachTaskEvent()
      let cancels = events.filter { if case .cancelled = $0.1 { return true } else { return false } }
      let cancelSequences = cancels.map(\.0.sequence)
      #expect(cancels.count == report.cancelled.count)
      #expect(cancelSequences == Array((cancelSequences.first ?? 0)...(cancelSequences.last ?? 0)))
      let at = try #require(cancelSequences.first)
      var open = Set<TaskID>()
      var ended = Set<TaskID>()
      for (event, decoded) in events where event.sequence < at {
        switch decoded {
        case .runStarted(let id, _, _, _, _): open.insert(id)
        case .runSucceeded(let id, _):
          open.remove(id)
          ended.insert(id)
        case .runFailed(let id, _, _, _), .runInterrupted(let id): open.remove(id)
        default: break
        }
      }
      #expect(Set(report.running) == open.intersection(tagged))
      #expect(report.running.count >= 4)
      #expect(report.cancelled == tagged.filter { !open.contains($0) && !ended.contains($0) })
      #expect(report.running.allSatisfy { started.all.contains("\($0)") })
      // No cancelled task runs after its cancel; the running ones finished as usual.
      for (event, decoded) in events where event.sequence > at {
        if case .runStarted(let id, _, _, _, _) = decoded {
          #expect(!report.cancelled.contains(id), "task \(id) ran after it was cancelled")
        }
      }
      let succeeded = Set(
        events.compactMap { if case .runSucceeded(let id, _) = $0.1 { return id } else { return nil } })
      #expect(Set(report.running).isSubset(of: succeeded))
      #expect(Set(others).isSubset(of: succeeded))  // the other tag is untouched
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  @Test func cancelByGroupLeavesItsRunningHeadAndTellsListeners() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let head = try await queue.add(tag: "t", payload: ["n": 0], groupId: "list")
      let rest = [
        try await queue.add(tag: "t", payload: ["n": 1], groupId: "list"),
        try await queue.add(tag: "t", payload: ["n": 2], groupId: "list"),
      ]
      let elsewhere = try await queue.add(tag: "t", payload: ["n": 3], groupId: "other")
      let started = Gate()
      let release = Gate()
      let runners = [runner(queue), runner(queue)]
      for run in runners {
        run.register(tag: "t") { task in
          if task.id == head {
            started.open()
            await release.wait()
          }
          return .succeeded
        }
      }
      let changes = queue.updates()
      async let first = runners[0].run(.group("list"))
      await started.wait()
      let report = try await queue.cancel(group: "list")
      #expect(report == CancelReport(cancelled: rest, running: [head]))
      #expect(try await queue.cancel(group: "nothing here") == CancelReport(cancelled: [], running: []))
      release.open()
      #expect(try await first.outcome(of: head) == .succeeded)
      #expect(try await runners[1].run().outcome(of: elsewhere) == .succeeded)
      var cancelled: [TaskID] = []
      for await change in changes {
        if case .cancelled(let id) = change { cancelled.append(id) }
        if case .succeeded(elsewhere) = change { break }
      }
      #expect(cancelled == rest)
      for (event, decoded) in try store.log.forEachTaskEvent() {
        if case .runStarted(let id, _, _, _, _) = decoded {
          #expect(!rest.contains(id), "at \(event.sequence)")
        }
      }
      #expect(try queue.pendingTasks().isEmpty)
      try expectConsistent(queue)
    }
  }

  // MARK: Idle

  @Test func waitUntilIdleReturnsAtOnceWhenNothingCanRunNow() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      try await queue.waitUntilIdle()  // empty
      let blocked = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      _ = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")  // behind the blocked head
      _ = try await queue.add(tag: "t", payload: ["n": 3], options: [.manual])
      try await queue.recordError(blocked, message: "fix it")
      let retrying = try await queue.add(tag: "t", payload: ["n": 4])
      let run = runner(queue)
      run.register(tag: "t") { task in task.id == retrying ? .failed("offline") : .succeeded }
      #expect(
        try await run.run(.task(retrying)).outcome(of: retrying)
          == .failed("offline", retryAt: at(clock.milliseconds + 1000)))
      // Blocked, behind a blocked head, manual, a retry ahead: nothing to do now.
      try await queue.waitUntilIdle()
      #expect(try queue.isIdle())
      // Its retry time come, the waiting task is work again.
      clock.advance(by: .seconds(1))
      #expect(try !queue.isIdle())
      // Paused, ready work is not work (a run under way would be).
      try await queue.pause()
      _ = try await queue.add(tag: "t", payload: ["n": 5])
      try await queue.waitUntilIdle()
      try await queue.resume()
      #expect(try !queue.isIdle())
    }
  }

  @Test func waitUntilIdleWaitsForWorkAndEndsWhenItsTaskIsCancelled() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let id = try await queue.add(tag: "t", payload: ["n": 1])
      let waiter = Task { try await queue.waitUntilIdle() }
      for _ in 0..<200 { await Task.yield() }
      waiter.cancel()
      await #expect(throws: FerryError.cancelled) { try await waiter.value }

      // This process's runner does the work: the waiter wakes on the queue's own publications.
      let returned = Mutex<[TaskID]?>(nil)
      let second = Task {
        try await queue.waitUntilIdle()
        returned.withLock { $0 = try? queue.pendingTasks().map(\.id) }
      }
      let run = runner(queue)
      run.register(tag: "t") { _ in .succeeded }
      run.startAutomaticRunning()
      defer { run.stop() }
      try await second.value
      #expect(returned.withLock { $0 } == [])
      #expect(try queue.task(id) == nil)
    }
  }

  /// The work is done by a runner in another process: the waiter wakes on the changes the queue
  /// reads from the log's tail, does not return while a task is left to run, and returns once the
  /// other process has finished (a task it blocked with an error is not work).
  @Test func waitUntilIdleReturnsAfterARunnerInAnotherProcessFinishesTheWork() async throws {
    let path = FileManager.default.temporaryDirectory.path + "/ferry-idle-\(UUID().uuidString.prefix(8))"
    defer { try? FileManager.default.removeItem(atPath: path) }
    let store = try await FerryStore.open(at: path)  // the wall clock: the worker's clock too
    defer { store.close() }
    let queue = store.queue
    var jobs: [TaskID] = []
    for i in 0..<20 {
      jobs.append(try await queue.add(tag: "job", payload: ["kind": i == 7 ? "error" : "ok"]))
    }
    let blocked = jobs[7]
    let state = Mutex<(returned: Bool, pending: [PendingTask])>((false, []))
    let waiter = Task {
      try await queue.waitUntilIdle()
      let pending = try queue.pendingTasks()
      state.withLock { $0 = (true, pending) }
    }
    // Nobody runs anything yet: the waiter waits (more than a tail period).
    try await Task.sleep(for: .milliseconds(600))
    #expect(!state.withLock { $0.returned })

    let child = try Child("ferry-test-worker", ["run-tasks", path, "2"])
    defer { if child.process.isRunning { child.kill() } }
    try await waiter.value
    let (_, pending) = state.withLock { $0 }
    // When it returned, every job had run: only the blocked one is left.
    #expect(pending.map(\.id) == [blocked])
    #expect(pending.first?.status == .blockedByError)
    _ = try await child.waitForLine(startingWith: "done")
    #expect(try await child.wait() == 0)
    let succeeded = try store.log.forEachTaskEvent().compactMap { event, decoded -> TaskID? in
      if case .runSucceeded(let id, _) = decoded { return id } else { return nil }
    }
    #expect(Set(succeeded) == Set(jobs).subtracting([blocked]))
  }

  // MARK: waitingForGroup

  @Test func tasksBehindTheirGroupsHeadAreWaitingForTheirGroup() async throws {
    try await withStore { store, _, _ in
      let queue = store.queue
      let head = try await queue.add(tag: "t", payload: ["n": 1], groupId: "g")
      let second = try await queue.add(tag: "t", payload: ["n": 2], groupId: "g")
      let third = try await queue.add(tag: "t", payload: ["n": 3], groupId: "g")
      let loose = try await queue.add(tag: "t", payload: ["n": 4])
      // Behind a head that may start, the rest of the group waits for it all the same.
      let behindHead: [TaskStatus] = [
        .ready, .waitingForGroup(behind: head), .waitingForGroup(behind: head), .ready,
      ]
      #expect(try queue.pendingTasks().map(\.status) == behindHead)

      try await queue.recordError(head, message: "fix it")
      #expect(
        try queue.pendingTasks().map(\.status) == [
          .blockedByError, .waitingForGroup(behind: head), .waitingForGroup(behind: head), .ready,
        ])
      #expect(try queue.task(second)?.status == .waitingForGroup(behind: head))
      var changes = try queue.updates(for: third).makeAsyncIterator()
      #expect(await changes.next() == .current(third, .waitingForGroup(behind: head)))
      let snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
      #expect(snapshot.tasks.map(\.status)[1] == .waitingForGroup(behind: head))
      // Nothing of it is stored: a rebuild gives the same, and the projection is as the log says.
      _ = try await store.log.rebuild()
      #expect(try queue.task(third)?.status == .waitingForGroup(behind: head))
      try expectConsistent(queue)

      try await queue.resolveError(head)
      #expect(try queue.pendingTasks().map(\.status) == behindHead)

      // A running head holds its group too; once it succeeds, the next is the head and ready.
      let started = Gate()
      let release = Gate()
      let run = runner(queue)
      run.register(tag: "t") { task in
        if task.id == head {
          started.open()
          await release.wait()
        }
        return task.id == second ? .failed("offline") : .succeeded
      }
      async let report = run.run(.task(head))
      await started.wait()
      #expect(try queue.task(head)?.status == .running)
      #expect(try queue.task(second)?.status == .waitingForGroup(behind: head))
      #expect(try queue.task(loose)?.status == .ready)
      release.open()
      #expect(try await report.outcome(of: head) == .succeeded)
      #expect(try queue.task(second)?.status == .ready)
      #expect(try queue.task(third)?.status == .waitingForGroup(behind: second))
      // A head waiting for a retry holds it, whatever the time.
      _ = try await run.run(.task(second))
      #expect(try queue.task(third)?.status == .waitingForGroup(behind: second))
    }
  }

  // MARK: Time limits

  /// A handler that ignores cancellation, past its time limit and the grace: the timeout is
  /// logged once (a retryable failure), its group goes on, and its late result is dropped.
  @Test func aHungHandlerPastItsTimeLimitFreesItsGroupAndHasOneOutcome() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let hung = try await queue.add(tag: "hang", payload: ["n": 1], groupId: "g")
      let next = try await queue.add(tag: "next", payload: ["n": 2], groupId: "g")
      let journal = Journal()
      let release = Gate()
      let run = runner(queue) { $0.timeLimitGrace = .seconds(5) }
      run.register(
        tag: "hang", retry: RetryPolicy(initialDelay: .seconds(1), jitter: 0), timeLimit: .seconds(10)
      ) {
        task in
        guard task.attempt == 1 else { return .succeeded }
        journal.note("started")
        await release.wait()  // not cancellable: it ignores its cancellation
        journal.note("cancelled: \(Task.isCancelled)")
        return .succeeded  // too late: never logged
      }
      run.register(tag: "next") { _ in .succeeded }
      let start = clock.milliseconds
      async let first = run.run()
      try await waitUntil { journal.all == ["started"] }
      await clock.waitForSleepers()
      clock.advance(by: .seconds(10))  // the limit: the handler's task is cancelled
      await clock.waitForSleepers()
      clock.advance(by: .seconds(5))  // the grace: the runner stops waiting
      let report = try await first
      let message =
        "timed out after 10 s; the handler did not stop within 5 s of being cancelled and was left running "
        + "(what it returns is not logged)"
      #expect(report.outcome(of: hung) == .failed(message, retryAt: at(start + 15_000 + 1000)))
      #expect(report.outcome(of: next) == .skipped(.partOfFailedGroup))  // its group failed in this pass
      #expect(try queue.task(hung)?.status == .waiting(until: at(start + 16_000)))

      // The hung handler ends late: nothing of it is logged.
      release.open()
      try await waitUntil { journal.all.count == 2 }
      #expect(journal.all == ["started", "cancelled: true"])
      for _ in 0..<200 { await Task.yield() }
      clock.advance(by: .seconds(1))
      let second = try await run.run()
      #expect(second.outcome(of: hung) == .succeeded)
      #expect(second.outcome(of: next) == .succeeded)  // the group goes on

      let history = try queue.history(of: hung).map(\.event)
      #expect(
        history == [
          .added, .runStarted(attempt: 1), .runFailed(message: message, retryAt: at(start + 16_000)),
          .runStarted(attempt: 2), .runSucceeded,
        ])
      let outcomes = try store.log.forEachTaskEvent().filter { _, decoded in
        switch decoded {
        case .runSucceeded(hung, _), .runFailed(hung, _, _, _), .runInterrupted(hung),
          .errorRecorded(hung, _, true):
          return true
        default: return false
        }
      }
      #expect(outcomes.count == 2)  // one per run
      try expectConsistent(queue)
    }
  }

  /// A handler that honours cancellation ends at its limit: a retryable "timed out" failure, with
  /// no grace waited for. A handler within its limit is not touched.
  @Test func aHandlerThatStopsWhenCancelledTimesOutAtItsLimit() async throws {
    try await withStore { store, clock, _ in
      let queue = store.queue
      let slow = try await queue.add(tag: "slow", payload: ["n": 1])
      let quick = try await queue.add(tag: "quick", payload: ["n": 2])
      let run = runner(queue) { $0.defaultTimeLimit = .milliseconds(1500) }
      let started = Gate()
      run.register(tag: "slow") { _ in
        started.open()
        try await Task.sleep(for: .seconds(3600))  // real time: only cancellation ends it
        return .succeeded
      }
      run.register(tag: "quick") { _ in .succeeded }
      let start = clock.milliseconds
      async let report = run.run()
      await started.wait()
      await clock.waitForSleepers()
      clock.advance(by: .milliseconds(1500))
      let done = try await report
      #expect(done.outcome(of: slow) == .failed("timed out after 1500 ms", retryAt: at(start + 1500 + 1000)))
      #expect(done.outcome(of: quick) == .succeeded)
      #expect(clock.sleeperCount == 0)  // the grace timer was given up with the run
      try expectConsistent(queue)
    }
  }
}

extension EventLog {
  /// Every queue event in the log, decoded, with its record.
  func forEachTaskEvent() throws -> [(LoggedEvent, TaskEvent)] {
    var events: [(LoggedEvent, TaskEvent)] = []
    try forEachEvent { event in
      guard TaskEvent.typeSet.contains(event.type) else { return }
      events.append((event, try TaskEvent(event)))
    }
    return events
  }
}

/// Waits (napping a millisecond) until `condition` holds. No wall-clock give-up: a condition that
/// never holds is ended by the test's time limit, which cancels the nap.
func waitUntil(_ condition: () throws -> Bool) async throws {
  while try !condition() {
    try await Task.sleep(for: .milliseconds(1))
  }
}
