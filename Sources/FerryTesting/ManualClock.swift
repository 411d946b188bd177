import Ferry
import Foundation
import Synchronization

/// A `Clock` a test moves by hand: it stays put until ``advance(by:)`` or ``set(_:)``, and
/// everything waiting on it (retry timers, time limits, max-age notices) wakes exactly when the
/// test moves it to or past the instant waited for — or when the waiting task is cancelled. Tests
/// never sleep.
///
/// Its readings are dates (it is a `DatedClock`), so a store opened on it takes "now" from it,
/// and a store reopened after the clock moved on carries on from the clock's date:
///
/// ```swift
/// let clock = ManualClock()                     // 2023-11-14 22:13:20 UTC
/// var configuration = FerryStore.Configuration()
/// configuration.clock = clock                   // or: clock.install(in: &configuration)
/// let store = try await FerryStore.open(at: path, configuration: configuration)
/// clock.advance(by: .seconds(3600))
/// ```
public final class ManualClock: DatedClock, Sendable {
  /// It measures in `Swift.Duration`.
  public typealias Duration = Swift.Duration

  /// A reading of the clock: a time since 1970-01-01 00:00:00 UTC.
  public struct Instant: InstantProtocol, CustomStringConvertible {
    /// It measures in `Swift.Duration`.
    public typealias Duration = Swift.Duration
    /// The time since 1970-01-01 00:00:00 UTC (negative before).
    public var sinceUnixEpoch: Duration

    /// The instant `sinceUnixEpoch` after 1970-01-01 00:00:00 UTC.
    public init(sinceUnixEpoch: Duration) { self.sinceUnixEpoch = sinceUnixEpoch }

