import FerryLog
import Foundation
import Synchronization

/// How old a cache is.
public enum CacheAge: Sendable, Equatable {
  /// Never fetched successfully.
  case noCache
  /// Last fetched successfully at `lastFetched`, `age` ago; too old when `lastFetched` is earlier
  /// than now minus the max age (exactly max age old is not too old). Times are whole
  /// milliseconds, as the log keeps them.
  case cache(lastFetched: Date, age: Duration, isTooOld: Bool)

  /// When the key was last fetched successfully (nil with no cache).
  public var lastFetched: Date? {
    guard case .cache(let lastFetched, _, _) = self else { return nil }
    return lastFetched
  }
}

/// The pull side's ledger: every fetch of every cache key is an event, and the ages are a
/// projection of them, so they survive restarts and can be rebuilt and audited.
///
/// ```swift
/// try await store.ledger.recordFetch(key: "notes", outcome: .success(isEmpty: false))
/// if case .cache(_, _, isTooOld: true) = try store.ledger.state(key: "notes", maxAge: .seconds(3600)) { ... }
/// ```
public final class CacheLedger: Sendable {
  /// The longest cache key, in UTF-8 bytes (so an index key of time + key fits LMDB's 511).
  public static let maxKeyLength = 400

  let log: EventLog
  let clock: @Sendable () -> Int64
  /// Refreshes under way, by key: every caller and repository of a key shares one. Keys are
  /// told apart by their bytes, as the ledger stores them (two spellings of "café" are equal
  /// `String`s but two keys).
  let inFlight = Mutex<[CacheKeyBytes: Task<RefreshOutcome, Never>]>([:])
  /// The error of each key's last refresh in this process, while it failed (with the underlying
  /// error the source threw); nil after a success.
  private let refreshErrors = Mutex<[CacheKeyBytes: RefreshError]>([:])

  func rememberRefresh(_ result: RefreshOutcome, for key: String) {
    refreshErrors.withLock { errors in
      switch result {
      case .failed(let error): errors[CacheKeyBytes(key)] = error
      case .successful: errors[CacheKeyBytes(key)] = nil
      case .skipped: break
      }
    }
  }

  /// When each key's last refresh in this process ended (the store's clock, Unix ms), whatever its
  /// result: a refresh interval counts from it (`CacheRepository.refreshInterval`).
  private let refreshEnds = Mutex<[CacheKeyBytes: Int64]>([:])

  func refreshEnded(_ key: CacheKeyBytes) {
    let now = clock()
    refreshEnds.withLock { $0[key] = now }
  }

  func lastRefreshEnd(_ key: CacheKeyBytes) -> Int64? { refreshEnds.withLock { $0[key] } }

  /// The error of `key`'s last refresh in this process, if it failed and no fetch succeeded since.
  func lastRefreshError(_ key: String) -> RefreshError? {
    guard let error = refreshErrors.withLock({ $0[CacheKeyBytes(key)] }) else { return nil }
    // A success recorded since (by another repository or process) ends it.
    if let record = try? record(key), let success = record.lastSuccessMs, let failure = record.lastFailureMs,
      success > failure.at
    {
      return nil
    }
    return error
  }

  /// Changes per key, for the repositories observing them.
  let changes = Broadcaster<CacheNotice, CacheKeyBytes>(buffer: 64)

  let sleep: @Sendable (Int64) async -> Void

  init(
    log: EventLog, clock: @escaping @Sendable () -> Int64, sleep: @escaping @Sendable (Int64) async -> Void
  ) {
    self.log = log
    self.clock = clock
    self.sleep = sleep
    self.observer = CacheObserver(log: log)
    // Other processes' fetches are followed while anyone observes a key: an app that stopped
    // observing is not woken five times a second for nothing.
    changes.whileObserved { [weak self] observed in
      guard let self else { return }
      if observed { self.observeOtherProcesses() } else { self.otherProcessFollower.stop() }
    }
  }

  /// Whether this ledger reads the log for other processes' fetches now (while any key is
  /// observed).
  var followsOtherProcesses: Bool { otherProcessFollower.isRunning }

