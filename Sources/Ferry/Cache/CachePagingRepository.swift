import FerryLog
import Synchronization

/// Where a paged list comes from and goes to: the server's pages, and the app's own cache of them.
public struct PagingSource<Page: Sendable, Cached: Sendable>: Sendable {
  /// Fetches one page: `next` is nil for the first page, else what the previous page said the next
  /// one needs (the app's own encoding); returns the page and what the page after it needs (nil
  /// when it was the last).
  public var fetchPage: @Sendable (_ next: [UInt8]?) async throws -> (page: Page, next: [UInt8]?)
  /// Saves a page into the app's cache: `first` replaces everything the cache holds (a refresh keeps
  /// only the first page), otherwise the page is appended.
  public var save: @Sendable (_ page: Page, _ first: Bool) async throws -> Void
  /// Loads what the app's cache holds now (every page saved), nil when nothing.
  public var load: @Sendable () async throws -> Cached?

  /// Describes the source.
  public init(
    fetchPage: @escaping @Sendable (_ next: [UInt8]?) async throws -> (page: Page, next: [UInt8]?),
    save: @escaping @Sendable (_ page: Page, _ first: Bool) async throws -> Void,
    load: @escaping @Sendable () async throws -> Cached?
  ) {
    self.fetchPage = fetchPage
    self.save = save
    self.load = load
  }
}

/// How loading the next page ended.
public enum LoadMoreResult: Sendable, Equatable {
  /// The next page was fetched and saved.
  case loaded
  /// There is no next page (or no first page yet: refresh first).
  case noMorePages
  /// Fetching or saving the page failed; the paging state is unchanged.
  case failed(RefreshError)
}

/// A paged list kept fresh like any cache (Teller's paging repository): `refresh()` fetches the
/// first page and keeps only it, `loadMore()` appends the next, and what the next page needs —
/// and whether there is one — is kept in the ledger, so it survives restarts.
///
/// ```swift
/// let feed = try CachePagingRepository(key: "feed", ledger: store.ledger, maxAge: .seconds(600), source: source)
/// for await state in feed.states() { render(state) }    // refreshes the first page when too old
/// if feed.morePagesAvailable { _ = await feed.loadMore() }
/// ```
public final class CachePagingRepository<Page: Sendable, Cached: Sendable>: Sendable {
  /// What the first-page repository holds: a fetched page on its way to the app's cache, or what
  /// the cache holds.
  enum Item: Sendable {
    case fetched(Page, next: [UInt8]?)
    case cached(Cached?)
  }

  /// The cache key.
  public let key: String
  /// The ledger that records its fetches and paging state.
  public let ledger: CacheLedger
  let first: CacheRepository<Item>
  let source: PagingSource<Page, Cached>
  private let loading = Mutex<Task<LoadMoreResult, Never>?>(nil)

  /// A paged repository of `key`. With `automaticRefresh`, observing it refreshes the first page
  /// when there is none or it is too old; with a `refreshInterval`, every interval while observed
  /// (as ``CacheRepository/init(key:ledger:maxAge:source:automaticRefresh:refreshInterval:connectivity:requires:)``).
  ///
  /// - Parameters:
  ///   - key: The cache key: 1 to ``CacheLedger/maxKeyLength`` UTF-8 bytes.
  ///   - ledger: The ledger that records its fetches (``FerryStore/ledger``).
  ///   - maxAge: Older than this, the cache is too old; not negative.
  ///   - source: Where its pages come from and go to (``PagingSource``).
  ///   - automaticRefresh: Whether observing it refreshes the first page of a cache that is missing or too
  ///     old.
  ///   - refreshInterval: While observed, refresh at least this long after the key's last fetch, too old or
  ///     not; at least 1 ms. Nil: no interval.
  ///   - connectivity: What tells the interval's refreshes that the device is offline; the gate's runner's
  ///     when nil.
  ///   - gate: Tasks to run before each refresh, so that a fetch never overwrites changes the server has not
  ///     seen (``PendingTasksGate``); nil for none.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``CacheLedger/maxKeyLength``
  ///   UTF-8 bytes, a negative `maxAge`, a `refreshInterval` under a millisecond (the log's unit), or a gate
  ///   whose runner runs another store's queue.
  public init(
    key: String, ledger: CacheLedger, maxAge: Duration, source: PagingSource<Page, Cached>,
    automaticRefresh: Bool = true, refreshInterval: Duration? = nil, connectivity: (any Connectivity)? = nil,
    requires gate: PendingTasksGate? = nil
  ) throws(FerryError) {
    self.key = key
    self.ledger = ledger
    self.source = source
    first = try CacheRepository<Item>(
      key: key, ledger: ledger, maxAge: maxAge,
      source: CacheSource(
        fetch: {
          let (page, next) = try await source.fetchPage(nil)
          return .fetched(page, next: next)
        },
        save: { item in
          guard case .fetched(let page, let next) = item else { return }
          try await source.save(page, true)
          try await ledger.setPaging(key: key, next: next, morePagesAvailable: next != nil)
        },
        load: { .cached(try await source.load()) }),
      automaticRefresh: automaticRefresh, refreshInterval: refreshInterval, connectivity: connectivity,
      requires: gate)
  }

