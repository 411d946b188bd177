import FerryLog
import Foundation
import Testing

@testable import Ferry

@Suite struct CacheDateTests {
  @Test func timesComeAndGoAsDatesWhileTheLogKeepsMilliseconds() async throws {
    try await withStore { store, clock, _ in
      let fetched = Date(timeIntervalSince1970: Double(clock.milliseconds - 5_250) / 1000)
      try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false), at: fetched)
      let record = try #require(try store.ledger.record("notes"))
      #expect(record.lastSuccessMs == clock.milliseconds - 5_250)  // milliseconds inside
      #expect(record.lastSuccess == fetched)
      #expect(record.lastAttempt == fetched)
      #expect(record.lastFailure == nil)
      let age = try store.ledger.state(key: "notes", maxAge: .seconds(3600))
      #expect(age.lastFetched == fetched)
      #expect(store.ledger.now == clock.date)

      let notes = try CacheRepository(
        key: "notes", ledger: store.ledger, maxAge: .seconds(3600),
        source: CacheSource(fetch: { "x" }, save: { _ in }, load: { "x" }), automaticRefresh: false)
      let state = try await notes.currentState()
      #expect(state.lastFetched == fetched)
      #expect(state.age == .milliseconds(5_250))
      #expect(Date.distantFuture.unixMilliseconds > 0 && Date.distantPast.unixMilliseconds < 0)
    }
  }
}
