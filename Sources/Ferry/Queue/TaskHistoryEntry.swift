import FerryLog
import Foundation

/// One event in a task's history (``TaskQueue/history(of:)``).
public struct TaskHistoryEntry: Sendable, Equatable {
  /// What happened.
  public enum Kind: Sendable, Equatable {
    /// The task was added.
    case added
    /// Run number `attempt` started.
    case runStarted(attempt: UInt32)
    /// A run succeeded.
    case runSucceeded
    /// A run failed; `retryAt` nil means the task became dead.
    case runFailed(message: String, retryAt: Date?)
    /// A run was interrupted (found at open, or cancelled).
    case runInterrupted
    /// A run said not now (or failed while offline): it gave its attempt back.
    case runDeferred(reason: String)
    /// A user-fixable error was recorded.
    case errorRecorded(message: String)
    /// The error was resolved.
    case errorResolved
    /// The task was revived.
    case revived
    /// Its payload was replaced (``TaskQueue/updatePayload(_:to:)``).
    case payloadUpdated
    /// The task was cancelled.
    case cancelled
    /// Its deadline passed before a run of it started: it left the queue.
    case expired
    /// The queue was cleared.
    case cleared
    /// A later add with ``UniquePolicy/replace`` (the task with this id) took its place.
    case replaced(by: TaskID)
  }

  /// The event's sequence number.
  public let sequence: UInt64
  /// When it was logged (whole milliseconds, as the log keeps it).
  public var timestamp: Date { Date(unixMilliseconds: timestampMs) }
  /// What happened.
  public let event: Kind
  /// ``timestamp`` as the log keeps it (Unix milliseconds).
  package let timestampMs: Int64

  init(sequence: UInt64, timestampMs: Int64, event: Kind) {
    self.sequence = sequence
    self.timestampMs = timestampMs
    self.event = event
  }
}