  /// Logging and metrics (Observability.swift).
  let observer: CacheObserver

  /// Tells observers of a key what other processes record about it.
  private let otherProcessFollower = OtherProcessFollower()

  func close() {
    otherProcessFollower.stop()
    log.close()
    changes.finish()
  }

  /// Stops reading other processes' fetches for a suspension (the queue suspends the log).
  func suspendTail() { otherProcessFollower.suspend() }

  /// Goes on reading other processes' fetches after a resume, from where it stopped (what a
  /// compaction removed meanwhile unread is told as a possible change, as at any time).
  func resumeTail() {
    otherProcessFollower.resume(log)
  }

  /// Starts telling this process's observers about fetches other processes record (an app
  /// extension refreshing a cache, say).
  private func observeOtherProcesses() {
    otherProcessFollower.start(log) { [weak self] event in
      guard let self else { return }
      if event.type == "task.runSucceeded", case .runSucceeded(_, let details)? = try? TaskEvent(event) {
        self.invalidated(details.invalidates)
        return
      }
      guard CacheEvent.typeSet.contains(event.type), let decoded = try? CacheEvent(event) else { return }
      switch decoded {
      case .fetched(let key, _, _), .forgotten(let key), .paging(let key, _, _), .refreshSkipped(let key, _):
        self.changes.publish(.changed, for: CacheKeyBytes(key))
      }
    } missed: { [weak self] in
      // Another process's events were compacted away unread (a key forgotten, say): every
      // observed key may have changed.
      self?.changes.publish(.mayHaveChanged, for: nil)
    }
  }

  /// The store's clock now (whole milliseconds, as the log keeps times).
  public var now: Date { Date(unixMilliseconds: clock()) }

  /// How far past the store's clock a fetch time may be (two clocks read a moment apart, a clock
  /// stepped back between them). A later one is refused: a fetch that "finished" in the future
  /// would keep its cache fresh until then — for `Int64.max`, forever.
  public static let maxFetchTimeAhead: Duration = .seconds(300)

