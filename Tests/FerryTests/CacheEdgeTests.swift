import FerryLog
import FerryTesting
import Foundation
import Synchronization
import Testing

@testable import Ferry

/// Races and edges of the pull side found in review, each pinned by a test.
@Suite(.timeLimit(.minutes(20))) struct CacheEdgeTests {
  @Test func aMaxAgeThatNeverEndsSetsNoTimer() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      try await store.ledger.makeFresh("notes")
      let loads = Mutex(0)
      var source = backend.source
      let load = source.load
      source.load = {
        loads.withLock { $0 += 1 }
        return try await load()
      }
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(Int64.max), source: source,
        automaticRefresh: false
      )
      var states = notes.states().makeAsyncIterator()
      _ = await states.next()
      for _ in 0..<2000 { await Task.yield() }
      #expect(loads.withLock { $0 } == 1)
      #expect(try store.ledger.keys(olderThan: .seconds(Int64.max)).isEmpty)
    }
  }

  @Test func theGateIgnoresFailuresOutsideItsCollection() async throws {
    try await withStore { store, clock, fixture in
      var configuration = TaskRunner.Configuration()
      configuration.collections = ["notes-changes": ["save-note"]]
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      let entered = Gate()
      let release = Gate()
      runner.register(tag: "save-note") { _ in .succeeded }
      runner.register(tag: "upload-photo") { _ in
        entered.open()
        await release.wait()
        return .failed("photo server down")
      }
      try await store.queue.add(tag: "upload-photo", payload: ["photo": "1"])
      try await store.queue.add(tag: "save-note", payload: ["text": "eggs"])
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source,
        requires: try PendingTasksGate(runner: runner, collection: "notes-changes"))
      let all = Task { try await runner.run() }  // the gate's pass joins this .all pass
      await entered.wait()
      async let refreshed = notes.refresh()
      release.open()
      #expect(await refreshed == .successful)
      _ = try await all.value
      #expect(try store.queue.pendingTasks().map(\.tag) == ["upload-photo"])
    }
  }

  @Test func severalObserversOfOneCrossingCauseOneFetch() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend(blocks: true)
      try await store.ledger.makeFresh("notes")
      var observers: [Task<Void, Never>] = []
      for _ in 0..<4 {
        let repository = try CacheRepository(
          key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
        observers.append(Task { for await _ in repository.states() {} })
      }
      await clock.waitForSleepers(4)
      clock.advance(by: .seconds(61))
      while backend.fetches == 0 { await Task.yield() }
      for _ in 0..<2000 { await Task.yield() }
      backend.release.open()
      for _ in 0..<2000 { await Task.yield() }
      for observer in observers { observer.cancel() }
      #expect(backend.fetches == 1)
    }
  }

  @Test func aKeyForgottenWhileObservedIsFetchedAgain() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      var states = notes.states().makeAsyncIterator()
      _ = await states.next()
      try await store.ledger.forget("notes")
      while let state = await states.next() {
        if state.justFinishedSuccessfulRefresh { break }
      }
      #expect(backend.fetches == 1)
      #expect(try store.ledger.state(key: "notes", maxAge: .seconds(60)) != .noCache)
    }
  }

  @Test func anObserverArrivingAsARefreshEndsNeverSeesItStillRunning() async throws {
    try await withStore { store, clock, fixture in
      var stale = 0
      for i in 0..<200 {
        let backend = NotesBackend()
        backend.state.withLock { $0.failFetch = "503" }
        let repository = try CacheRepository(
          key: "k\(i)", ledger: store.ledger, maxAge: .seconds(60), source: backend.source,
          automaticRefresh: false)
        let notices = store.ledger.changes.stream(for: CacheKeyBytes("k\(i)")) { nil }
        let refresh = Task.detached { await repository.refresh() }
        for await notice in notices {
          if case .refreshFinished = notice { break }
        }
        var states = repository.states().makeAsyncIterator()
        if await states.next()?.isRefreshing == true { stale += 1 }
        _ = await refresh.value
      }
      #expect(stale == 0)
    }
  }

  @Test func aNewObserverSeesTheLastErrorAndAFailingLoadStillGivesAState() async throws {
    try await withStore { store, clock, fixture in
      try await store.ledger.makeFresh("notes")
      clock.advance(by: .seconds(1))
      try await store.ledger.recordFetch(key: "notes", outcome: .failure("503 from the server"))
      struct Corrupt: Error {}
      let source = CacheSource<[String]>(fetch: { [] }, save: { _ in }, load: { throw Corrupt() })
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: source, automaticRefresh: false)
      var states = notes.states().makeAsyncIterator()
      let first = try #require(await states.next())
      // Read back from the ledger (recorded by whoever fetched): its message, no underlying error.
      #expect(first.refreshError == RefreshError(stage: .recorded, message: "503 from the server"))
      #expect(first.refreshError?.underlying == nil)
      guard case .cache(let value, _, _, isTooOld: false) = first.content else {
        Issue.record("expected a fresh cache")
        return
      }
      #expect(value == nil)
    }
  }
}
