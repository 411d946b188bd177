import Ferry
import FerryLog
import Foundation

/// The stable JSON form of an operator command (`ferry cancel`, `revive`, `resolve`, `forget`,
/// `pause`, `resume` with `--json`): one object, keys sorted.
package struct OperatorReport: Codable, Sendable, Equatable {
  /// The command: cancel, revive, resolve, forget, pause or resume.
  package var command: String
  /// Tasks changed (cancelled, revived, or their error resolved), in id order.
  package var changed: [TaskID] = []
  /// Tasks left alone because a run of them is under way (exit status 10).
  package var running: [TaskID] = []
  /// Tasks left alone because they are not queued or not in the state the command needs (exit
  /// status 11), each with the reason.
  package var refused: [Refusal] = []
  /// For `forget`: the cache key, and whether the store had a record of it.
  package var key: String?
  /// For `forget`: whether the store had a record of the key before.
  package var hadRecord: Bool?
  /// For `pause` and `resume`: whether the queue is paused afterwards.
  package var paused: Bool?
  /// For `pause` and `resume`: whether the state changed (false: it was already so, and nothing
  /// was appended).
  package var stateChanged: Bool?
  /// Runs under way when the command ran (they are never touched).
  package var runsUnderWay: Int?

  /// One task the command left alone, and why.
  package struct Refusal: Codable, Sendable, Equatable {
    /// The task id.
    package var id: TaskID
    /// Why, in one line.
    package var reason: String
  }

  /// The exit status the report stands for: 10 when a task was left for its run, 11 when one was
  /// refused otherwise, 0 when every task asked for was changed.
  package var status: ExitStatus {
    if !running.isEmpty { return .runUnderWay }
    if !refused.isEmpty { return .notApplicable }
    return .ok
  }
}

/// What an operator command does to the queue or the cache.
package enum OperatorAction: Sendable, Equatable {
  /// Cancel these tasks (each only if no run of it is under way).
  case cancel([TaskID])
  /// Cancel every task of a tag that has no run under way.
  case cancelTag(String)
  /// Cancel every task of a group that has no run under way.
  case cancelGroup(String)
  /// Make a dead task ready again.
  case revive(TaskID)
  /// Make every dead task of a tag, of a group, or of the whole queue (both nil) ready again.
  case reviveMany(tag: String?, group: String?)
  /// Resolve a task's recorded error.
  case resolve(TaskID)
  /// Resolve the errors of every blocked task of a tag, of a group, or of the whole queue.
  case resolveMany(tag: String?, group: String?)
  /// Forget everything about a cache key.
  case forget(String)
  /// Stop automatic running.
  case pause
  /// Start automatic running again.
  case resume
}

/// Opens the store read-write (never creating it) and appends what `action` decides, through the
/// queue's and the ledger's own commands, so the events are exactly those the library appends.
/// A task a runner holds is never changed. Prints a human summary, or one JSON object.
package func operate(
  path: String, _ action: OperatorAction, json: Bool, output: Output
) async throws(ToolError) -> ExitStatus {
  try requireDirectory(path)
  let store: FerryStore
  do {
    store = try await FerryStore.open(at: path, configuration: toolConfiguration(for: path))
  } catch {
    throw ToolError.from(error)
  }
  defer { store.close() }
  let report: OperatorReport
  do {
    report = try await apply(action, to: store)
  } catch {
    throw ToolError.from(error)
  }
  if json {
    output.line(jsonLine(report))
  } else {
    for line in describe(report) { output.line(line) }
  }
  return report.status
}

private func runsUnderWay(_ store: FerryStore) throws -> Int {
  try store.queue.pendingTasks().filter { $0.status == .running }.count
}

