import FerryLog
import Foundation

/// The engine smoke run behind `ferry demo`.
struct SmokeRun {
  let path: String
  let events: Int
  let callers: Int

  /// Runs every phase, printing as it goes; returns whether the final verify was clean.
  func run(print: (String) -> Void) async throws -> Bool {
    let configuration = EventLog.Configuration(projections: [EventTypeCounts()])
    var log = try EventLog.open(at: path, configuration: configuration)
    print("opened \(path) (created: \(log.wasCreated))")

    var start = ContinuousClock.now
    for i in 0..<events {
      _ = try await log.append(NewEvent(type: "item.added", payload: Array("item \(i)".utf8)))
    }
    var seconds = (ContinuousClock.now - start).seconds
    print(
      "1 caller:   \(events) durable appends in \(format(seconds)) s = \(Int(Double(events) / seconds)) appends/s"
    )

    let before = log.statistics.commits
    start = ContinuousClock.now
    let perCaller = max(1, events / callers)
    try await withThrowingTaskGroup(of: Void.self) { group in
      for c in 0..<callers {
        group.addTask { [log] in
          for i in 0..<perCaller {
            _ = try await log.append(
              NewEvent(type: "item.checked", payload: Array("caller \(c) item \(i)".utf8)))
          }
        }
      }
      try await group.waitForAll()
    }
    seconds = (ContinuousClock.now - start).seconds
    let total = perCaller * callers
    let commits = log.statistics.commits - before
    print(
      "\(callers) callers: \(total) durable appends in \(format(seconds)) s = \(Int(Double(total) / seconds)) appends/s, "
        + "\(commits) commits (\(format(Double(total) / Double(max(commits, 1)))) appends per commit)")

    log.close()
    log = try EventLog.open(at: path, configuration: configuration)
    defer { log.close() }
    let head = try log.head()
    let counts = try log.read { view in try EventTypeCounts.counts(in: view.tables(of: "eventTypeCounts")) }
      .sorted { $0.key < $1.key }
    print("reopened: head \(head); counts " + counts.map { "\($0.key)=\($0.value)" }.joined(separator: ", "))
    let report = try log.verify()
    print(
      "verify: \(report.recordsChecked) records, \(report.rowsCompared) rows compared, "
        + (report.isHealthy ? "healthy" : "\(report.problems.count) problems"))
    for problem in report.problems.prefix(5) { print("  \(problem)") }
    return report.isHealthy
  }

  private func format(_ value: Double) -> String { String(format: "%.2f", value) }
}

extension Duration {
  var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
