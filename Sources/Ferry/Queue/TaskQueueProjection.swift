import FerryLog

/// The queue folded from the log: tasks, the indexes the runner asks, group order, unique keys,
/// errors and the pause flag (`Specs/task-events.md` §3).
struct TaskQueueProjection: InPlaceFolding {
  static let projectionName = "taskQueue"
  static let tableNames = [
    "tasks", "ready", "waiting", "running", "groups", "unique", "errors", "payloads", "deadlines", "state",
    "outputs", "outputsByData",
  ]
  // Computed, not stored: a projection with no stored properties fits in its existential's
  // inline buffer, and every fold reaches it through one without copying a box.
  var name: String { Self.projectionName }
  /// 2: claims with owners (`task.runStarted` v2), the `running` index holds each claim.
  /// 3: `task.payloadUpdated`, and the `payloads` table naming the event that holds a task's payload.
  /// 4: priority and deadline (`task.added` v2) in the row, `ready` and `waiting` keys led by the
  /// priority level, the `deadlines` index and `task.expired`.
  /// 5: a task cancelled or cleared while a run of it is under way keeps its row (status
  /// cancelled), claim and group entry until that run's outcome: its group waits for the handler,
  /// and it does not run again.
  /// 6: the outputs of successes (`task.runSucceeded` v2) in `outputs` and `outputsByData`; an
  /// interrupted run and a deferred one (`task.runDeferred`) give their attempt back (the row's
  /// `givenBack`).
  ///    And an add with keep whose only twins are dead is stored (the add command now logs it): a
  /// dead twin never swallows a newer change. Rebuilt so that old logs fold by the same rule.
  /// 7: the schedule of `task.added` v3 — a start time (the task waits in `waiting` until it) and
  /// a repeat interval — in the row (`startAt`, `interval`).
  var version: UInt32 { 7 }
  var tables: [String] { Self.tableNames }

  func apply(_ event: LoggedEvent, to tables: ProjectionTables) throws {
    // On the live path the appender hands the event it encoded; a rebuild decodes the payload
    // (and passes over the other side's events: nil).
    guard let decoded = try (event.decoded as? TaskEvent) ?? TaskEvent.forFold(event) else { return }
    try fold(decoded, sequence: event.sequence, timestamp: event.timestamp, to: tables)
  }

  /// A replay's fold: the payload decoded where it lies in the map.
  func apply(_ header: RecordHeader, payload: UnsafeRawBufferPointer, to tables: ProjectionTables) throws {
    guard let decoded = try TaskEvent.forFold(header, payload: payload) else { return }
    try fold(decoded, sequence: header.sequence, timestamp: header.timestamp, to: tables)
  }

