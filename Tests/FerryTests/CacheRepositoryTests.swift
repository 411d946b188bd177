import FerryLog
import FerryTesting
import Foundation
import Synchronization
import Testing

@testable import Ferry

/// A fake server and app cache: counts fetches, can block them, fail them, or fail the save.
final class NotesBackend: Sendable {
  struct State {
    var serverValue = ["milk"]
    var saved: [String]?
    var fetches = 0
    var failFetch: String?
    var failSave = false
  }
  let state = Mutex(State())
  let release = Gate()
  let blocks: Bool

  init(blocks: Bool = false) {
    self.blocks = blocks
    if !blocks { release.open() }
  }

  var source: CacheSource<[String]> {
    CacheSource(
      fetch: { [self] in
        let (value, failure) = state.withLock { s -> ([String], String?) in
          s.fetches += 1
          return (s.serverValue, s.failFetch)
        }
        await release.wait()
        if let failure { throw NSError(domain: failure, code: 1) }
        return value
      },
      save: { [self] value in
        struct DiskFull: Error {}
        if state.withLock({ $0.failSave }) { throw DiskFull() }
        state.withLock { $0.saved = value }
      },
      load: { [self] in state.withLock { $0.saved } },
      isEmpty: { $0.isEmpty })
  }

  var fetches: Int { state.withLock { $0.fetches } }
}

