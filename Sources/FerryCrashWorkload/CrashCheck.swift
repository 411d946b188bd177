@_spi(Engine) @_spi(Experimental) import Ferry
import FerryLog
import Foundation

/// One acknowledged event, as the crash workload printed it.
public struct Acknowledgement: Sendable, Equatable {
  /// Its sequence number.
  public let sequence: UInt64
  /// Its type.
  public let type: String
  /// The CRC32C of its stored record.
  public let crc: UInt32

  /// Parses `ack <sequence> <type> <crc hex>`; nil for any other line.
  public init?(line: some StringProtocol) {
    let parts = line.split(separator: " ")
    guard parts.count == 4, parts[0] == "ack", let sequence = UInt64(parts[1]),
      let crc = UInt32(parts[3], radix: 16)
    else { return nil }
    self.sequence = sequence
    self.type = String(parts[2])
    self.crc = crc
  }
}

/// What the crash checks found after a kill.
public struct CrashCheckReport: Sendable {
  /// The log's head found after the crash.
  public var head: UInt64 = 0
  /// Acknowledged events checked.
  public var acknowledged = 0
  /// Acknowledged events missing or changed.
  public var lost = 0
  /// Every broken invariant, in words.
  public var violations: [String] = []
  /// Runs found in flight and logged as interrupted at reopen.
  public var interrupted: [TaskID] = []

  /// The report as lines for the harness to parse.
  public var lines: [String] {
    [
      "head \(head)", "acknowledged \(acknowledged)", "lost \(lost)", "violations \(violations.count)",
      "interrupted \(interrupted.map(String.init).joined(separator: ","))",
    ]
      + violations.map { "violation: \($0)" }
  }
}