  // `consuming`: the event is destroyed here, case by case, not by a generic value witness in the
  // caller, once per event of a rebuild.
  private func fold(
    _ decoded: consuming TaskEvent, sequence: UInt64, timestamp: Int64, to tables: ProjectionTables
  ) throws {
    let queue = QueueTables(tables)
    switch decoded {
    case .added(
      let tag, _, let dataId, let groupId, let manual, let unique, let priority, let deadline, let schedule):
      if let dataId, unique != .append {
        let existing = try queue.tasks(tag: tag, dataId: dataId)
        // The command's rule (`keptTwin`): a dead twin keeps nothing out (version 6).
        if unique == .keep, try queue.keptTwin(existing) != nil { return }
        if unique == .replace {
          // A twin whose run is under way stays: the add command logs its `task.cancelled` first
          // (version 5; logs of earlier versions left it queued, and still fold so).
          for id in existing where try queue.row(id)?.claim == nil { try queue.remove(id) }
        }
      }
      // A start time makes it wait in the time-ordered `waiting` index, as a retry does: claims
      // read only the entries that are due, so delayed tasks cost nothing until then (version 7).
      let row = TaskRow(
        tag: tag, dataId: dataId, groupId: groupId, manual: manual,
        status: schedule.startAt == nil ? .ready : .waiting,
        eligibleAt: schedule.startAt, addedAt: timestamp, priority: priority, deadline: deadline,
        schedule: schedule)
      let id = TaskID(rawValue: sequence)
      // A new task's id is the largest yet: its row goes at the end of `tasks`.
      try QueueKey.withTask(id) { key in
        try row.withBytes { try tables.putLast("tasks", key: key, value: $0) }
      }
      if let groupId { try tables.put("groups", key: QueueKey.group(groupId, id), value: []) }
      if let dataId {
        try tables.put("unique", key: QueueKey.unique(tag: tag, dataId: dataId, id), value: [])
      }
      try queue.index(id, row)
    case .runStarted(let id, let attempt, let owner, let runner, _):
      // Only a task that may run starts: one blocked, dead or claimed meanwhile stays as it is.
      // (The claim command decides this before logging; the fold says the same.)
      try queue.update(id) { row in
        guard row.claim == nil, row.status == .ready || row.status == .waiting else { return }
        row.status = .running
        row.attempts = attempt
        row.eligibleAt = nil
        row.claim = TaskRow.Claim(owner: owner, runner: runner, attempt: attempt)
      }
    case .runSucceeded(let id, let details):
      guard let row = try queue.row(id) else { return }
      if let output = details.output { try queue.keepOutput(output, of: id, row) }
      try queue.remove(id, row)
    case .expired(let id):
      try queue.remove(id)
    case .cancelled(let id):
      // A run under way keeps the row, its claim and its place in its group until its outcome.
      guard let row = try queue.row(id) else { return }
      if row.claim == nil { return try queue.remove(id, row) }
      if row.isQueued { try queue.cancelDuringRun(id, row) }
    case .runFailed(let id, let message, _, let next):
      guard let old = try queue.outcomeTarget(id) else { return }
      try queue.update(id, old) { row in
        row.lastFailure = message
        let hadClaim = row.claim != nil
        row.claim = nil
        // An error recorded during the run keeps the task blocked until it is resolved; one
        // recorded and resolved during the run leaves it ready, and the run's failure still
        // applies (its backoff, or death).
        guard row.status == .running || (hadClaim && row.status == .ready) else { return }
        row.status = next == nil ? .dead : .waiting
        row.eligibleAt = next
      }
    case .runInterrupted(let id), .runDeferred(let id, _):
      guard let old = try queue.outcomeTarget(id) else { return }
      try queue.update(id, old) { row in
        // Not the server's answer (the app killed, a window's end, offline): the attempt is given
        // back; the run keeps its number, so (task, attempt) still names one run.
        if row.claim != nil { row.givenBack &+= 1 }
        row.claim = nil
        if row.status == .running { row.status = .ready }
      }
    case .errorRecorded(let id, let message, let endsRun):
      guard let old = try queue.row(id) else { return }
      // A cancelled task takes no error; one that ends its run is that run's outcome.
      guard old.isQueued else { return endsRun ? try queue.remove(id, old) : () }
      try queue.update(id, old) { row in
        row.status = .blocked
        row.eligibleAt = nil
        row.errorCount &+= 1
        // Recorded by the app while a run is under way, the claim stays: the run is still live.
        if endsRun { row.claim = nil }
      }
      var writer = PayloadWriter()
      writer.write(sequence)
      writer.write(message)
      writer.write(timestamp)
      try tables.put("errors", key: QueueKey.task(id), value: writer.bytes)
    case .errorResolved(let id):
      guard try queue.row(id)?.status == .blocked else { return }
      try queue.update(id) { row in
        // A task that has not run yet still waits for its start time (a past one is due at once).
        if row.attempts == 0, let startAt = row.startAt {
          row.status = .waiting
          row.eligibleAt = startAt
        } else {
          row.status = .ready
        }
      }
      try tables.delete("errors", key: QueueKey.task(id))
    case .revived(let id):
      try queue.update(id) { row in
        if row.status == .dead { row.status = .ready }
      }
    case .payloadUpdated(let id, _):
      // The task keeps its id, status, claim and place; its next claim reads this event's payload.
      guard try queue.row(id)?.isQueued == true else { return }
      try tables.put("payloads", key: QueueKey.task(id), value: sequence.bigEndianBytes)
    case .cleared:
      // Tasks whose run is under way stay, cancelled, until their runs' outcomes (as a cancel
      // leaves them): read from `running` before everything goes.
      var running: [(TaskID, TaskRow)] = []
      for (id, _) in try QueueCommand.claims(queue) {
        if let row = try queue.row(id) { running.append((id, row)) }
      }
      for table in [
        "tasks", "ready", "waiting", "running", "groups", "unique", "errors", "payloads", "deadlines",
      ] {
        try tables.removeAll(table)
      }
      for (id, row) in running { try queue.keepCancelled(id, row) }
    case .paused:
      try tables.put("state", key: QueueKey.paused, value: [1])
    case .resumed:
      try tables.put("state", key: QueueKey.paused, value: [0])
    }
  }
}

