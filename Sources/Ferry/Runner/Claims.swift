import FerryLog
import Foundation
import Synchronization

/// What a pass's claim command found (`Specs/task-events.md` §4).
struct ClaimStep: Sendable {
  enum Found: Sendable {
    /// A run claimed for this runner, durable once the command returns.
    case claimed(ClaimedRun)
    /// A task whose `isReadyToRun` must be asked before it is claimed.
    case check(PendingTask)
    /// The search looked at its limit of entries without finding one: ask again.
    case more
    /// Nothing the pass may run, as of the log's `head`.
    case none(head: UInt64)
  }

  var found: Found
  /// Tasks found in the indexes that the pass skips (no handler), with their priority.
  var skips: [PassSkip] = []
  /// Where the search stopped in each priority level of the indexes.
  var cursors: PassCursors
}

/// How far a pass has read each priority level of the `ready` and `waiting` indexes
/// (`Specs/task-events.md` §4.3). A task added later has a larger id than any its level's cursor
/// passed, so the pass still meets it — before the lower levels when it is more urgent.
struct PassCursors: Sendable, Equatable {
  /// The last ready id passed, by level.
  var ready: [UInt8: TaskID] = [:]
  /// The last waiting key passed (level, time, id), by level.
  var retry: [UInt8: [UInt8]] = [:]

  /// Keeps the furthest of both, level by level.
  mutating func merge(_ other: PassCursors) {
    ready.merge(other.ready) { max($0, $1) }
    retry.merge(other.retry) { $0.lexicographicallyPrecedes($1) ? $1 : $0 }
  }
}

/// A task a pass's command found it may not run, and why (reported, not logged).
struct PassSkip: Sendable {
  let id: TaskID
  let reason: SkipReason
  let priority: TaskPriority
  /// Its group, which the skip fails for the rest of the pass.
  let groupId: String?

  init(id: TaskID, reason: SkipReason, row: TaskRow) {
    self.id = id
    self.reason = reason
    self.priority = TaskPriority(rawValue: row.priority)
    self.groupId = row.groupId
  }
}

/// A task that left the queue because its deadline passed, as a command logged it.
struct ExpiredTask: Sendable {
  let id: TaskID
  let row: TaskRow
}

/// What a claim of one task decided.
enum SingleClaim: Sendable {
  case claimed(ClaimedRun)
  case skip(SkipReason)
  case check(PendingTask)
  /// It is not queued.
  case gone
  /// Its deadline had passed: this command logged `task.expired` and it left the queue.
  case expired
  /// Another runner's run of it (this claim) is under way, as of the log's `head`.
  case runningElsewhere(head: UInt64, claim: TaskRow.Claim)
}

/// The claim decisions: read the queue's indexes inside the writer's transaction and log a
/// `task.runStarted` naming the claimant. Pure, like every command.
enum ClaimSearch {
  /// Entries a claim command reads before it hands the writer back (`more`).
  static let scanLimit = 512

  /// Whether a queued task may start now (index membership already says it heads its group).
  static func mayStart(_ row: TaskRow, now: Int64) -> Bool {
    guard row.claim == nil, !row.manual else { return false }
    switch row.status {
    case .ready: return true
    case .waiting: return (row.eligibleAt ?? .min) <= now
    case .running, .blocked, .dead, .cancelled: return false
    }
  }

  /// Whether a queued task may be claimed by this pass now: returns what to do with it (claim it,
  /// or ask its `isReadyToRun` first), nil to pass it over; a missing handler is a skip.
  static func consider(
    _ id: TaskID, _ context: CommandContext, _ queue: QueueTables<ProjectionReader>, pass: PassState,
    handlers: TaskRunner.HandlerInfo, owner: String, runner: UInt32, now: Int64,
    skips: inout [PassSkip], expired: inout [ExpiredTask]
  ) throws -> ClaimStep.Found? {
    guard !pass.isTouched(id), !handlers.unhandled.contains(id), !handlers.deferred.contains(id, now: now),
      let row = try queue.row(id)
    else { return nil }
    if try expireIfDue(id, row, context, now: now) {
      expired.append(ExpiredTask(id: id, row: row))
      return nil
    }
    guard mayStart(row, now: now), pass.matches(row) else { return nil }
    if let group = row.groupId, pass.isFailed(group) { return nil }
    guard let needsCheck = handlers.tags[row.tag] else {
      skips.append(PassSkip(id: id, reason: .noHandler, row: row))
      return nil
    }
    if needsCheck { return .check(row.task(id: id)) }
    return .claimed(
      try claim(id, row, context, owner: owner, runner: runner, batch: handlers.batchHead(id, row)))
  }