/// Reopens a store after a kill and checks every invariant of `Specs/crash-model.md`: every
/// acknowledged event present byte for byte; the log a gap-free run of records whose CRCs hold;
/// stored projections equal to a rebuild; each task pending at most once and never after it
/// finished; group order kept; every run in flight logged as interrupted at reopen and runnable again.
public func checkAfterCrash(path: String, acknowledged: [Acknowledgement]) async -> CrashCheckReport {
  var report = CrashCheckReport()
  report.acknowledged = acknowledged.count
  var inFlight: [TaskID] = []
  var cancelledInFlight = Set<TaskID>()

  // 0. With the write-ahead segment, a store whose writer died has frames past its checkpoint
  // that only a read-write open replays (a read-only one refuses it): the log alone is opened
  // once — no projections, no queue recovery — to replay them, as any open would first.
  if crashStoresUseSegment {
    do {
      var readOnly = EventLog.Configuration()
      readOnly.readOnly = true
      try EventLog.open(at: path, configuration: readOnly).close()
    } catch FerryLogError.needsRecovery {
      do {
        var configuration = EventLog.Configuration()
        configuration.createIfMissing = false
        configuration.writeAheadSegment = true
        try EventLog.open(at: path, configuration: configuration).close()
      } catch {
        report.violations.append("replaying the write-ahead segment after the crash failed: \(error)")
        return report
      }
    } catch {
      // Anything else is step 1's to judge.
    }
  }

  // 1. Read-only, exactly as the crash left it (nothing written, no recovery yet).
  do {
    let store = try FerryStore.openReadOnly(at: path)
    defer { store.close() }
    report.head = try store.log.head()
    // Compaction removes acknowledged events on purpose, but only at or below its point.
    let compacted = try store.log.compactionState()?.through ?? 0
    for ack in acknowledged {
      guard let record = try store.log.record(at: ack.sequence) else {
        if ack.sequence <= compacted { continue }
        report.lost += 1
        report.violations.append("acknowledged event \(ack.sequence) (\(ack.type)) is missing")
        continue
      }
      let event = try EventRecord.decode(record, sequence: ack.sequence)
      if event.type != ack.type || CRC32C.checksum(record) != ack.crc {
        report.lost += 1
        report.violations.append(
          "acknowledged event \(ack.sequence) changed: \(event.type) instead of \(ack.type)")
      }
    }
    // A rebuild killed between chunks leaves projections behind the head: allowed (readers are
    // refused their rows, and the next open resumes the rebuild), so their rows are judged after
    // reopen instead. Anything else wrong is a violation now.
    let behind = Set(store.log.staleProjections.filter { $0.value.contains("covers the log up to") }.keys)
    let verified = try store.log.verify(maxDifferences: 5)
    for problem in verified.problems {
      if case .projectionState(let projection, _) = problem, behind.contains(projection) { continue }
      report.violations.append("after the crash: \(problem)")
    }
    let snapshot =
      behind.isEmpty
      ? try store.log.read { try FerryStore.snapshot(of: $0) }
      : try store.log.withProjections(asOf: nil) { try FerryStore.snapshot(of: $0) }
    inFlight = (snapshot.tasks.filter { $0.status == .running }.map(\.id) + snapshot.cancelledRunning)
      .sorted()
    cancelledInFlight = Set(snapshot.cancelledRunning)
    report.violations += try taskInvariants(store.log, pending: snapshot.tasks)
  } catch FerryError.notAStore(_, _) where acknowledged.isEmpty {
    // Killed while the store was being created: nothing was acknowledged, nothing to check yet.
  } catch FerryError.noSuchStore(_) where acknowledged.isEmpty {
    // Killed before the directory was even made.
  } catch {
    report.violations.append("reading the store after the crash failed: \(error)")
    return report
  }

  // 2. Reopen as the app would: runs in flight are logged as interrupted and are runnable again.
  do {
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = crashStoresUseSegment
    let store = try await FerryStore.open(at: path, configuration: configuration)
    defer { store.close() }
    report.interrupted = store.queue.interruptedAtOpen
    if report.interrupted != inFlight {
      report.violations.append(
        "runs in flight \(inFlight) but \(report.interrupted) reported interrupted at reopen")
    }
    for id in report.interrupted
    where try !cancelledInFlight.contains(id) && store.queue.task(id)?.status != .ready {
      report.violations.append("interrupted task \(id) is not ready again after reopen")
    }
    // A task cancelled while it ran leaves the queue when its run ends — here, interrupted.
    for id in cancelledInFlight where try store.queue.task(id) != nil {
      report.violations.append(
        "task \(id), cancelled while it ran, is queued again after its run was interrupted")
    }
    if let left = try? store.log.read({ try FerryStore.snapshot(of: $0) }).cancelledRunning, !left.isEmpty {
      report.violations.append("runs of cancelled tasks \(left) are still under way after reopen")
    }
    let verified = try store.log.verify(maxDifferences: 5)
    for problem in verified.problems { report.violations.append("after reopen: \(problem)") }
  } catch {
    report.violations.append("reopening after the crash failed: \(error)")
  }
  return report
}