  /// Records that a fetch of `key` finished. Durable before it returns.
  ///
  /// - Parameters:
  ///   - key: The cache key: 1 to ``maxKeyLength`` UTF-8 bytes.
  ///   - outcome: How the fetch ended: a success (and whether the data was empty) or a failure with its
  ///     message.
  ///   - date: When it finished — when the response arrived and was saved, for a success; now when nil. Kept
  ///     in whole milliseconds: the last millisecond at or before `date`.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``maxKeyLength`` UTF-8 bytes,
  ///   and for a time before 1970, more than ``maxFetchTimeAhead`` after the store's clock, or not a time at
  ///   all (an infinite or NaN interval); ``FerryError/closed`` or ``FerryError/suspended`` when the store is
  ///   closed or suspended; ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func recordFetch(key: String, outcome: FetchResult, at date: Date? = nil) async throws(FerryError) {
    try await engine {
      if let date, !date.timeIntervalSince1970.isFinite {
        throw FerryError.invalidArgument(
          "a fetch time must be a time, not \(date.timeIntervalSince1970) s since 1970")
      }
      try await recordFetch(key: key, outcome: outcome, atMilliseconds: date?.unixMilliseconds)
    }
  }

  /// ``recordFetch(key:outcome:at:)`` with the time as the log keeps it (Unix milliseconds).
  package func recordFetch(key: String, outcome: FetchResult, atMilliseconds at: Int64?) async throws {
    try Self.validate(key)
    let now = clock()
    if let at {
      guard at >= 0 else {
        throw FerryError.invalidArgument(
          "a fetch time must not be before 1970, not \(readableTime(at))")
      }
      let (latest, overflow) = now.addingReportingOverflow(Self.maxFetchTimeAhead.milliseconds)
      guard overflow || at <= latest else {
        throw FerryError.invalidArgument(
          "a fetch time must not be later than the store's clock (\(readableTime(now))) by more than "
            + "\(Self.maxFetchTimeAhead), not \(readableTime(at))")
      }
    }
    var outcome = outcome
    if case .failure(let message) = outcome { outcome = .failure(TaskQueue.loggable(message)) }
    _ = try await log.append(CacheEvent.fetched(key: key, at: at ?? now, outcome: outcome).newEvent)
    observer.fetched(key, outcome, at: at ?? now)
    changes.publish(.changed, for: CacheKeyBytes(key))
  }

  /// Tells observers of `keys` that a push made them stale.
  func invalidated(_ keys: [String]) {
    for key in keys { changes.publish(.invalidated, for: CacheKeyBytes(key)) }
  }

  /// Logs that a refresh of `key` was held back by `pendingTasks` tasks that could still run
  /// (`cache.refreshSkipped`): visible in ``CacheRecord/lastSkip`` and `ferry log --key`.
  func recordSkip(key: String, pendingTasks: UInt32) async throws {
    _ = try await log.append(CacheEvent.refreshSkipped(key: key, pendingTasks: pendingTasks).newEvent)
    changes.publish(.changed, for: CacheKeyBytes(key))
  }

  /// Forgets everything about `key` (its next state is ``CacheAge/noCache``).
  ///
  /// - Parameter key: The cache key.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``maxKeyLength`` UTF-8 bytes;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func forget(_ key: String) async throws(FerryError) {
    try await engine {
      try Self.validate(key)
      _ = try await log.append(CacheEvent.forgotten(key: key).newEvent)
      changes.publish(.changed, for: CacheKeyBytes(key))
    }
  }

  /// Stores the paging state of `key`: what the next page needs and whether more are available.
  ///
  /// - Parameters:
  ///   - key: The cache key.
  ///   - next: What fetching the next page needs, in the app's own encoding; nil for none.
  ///   - morePagesAvailable: Whether there is a next page.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``maxKeyLength`` UTF-8 bytes;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func setPaging(key: String, next: [UInt8]?, morePagesAvailable: Bool) async throws(FerryError) {
    try await engine {
      try Self.validate(key)
      _ = try await log.append(
        CacheEvent.paging(key: key, next: next, morePagesAvailable: morePagesAvailable).newEvent)
      changes.publish(.changed, for: CacheKeyBytes(key))
    }
  }

  /// How old the cache of `key` is, against `maxAge`. A clock that went backwards gives an age of
  /// zero, never a negative one.
  ///
  /// - Parameters:
  ///   - key: The cache key.
  ///   - maxAge: Older than this, the cache is too old; not negative.
  /// - Returns: ``CacheAge/noCache`` when the key was never fetched successfully; else when it last was, how
  ///   long ago, and whether that is too old — or made stale by a push
  ///   (``TaskResult/succeeded(output:invalidating:)``).
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``maxKeyLength`` UTF-8 bytes or
  ///   a negative `maxAge`; ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or
  ///   suspended; ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the read fails.
  public func state(key: String, maxAge: Duration) throws(FerryError) -> CacheAge {
    try engine {
      try Self.validate(key)
      try Self.validate(maxAge: maxAge)
      guard let record = try record(key), let lastFetched = record.lastSuccessMs else { return .noCache }
      let now = clock()
      let maxAgeMs = maxAge.milliseconds
      let (threshold, overflow) = now.subtractingReportingOverflow(maxAgeMs)
      // A push that made the key stale after its last fetch: too old, whatever its age.
      let isTooOld = (!overflow && lastFetched < threshold) || record.isInvalidated
      // A time from an imported or older store can be anything: the age saturates, never wraps.
      let (age, ageOverflow) = now.subtractingReportingOverflow(lastFetched)
      let ageMs = ageOverflow ? (lastFetched < 0 ? Int64.max : 0) : max(0, age)
      return .cache(
        lastFetched: Date(unixMilliseconds: lastFetched), age: .milliseconds(ageMs), isTooOld: isTooOld)
    }
  }

  /// Everything the ledger knows about `key`.
  ///
  /// - Parameter key: The cache key.
  /// - Returns: The key's record, or nil when the ledger holds nothing about it.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a key that is not 1 to ``maxKeyLength`` UTF-8 bytes;
  ///   ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func record(_ key: String) throws(FerryError) -> CacheRecord? {
    try engine {
      try Self.validate(key)
      return try log.read { view in
        try CacheAgesProjection.record(key, in: view.tables(of: CacheAgesProjection.projectionName))
      }
    }
  }

  /// Keys whose last successful fetch is older than `maxAge`, for eviction.
  /// Keys never fetched successfully are not listed. Reads only the keys it returns.
  ///
  /// - Parameter maxAge: The age past which a key is listed; not negative.
  /// - Returns: The keys, the oldest first.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a negative `maxAge`; ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended; ``FerryError/notCurrent(_:)``,
  ///   ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)`` when the read fails.
  public func keys(olderThan maxAge: Duration) throws(FerryError) -> [String] {
    try engine {
      try Self.validate(maxAge: maxAge)
      let (threshold, overflow) = clock().subtractingReportingOverflow(maxAge.milliseconds)
      if overflow { return [] }  // older than the start of time: none
      return try log.read { view in
        var keys: [String] = []
        try view.tables(of: CacheAgesProjection.projectionName).scan("bySuccess", from: nil) { raw, _ in
          guard let (at, key) = CacheKey.decodeBySuccess(raw), at < threshold else { return false }
          keys.append(key)
          return true
        }
        return keys
      }
    }
  }

  /// Refuses a negative max age: nothing can be fetched less than no time ago, and the sign of an
  /// overflowing threshold would decide between "always too old" and "never too old".
  static func validate(maxAge: Duration) throws(FerryError) {
    guard maxAge >= .zero else {
      throw FerryError.invalidArgument("a max age must not be negative, not \(maxAge)")
    }
  }

  /// Refuses a refresh interval under a millisecond: the log keeps whole milliseconds, and an
  /// interval of none would refresh again as soon as a refresh ended.
  static func validate(refreshInterval: Duration) throws(FerryError) {
    guard refreshInterval >= .milliseconds(1) else {
      throw FerryError.invalidArgument("a refresh interval must be at least 1 ms, not \(refreshInterval)")
    }
  }

  static func validate(_ key: String) throws(FerryError) {
    let count = key.utf8.count
    guard (1...maxKeyLength).contains(count) else {
      throw FerryError.invalidArgument("a cache key must be 1 to \(maxKeyLength) UTF-8 bytes, not \(count)")
    }
  }
}