  /// The new head of a group whose task this pass just finished successfully, when the pass's
  /// cursor has passed it (a later one is met by the scan in its turn).
  static func successor(
    of group: String, _ context: CommandContext, pass: PassState, cursors: PassCursors,
    handlers: TaskRunner.HandlerInfo, owner: String, runner: UInt32, now: Int64,
    skips: inout [PassSkip], expired: inout [ExpiredTask]
  ) throws -> ClaimStep.Found? {
    let queue = try QueueCommand.tables(context)
    guard let head = try queue.head(of: group), let row = try queue.row(head),
      head <= cursors.ready[row.level] ?? .zero
    else { return nil }
    return try consider(
      head, context, queue, pass: pass, handlers: handlers, owner: owner, runner: runner, now: now,
      skips: &skips,
      expired: &expired)
  }

  /// Why a queued head that may not start now does not run, for a report; nil when no reason
  /// fits (a manual head, which runs only when asked for by id; a row cancelled during its run).
  static func whyNot(_ row: TaskRow, now: Int64) -> SkipReason? {
    guard row.isQueued, !row.manual else { return nil }
    if row.claim != nil { return .running }
    switch row.status {
    case .blocked: return .blockedByError
    case .dead: return .dead
    case .waiting where (row.eligibleAt ?? .min) > now: return notDue(row)
    case .running: return .running
    case .ready, .waiting, .cancelled: return nil
    }
  }

  /// Why a waiting task may not start yet: its start time, or its retry time.
  static func notDue(_ row: TaskRow) -> SkipReason {
    let at = Date(unixMilliseconds: row.eligibleAt ?? 0)
    return row.isScheduled ? .scheduled(at: at) : .waitingForRetry(until: at)
  }

  /// Logs `task.expired` when the task has no claim and its deadline is at or before `now`.
  static func expireIfDue(_ id: TaskID, _ row: TaskRow, _ context: CommandContext, now: Int64) throws -> Bool
  {
    guard row.claim == nil, let deadline = row.deadline, deadline <= now else { return false }
    try context.append([TaskEvent.expired(id).newEvent])
    return true
  }

  /// Expires, up to `limit`, the queued tasks without a claim whose deadline is at or before `now`
  /// — blocked, waiting, dead, manual and non-head ones too — reading `deadlines` from its start,
  /// so the sweep costs what it expires (and one key more).
  static func sweep(_ context: CommandContext, now: Int64, limit: Int) throws -> [ExpiredTask] {
    let queue = try QueueCommand.tables(context)
    var due: [TaskID] = []
    // Most queues have no deadlines: an empty index is not searched.
    if try queue.tables.isCertainlyEmpty("deadlines") { return [] }
    try queue.tables.scan("deadlines", from: nil) { key, _ in
      guard let (at, id) = QueueKey.deadlineEntry(key), at <= now else { return false }
      due.append(id)
      return due.count < limit
    }
    var expired: [ExpiredTask] = []
    for id in due {
      guard let row = try queue.row(id), try expireIfDue(id, row, context, now: now) else { continue }
      expired.append(ExpiredTask(id: id, row: row))
    }
    return expired
  }

