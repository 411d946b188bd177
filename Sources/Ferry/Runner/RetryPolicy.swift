import FerryLog
import Foundation

/// When a failed task may run again: exponential backoff with jitter, and a limit on attempts.
///
/// The delay after run number *n* fails is `initialDelay × multiplier^(n − 1)`, times a random
/// factor in `[1 − jitter, 1 + jitter]`, then capped at ``maxDelay``: jitter first, the cap last,
/// so the delay never exceeds ``maxDelay``. (A growth already past the cap is taken as the cap
/// before the factor, so retries at the cap still spread out below it.)
///
/// Delays are kept in whole milliseconds (as the log keeps retry times): a delay's sub-millisecond
/// part is dropped. A negative delay is taken as zero — the initializer clamps it, and so does
/// ``delay(afterAttempt:random:)`` for a property set negative afterwards — so a policy never
/// schedules a retry in the past.
public struct RetryPolicy: Sendable, Equatable {
  /// Failed runs allowed in all; after the last one fails the task is dead. Only a server's
  /// answer counts: a deferred run, a run while offline and an interrupted run (the app killed,
  /// a window's end) give their attempt back. ``unlimited`` by default.
  public var maxAttempts: UInt32
  /// The delay after the first failure.
  public var initialDelay: Duration
  /// Each further failure multiplies the delay by this.
  public var multiplier: Double
  /// The delay never exceeds this: it is applied after the jitter.
  public var maxDelay: Duration
  /// The delay varies by up to this fraction either way (0 = exact), so that many clients do not
  /// retry in step — within ``maxDelay``, which caps the varied delay.
  public var jitter: Double

  /// No limit on attempts: a change is never given up on by itself (``maxAttempts``).
  public static let unlimited = UInt32.max

  /// A policy; the defaults are no limit on attempts, 1 s doubling up to 1 h, ±20 % — an
  /// offline-first app's change should outlast any outage; a failure that retrying cannot fix is
  /// the handler's to say (`.failed(_, retryable: false)` or `.recordError`). A `maxAttempts` of 0
  /// is taken as 1, a negative delay as zero, a multiplier below 1 (or NaN) as 1, and a jitter
  /// outside 0...1 as its nearest end (NaN or infinite: 0).
  public init(
    maxAttempts: UInt32 = RetryPolicy.unlimited, initialDelay: Duration = .seconds(1), multiplier: Double = 2,
    maxDelay: Duration = .seconds(3600), jitter: Double = 0.2
  ) {
    self.maxAttempts = max(1, maxAttempts)
    self.initialDelay = max(.zero, initialDelay)
    self.multiplier = multiplier.isNaN ? 1 : max(1, multiplier)  // +infinity: straight to maxDelay
    self.maxDelay = max(.zero, maxDelay)
    self.jitter = jitter.isFinite ? min(max(jitter, 0), 1) : 0
  }

  /// The delay after the failure of run number `attempt`, for a random number in 0..<1: whole
  /// milliseconds, never negative, never more than ``maxDelay``.
  public func delay(afterAttempt attempt: UInt32, random: Double) -> Duration {
    .milliseconds(delayMilliseconds(afterAttempt: attempt, random: random))
  }

  /// ``delay(afterAttempt:random:)`` in milliseconds.
  func delayMilliseconds(afterAttempt attempt: UInt32, random: Double) -> Int64 {
    let initialMs = max(0, initialDelay.milliseconds)
    let maxMs = max(0, maxDelay.milliseconds)
    let exponent = Double(max(attempt, 1) - 1)
    let grown = Double(initialMs) * pow(multiplier, exponent)
    let base = grown.isFinite ? min(grown, Double(maxMs)) : Double(maxMs)
    let unit = random.isFinite ? min(max(random, 0), 1) : 0.5
    let jitter = self.jitter.isFinite ? min(max(self.jitter, 0), 1) : 0
    // Jitter, then the cap: the cap is a promise ("never exceeds"), the jitter a spread within it.
    let delay = min(base * (1 - jitter + 2 * jitter * unit), Double(maxMs))
    guard delay.isFinite else { return min(maxMs, Int64.max / 2) }
    return min(maxMs, Int64(min(max(delay, 0), Double(Int64.max / 2))))
  }
}
