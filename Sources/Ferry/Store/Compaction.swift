import FerryLog
import Foundation
import Synchronization

/// When a store compacts by itself (``FerryStore/Configuration/automaticCompaction``).
public struct AutomaticCompaction: Sendable {
  /// Compact once this many events were appended since the last compaction.
  public var everyEvents: Int
  /// How long the events of finished tasks are kept (see ``FerryStore/compact(retention:progress:)``).
  public var retention: Duration
  /// How often the store looks (real time).
  public var checkInterval: Duration

  /// A policy; by default every 100,000 events, keeping finished tasks for 7 days, looking every 10 s.
  public init(
    everyEvents: Int = 100_000, retention: Duration = .seconds(7 * 86_400),
    checkInterval: Duration = .seconds(10)
  ) {
    self.everyEvents = max(1, everyEvents)
    self.retention = retention
    self.checkInterval = checkInterval
  }
}

extension FerryStore {
  /// Compacts the log with Ferry's retention policy, in one transaction with a snapshot of both
  /// sides (`Specs/compaction.md`):
  /// - the events of finished tasks (succeeded, cancelled, cleared, replaced) older than
  ///   `retention` are removed; a pending task keeps its whole history;
  /// - of each cache key's fetch events only the newest success and the newest failure stay, and
  ///   its newest paging event; forget events older than `retention` go;
  /// - `queue.cleared` events older than `retention` go, and all but the newest pause or resume.
  ///
  /// - Parameters:
  ///   - retention: How long the events of finished tasks are kept; zero removes them all at once. Not
  ///     negative.
  ///   - progress: Called with the events read so far and the head, every 10,000 events (on the writer's
  ///     thread), for a progress bar.
  /// - Returns: What was removed and kept.
  /// - Throws: ``FerryError/invalidArgument(_:)`` for a negative `retention`; ``FerryError/closed`` or
  ///   ``FerryError/suspended`` when the store is closed or suspended;
  ///   ``FerryError/permissionDenied(path:detail:)`` on a store opened read-only;
  ///   ``FerryError/diskFull(path:)``, ``FerryError/quotaExceeded(path:)``,
  ///   ``FerryError/ioError(path:detail:)``, ``FerryError/damaged(path:message:)`` or
  ///   ``FerryError/storage(_:)`` when the commit fails.
  public func compact(
    retention: Duration, progress: @escaping @Sendable (_ read: UInt64, _ head: UInt64) -> Void = { _, _ in }
  ) async throws(FerryError) -> FerryStore.CompactionReport {
    try await engine {
      guard retention >= .zero else { throw FerryError.invalidArgument("retention must not be negative") }
      // Saturating: with a clock before 1970 a long retention must not wrap to a cutoff in the
      // far future (which would remove every finished task).
      let (difference, overflow) = queue.clock().subtractingReportingOverflow(retention.milliseconds)
      let cutoff = overflow ? Int64.min : difference
      // The queued tasks, read just before the compaction; a task added after this is newer than
      // the plan's head and stays.
      let (pending, head) = try log.read { view -> (Set<TaskID>, UInt64) in
        var ids = Set<TaskID>()
        var groups = Set<String>()
        var dataIds = Set<String>()
        let tables = try view.tables(of: TaskQueueProjection.projectionName)
        // Rows are decoded only when some success left an output: most stores have none.
        let hasOutputs = try !tables.isCertainlyEmpty("outputs")
        try tables.scan("tasks", from: nil) { key, value in
          if let id = TaskID(bigEndianBytes: key) { ids.insert(id) }
          if hasOutputs, let row = try? TaskRow(value) {
            if let group = row.groupId { groups.insert(group) }
            if let dataId = row.dataId { dataIds.insert(dataId) }
          }
          return true
        }
        // A succeeded task's output stays readable, with the events it comes from, while a queued
        // task shares its group or data id (it may read it): kept like a queued task.
        if hasOutputs {
          try tables.scan("outputs", from: nil) { key, value in
            guard let id = TaskID(bigEndianBytes: key),
              let entry = try? QueueTables<ProjectionReader>.outputEntry(Array(value))
            else { return true }
            if entry.groupId.map(groups.contains) == true || entry.dataId.map(dataIds.contains) == true {
              ids.insert(id)
            }
            return true
          }
        }
        return (ids, try view.head())
      }
      let plan = Mutex(RetentionPlan(pending: pending, head: head))
      let report = try await log.compact(
        removing: { event in plan.withLock { $0.isRemovable(event, cutoff: cutoff) } }, progress: progress)
      compacted(report)
      return FerryStore.CompactionReport(report)
    }
  }