  /// The next task of the pass, most urgent priority level first; within a level, due retries in
  /// time order, then ready tasks in id order, each after the level's cursor. Claims it unless its
  /// tag asks `isReadyToRun` first. Tasks met past their deadline are expired on the way.
  static func next(
    _ context: CommandContext, pass: PassState, cursors: PassCursors, handlers: TaskRunner.HandlerInfo,
    owner: String, runner: UInt32, now: Int64, expired: inout [ExpiredTask]
  ) throws -> ClaimStep {
    var queue = try QueueCommand.tables(context)
    var step = ClaimStep(found: .none(head: context.head), cursors: cursors)

    func consider(_ id: TaskID) throws -> ClaimStep.Found? {
      try Self.consider(
        id, context, queue, pass: pass, handlers: handlers, owner: owner, runner: runner, now: now,
        skips: &step.skips, expired: &expired)
    }

    if case .group(let group) = pass.filter {
      guard let head = try queue.head(of: group) else { return step }
      if let found = try consider(head) {
        step.found = found
      } else if !pass.isTouched(head), let row = try queue.row(head), let reason = whyNot(row, now: now) {
        // Asked for this group, the pass says why its head does not run (and so the rest of it).
        step.skips.append(PassSkip(id: head, reason: reason, row: row))
      }
      return step
    }
    var examined = 0
    /// Walks one level of one index in batches from its cursor, considering each task, until one
    /// is found, the level ends, or the scan limit is reached. The first batch is small: the first
    /// entry is usually the one claimed, and reading 64 keys for it was a third of a serial run's
    /// instructions.
    func walk(
      first: (key: [UInt8], id: TaskID)? = nil,
      _ batch: (_ size: Int) throws -> [(key: [UInt8], id: TaskID)],
      advance: (_ key: [UInt8], _ id: TaskID) -> Void
    ) throws -> ClaimStep.Found? {
      var entries: [(key: [UInt8], id: TaskID)]
      var size = 2
      var full: Bool
      var known = first
      repeat {
        // An entry the level's seek already read is the first batch: it costs no seek again.
        if let entry = known {
          entries = [entry]
          full = true
          known = nil
        } else {
          entries = try batch(size)
          full = entries.count == size
          size = 64
        }
        for entry in entries {
          advance(entry.key, entry.id)
          // Known-unhandled tasks cost only their key: they do not count toward the limit.
          if !handlers.unhandled.contains(entry.id) { examined += 1 }
          if let found = try consider(entry.id) { return found }
          if examined >= scanLimit { return .more }
        }
      } while full
      return nil
    }
    // The levels one at a time, most urgent first: the search usually ends in the first.
    var from: UInt8 = 0
    while let (level, firstReady) = try queue.nextRunnableLevelAndFirstReady(from: from) {
      // Whether the retries' walk below finds `waiting` empty: it then changes nothing, and the
      // level's smallest ready id, read by the seek above, is still where the ready walk begins.
      let noRetries = try queue.tables.isCertainlyEmpty("waiting")
      // Due retries of the level, oldest retry time first: read from the start of its
      // time-ordered entries, so they cost what the pass takes from them.
      let retry = try walk(
        { size in
          var entries: [(key: [UInt8], id: TaskID)] = []
          if try queue.tables.isCertainlyEmpty("waiting") { return entries }
          let cursor = step.cursors.retry[level]
          try queue.tables.scan("waiting", from: cursor ?? [level]) { key, _ in
            if let cursor, key.elementsEqual(cursor) { return true }
            guard let (keyLevel, at, id) = QueueKey.waitingTime(key), keyLevel == level, at <= now else {
              return false
            }
            entries.append((Array(key), id))
            return entries.count < size
          }
          return entries
        }, advance: { key, _ in step.cursors.retry[level] = key })
      if let retry {
        step.found = retry
        return step
      }
      var first: (key: [UInt8], id: TaskID)?
      if noRetries, let firstReady, firstReady > step.cursors.ready[level] ?? .zero {
        first = ([], firstReady)
      }
      let ready = try walk(
        first: first,
        { size in
          var entries: [(key: [UInt8], id: TaskID)] = []
          let cursor = step.cursors.ready[level] ?? .zero
          if cursor == TaskID.max { return entries }  // no id follows the largest
          try queue.tables.scan("ready", from: QueueKey.ready(level, cursor.next)) { key, _ in
            guard let (keyLevel, id) = QueueKey.readyEntry(key), keyLevel == level else { return false }
            if id > cursor { entries.append(([], id)) }
            return entries.count < size
          }
          return entries
        }, advance: { _, id in step.cursors.ready[level] = id })
      if let ready {
        step.found = ready
        return step
      }
      if level == .max { break }
      from = level + 1
    }
    return step
  }