private func apply(_ action: OperatorAction, to store: FerryStore) async throws -> OperatorReport {
  let queue = store.queue
  switch action {
  case .cancel(let ids):
    var report = OperatorReport(command: "cancel")
    for id in ids {
      do {
        try await queue.cancelUnlessRunning(id)
        report.changed.append(id)
      } catch FerryError.taskRunning {
        report.running.append(id)
      } catch FerryError.noSuchTask {
        report.refused.append(.init(id: id, reason: "not in the queue"))
      }
    }
    return report
  case .cancelTag(let tag):
    let result = try await queue.cancel(tag: tag)
    return OperatorReport(command: "cancel", changed: result.cancelled, running: result.running)
  case .cancelGroup(let group):
    let result = try await queue.cancel(group: group)
    return OperatorReport(command: "cancel", changed: result.cancelled, running: result.running)
  case .revive(let id):
    var report = OperatorReport(command: "revive")
    do {
      try await queue.revive(id)
      report.changed.append(id)
    } catch FerryError.noSuchTask {
      report.refused.append(.init(id: id, reason: "not in the queue"))
    } catch FerryError.invalidArgument {
      report.refused.append(.init(id: id, reason: "not dead (only a dead task can be revived)"))
    }
    return report
  case .reviveMany(let tag, let group):
    let revived: [TaskID]
    if let tag {
      revived = try await queue.revive(tag: tag)
    } else if let group {
      revived = try await queue.revive(group: group)
    } else {
      revived = try await queue.reviveAll()
    }
    return OperatorReport(command: "revive", changed: revived, running: [])
  case .resolveMany(let tag, let group):
    let result: BulkChangeReport
    if let tag {
      result = try await queue.resolveErrors(tag: tag)
    } else if let group {
      result = try await queue.resolveErrors(group: group)
    } else {
      result = try await queue.resolveAllErrors()
    }
    return OperatorReport(command: "resolve", changed: result.changed, running: result.running)
  case .resolve(let id):
    var report = OperatorReport(command: "resolve")
    do {
      try await queue.resolveErrorUnlessRunning(id)
      report.changed.append(id)
    } catch FerryError.taskRunning {
      report.running.append(id)
    } catch FerryError.noSuchTask {
      report.refused.append(.init(id: id, reason: "not in the queue"))
    } catch FerryError.invalidArgument {
      report.refused.append(.init(id: id, reason: "has no unresolved error"))
    }
    return report
  case .forget(let key):
    let had = try store.ledger.record(key) != nil
    try await store.ledger.forget(key)
    return OperatorReport(command: "forget", key: key, hadRecord: had)
  case .pause, .resume:
    let pause = action == .pause
    let before = try queue.isPaused()
    if pause { try await queue.pause() } else { try await queue.resume() }
    return OperatorReport(
      command: pause ? "pause" : "resume", paused: try queue.isPaused(), stateChanged: before != pause,
      runsUnderWay: try runsUnderWay(store))
  }
}

private func describe(_ report: OperatorReport) -> [String] {
  var lines: [String] = []
  let verb: String
  switch report.command {
  case "cancel": verb = "cancelled"
  case "revive": verb = "revived"
  case "resolve": verb = "error resolved for"
  default: verb = report.command
  }
  switch report.command {
  case "forget":
    let key = report.key ?? ""
    lines.append(
      report.hadRecord == true
        ? "forgot cache key \(key): its next state is \"no cache\""
        : "cache key \(key) had no record; a forget was logged all the same (its state stays \"no cache\")")
  case "pause", "resume":
    let state = report.paused == true ? "paused: yes" : "paused: no"
    let change = report.stateChanged == true ? "" : " (it was already; nothing was appended)"
    lines.append(state + change)
    if let count = report.runsUnderWay, count > 0 {
      lines.append(
        "\(plural(count, "run")) under way \(count == 1 ? "goes" : "go") on and \(count == 1 ? "is" : "are") logged as usual"
          + (report.paused == true ? "; no new automatic run starts" : ""))
    }
  default:
    if report.changed.isEmpty && report.running.isEmpty && report.refused.isEmpty {
      lines.append("no task matched: nothing was changed")
    }
    if !report.changed.isEmpty {
      lines.append("\(verb) \(plural(report.changed.count, "task")): \(ids(report.changed))")
    }
    if !report.running.isEmpty {
      lines.append(
        "refused for \(plural(report.running.count, "task")) with a run under way: \(ids(report.running)) — "
          + "a runner holds \(report.running.count == 1 ? "it" : "them") (in this process or another); nothing was changed for "
          + "\(report.running.count == 1 ? "it" : "them"): the run goes on and its outcome is logged as usual. "
          + "Try again once the run has ended (exit status 10)")
    }
    for refusal in report.refused {
      lines.append(
        "refused for task \(refusal.id): \(refusal.reason); nothing was changed for it (exit status 11)")
    }
  }
  return lines
}

private func ids(_ ids: [TaskID]) -> String { ids.map(\.description).joined(separator: ", ") }

/// "1 task", "2 tasks".
func plural(_ count: Int, _ noun: String) -> String { "\(count) \(noun)\(count == 1 ? "" : "s")" }