  func startAutomaticCompaction(_ policy: AutomaticCompaction) {
    let task = Task { [weak self] in
      while !Task.isCancelled {
        try? await Task.sleep(for: policy.checkInterval.checkPeriod)
        guard let self, !Task.isCancelled else { return }
        let head = (try? self.log.head()) ?? 0
        let through = (try? self.log.compactionState())??.through ?? 0
        if head &- through >= UInt64(policy.everyEvents) {
          _ = try? await self.compact(retention: policy.retention)
        }
      }
    }
    automaticCompaction.withLock { $0 = task }
  }
}

/// Which events Ferry's retention policy may remove. Shown the log newest first, it keeps the first
/// (newest) success, failure and paging event of each cache key and the newest pause or resume.
struct RetentionPlan: Sendable {
  let pending: Set<TaskID>
  let head: UInt64
  var seenSuccess = Set<String>()
  var seenFailure = Set<String>()
  var seenPaging = Set<String>()
  var seenSkip = Set<String>()
  /// Cache keys whose newest invalidation (a success's stale keys) not followed by a successful
  /// fetch has been met: it stays, and older invalidations of the key are shadowed by it.
  var seenInvalidation = Set<String>()
  var seenPauseOrResume = false
  /// Whether each task met so far goes (decided at its newest event).
  var finishedTaskDecision: [TaskID: Bool] = [:]
  /// Cache keys whose newest `cache.forgotten` has been met: their older events are shadowed.
  var forgotten = Set<String>()
  /// The lowest id of a task whose events stay: a `queue.cleared` after it still ends it, so the
  /// clear stays too (or the task would come back in a rebuild).
  var lowestKeptTask: TaskID?
  /// Tasks added before a removed `queue.cleared` were ended by it: their events go too.
  var clearedBelow: UInt64 = 0
  /// The oldest timestamp of the events met so far (all newer than the one being judged).
  var oldestNewer: Int64 = .max

  init(pending: Set<TaskID>, head: UInt64) {
    self.pending = pending
    self.head = head
  }

  /// An event logged after the queued tasks were read stays, and so does the rest of its task's
  /// history: a run's outcome logged late (its task cancelled or cleared while it ran, so not
  /// queued when read) must not lose the run it ends — all of a history or none of it.
  private mutating func keepHistory(of event: LoggedEvent) {
    guard TaskEvent.typeSet.contains(event.type), let decoded = try? TaskEvent(event) else { return }
    let task: TaskID
    switch decoded {
    case .added: task = TaskID(rawValue: event.sequence)
    case .runStarted(let id, _, _, _, _), .runSucceeded(let id, _), .runFailed(let id, _, _, _),
      .runInterrupted(let id), .runDeferred(let id, _), .errorRecorded(let id, _, _), .errorResolved(let id),
      .cancelled(let id),
      .revived(let id), .payloadUpdated(let id, _), .expired(let id):
      task = id
    case .cleared, .paused, .resumed: return
    }
    guard task.rawValue <= head else { return }
    finishedTaskDecision[task] = false
    lowestKeptTask = min(lowestKeptTask ?? task, task)
  }

  /// Whether a success naming `keys` as stale holds the newest invalidation of any of them that
  /// no newer successful fetch or forget shadows (those are met first: the log is walked newest
  /// first); notes each such key as seen.
  private mutating func keepsInvalidation(_ keys: [String]) -> Bool {
    var keeps = false
    for key in keys
    where CacheAgesProjection.isValidKey(key) && !seenSuccess.contains(key) && !forgotten.contains(key) {
      if seenInvalidation.insert(key).inserted { keeps = true }
    }
    return keeps
  }