/// Each task pending at most once and never after it finished; group order kept; no double run
/// without a dead owner (`Specs/crash-model.md`): a task is never claimed while a run of it is
/// under way, every outcome ends a run that was under way, no task succeeds twice, and a run
/// interrupted as its owner's was never followed by another claim of that owner (which would prove
/// the owner alive when its run was taken away). Only tasks whose add is still in the log are
/// judged: compaction removes a finished task's events from its add on.
private func taskInvariants(_ log: EventLog, pending: [PendingTask]) throws -> [String] {
  var violations: [String] = []
  var open: [TaskID: String] = [:]
  var succeeded = Set<TaskID>()
  var interruptedOwners: [String: (task: TaskID, sequence: UInt64)] = [:]
  var present = Set<TaskID>()
  // A group never has two runs under way: its next task starts only after its head's run ended
  // (a head cancelled during its run too, `Specs/task-events.md` §3.2).
  var groupOf: [TaskID: String] = [:]
  var runningInGroup: [String: TaskID] = [:]
  func endRun(_ id: TaskID) {
    if let group = groupOf[id], runningInGroup[group] == id { runningInGroup[group] = nil }
  }
  try log.forEachEvent(chunkSize: 5000) { event in
    guard let decoded = try? TaskEvent(event) else { return }
    switch decoded {
    case .added(_, _, _, let groupId, _, _, _, _, _):
      present.insert(TaskID(rawValue: event.sequence))
      if let groupId { groupOf[TaskID(rawValue: event.sequence)] = groupId }
    case .runStarted(let id, _, let owner, _, _) where present.contains(id):
      if let other = open[id] {
        violations.append(
          "task \(id) claimed at \(event.sequence) by \(owner) while \(other)'s run was under way")
      }
      if let group = groupOf[id] {
        if let other = runningInGroup[group], other != id {
          violations.append(
            "group \(group): task \(id) started at \(event.sequence) while task \(other)'s run was under way")
        }
        runningInGroup[group] = id
      }
      if let interrupted = interruptedOwners[owner] {
        violations.append(
          "owner \(owner) claimed task \(id) at \(event.sequence) after its run of task \(interrupted.task) was interrupted at \(interrupted.sequence) as if it were dead"
        )
      }
      open[id] = owner
    case .runSucceeded(let id, _) where present.contains(id),
      .runFailed(let id, _, _, _) where present.contains(id),
      .errorRecorded(let id, _, true) where present.contains(id):
      endRun(id)
      if open.removeValue(forKey: id) == nil {
        violations.append("task \(id) has an outcome at \(event.sequence) with no run under way")
      }
      if case .runSucceeded = decoded, !succeeded.insert(id).inserted {
        violations.append("task \(id) succeeded twice (again at \(event.sequence))")
      }
    case .runInterrupted(let id) where present.contains(id):
      endRun(id)
      guard let owner = open.removeValue(forKey: id) else {
        violations.append("task \(id) interrupted at \(event.sequence) with no run under way")
        return
      }
      interruptedOwners[owner] = (id, event.sequence)
    case .expired(let id) where present.contains(id):
      // A deadline never interrupts a run: only a task without a claim expires.
      if let owner = open[id] {
        violations.append("task \(id) expired at \(event.sequence) while \(owner)'s run was under way")
      }
    default:
      break
    }
  }
  var added: [TaskID: String?] = [:]
  var finished = Set<TaskID>()
  var lastClear: UInt64 = 0
  var lastSucceededInGroup: [String: TaskID] = [:]
  try log.forEachEvent(chunkSize: 5000) { event in
    let summary = EventSummary(event)
    switch summary.kind {
    case .task("added"): added[TaskID(rawValue: event.sequence)] = summary.groupId
    case .task("runSucceeded"), .task("cancelled"), .task("expired"):
      guard let id = summary.taskId else { return }
      // A success that removed its task (not the late result of a run whose task had already left)
      // must come in id order within its group: only a group's head runs.
      let removedByThis =
        finished.insert(id).inserted && event.sequence > lastClear && id.rawValue > lastClear
      if removedByThis, summary.kind == .task("runSucceeded"), let group = added[id] ?? nil {
        if let previous = lastSucceededInGroup[group], previous > id {
          violations.append("group \(group): task \(id) succeeded after task \(previous)")
        }
        lastSucceededInGroup[group] = max(lastSucceededInGroup[group] ?? id, id)
      }
    case .task("cleared"): lastClear = event.sequence
    default: break
    }
  }
  var seen = Set<TaskID>()
  for task in pending {
    if !seen.insert(task.id).inserted { violations.append("task \(task.id) is pending twice") }
    if added[task.id] == nil { violations.append("pending task \(task.id) was never added") }
    if finished.contains(task.id) { violations.append("task \(task.id) is pending after it finished") }
    if task.id.rawValue < lastClear {
      violations.append("task \(task.id) is pending after the queue was cleared")
    }
  }
  return violations
}
