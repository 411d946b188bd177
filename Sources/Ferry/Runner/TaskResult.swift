import FerryLog
import Foundation

/// What a handler says happened.
public enum TaskResult: Sendable, Equatable {
  /// Done: the task leaves the queue.
  case succeeded
  /// Done, with an output for later tasks and cache keys the success makes stale
  /// (``succeeded(output:invalidating:)``).
  case succeededWith(output: TaskOutput?, invalidating: [String])
  /// It failed; a retryable failure runs again after a backoff, until the attempts run out. A
  /// retryable failure of a run during which the runner's ``TaskRunner/Configuration/connectivity``
  /// said offline at any moment is taken as ``deferred(_:)``: offline is not the server's answer.
  case failed(String, retryable: Bool)
  /// The user must fix something first: the task (and its group) waits until the error is resolved.
  case recordError(String)
  /// Not now — the device is offline, the server could not be reached, a precondition is not met
  /// yet. The run gives its attempt back and no backoff grows: the task stays ready, and this
  /// runner tries it again when connectivity comes back, at ``TaskRunner/conditionsChanged()``,
  /// or after ``TaskRunner/Configuration/deferralDelay``; another runner or process may try it
  /// at once. The message is logged (`task.runDeferred`).
  case deferred(String)

  /// A retryable failure.
  public static func failed(_ message: String) -> TaskResult { .failed(message, retryable: true) }

  /// Done, keeping `output` (a server id, an ETag) for the tasks queued after it — read with
  /// ``TaskQueue/output(of:)`` or ``TaskQueue/output(dataId:tag:)`` — and making the cache keys in
  /// `invalidating` stale: their next refresh fetches whatever their age.
  public static func succeeded(output: TaskOutput?, invalidating keys: [String] = []) -> TaskResult {
    .succeededWith(output: output, invalidating: keys)
  }

  /// Done, making the cache keys in `keys` stale: their next refresh fetches whatever their age.
  public static func succeeded(invalidating keys: [String]) -> TaskResult {
    .succeededWith(output: nil, invalidating: keys)
  }
}
