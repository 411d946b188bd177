import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Offline is a state, not a failure: no attempt is spent and no backoff grows while the device is
/// offline, a deferral gives its attempt back, and the network's return runs what waited at once.
@Suite(.timeLimit(.minutes(20))) struct ConnectivityTests {
  /// The `task.runStarted` events in the log (read back, not counted by the code under test).
  static func starts(_ queue: TaskQueue) throws -> [TaskID] {
    try queue.log.events(after: 0, limit: 100_000).compactMap { event in
      guard event.type == "task.runStarted", case .runStarted(let id, _, _, _, _) = try TaskEvent(event)
      else { return nil }
      return id
    }
  }

  @Test func sixtySecondsOfflineSpendsNoAttemptAndTheReturnRunsEverythingAtOnce() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let store = try await fixture.openStore()
    defer { store.close() }
    let network = ManualConnectivity(online: false)
    let calls = Atomic<Int>(0)
    let run = runner(store.queue) { $0.connectivity = network }
    run.register(tag: "note") { _ in
      calls.add(1, ordering: .relaxed)
      return .succeeded
    }
    run.startAutomaticRunning()
    defer { run.stop() }
    var ids: [TaskID] = []
    for n in 0..<50 {
      ids.append(try await store.queue.add(tag: "note", payload: Item(name: "\(n)"), groupId: "g\(n % 10)"))
    }
    // A minute on the store's clock, a second at a time, with the loop given room to act.
    for _ in 0..<60 {
      fixture.time += 1_000
      for _ in 0..<5 { await Task.yield() }
    }
    #expect(try await run.run().offline)
    #expect(calls.load(ordering: .relaxed) == 0)
    #expect(try Self.starts(store.queue).isEmpty)
    let tasks = try store.queue.pendingTasks()
    #expect(tasks.count == 50)
    #expect(tasks.allSatisfy { $0.attempts == 0 && $0.status != .dead })
    network.set(online: true)
    // Back online: the automatic loop goes on without the app calling run() and without the clock moving.
    try await pollUntil { (try? store.queue.pendingTasks().isEmpty) == true }
    #expect(calls.load(ordering: .relaxed) == 50)
    #expect(try Self.starts(store.queue).sorted() == ids)
  }

  @Test func aDeferralGivesItsAttemptBackAndGrowsNoBackoff() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"), groupId: "g")
    let behind = try await queue.add(tag: "t", payload: Item(name: "b"), groupId: "g")
    let deferrals = Atomic<Int>(0)
    let run = runner(queue) {
      $0.defaultRetry = RetryPolicy(maxAttempts: 2)
      $0.deferralDelay = .seconds(30)
    }
    run.register(tag: "t") { task in
      if deferrals.add(1, ordering: .relaxed).newValue <= 10 { return .deferred("server unreachable") }
      return .succeeded
    }
    for _ in 0..<10 {
      let report = try await run.run()
      #expect(report.outcome(of: id) == .deferred("server unreachable"))
      // Its group waits with it; its attempt is back and it is ready, with no retry time.
      #expect(report.outcome(of: behind) == .skipped(.partOfFailedGroup))
      let task = try #require(try queue.task(id))
      #expect(task.attemptsSpent == 0)
      #expect(task.status == .ready)
      // Passed over by this runner until the deferral delay (or the network's return).
      #expect(try await run.run().entries.isEmpty)
      fixture.time += 30_000
    }
    #expect(try await run.run().succeeded == 2)
    let history = try queue.history(of: id).map(\.event)
    #expect(history.filter { $0 == .runDeferred(reason: "server unreachable") }.count == 10)
    try expectConsistent(queue)
  }

  @Test func aRetryableFailureWhileOfflineIsADeferralAndAFinalOneIsNot() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let network = ManualConnectivity(online: true)
    let dropped = try await queue.add(tag: "drops", payload: Item(name: "a"))
    let refused = try await queue.add(tag: "refused", payload: Item(name: "b"))
    let run = runner(queue) { $0.connectivity = network }
    run.register(tag: "drops") { _ in
      network.set(online: false)  // the network went away during the request
      return .failed("The Internet connection appears to be offline.")
    }
    let report = try await run.run()
    #expect(
      report.outcome(of: dropped) == .deferred("offline: The Internet connection appears to be offline."))
    #expect(try queue.task(dropped)?.attemptsSpent == 0)
    #expect(report.outcome(of: refused) == nil, "nothing starts once offline")
    #expect(try await run.run(.task(refused)).outcome(of: refused) == .skipped(.offline))
    network.set(online: true)
    run.register(tag: "refused") { _ in .failed("400 bad request", retryable: false) }
    run.register(tag: "drops") { _ in .succeeded }
    let online = try await run.run()
    #expect(online.outcome(of: dropped) == .succeeded)
    #expect(online.outcome(of: refused) == .failed("400 bad request", retryAt: nil))
    #expect(try queue.task(refused)?.status == .dead)
  }

  @Test func aWindowWaitsForTheNetworkUntilItsDeadline() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let network = ManualConnectivity(online: false)
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    let run = runner(queue) { $0.connectivity = network }
    run.register(tag: "t") { _ in .succeeded }
    let window = Task { try await run.run(for: .seconds(25)) }
    // The window is waiting (offline): it has not ended on its own.
    for _ in 0..<200 { await Task.yield() }
    try await Task.sleep(for: .milliseconds(50))
    #expect(try queue.task(id) != nil)
    network.set(online: true)
    let report = try await window.value
    #expect(report.outcome(of: id) == .succeeded)
    #expect(report.end == .outOfWork)
    // Offline until the deadline: the window ends there having started nothing.
    let later = try await queue.add(tag: "t", payload: Item(name: "b"))
    network.set(online: false)
    let offline = Task { try await run.run(for: .seconds(25)) }
    for _ in 0..<200 { await Task.yield() }
    fixture.time += 26_000
    let ended = try await offline.value
    #expect(ended.end == .deadline)
    #expect(try queue.task(later)?.attempts == 0)
  }

  @Test func anInterruptedRunGivesItsAttemptBack() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    let started = Gate()
    let run = runner(queue) { $0.interruptionGrace = .zero }
    run.register(tag: "t") { _ in
      started.open()
      try await Task.sleep(for: .seconds(3600))
      return .succeeded
    }
    let pass = Task { try await run.run() }
    await started.wait()
    run.stop()
    _ = try? await pass.value
    let task = try #require(try queue.task(id))
    #expect(task.attempts == 1)
    #expect(task.attemptsSpent == 0)
    #expect(task.status == .ready)
    try expectConsistent(queue)
  }

  @Test func theDefaultPolicyNeverGivesUpOnAChangeByItself() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let queue = try await fixture.open()
    defer { queue.close() }
    let id = try await queue.add(tag: "t", payload: Item(name: "a"))
    let run = runner(queue)
    run.register(tag: "t") { _ in .failed("503") }
    for _ in 0..<30 {
      _ = try await run.run()
      fixture.time += 3_700_000  // past the 1 h cap
    }
    let task = try #require(try queue.task(id))
    #expect(task.attempts == 30)
    #expect(task.status != .dead)
    #expect(RetryPolicy().maxAttempts == RetryPolicy.unlimited)
  }
}
