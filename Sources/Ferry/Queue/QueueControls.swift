import FerryLog
import Foundation

/// What an app does to queued work beyond adding it: change a task's payload, cancel a tag's or a
/// group's tasks, and wait until nothing is left to run (`Specs/task-events.md` §2.2, §4.1, §4.5).
/// Each change is a command, decided inside the commit.
extension TaskQueue {
  /// Replaces a queued task's payload; durable when it returns. The task keeps its id, its place
  /// in its group, its status and its attempts, and its next run is handed the new payload.
  ///
  /// The main use: a run recorded an error the user must fix (the task is blocked), the user
  /// fixes the item, and the fix is what gets sent:
  ///
  /// ```swift
  /// try await queue.updatePayload(id, to: Note(text: fixedText))
  /// try await queue.resolveError(id)     // the task runs again, with the new payload
  /// ```
  ///
  /// - A **blocked** task takes the update and stays blocked until ``resolveError(_:)``: the
  ///   update does not resolve anything by itself.
  /// - A **dead** task takes it and stays dead until ``revive(_:)``.
  /// - A **waiting** task (a retry time ahead) keeps its retry time; a manual task stays manual.
  ///
  /// A task whose run is under way — in any runner, in this process or another — is refused,
  /// since that run has the old payload and its outcome is about it; update it once the run has
  /// ended (a failed run leaves it queued).
  ///
  /// - Parameters:
  ///   - id: The queued task.
  ///   - payload: The new payload, encoded as JSON as an add's is.
  /// - Throws: ``FerryError/noSuchTask(_:)`` when the task is not queued; ``FerryError/taskRunning(_:)``
  ///   while a run of it is under way (see above); ``FerryError/payload(taskId:reason:)`` when `payload` does
  ///   not encode as JSON; ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or
  ///   suspended; ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func updatePayload(_ id: TaskID, to payload: some Encodable & Sendable) async throws(FerryError) {
    try await engine {
      let bytes = try Self.encode(payload)
      try await log.execute { context in try QueueCommand.updatePayload(id, bytes, context) }
      publish(.payloadUpdated(id))
    }
  }

  /// Cancels every queued task with a tag that has no run under way, in one commit, and
  /// reports them (``CancelReport/cancelled``). Tasks of the tag whose run is under way — in any
  /// runner, in this process or another — are left alone, and listed in
  /// ``CancelReport/running``: their runs finish and are logged as usual. A repeating task
  /// (``TaskSchedule/every(_:startingAt:)``) is cancelled even while it runs, so the series ends:
  /// its run goes on and is logged, and adds no next repetition. Observers get
  /// ``TaskUpdate/cancelled(_:)`` for each task cancelled.
  ///
  /// The queue has no index by tag: this reads every queued task's row (decoding only those of
  /// the tag), inside the commit.
  ///
  /// - Parameter tag: The tag whose tasks are cancelled.
  /// - Returns: What was cancelled, and the tasks left to their runs (``CancelReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func cancel(tag: String) async throws(FerryError) -> CancelReport {
    try await engine {
      try await cancel(.tag(tag))
    }
  }

  /// Cancels every queued task of a group that has no run under way, in one commit, and returns
  /// them (``CancelReport/cancelled``). A run under way (only the group's head can have one) is
  /// left alone and listed in ``CancelReport/running``: it finishes and is logged as usual — but
  /// a repeating task is cancelled while it runs, as by ``cancel(tag:)-(String)``, so its series ends.
  /// Observers get ``TaskUpdate/cancelled(_:)`` for each task cancelled.
  ///
  /// - Parameter groupId: The group whose tasks are cancelled.
  /// - Returns: What was cancelled, and the tasks left to their runs (``CancelReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func cancel(group groupId: String) async throws(FerryError) -> CancelReport {
    try await engine {
      try await cancel(.group(groupId))
    }
  }

  private func cancel(_ selection: TaskSelection) async throws -> CancelReport {
    let report = try await log.execute { context in try QueueCommand.cancel(selection, context) }
    for id in report.cancelled { publish(.cancelled(id)) }
    return report
  }

  /// Makes every dead task with a tag ready again, in one commit (their attempt counts are
  /// kept). After an outage that outlasted a policy's
  /// ``RetryPolicy/maxAttempts``, one call brings the whole tag back.
  ///
  /// - Parameter tag: The tag whose dead tasks are revived.
  /// - Returns: The tasks revived, in id order.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func revive(tag: String) async throws(FerryError) -> [TaskID] {
    try await engine { try await revive(.tag(tag)) }
  }

  /// Makes every dead task of a group ready again, in one commit.
  ///
  /// - Parameter groupId: The group whose dead tasks are revived.
  /// - Returns: The tasks revived, in id order.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func revive(group groupId: String) async throws(FerryError) -> [TaskID] {
    try await engine { try await revive(.group(groupId)) }
  }

  /// Makes every dead task ready again, in one commit.
  ///
  /// - Returns: The tasks revived, in id order.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func reviveAll() async throws(FerryError) -> [TaskID] { try await engine { try await revive(.all) } }

  private func revive(_ selection: TaskSelection) async throws -> [TaskID] {
    let revived = try await log.execute { context in try QueueCommand.revive(selection, context) }
    for id in revived { publish(.revived(id)) }
    return revived
  }

  /// Resolves the recorded error of every blocked task with a tag, in one commit: they (and
  /// their groups) may run again. A task whose error the app recorded while a run of it is under
  /// way is left to that run, and listed in ``BulkChangeReport/running``.
  ///
  /// - Parameter tag: The tag whose blocked tasks are resolved.
  /// - Returns: The tasks whose error was resolved, and those left to their runs (``BulkChangeReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func resolveErrors(tag: String) async throws(FerryError) -> BulkChangeReport {
    try await engine { try await resolve(.tag(tag)) }
  }

  /// Resolves the recorded error of every blocked task of a group, in one commit (as ``resolveErrors(tag:)``).
  ///
  /// - Parameter groupId: The group whose blocked tasks are resolved.
  /// - Returns: The tasks whose error was resolved, and those left to their runs (``BulkChangeReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func resolveErrors(group groupId: String) async throws(FerryError) -> BulkChangeReport {
    try await engine {
      try await resolve(.group(groupId))
    }
  }

  /// Resolves the recorded error of every blocked task, in one commit (as ``resolveErrors(tag:)``).
  ///
  /// - Returns: The tasks whose error was resolved, and those left to their runs (``BulkChangeReport``).
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  @discardableResult
  public func resolveAllErrors() async throws(FerryError) -> BulkChangeReport {
    try await engine { try await resolve(.all) }
  }

  private func resolve(_ selection: TaskSelection) async throws -> BulkChangeReport {
    let report = try await log.execute { context in try QueueCommand.resolve(selection, context) }
    for id in report.changed { publish(.errorResolved(id)) }
    return report
  }

  /// Whether the store's queue is idle now: no run is under way, in any process, and no task
  /// could be claimed at a time. See ``waitUntilIdle()`` for what counts as work.
  ///
  /// - Parameter date: The time to decide by: the store's clock now when nil; taken to the millisecond, as
  ///   the log keeps times.
  /// - Returns: True when no run is under way and no task could be claimed at `date`.
  /// - Throws: ``FerryError/closed`` or ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when the read fails.
  public func isIdle(at date: Date? = nil) throws(FerryError) -> Bool {
    try engine {
      let time = date?.unixMilliseconds ?? clock()
      return try log.read { view in
        try Self.isIdle(QueueTables(view.tables(of: TaskQueueProjection.projectionName)), now: time)
      }
    }
  }

  /// Returns once the store's queue is idle: no task is running and none is runnable, in this
  /// process or any other on the store. At once when it is idle already.
  ///
  /// *Work* is a run under way (a claim without an outcome yet, whoever owns it) and, unless the
  /// queue is paused, a task a pass would claim now: a ready task that heads its group (or has
  /// none) and is not manual, or a retry whose time has come. What is **not** work:
  /// - tasks that are manual, blocked by an error, dead, or behind a group head that cannot run;
  /// - every ready task while the queue is paused (``pause()``) — runs under way still count;
  /// - a retry whose time is still ahead: the queue is idle until it comes (then it is work again,
  ///   for the next call). Idle answers "is there anything to do now", so a caller that wants the
  ///   retries done too waits again after their time.
  ///
  /// A ready task counts as work even when no runner here can run it (no handler registered for
  /// its tag, or its `isReadyToRun` says no): the queue cannot know other processes' handlers. A
  /// run whose process died counts until it is interrupted (at the next open, pass, or a runner's
  /// periodic look for dead owners while running automatically).
  /// This does not run anything: without a runner at work (automatic running, passes, another
  /// process) it waits until someone runs or cancels the work.
  ///
  /// It does not poll: it looks at the queue's indexes (three first keys) now, and again each time
  /// the queue changes — this process's changes as they are made, other processes' as the queue's
  /// observation reads them from the log (within a fraction of a second).
  ///
  /// - Throws: ``FerryError/cancelled`` when the waiting task is cancelled; ``FerryError/closed`` when the
  ///   queue is closed meanwhile; ``FerryError/suspended`` when the store is suspended;
  ///   ``FerryError/notCurrent(_:)``, ``FerryError/damaged(path:message:)`` or ``FerryError/storage(_:)``
  ///   when a look at the queue fails.
  public func waitUntilIdle() async throws(FerryError) {
    try await engine {
      // Subscribed before the first look, so that no change falls between the look and the wait.
      // Also woken when the other-process follower finds another process's events compacted away unread
      // (the last task run there and compacted: no update of it will ever come).
      let (wakes, wake) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
      let changes = updates()
      let holes = compactedUnread.stream(for: nil) { nil }
      let feeds = [
        Task {
          for await _ in changes { wake.yield() }
          wake.finish()
        },
        Task { for await _ in holes { wake.yield() } },
      ]
      defer { for feed in feeds { feed.cancel() } }
      if try isIdle() { return }
      for await _ in wakes {
        if try isIdle() { return }
      }
      try Task.checkCancellation()
      throw FerryLogError.closed
    }
  }

  /// The idle rule of ``waitUntilIdle()``, on the queue's indexes: the first keys of `running`,
  /// `ready` and of each priority level of `waiting` (by time), and the pause flag.
  static func isIdle(_ queue: QueueTables<some ProjectionTableReading>, now: Int64) throws -> Bool {
    func isEmpty(_ table: String) throws -> Bool {
      var empty = true
      try queue.tables.scan(table, from: nil) { _, _ in
        empty = false
        return false
      }
      return empty
    }
    if try !isEmpty("running") { return false }
    if try queue.tables.get("state", key: QueueKey.paused) == [1] { return true }
    if try !isEmpty("ready") { return false }
    // The first key of each priority level of `waiting` is its earliest retry time.
    var queue = queue
    return try queue.earliestRetry(atOrAfter: .min).map { $0 > now } ?? true
  }

  /// One encoder for every payload: made once (its options never change after), not per add.
  private static let payloadEncoder: JSONEncoder = {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return encoder
  }()

  /// A payload's JSON bytes (keys sorted, so equal values give equal bytes): written directly
  /// when it holds only what ``PayloadJSON`` writes (the same bytes), else by `JSONEncoder`.
  static func encode(_ payload: some Encodable & Sendable) throws -> [UInt8] {
    if let bytes = PayloadJSON.encode(payload) { return bytes }
    do {
      return Array(try payloadEncoder.encode(payload))
    } catch {
      throw FerryError.payload(taskId: nil, reason: "it does not encode as JSON: \(error)")
    }
  }
}