/// Row-level reads of the queue's tables, shared by the projection and the queries.
struct QueueTables<Tables: ProjectionTableReading> {
  let tables: Tables
  /// Index entries and rows read so far (the runner's lookups are proven not to scan by this).
  private(set) var touched = 0

  init(_ tables: Tables) { self.tables = tables }

  func row(_ id: TaskID) throws -> TaskRow? {
    try tables.value("tasks", key: QueueKey.task(id)) { try TaskRow(bytes: $0) }
  }

  /// The sequence of the event that holds a queued task's payload: its latest `task.payloadUpdated`,
  /// else its `task.added` (whose sequence is the task's id).
  func payloadSource(_ id: TaskID) throws -> UInt64 {
    // Payload updates are rare: an empty table is not searched.
    guard try !tables.isCertainlyEmpty("payloads"),
      let value = try tables.get("payloads", key: QueueKey.task(id))
    else { return id.rawValue }
    guard let sequence = UInt64(bigEndianBytes: value) else {
      throw PayloadError("the payload entry of task \(id) has \(value.count) bytes")
    }
    return sequence
  }

  /// The output a succeeded task left, with its tag; nil when it left none (or it was removed).
  func output(of id: TaskID) throws -> (tag: String, output: [UInt8])? {
    guard let value = try tables.get("outputs", key: QueueKey.task(id)) else { return nil }
    let entry = try Self.outputEntry(value)
    return (entry.tag, entry.output)
  }

  /// An `outputs` row's fields.
  static func outputEntry(
    _ value: [UInt8]
  ) throws -> (tag: String, dataId: String?, groupId: String?, output: [UInt8]) {
    var reader = PayloadReader(value)
    let tag = try reader.readString("tag")
    let dataId = try reader.readOptionalString("dataId")
    let groupId = try reader.readOptionalString("groupId")
    let output = try reader.readBytes("output")
    try reader.finish("an output")
    return (tag, dataId, groupId, output)
  }

  /// The ids of succeeded tasks with this data id that left an output, newest first.
  func outputs(dataId: String) throws -> [TaskID] {
    let prefix = QueueKey.groupPrefix(dataId)
    var ids: [TaskID] = []
    try tables.scan("outputsByData", from: prefix) { key, _ in
      guard key.count == prefix.count + 8 && key.starts(with: prefix), let id = QueueKey.trailingID(key)
      else {
        return false
      }
      ids.append(id)
      return true
    }
    return ids.reversed()
  }

  /// The first task of a group, or nil when the group is empty.
  func head(of groupId: String) throws -> TaskID? {
    let prefix = QueueKey.groupPrefix(groupId)
    var found: TaskID?
    try tables.scan("groups", from: prefix) { key, _ in
      if key.count == prefix.count + 8 && key.starts(with: prefix) { found = QueueKey.trailingID(key) }
      return false
    }
    return found
  }

  /// The first task of a group that is queued as callers see it (``TaskRow/isQueued``): the
  /// group's head, or the task after a head cancelled during its run. Reads the group's entries
  /// up to it (a cancelled row waiting for its run is rare, and only ever at the front).
  func firstQueued(of groupId: String) throws -> TaskID? {
    let prefix = QueueKey.groupPrefix(groupId)
    var from = prefix
    while true {
      var found: TaskID?
      try tables.scan("groups", from: from) { key, _ in
        if key.count == prefix.count + 8 && key.starts(with: prefix) { found = QueueKey.trailingID(key) }
        return false
      }
      // One seek per entry passed over; no id follows the largest.
      guard let id = found else { return nil }
      if try row(id)?.isQueued == true { return id }
      guard id < TaskID.max else { return nil }
      from = QueueKey.group(groupId, id.next)
    }
  }

  /// Every queued task with this tag and data id, in id order.
  func tasks(tag: String, dataId: String) throws -> [TaskID] {
    let prefix = QueueKey.uniquePrefix(tag: tag, dataId: dataId)
    var ids: [TaskID] = []
    try tables.scan("unique", from: prefix) { key, _ in
      guard key.count == prefix.count + 8 && key.starts(with: prefix), let id = QueueKey.trailingID(key)
      else {
        return false
      }
      ids.append(id)
      return true
    }
    return ids
  }

