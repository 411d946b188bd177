import FerryLog
import Foundation

@testable import Ferry

/// Runs `body`, giving up after `seconds`: nil when it did not finish in time (it is cancelled).
func resultWithin<T: Sendable>(
  _ seconds: Double, _ body: @escaping @Sendable () async throws -> T
) async throws -> T? {
  try await withThrowingTaskGroup(of: T?.self) { group in
    group.addTask { try await body() }
    group.addTask {
      try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
      return nil
    }
    let first = try await group.next() ?? nil
    group.cancelAll()
    return first
  }
}

/// The runs of each task as the log tells them: (starts, successes, finishes, interruptions).
func runsByTask(
  _ log: EventLog
) throws -> [TaskID: (starts: Int, successes: Int, finishes: Int, interruptions: Int)] {
  var runs: [TaskID: (starts: Int, successes: Int, finishes: Int, interruptions: Int)] = [:]
  try log.forEachEvent { event in
    guard TaskEvent.typeSet.contains(event.type) else { return }
    switch try TaskEvent(event) {
    case .runStarted(let id, _, _, _, _): runs[id, default: (0, 0, 0, 0)].starts += 1
    case .runSucceeded(let id, _):
      runs[id, default: (0, 0, 0, 0)].successes += 1
      runs[id, default: (0, 0, 0, 0)].finishes += 1
    case .runFailed(let id, _, _, _), .errorRecorded(let id, _, true):
      runs[id, default: (0, 0, 0, 0)].finishes += 1
    case .runInterrupted(let id): runs[id, default: (0, 0, 0, 0)].interruptions += 1
    default: break
    }
  }
  return runs
}

/// Per task, in log order: "S" start (owner), "F" finish, "I" interrupt.
func runTimeline(_ log: EventLog) throws -> [TaskID: [(kind: Character, owner: String)]] {
  var timeline: [TaskID: [(kind: Character, owner: String)]] = [:]
  try log.forEachEvent { event in
    guard TaskEvent.typeSet.contains(event.type) else { return }
    switch try TaskEvent(event) {
    case .runStarted(let id, _, let owner, _, _): timeline[id, default: []].append(("S", owner))
    case .runSucceeded(let id, _): timeline[id, default: []].append(("F", "ok"))
    case .runFailed(let id, _, _, _), .errorRecorded(let id, _, true):
      timeline[id, default: []].append(("F", ""))
    case .runInterrupted(let id): timeline[id, default: []].append(("I", ""))
    default: break
    }
  }
  return timeline
}
