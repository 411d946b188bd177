import FerryLog

/// Both sides of a store as one value: what `ferry inspect` shows, and what `ferry replay --until`
/// rebuilds as of a point in the log.
public struct FerrySnapshot: Sendable, Equatable {
  /// The log's head in the snapshot.
  public var head: UInt64
  /// Queued tasks in id order.
  public var tasks: [PendingTask]
  /// Unresolved errors by task id.
  public var errors: [RecordedError]
  /// Whether automatic running is paused.
  public var paused: Bool
  /// Every cache key the ledger knows, by key.
  public var caches: [CacheRecord]
  /// Tasks cancelled (or cleared, or replaced) while a run of them was under way, in id order:
  /// no longer queued — not in ``tasks`` — but their runs have not ended, and each still holds
  /// its group until its run's outcome is logged.
  public var cancelledRunning: [TaskID] = []

  /// The groups with queued tasks, each with its task ids in order (the first is the head).
  public var groups: [(group: String, tasks: [TaskID])] {
    // Groups by their bytes, as the queue keeps them: two spellings of "café" are equal
    // `String`s but two groups, each with its own head.
    var order: [(group: String, bytes: [UInt8])] = []
    var members: [[UInt8]: [TaskID]] = [:]
    for task in tasks {
      guard let group = task.groupId else { continue }
      let bytes = Array(group.utf8)
      if members[bytes] == nil { order.append((group, bytes)) }
      members[bytes, default: []].append(task.id)
    }
    return order.map { ($0.group, members[$0.bytes] ?? []) }
  }

  /// Two snapshots are equal when every field is.
  public static func == (lhs: FerrySnapshot, rhs: FerrySnapshot) -> Bool {
    lhs.head == rhs.head && lhs.tasks == rhs.tasks && lhs.errors == rhs.errors && lhs.paused == rhs.paused
      && lhs.caches == rhs.caches && lhs.cancelledRunning == rhs.cancelledRunning
  }
}

extension FerryStore {
  /// Reads both sides from a view of the log: the stored projections (`EventLog.read(_:)`) or a
  /// rebuild as of a sequence (`EventLog.withProjections(asOf:progress:_:)`).
  @_spi(Engine) public static func snapshot(of view: LogView) throws -> FerrySnapshot {
    let queue = QueueTables(try view.tables(of: TaskQueueProjection.projectionName))
    let tasks = try queue.allTasks()
    let errors = try queue.tables.entries("errors").map { entry -> RecordedError in
      guard let id = TaskID(bigEndianBytes: entry.key) else {
        throw PayloadError("an error key is malformed")
      }
      return try TaskQueue.decodeError(id, entry.value)
    }
    let paused = try queue.tables.get("state", key: QueueKey.paused) == [1]
    let caches = try view.tables(of: CacheAgesProjection.projectionName).entries("keys").map {
      try CacheRecord(key: String(decoding: $0.key, as: UTF8.self), bytes: $0.value)
    }
    let cancelledRunning = try QueueCommand.claims(queue).map(\.0).filter {
      try queue.row($0)?.isQueued == false
    }
    return FerrySnapshot(
      head: try view.head(), tasks: tasks, errors: errors, paused: paused, caches: caches,
      cancelledRunning: cancelledRunning)
  }

  /// Opens a store read-only: nothing is written (no crash recovery either), and it works while
  /// another process writes. The queue and ledger refuse changes.
  ///
  /// - Parameter path: The store's directory.
  /// - Returns: The store; its queue and ledger refuse changes with
  ///   ``FerryError/permissionDenied(path:detail:)``.
  /// - Throws: ``FerryError/noSuchStore(path:)`` when there is no store (none is created);
  ///   ``FerryError/needsRecovery(path:)`` when commits only the write-ahead segment holds need a read-write
  ///   open first; ``FerryError/notAStore(path:reason:)``, ``FerryError/alreadyOpen(path:)``,
  ///   ``FerryError/permissionDenied(path:detail:)``, ``FerryError/newerFormat(path:message:)``,
  ///   ``FerryError/unsupportedLMDB(found:supported:)``, ``FerryError/damaged(path:message:)``,
  ///   ``FerryError/ioError(path:detail:)`` or ``FerryError/storage(_:)`` when it cannot be opened.
  public static func openReadOnly(at path: String) throws(FerryError) -> FerryStore {
    try openReadOnly(at: path, recoveredCopyIfNeeded: false)
  }

