import FerryLog
import Foundation

/// The task a handler is running.
public struct RunningTask: Sendable {
  /// The task's id.
  public let id: TaskID
  /// Its tag.
  public let tag: String
  /// Its data id.
  public let dataId: String?
  /// Its group.
  public let groupId: String?
  /// This run's attempt number (1 for the first run).
  public let attempt: UInt32
  /// The payload's JSON bytes as they were added, or as the latest
  /// ``TaskQueue/updatePayload(_:to:)`` before this run's claim left them.
  public let payloadBytes: [UInt8]
  /// The key a server deduplicates this change on (send it as an `Idempotency-Key` header): the
  /// same on every attempt, in every process and after every crash, for as long as the payload
  /// stays; never used by another task or store. It is the id of the event that holds the payload
  /// — the task's add, or its latest ``TaskQueue/updatePayload(_:to:)``: a new payload is a new
  /// change, with a key of its own (a server that saw the old one must not drop the new one).
  /// Kept by compaction, `ferry compact --copy`, `ferry salvage` and `ferry export`/`import`.
  public var idempotencyKey: String { payloadEventId.description }
  /// The id of the event that holds the payload (made into text only when a handler asks).
  let payloadEventId: EventID

  /// Decodes the payload; ``FerryError/payload(taskId:reason:)`` when it no longer decodes as `type`
  /// (a handler that lets this error out fails the task for good: retrying cannot help).
  public func payload<Payload: Decodable>(as type: Payload.Type) throws(FerryError) -> Payload {
    do {
      return try JSONDecoder().decode(type, from: Data(payloadBytes))
    } catch {
      throw FerryError.payload(taskId: id, reason: "it does not decode as \(type): \(error)")
    }
  }
}

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

/// A small value a task's success leaves for later tasks — the id a server gave a record created
/// offline, an ETag: JSON, kept in the success's event (at most ``maxSize`` bytes).
public struct TaskOutput: Sendable, Equatable {
  /// The largest output, in bytes of JSON: outputs are kept in the queue, not in a blob store.
  public static let maxSize = 64 * 1024
  /// The output's JSON bytes.
  public let bytes: [UInt8]

  /// Encodes `value` as JSON; ``FerryError/invalidArgument(_:)`` when it does not encode or is
  /// larger than ``maxSize``.
  public init(_ value: some Encodable) throws(FerryError) {
    let data: Data
    do {
      data = try JSONEncoder().encode(value)
    } catch {
      throw FerryError.invalidArgument("the task output does not encode as JSON: \(error)")
    }
    try self.init(bytes: Array(data))
  }

  /// Wraps JSON bytes already encoded; ``FerryError/invalidArgument(_:)`` past ``maxSize``.
  public init(bytes: [UInt8]) throws(FerryError) {
    guard bytes.count <= Self.maxSize else {
      throw FerryError.invalidArgument(
        "a task output has \(bytes.count) bytes; at most \(Self.maxSize) are kept")
    }
    self.bytes = bytes
  }

  init(stored bytes: [UInt8]) { self.bytes = bytes }

  /// Decodes the output as `type`; ``FerryError/invalidArgument(_:)`` when it does not decode.
  public func decode<Value: Decodable>(as type: Value.Type) throws(FerryError) -> Value {
    do {
      return try JSONDecoder().decode(type, from: Data(bytes))
    } catch {
      throw FerryError.invalidArgument("the task output does not decode as \(type): \(error)")
    }
  }
}

