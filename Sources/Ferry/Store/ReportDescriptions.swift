import FerryLog
import Foundation

// The rest of what apps print: policies, filters, handler results, reports and the pull side's
// smaller enums read as phrases too (Descriptions.swift has the statuses and updates).

extension UniquePolicy: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .append: return "append"
    case .keep: return "keep the queued task"
    case .replace: return "replace the queued tasks"
    }
  }
}

extension TaskResult: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .succeeded: return "succeeded"
    case .succeededWith(let output, let keys):
      var parts = ["succeeded"]
      if let output { parts.append("output \(String(decoding: output.bytes.prefix(120), as: UTF8.self))") }
      if !keys.isEmpty { parts.append("stales \(keys.joined(separator: ", "))") }
      return parts.joined(separator: ", ")
    case .failed(let message, let retryable): return (retryable ? "failed: " : "failed for good: ") + message
    case .recordError(let message): return "error for the user: \(message)"
    case .deferred(let message): return "deferred: \(message)"
    }
  }
}

extension RunFilter: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .all: return "all tasks"
    case .group(let group): return "group \(group)"
    case .collection(let name): return "collection \(name)"
    case .task(let id): return "task \(id)"
    }
  }
}

extension PassReport.Entry: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String { "task \(taskId): \(outcome)" }
}

extension PassReport: CustomStringConvertible {
  /// A one-line summary: "3 ran (2 succeeded, 1 failed, 1 error recorded), 1 skipped".
  public var description: String {
    var parts = ["\(ran) ran (\(succeeded) succeeded, \(failed) failed"]
    if errorsRecorded > 0 {
      parts[0] += ", \(errorsRecorded) error" + (errorsRecorded == 1 ? "" : "s") + " recorded"
    }
    if interrupted > 0 { parts[0] += ", \(interrupted) interrupted" }
    if deferred > 0 { parts[0] += ", \(deferred) deferred" }
    parts[0] += ")"
    if offline { parts.append("offline") }
    if skipped > 0 { parts.append("\(skipped) skipped") }
    return parts.joined(separator: ", ")
  }
}

extension CancelReport: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    let cancelled = self.cancelled.isEmpty ? "none" : self.cancelled.map(String.init).joined(separator: ", ")
    let running =
      self.running.isEmpty ? "" : "; still running: " + self.running.map(String.init).joined(separator: ", ")
    return "cancelled \(self.cancelled.count) (\(cancelled))\(running)"
  }
}

extension FetchResult: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .success(let isEmpty): return isEmpty ? "success (empty)" : "success"
    case .failure(let message): return "failure: \(message)"
    }
  }
}

extension LoadMoreResult: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .loaded: return "loaded the next page"
    case .noMorePages: return "no more pages"
    case .failed(let error): return "failed: \(error)"
    }
  }
}

extension RefreshError.Stage: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .pendingTasks: return "running the pending tasks first"
    case .fetch: return "fetching"
    case .save: return "saving"
    case .recording: return "recording the fetch"
    case .recorded: return "an earlier refresh"
    }
  }
}

extension PendingTask: CustomStringConvertible {
  /// "task 2 (upload, group album-7): waiting until …, 1 attempt, last failure: offline".
  public var description: String {
    var about = [tag]
    if let groupId { about.append("group \(groupId)") }
    if let dataId { about.append("data \(dataId)") }
    if manual { about.append("manual") }
    if priority != .normal { about.append("priority \(priority)") }
    var text = "task \(id) (\(about.joined(separator: ", "))): \(status)"
    text += ", \(attempts) attempt" + (attempts == 1 ? "" : "s")
    if let deadline { text += ", deadline \(readableTime(deadline))" }
    if let lastFailure { text += ", last failure: \(lastFailure)" }
    return text
  }
}

extension RecordedError: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    "error \(errorId) on task \(taskId) at \(readableTime(recordedAt)): \(message)"
  }
}

extension TaskHistoryEntry.Kind: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .added: return "added"
    case .runStarted(let attempt): return "run started (attempt \(attempt))"
    case .runSucceeded: return "succeeded"
    case .runFailed(let message, let retryAt):
      return "failed: \(message)" + (retryAt.map { ", retry at \(readableTime($0))" } ?? ", dead")
    case .runInterrupted: return "run interrupted"
    case .runDeferred(let reason): return "run deferred (no attempt spent): \(reason)"
    case .errorRecorded(let message): return "error recorded: \(message)"
    case .errorResolved: return "error resolved"
    case .revived: return "revived"
    case .payloadUpdated: return "payload updated"
    case .cancelled: return "cancelled"
    case .expired: return "expired (its deadline passed before it started)"
    case .cleared: return "queue cleared"
    case .replaced(let id): return "replaced by task \(id)"
    }
  }
}

extension TaskHistoryEntry: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String { "\(sequence) \(readableTime(timestamp)) \(event)" }
}

extension CacheRecord: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    var parts = ["\(key): \(fetchCount) fetch" + (fetchCount == 1 ? "" : "es")]
    if let lastSuccess {
      parts.append("last success \(readableTime(lastSuccess))" + (lastSuccessWasEmpty ? " (empty)" : ""))
    } else {
      parts.append("never fetched successfully")
    }
    if let lastFailure {
      parts.append("last failure \(readableTime(lastFailure.at)): \(lastFailure.message)")
    }
    return parts.joined(separator: ", ")
  }
}

extension CacheState.Content: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    switch self {
    case .noCache: return "no cache"
    case .cache(let value, let lastFetched, let age, let isTooOld):
      return "cache \(value.map { "\($0)" } ?? "empty"), fetched \(readableTime(lastFetched)), "
        + "\(age.formatted(.units(allowed: [.days, .hours, .minutes, .seconds], width: .narrow))) old"
        + (isTooOld ? ", too old" : "")
    }
  }
}

extension CacheState: CustomStringConvertible {
  /// A one-line summary, as logs and the CLI print it.
  public var description: String {
    var text = content.description
    if isRefreshing { text += ", refreshing" }
    if let refreshError { text += ", last refresh failed: \(refreshError.message)" }
    return text
  }
}