  /// Opens a store read-only as ``openReadOnly(at:)`` does, and — with `recoveredCopyIfNeeded` —
  /// reads a recovered copy of a store that needs recovery instead of failing with
  /// ``FerryError/needsRecovery(path:)``: its data file and write-ahead segment are copied into
  /// a private directory under the temporary directory, the copy's segment is replayed there,
  /// and the store reads the copy — every acknowledged event, as the store was when its writer
  /// died. Nothing is written to the store's directory (it may be on read-only media), nothing is
  /// appended beyond the replay (no `task.runInterrupted`), and the copy is removed at close.
  /// ``isRecoveredCopy`` says whether the store read is such a copy.
  ///
  /// - Parameters:
  ///   - path: The store's directory.
  ///   - recoveredCopyIfNeeded: Read a recovered copy of a store that needs recovery.
  /// - Returns: The store; its queue and ledger refuse changes.
  /// - Throws: As ``openReadOnly(at:)``, and — with `recoveredCopyIfNeeded` — in place of
  ///   ``FerryError/needsRecovery(path:)``: ``FerryError/recoveredCopyFailed(path:reason:)`` when
  ///   no copy could be made (no room in the temporary directory), or
  ///   ``FerryError/damaged(path:message:)`` when the replay found the store damaged.
  public static func openReadOnly(
    at path: String, recoveredCopyIfNeeded: Bool
  ) throws(FerryError) -> FerryStore {
    try engine {
      var logConfiguration = EventLog.Configuration(
        projections: [TaskQueueProjection(), CacheAgesProjection()], catalog: catalog)
      logConfiguration.readOnly = true
      logConfiguration.recoveredCopyIfNeeded = recoveredCopyIfNeeded
      let log = try EventLog.open(at: path, configuration: logConfiguration)
      let clock: @Sendable () -> Int64 = wallClockMilliseconds
      let sleep: @Sendable (Int64) async -> Void = { _ in }
      return FerryStore(
        log: log, queue: TaskQueue(log: log, clock: clock, sleep: sleep),
        ledger: CacheLedger(log: log, clock: clock, sleep: sleep))
    }
  }
}

extension FerryStore {
  /// Whether this store reads a private, recovered copy of a store that needed recovery
  /// (``openReadOnly(at:recoveredCopyIfNeeded:)``) rather than the store's own files, which are
  /// untouched until a read-write open (`ferry recover`) replays them in place.
  public var isRecoveredCopy: Bool { log.isRecoveredCopy }
}

/// A one-line, human reading of a logged event of a Ferry store, for `ferry log` and the crash checks.
public struct EventSummary: Sendable, Equatable {
  /// What kind of event it is.
  public enum Kind: Sendable, Equatable {
    /// A queue event, by the name after its `task.` or `queue.` prefix (`added`, `runSucceeded`, `cleared`, ...).
    case task(String)
    /// A cache event, by the name after its `cache.` prefix (`fetched`, `forgotten`, `paging`).
    case cache(String)
    /// Not a Ferry event, or one that does not decode.
    case other
  }

  /// What kind of event it is.
  public let kind: Kind
  /// The group of the task a `task.added` event adds.
  public let groupId: String?
  /// The task the event is about, if any.
  public let taskId: TaskID?
  /// The cache key the event is about, if any.
  public let key: String?
  /// The cache keys a task's success made stale (``TaskResult/succeeded(output:invalidating:)``).
  public private(set) var staleKeys: [String] = []
  /// What happened, in words.
  public let text: String

