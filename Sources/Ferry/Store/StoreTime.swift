import FerryLog
import Foundation

// Time in a store: the API speaks `Date` and `Duration`; the log and its projections keep whole
// Unix milliseconds (so stored bytes and golden vectors never depend on Foundation). Inside, the
// queue and the ledger read "now" as Unix milliseconds and wait until a Unix-millisecond time;
// `StoreTime` makes those two functions from the `any Clock<Duration>` a store is configured with.

/// A clock that knows the wall time of its readings — a test clock set to a date, say. A store
/// opened on one (``FerryStore/Configuration/clock``) takes its start date from the clock, so a
/// store reopened after the clock moved on carries on from the clock's date.
public protocol DatedClock: Clock where Duration == Swift.Duration {
  /// The wall time the clock's reading `instant` stands for.
  func date(at instant: Instant) -> Date
}

/// "Now" and "wait until" in Unix milliseconds, on a store's clock.
struct StoreTime: Sendable {
  /// The time now (Unix milliseconds).
  let now: @Sendable () -> Int64
  /// Waits until `now` reads at least a time, or the waiting task is cancelled.
  let sleep: @Sendable (Int64) async -> Void

  /// The time of `clock`, whose reading now stands for `startDate` (see
  /// ``FerryStore/Configuration/startDate``).
  init(_ clock: any Clock<Duration>, startDate: Date?) {
    if startDate == nil, clock is ContinuousClock {
      self = .system
    } else {
      self = Self.elapsing(on: clock, startDate: startDate)  // opens the existential
    }
  }

  private init(now: @escaping @Sendable () -> Int64, sleep: @escaping @Sendable (Int64) async -> Void) {
    self.now = now
    self.sleep = sleep
  }

  /// The system's wall clock, and real sleeps that look at it again when they end (so a change of
  /// the system's time moves a wait's end).
  static let system = StoreTime(
    now: wallClockMilliseconds,
    sleep: { until in
      while !Task.isCancelled {
        let delay = until &- wallClockMilliseconds()
        if delay <= 0 { return }
        try? await Task.sleep(for: .milliseconds(delay))
      }
    })

  /// The longest single sleep on an injected clock: a real clock's `sleep(until:)` may trap on a
  /// deadline far enough away, so a longer wait sleeps in steps.
  static let longestStep = Duration.seconds(1_000_000_000)

  /// Time elapsing on `clock` from `startDate` (or the clock's own date, or `Date()`) at its
  /// reading now.
  private static func elapsing<C: Clock<Duration>>(on clock: C, startDate: Date?) -> StoreTime {
    let start = clock.now
    let startMs = (startDate ?? Self.date(of: clock, at: start) ?? Date()).unixMilliseconds
    @Sendable func now() -> Int64 { startMs.addingSaturating(start.duration(to: clock.now).milliseconds) }
    return StoreTime(
      now: now,
      sleep: { until in
        // The instant `until` stands for: exactly, so a test clock advanced to it wakes the wait.
        let target = Duration.milliseconds(until) - Duration.milliseconds(startMs)
        while !Task.isCancelled, now() < until {
          let left = target - start.duration(to: clock.now)
          let deadline =
            left <= longestStep ? start.advanced(by: target) : clock.now.advanced(by: longestStep)
          do {
            try await clock.sleep(until: deadline, tolerance: nil)
          } catch {
            return  // cancelled (a clock's sleep throws for nothing else)
          }
        }
      })
  }

  /// The date of a ``DatedClock``'s reading; nil for any other clock.
  private static func date<C: Clock>(of clock: C, at instant: C.Instant) -> Date? {
    guard let dated = clock as? any DatedClock else { return nil }
    return date(ofDated: dated, at: instant)
  }

  private static func date<D: DatedClock>(ofDated clock: D, at instant: Any) -> Date? {
    (instant as? D.Instant).map { clock.date(at: $0) }
  }
}

extension Date {
  /// The date of a time in Unix milliseconds, as the log stores it.
  package init(unixMilliseconds: Int64) {
    self.init(timeIntervalSince1970: Double(unixMilliseconds) / 1000)
  }

  /// This date in Unix milliseconds: the last millisecond at or before it (so
  /// `Date(unixMilliseconds: ms).unixMilliseconds == ms` for every time a `Date` holds to the
  /// millisecond — some 70,000 years either side of 1970), saturating at the ends of `Int64` for a
  /// date beyond them (never trapping, not even for an infinite or NaN interval).
  package var unixMilliseconds: Int64 {
    let seconds = timeIntervalSince1970
    if seconds.isNaN { return 0 }
    let estimate = (seconds * 1000).rounded(.down)
    if estimate >= Double(Int64.max) { return .max }
    if estimate <= Double(Int64.min) { return .min }
    // `seconds * 1000` rounds: the millisecond next to the estimate may be the one at or before.
    var milliseconds = Int64(estimate)
    if milliseconds < .max, Date(unixMilliseconds: milliseconds + 1) <= self {
      milliseconds += 1
    } else if milliseconds > .min, Date(unixMilliseconds: milliseconds) > self {
      milliseconds -= 1
    }
    return milliseconds
  }
}