    /// The instant `duration` later (earlier, for a negative one).
    public func advanced(by duration: Duration) -> Instant {
      Instant(sinceUnixEpoch: sinceUnixEpoch + duration)
    }
    /// The time from this instant to `other`.
    public func duration(to other: Instant) -> Duration { other.sinceUnixEpoch - sinceUnixEpoch }
    /// Whether `lhs` comes before `rhs`.
    public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.sinceUnixEpoch < rhs.sinceUnixEpoch }
    /// The time since 1970 it stands for.
    public var description: String { "\(sinceUnixEpoch) since 1970" }
  }

  private struct Sleeper {
    let until: Instant
    let continuation: CheckedContinuation<Void, any Error>
  }
  private struct State {
    var now: Instant
    var next = 0
    var sleepers: [Int: Sleeper] = [:]
    var cancelled: Set<Int> = []
  }
  private let state: Mutex<State>

  /// A clock reading `date` (to the millisecond; by default 2023-11-14 22:13:20 UTC).
  public init(date: Date = Date(timeIntervalSince1970: 1_700_000_000)) {
    state = Mutex(State(now: Self.instant(of: date)))
  }

  /// The clock's reading now.
  public var now: Instant { state.withLock { $0.now } }

  /// The smallest step it can move: any.
  public var minimumResolution: Duration { .zero }

  /// The date now.
  public var date: Date { date(at: now) }

  /// The date `instant` stands for.
  public func date(at instant: Instant) -> Date {
    // Whole milliseconds exactly as the store turns them into dates, so that a reading set to the
    // millisecond is that millisecond to the store too.
    let milliseconds = instant.sinceUnixEpoch.milliseconds
    let rest = instant.sinceUnixEpoch - .milliseconds(milliseconds)
    let date = Date(unixMilliseconds: milliseconds)
    // Beyond Int64's milliseconds the date is the end of that range (and `components` would trap
    // on what is left over past Int64.max seconds).
    guard rest != .zero, rest > .milliseconds(-1), rest < .milliseconds(1) else { return date }
    let (seconds, attoseconds) = rest.components
    return date.addingTimeInterval(Double(seconds) + Double(attoseconds) / 1e18)
  }

  /// How many tasks are waiting for an instant to come.
  public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

  /// Moves the clock forward (or back, for a negative duration) and wakes every waiter whose
  /// instant came.
  public func advance(by duration: Duration) { move { $0.advanced(by: duration) } }

  /// Moves the clock to `instant` (forward or back) and wakes every waiter whose instant came.
  public func advance(to instant: Instant) { move { _ in instant } }

  /// Sets the clock to `date` (to the millisecond; a date beyond the range of Unix milliseconds in
  /// an `Int64` is taken as its end) and wakes every waiter whose instant came.
  public func set(_ date: Date) { move { _ in Self.instant(of: date) } }

  private static func instant(of date: Date) -> Instant {
    Instant(sinceUnixEpoch: .milliseconds(date.unixMilliseconds))
  }

  private func move(_ change: (Instant) -> Instant) {
    let woken = state.withLock { s -> [CheckedContinuation<Void, any Error>] in
      s.now = change(s.now)
      let due = s.sleepers.filter { $0.value.until <= s.now }
      for token in due.keys { s.sleepers[token] = nil }
      return due.values.map(\.continuation)
    }
    for continuation in woken { continuation.resume() }
  }

  /// Waits until the clock reads at least `deadline`; throws `CancellationError` as soon as the
  /// waiting task is cancelled.
  public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
    let token = state.withLock { s -> Int in
      s.next += 1
      return s.next
    }
    defer { _ = state.withLock { $0.cancelled.remove(token) } }
    try await withTaskCancellationHandler {
      try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
        let end = state.withLock { s -> Result<Void, any Error>? in
          if s.cancelled.remove(token) != nil { return .failure(CancellationError()) }
          if s.now >= deadline { return .success(()) }
          s.sleepers[token] = Sleeper(until: deadline, continuation: continuation)
          return nil
        }
        if let end { continuation.resume(with: end) }
      }
    } onCancel: {
      let sleeper = state.withLock { s -> Sleeper? in
        if let sleeper = s.sleepers.removeValue(forKey: token) { return sleeper }
        s.cancelled.insert(token)
        return nil
      }
      sleeper?.continuation.resume(throwing: CancellationError())
    }
  }

  /// Makes a store configuration read this clock and wait on it (the same as setting
  /// `configuration.clock` to it and clearing `startDate`).
  public func install(in configuration: inout FerryStore.Configuration) {
    configuration.clock = self
    configuration.startDate = nil
  }

  /// Waits (yielding, never sleeping) until at least `count` tasks wait on the clock, so a test can
  /// advance past a timer it knows is set. Gives up after a great many yields.
  public func waitForSleepers(_ count: Int = 1) async {
    for _ in 0..<1_000_000 where sleeperCount < count { await Task.yield() }
  }
}

extension CacheLedger {
  /// Puts `key` in the state of a key never fetched.
  public func makeNeverFetched(_ key: String) async throws(FerryError) {
    try await engine {
      try await forget(key)
    }
  }

  /// Puts `key` in the state of a key fetched just now.
  public func makeFresh(_ key: String) async throws(FerryError) {
    try await engine {
      try await recordFetch(key: key, outcome: .success(isEmpty: false), at: now)
    }
  }

  /// Puts `key` in the state of a key too old for `maxAge`: fetched one millisecond more than
  /// `maxAge` ago (exactly `maxAge` would not be too old).
  public func makeTooOld(_ key: String, maxAge: Duration) async throws(FerryError) {
    try await engine {
      let (at, overflow) = now.unixMilliseconds.subtractingReportingOverflow(maxAge.milliseconds)
      try await recordFetch(
        key: key, outcome: .success(isEmpty: false), atMilliseconds: overflow ? .min : at.addingSaturating(-1)
      )
    }
  }
}

extension Int64 {
  /// `self + other`, clamped to the limits of `Int64`.
  func addingSaturating(_ other: Int64) -> Int64 {
    let (sum, overflow) = addingReportingOverflow(other)
    if overflow { return other < 0 ? .min : .max }
    return sum
  }
}