/// When a failed task may run again: exponential backoff with jitter, and a limit on attempts.
///
/// The delay after run number *n* fails is `initialDelay × multiplier^(n − 1)`, times a random
/// factor in `[1 − jitter, 1 + jitter]`, then capped at ``maxDelay``: jitter first, the cap last,
/// so the delay never exceeds ``maxDelay``. (A growth already past the cap is taken as the cap
/// before the factor, so retries at the cap still spread out below it.)
///
/// Delays are kept in whole milliseconds (as the log keeps retry times): a delay's sub-millisecond
/// part is dropped. A negative delay is taken as zero — the initializer clamps it, and so does
/// ``delay(afterAttempt:random:)`` for a property set negative afterwards — so a policy never
/// schedules a retry in the past.
public struct RetryPolicy: Sendable, Equatable {
  /// Failed runs allowed in all; after the last one fails the task is dead. Only a server's
  /// answer counts: a deferred run, a run while offline and an interrupted run (the app killed,
  /// a window's end) give their attempt back. ``unlimited`` by default.
  public var maxAttempts: UInt32
  /// The delay after the first failure.
  public var initialDelay: Duration
  /// Each further failure multiplies the delay by this.
  public var multiplier: Double
  /// The delay never exceeds this: it is applied after the jitter.
  public var maxDelay: Duration
  /// The delay varies by up to this fraction either way (0 = exact), so that many clients do not
  /// retry in step — within ``maxDelay``, which caps the varied delay.
  public var jitter: Double

  /// No limit on attempts: a change is never given up on by itself (``maxAttempts``).
  public static let unlimited = UInt32.max

  /// A policy; the defaults are no limit on attempts, 1 s doubling up to 1 h, ±20 % — an
  /// offline-first app's change should outlast any outage; a failure that retrying cannot fix is
  /// the handler's to say (`.failed(_, retryable: false)` or `.recordError`). A `maxAttempts` of 0
  /// is taken as 1, a negative delay as zero, a multiplier below 1 (or NaN) as 1, and a jitter
  /// outside 0...1 as its nearest end (NaN or infinite: 0).
  public init(
    maxAttempts: UInt32 = RetryPolicy.unlimited, initialDelay: Duration = .seconds(1), multiplier: Double = 2,
    maxDelay: Duration = .seconds(3600), jitter: Double = 0.2
  ) {
    self.maxAttempts = max(1, maxAttempts)
    self.initialDelay = max(.zero, initialDelay)
    self.multiplier = multiplier.isNaN ? 1 : max(1, multiplier)  // +infinity: straight to maxDelay
    self.maxDelay = max(.zero, maxDelay)
    self.jitter = jitter.isFinite ? min(max(jitter, 0), 1) : 0
  }

  /// The delay after the failure of run number `attempt`, for a random number in 0..<1: whole
  /// milliseconds, never negative, never more than ``maxDelay``.
  public func delay(afterAttempt attempt: UInt32, random: Double) -> Duration {
    .milliseconds(delayMilliseconds(afterAttempt: attempt, random: random))
  }

  /// ``delay(afterAttempt:random:)`` in milliseconds.
  func delayMilliseconds(afterAttempt attempt: UInt32, random: Double) -> Int64 {
    let initialMs = max(0, initialDelay.milliseconds)
    let maxMs = max(0, maxDelay.milliseconds)
    let exponent = Double(max(attempt, 1) - 1)
    let grown = Double(initialMs) * pow(multiplier, exponent)
    let base = grown.isFinite ? min(grown, Double(maxMs)) : Double(maxMs)
    let unit = random.isFinite ? min(max(random, 0), 1) : 0.5
    let jitter = self.jitter.isFinite ? min(max(self.jitter, 0), 1) : 0
    // Jitter, then the cap: the cap is a promise ("never exceeds"), the jitter a spread within it.
    let delay = min(base * (1 - jitter + 2 * jitter * unit), Double(maxMs))
    guard delay.isFinite else { return min(maxMs, Int64.max / 2) }
    return min(maxMs, Int64(min(max(delay, 0), Double(Int64.max / 2))))
  }
}

/// Which tasks a pass considers.
public enum RunFilter: Sendable, Equatable {
  /// Every task that is not manual.
  case all
  /// The tasks of one group.
  case group(String)
  /// The tasks whose tags are in a collection given at setup.
  case collection(String)
  /// One task (the only way a manual task runs).
  case task(TaskID)
}

