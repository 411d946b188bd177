import FerryLog
import Foundation
import TestSupport
import Testing

@_spi(Engine) @_spi(Experimental) @testable import Ferry

/// The `ferry` tool's operator commands (and compact, verify, inspect) run again and again from
/// another process while two runner processes work the queue, with and without the write-ahead
/// segment: no run is ever taken from its runner, no task runs twice or after its cancellation,
/// every command exits with a documented status, and the log stays healthy. Everything is read
/// from the log and the handlers' own lines, never from counters.
@Suite(.timeLimit(.minutes(20))) struct OperatorCompanyTests {
  /// Runs `ferry` with `arguments`; its status, standard output and standard error.
  static func ferry(
    _ arguments: [String], killAfter: Duration? = nil
  ) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = Process()
    process.executableURL = productURL("ferry")
    process.arguments = arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    if let killAfter {
      let pid = process.processIdentifier
      Thread.detachNewThread {
        Thread.sleep(forTimeInterval: Double(killAfter.components.attoseconds) / 1e18)
        kill(pid, SIGKILL)
      }
    }
    let stdout = out.fileHandleForReading.readAll()
    let stderr = err.fileHandleForReading.readAll()
    process.waitUntilExit()
    let status =
      process.terminationReason == .uncaughtSignal ? -process.terminationStatus : process.terminationStatus
    return (status, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
  }

  @Test(arguments: [false, true], [false, true])
  func operatorCommandsBesideTwoRunnerProcessesNeverTakeARunOrRunATaskTwice(
    segment: Bool, killing: Bool
  ) async throws {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let company = RebuildCompactionCompanyTests()
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let queue = try await TaskQueue.open(at: fixture.path, configuration: configuration)
    defer { queue.close() }
    let plan = try await company.addJobs(queue, 4_000)
    let runners = try company.twoRunners(fixture.path, segment: segment)

    var random = SystemRandomNumberGenerator()
    var odd: [String] = []
    var rounds = 0
    var statuses: [String: [Int32: Int]] = [:]
    while runners.contains(where: { $0.process.isRunning }) {
      let id = String(plan.ids.randomElement(using: &random)!)
      let commands: [[String]] = [
        ["cancel", fixture.path, id], ["resolve", fixture.path, id], ["revive", fixture.path, id],
        ["cancel", fixture.path, "--group", "g\(Int.random(in: 0..<30, using: &random))"],
        ["pause", fixture.path], ["resume", fixture.path], ["forget", fixture.path, "k"],
        ["inspect", fixture.path], ["verify", fixture.path], ["compact", fixture.path, "--retention", "0"],
        ["stats", fixture.path],
      ]
      let command = commands[rounds % commands.count]
      let run = try Self.ferry(
        command, killAfter: killing ? .milliseconds(Int.random(in: 5...120, using: &random)) : nil)
      if run.status == -SIGKILL { continue }
      statuses[command[0], default: [:]][run.status, default: 0] += 1
      let allowed: Set<Int32> = ["cancel", "resolve", "revive"].contains(command[0]) ? [0, 10, 11] : [0]
      if !allowed.contains(run.status) {
        odd.append(
          "\(command.dropFirst(2)) \(command[0]) → \(run.status): \(run.stderr.prefix(300)) \(run.stdout.prefix(200))"
        )
      }
      rounds += 1
    }
    for (index, runner) in runners.enumerated() {
      #expect(
        try await company.finish(runner, "runner \(index)") == 0,
        "runner \(index): \(runner.output.suffix(3))")
    }
    print(
      "operator rounds beside two runners (segment \(segment), killing \(killing)): \(rounds), statuses \(statuses)"
    )
    #expect(odd.isEmpty, "\(odd.count) commands: \(odd.prefix(6))")

    Self.expectEachAttemptHandledOnce(runners)
    // From what the log still holds (compaction removed finished tasks' histories): no live run was
    // interrupted, no claim overlapped another, none succeeded twice, every run ended once.
    let ledger = try RunLedger(queue.log)
    #expect(ledger.violations.isEmpty, "\(ledger.violations.prefix(5))")
    var afterCancel: [String] = []
    var cancelled: Set<TaskID> = []
    try queue.log.forEachEvent { event in
      guard TaskEvent.typeSet.contains(event.type) else { return }
      switch try TaskEvent(event) {
      case .cancelled(let id): cancelled.insert(id)
      case .runStarted(let id, _, _, _, _), .runSucceeded(let id, _), .revived(let id),
        .errorResolved(let id):
        if cancelled.contains(id) { afterCancel.append("\(event.type) of task \(id) at \(event.sequence)") }
      default: break
      }
    }
    #expect(afterCancel.isEmpty, "\(afterCancel.prefix(5))")
    for (id, runs) in ledger.tasks where runs.starts.count != runs.finishes + runs.interruptions.count {
      Issue.record("task \(id): \(runs)")
    }
    #expect(ledger.tasks.values.allSatisfy { $0.interruptions.isEmpty })
    let report = try queue.log.verify()
    #expect(report.isHealthy, "\(report.problems.prefix(5))")
  }

  /// The operator commands' own process killed (SIGKILL) inside its commit — everything written,
  /// not committed; with the segment, its frame flushed and LMDB not committed; or just after the
  /// commit — again and again while two runner processes work the queue: the runners never wait
  /// for a dead writer, no run is taken or run twice, and the log stays healthy.
  @Test(arguments: [
    (false, "append.beforeCommit"), (false, "append.afterCommit"), (true, "append.beforeCommit"),
    (true, "segment.frameFlushed"), (true, "append.afterCommit"),
  ])
  func operatorCommandsKilledInTheirCommitBesideTwoRunnerProcesses(segment: Bool, point: String) async throws
  {
    let fixture = QueueFixture()
    defer { fixture.remove() }
    let company = RebuildCompactionCompanyTests()
    var configuration = FerryStore.Configuration()
    configuration.writeAheadSegment = segment
    let queue = try await TaskQueue.open(at: fixture.path, configuration: configuration)
    defer { queue.close() }
    let plan = try await company.addJobs(queue, 3_000)
    let runners = try company.twoRunners(fixture.path, segment: segment)
    var kills = 0
    var other: [String] = []
    var round = 0
    while runners.contains(where: { $0.process.isRunning }) {
      let action: [String] =
        switch round % 3 {
        case 0: ["pause"]
        case 1: ["resume"]
        default: ["cancel-group", "g\(round % 30)"]
        }
      round += 1
      let command = try Child(
        "ferry-test-worker", ["operate", fixture.path] + action, environment: ["FERRY_CRASH_POINT": point])
      let status = try await command.wait()
      if command.process.terminationReason == .uncaughtSignal && status == SIGKILL {
        kills += 1
      } else if !(command.output.last ?? "").hasPrefix("status ") {
        other.append("\(action): \(command.output.suffix(2))")
      }
    }
    for (index, runner) in runners.enumerated() {
      #expect(
        try await company.finish(runner, "runner \(index)") == 0,
        "runner \(index): \(runner.output.suffix(3))")
    }
    print(
      "operator commands killed at \(point) (segment \(segment)) beside two runners: \(kills) of \(round)")
    #expect(kills > 0)
    #expect(other.isEmpty, "\(other.prefix(4))")
    Self.expectEachAttemptHandledOnce(runners)
    let ledger = try RunLedger(queue.log)
    #expect(ledger.violations.isEmpty, "\(ledger.violations.prefix(5))")
    for id in plan.ids {
      let runs = ledger.tasks[id] ?? RunLedger.Runs()
      #expect(runs.starts.count == runs.finishes + runs.interruptions.count, "task \(id): \(runs)")
      #expect(runs.interruptions.isEmpty, "task \(id): \(runs)")
    }
    let report = try queue.log.verify()
    #expect(report.isHealthy, "\(report.problems.prefix(5))")
  }

  /// Each attempt of a task handled once, over both runners (from their handlers' own lines).
  static func expectEachAttemptHandledOnce(_ runners: [Child]) {
    for (id, seen) in RebuildCompactionCompanyTests.handlerRuns(runners) {
      let attempts = seen.map(\.attempt)
      #expect(Set(attempts).count == attempts.count, "task \(id): one attempt handled twice \(seen)")
    }
  }
}
