import FerryLog
import FerryTesting
import Foundation
import Synchronization
import TestSupport
import Testing

@_spi(Engine) @testable import Ferry

/// The sync article's promises, attacked where they cross compaction, rebuilds and odd results.
@Suite(.timeLimit(.minutes(20))) struct SyncContractTests {
  /// A push made "notes" stale; the app did not refresh it for longer than the retention. The
  /// success's task is finished and old, but its invalidation is the only thing that says the
  /// cache is stale: a compaction followed by a rebuild (a projection's new version, `ferry
  /// rebuild`) must not make the stale cache read fresh.
  @Test func aStaleKeyStaysStaleThroughCompactionAndRebuild() async throws {
    try await withStore { store, clock, _ in
      try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
      // Another key fetched after its push: that invalidation is shadowed and may go.
      clock.advance(by: .seconds(1))
      let run = runner(store.queue)
      run.register(tag: "save-note") { _ in .succeeded(invalidating: ["notes", "other"]) }
      try await store.queue.add(tag: "save-note", payload: Item(name: "bread"))
      #expect(try await run.run().succeeded == 1)
      clock.advance(by: .seconds(1))
      try await store.ledger.recordFetch(key: "other", outcome: .success(isEmpty: false))
      #expect(try store.ledger.record("notes")?.isInvalidated == true)
      #expect(try store.ledger.record("other")?.isInvalidated == false)
      clock.advance(by: .seconds(8 * 86_400))
      _ = try await store.compact(retention: .seconds(7 * 86_400))
      #expect(try store.ledger.record("notes")?.isInvalidated == true)
      // What a rebuild without a usable snapshot replays: the log as it is now.
      let stale = try store.log.events(after: 0, limit: 1000).compactMap { event -> [String]? in
        guard event.type == "task.runSucceeded", case .runSucceeded(_, let details) = try TaskEvent(event)
        else {
          return nil
        }
        return details.invalidates
      }
      #expect(stale == [["notes", "other"]], "the push's invalidation was compacted away")
      _ = try await store.log.rebuild()
      #expect(
        try store.ledger.record("notes")?.isInvalidated == true, "the push's invalidation was compacted away")
      #expect(try store.ledger.record("other")?.isInvalidated == false)
      let report = try store.log.verify()
      #expect(report.isHealthy, "\(report.problems)")
    }
  }
}
