import ArgumentParser
import FerryLog

/// Checks every record and every projection row of a store.
struct Verify: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Check every record's CRC, sequence contiguity and projections against a rebuild.",
    discussion: "Example: ferry verify /path/to/store")

  @Argument(help: "The store directory.")
  var dir: String

  func run() async throws {
    let log: EventLog
    do {
      var configuration = EventLog.Configuration(projections: [EventTypeCounts()])
      configuration.readOnly = true
      log = try EventLog.open(at: dir, configuration: configuration)
    } catch let error as FerryLogError {
      print("ferry: \(error)")
      throw ExitCode(2)
    }
    defer { log.close() }
    let report = try log.verify()
    print(
      "head \(report.head), \(report.recordsChecked) records checked, \(report.rowsCompared) rows compared")
    for problem in report.problems { print("problem: \(problem)") }
    if !report.isHealthy { throw ExitCode(1) }
    print("ok")
  }
}
