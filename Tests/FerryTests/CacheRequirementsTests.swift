import FerryLog
import Foundation
import Synchronization
import Testing

@testable import Ferry

@Suite(.timeLimit(.minutes(20))) struct CacheRequirementsTests {
  /// A server with a feed per user and an app cache per user; counts fetches per user.
  final class Feeds: Sendable {
    let state = Mutex<(saved: [String: [String]], fetches: [String: Int])>(([:], [:]))

    func source(_ user: String) -> CacheSource<[String]> {
      CacheSource(
        fetch: { [self] in
          state.withLock { $0.fetches[user, default: 0] += 1 }
          return ["\(user)'s post"]
        },
        save: { [self] posts in state.withLock { $0.saved[user] = posts } },
        load: { [self] in state.withLock { $0.saved[user] } })
    }

    func fetches(_ user: String) -> Int { state.withLock { $0.fetches[user] ?? 0 } }
  }

  /// Reads states until one matches, failing after `limit` states.
  static func next(
    _ iterator: inout AsyncStream<CacheState<[String]>?>.Iterator, limit: Int = 20,
    where matches: (CacheState<[String]>?) -> Bool
  ) async -> [CacheState<[String]>?] {
    var seen: [CacheState<[String]>?] = []
    while seen.count < limit, let state = await iterator.next() {
      seen.append(state)
      if matches(state) { return seen }
    }
    Issue.record("no matching state in \(seen.count) states")
    return seen
  }

  static func posts(_ state: CacheState<[String]>?) -> [String]? {
    guard case .cache(let value, _, _, _) = state?.content else { return nil }
    return value
  }

  @Test func statesFollowTheRequirementsAndNeverShowTheOldOnesAfterASwitch() async throws {
    try await withStore { store, _, _ in
      let feeds = Feeds()
      let feed = try CacheRequirementsRepository<String, [String]>(
        ledger: store.ledger, maxAge: .seconds(600), key: { "feed:\($0)" }, source: { feeds.source($0) })
      var states = feed.states().makeAsyncIterator()
      let first = await states.next()
      #expect(first != nil && first! == nil)  // no requirements yet: a nil state

      try feed.setRequirements("alice")
      _ = await Self.next(&states) { Self.posts($0) == ["alice's post"] }  // refreshed by itself
      #expect(feeds.fetches("alice") == 1)

      try feed.setRequirements("bob")
      let afterSwitch = await Self.next(&states) { Self.posts($0) == ["bob's post"] }
      // Once bob's first state is shown (no cache yet, or his posts), nothing of alice's follows;
      // states of alice's yielded before the switch may still be in the stream's buffer before it.
      let bobsFirst = afterSwitch.firstIndex { state in
        if case .noCache = state?.content { return true }
        return Self.posts(state) == ["bob's post"]
      }
      let fromBob = afterSwitch[(bobsFirst ?? afterSwitch.endIndex)...]
      #expect(!fromBob.isEmpty && fromBob.allSatisfy { Self.posts($0) != ["alice's post"] })
      #expect(await feed.refresh() == .skipped(.notTooOld))
      #expect(feed.repository?.key == "feed:bob")

      try feed.setRequirements("alice")  // still fresh: shown from the app's cache, not fetched again
      _ = await Self.next(&states) { Self.posts($0) == ["alice's post"] }
      #expect(feeds.fetches("alice") == 1)
      #expect(try store.ledger.record("feed:alice")?.fetchCount == 1)
      #expect(try store.ledger.record("feed:bob")?.fetchCount == 1)

      try feed.setRequirements(nil)  // signed out
      _ = await Self.next(&states) { $0 == nil }
      #expect(await feed.refresh() == .skipped(.cancelled))
    }
  }

  @Test func aKeyThatIsNotValidIsRefusedAndChangesNothing() async throws {
    try await withStore { store, _, _ in
      let feeds = Feeds()
      let feed = try CacheRequirementsRepository<String, [String]>(
        ledger: store.ledger, maxAge: .seconds(600), key: { $0 }, source: { feeds.source($0) },
        automaticRefresh: false)
      try feed.setRequirements("alice")
      #expect(throws: (any Error).self) { try feed.setRequirements("") }
      #expect(feed.requirements == "alice")
    }
  }
}