  /// Decides about one task: claims it when it may run now (`checked`: its `isReadyToRun`, if
  /// any, already said yes), or says why not.
  static func claim(
    _ id: TaskID, _ context: CommandContext, owner: String, runner: UInt32, now: Int64,
    handlers: TaskRunner.HandlerInfo, checked: Bool
  ) throws -> SingleClaim {
    let queue = try QueueCommand.tables(context)
    // Cancelled while a run of it is under way: it has left the queue.
    guard let row = try queue.row(id), row.isQueued else { return .gone }
    if let claim = row.claim { return .runningElsewhere(head: context.head, claim: claim) }
    if try expireIfDue(id, row, context, now: now) { return .expired }
    switch row.status {
    case .blocked: return .skip(.blockedByError)
    case .dead: return .skip(.dead)
    case .running, .cancelled: return .skip(.running)
    case .waiting where (row.eligibleAt ?? .min) > now: return .skip(notDue(row))
    case .ready, .waiting: break
    }
    if let group = row.groupId, try queue.head(of: group) != id { return .skip(.notHeadOfGroup) }
    guard let needsCheck = handlers.tags[row.tag] else { return .skip(.noHandler) }
    if needsCheck && !checked { return .check(row.task(id: id)) }
    return .claimed(
      try claim(id, row, context, owner: owner, runner: runner, batch: handlers.batchHead(id, row)))
  }

  /// The batch a batched tag's claim `first` leads (`Specs/task-events.md` §4.8), claimed in the
  /// same command: `first`, then the tasks right behind it in its group, one after another while
  /// each has the same tag and may start; then, while there is room, other heads of that tag at
  /// the same priority level past the pass's cursor, each followed by the tasks behind it in its
  /// group the same way, until the batch is full or `scanLimit` keys of the level did not join
  /// it. Never more than `size` runs; a task whose deadline passed ends the search
  /// of its group (the next sweep expires it). Group tasks stay consecutive and in group order.
  static func fillBatch(
    _ first: ClaimedRun, size: Int, _ context: CommandContext, pass: PassState, cursors: PassCursors,
    handlers: TaskRunner.HandlerInfo, owner: String, runner: UInt32, now: Int64
  ) throws -> [ClaimedRun] {
    var members = [first]
    guard size > 1 else { return members }
    let queue = try QueueCommand.tables(context)
    let tag = first.task.tag

    func fits(_ id: TaskID, _ row: TaskRow) -> Bool {
      guard row.tag == tag, row.isQueued, mayStart(row, now: now), pass.matches(row), !pass.isTouched(id),
        !handlers.deferred.contains(id, now: now)
      else { return false }
      return (row.deadline ?? .max) > now
    }

    /// The tasks behind `id` in `group`, while each fits.
    func addFollowers(of id: TaskID, group: String) throws {
      let prefix = QueueKey.groupPrefix(group)
      var after = id
      while members.count < size && after < TaskID.max {
        var next: TaskID?
        try queue.tables.scan("groups", from: QueueKey.group(group, after.next)) { key, _ in
          if key.count == prefix.count + 8 && key.starts(with: prefix) { next = QueueKey.trailingID(key) }
          return false
        }
        guard let id = next, let row = try queue.row(id), fits(id, row) else { return }
        members.append(try claim(id, row, context, owner: owner, runner: runner, batch: first.task.id))
        after = id
      }
    }

    if let group = first.task.groupId { try addFollowers(of: first.task.id, group: group) }
    guard members.count < size, let level = try queue.row(first.task.id)?.level else { return members }
    // Other heads of the level, in chunks read before any of them is claimed (a claim changes
    // `ready`, and only at keys the scan has passed); the pass's cursor is not moved, so tasks of
    // other tags stay for its walk. The search ends when the batch is full or `scanLimit` keys
    // did not join it: the keys that join cost what they claim, so a batch of 1000 fills.
    var after = cursors.ready[level] ?? .zero
    var passedOver = 0
    while members.count < size && passedOver < scanLimit && after < TaskID.max {
      var ids: [TaskID] = []
      let chunk = min(64, size - members.count + scanLimit - passedOver)
      try queue.tables.scan("ready", from: QueueKey.ready(level, after.next)) { key, _ in
        guard let (keyLevel, id) = QueueKey.readyEntry(key), keyLevel == level else { return false }
        ids.append(id)
        return ids.count < chunk
      }
      for id in ids {
        after = id
        guard members.count < size else { break }
        guard !handlers.unhandled.contains(id), let row = try queue.row(id), fits(id, row),
          row.groupId.map({ !pass.isFailed($0) }) ?? true
        else {
          passedOver += 1
          if passedOver >= scanLimit { break }
          continue
        }
        members.append(try claim(id, row, context, owner: owner, runner: runner, batch: first.task.id))
        if let group = row.groupId { try addFollowers(of: id, group: group) }
      }
      if ids.count < chunk { break }  // the level ended
    }
    return members
  }