  /// The twin an add with keep keeps (returns its id, adding nothing): the first of `twins` that
  /// is not dead — queued, waiting, blocked (it runs once resolved) or running. A dead twin will
  /// never send the change again by itself, so it keeps nothing out: it stays dead and visible,
  /// and the new task is added after it. Shared by the add command and the fold, which must agree.
  func keptTwin(_ twins: [TaskID]) throws -> TaskID? {
    for id in twins {
      guard let row = try row(id), row.isQueued else { continue }
      if row.status != .dead { return id }
    }
    return nil
  }

  /// The priority levels that have entries in an index whose keys lead with the level, most
  /// urgent first: one seek per level present (at most 256), never a walk of the entries.
  mutating func levels(_ table: String) throws -> [UInt8] {
    var levels: [UInt8] = []
    var from: [UInt8]?
    while true {
      var found: UInt8?
      try tables.scan(table, from: from) { key, _ in
        found = key.first
        return false
      }
      touched += 1
      guard let level = found else { break }
      levels.append(level)
      if level == .max { break }
      from = [level + 1]
    }
    return levels
  }

  /// The levels present in `ready` or `waiting`, most urgent first.
  mutating func runnableLevels() throws -> [UInt8] {
    Array(Set(try levels("waiting")).union(try levels("ready"))).sorted()
  }

  /// The most urgent level at or after `from` present in `ready` or `waiting`: one seek in each.
  /// A search that usually ends in its first level asks this once, where ``runnableLevels()``
  /// seeks past every level.
  mutating func nextRunnableLevel(from: UInt8) throws -> UInt8? {
    try nextRunnableLevelAndFirstReady(from: from)?.level
  }

  /// ``nextRunnableLevel(from:)``, and the first `ready` id of that level when its seek in `ready`
  /// landed there (the smallest ready id of the level): a claim search starts from it without
  /// seeking again.
  mutating func nextRunnableLevelAndFirstReady(from: UInt8) throws -> (level: UInt8, firstReady: TaskID?)? {
    var found: UInt8?
    var firstReady: (level: UInt8, id: TaskID)?
    for table in ["waiting", "ready"] {
      // Retries are rare: an empty `waiting` is not searched.
      if table == "waiting", try tables.isCertainlyEmpty(table) { continue }
      try tables.scan(table, from: [from]) { key, _ in
        if let level = key.first { found = min(found ?? level, level) }
        if table == "ready" { firstReady = QueueKey.readyEntry(key) }
        return false
      }
      touched += 1
    }
    guard let found else { return nil }
    return (found, firstReady?.level == found ? firstReady?.id : nil)
  }

  /// The next task after `after` that may run at `now`, in a pass's order: the most urgent
  /// priority first, and within it due retries (the oldest retry time first, read from the start
  /// of that level's time-ordered `waiting` entries, so due retries cost what they return), then
  /// the first `ready` key of the level past `after`. Blocked, dead, manual, claimed and non-head
  /// tasks are in neither index, so they are never read.
  mutating func nextRunnable(after: TaskID, now: Int64) throws -> TaskID? {
    var found: TaskID?
    var visited = 0
    var from: UInt8 = 0
    while let level = try nextRunnableLevel(from: from) {
      try tables.scan("waiting", from: [level]) { key, _ in
        visited += 1
        guard let (keyLevel, at, id) = QueueKey.waitingTime(key), keyLevel == level, at <= now else {
          return false
        }
        if id > after {
          found = id
          return false
        }
        return true
      }
      // No id follows the largest (`after &+ 1` would wrap around to the first task).
      if found == nil && after < TaskID.max {
        try tables.scan("ready", from: QueueKey.ready(level, after.next)) { key, _ in
          visited += 1
          if let (keyLevel, id) = QueueKey.readyEntry(key), keyLevel == level { found = id }
          return false
        }
      }
      if found != nil || level == .max { break }
      from = level + 1
    }
    touched += visited
    return found
  }

  /// The earliest retry time at or after `time` in `waiting` (one seek per priority level).
  mutating func earliestRetry(atOrAfter time: Int64) throws -> Int64? {
    var earliest: Int64?
    for level in try levels("waiting") {
      try tables.scan("waiting", from: [level] + QueueKey.time(time)) { key, _ in
        if let (keyLevel, at, _) = QueueKey.waitingTime(key), keyLevel == level {
          earliest = min(earliest ?? at, at)
        }
        return false
      }
    }
    return earliest
  }

