import FerryLog
import Foundation

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