  /// Logs the claim and returns the run with its payload — the latest payload update's, else the
  /// add's — read here, in the same transaction.
  /// `batch`: the first task of the batch it is claimed in (a batched tag's run; its own id for
  /// the first), which `ferry log` shows.
  static func claim(
    _ id: TaskID, _ row: TaskRow, _ context: CommandContext, owner: String, runner: UInt32,
    batch: TaskID? = nil
  ) throws -> ClaimedRun {
    let source = try QueueCommand.tables(context).payloadSource(id)
    let payload = try TaskQueue.payload(of: id, at: source) { try context.event(at: $0) }
    let attempt = row.attempts &+ 1
    let claim = TaskRow.Claim(owner: owner, runner: runner, attempt: attempt)
    try context.append([
      TaskEvent.runStarted(id, attempt: attempt, owner: owner, runner: runner, batch: batch).newEvent
    ])
    var claimed = row
    claimed.status = .running
    claimed.attempts = attempt
    claimed.eligibleAt = nil
    claimed.claim = claim
    return ClaimedRun(
      task: claimed.task(id: id), claim: claim, payload: payload.bytes, payloadEventId: payload.key)
  }
}

/// What one pass has done so far, shared by its workers (and read by their claim commands).
final class PassState: Sendable {
  let filter: RunFilter
  let collectionTags: Set<String>?

  private struct State {
    var cursors = PassCursors()
    var touched: Set<TaskID> = []
    var failedGroups: Set<String> = []
    /// The failed groups whose rest the report names: not those failed only by an interrupted
    /// run (the pass was cut short; it decided nothing about the rest of them).
    var reportedGroups: Set<String> = []
    var entries: [PassReport.Entry] = []
    var batches: [PassReport.Batch] = []
  }
  private let state = Mutex(State())

  init(filter: RunFilter, collectionTags: Set<String>?) {
    self.filter = filter
    self.collectionTags = collectionTags
  }

  func matches(_ row: TaskRow) -> Bool {
    switch filter {
    case .all, .task: return true
    case .group(let group): return TaskQueue.sameBytes(row.groupId, group)
    case .collection: return collectionTags?.contains(row.tag) ?? false
    }
  }

  func cursors() -> PassCursors { state.withLock { $0.cursors } }

  func advance(cursors: PassCursors, claimed: [ClaimedRun]) {
    state.withLock { s in
      s.cursors.merge(cursors)
      for run in claimed { s.touched.insert(run.task.id) }
    }
  }

