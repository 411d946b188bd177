import FerryLog
import Foundation

/// Every failure of Ferry's API: of the task queue, the cache ledger and the store beneath them.
/// An app catches them all with `import Ferry` alone; the storage engine's own errors are mapped
/// to the cases below at the API's edge, their message kept.
///
/// ```swift
/// do { try await store.queue.add(tag: "save-note", payload: note) }
/// catch .closed { /* the store was closed meanwhile */ }
/// catch { show(error.description) }
/// ```
public enum FerryError: Error, Sendable, Equatable, CustomStringConvertible {
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

  // The store's failures.

  /// The store was closed (``FerryStore/close()``); nothing more is read or written.
  case closed
  /// The store is suspended (``FerryStore/suspend()``): call again after ``FerryStore/resume()``.
  case suspended
  /// The task that made the call was cancelled while it waited.
  case cancelled
  /// There is no store at the path, and the open was not to create one.
  case noSuchStore(path: String)
  /// The path exists but does not hold a Ferry store.
  case notAStore(path: String, reason: String)
  /// The store is already open in this process: use that ``FerryStore``, or close it first.
  case alreadyOpen(path: String)
  /// The process may not read or write the store.
  case permissionDenied(path: String, detail: String)
  /// The store, or a record in it (`path` nil), was written by a newer Ferry or a newer version
  /// of the app: this code does not touch it. `message` says what was found.
  case newerFormat(path: String?, message: String)
  /// The process runs on an LMDB that Ferry does not support; nothing was opened.
  case unsupportedLMDB(found: String, supported: String)
  /// Commits only the store's write-ahead segment holds, which a read-only open cannot show:
  /// open it read-write once (`ferry recover`).
  case needsRecovery(path: String)
  /// A read-only open asked for a recovered copy of a store that needs recovery
  /// (``FerryStore/openReadOnly(at:recoveredCopyIfNeeded:)``) and none could be made (no room in
  /// the temporary directory, a failed copy or replay): `reason` says why. The store is untouched.
  case recoveredCopyFailed(path: String, reason: String)
  /// The store's files are damaged or lost commits (`path` nil when only a record is known):
  /// `message` names what and how to recover (`ferry salvage`).
  case damaged(path: String?, message: String)
  /// The disk holding the store is full; nothing acknowledged was lost.
  case diskFull(path: String)
  /// The user's disk quota is used up; nothing acknowledged was lost.
  case quotaExceeded(path: String)
  /// The device reported an input/output error: the disk or file system is failing.
  case ioError(path: String, detail: String)
  /// The store could not bring its state up to date for this call (a read-only store, a writer
  /// held up, another process keeping it at another version); calling again may succeed.
  case notCurrent(String)
  /// A storage failure none of the cases above names, with the engine's message.
  case storage(String)

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
    case .closed: return "the store is closed"
    case .cancelled: return "the call was cancelled"
    case .newerFormat(_, let message), .damaged(_, let message), .notCurrent(let message),
      .storage(let message):
      return message
    // The engine's wording, one source for both.
    case .suspended: return FerryLogError.suspended.description
    case .noSuchStore(let path): return FerryLogError.noSuchStore(path: path).description
    case .notAStore(let path, let reason):
      return FerryLogError.notAStore(path: path, reason: reason).description
    case .alreadyOpen(let path): return FerryLogError.alreadyOpen(path: path).description
    case .permissionDenied(let path, let detail):
      return FerryLogError.permissionDenied(path: path, detail: detail).description
    case .unsupportedLMDB(let found, let supported):
      return FerryLogError.unsupportedLMDB(found: found, supported: supported).description
    case .needsRecovery(let path): return FerryLogError.needsRecovery(path: path).description
    case .recoveredCopyFailed(let path, let reason):
      return FerryLogError.recoveredCopyFailed(path: path, reason: reason).description
    case .diskFull(let path): return FerryLogError.diskFull(path: path).description
    case .quotaExceeded(let path): return FerryLogError.quotaExceeded(path: path).description
    case .ioError(let path, let detail): return FerryLogError.ioError(path: path, detail: detail).description
    }
  }
}
