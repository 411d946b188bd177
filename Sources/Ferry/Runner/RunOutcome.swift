import FerryLog
import Foundation

/// What happened to one task in a pass.
public enum RunOutcome: Sendable, Equatable {
  /// The handler succeeded.
  case succeeded
  /// The handler failed; `retryAt` is when it may run again (nil: it is dead).
  case failed(String, retryAt: Date?)
  /// The handler recorded an error for the user.
  case errorRecorded(String)
  /// The run was cancelled or interrupted; the task is ready again.
  case interrupted
  /// The handler said not now (or failed while offline): the task is ready again, no attempt spent.
  case deferred(String)
  /// It was not run.
  case skipped(SkipReason)
  /// Its deadline had passed before a run of it started: it left the queue (`task.expired`).
  case expired
}
