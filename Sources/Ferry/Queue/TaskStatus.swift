import FerryLog
import Foundation

/// Where a queued task stands.
public enum TaskStatus: Sendable, Equatable {
  /// May run now: it has no group or heads it (a manual task runs only when asked for by id).
  case ready
  /// A handler is running it (or was, when the process died; see `runInterrupted`).
  case running
  /// Failed and waits until this time before it may run again (whole milliseconds, as the log
  /// keeps it).
  case waiting(until: Date)
  /// A user-fixable error was recorded; it and its group wait until the error is resolved.
  case blockedByError
  /// Failed for good (not retryable, or out of attempts); kept until revived or cancelled.
  case dead
  /// Ready itself, but queued behind the head of its group (the task `behind`): only a group's
  /// head may run, so every task behind it waits, whatever the head's state — about to start,
  /// running, waiting for a retry time, blocked, dead or manual. It reads ready once it is the
  /// head. A task behind its head whose own state says more (waiting for its retry time, blocked,
  /// dead) reads that instead. Derived when the task is read; nothing of it is logged or stored.
  case waitingForGroup(behind: TaskID)
  /// Added with a start time (``TaskSchedule``) that has not come: it has not run yet, and no run
  /// of it starts before `at` (whole milliseconds). A task behind its group's head reads this
  /// while its start time is ahead.
  case scheduled(at: Date)
}
