import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// Pushes and pulls agree: a push can make a cache stale; the gate waits only for tasks that can
/// still run and names the ones that cannot; a held refresh is visible and spends no attempt.
@Suite(.timeLimit(.minutes(20))) struct PushPullAgreementTests {
  static func gated(
    _ store: FerryStore, network: ManualConnectivity = ManualConnectivity(), backend: NotesBackend
  ) throws -> (TaskRunner, CacheRepository<[String]>) {
    let run = runner(store.queue) {
      $0.collections["note-changes"] = ["save-note"]
      $0.connectivity = network
    }
    let gate = try PendingTasksGate(runner: run, collection: "note-changes")
    let notes = try CacheRepository(
      key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: backend.source, requires: gate)
    return (run, notes)
  }

  @Test func aDeadTaskInTheGatedCollectionNoLongerHidesTheCacheAndIsNamed() async throws {
    try await withStore { store, _, _ in
      let backend = NotesBackend()
      let (run, notes) = try Self.gated(store, backend: backend)
      let dead = try await store.queue.add(tag: "save-note", payload: Item(name: "milk"), groupId: "note-1")
      let behind = try await store.queue.add(
        tag: "save-note", payload: Item(name: "oat milk"), groupId: "note-1")
      run.register(tag: "save-note") { _ in .failed("400: title too long", retryable: false) }
      // The very first fetch: the gate runs the task, it dies, and the refresh fetches anyway.
      #expect(await notes.refresh() == .successful)
      #expect(backend.fetches == 1)
      let state = try await notes.currentState()
      #expect(state.stuckTasks.map(\.id) == [dead, behind])
      #expect(state.stuckTasks.first?.status == .dead)
      guard case .cache(["milk"], _, _, isTooOld: false) = state.content else {
        Issue.record("\(state.content)")
        return
      }
      // Forced or not, a stuck task holds nothing back and spends nothing more.
      #expect(await notes.refresh(force: true) == .successful)
      #expect(try store.queue.task(dead)?.attempts == 1)
    }
  }

  @Test func aTaskBlockedByAnErrorForTheUserIsNamedTooAndResolvingItBringsItBack() async throws {
    try await withStore { store, _, _ in
      let backend = NotesBackend()
      let (run, notes) = try Self.gated(store, backend: backend)
      let id = try await store.queue.add(tag: "save-note", payload: Item(name: "BAD"))
      run.register(tag: "save-note") { _ in .recordError("the server refused the title") }
      #expect(await notes.refresh() == .successful)
      #expect(try await notes.currentState().stuckTasks.map(\.id) == [id])
      run.register(tag: "save-note") { _ in .succeeded(invalidating: ["notes"]) }
      try await store.queue.resolveError(id)
      #expect(try await notes.currentState().stuckTasks.isEmpty, "resolved: it can run, it is not stuck")
      // It runs, and its success makes the cache stale: the refresh fetches although the cache is fresh.
      #expect(try await run.run().succeeded == 1)
      #expect(await notes.refresh() == .successful)
      #expect(backend.fetches == 2)
      #expect(try store.queue.task(id) == nil)
      #expect(try await notes.currentState().stuckTasks.isEmpty)
    }
  }

  @Test func aPushThatMakesAKeyStaleMakesTheNextRefreshFetchWhateverItsAge() async throws {
    try await withStore { store, clock, _ in
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: backend.source)
      #expect(await notes.refresh() == .successful)
      #expect(await notes.refresh() == .skipped(.notTooOld))
      let run = runner(store.queue)
      run.register(tag: "save-note") { _ in
        backend.state.withLock { $0.serverValue = ["milk", "bread"] }
        return .succeeded(invalidating: ["notes", "note/1"])
      }
      try await store.queue.add(tag: "save-note", payload: Item(name: "bread"))
      _ = try await run.run()
      clock.advance(by: .seconds(5))
      let record = try #require(try store.ledger.record("notes"))
      #expect(record.isInvalidated)
      guard case .cache(_, _, isTooOld: true) = try store.ledger.state(key: "notes", maxAge: .seconds(3600))
      else {
        Issue.record("a key made stale by a push reads too old")
        return
      }
      #expect(await notes.refresh() == .successful)
      #expect(backend.state.withLock { $0.saved } == ["milk", "bread"])
      #expect(await notes.refresh() == .skipped(.notTooOld))
      // A key never fetched gets a row that says so, and still no cache.
      #expect(try store.ledger.state(key: "note/1", maxAge: .seconds(1)) == .noCache)
      // The push shows in the key's log, as `ferry log --key notes` filters it.
      let summaries = try store.log.events(after: 0, limit: 100).map(EventSummary.init)
      #expect(summaries.contains { $0.staleKeys.contains("notes") && $0.kind == .task("runSucceeded") })
      let report = try store.log.verify()
      #expect(report.isHealthy, "\(report.problems)")
    }
  }

  @Test func aHeldRefreshIsVisibleAndRefreshingOftenSpendsNoAttempt() async throws {
    try await withStore { store, clock, _ in
      let backend = NotesBackend()
      let network = ManualConnectivity(online: false)
      let (run, notes) = try Self.gated(store, network: network, backend: backend)
      let calls = Atomic<Int>(0)
      run.register(tag: "save-note") { _ in
        calls.add(1, ordering: .relaxed)
        return .failed("503")
      }
      let id = try await store.queue.add(tag: "save-note", payload: Item(name: "milk"))
      // Offline: held, forced or not, and no run starts.
      for _ in 0..<10 { #expect(await notes.refresh(force: true) == .skipped(.pendingTasks)) }
      #expect(calls.load(ordering: .relaxed) == 0)
      #expect(backend.fetches == 0)
      let state = try await notes.currentState()
      #expect(state.heldBackByPendingTasks == 1)
      #expect(state.stuckTasks.isEmpty)
      let skips = try store.log.events(after: 0, limit: 100).map(EventSummary.init).filter {
        $0.key == "notes"
      }
      #expect(skips.count == 10)
      #expect(skips.allSatisfy { $0.kind == .cache("refreshSkipped") })
      // Online: one run, a failure with a retry in 1 s; refreshing again and again before then
      // starts nothing more.
      network.set(online: true)
      #expect(await notes.refresh() == .skipped(.pendingTasks))
      for _ in 0..<10 { _ = await notes.refresh() }
      #expect(calls.load(ordering: .relaxed) == 1)
      #expect(try store.queue.task(id)?.attempts == 1)
      clock.advance(by: .seconds(2))
      run.register(tag: "save-note") { _ in .succeeded }
      #expect(await notes.refresh() == .successful)
      #expect(try await notes.currentState().heldBackByPendingTasks == nil)
    }
  }

  @Test func aPushLandingWhileAFetchIsInFlightIsFetchedAgain() async throws {
    try await withStore { store, _, _ in
      let backend = NotesBackend(blocks: true)
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(3600), source: backend.source)
      let refresh = Task { await notes.refresh() }
      try await pollUntil { backend.fetches == 1 }
      // The fetch read the server before the push; the push's success lands before the fetch is recorded.
      let run = runner(store.queue)
      run.register(tag: "save-note") { _ in
        backend.state.withLock { $0.serverValue = ["milk", "bread"] }
        return .succeeded(invalidating: ["notes"])
      }
      try await store.queue.add(tag: "save-note", payload: Item(name: "bread"))
      _ = try await run.run()
      backend.release.open()
      #expect(await refresh.value == .successful)
      #expect(backend.fetches == 2)
      #expect(backend.state.withLock { $0.saved } == ["milk", "bread"])
      #expect(await notes.refresh() == .skipped(.notTooOld))
    }
  }
}
