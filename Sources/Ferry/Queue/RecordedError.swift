import FerryLog
import Foundation

/// A user-fixable error recorded on a task and not yet resolved.
public struct RecordedError: Sendable, Equatable {
  /// The task it blocks.
  public let taskId: TaskID
  /// The error's id: the sequence number of the event that recorded it.
  public let errorId: UInt64
  /// The message for the user.
  public let message: String
  /// When it was recorded (whole milliseconds, as the log keeps it).
  public var recordedAt: Date { Date(unixMilliseconds: recordedAtMs) }
  /// ``recordedAt`` as the log keeps it (Unix milliseconds).
  package let recordedAtMs: Int64

  init(taskId: TaskID, errorId: UInt64, message: String, recordedAtMs: Int64) {
    self.taskId = taskId
    self.errorId = errorId
    self.message = message
    self.recordedAtMs = recordedAtMs
  }
}
