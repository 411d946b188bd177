import FerryLog

// The rest of what apps print: policies, filters, handler results, reports and the pull side's
// smaller enums read as phrases too (Descriptions.swift has the statuses and updates).

extension UniquePolicy: CustomStringConvertible {
  public var description: String {
    switch self {
    case .append: return "append"
    case .keep: return "keep the queued task"
    case .replace: return "replace the queued tasks"
    }
  }
}

extension TaskResult: CustomStringConvertible {
  public var description: String {
    switch self {
    case .succeeded: return "succeeded"
    case .failed(let message, let retryable): return (retryable ? "failed: " : "failed for good: ") + message
    case .recordError(let message): return "error for the user: \(message)"
    }
  }
}

extension RunFilter: CustomStringConvertible {
  public var description: String {
    switch self {
    case .all: return "all tasks"
    case .group(let group): return "group \(group)"
    case .collection(let name): return "collection \(name)"
    case .task(let id): return "task \(id)"
    }
  }
}

extension RunReport.Entry: CustomStringConvertible {
  public var description: String { "task \(taskId): \(outcome)" }
}

extension RunReport: CustomStringConvertible {
  /// A one-line summary: "3 ran (2 succeeded, 1 failed), 1 skipped".
  public var description: String {
    var parts = ["\(ran) ran (\(succeeded) succeeded, \(failed) failed"]
    if interrupted > 0 { parts[0] += ", \(interrupted) interrupted" }
    parts[0] += ")"
    if skipped > 0 { parts.append("\(skipped) skipped") }
    return parts.joined(separator: ", ")
  }
}

extension CancelReport: CustomStringConvertible {
  public var description: String {
    let cancelled = self.cancelled.isEmpty ? "none" : self.cancelled.map(String.init).joined(separator: ", ")
    let running = self.running.isEmpty ? "" : "; still running: " + self.running.map(String.init).joined(separator: ", ")
    return "cancelled \(self.cancelled.count) (\(cancelled))\(running)"
  }
}

extension FetchOutcome: CustomStringConvertible {
  public var description: String {
    switch self {
    case .success(let isEmpty): return isEmpty ? "success (empty)" : "success"
    case .failure(let message): return "failure: \(message)"
    }
  }
}

extension LoadMoreResult: CustomStringConvertible {
  public var description: String {
    switch self {
    case .loaded: return "loaded the next page"
    case .noMorePages: return "no more pages"
    case .failed(let error): return "failed: \(error)"
    }
  }
}

extension RefreshError.Stage: CustomStringConvertible {
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
