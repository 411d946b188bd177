import FerryLog
import Foundation

// The pull side in `Date` and `Duration`: the log and its projections keep Unix milliseconds (so
// stored bytes and golden vectors never depend on Foundation), and every time the API gives out or
// takes in has a `Date` form beside them.

extension Date {
  /// The date of a time in Unix milliseconds, as the log stores it.
  init(unixMilliseconds: Int64) { self.init(timeIntervalSince1970: Double(unixMilliseconds) / 1000) }

  /// This date in Unix milliseconds, rounded down, saturating at the ends of `Int64`.
  var unixMilliseconds: Int64 {
    let milliseconds = (timeIntervalSince1970 * 1000).rounded(.down)
    guard milliseconds.isFinite else { return milliseconds < 0 ? .min : .max }
    if milliseconds >= Double(Int64.max) { return .max }
    if milliseconds <= Double(Int64.min) { return .min }
    return Int64(milliseconds)
  }
}

extension CacheAge {
  /// When the key was last fetched successfully, as a date (nil with no cache).
  public var lastFetchedDate: Date? {
    guard case .cache(let lastFetched, _, _) = self else { return nil }
    return Date(unixMilliseconds: lastFetched)
  }
}

extension CacheRecord {
  /// When the last successful fetch finished.
  public var lastSuccessDate: Date? { lastSuccess.map(Date.init(unixMilliseconds:)) }
  /// When the last fetch, successful or not, finished.
  public var lastAttemptDate: Date? { lastAttempt.map(Date.init(unixMilliseconds:)) }
  /// When the last failed fetch finished.
  public var lastFailureDate: Date? { lastFailure.map { Date(unixMilliseconds: $0.at) } }
}

extension CacheState {
  /// When the cache was last fetched successfully (nil with no cache).
  public var lastFetched: Date? {
    guard case .cache(_, let lastFetched, _, _) = content else { return nil }
    return Date(unixMilliseconds: lastFetched)
  }

  /// How long ago that was (nil with no cache).
  public var age: Duration? {
    guard case .cache(_, _, let age, _) = content else { return nil }
    return age
  }
}

extension CacheLedger {
  /// The store's clock now, as a date.
  public var currentDate: Date { Date(unixMilliseconds: clock()) }

  /// Records that a fetch of `key` finished at `date` (see ``recordFetch(key:outcome:at:)``).
  public func recordFetch(key: String, outcome: FetchOutcome, at date: Date) async throws {
    try await recordFetch(key: key, outcome: outcome, at: date.unixMilliseconds)
  }
}
