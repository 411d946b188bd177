import FerryLog
import Foundation

/// Errors of the task queue. Errors of the log beneath it arrive as `FerryLogError` (module FerryLog).
public enum FerryError: Error, Sendable, CustomStringConvertible {
  /// An argument is not acceptable; the message says which and why.
  case invalidArgument(String)
  /// No task with this id is in the queue.
  case noSuchTask(TaskID)
  /// A run of the task is under way (claimed by a runner, in this process or another), so the
  /// change asked for is refused: the handler already has the task as it was.
  case taskRunning(TaskID)
  /// A task's payload could not be encoded or decoded as the type asked for.
  case payload(taskId: TaskID?, reason: String)
  /// ``RunFilter/collection(_:)`` named a collection not given at setup.
  case unknownCollection(String)
  /// An event of the queue's own types did not decode.
  case malformedEvent(sequence: UInt64, type: String, reason: String)

  /// A one-line message for people.
  public var description: String {
    switch self {
    case .invalidArgument(let message): return "invalid argument: \(message)"
    case .noSuchTask(let id): return "no task \(id) in the queue"
    case .taskRunning(let id): return "task \(id) is running: a handler has it as it was"
    case .payload(let taskId, let reason):
      return "payload" + (taskId.map { " of task \($0)" } ?? "") + ": \(reason)"
    case .unknownCollection(let name): return "no collection named '\(name)' was given at setup"
    case .malformedEvent(let sequence, let type, let reason):
      return "event \(sequence) of type \(type) is malformed: \(reason)"
    }
  }
}