  /// Describes a logged event; an event of another type, or one that does not decode, says so.
  @_spi(Engine) public init(_ event: LoggedEvent) {
    let name = String(event.type.split(separator: ".").last ?? "")
    var groupId: String?
    var taskId: TaskID?
    var key: String?
    let text: String
    if TaskEvent.typeSet.contains(event.type), let decoded = try? TaskEvent(event) {
      kind = .task(name)
      switch decoded {
      case .added(
        let tag, let payload, let dataId, let group, let manual, let unique, let priority, let deadline,
        let schedule):
        taskId = TaskID(rawValue: event.sequence)
        groupId = group
        var parts = ["task \(event.sequence) added: tag \(tag)"]
        if let group { parts.append("group \(group)") }
        if let dataId { parts.append("dataId \(dataId)") }
        if manual { parts.append("manual") }
        if unique != .append { parts.append("unique \(unique)") }
        if priority != 0 { parts.append("priority \(TaskPriority(rawValue: priority))") }
        if let deadline { parts.append("deadline \(readableTime(deadline))") }
        if let startAt = schedule.startAt { parts.append("starts \(readableTime(startAt))") }
        if let interval = schedule.interval {
          parts.append("repeats every \(TaskRunner.readable(milliseconds: interval))")
        }
        parts.append("payload \(String(decoding: payload.prefix(120), as: UTF8.self))")
        text = parts.joined(separator: ", ")
      case .runStarted(let id, let attempt, let owner, let runner, let batch):
        taskId = id
        text =
          "task \(id) run started (attempt \(attempt))"
          + (owner.isEmpty ? "" : " by runner \(runner) of owner \(owner)")
          + (batch.map { $0 == id ? ", first of a batch" : ", in the batch of task \($0)" } ?? "")
      case .runSucceeded(let id, let details):
        taskId = id
        staleKeys = details.invalidates
        var parts = ["task \(id) succeeded"]
        if let output = details.output {
          parts.append("output \(String(decoding: output.prefix(120), as: UTF8.self))")
        }
        if !details.invalidates.isEmpty {
          parts.append("stales \(details.invalidates.joined(separator: ", "))")
        }
        text = parts.joined(separator: ", ")
      case .runDeferred(let id, let reason):
        taskId = id
        text = "task \(id) run deferred (no attempt spent): \(reason)"
      case .runFailed(let id, let message, let retryable, let next):
        taskId = id
        text =
          "task \(id) failed (\(retryable ? "retryable" : "final")): \(message); "
          + (next.map { "retry at \(readableTime($0))" } ?? "dead")
      case .runInterrupted(let id):
        taskId = id
        text = "task \(id) run interrupted"
      case .errorRecorded(let id, let message, let endsRun):
        taskId = id
        text = "task \(id) error recorded\(endsRun ? " by its run" : ""): \(message)"
      case .errorResolved(let id):
        taskId = id
        text = "task \(id) error resolved"
      case .cancelled(let id):
        taskId = id
        text = "task \(id) cancelled"
      case .expired(let id):
        taskId = id
        text = "task \(id) expired: its deadline passed before it started"
      case .revived(let id):
        taskId = id
        text = "task \(id) revived"
      case .payloadUpdated(let id, let payload):
        taskId = id
        text = "task \(id) payload updated: \(String(decoding: payload.prefix(120), as: UTF8.self))"
      case .cleared: text = "queue cleared"
      case .paused: text = "queue paused"
      case .resumed: text = "queue resumed"
      }
    } else if CacheEvent.typeSet.contains(event.type), let decoded = try? CacheEvent(event) {
      kind = .cache(name)
      switch decoded {
      case .fetched(let k, let at, .success(let isEmpty)):
        key = k
        text = "cache \(k) fetched at \(readableTime(at))\(isEmpty ? " (empty)" : "")"
      case .fetched(let k, let at, .failure(let message)):
        key = k
        text = "cache \(k) fetch failed at \(readableTime(at)): \(message)"
      case .forgotten(let k):
        key = k
        text = "cache \(k) forgotten"
      case .paging(let k, _, let more):
        key = k
        text = "cache \(k) paging: \(more ? "more pages" : "no more pages")"
      case .refreshSkipped(let k, let pending):
        key = k
        text = "cache \(k) refresh skipped: \(pending) pending task\(pending == 1 ? "" : "s") could still run"
      }
    } else {
      kind = .other
      text = "\(event.type) (\(event.payload.count) payload bytes, not a Ferry event)"
    }
    self.groupId = groupId
    self.taskId = taskId
    self.key = key
    self.text = text
  }
}
