import FerryLog
import Foundation

/// A task's id: the sequence number of the event that added it. Ids are never reused, and their
/// order is the order tasks were added (FIFO by log order, never by wall clock).
public typealias TaskID = UInt64

/// What `add` does when a task with the same tag and data id (a *twin*) is already queued.
public enum UniquePolicy: UInt8, Sendable, CaseIterable {
  /// Add another task regardless (the default).
  case append = 0
  /// Keep the existing task and add nothing; `add` returns the existing task's id. Only a twin
  /// that will still run keeps the new task out: one ready, waiting for a retry, running, or
  /// blocked by an error (it runs once the error is resolved). A dead twin never does — it would
  /// never send the newer change: the new task is added after it, and the dead one stays, dead and
  /// visible, until it is revived or cancelled.
  case keep = 1
  /// Cancel every twin, then add the new one. A twin whose run is under way is cancelled too: its
  /// handler runs on and its outcome is logged, but it leaves the queue at once and never runs
  /// again, and its group's next task waits until that handler has ended.
  case replace = 2
}

/// How urgent a task is: among the tasks that may start now, a pass claims higher priorities
/// first (`Specs/task-events.md` §4.3). Within one priority the order is unchanged: due retries
/// by retry time, then ready tasks by id. Priority never reorders a group: a group's tasks run in
/// id order, and its head competes with the head's own priority.
///
/// ``low``, ``normal`` and ``high`` are the usual levels; any `Int8` is a level of its own
/// (larger is more urgent), for apps that need more than three.
public struct TaskPriority: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
  /// The level as stored in the log: larger runs first; 0 is ``normal``.
  public let rawValue: Int8

  /// A level: larger runs first.
  public init(rawValue: Int8) { self.rawValue = rawValue }

  /// Runs after the normal and high tasks that may start.
  public static let low = TaskPriority(rawValue: -1)
  /// The default.
  public static let normal = TaskPriority(rawValue: 0)
  /// Runs before the normal and low tasks that may start.
  public static let high = TaskPriority(rawValue: 1)

  public static func < (lhs: TaskPriority, rhs: TaskPriority) -> Bool { lhs.rawValue < rhs.rawValue }

  public var description: String {
    switch self {
    case .low: return "low"
    case .normal: return "normal"
    case .high: return "high"
    default: return "priority \(rawValue)"
    }
  }

  /// The first byte of an index key: higher priorities sort first (127 → 0, −128 → 255).
  var indexLevel: UInt8 { UInt8(127 - Int(rawValue)) }
}

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

/// A task in the queue.
public struct PendingTask: Sendable, Equatable {
  /// The task's id.
  public let id: TaskID
  /// The tag that selects its handler.
  public let tag: String
  /// The app's id for the data the task is about (used by unique policies and queries).
  public let dataId: String?
  /// Tasks of one group run strictly in id order, one at a time.
  public let groupId: String?
  /// A manual task runs only when asked for by id.
  public let manual: Bool
  /// Where it stands.
  public let status: TaskStatus
  /// Runs started so far (each run's ``RunningTask/attempt`` is its number among them).
  public let attempts: UInt32
  /// The runs that count toward the retry policy's ``RetryPolicy/maxAttempts``: ``attempts``
  /// less the runs that gave their attempt back — deferred (``TaskResult/deferred(_:)``, or a
  /// failure while offline) or interrupted (the app killed, a window's end, a stop).
  public var attemptsSpent: UInt32 { attempts &- attemptsGivenBack }
  /// Runs that gave their attempt back.
  package let attemptsGivenBack: UInt32
  /// When it was added (whole milliseconds, as the log keeps it).
  public var addedAt: Date { Date(unixMilliseconds: addedAtMs) }
  /// The message of its last failed run, if any.
  public let lastFailure: String?
  /// How many errors have been recorded on it, resolved or not.
  public let errorCount: UInt32
  /// ``addedAt`` as the log keeps it (Unix milliseconds).
  package let addedAtMs: Int64
  /// How urgent it is (``TaskPriority/normal`` unless given to `add`).
  public let priority: TaskPriority
  /// When given to `add`: no run of it starts after this time; a task still queued then leaves
  /// the queue (``TaskUpdate/expired(_:)``). A run already under way is not interrupted.
  public let deadline: Date?
  /// When given to `add` (``TaskSchedule``): no run of it starts before this time.
  public let startAt: Date?
  /// When it repeats (``TaskSchedule/every(_:startingAt:)``): each success of it adds the task that
  /// repeats it, due this long after that success.
  public let repeatInterval: Duration?

  init(
    id: TaskID, tag: String, dataId: String?, groupId: String?, manual: Bool, status: TaskStatus,
    attempts: UInt32, addedAtMs: Int64, lastFailure: String?, errorCount: UInt32,
    priority: TaskPriority = .normal, deadline: Date? = nil, attemptsGivenBack: UInt32 = 0,
    startAt: Date? = nil, repeatInterval: Duration? = nil
  ) {
    self.startAt = startAt
    self.repeatInterval = repeatInterval
    self.attemptsGivenBack = attemptsGivenBack
    self.id = id
    self.tag = tag
    self.dataId = dataId
    self.groupId = groupId
    self.manual = manual
    self.status = status
    self.attempts = attempts
    self.addedAtMs = addedAtMs
    self.lastFailure = lastFailure
    self.errorCount = errorCount
    self.priority = priority
    self.deadline = deadline
  }

  /// The same task with another status.
  func with(status: TaskStatus) -> PendingTask {
    PendingTask(
      id: id, tag: tag, dataId: dataId, groupId: groupId, manual: manual, status: status, attempts: attempts,
      addedAtMs: addedAtMs, lastFailure: lastFailure, errorCount: errorCount, priority: priority,
      deadline: deadline, attemptsGivenBack: attemptsGivenBack, startAt: startAt,
      repeatInterval: repeatInterval)
  }
}

/// What a change of many tasks at once did (``TaskQueue/resolveErrors(tag:)``, …).
public struct BulkChangeReport: Sendable, Equatable {
  /// The tasks changed, in id order.
  public internal(set) var changed: [TaskID] = []
  /// The tasks left alone because a run of them is under way, in id order.
  public internal(set) var running: [TaskID] = []
}

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
    case .diskFull(let path): return FerryLogError.diskFull(path: path).description
    case .quotaExceeded(let path): return FerryLogError.quotaExceeded(path: path).description
    case .ioError(let path, let detail): return FerryLogError.ioError(path: path, detail: detail).description
    }
  }
}
