import FerryLog

/// The queue's decisions, made inside the writer's transaction (`Specs/task-events.md` §4): each
/// reads the queue at the log's head and appends what it decided, so two callers can never decide
/// the same thing. They are pure: a transaction that is run again runs them again.
enum QueueCommand {
  static func tables(_ context: CommandContext) throws -> QueueTables<ProjectionReader> {
    QueueTables(try context.tables(of: TaskQueueProjection.projectionName))
  }

  /// What an add decided.
  enum AddOutcome: Sendable {
    /// A new task, and the tasks the add replaced.
    case added(TaskID, replaced: [TaskID])
    /// Kept: a task of the same tag and data id is queued or running, and not dead; nothing was
    /// appended.
    case kept(TaskID)
  }

  static func add(_ event: TaskEvent, _ context: CommandContext) throws -> AddOutcome {
    guard case .added(let tag, _, let dataId, _, _, let unique, _, _, _) = event else {
      throw FerryError.invalidArgument("not an add")
    }
    var replaced: [TaskID] = []
    var cancelledDuringRun: [TaskID] = []
    if let dataId, unique != .append {
      let queue = try tables(context)
      let existing = try queue.tasks(tag: tag, dataId: dataId)
      if unique == .keep, let kept = try queue.keptTwin(existing) { return .kept(kept) }
      if unique == .replace {
        // Every twin is replaced. The add removes those without a claim; one whose run is under
        // way is cancelled by its own `task.cancelled`, logged just before the add: that run ends
        // as it will, the task does not run again, and its history ends in an event of its own
        // (what compaction keeps or removes with the rest of it; `Specs/task-events.md` §4.1).
        replaced = existing
        for id in existing where try queue.row(id)?.claim != nil { cancelledDuringRun.append(id) }
      }
    }
    let events = cancelledDuringRun.map { TaskEvent.cancelled($0).newEvent } + [event.newEvent]
    guard let id = try context.append(events).last.map(TaskID.init(rawValue:)) else {
      throw FerryError.invalidArgument("the add appended nothing")
    }
    return .added(id, replaced: replaced)
  }

  /// Appends `event` when the task is queued (and passes `check`); throws otherwise, appending nothing.
  static func onTask(
    _ id: TaskID, _ event: TaskEvent, _ context: CommandContext,
    check: (TaskRow) throws -> Void = { _ in }
  ) throws {
    guard let row = try tables(context).row(id), row.isQueued else { throw FerryError.noSuchTask(id) }
    try check(row)
    try context.append([event.newEvent])
  }

  /// Replaces a queued task's payload: refused when it is not queued (`noSuchTask`) or a run of
  /// it is under way (`taskRunning`: its handler has the old payload, and its outcome is about
  /// that). Ready, waiting, blocked, dead and manual tasks take it and keep their status.
  static func updatePayload(_ id: TaskID, _ payload: [UInt8], _ context: CommandContext) throws {
    guard let row = try tables(context).row(id), row.isQueued else { throw FerryError.noSuchTask(id) }
    if row.claim != nil { throw FerryError.taskRunning(id) }
    try context.append([TaskEvent.payloadUpdated(id, payload: payload).newEvent])
  }

  /// Cancels every queued task of a tag, or of a group, that has no run under way — one
  /// `task.cancelled` each, in this one command — and names the tasks left because they run. A
  /// repeating task is cancelled even while it runs: left alone, its success would add the next
  /// repetition, and the series the caller cancelled would go on (`Specs/task-events.md` §3.5).
  static func cancel(
    _ selection: TaskSelection, _ context: CommandContext
  ) throws -> CancelReport {
    let queue = try tables(context)
    var cancelled: [TaskID] = []
    var running: [TaskID] = []
    for (id, row) in try selected(selection, queue) {
      if row.claim != nil && row.interval == nil { running.append(id) } else { cancelled.append(id) }
    }
    try context.append(cancelled.map { TaskEvent.cancelled($0).newEvent })
    return CancelReport(cancelled: cancelled, running: running)
  }

