import FerryLog
import Foundation
import Testing

@testable import Ferry

@Suite(.timeLimit(.minutes(20))) struct CacheLedgerTests {
  @Test func aKeyIsTooOldOnlyOnceItIsOlderThanItsMaxAge() async throws {
    try await withStore { store, clock, fixture in
      let ledger = store.ledger
      #expect(try ledger.state(key: "notes", maxAge: .seconds(60)) == .noCache)
      let fetchedAt = fixture.time
      try await ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
      #expect(
        try ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: at(fetchedAt), age: .zero, isTooOld: false))
      fixture.time = fetchedAt + 60_000  // exactly max age: not too old
      #expect(
        try ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: at(fetchedAt), age: .seconds(60), isTooOld: false))
      fixture.time += 1
      #expect(
        try ledger.state(key: "notes", maxAge: .seconds(60))
          == .cache(lastFetched: at(fetchedAt), age: .milliseconds(60_001), isTooOld: true))
      try expectConsistent(store.queue)
    }
  }

  @Test func aFailureKeepsTheLastSuccessTime() async throws {
    try await withStore { store, clock, fixture in
      let ledger = store.ledger
      let success = fixture.time
      try await ledger.recordFetch(key: "k", outcome: .success(isEmpty: true))
      fixture.time += 5000
      try await ledger.recordFetch(key: "k", outcome: .failure("503"))
      let record = try #require(try ledger.record("k"))
      #expect(record.lastSuccess == at(success))
      #expect(record.lastSuccessWasEmpty)
      #expect(record.lastAttempt == at(success + 5000))
      #expect(record.lastFailure?.message == "503")
      #expect(record.fetchCount == 2)
      guard case .cache(let lastFetched, _, _) = try ledger.state(key: "k", maxAge: .seconds(1)) else {
        Issue.record("the cache was lost")
        return
      }
      #expect(lastFetched == at(success))
    }
  }

  @Test func aClockThatWentBackwardsNeverGivesANegativeAge() async throws {
    try await withStore { store, clock, fixture in
      try await store.ledger.recordFetch(key: "k", outcome: .success(isEmpty: false))
      fixture.time -= 10_000
      #expect(
        try store.ledger.state(key: "k", maxAge: .seconds(1))
          == .cache(lastFetched: at(fixture.time + 10_000), age: .zero, isTooOld: false))
    }
  }

  @Test func keysOlderThanAnAgeOldestFirstAndForget() async throws {
    try await withStore { store, clock, fixture in
      let ledger = store.ledger
      let start = fixture.time
      for (offset, key) in [(0, "a"), (1000, "b"), (2000, "c")] {
        try await ledger.recordFetch(
          key: key, outcome: .success(isEmpty: false), at: at(start + Int64(offset)))
      }
      try await ledger.recordFetch(key: "never", outcome: .failure("offline"))
      fixture.time = start + 3000
      #expect(try ledger.keys(olderThan: .milliseconds(1500)) == ["a", "b"])
      #expect(try ledger.keys(olderThan: .seconds(10)).isEmpty)
      // A newer success moves a key along the index.
      try await ledger.recordFetch(key: "a", outcome: .success(isEmpty: false), at: at(start + 2500))
      #expect(try ledger.keys(olderThan: .milliseconds(1500)) == ["b"])
      try await ledger.forget("b")
      #expect(try ledger.keys(olderThan: .zero) == ["c", "a"])
      #expect(try ledger.state(key: "b", maxAge: .seconds(1)) == .noCache)
      #expect(try ledger.record("b") == nil)
      try expectConsistent(store.queue)
    }
  }

  @Test func agesAndPagingSurviveReopen() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    var store = try await fixture.openStore()
    let fetched = at(fixture.time)
    try await store.ledger.recordFetch(key: "feed", outcome: .success(isEmpty: false))
    try await store.ledger.setPaging(key: "feed", next: Array("page=3".utf8), morePagesAvailable: true)
    store.close()
    store = try await fixture.openStore()
    defer { store.close() }
    let record = try #require(try store.ledger.record("feed"))
    #expect(record.lastSuccess == fetched)
    #expect(record.nextPage == Array("page=3".utf8))
    #expect(record.morePagesAvailable)
    try await store.ledger.setPaging(key: "feed", next: nil, morePagesAvailable: false)
    #expect(try store.ledger.record("feed")?.morePagesAvailable == false)
    #expect(try store.ledger.record("feed")?.lastSuccess == fetched)
    try expectConsistent(store.queue)
  }

  @Test func keysThatCannotBeStoredAreRefused() async throws {
    try await withStore { store, clock, fixture in
      await #expect(throws: FerryError.self) {
        try await store.ledger.recordFetch(key: "", outcome: .success(isEmpty: false))
      }
      await #expect(throws: FerryError.self) {
        try await store.ledger.recordFetch(
          key: String(repeating: "k", count: 401), outcome: .success(isEmpty: false))
      }
      try await store.ledger.recordFetch(
        key: String(repeating: "k", count: 400), outcome: .success(isEmpty: false))
      #expect(throws: FerryError.self) { try store.ledger.state(key: "", maxAge: .seconds(1)) }
      try expectConsistent(store.queue)
    }
  }
}
