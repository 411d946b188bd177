@_spi(Engine) import Ferry
import FerryLog
import Foundation

/// The stable JSON form of `ferry inspect --json`.
package struct InspectReport: Codable, Sendable, Equatable {
  /// One queued task.
  package struct Task: Codable, Sendable, Equatable {
    /// The task id.
    package var id: TaskID
    /// The tag.
    package var tag: String
    /// The group, if any.
    package var group: String?
    /// The data id, if any.
    package var dataId: String?
    /// Whether it is manual.
    package var manual: Bool
    /// The task's ``TaskStatus`` as a stable key for scripts: `ready`, `running`, `waiting`
    /// (`waiting(until:)`, the time in `eligibleAt`), `blocked` (`blockedByError`), `dead` or
    /// `waitingForGroup` (`waitingForGroup(behind:)`, the head in `behind`) or `scheduled`
    /// (`scheduled(at:)`, the start in `eligibleAt`). The table prints the
    /// API's words for it instead (``statusWords``).
    package var status: String
    /// When a waiting task may run again, or a scheduled one first (Unix ms).
    package var eligibleAt: Int64?
    /// For a task waiting for its group: the group's head it waits behind.
    package var behind: TaskID?
    /// Runs started.
    package var attempts: UInt32
    /// When it was added (Unix ms).
    package var addedAt: Int64
    /// The message of its last failed run.
    package var lastFailure: String?
    /// Its unresolved error, if any.
    package var error: String?
    /// Its priority when not normal (larger runs first).
    package var priority: Int8?
    /// Its deadline (Unix ms), if any: no run starts after it.
    package var deadline: Int64?
    /// For a repeating task: the interval (ms) from a success to the next repetition's start.
    package var repeatEveryMs: Int64?

    /// The status as the API reads it (``TaskStatus``), rebuilt from the JSON's key and times.
    package var taskStatus: TaskStatus? {
      switch status {
      case "ready": return .ready
      case "running": return .running
      case "waiting": return .waiting(until: Date(unixMilliseconds: eligibleAt ?? 0))
      case "blocked": return .blockedByError
      case "dead": return .dead
      case "waitingForGroup": return .waitingForGroup(behind: behind ?? TaskID(rawValue: 0))
      case "scheduled": return .scheduled(at: Date(unixMilliseconds: eligibleAt ?? 0))
      default: return nil
      }
    }

    /// The status in the API's words (``TaskStatus``'s description: "blocked by an error",
    /// "waiting for its group (behind task 3)"): what people read, in the table as in an app.
    package var statusWords: String { taskStatus.map(\.description) ?? status }
  }
  /// One group and its tasks in order.
  package struct Group: Codable, Sendable, Equatable {
    /// The group, if any.
    package var group: String
    /// Its task ids, head first.
    package var tasks: [TaskID]
  }
  /// One unresolved error.
  package struct Error: Codable, Sendable, Equatable {
    /// The task it blocks.
    package var taskId: TaskID
    /// The error id.
    package var errorId: UInt64
    /// The message.
    package var message: String
    /// When it was recorded (Unix ms).
    package var recordedAt: Int64
  }
  /// One cache key.
  package struct Cache: Codable, Sendable, Equatable {
    /// The cache key.
    package var key: String
    /// The last successful fetch (Unix ms).
    package var lastSuccess: Int64?
    /// Milliseconds since then, at `now`.
    package var ageMs: Int64?
    /// Whether that is older than `maxAgeMs`.
    package var tooOld: Bool?
    /// The last fetch (Unix ms).
    package var lastAttempt: Int64?
    /// The last failed fetch (Unix ms).
    package var lastFailure: Int64?
    /// Its message.
    package var lastFailureMessage: String?
    /// Fetches recorded.
    package var fetchCount: UInt64
    /// Whether more pages are available.
    package var morePagesAvailable: Bool
  }
  /// Counts.
  package struct Totals: Codable, Sendable, Equatable {
    /// Counts of tasks by status, groups, errors, caches and too-old caches.
    package var tasks = 0, ready = 0, running = 0, waiting = 0, blocked = 0, dead = 0, manual = 0, groups = 0
    /// Tasks ready themselves but behind a group head that cannot run now.
    package var waitingForGroup = 0
    /// Tasks waiting for their start time; tasks that repeat (whatever their status).
    package var scheduled = 0, repeating = 0
    /// Unresolved errors.
    package var errors = 0, caches = 0, tooOld = 0
  }

  /// The log head of the state shown.
  package var head: UInt64
  /// Whether automatic running is paused.
  package var paused: Bool
  /// The time ages are measured at (Unix ms).
  package var now: Int64
  /// The max age caches are judged by.
  package var maxAgeMs: Int64
  /// The items, in order.
  package var tasks: [Task]
  /// Groups with queued tasks.
  package var groups: [Group]
  /// Unresolved errors.
  package var errors: [Error]
  /// Cache keys.
  package var caches: [Cache]
  /// Counts.
  package var totals: Totals
  /// Tasks cancelled while a run of them is under way (not pending; each holds its group until
  /// its run ends). Absent when there are none.
  package var cancelledRunning: [TaskID]?

  /// The report of a snapshot, with cache ages measured at `now` against `maxAgeMs`.
  package init(_ snapshot: FerrySnapshot, now: Int64, maxAgeMs: Int64) {
    head = snapshot.head
    paused = snapshot.paused
    cancelledRunning = snapshot.cancelledRunning.isEmpty ? nil : snapshot.cancelledRunning
    self.now = now
    self.maxAgeMs = maxAgeMs
    var totals = Totals()
    let errorByTask = Dictionary(
      snapshot.errors.map { ($0.taskId, $0.message) }, uniquingKeysWith: { a, _ in a })
    tasks = snapshot.tasks.map { task in
      totals.tasks += 1
      if task.manual { totals.manual += 1 }
      let status: String
      var eligibleAt: Int64?
      var behind: TaskID?
      switch task.status {
      case .ready:
        status = "ready"
        totals.ready += 1
      case .running:
        status = "running"
        totals.running += 1
      case .waiting(let until):
        status = "waiting"
        eligibleAt = until.unixMilliseconds
        totals.waiting += 1
      case .blockedByError:
        status = "blocked"
        totals.blocked += 1
      case .dead:
        status = "dead"
        totals.dead += 1
      case .waitingForGroup(let head):
        status = "waitingForGroup"
        behind = head
        totals.waitingForGroup += 1
      case .scheduled(let at):
        status = "scheduled"
        eligibleAt = at.unixMilliseconds
        totals.scheduled += 1
      }
      if task.repeatInterval != nil { totals.repeating += 1 }
      return Task(
        id: task.id, tag: task.tag, group: task.groupId, dataId: task.dataId, manual: task.manual,
        status: status,
        eligibleAt: eligibleAt, behind: behind, attempts: task.attempts, addedAt: task.addedAtMs,
        lastFailure: task.lastFailure,
        error: errorByTask[task.id],
        priority: task.priority == .normal ? nil : task.priority.rawValue,
        deadline: task.deadline.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) },
        repeatEveryMs: task.repeatInterval.map(\.milliseconds))
    }
    groups = snapshot.groups.map { Group(group: $0.group, tasks: $0.tasks) }
    totals.groups = groups.count
    errors = snapshot.errors.map {
      Error(taskId: $0.taskId, errorId: $0.errorId, message: $0.message, recordedAt: $0.recordedAtMs)
    }
    totals.errors = errors.count
    caches = snapshot.caches.map { record in
      let age = record.lastSuccessMs.map { max(0, now &- $0) }
      let tooOld = record.lastSuccessMs.map { $0 < now &- maxAgeMs }
      if tooOld == true { totals.tooOld += 1 }
      return Cache(
        key: record.key, lastSuccess: record.lastSuccessMs, ageMs: age, tooOld: tooOld,
        lastAttempt: record.lastAttemptMs,
        lastFailure: record.lastFailureMs?.at, lastFailureMessage: record.lastFailureMs?.message,
        fetchCount: record.fetchCount, morePagesAvailable: record.morePagesAvailable)
    }
    totals.caches = caches.count
    self.totals = totals
  }

  /// The report as readable tables.
  package func lines() -> [String] {
    var out: [String] = []
    out.append(
      "store head: \(head)   paused: \(paused ? "yes (no automatic run starts; runs under way finish)" : "no")"
    )
    out.append("")
    out.append("pending tasks (\(totals.tasks))")
    if tasks.isEmpty {
      out.append("  (none)")
    } else {
      out.append(
        "  " + column("id", 6) + column("tag", 22) + column("group", 14) + column("status", 40)
          + column("attempts", 9)
          + column("next eligible", 40) + "error / last failure")
      for task in tasks {
        let next =
          task.eligibleAt.map { relativeTime($0, now: now) } ?? task.behind.map { "after task \($0)" }
          ?? (task.status == "ready" ? "now" : "-")
        // Priority (when not normal) and deadline lead the last column.
        let note = [
          task.priority.map { "priority \(TaskPriority(rawValue: $0))" },
          task.deadline.map { "deadline \(isoTime($0))" },
          task.repeatEveryMs.map { "repeats every \(humanDuration($0)) after a success" },
          task.error.map { "error: \($0)" } ?? task.lastFailure.map { "last failure: \($0)" },
        ].compactMap { $0 }.joined(separator: "; ")
        out.append(
          "  " + column("\(task.id)", 6) + column(task.tag + (task.manual ? " (manual)" : ""), 22)
            + column(task.group ?? "-", 14) + column(task.statusWords, 40) + column("\(task.attempts)", 9)
            + column(next, 40)
            + note)
      }
    }
    if let cancelledRunning {
      out.append(
        "  cancelled while running (not pending; each holds its group until its run ends): "
          + cancelledRunning.map(String.init).joined(separator: ", "))
    }
    out.append("")
    out.append("groups (\(groups.count))")
    if groups.isEmpty { out.append("  (none)") }
    for group in groups {
      out.append("  \(group.group): " + group.tasks.map(String.init).joined(separator: " → "))
    }
    out.append("")
    out.append("unresolved errors (\(errors.count))")
    if errors.isEmpty { out.append("  (none)") }
    for error in errors {
      out.append(
        "  task \(error.taskId): \(error.message) (error \(error.errorId), \(relativeTime(error.recordedAt, now: now)))"
      )
    }
    out.append("")
    out.append("cache ages (max age \(humanDuration(maxAgeMs)))")
    if caches.isEmpty { out.append("  (none)") }
    for cache in caches {
      let age = cache.ageMs.map(humanDuration) ?? "never fetched"
      let old = cache.tooOld.map { $0 ? "TOO OLD" : "fresh" } ?? "no cache"
      var line =
        "  " + column(cache.key, 18) + column(age, 14) + column(old, 9) + "fetches \(cache.fetchCount)"
      if let failure = cache.lastFailureMessage { line += ", last failure: \(failure)" }
      out.append(line)
    }
    out.append("")
    out.append(
      "totals: \(plural(totals.tasks, "task")) (\(totals.ready) ready, \(totals.running) running, \(totals.waiting) waiting, "
        + "\(totals.blocked) blocked by an error, \(totals.dead) dead, \(totals.waitingForGroup) waiting for their group, "
        + "\(totals.scheduled) scheduled, \(totals.repeating) repeating, "
        + "\(totals.manual) manual), \(plural(totals.groups, "group")), "
        + "\(plural(totals.errors, "error")), \(plural(totals.caches, "cache")) (\(totals.tooOld) too old)")
    return out
  }
}

/// `ferry inspect`: the state of a store, read-only.
package func inspect(path: String, json: Bool, maxAgeMs: Int64, output: Output) throws(ToolError) {
  let store = try openForReading(path)
  defer { store.close() }
  do {
    let snapshot: FerrySnapshot
    if store.log.staleProjections.isEmpty {
      snapshot = try store.log.read { try FerryStore.snapshot(of: $0) }
    } else {
      // Another process appended without these projections: show a rebuild instead.
      snapshot = try store.log.withProjections(asOf: nil) { try FerryStore.snapshot(of: $0) }
    }
    let report = InspectReport(snapshot, now: wallClockMilliseconds(), maxAgeMs: maxAgeMs)
    if json { output.line(jsonLine(report)) } else { report.lines().forEach(output.line) }
  } catch {
    throw ToolError.from(error)
  }
}