  /// Refreshes the first page when the cache is too old or missing (always, with `force`); the
  /// app's cache then holds only that page.
  ///
  /// - Parameter force: Fetch whatever the cache's age (the gate still applies).
  /// - Returns: How it ended: ``RefreshOutcome/successful``, skipped and why (``RefreshSkipReason``), or
  ///   failed with the error (``RefreshError``). It never throws: a failure is an outcome.
  public func refresh(force: Bool = false) async -> RefreshOutcome { await first.refresh(force: force) }

  /// Refreshes only when there is no cache yet.
  ///
  /// - Returns: ``RefreshOutcome/successful`` at once when the key has a cache; else the refresh's outcome.
  public func refreshIfNoCache() async -> RefreshOutcome { await first.refreshIfNoCache() }

  /// Whether a next page is available (as the last page fetched said; kept across restarts).
  public var morePagesAvailable: Bool { ((try? ledger.record(key)) ?? nil)?.morePagesAvailable ?? false }

  /// Fetches and appends the next page. One load runs at a time: callers share it.
  ///
  /// - Returns: ``LoadMoreResult/loaded``, ``LoadMoreResult/noMorePages``, or the failure; the paging state
  ///   is unchanged unless the page was saved.
  public func loadMore() async -> LoadMoreResult {
    let task = loading.withLock { loading -> Task<LoadMoreResult, Never> in
      if let running = loading { return running }
      let task = Task { [self] in
        defer { self.loading.withLock { $0 = nil } }
        return await performLoadMore()
      }
      loading = task
      return task
    }
    return await task.value
  }

  private func performLoadMore() async -> LoadMoreResult {
    guard let record = (try? ledger.record(key)) ?? nil, record.morePagesAvailable, let next = record.nextPage
    else { return .noMorePages }
    let page: Page
    let following: [UInt8]?
    do {
      (page, following) = try await source.fetchPage(next)
    } catch {
      return .failed(
        RefreshError(stage: .fetch, message: "fetching the next page failed: \(error)", underlying: error))
    }
    do {
      try await source.save(page, false)
    } catch {
      return .failed(
        RefreshError(stage: .save, message: "saving the next page failed: \(error)", underlying: error))
    }
    do {
      try await ledger.setPaging(key: key, next: following, morePagesAvailable: following != nil)
    } catch {
      return .failed(
        RefreshError(
          stage: .recording, message: "the paging state could not be recorded: \(error)", underlying: error))
    }
    return .loaded
  }

  /// The states of the list: as ``CacheRepository/states()``, with the app's cached pages.
  ///
  /// - Returns: The states, ending when the observing task is cancelled.
  public func states() -> AsyncStream<CacheState<Cached>> {
    let upstream = first.states()
    let (stream, continuation) = AsyncStream<CacheState<Cached>>.makeStream(
      bufferingPolicy: .bufferingNewest(16))
    let forward = Task {
      for await state in upstream { continuation.yield(Self.cachedState(state)) }
      continuation.finish()
    }
    continuation.onTermination = { _ in forward.cancel() }
    return stream
  }

  /// The state now.
  ///
  /// - Returns: The list's state now, with the app's cached pages.
  /// - Throws: A ``FerryError`` when the ledger or the gate's queue cannot be read: ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended; ``FerryError/notCurrent(_:)``,
  ///   ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)`` when the read fails.
  public func currentState() async throws(FerryError) -> CacheState<Cached> {
    Self.cachedState(try await first.currentState())
  }

  static func cachedState(_ state: CacheState<Item>) -> CacheState<Cached> {
    let content: CacheState<Cached>.Content
    switch state.content {
    case .noCache: content = .noCache
    case .cache(let item, let lastFetched, let age, let isTooOld):
      var cached: Cached?
      if case .cached(let value)? = item { cached = value }
      content = .cache(cached, lastFetched: lastFetched, age: age, isTooOld: isTooOld)
    }
    return CacheState(
      content: content, isRefreshing: state.isRefreshing, refreshError: state.refreshError,
      justFinishedFirstFetch: state.justFinishedFirstFetch,
      justFinishedSuccessfulRefresh: state.justFinishedSuccessfulRefresh)
  }
}