  /// Marks a task as seen by this pass; false when it already was.
  func touch(_ id: TaskID) -> Bool { state.withLock { $0.touched.insert(id).inserted } }
  func isTouched(_ id: TaskID) -> Bool { state.withLock { $0.touched.contains(id) } }
  func isFailed(_ group: String) -> Bool { state.withLock { $0.failedGroups.contains(group) } }
  /// The groups that failed in this pass so far, other than by an interruption: the rest of
  /// each is reported ``SkipReason/partOfFailedGroup``.
  var failedGroups: Set<String> { state.withLock { $0.reportedGroups } }
  /// Fails a group for the rest of the pass; `reported`: its rest is named in the report.
  func failGroup(_ group: String?, reported: Bool = true) {
    guard let group else { return }
    state.withLock { s in
      s.failedGroups.insert(group)
      if reported { s.reportedGroups.insert(group) }
    }
  }
  func add(_ id: TaskID, _ outcome: RunOutcome, priority: TaskPriority) {
    state.withLock {
      $0.entries.append(PassReport.Entry(taskId: id, outcome: outcome, priority: priority))
    }
  }

  /// A batched handler was called with these tasks.
  func addBatch(tag: String, _ ids: [TaskID]) {
    state.withLock { $0.batches.append(PassReport.Batch(tag: tag, taskIds: ids)) }
  }

  /// The entries, the most urgent priority first, then by task id.
  func report() -> PassReport {
    var report = PassReport()
    report.batches = state.withLock { $0.batches }
    report.entries = state.withLock { $0.entries }.sorted {
      $0.priority != $1.priority ? $0.priority > $1.priority : $0.taskId < $1.taskId
    }
    return report
  }
}

/// When a pass may end: it found nothing to run as of a head no older than the head any joined
/// caller needs (its add is then among what the pass looked at).
final class PassControl: Sendable {
  private struct State {
    var required: UInt64 = 0
    var finished = false
    var deadline: Int64?
    var cutShort = false
    var stoppedByPause = false
    var offline = false
  }
  private let state = Mutex(State())
  /// A pass of automatic running: it claims nothing once the queue is paused (decided in each
  /// claim command), and its runs under way finish.
  let stopsWhenPaused: Bool

  init(stopsWhenPaused: Bool = false) { self.stopsWhenPaused = stopsWhenPaused }

  /// Whether the pass stopped claiming because the queue was paused.
  var wasStoppedByPause: Bool { state.withLock { $0.stoppedByPause } }

  /// The pass found the queue paused and claims nothing more.
  func markStoppedByPause() { state.withLock { $0.stoppedByPause = true } }

  /// The time (store clock, Unix ms) from which the pass claims nothing more: the earliest
  /// deadline of the windows running it (``TaskRunner/run(until:_:)``); nil: none.
  var deadline: Int64? { state.withLock { $0.deadline } }

  /// Whether the pass ended because it was stopped or reached its deadline, rather than finding
  /// nothing more to run: a window whose own deadline has not come, or automatic running, runs
  /// another pass after it (another window may have cut it short at an earlier deadline).
  var wasCutShort: Bool { state.withLock { $0.cutShort } }

  /// Whether the pass stopped claiming because the runner's connectivity said offline.
  var wasOffline: Bool { state.withLock { $0.offline } }

  /// The pass found the device offline and claims nothing more.
  func markOffline() { state.withLock { $0.offline = true } }

  /// The pass stopped claiming: it was cancelled or its deadline came.
  func markCutShort() { state.withLock { $0.cutShort = true } }

  /// Claims nothing from `time` on (an earlier deadline set before stays).
  func limit(until time: Int64) {
    state.withLock { s in s.deadline = min(s.deadline ?? time, time) }
  }

  /// Joins the pass unless it has ended; the pass then looks at the queue as of `head` at least.
  func join(requiring head: UInt64) -> Bool {
    state.withLock { s in
      if s.finished { return false }
      s.required = max(s.required, head)
      return true
    }
  }

  /// The pass found nothing as of `head`; true when it may end (no joined caller needs more).
  func finish(at head: UInt64) -> Bool {
    state.withLock { s in
      if s.required > head { return false }
      s.finished = true
      return true
    }
  }
}