@Suite(.timeLimit(.minutes(20))) struct CacheRepositoryTests {
  @Test func refreshFetchesWhenThereIsNoCacheOrItIsTooOld() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      #expect(await notes.refreshIfNoCache() == .successful)
      #expect(backend.state.withLock { $0.saved } == ["milk"])
      // A key with a cache needs nothing from refreshIfNoCache: that is a success, and no fetch.
      #expect(await notes.refreshIfNoCache() == .successful)
      #expect(await notes.refresh() == .skipped(.notTooOld))
      clock.advance(by: .seconds(60))  // exactly max age: not too old
      #expect(await notes.refresh() == .skipped(.notTooOld))
      clock.advance(by: .milliseconds(1))
      #expect(await notes.refreshIfNoCache() == .successful)  // too old, but it has a cache: no fetch
      #expect(backend.fetches == 1)
      #expect(await notes.refresh() == .successful)
      #expect(await notes.refresh(force: true) == .successful)
      #expect(backend.fetches == 3)
      #expect(try store.ledger.record("notes")?.fetchCount == 3)
      try expectConsistent(store.queue)
    }
  }

  @Test func aFailedFetchOrSaveKeepsTheLastSuccessTime() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      try await store.ledger.makeTooOld("notes", maxAge: .seconds(60))
      let fetchedAt = try #require(try store.ledger.record("notes")?.lastSuccess)

      backend.state.withLock { $0.failFetch = "offline" }
      guard case .failed(let fetchError) = await notes.refresh() else {
        Issue.record("the fetch did not fail")
        return
      }
      // The source's own error comes through, typed: no parsing of text to tell failures apart.
      #expect(fetchError.stage == .fetch)
      #expect((fetchError.underlying as? NSError)?.domain == "offline")
      #expect(fetchError.message.contains("offline"))
      backend.state.withLock {
        $0.failFetch = nil
        $0.failSave = true
      }
      guard case .failed(let saveError) = await notes.refresh() else {
        Issue.record("the save did not fail")
        return
      }
      #expect(saveError.stage == .save)
      #expect(saveError.underlying.map { "\(type(of: $0))" } == "DiskFull")
      #expect(saveError.message.contains("save failed"))
      let record = try #require(try store.ledger.record("notes"))
      #expect(record.lastSuccess == fetchedAt)
      #expect(record.lastFailure?.message.contains("save failed") == true)
      #expect(backend.state.withLock { $0.saved } == nil)
      try expectConsistent(store.queue)
    }
  }

  @Test func aHundredConcurrentCallersShareOneFetch() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend(blocks: true)
      let first = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      let second = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      let results = await withTaskGroup(of: RefreshOutcome.self) { group in
        for i in 0..<100 { group.addTask { await (i.isMultiple(of: 2) ? first : second).refresh() } }
        while backend.fetches == 0 { await Task.yield() }
        backend.release.open()
        var results: [RefreshOutcome] = []
        for await result in group { results.append(result) }
        return results
      }
      #expect(results.count == 100)
      #expect(results.allSatisfy { $0 == .successful })
      #expect(backend.fetches == 1)
      #expect(try store.ledger.record("notes")?.fetchCount == 1)
    }
  }

  @Test func observingRefreshesAMissingCacheAndReportsTheFirstFetch() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      var seen: [CacheState<[String]>] = []
      for await state in notes.states() {
        seen.append(state)
        if state.justFinishedFirstFetch { break }
      }
      guard case .noCache = seen.first?.content else {
        Issue.record("the first state was not noCache")
        return
      }
      #expect(seen.contains { $0.isRefreshing })
      let last = try #require(seen.last)
      #expect(last.justFinishedSuccessfulRefresh)
      #expect(!last.isRefreshing)
      guard case .cache(let value, _, let age, let isTooOld) = last.content else {
        Issue.record("no cache after the first fetch")
        return
      }
      #expect(value == ["milk"])
      #expect(age == .zero)
      #expect(!isTooOld)
    }
  }

  @Test func anObservedCacheIsToldWhenItCrossesItsMaxAge() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source,
        automaticRefresh: false)
      var states = notes.states().makeAsyncIterator()
      let fresh = try #require(await states.next())
      guard case .cache(_, _, _, isTooOld: false) = fresh.content else {
        Issue.record("expected a fresh cache")
        return
      }
      await clock.waitForSleepers()
      clock.advance(by: .milliseconds(60_001))
      let stale = try #require(await states.next())
      guard case .cache(_, _, let age, isTooOld: true) = stale.content else {
        Issue.record("expected a too-old cache")
        return
      }
      #expect(age == .milliseconds(60_001))
      #expect(backend.fetches == 0)  // automatic refresh is off
    }
  }

  @Test func anObservedCacheThatGetsTooOldIsRefreshedByItself() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      try await store.ledger.makeFresh("notes")
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      var states = notes.states().makeAsyncIterator()
      _ = await states.next()
      await clock.waitForSleepers()
      clock.advance(by: .seconds(61))
      var refreshed = false
      while let state = await states.next() {
        if state.justFinishedSuccessfulRefresh {
          refreshed = true
          #expect(!state.justFinishedFirstFetch)
          break
        }
      }
      #expect(refreshed)
      #expect(backend.fetches == 1)
      #expect(
        try store.ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: clock.date, age: .zero, isTooOld: false))
    }
  }

  @Test func aFailingServerIsNotAskedAgainAndAgainWhileObserved() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend()
      backend.state.withLock { $0.failFetch = "503" }
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      var states = notes.states().makeAsyncIterator()
      var failed = false
      while let state = await states.next() {
        if let error = state.refreshError {
          #expect(error.message.contains("503"))
          failed = true
          break
        }
      }
      #expect(failed)
      // Give a storm every chance to show itself: many scheduling turns, one fetch.
      for _ in 0..<2000 { await Task.yield() }
      #expect(backend.fetches == 1)
      #expect(try store.ledger.record("notes")?.fetchCount == 1)
    }
  }

  @Test func aRefreshWaitsForPendingChangesToReachTheServer() async throws {
    try await withStore { store, clock, fixture in
      let serverUp = Mutex(false)
      var configuration = TaskRunner.Configuration()
      configuration.collections = ["notes-changes": ["save-note"]]
      let runner = TaskRunner(queue: store.queue, configuration: configuration)
      runner.register(tag: "save-note") { _ in serverUp.withLock { $0 } ? .succeeded : .failed("offline") }
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source,
        requires: try PendingTasksGate(runner: runner, collection: "notes-changes"))
      try await store.queue.add(tag: "save-note", payload: ["text": "buy eggs"])
      #expect(await notes.refresh() == .skipped(.pendingTasks))
      #expect(backend.fetches == 0)

      serverUp.withLock { $0 = true }
      clock.advance(by: .seconds(10))  // past the retry time of the failed save
      #expect(await notes.refresh() == .successful)
      #expect(backend.fetches == 1)
      #expect(try store.queue.pendingTasks().isEmpty)
      try expectConsistent(store.queue)
    }
  }

  @Test func cancellingAnObserverMidRefreshDoesNotCancelTheRefresh() async throws {
    try await withStore { store, clock, fixture in
      let backend = NotesBackend(blocks: true)
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source)
      let observer = Task {
        for await _ in notes.states() {}
      }
      while backend.fetches == 0 { await Task.yield() }  // the observer started the refresh
      observer.cancel()
      await observer.value
      async let joined = notes.refresh()
      backend.release.open()
      #expect(await joined == .successful)
      #expect(backend.fetches == 1)
      #expect(try store.ledger.state(key: "notes", maxAge: .seconds(60)) != .noCache)
    }
  }

  @Test func badKeysAndMaxAgesAreRefused() async throws {
    try await withStore { store, clock, fixture in
      let source = NotesBackend().source
      #expect(throws: FerryError.self) {
        try CacheRepository(key: "", ledger: store.ledger, maxAge: .seconds(1), source: source)
      }
      #expect(throws: FerryError.self) {
        try CacheRepository(key: "k", ledger: store.ledger, maxAge: .seconds(-1), source: source)
      }
    }
  }

  @Test func testHelpersPutAKeyInTheStateAskedFor() async throws {
    try await withStore { store, clock, fixture in
      try await store.ledger.makeTooOld("a", maxAge: .seconds(30))
      guard case .cache(_, let age, isTooOld: true) = try store.ledger.state(key: "a", maxAge: .seconds(30))
      else {
        Issue.record("makeTooOld did not make it too old")
        return
      }
      #expect(age == .milliseconds(30_001))
      try await store.ledger.makeFresh("a")
      #expect(
        try store.ledger.state(key: "a", maxAge: .seconds(30))
          == .cache(lastFetched: clock.date, age: .zero, isTooOld: false))
      try await store.ledger.makeNeverFetched("a")
      #expect(try store.ledger.state(key: "a", maxAge: .seconds(30)) == .noCache)
    }
  }

  /// Regression: `currentState()` said no error after a failed refresh, while `states()` showed it.
  @Test func currentStateCarriesTheLastRefreshError() async throws {
    try await withStore { store, clock, _ in
      let backend = NotesBackend()
      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(60), source: backend.source,
        automaticRefresh: false)
      #expect(await notes.refresh() == .successful)
      clock.advance(by: .seconds(61))
      backend.state.withLock { $0.failFetch = "offline" }
      guard case .failed = await notes.refresh() else {
        Issue.record("the refresh did not fail")
        return
      }
      let error = try #require(try await notes.currentState().refreshError)
      #expect(error.message.contains("offline"))
      #expect(error.stage == .fetch && error.underlying != nil)  // seen thrown here: kept whole
      backend.state.withLock { $0.failFetch = nil }
      clock.advance(by: .milliseconds(1))  // the ledger orders a failure and a success by their times
      #expect(await notes.refresh() == .successful)
      #expect(try await notes.currentState().refreshError == nil)
    }
  }
}