  mutating func isRemovable(_ event: LoggedEvent, cutoff: Int64) -> Bool {
    guard event.sequence <= head else {
      keepHistory(of: event)
      return false
    }
    // An event is judged as old as the oldest event logged at or after it: the sequence is the
    // true order, timestamps written by two processes need not rise with it. Judged by its own
    // timestamp, a replaced task could be newer than the add that replaced it (that add's task
    // finished, both before the cutoff by its clock): the add would go, the replaced task stay,
    // and a rebuild would bring it back. With times that never fall along the log, whatever goes
    // takes everything it shadows with it.
    let time = min(event.timestamp, oldestNewer)
    oldestNewer = time
    if TaskEvent.typeSet.contains(event.type), let decoded = try? TaskEvent(event) {
      let task: TaskID?
      switch decoded {
      case .added: task = TaskID(rawValue: event.sequence)
      case .runStarted(let id, _, _, _, _), .runSucceeded(let id, _), .runFailed(let id, _, _, _),
        .runInterrupted(let id), .runDeferred(let id, _),
        .errorRecorded(let id, _, _), .errorResolved(let id), .cancelled(let id), .revived(let id),
        .payloadUpdated(let id, _), .expired(let id):
        task = id
      case .cleared:
        // A tombstone: it stays while anything it shadows stays.
        if let lowest = lowestKeptTask, lowest.rawValue < event.sequence { return false }
        guard time < cutoff else { return false }
        clearedBelow = max(clearedBelow, event.sequence)
        return true
      case .paused, .resumed:
        defer { seenPauseOrResume = true }
        return seenPauseOrResume
      }
      guard let task, task.rawValue <= head else { return false }
      // A finished task's events go together, judged by its newest one (met first: the log is
      // walked newest first): timestamps written by different processes need not rise with the
      // sequence, and removing the middle of a history would leave an outcome without its run.
      if let decided = finishedTaskDecision[task] { return decided }
      var removable = !pending.contains(task) && (task.rawValue < clearedBelow || time < cutoff)
      // A success that made a cache key stale, with no successful fetch of that key since, is the
      // only record that the cache is stale: a rebuild that cannot start from a snapshot (a
      // projection's new version, a damaged snapshot) replays what is left, and without it the
      // stale cache would read fresh. Its task's history stays, for the newest such success of
      // each key only.
      if case .runSucceeded(_, let details) = decoded, keepsInvalidation(details.invalidates) {
        removable = false
      }
      finishedTaskDecision[task] = removable
      if !removable { lowestKeptTask = min(lowestKeptTask ?? task, task) }
      return removable
    }
    if CacheEvent.typeSet.contains(event.type), let decoded = try? CacheEvent(event) {
      switch decoded {
      case .fetched(let key, _, _) where forgotten.contains(key),
        .paging(let key, _, _) where forgotten.contains(key):
        return true  // older than a forget of its key: shadowed
      case .fetched(let key, _, .success): return !seenSuccess.insert(key).inserted
      case .fetched(let key, _, .failure): return !seenFailure.insert(key).inserted
      case .paging(let key, _, _): return !seenPaging.insert(key).inserted
      // A trace for the operator, folded into the key's row: the newest stays, within the retention.
      case .refreshSkipped(let key, _): return !seenSkip.insert(key).inserted || time < cutoff
      case .forgotten(let key):
        // The newest forget of a key stays while it is within the retention window; everything
        // older of that key goes in any case, so removing the forget later brings nothing back.
        guard forgotten.insert(key).inserted else { return true }
        return time < cutoff
      }
    }
    return false
  }
}

extension FerryStore {
  /// What a compaction removed and kept (``FerryStore/compact(retention:progress:)``).
  public struct CompactionReport: Sendable, Equatable {
    /// The engine's report, read through the properties below.
    let engine: FerryLog.CompactionReport

    init(_ engine: FerryLog.CompactionReport) { self.engine = engine }

    /// The sequence the snapshot covers: every event at or below it was considered.
    public var snapshotSequence: UInt64 { engine.snapshotSequence }
    /// Events removed now.
    public var removed: Int { engine.removed }
    /// Bytes of records removed now.
    public var removedBytes: Int { engine.removedBytes }
    /// Events left in the log.
    public var remaining: Int { engine.remaining }
    /// Rows in the snapshot, over every projection.
    public var snapshotRows: UInt64 { engine.snapshotRows }
    /// The projections that kept this compaction from removing anything: stored at another
    /// version than this code's, or not configured here, and behind the head. Empty when nothing
    /// held it back; while one stays there the log is never compacted.
    public var heldBackBy: [String] { engine.heldBackBy }
  }
}
