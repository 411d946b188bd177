import FerryLog
import Foundation
import Synchronization
import Testing

@testable import Ferry

@Suite(.timeLimit(.minutes(20))) struct CachePagingTests {
  /// A server with three pages of posts and an app cache of the pages saved, in order.
  final class PostsServer: Sendable {
    static let pages = [["p1", "p2"], ["p3", "p4"], ["p5"]]
    let cache = Mutex<[String]?>(nil)
    let fetched = Mutex<[Int]>([])

    var source: PagingSource<[String], [String]> {
      PagingSource(
        fetchPage: { [self] next in
          let index = next.flatMap { $0.first.map(Int.init) } ?? 0
          fetched.withLock { $0.append(index) }
          let following = index + 1 < Self.pages.count ? [UInt8(index + 1)] : nil
          return (Self.pages[index], following)
        },
        save: { [self] page, first in cache.withLock { $0 = first ? page : ($0 ?? []) + page } },
        load: { [self] in cache.withLock { $0 } })
    }
  }

  @Test func pagesLoadOneAfterAnotherAcrossARestartAndARefreshKeepsOnlyTheFirst() async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let server = PostsServer()
    do {
      let store = try await fixture.openStore()
      defer { store.close() }
      let feed = try CachePagingRepository(
        key: "feed", ledger: store.ledger, maxAge: .seconds(600), source: server.source,
        automaticRefresh: false)
      #expect(await feed.loadMore() == .noMorePages)  // nothing to continue from yet
      #expect(await feed.refresh() == .successful)
      #expect(feed.morePagesAvailable)
      #expect(await feed.loadMore() == .loaded)
      guard case .cache(let cached, _, _, _) = try await feed.currentState().content else {
        Issue.record("no cache after two pages")
        return
      }
      #expect(cached == ["p1", "p2", "p3", "p4"])
    }
    // The app restarts: the paging state comes back from the ledger.
    let store = try await fixture.openStore()
    defer { store.close() }
    let feed = try CachePagingRepository(
      key: "feed", ledger: store.ledger, maxAge: .seconds(600), source: server.source, automaticRefresh: false
    )
    #expect(feed.morePagesAvailable)
    #expect(await feed.loadMore() == .loaded)
    #expect(server.cache.withLock { $0 } == ["p1", "p2", "p3", "p4", "p5"])
    #expect(!feed.morePagesAvailable)
    #expect(await feed.loadMore() == .noMorePages)
    // A refresh keeps only the first page, and paging starts again after it.
    #expect(await feed.refresh(force: true) == .successful)
    #expect(server.cache.withLock { $0 } == ["p1", "p2"])
    #expect(feed.morePagesAvailable)
    #expect(server.fetched.withLock { $0 } == [0, 1, 2, 0])
    // refreshes only: pages are not fetches of the key
    #expect(try store.ledger.record("feed")?.fetchCount == 2)
  }

  @Test func concurrentLoadsShareOneFetch() async throws {
    try await withStore { store, _, _ in
      let server = PostsServer()
      let feed = try CachePagingRepository(
        key: "feed", ledger: store.ledger, maxAge: .seconds(600), source: server.source,
        automaticRefresh: false)
      #expect(await feed.refresh() == .successful)
      async let a = feed.loadMore()
      async let b = feed.loadMore()
      let results = await [a, b]
      #expect(results.contains(.loaded))
      // Either both shared one load, or the second found the next page and loaded it: never the same page twice.
      let fetched = server.fetched.withLock { $0 }
      #expect(Set(fetched).count == fetched.count, "\(fetched)")
    }
  }
}