extension Duration {
  /// This interval as a period to sleep between checks: at least 10 ms (zero or a negative one
  /// would spin), at most a billion seconds (`Task.sleep` traps on a deadline past `Int64`
  /// seconds, which `.seconds(Int64.max)` is).
  var checkPeriod: Duration { min(max(self, .milliseconds(10)), .seconds(1_000_000_000)) }
}

/// What observers of a cache key are told (in this process).
enum CacheNotice: Sendable, Equatable {
  /// The key's record changed (a fetch recorded, forgotten, paging set).
  case changed
  /// Any key's record may have changed: another process's events were compacted away before
  /// this process read them.
  case mayHaveChanged
  /// A refresh of the key started.
  case refreshStarted
  /// A refresh of the key ended; `firstFetch` when the key had no cache before it.
  case refreshFinished(RefreshOutcome, firstFetch: Bool)
  /// The key's cache just became too old (a repository's timer).
  case crossedMaxAge
  /// A task's success made the key stale (here or in another process): observers refresh it.
  case invalidated
}

/// A cache key as the ledger stores it: its UTF-8 bytes. What this process keeps per key
/// (refreshes under way, their errors, observers) is keyed by it, not by `String`, whose equality
/// is Unicode's canonical equivalence: "caf\u{E9}" and "cafe\u{301}" are equal strings but two keys
/// in the ledger, and must not share a refresh.
struct CacheKeyBytes: Hashable, Sendable {
  let bytes: [UInt8]
  init(_ key: String) { bytes = Array(key.utf8) }
}
