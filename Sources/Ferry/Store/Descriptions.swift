import FerryLog
import Foundation

// What apps print and show: every status, update and outcome reads as a short phrase (not as
// `current(1, Optional(Ferry.TaskStatus.ready))`), and the errors are `LocalizedError`s, so
// `localizedDescription` carries the message instead of a generic one.

/// A time as ISO 8601 with milliseconds, UTC, to the millisecond the log would keep (a date no
/// calendar holds — an infinite or NaN interval — as its seconds since 1970).
func readableTime(_ date: Date) -> String {
  guard date.timeIntervalSince1970.isFinite else { return "\(date.timeIntervalSince1970) s since 1970" }
  return readableTime(date.unixMilliseconds)
}

/// A Unix-milliseconds time as ISO 8601 with milliseconds, UTC. The milliseconds are written from
/// the number itself: a formatter given the date (a binary fraction of a second) may print one
/// millisecond less.
func readableTime(_ milliseconds: Int64) -> String {
  let (seconds, fraction) = milliseconds.quotientAndRemainder(dividingBy: 1000)
  let (wholeSeconds, millisecond) = fraction < 0 ? (seconds - 1, fraction + 1000) : (seconds, fraction)
  let text = Date.ISO8601FormatStyle().format(Date(timeIntervalSince1970: Double(wholeSeconds)))
  guard text.hasSuffix("Z") else { return text }
  return text.dropLast() + "." + String(String(millisecond + 1000).dropFirst()) + "Z"
}

extension TaskStatus: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .ready: return "ready"
    case .running: return "running"
    case .waiting(let until): return "waiting until \(readableTime(until))"
    case .blockedByError: return "blocked by an error"
    case .dead: return "dead"
    case .waitingForGroup(let behind): return "waiting for its group (behind task \(behind))"
    case .scheduled(let at): return "scheduled for \(readableTime(at))"
    }
  }
}

extension SkipReason: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .partOfFailedGroup: return "an earlier task of its group failed"
    case .notReady: return "not ready to run"
    case .blockedByError: return "blocked by an error"
    case .waitingForRetry(let until): return "waiting for its retry at \(readableTime(until))"
    case .scheduled(let at): return "scheduled for \(readableTime(at))"
    case .dead: return "dead"
    case .running: return "already running"
    case .notHeadOfGroup: return "an earlier task of its group is still queued"
    case .noHandler: return "no handler for its tag"
    case .noLongerQueued: return "no longer queued"
    case .offline: return "offline"
    case .deferred: return "deferred by its last run, until the network is back"
    }
  }
}

extension RunOutcome: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .succeeded: return "succeeded"
    case .failed(let message, let retryAt):
      return "failed: \(message)" + (retryAt.map { ", retry at \(readableTime($0))" } ?? ", dead")
    case .errorRecorded(let message): return "error recorded: \(message)"
    case .interrupted: return "interrupted"
    case .deferred(let reason): return "deferred (no attempt spent): \(reason)"
    case .skipped(let reason): return "skipped: \(reason)"
    case .expired: return "expired: its deadline passed before it started"
    }
  }
}

extension TaskUpdate: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .current(let id, let status): return "task \(id): " + (status.map { "\($0)" } ?? "not queued")
    case .added(let id): return "task \(id) added"
    case .running(let id, let attempt): return "task \(id) running (attempt \(attempt))"
    case .succeeded(let id): return "task \(id) succeeded"
    case .failed(let id, let message, let retryAt):
      return "task \(id) failed: \(message)" + (retryAt.map { ", retry at \(readableTime($0))" } ?? ", dead")
    case .interrupted(let id): return "task \(id) interrupted"
    case .deferred(let id, let reason): return "task \(id) deferred (no attempt spent): \(reason)"
    case .skipped(let id, let reason): return "task \(id) skipped: \(reason)"
    case .errorRecorded(let id, let message): return "task \(id) error recorded: \(message)"
    case .errorResolved(let id): return "task \(id) error resolved"
    case .cancelled(let id): return "task \(id) cancelled"
    case .expired(let id): return "task \(id) expired (its deadline passed before it started)"
    case .revived(let id): return "task \(id) revived"
    case .payloadUpdated(let id): return "task \(id) payload updated"
    case .cleared: return "queue cleared"
    case .paused: return "automatic running paused"
    case .resumed: return "automatic running resumed"
    }
  }
}

extension CacheAge: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .noCache: return "no cache"
    case .cache(let lastFetched, let age, let isTooOld):
      return
        "fetched \(readableTime(lastFetched)), \(age.formatted(.units(allowed: [.days, .hours, .minutes, .seconds], width: .narrow))) old"
        + (isTooOld ? ", too old" : "")
    }
  }
}

extension RefreshSkipReason: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .notTooOld: return "the cache is not too old"
    case .cancelled: return "cancelled"
    case .pendingTasks: return "pending tasks did not all succeed first"
    }
  }
}

extension RefreshOutcome: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .successful: return "successful"
    case .failed(let error): return "failed: \(error)"
    case .skipped(let reason): return "skipped: \(reason)"
    }
  }
}

extension FerryError: LocalizedError {
  /// The same as `description`, for `LocalizedError`.
  public var errorDescription: String? { description }
}

extension RefreshError: LocalizedError {
  /// The same as `description`, for `LocalizedError`.
  public var errorDescription: String? { description }
}
