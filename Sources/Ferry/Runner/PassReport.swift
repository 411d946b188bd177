import FerryLog
import Foundation

/// The result of one pass.
public struct PassReport: Sendable, Equatable {
  /// One task's outcome.
  public struct Entry: Sendable, Equatable {
    /// The task.
    public let taskId: TaskID
    /// What happened.
    public let outcome: RunOutcome
    /// The task's priority: the report lists the more urgent tasks first.
    public internal(set) var priority: TaskPriority = .normal
  }

  /// Every task the pass decided about: those it ran, skipped or expired — including the tasks
  /// behind a group head that failed, recorded an error or was skipped in this pass
  /// (``SkipReason/partOfFailedGroup``) — the most urgent priority first, then in task-id order.
  public internal(set) var entries: [Entry] = []
  /// The runner's connectivity said offline, so the pass started nothing more (no attempt spent).
  public internal(set) var offline = false

  /// One call of a batched handler
  /// (``TaskRunner/register(tag:batchSize:retry:timeLimit:isReadyToRun:handler:)``).
  public struct Batch: Sendable, Equatable {
    /// The batch's tag.
    public let tag: String
    /// Its tasks, in the order the handler was given them; each has its own entry in ``entries``.
    public let taskIds: [TaskID]
  }

  /// The batched handler calls of the pass, in the order they started.
  public internal(set) var batches: [Batch] = []

  /// Tasks whose handler ran.
  public var ran: Int { entries.count - skipped - expired }
  /// Tasks whose deadline had passed before they started: the pass expired them, none ran.
  public var expired: Int { entries.filter { $0.outcome == .expired }.count }
  /// Tasks that succeeded.
  public var succeeded: Int { entries.filter { $0.outcome == .succeeded }.count }
  /// Tasks whose handler failed (retryable or not). Errors recorded for the user are counted
  /// apart, in ``errorsRecorded``.
  public var failed: Int { count(.failed) }
  /// Tasks whose handler recorded an error for the user (``TaskResult/recordError(_:)``): blocked
  /// until it is resolved. Not failures: no attempt was spent on a retry.
  public var errorsRecorded: Int { count(.errorRecorded) }
  /// Tasks whose run said not now (``TaskResult/deferred(_:)``, or failed while offline): ready
  /// again, no attempt spent.
  public var deferred: Int { count(.deferred) }
  /// Tasks skipped.
  public var skipped: Int { count(.skipped) }

  /// The kinds of outcome the counts above count, whatever their details.
  private enum Kind { case failed, errorRecorded, deferred, skipped }

  private func count(_ kind: Kind) -> Int {
    entries.count { entry in
      switch (kind, entry.outcome) {
      case (.failed, .failed), (.errorRecorded, .errorRecorded), (.deferred, .deferred), (.skipped, .skipped):
        return true
      default: return false
      }
    }
  }
  /// Tasks that left the queue (cancelled or cleared) before their turn in the pass.
  public var cancelled: Int { entries.filter { $0.outcome == .skipped(.noLongerQueued) }.count }
  /// Runs cut short by ``TaskRunner/stop()`` or a window's end; their tasks are ready again.
  public var interrupted: Int { entries.filter { $0.outcome == .interrupted }.count }
  /// The first task that failed or recorded an error (either), if any.
  public var firstFailure: Entry? {
    entries.first {
      switch $0.outcome {
      case .failed, .errorRecorded: return true
      default: return false
      }
    }
  }
  /// The outcome of one task, if the pass considered it.
  public func outcome(of id: TaskID) -> RunOutcome? { entries.first { $0.taskId == id }?.outcome }
}