  /// The earliest deadline at or after `time` of a queued task without a claim.
  func earliestDeadline(atOrAfter time: Int64) throws -> Int64? {
    var earliest: Int64?
    try tables.scan("deadlines", from: QueueKey.time(time)) { key, _ in
      earliest = QueueKey.deadlineEntry(key)?.at
      return false
    }
    return earliest
  }

  /// A queued task as the API shows it (`Specs/task-events.md` §3.3): its row's status, except
  /// that a ready task behind its group's head — whatever the head's status, since only a head
  /// may start — is ``TaskStatus/waitingForGroup(behind:)``. Derived at read time: nothing of it
  /// is stored. `heads` keeps each group's head for the rest of a scan.
  func task(_ id: TaskID, _ row: TaskRow, heads: inout [String: TaskID?]) throws -> PendingTask {
    let task = row.task(id: id)
    guard row.status == .ready, row.claim == nil, let groupId = row.groupId else { return task }
    let head: TaskID?
    if let known = heads[groupId] {
      head = known
    } else {
      head = try self.head(of: groupId)
      heads[groupId] = .some(head)
    }
    guard let head, head != id else { return task }
    return task.with(status: .waitingForGroup(behind: head))
  }

  /// Every queued task `including` accepts, in id order, as the API shows them (one scan of
  /// `tasks`; a row that does not decode is damage and throws).
  func allTasks(including: (TaskRow) -> Bool = { _ in true }) throws -> [PendingTask] {
    var result: [PendingTask] = []
    var failure: (any Error)?
    var heads: [String: TaskID?] = [:]
    try tables.scan("tasks", from: nil) { key, value in
      do {
        guard let id = TaskID(bigEndianBytes: key) else {
          throw PayloadError("a task key has \(key.count) bytes")
        }
        let row = try TaskRow(value)
        if row.isQueued && including(row) { result.append(try task(id, row, heads: &heads)) }
        return true
      } catch {
        failure = error
        return false
      }
    }
    if let failure { throw failure }
    return result
  }

  /// ``task(_:_:heads:)`` for one task.
  func task(_ id: TaskID) throws -> PendingTask? {
    guard let row = try row(id), row.isQueued else { return nil }
    var heads: [String: TaskID?] = [:]
    return try task(id, row, heads: &heads)
  }

  func isEligible(_ id: TaskID, _ row: TaskRow) throws -> Bool {
    if row.manual || row.claim != nil { return false }
    guard let groupId = row.groupId else { return true }
    return try head(of: groupId) == id
  }
}

/// Row-level changes, only inside the projection's `apply`.
extension QueueTables where Tables == ProjectionTables {
  /// Changes a task's row and keeps the indexes in step; nothing when the task is not queued.
  func update(_ id: TaskID, _ change: (inout TaskRow) -> Void) throws {
    guard let old = try row(id) else { return }
    try update(id, old, change)
  }

  /// ``update(_:_:)`` of a row already read (`old`).
  func update(_ id: TaskID, _ old: TaskRow, _ change: (inout TaskRow) -> Void) throws {
    var new = old
    change(&new)
    if new == old { return }
    try unindex(id, old)
    try QueueKey.withTask(id) { key in try new.withBytes { try tables.put("tasks", key: key, value: $0) } }
    try index(id, new)
  }

  /// Takes a task out of every table; the next task of its group becomes the head.
  func remove(_ id: TaskID) throws {
    guard let old = try row(id) else { return }
    try remove(id, old)
  }

  /// ``remove(_:)`` of a row already read (`old`).
  func remove(_ id: TaskID, _ old: TaskRow) throws {
    try unindex(id, old)
    try tables.delete("tasks", key: QueueKey.task(id))
    try dropEntries(id, old)
    if let groupId = old.groupId {
      try tables.delete("groups", key: QueueKey.group(groupId, id))
      if let head = try head(of: groupId), let headRow = try row(head) { try index(head, headRow) }
    }
  }