// The operator's tool (`ferry cancel`, `ferry resolve`) changes a task only when no run of it is
// under way: unlike the app's own calls, which let a run finish and log it, an operator is told
// that a runner holds the task and nothing changes. Decided inside the commit, like every command.
extension TaskQueue {
  /// Cancels a queued task unless a run of it is under way. Throws ``FerryError/noSuchTask(_:)``
  /// when it is not queued and ``FerryError/taskRunning(_:)`` when a runner (in any process)
  /// holds it; appends nothing then.
  package func cancelUnlessRunning(_ id: TaskID) async throws {
    try await log.execute { context in
      try QueueCommand.onTask(id, .cancelled(id), context) { row in
        if row.claim != nil { throw FerryError.taskRunning(id) }
      }
    }
    publish(.cancelled(id))
  }

  /// Resolves a task's recorded error unless a run of it is under way (an error recorded by a
  /// handler that is still running). Throws as ``cancelUnlessRunning(_:)`` does, and
  /// ``FerryError/invalidArgument(_:)`` when the task has no unresolved error.
  package func resolveErrorUnlessRunning(_ id: TaskID) async throws {
    try await log.execute { context in
      try QueueCommand.onTask(id, .errorResolved(id), context) { row in
        if row.claim != nil { throw FerryError.taskRunning(id) }
        guard row.status == .blocked else {
          throw FerryError.invalidArgument("task \(id) has no unresolved error")
        }
      }
    }
    publish(.errorResolved(id))
  }
}
