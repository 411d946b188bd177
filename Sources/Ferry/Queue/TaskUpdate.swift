import FerryLog
import Foundation

/// A change to the queue, as observers see it.
public enum TaskUpdate: Sendable, Equatable {
  /// The first element of a per-task stream: the task's status then (nil when it is not queued).
  /// Also sent again when another process's events were compacted away before this process read
  /// them: what happened to the task meanwhile is lost, its status now is not.
  case current(TaskID, TaskStatus?)
  /// A task was added.
  case added(TaskID)
  /// A run started.
  case running(TaskID, attempt: UInt32)
  /// A run succeeded; the task left the queue.
  case succeeded(TaskID)
  /// A run failed; `retryAt` nil means the task is dead.
  case failed(TaskID, message: String, retryAt: Date?)
  /// A run was interrupted; the task is ready again.
  case interrupted(TaskID)
  /// A run ended with ``TaskResult/deferred(_:)`` (or failed while offline): ready again, no attempt spent.
  case deferred(TaskID, reason: String)
  /// A pass skipped the task.
  case skipped(TaskID, SkipReason)
  /// An error was recorded on the task.
  case errorRecorded(TaskID, message: String)
  /// The task's error was resolved.
  case errorResolved(TaskID)
  /// The task was cancelled.
  case cancelled(TaskID)
  /// The task's deadline passed before a run of it started: it left the queue.
  case expired(TaskID)
  /// A dead task was revived.
  case revived(TaskID)
  /// The task's payload was replaced (``TaskQueue/updatePayload(_:to:)``); its next run gets the new one.
  case payloadUpdated(TaskID)
  /// Every task was removed.
  case cleared
  /// Automatic running was paused.
  case paused
  /// Automatic running was resumed.
  case resumed

  /// The task the update is about (nil for `cleared`, `paused`, `resumed`).
  public var taskId: TaskID? {
    switch self {
    case .current(let id, _), .added(let id), .running(let id, _), .succeeded(let id), .failed(let id, _, _),
      .interrupted(let id), .deferred(let id, _), .skipped(let id, _), .errorRecorded(let id, _),
      .errorResolved(let id),
      .cancelled(let id), .expired(let id), .revived(let id), .payloadUpdated(let id):
      return id
    case .cleared, .paused, .resumed: return nil
    }
  }
}