  /// Keeps a succeeded task's output, by id and by data id (`Specs/task-events.md` §3.3).
  func keepOutput(_ output: [UInt8], of id: TaskID, _ row: TaskRow) throws {
    var writer = PayloadWriter()
    writer.write(row.tag)
    writer.write(row.dataId)
    writer.write(row.groupId)
    writer.write(bytes: output)
    try tables.put("outputs", key: QueueKey.task(id), value: writer.bytes)
    if let dataId = row.dataId { try tables.put("outputsByData", key: QueueKey.group(dataId, id), value: []) }
  }

  /// Cancels a task whose run is under way (`Specs/task-events.md` §3.2): it leaves the queue for
  /// every caller — its unique key, error and payload entries go — while its row (status
  /// cancelled), claim and group entry stay until the run's outcome removes them.
  func cancelDuringRun(_ id: TaskID, _ old: TaskRow) throws {
    try unindex(id, old)
    try dropEntries(id, old)
    try keepCancelled(id, old)
  }

  /// The `errors`, `payloads` and `unique` entries of a task leaving the queue (by ``remove(_:_:)``,
  /// or cancelled during its run).
  private func dropEntries(_ id: TaskID, _ old: TaskRow) throws {
    // An `errors` row is written only with `errorCount` raised (it falls back to 0 only by wrapping
    // after 2^32 errors): a task that never had one has no row to delete, and the usual run skips
    // that B-tree search.
    if old.errorCount != 0 { try tables.delete("errors", key: QueueKey.task(id)) }
    if try !tables.isCertainlyEmpty("payloads") { try tables.delete("payloads", key: QueueKey.task(id)) }
    if let dataId = old.dataId {
      try tables.delete("unique", key: QueueKey.unique(tag: old.tag, dataId: dataId, id))
    }
  }

  /// The row a run's outcome (a failure, an interruption) applies to, read once — nil when the
  /// task is not queued, or was cancelled during that run: then the outcome ends it, and it leaves
  /// the queue here.
  func outcomeTarget(_ id: TaskID) throws -> TaskRow? {
    guard let old = try row(id) else { return nil }
    guard old.isQueued else {
      try remove(id, old)
      return nil
    }
    return old
  }

  /// Writes a task's row as cancelled with its claim and group entry (and nothing else): after a
  /// clear emptied every table, or from ``cancelDuringRun(_:_:)``.
  func keepCancelled(_ id: TaskID, _ old: TaskRow) throws {
    var row = old
    row.status = .cancelled
    row.eligibleAt = nil
    try QueueKey.withTask(id) { key in try row.withBytes { try tables.put("tasks", key: key, value: $0) } }
    if let groupId = row.groupId { try tables.put("groups", key: QueueKey.group(groupId, id), value: []) }
    try index(id, row)
  }

  func index(_ id: TaskID, _ row: TaskRow) throws {
    if let claim = row.claim { try tables.put("running", key: QueueKey.task(id), value: claim.bytes) }
    // Every queued task with a deadline and no claim, whatever its status, group or manual flag:
    // what a pass's sweep expires (a run under way is never interrupted by its deadline).
    if let deadline = row.deadline, row.claim == nil {
      try tables.put("deadlines", key: QueueKey.deadline(deadline, id), value: [])
    }
    guard try isEligible(id, row) else { return }
    switch row.status {
    // A new task's key is usually the last (the largest id, at the common level): LMDB then
    // appends without searching and fills its pages; any other key is stored the ordinary way.
    case .ready:
      try QueueKey.withReady(row.level, id) { key in
        try QueueKey.withEmpty { try tables.putLast("ready", key: key, value: $0) }
      }
    case .waiting:
      try tables.put("waiting", key: QueueKey.waiting(row.level, row.eligibleAt ?? 0, id), value: [])
    case .running, .blocked, .dead, .cancelled: break
    }
  }

  func unindex(_ id: TaskID, _ row: TaskRow) throws {
    // `index` puts a `ready` row only for a row whose status is ready, and every later change of
    // the row goes through `unindex` with that row: any other status has no `ready` row to delete.
    if row.status == .ready {
      try QueueKey.withReady(row.level, id) { _ = try tables.delete("ready", key: $0) }
    }
    if row.claim != nil { try tables.delete("running", key: QueueKey.task(id)) }
    if let at = row.eligibleAt { try tables.delete("waiting", key: QueueKey.waiting(row.level, at, id)) }
    if let deadline = row.deadline { try tables.delete("deadlines", key: QueueKey.deadline(deadline, id)) }
  }
}