/// Why a pass did not run a task. Skips are reported, not logged.
public enum SkipReason: Sendable, Equatable {
  /// An earlier task of its group failed, recorded an error, or was skipped in this pass (not ready, no handler, blocked, dead, waiting for its retry): the rest of the group
  /// waits for a later pass.
  case partOfFailedGroup
  /// Its tag's `isReadyToRun` check, or the runner's (``TaskRunner/Configuration/isReadyToRun``),
  /// said no. ``TaskRunner/conditionsChanged()`` has them asked again.
  case notReady
  /// It has an unresolved recorded error.
  case blockedByError
  /// It waits for its retry time.
  case waitingForRetry(until: Date)
  /// It has not run yet and waits for its start time (``TaskSchedule``).
  case scheduled(at: Date)
  /// It is dead (revive it to run it again).
  case dead
  /// It is running already (in another pass or process).
  case running
  /// An earlier task of its group is still queued.
  case notHeadOfGroup
  /// No handler is registered for its tag; it stays queued.
  case noHandler
  /// It left the queue (cancelled or cleared) before its turn.
  case noLongerQueued
  /// The runner's ``TaskRunner/Configuration/connectivity`` says the device is offline: nothing
  /// starts, and no attempt is spent, until it is back.
  case offline
  /// Its last run in this runner said ``TaskResult/deferred(_:)``: it waits for connectivity to
  /// come back, ``TaskRunner/conditionsChanged()`` or ``TaskRunner/Configuration/deferralDelay``.
  case deferred
}

/// What happened to one task in a pass.
public enum TaskOutcome: Sendable, Equatable {
  /// The handler succeeded.
  case succeeded
  /// The handler failed; `retryAt` is when it may run again (nil: it is dead).
  case failed(String, retryAt: Date?)
  /// The handler recorded an error for the user.
  case errorRecorded(String)
  /// The run was cancelled or interrupted; the task is ready again.
  case interrupted
  /// The handler said not now (or failed while offline): the task is ready again, no attempt spent.
  case deferred(String)
  /// It was not run.
  case skipped(SkipReason)
  /// Its deadline had passed before a run of it started: it left the queue (`task.expired`).
  case expired
}

/// The result of one pass.
public struct RunReport: Sendable, Equatable {
  /// One task's outcome.
  public struct Entry: Sendable, Equatable {
    /// The task.
    public let taskId: TaskID
    /// What happened.
    public let outcome: TaskOutcome
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
  public func outcome(of id: TaskID) -> TaskOutcome? { entries.first { $0.taskId == id }?.outcome }
}

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

/// One event in a task's history (``TaskQueue/history(of:)``).
public struct TaskHistoryEntry: Sendable, Equatable {
  /// What happened.
  public enum Kind: Sendable, Equatable {
    /// The task was added.
    case added
    /// Run number `attempt` started.
    case runStarted(attempt: UInt32)
    /// A run succeeded.
    case runSucceeded
    /// A run failed; `retryAt` nil means the task became dead.
    case runFailed(message: String, retryAt: Date?)
    /// A run was interrupted (found at open, or cancelled).
    case runInterrupted
    /// A run said not now (or failed while offline): it gave its attempt back.
    case runDeferred(reason: String)
    /// A user-fixable error was recorded.
    case errorRecorded(message: String)
    /// The error was resolved.
    case errorResolved
    /// The task was revived.
    case revived
    /// Its payload was replaced (``TaskQueue/updatePayload(_:to:)``).
    case payloadUpdated
    /// The task was cancelled.
    case cancelled
    /// Its deadline passed before a run of it started: it left the queue.
    case expired
    /// The queue was cleared.
    case cleared
    /// A later add with ``UniquePolicy/replace`` (the task with this id) took its place.
    case replaced(by: TaskID)
  }

  /// The event's sequence number.
  public let sequence: UInt64
  /// When it was logged (whole milliseconds, as the log keeps it).
  public var timestamp: Date { Date(unixMilliseconds: timestampMs) }
  /// What happened.
  public let event: Kind
  /// ``timestamp`` as the log keeps it (Unix milliseconds).
  package let timestampMs: Int64

  init(sequence: UInt64, timestampMs: Int64, event: Kind) {
    self.sequence = sequence
    self.timestampMs = timestampMs
    self.event = event
  }
}