  /// Revives every dead task of the selection (a dead task has no run under way), in one commit.
  static func revive(_ selection: TaskSelection, _ context: CommandContext) throws -> [TaskID] {
    let dead = try selected(selection, tables(context)).filter { $0.1.status == .dead }.map(\.0)
    try context.append(dead.map { TaskEvent.revived($0).newEvent })
    return dead
  }

  /// Resolves the error of every blocked task of the selection that has no run under way (one
  /// recorded by the app during a run is left to that run), in one commit.
  static func resolve(_ selection: TaskSelection, _ context: CommandContext) throws -> BulkChangeReport {
    var report = BulkChangeReport()
    for (id, row) in try selected(selection, tables(context)) where row.status == .blocked {
      if row.claim != nil { report.running.append(id) } else { report.changed.append(id) }
    }
    try context.append(report.changed.map { TaskEvent.errorResolved($0).newEvent })
    return report
  }

  /// The queued tasks of a selection, in id order, with their rows.
  private static func selected(
    _ selection: TaskSelection, _ queue: QueueTables<ProjectionReader>
  ) throws -> [(TaskID, TaskRow)] {
    var candidates: [TaskID] = []
    switch selection {
    case .all:
      try queue.tables.scan("tasks", from: nil) { key, _ in
        if let id = TaskID(bigEndianBytes: key) { candidates.append(id) }
        return true
      }
    case .group(let groupId):
      let prefix = QueueKey.groupPrefix(groupId)
      try queue.tables.scan("groups", from: prefix) { key, _ in
        guard key.count == prefix.count + 8 && key.starts(with: prefix), let id = QueueKey.trailingID(key)
        else { return false }
        candidates.append(id)
        return true
      }
    case .tag(let tag):
      // No index by tag: the rows are read in id order, and only those that begin with this tag
      // (a row starts with it, `string` encoded) are decoded.
      let encoded = UInt32(tag.utf8.count).bigEndianBytes + Array(tag.utf8)
      var failure: PayloadError?
      try queue.tables.scan("tasks", from: nil) { key, value in
        guard value.starts(with: encoded) else { return true }
        guard let id = TaskID(bigEndianBytes: key) else {
          failure = PayloadError("a task key has \(key.count) bytes")
          return false
        }
        candidates.append(id)
        return true
      }
      if let failure { throw failure }
    }
    var rows: [(TaskID, TaskRow)] = []
    for id in candidates {
      // A task cancelled while it runs has left the queue already (its row waits for the run).
      guard let row = try queue.row(id), row.isQueued else { continue }
      if case .tag(let tag) = selection, row.tag != tag { continue }
      rows.append((id, row))
    }
    return rows
  }

  /// Pauses or resumes; returns whether the state changed (nothing is appended when it did not).
  static func setPaused(_ paused: Bool, _ context: CommandContext) throws -> Bool {
    let isPaused = try tables(context).tables.get("state", key: QueueKey.paused) == [1]
    if isPaused == paused { return false }
    try context.append([(paused ? TaskEvent.paused : TaskEvent.resumed).newEvent])
    return true
  }

  /// Whether a run's outcome was logged.
  enum FinishOutcome: Sendable, Equatable {
    /// Logged: the caller owned the run (or the task left the queue during it).
    case logged
    /// Not logged: the run is no longer the caller's (it was interrupted meanwhile).
    case notOwner
  }

