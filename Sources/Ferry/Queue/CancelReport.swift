import FerryLog
import Foundation

/// What ``TaskQueue/cancel(tag:)-(String)`` or ``TaskQueue/cancel(group:)`` did.
public struct CancelReport: Sendable, Equatable {
  /// The tasks cancelled, in id order: they left the queue, and no run of them starts again. A
  /// repeating task is here even if a run of it was under way: that run goes on and is logged,
  /// and adds no next repetition.
  public let cancelled: [TaskID]
  /// The tasks of the tag or group (none that repeats) left in the queue because a run of them
  /// was under way: each
  /// run goes on, and its outcome is logged as usual (a success takes the task out of the queue;
  /// a failure leaves it queued). Cancel them one by one (``TaskQueue/cancel(_:)``) to have them
  /// leave the queue whatever their run's outcome.
  public let running: [TaskID]
}