  /// Logs a run's outcome if the run is still the caller's. A task that left the queue during its
  /// run (cancelled, cleared: its row waits, cancelled, with the caller's claim) gets its outcome
  /// logged too, and does not come back. The success of a repeating task that is still queued
  /// adds, in the same commit, the task that repeats it (due `interval` after `now`):
  /// `repetition` is its id.
  static func finish(
    _ id: TaskID, claim: TaskRow.Claim, outcome: [TaskEvent], now: Int64, _ context: CommandContext,
    repetition: inout TaskID?
  ) throws -> FinishOutcome {
    let row = try tables(context).row(id)
    if let row, row.claim != claim { return .notOwner }
    var events = outcome.map(\.newEvent)
    let next = try row.flatMap { row in try repeating(id, row, after: outcome, now: now, context) }
    if let next { events.append(next.newEvent) }
    let sequences = try context.append(events)
    if next != nil { repetition = sequences.last.map(TaskID.init(rawValue:)) }
    return .logged
  }

  /// The add of the task that repeats `id` when `outcome` is a success of a repeating task still
  /// queued (a cancel during the run ends the series): the same tag, payload (its latest), data
  /// id, group and priority, due an interval from now (`Specs/task-events.md` §3.5).
  private static func repeating(
    _ id: TaskID, _ row: TaskRow, after outcome: [TaskEvent], now: Int64, _ context: CommandContext
  ) throws -> TaskEvent? {
    guard let interval = row.interval, row.isQueued,
      outcome.contains(where: { if case .runSucceeded = $0 { true } else { false } }),
      try !seriesGoesOn(beside: id, row, context)
    else { return nil }
    let source = try tables(context).payloadSource(id)
    let payload = try TaskQueue.payload(of: id, at: source) { try context.event(at: $0) }
    let (due, overflow) = now.addingReportingOverflow(interval)
    // Always .append: the series' own next task, whatever twins the app added meanwhile.
    return .added(
      tag: row.tag, payload: payload.bytes, dataId: row.dataId, groupId: row.groupId, manual: false,
      unique: .append, priority: row.priority, deadline: nil,
      schedule: AddSchedule(startAt: overflow ? .max - 1 : due, interval: interval))
  }

  /// Whether another queued task of the same tag and data id repeats and is not dead: the series
  /// goes on in it (an add with `keep` restarted the series while this one was dead, and this one
  /// was revived since), and a repetition of this one would run every interval twice.
  private static func seriesGoesOn(
    beside id: TaskID, _ row: TaskRow, _ context: CommandContext
  ) throws -> Bool {
    guard let dataId = row.dataId else { return false }
    let queue = try tables(context)
    for twin in try queue.tasks(tag: row.tag, dataId: dataId) where twin != id {
      if let other = try queue.row(twin), other.isQueued, other.status != .dead, other.interval != nil {
        return true
      }
    }
    return false
  }

  /// Interrupts a run whose owner is gone, if it is still that same claim.
  static func interrupt(_ id: TaskID, claim: TaskRow.Claim, _ context: CommandContext) throws -> Bool {
    guard let row = try tables(context).row(id), row.claim == claim else { return false }
    try context.append([TaskEvent.runInterrupted(id).newEvent])
    return true
  }

  /// The claims in the `running` index.
  static func claims(_ tables: QueueTables<some ProjectionTableReading>) throws -> [(TaskID, TaskRow.Claim)] {
    var result: [(TaskID, TaskRow.Claim)] = []
    var failure: (any Error)?
    try tables.tables.scan("running", from: nil) { key, value in
      guard let id = TaskID(bigEndianBytes: key) else {
        failure = PayloadError("a running key has \(key.count) bytes")
        return false
      }
      do {
        result.append((id, try TaskRow.Claim(bytes: Array(value))))
      } catch {
        failure = error
        return false
      }
      return true
    }
    if let failure { throw failure }
    return result
  }
}

/// Which tasks a cancel by selection looks at.
enum TaskSelection: Sendable {
  case tag(String)
  case group(String)
  case all
}

/// A claimed run: the task, its attempt and claim, and its payload (read in the claim's command).
struct ClaimedRun: Sendable {
  let task: PendingTask
  let claim: TaskRow.Claim
  let payload: [UInt8]
  /// ``RunningTask/idempotencyKey``: the id of the event that holds the payload.
  let payloadEventId: EventID
}
